//! `craterdex extract`: features of many images into one safetensors file.

use crate::args::ModelOpts;
use crate::output::Bars;
use anyhow::{bail, Result};
use clap::Args;
use craterdex_engine::inputs::{images_in, images_in_list};
use craterdex_eval::manifest;
use std::collections::HashMap;
use std::path::PathBuf;

#[derive(Args)]
pub struct ExtractCmd {
    #[arg(long, group = "input")]
    dir: Option<PathBuf>,
    /// A text file with one image path per line.
    #[arg(long, group = "input")]
    list: Option<PathBuf>,
    /// A CraterBench-R manifest (gallery and query images).
    #[arg(long, group = "input")]
    manifest: Option<PathBuf>,
    #[arg(long)]
    out: PathBuf,
    /// Store patch tokens as f16.
    #[arg(long)]
    f16: bool,
    #[command(flatten)]
    model: ModelOpts,
}

pub fn run(c: ExtractCmd) -> Result<()> {
    let items = match (&c.dir, &c.list, &c.manifest) {
        (Some(d), _, _) => images_in(d)?,
        (_, Some(l), _) => images_in_list(l)?,
        (_, _, Some(m)) => {
            let b = manifest::load(m, None)?;
            let mut v = b.gallery_items();
            v.extend(b.query_items());
            v
        }
        _ => bail!("give --dir, --list or --manifest"),
    };
    let extractor = c.model.load()?;
    let t = std::time::Instant::now();
    let feats = extractor.extract(&items, "extract", &Bars::new())?;
    let mut meta = HashMap::new();
    meta.insert("model".to_string(), extractor.fingerprint());
    meta.insert(
        "preprocess".to_string(),
        serde_json::to_string(&extractor.preprocess())?,
    );
    feats.write(&c.out, c.f16, meta)?;
    eprintln!(
        "wrote {} images ({} tokens x {}) to {} and {} in {:.1}s",
        feats.len(),
        feats.tokens,
        feats.dim,
        c.out.display(),
        craterdex_model::extract::ids_path(&c.out).display(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
