//! `craterdex index`: build, grow, shrink and inspect an index.

use crate::args::dir_entries;
use crate::args::{ModelOpts, RecipeOpts};
use crate::output::{print_json, Bars};
use anyhow::{bail, Result};
use clap::Subcommand;
use craterdex_engine::inputs::metas_in_order;
use craterdex_engine::{learn_rows, Engine, Index};
use craterdex_eval::manifest;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Subcommand)]
pub enum IndexCmd {
    /// Build an index from a manifest's gallery or a directory of images.
    #[command(
        after_help = "Examples:\n  craterdex index build --manifest bench/splits/test.json --out idx\n  craterdex index build --dir catalogue_crops/ --out idx --codec pq96\n\nFrom a manifest with query images, whitening is learned from the gallery images of craters\nthat no query looks for, as `craterdex eval` does, so that searching the manifest's queries\nmeasures what eval reports; from a directory, from every image up to 8,192 and from a seeded\nsample of 8,192 beyond (the sample `craterdex.dask.build_index` learns from too)."
    )]
    Build {
        #[arg(long, group = "input")]
        manifest: Option<PathBuf>,
        /// A directory of crops; their metadata from --meta or DIR.csv beside it.
        #[arg(long, group = "input")]
        dir: Option<PathBuf>,
        /// Metadata of the --dir crops: CSV with an `id` column and any of crater_id,
        /// source, view, lat, lon, diameter_km, x, y, diameter_px.
        #[arg(long)]
        meta: Option<PathBuf>,
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        recipe: RecipeOpts,
        #[command(flatten)]
        model: ModelOpts,
    },
    /// Add images (a directory) to an index, as a new segment.
    Add {
        #[arg(long)]
        index: PathBuf,
        /// A directory of crops; their metadata from --meta or DIR.csv beside it.
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        meta: Option<PathBuf>,
        #[command(flatten)]
        model: ModelOpts,
    },
    /// Remove images by id.
    Remove {
        #[arg(long)]
        index: PathBuf,
        ids: Vec<String>,
    },
    /// Show what an index holds.
    Info {
        #[arg(long)]
        index: PathBuf,
    },
}

pub fn run(c: IndexCmd) -> Result<()> {
    match c {
        IndexCmd::Build {
            manifest: m,
            dir,
            meta,
            out,
            recipe,
            model,
        } => {
            let recipe = recipe.recipe()?;
            let extractor = model.load()?;
            let bars = Bars::new();
            let (feats, metas, learn_from) = match (m, dir) {
                (Some(m), _) => {
                    let b = manifest::load(&m, None)?;
                    let f = extractor.extract(&b.gallery_items(), "gallery", &bars)?;
                    let metas = b.gallery_metas(&f.ids);
                    let learn = (!b.manifest.query_images.is_empty())
                        .then(|| b.unqueried_gallery_rows(&f.ids));
                    (f, metas, learn)
                }
                (None, Some(d)) => {
                    let (items, metas) = dir_entries(&d, meta.as_deref())?;
                    let f = extractor.extract(&items, "images", &bars)?;
                    let metas = metas_in_order(metas, &f.ids)?;
                    let ids: Vec<String> = items.iter().map(|(id, _)| id.clone()).collect();
                    let learn = learn_rows(&ids, &f.ids, recipe.seed);
                    (f, metas, learn)
                }
                _ => bail!("give --manifest or --dir"),
            };
            if let Some(rows) = &learn_from {
                eprintln!(
                    "whitening and codec learned from {} of {} images",
                    rows.len(),
                    feats.len()
                );
            }
            let encoder = recipe.learn_encoder(&feats, learn_from.as_deref(), &metas)?;
            recipe.write_index(
                &out,
                &encoder,
                &feats,
                metas,
                Some(extractor.fingerprint()),
                learn_from.as_deref(),
                &bars,
            )?;
            let idx = Index::open(&out)?;
            println!(
                "indexed {} images into {} ({} bytes of tokens per image)",
                idx.live(),
                out.display(),
                idx.token_bytes_per_image()
            );
        }
        IndexCmd::Add {
            index,
            dir,
            meta,
            model,
        } => {
            let extractor = Arc::new(model.load()?);
            let engine = Engine::open(&index, None)?.with_extractor(extractor.clone())?;
            let (items, metas) = dir_entries(&dir, meta.as_deref())?;
            let f = extractor.extract(&items, "add", &Bars::new())?;
            let (n, _) = engine.add_features(metas_in_order(metas, &f.ids)?, &f)?;
            println!("added {n} images to {}", index.display());
        }
        IndexCmd::Remove { index, ids } => {
            let (n, _) = Engine::open(&index, None)?.remove(&ids)?;
            println!("removed {n} of {} ids from {}", ids.len(), index.display());
        }
        IndexCmd::Info { index } => {
            let idx = Index::open(&index)?;
            print_json(&serde_json::json!({
                "images": idx.live(), "removed": idx.rows() - idx.live(), "segments": idx.segment_count(),
                "model": idx.model(), "codec": idx.codec.codec.name(), "tokens_per_image": idx.tokens_per_image(),
                "token_dim": idx.token_dim(), "single_dim": idx.single_dim(), "token_bytes_per_image": idx.token_bytes_per_image(),
                "recipe": idx.encoder.recipe,
                "ivf": idx.ivf().map(|(ivf, nprobe)| serde_json::json!({"lists": ivf.lists(), "nprobe": nprobe})),
            }))?;
        }
    }
    Ok(())
}
