//! Argument groups shared by several commands. Each becomes the engine's typed options
//! (`ModelOptions`, `RecipeOptions`, `SearchOptions`): values are parsed by the options' own
//! spelling (`FromStr`, the values listed from the types) and defaults are the options'
//! `Default`, so the command line, Python and the service cannot drift apart.

use crate::output::Bars;
use anyhow::Result;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Args;
use craterdex_engine::{
    Brightness, Codec, Extractor, IvfSetting, Mode, ModelOptions, Orientation, Pooling, Precision,
    Protocol, RecipeOptions, ResizeMode, SearchOptions, SeedStrategy, Whitening,
};
use std::path::PathBuf;
use std::str::FromStr;
use strum::VariantNames;

/// A value parser for an option whose values are `names` (the help lists them).
fn one_of<T>(names: impl IntoIterator<Item = &'static str>) -> impl TypedValueParser<Value = T>
where
    T: FromStr<Err = craterdex_errors::Invalid> + Clone + Send + Sync + 'static,
{
    PossibleValuesParser::new(names).try_map(|s| s.parse::<T>())
}

/// Which model, at what input size, resize and precision: everything that runs the model.
#[derive(Args, Clone)]
pub struct ModelChoice {
    /// Model directory (default: the default model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Input size in pixels (default: the model's, 224).
    #[arg(long)]
    pub size: Option<usize>,
    /// How images are brought to the model's square input.
    #[arg(long, value_parser = one_of::<ResizeMode>(ResizeMode::VARIANTS.iter().copied()),
          default_value_t = ModelOptions::default().resize)]
    pub resize: ResizeMode,
    /// f32; int8: linear layers on integers (activations quantised per row and group of 64,
    /// 8-bit weights), exact products on every kernel level, fastest with AVX-512 VNNI or
    /// AMX; or bf16: linear layers in bf16 on AVX-512 BF16 dot products (AMD Zen 4 and
    /// later, Intel Cooper Lake and Xeon 4th generation) or AMX tiles. Default: int8 where
    /// the CPU has VNNI or AMX, f32 elsewhere (measured speed and accuracy:
    /// docs/performance.md; `craterdex cpu` says which). An index does not record it:
    /// queries in either precision search it.
    #[arg(long, value_parser = one_of::<Precision>(Precision::VARIANTS.iter().copied()),
          default_value_t = ModelOptions::default().precision)]
    pub precision: Precision,
    /// as-is; shading: turn every crop so that its crater's shading points one way and add
    /// its mirror image (two forward passes per image, same bytes per image), for queries
    /// seen from another orbit: turned or mirrored; shading-spread: the same at the shading
    /// angle and 20 degrees either side (six forward passes per image). An index records it
    /// and its queries must use the same. Measured: docs/results.md, "Turned queries".
    #[arg(long, value_parser = one_of::<Orientation>(Orientation::VARIANTS.iter().copied()),
          default_value_t = ModelOptions::default().orient)]
    pub orient: Orientation,
    /// standardised: shift and scale every crop's brightness to mid grey and a fixed spread
    /// before the model sees it, so that an observation's exposure and (to first order) its
    /// sun's elevation do not change its tokens; as-is: as stored (indexes built before this
    /// default). An index records it and its queries must use the same. Measured:
    /// docs/results.md, "Another sun, another exposure".
    #[arg(long, value_parser = one_of::<Brightness>(Brightness::VARIANTS.iter().copied()),
          default_value_t = ModelOptions::default().brightness)]
    pub brightness: Brightness,
    /// Token reduction: the fraction of patch tokens, those the CLS token attends to most,
    /// that go on through the second half of the blocks (1: all). Faster, and not free in
    /// accuracy: docs/performance.md.
    #[arg(long, default_value_t = ModelOptions::default().keep_tokens)]
    pub keep_tokens: f32,
    /// Blocks of the backbone to run (default: two thirds of them, 8 of ViT-S/14's 12); CLS,
    /// patch tokens and attention come from the last one run. The later blocks make the
    /// tokens worse at telling one crater from another (docs/results.md). An index records it
    /// and its queries must use the same: indexes built before this default need `--blocks 12`.
    #[arg(long)]
    pub blocks: Option<usize>,
    /// Multi-scale: also see every crop at these input sizes (comma-separated pixels, e.g.
    /// 322), the patch tokens of every size pooled into one set of instance tokens: same bytes
    /// per image and search time, one forward pass per size. An index records them and its
    /// queries must use the same. Measured: docs/results.md, "Multi-scale tokens".
    #[arg(long, value_delimiter = ',')]
    pub extra_sizes: Vec<usize>,
    /// A named protocol in place of --blocks, --brightness and --precision: shipped
    /// (craterdex's defaults: two thirds of the blocks, brightness standardised, the CPU's
    /// default precision) or paper (the CraterBench-R paper's: every block, brightness as
    /// stored, f32). `eval` records which protocol ran, named or not (docs/guide/cli.md).
    #[arg(long, value_parser = one_of::<Protocol>(Protocol::VARIANTS.iter().copied()),
          conflicts_with_all = ["blocks", "brightness", "precision", "size", "keep_tokens", "extra_sizes", "orient"])]
    pub protocol: Option<Protocol>,
}

/// [`ModelChoice`] plus how extraction runs.
#[derive(Args, Clone)]
pub struct ModelOpts {
    #[command(flatten)]
    pub choice: ModelChoice,
    /// Images per forward pass.
    #[arg(long, default_value_t = ModelOptions::default().batch)]
    pub batch: usize,
    /// Bypass the on-disk feature cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Use what can be decoded of truncated or corrupt images (JPEGs cut short, bad Huffman
    /// data) instead of skipping them with a warning.
    #[arg(long)]
    pub allow_partial_images: bool,
}

impl ModelChoice {
    /// The options of the model chosen, the on-disk feature cache off (the commands that
    /// use it say so: [`ModelOpts`], `serve`).
    pub fn options(&self) -> ModelOptions {
        ModelOptions {
            model: self.model.clone(),
            size: self.size,
            precision: self.precision,
            resize: self.resize,
            orient: self.orient,
            brightness: self.brightness,
            keep_tokens: self.keep_tokens,
            blocks: self.blocks,
            extra_sizes: self.extra_sizes.clone(),
            protocol: self.protocol,
            cache: false,
            ..Default::default()
        }
    }
}

impl ModelOpts {
    pub fn options(&self) -> ModelOptions {
        ModelOptions {
            batch: self.batch,
            cache: !self.no_cache,
            allow_partial_images: self.allow_partial_images,
            ..self.choice.options()
        }
    }

    /// Loads the model (fetching the default one on first use).
    pub fn load(&self) -> Result<Extractor> {
        Ok(Extractor::load(&self.options(), &Bars::new())?)
    }
}

/// The index build recipe.
#[derive(Args, Clone)]
pub struct RecipeOpts {
    /// Token codec: f32, f16, int8 or pqM (M subquantisers: pq96, pq48, ...).
    #[arg(long, value_parser = Codec::from_str, default_value_t = RecipeOptions::default().codec)]
    pub codec: Codec,
    /// Instance tokens per image.
    #[arg(long, default_value_t = RecipeOptions::default().k)]
    pub k: usize,
    /// How the instance tokens' seeds are chosen.
    #[arg(long, value_parser = one_of::<SeedStrategy>(SeedStrategy::OPTIONS.iter().map(SeedStrategy::name)),
          default_value_t = RecipeOptions::default().seeds)]
    pub seeds: SeedStrategy,
    /// The single vector of the stage-1 shortlist.
    #[arg(long, value_parser = one_of::<Pooling>(Pooling::OPTIONS.iter().map(Pooling::name)),
          default_value_t = RecipeOptions::default().pooling)]
    pub pooling: Pooling,
    /// What the whitening learns from: pairs (the gallery's matching pairs, two images of one
    /// crater as a manifest's 2x and 3x views or a crater_id column give, blended with PCA;
    /// PCA alone where no two images share a crater), pca, or none (the paper's unwhitened
    /// setting). Measured: docs/results.md, "Whitening from the catalogue's own pairs".
    #[arg(long, value_parser = one_of::<Whitening>(Whitening::VARIANTS.iter().copied()),
          default_value_t = RecipeOptions::default().whitening)]
    pub whitening: Whitening,
    /// Same as --whitening none.
    #[arg(long, hide = true, conflicts_with_all = ["whitening", "pca_whitening"])]
    pub no_whiten: bool,
    /// Same as --whitening pca.
    #[arg(long, hide = true, conflicts_with = "whitening")]
    pub pca_whitening: bool,
    /// Approximate stage 1: IVF lists over the single vectors. "auto": about 4 sqrt(n) lists
    /// from 100,000 images up, exact below; "off"; or a number of lists.
    #[arg(long, value_parser = IvfSetting::from_str, default_value_t = RecipeOptions::default().ivf)]
    pub ivf: IvfSetting,
    /// IVF lists scanned per query by default (default: lists / 32, at least 8).
    #[arg(long)]
    pub nprobe: Option<usize>,
}

impl RecipeOpts {
    pub fn options(&self) -> RecipeOptions {
        RecipeOptions {
            codec: self.codec,
            k: self.k,
            seeds: self.seeds,
            pooling: self.pooling,
            whitening: match (self.no_whiten, self.pca_whitening) {
                (true, _) => Whitening::None,
                (_, true) => Whitening::Pca,
                _ => self.whitening,
            },
            ivf: self.ivf,
            nprobe: self.nprobe,
            ..Default::default()
        }
    }
}

/// How a search runs.
#[derive(Args, Clone)]
pub struct SearchOpts {
    /// Results per query.
    #[arg(long, default_value_t = SearchOptions::default().top_k)]
    pub top: usize,
    /// Shortlist size S: the S best by stage 1 are reranked; results past S (when --top is
    /// larger) follow in stage-1 order.
    #[arg(long, default_value_t = SearchOptions::default().shortlist)]
    pub shortlist: usize,
    /// How hits are ranked.
    #[arg(long, value_parser = one_of::<Mode>(Mode::VARIANTS.iter().copied()),
          default_value_t = SearchOptions::default().mode)]
    pub mode: Mode,
    /// IVF lists to scan in stage 1 (default: the index's); 0 scans every image exactly.
    #[arg(long)]
    pub nprobe: Option<usize>,
    /// List hits image by image, by their own score, rather than crater by crater (by default
    /// the views of one crater, images sharing a crater_id, follow one another, ranked by the
    /// best of them).
    #[arg(long)]
    pub ungrouped: bool,
    /// For query images at an unknown heading (unprojected observations): also search each
    /// turned by every N-th of a circle and mirrored (2N forward passes per query), each
    /// image ranked by its best score; 12 is a good choice, 1 searches the query as given.
    /// Measured: docs/results.md, "Queries at an unknown heading".
    #[arg(long, default_value_t = SearchOptions::default().turns)]
    pub turns: usize,
    /// For query images lit from the other side than the catalogue (another time of day):
    /// also search each with its brightness inverted, how a crater looks with the sun turned
    /// 180 degrees, each image ranked by its best score (twice the forward passes of --turns).
    /// Measured: docs/results.md, "Another sun, another exposure".
    #[arg(long)]
    pub opposite_sun: bool,
    /// Verify the N best images spatially, for map-projected (upright) queries: patch-token
    /// correspondences between the query and each candidate, and the most of them one
    /// similarity transform (turn, scale, shift) explains, rerank them (score + 0.01 per
    /// inlier beyond a fifth of the patches; 20 is a good choice, 50 with --turns, 0 is off).
    /// Where the N best are the views of fewer than N craters (an index holding a crater
    /// several times), the best view of each further crater is verified too, up to N craters.
    /// A verified search reranks a shortlist of at least 400 (a deeper --shortlist is kept).
    /// The candidates' images are read where the index recorded them and run through the
    /// model (up to N forward passes per query; the feature cache serves repeats). Measured:
    /// docs/results.md, "Spatial verification of the best images".
    #[arg(long, default_value_t = SearchOptions::default().verify, value_name = "N")]
    pub verify: usize,
    /// Search every query image only as given, not rechecked. By default (without --turns or
    /// --verify) a query image whose first hit does not register with it is searched again.
    /// Measured: docs/results.md, "Rechecked by default".
    #[arg(long, long_help = recheck_help())]
    pub no_recheck: bool,
    /// The most views of a query image a rechecked search runs through the model, its stages
    /// together and the query as given counted: stages that would take it past N are left
    /// out, in order (default: every stage, 30 views with one catalogue sun). 3 keeps the
    /// query as given and turned toward one catalogue sun: a query that does not register
    /// then costs three times an upright one. Measured: docs/results.md, "A search of bounded
    /// cost".
    #[arg(long, value_name = "N")]
    pub recheck_views: Option<usize>,
}

/// --no-recheck's long help: the plan in its own words and numbers.
fn recheck_help() -> String {
    format!(
        "Search every query image only as given, not rechecked. By default (without --turns or \
         --verify) each query image is searched {}. Measured: docs/results.md, \"Rechecked by \
         default\".",
        craterdex_engine::RecheckPlan::describe()
    )
}

impl SearchOpts {
    pub fn options(&self) -> SearchOptions {
        SearchOptions {
            top_k: self.top,
            shortlist: self.shortlist,
            mode: self.mode,
            nprobe: self.nprobe,
            group_views: !self.ungrouped,
            turns: self.turns,
            opposite_sun: self.opposite_sun,
            verify: self.verify,
            recheck: !self.no_recheck,
            recheck_views: self.recheck_views,
        }
    }
}

/// Crater entries to link: crops with ids and, when known, crater ids and positions.
#[derive(Args, Clone)]
pub struct EntriesOpts {
    /// A CraterBench-R manifest (its query images, with crater ids and any positions), or a
    /// directory of crops (ids are file names; metadata from --meta, or from DIR.csv beside
    /// the directory when it exists).
    #[arg(long)]
    pub entries: Option<PathBuf>,
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
    pub fn load(&self) -> Result<craterdex_engine::Entries> {
        use anyhow::bail;
        let Some(e) = &self.entries else {
            bail!("give the entries to link with --entries");
        };
        if e.is_dir() {
            return dir_entries(e, self.meta.as_deref());
        }
        if self.meta.is_some() {
            bail!("--meta goes with a directory of crops; a manifest carries its own metadata");
        }
        // entries to link need no crater ids; an index's gallery is a benchmark's
        let bench = if self.gallery_side {
            craterdex_eval::manifest::load(e, None)?
        } else {
            craterdex_eval::manifest::load_entries(e, None)?
        };
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
        Ok(craterdex_engine::Entries {
            items,
            metas,
            learn: Default::default(),
        })
    }
}

/// The images of a directory (ids are file names) with their metadata: from `meta`, or
/// from `DIR.csv` beside the directory when it exists (an `id` column and any of
/// crater_id, source, view, lat, lon, diameter_km, x, y, diameter_px).
pub fn dir_entries(
    dir: &std::path::Path,
    meta: Option<&std::path::Path>,
) -> Result<craterdex_engine::Entries> {
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
    Ok(craterdex_engine::Entries {
        items,
        metas,
        learn: Default::default(),
    })
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

/// The merge factor of a merge policy.
#[derive(Args, Clone)]
pub struct MergeFactor {
    /// Segments of one size level merged together once this many lie there (default 8).
    #[arg(long, value_parser = clap::value_parser!(u64).range(2..=1024))]
    pub merge_factor: Option<u64>,
}

impl MergeFactor {
    /// `base` with this factor, when given.
    pub fn applied(
        &self,
        mut base: craterdex_engine::MergePolicy,
    ) -> craterdex_engine::MergePolicy {
        if let Some(f) = self.merge_factor {
            base.merge_factor = f as usize;
        }
        base
    }
}

/// How segments are merged after writes (the policy's defaults unless given).
#[derive(Args, Clone)]
pub struct MergeOpts {
    /// Leave every write as a segment of its own (merge later with `craterdex index merge`).
    #[arg(long)]
    pub no_merge: bool,
    #[command(flatten)]
    pub factor: MergeFactor,
}

impl MergeOpts {
    /// The merge policy, or `None` with --no-merge.
    pub fn policy(&self) -> Option<craterdex_engine::MergePolicy> {
        (!self.no_merge).then(|| self.factor.applied(Default::default()))
    }
}
