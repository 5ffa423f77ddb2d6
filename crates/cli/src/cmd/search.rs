//! `craterdex search`: rank an index's images for query images.

use crate::args::{ModelOpts, SearchOpts};
use crate::output::{hits_table, Bars};
use anyhow::{bail, Result};
use clap::Args;
use craterdex_engine::inputs::images_in;
use craterdex_engine::{search_streamed, Catalogue, Engine, OverShards, ShardedEngine};
use craterdex_errors::IoError;
use std::io::Write;
use std::path::{Path, PathBuf};
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
    let (single, sharded);
    let catalogue: &dyn Catalogue = match (&c.index, &c.shards) {
        (Some(index), _) => {
            single = Engine::open(index, Some(extractor))?;
            &single
        }
        (None, Some(set)) => {
            sharded = ShardedEngine::open(set, Some(extractor))?;
            &OverShards(&sharded)
        }
        (None, None) => bail!("give --index or --shards"),
    };
    // answers are printed batch by batch as they come, so memory does not grow with the
    // number of queries
    let mut answered = 0;
    let mut out = std::io::stdout().lock();
    if c.json {
        write!(out, "[")?;
    }
    search_streamed(catalogue, &items, &options, &bars, &mut |answer| {
        for hits in &answer.hits {
            if c.json {
                let sep = if answered == 0 { "\n" } else { ",\n" };
                write!(out, "{sep}{}", serde_json::to_string_pretty(hits)?)
            } else {
                write!(out, "{}", hits_table(hits))
            }
            .map_err(|e| IoError::new("write", Path::new("standard output"), e))?;
            answered += 1;
        }
        Ok(())
    })?;
    if c.json {
        writeln!(out, "\n]")?;
    }
    let ms = t.elapsed().as_secs_f64() * 1e3 / answered.max(1) as f64;
    if !c.json {
        eprintln!("search: {ms:.2} ms per query (feature extraction included)");
    }
    Ok(())
}
