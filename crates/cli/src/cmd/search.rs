//! `craterdex search`: rank an index's images for query images.

use crate::args::{ModelOpts, SearchOpts};
use crate::output::{print_hits, print_json, Bars};
use anyhow::{bail, Result};
use clap::Args;
use craterdex_engine::inputs::images_in;
use craterdex_engine::{Engine, SearchInput, ShardedEngine};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args)]
pub struct SearchCmd {
    #[arg(long, required_unless_present = "shards", conflicts_with = "shards")]
    index: Option<PathBuf>,
    /// A set of shard indexes (`craterdex index split`), searched as one catalogue.
    #[arg(long)]
    shards: Option<PathBuf>,
    /// Query images.
    images: Vec<PathBuf>,
    /// A directory of query images.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The query images of a CraterBench-R manifest.
    #[arg(long)]
    manifest: Option<PathBuf>,
    #[command(flatten)]
    search: SearchOpts,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    model: ModelOpts,
}

pub fn run(c: SearchCmd) -> Result<()> {
    let options = c.search.options();
    options.params(&Default::default())?;
    let mut items: Vec<(String, PathBuf)> = c
        .images
        .iter()
        .map(|p| (p.display().to_string(), p.clone()))
        .collect();
    if let Some(d) = &c.dir {
        items.extend(images_in(d)?);
    }
    if let Some(m) = &c.manifest {
        items.extend(craterdex_eval::manifest::load(m, None)?.query_items());
    }
    if items.is_empty() {
        bail!("give query images, --dir or --manifest");
    }
    let extractor = Arc::new(c.model.load()?);
    let bars = Bars::new();
    let t = std::time::Instant::now();
    let input = SearchInput::Files(&items);
    let answer = match (&c.index, &c.shards) {
        (Some(index), _) => Engine::open(index, Some(extractor))?.search(input, &options, &bars)?,
        (None, Some(set)) => {
            ShardedEngine::open(set, Some(extractor))?.search(input, &options, &bars)?
        }
        (None, None) => bail!("give --index or --shards"),
    };
    let results = answer.hits;
    let ms = t.elapsed().as_secs_f64() * 1e3 / results.len().max(1) as f64;
    if c.json {
        print_json(&results)?;
    } else {
        print_hits(&results);
        eprintln!("search: {ms:.2} ms per query (feature extraction included)");
    }
    Ok(())
}
