//! Argument groups shared by several commands, each turned into the engine's own settings.

use crate::output::Bars;
use anyhow::Result;
use clap::Args;
use craterdex_engine::{
    Aggregation, Codec, ExtractSettings, Extractor, IndexRecipe, IvfSetting, Mode, ModelSpec,
    Orientation, Pooling, Precision, Recipe, ResizeMode, SearchParams, SeedStrategy, Stage1,
};
use std::path::PathBuf;

/// Which model, at what input size, resize and precision: everything that runs the model.
#[derive(Args, Clone)]
pub struct ModelChoice {
    /// Model directory (default: the default model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Input size in pixels (default: the model's, 224).
    #[arg(long)]
    pub size: Option<usize>,
    /// squash (default) or center-crop.
    #[arg(long, default_value = "squash")]
    pub resize: ResizeMode,
    /// f32 (default); int8: linear layers on integers (activations quantised per row and
    /// group of 64, 8-bit weights), exact products on every kernel level, fastest with
    /// AVX-512 VNNI or AMX; or bf16: linear layers in bf16 on AMX tiles (Intel Xeon 4th
    /// generation or later). Measured speed and accuracy: README, "Choosing a model".
    #[arg(long, default_value = "f32")]
    pub precision: Precision,
    /// as-is (default); shading: turn every crop so that its crater's shading points one
    /// way and add its mirror image (two forward passes per image, same bytes per image),
    /// for queries seen from another orbit: turned or mirrored; shading-spread: the same at
    /// the shading angle and 20 degrees either side (six forward passes per image). An index
    /// records it and its queries must use the same. Measured: README, "Turned queries".
    #[arg(long, default_value = "as-is")]
    pub orient: Orientation,
}

impl ModelChoice {
    pub fn spec(&self) -> ModelSpec {
        ModelSpec {
            dir: self.model.clone(),
            size: self.size,
            precision: self.precision,
            resize: self.resize,
            orientation: self.orient,
        }
    }
}

/// [`ModelChoice`] plus how extraction runs.
#[derive(Args, Clone)]
pub struct ModelOpts {
    #[command(flatten)]
    pub choice: ModelChoice,
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Bypass the on-disk feature cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Use what can be decoded of truncated or corrupt images (JPEGs cut short, bad Huffman
    /// data) instead of skipping them with a warning.
    #[arg(long)]
    pub allow_partial_images: bool,
}

impl ModelOpts {
    pub fn settings(&self) -> ExtractSettings {
        ExtractSettings {
            batch: self.batch,
            cache: !self.no_cache,
            allow_partial: self.allow_partial_images,
        }
    }

    /// Loads the model (fetching the default one on first use).
    pub fn load(&self) -> Result<Extractor> {
        Ok(Extractor::load(
            &self.choice.spec(),
            self.settings(),
            &Bars::new(),
        )?)
    }
}

/// The index build recipe.
#[derive(Args, Clone)]
pub struct RecipeOpts {
    /// Token codec: f32, f16, int8, pq96, pq48, ...
    #[arg(long, default_value = "int8")]
    pub codec: Codec,
    /// Instance tokens per image.
    #[arg(long, default_value_t = 32)]
    pub k: usize,
    /// Seeds: fps, attn, random, norm, normattn.
    #[arg(long, default_value = "fps")]
    pub seeds: SeedStrategy,
    /// Single vector for the shortlist: cls, gap, gem, max.
    #[arg(long, default_value = "cls")]
    pub pooling: Pooling,
    /// Do not whiten (reproduces the paper's unwhitened numbers).
    #[arg(long)]
    pub no_whiten: bool,
    /// Learn PCA whitening only. By default, where the metadata gives two images of one
    /// crater (a manifest's 2x and 3x gallery views, a catalogue's crater_id column), the
    /// whitening also learns from those matching pairs (README, "Whitening from the
    /// catalogue's own pairs"); without such pairs it is PCA whitening either way.
    #[arg(long)]
    pub pca_whitening: bool,
    /// Approximate stage 1: IVF lists over the single vectors. "auto": about 4 sqrt(n) lists
    /// from 100,000 images up, exact below; "off"; or a number of lists.
    #[arg(long, default_value = "auto")]
    pub ivf: String,
    /// IVF lists scanned per query by default (default: lists / 32, at least 8).
    #[arg(long)]
    pub nprobe: Option<usize>,
}

impl RecipeOpts {
    pub fn recipe(&self) -> Result<IndexRecipe> {
        Ok(IndexRecipe {
            recipe: Recipe {
                pooling: self.pooling,
                aggregation: Aggregation::Instance {
                    seeds: self.seeds,
                    k: self.k,
                    soft_m: 1,
                },
                whiten: !self.no_whiten,
                whiten_pairs: if self.pca_whitening {
                    None
                } else {
                    Recipe::default().whiten_pairs
                },
                ..Default::default()
            },
            codec: self.codec,
            ivf: self.ivf.parse::<IvfSetting>()?,
            nprobe: self.nprobe,
            seed: 0,
        })
    }
}

/// How a search runs.
#[derive(Args, Clone)]
pub struct SearchOpts {
    /// Results per query.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Shortlist size S: the S best by stage 1 are reranked; results past S (when --top is
    /// larger) follow in stage-1 order.
    #[arg(long, default_value_t = 100)]
    pub shortlist: usize,
    /// two-stage (default), stage1 or exhaustive.
    #[arg(long, default_value = "two-stage")]
    pub mode: String,
    /// IVF lists to scan in stage 1 (default: the index's); 0 scans every image exactly.
    #[arg(long)]
    pub nprobe: Option<usize>,
    /// List hits image by image, by their own score, rather than crater by crater (by default
    /// the views of one crater, images sharing a crater_id, follow one another, ranked by the
    /// best of them).
    #[arg(long)]
    pub ungrouped: bool,
}

impl SearchOpts {
    pub fn params(&self) -> Result<SearchParams> {
        Ok(SearchParams {
            top_k: self.top,
            shortlist: self.shortlist,
            mode: self.mode.parse::<Mode>()?,
            stage1: Stage1::from_nprobe(self.nprobe),
            group_views: !self.ungrouped,
        })
    }
}

/// Entries' `(id, path)` and their metadata, in the same order.
pub type LoadedEntries = (Vec<(String, PathBuf)>, Vec<craterdex_engine::ImageMeta>);

/// Crater entries to link: crops with ids and, when known, crater ids and positions.
#[derive(Args, Clone)]
pub struct EntriesOpts {
    /// A CraterBench-R manifest (its query images, with crater ids and any positions), or a
    /// directory of crops (ids are file names; metadata from --meta, or from DIR.csv beside
    /// the directory when it exists).
    #[arg(long)]
    pub entries: PathBuf,
    /// With a manifest: take its gallery images instead of its queries.
    #[arg(long)]
    pub gallery_side: bool,
    /// Metadata of a directory's crops: CSV with an `id` column and any of crater_id,
    /// source, view, lat, lon, diameter_km.
    #[arg(long)]
    pub meta: Option<PathBuf>,
}

impl EntriesOpts {
    /// The entries' `(id, path)` and metadata, in the same order.
    pub fn load(&self) -> Result<LoadedEntries> {
        use anyhow::bail;
        let e = &self.entries;
        if e.is_dir() {
            return dir_entries(e, self.meta.as_deref());
        }
        if self.meta.is_some() {
            bail!("--meta goes with a directory of crops; a manifest carries its own metadata");
        }
        let bench = craterdex_eval::manifest::load(e, None)?;
        let items = if self.gallery_side {
            bench.gallery_items()
        } else {
            bench.query_items()
        };
        let ids: Vec<String> = items.iter().map(|(id, _)| id.clone()).collect();
        let metas = if self.gallery_side {
            bench.gallery_metas(&ids)
        } else {
            bench.query_metas(&ids)
        };
        Ok((items, metas))
    }
}

/// The images of a directory (ids are file names) with their metadata: from `meta`, or
/// from `DIR.csv` beside the directory when it exists (an `id` column and any of
/// crater_id, source, view, lat, lon, diameter_km, x, y, diameter_px).
pub fn dir_entries(dir: &std::path::Path, meta: Option<&std::path::Path>) -> Result<LoadedEntries> {
    let items = craterdex_engine::inputs::images_in(dir)?;
    let beside = dir.with_extension("csv");
    let meta_path = meta
        .map(std::path::Path::to_path_buf)
        .or(beside.is_file().then_some(beside));
    let known = match &meta_path {
        Some(p) => craterdex_workflows::entries::read_meta_csv(p)?,
        None => Default::default(),
    };
    let metas = items
        .iter()
        .map(|(id, path)| {
            let mut m = known.get(id).cloned().unwrap_or_default();
            m.id = id.clone();
            m.path = Some(path.display().to_string());
            m
        })
        .collect();
    Ok((items, metas))
}

/// Image tiles with their crater lists in pixels, given in pairs.
#[derive(Args, Clone)]
pub struct TileArgs {
    /// Image tile (repeat with --craters for several tiles).
    #[arg(long, required = true)]
    pub tile: Vec<PathBuf>,
    /// Crater list in pixels for the tile at the same position (pycda CSV or NAC format).
    #[arg(long)]
    pub craters: Vec<PathBuf>,
}

impl TileArgs {
    /// `(tile, crater list)` pairs; fails unless each tile has its list.
    pub fn pairs(&self) -> Result<Vec<(PathBuf, PathBuf)>> {
        anyhow::ensure!(
            self.tile.len() == self.craters.len(),
            "give one --craters list per --tile ({} tiles, {} lists)",
            self.tile.len(),
            self.craters.len()
        );
        Ok(self
            .tile
            .iter()
            .cloned()
            .zip(self.craters.clone())
            .collect())
    }
}

/// The metadata of the crops `ids` in `dir` (`<id>.png`) from a CSV craterdex wrote beside
/// them, in the order of `ids`; every id must have its row.
pub fn csv_metas_in_order(
    csv: &std::path::Path,
    ids: &[String],
    dir: &std::path::Path,
) -> Result<Vec<craterdex_engine::ImageMeta>> {
    use anyhow::Context;
    let metas = craterdex_workflows::entries::read_meta_csv(csv)?
        .into_values()
        .map(|mut m| {
            m.path = Some(dir.join(format!("{}.png", m.id)).display().to_string());
            m
        });
    craterdex_engine::inputs::metas_in_order(metas, ids).with_context(|| csv.display().to_string())
}
