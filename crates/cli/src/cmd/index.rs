//! `craterdex index`: build, grow, shrink and inspect an index.

use crate::args::dir_entries;
use crate::args::{MergeFactor, MergeOpts, ModelOpts, RecipeOpts};
use crate::output::{print_json, Bars};
use anyhow::{bail, Result};
use clap::Subcommand;
use craterdex_engine::{Engine, MergePolicy, MergeReport};
use craterdex_eval::manifest;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Subcommand)]
pub enum IndexCmd {
    /// Build an index from a manifest's gallery or a directory of images.
    #[command(
        after_help = "Examples:\n  craterdex index build --manifest bench/splits/test.json --out idx\n  craterdex index build --dir catalogue_crops/ --out idx --codec pq96\n\nFrom a manifest with query images, whitening is learned from the gallery images of craters\nthat no query looks for, as `craterdex eval` does, so that searching the manifest's queries\nmeasures what eval reports; otherwise from every image up to 8,192 and from a seeded sample\nof 8,192 beyond (the sample `craterdex.dask.build_index` learns from too). Past 4,096 images,
when whitening learns from fewer than all of them, the others are read and encoded 4,096 at a
time: memory holds the learning images' features and one chunk's, whatever the catalogue's size."
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
    /// Add images (a directory) to an index, as a new segment, then merge segments by the
    /// policy (docs/formats/index.md).
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
        #[command(flatten)]
        merge: MergeOpts,
    },
    /// Merge segments: by the policy, or every segment into one with --into-one (removed
    /// images are purged from the segments rewritten).
    #[command(
        after_help = "Examples:\n  craterdex index merge --index idx\n  craterdex index merge --index idx --into-one"
    )]
    Merge {
        #[arg(long)]
        index: PathBuf,
        #[arg(long)]
        into_one: bool,
        #[command(flatten)]
        factor: MergeFactor,
    },
    /// Remove images by id.
    Remove {
        #[arg(long)]
        index: PathBuf,
        ids: Vec<String>,
    },
    /// Cut an index into N shard indexes (OUT/shard-NNN and OUT/shards.json) for a cluster:
    /// all views of a crater in one shard, the same encoder and codec in every shard.
    #[command(
        after_help = "Example:\n  craterdex index split --index idx --shards 4 --out idx-shards\n\nAn image's shard is crc32(crater id, else image id) mod N (docs/formats.md)."
    )]
    Split {
        #[arg(long)]
        index: PathBuf,
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
        shards: u64,
        #[arg(long)]
        out: PathBuf,
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
            let recipe = recipe.options().recipe()?;
            let entries = match (m, dir) {
                (Some(m), _) => manifest::load(&m, None)?.gallery_entries(),
                (None, Some(d)) => dir_entries(&d, meta.as_deref())?,
                _ => bail!("give --manifest or --dir"),
            };
            let extractor = Arc::new(model.load()?);
            let engine = Engine::build(&out, &entries, &recipe, extractor, &Bars::new())?;
            let info = engine.info();
            println!(
                "indexed {} images into {} ({} bytes of tokens per image)",
                info.images,
                out.display(),
                info.token_bytes_per_image
            );
        }
        IndexCmd::Add {
            index,
            dir,
            meta,
            model,
            merge,
        } => {
            let engine = Engine::open(&index, None)?.with_extractor(Arc::new(model.load()?))?;
            let entries = dir_entries(&dir, meta.as_deref())?;
            let (n, grown) = engine.add_entries(&entries, &Bars::new())?;
            println!("added {n} images to {}", index.display());
            if let Some(policy) = merge.policy() {
                print_merge(&grown.merge(&policy)?.0);
            }
        }
        IndexCmd::Merge {
            index,
            into_one,
            factor,
        } => {
            let policy = factor.applied(if into_one {
                MergePolicy::into_one()
            } else {
                MergePolicy::default()
            });
            print_merge(&Engine::open(&index, None)?.merge(&policy)?.0);
        }
        IndexCmd::Remove { index, ids } => {
            let (n, _) = Engine::open(&index, None)?.remove(&ids)?;
            println!("removed {n} of {} ids from {}", ids.len(), index.display());
        }
        IndexCmd::Split { index, shards, out } => {
            let set = Engine::open(&index, None)?.index().split(
                &out,
                shards as usize,
                &[craterdex_workflows::rule::RULE_FILE],
            )?;
            for s in &set.shards {
                println!("{}: {} images", out.join(&s.name).display(), s.images);
            }
        }
        IndexCmd::Info { index } => print_json(&Engine::open(&index, None)?.info())?,
    }
    Ok(())
}

fn print_merge(r: &MergeReport) {
    if r.merges > 0 {
        println!(
            "merged: {} -> {} segments ({} images rewritten, {} removed images purged)",
            r.segments_before, r.segments_after, r.rows_written, r.rows_purged
        );
    }
}
