//! `craterdex discover`: rank the tiles (windows) of a mosaic by their likeness to one or
//! more exemplar crater images.

use crate::args::ModelOpts;
use crate::output::Bars;
use anyhow::{ensure, Result};
use clap::Args;
use craterdex_engine::Engine;
use craterdex_workflows::discover::{discover, Fuse, Scoring};
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args)]
pub struct DiscoverCmd {
    /// An index of the mosaic's windows (`bench-build --windows`, then `index build --dir`).
    #[arg(long)]
    index: PathBuf,
    /// Exemplar crater images.
    #[arg(long, required = true, num_args = 1..)]
    query: Vec<PathBuf>,
    /// Where ranked.csv and ranked.geojson go.
    #[arg(long)]
    out: PathBuf,
    /// How the exemplars' scores combine: max or mean.
    #[arg(long, default_value = "max")]
    fuse: Fuse,
    /// Rank by the single vectors only (the CLS-style baseline) instead of late interaction.
    #[arg(long)]
    single_vector: bool,
    /// Rows written (all when 0).
    #[arg(long, default_value_t = 1000)]
    top: usize,
    #[command(flatten)]
    model: ModelOpts,
}

pub fn run(c: DiscoverCmd) -> Result<()> {
    let engine = Engine::open(&c.index, None)?.with_extractor(Arc::new(c.model.load()?))?;
    let items: Vec<(String, PathBuf)> = c
        .query
        .iter()
        .map(|p| (p.display().to_string(), p.clone()))
        .collect();
    let (_, exemplars) = engine.encode_images(&items, &Bars::new())?;
    ensure!(
        !exemplars.is_empty(),
        "none of the exemplar images could be read"
    );
    let scoring = if c.single_vector {
        Scoring::SingleVector
    } else {
        Scoring::LateInteraction
    };
    let mut ranked = discover(&engine, &exemplars, c.fuse, scoring)?;
    if c.top > 0 {
        ranked.truncate(c.top);
    }
    craterdex_workflows::output::write_discovered(&c.out, &ranked)?;
    for d in ranked.iter().take(10) {
        println!("{:>9.4}  {}", d.score, d.meta.id);
    }
    println!(
        "wrote {} ranked windows to {}/ranked.csv and ranked.geojson",
        ranked.len(),
        c.out.display()
    );
    Ok(())
}
