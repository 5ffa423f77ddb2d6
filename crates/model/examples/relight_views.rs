//! Writes each image relit toward `n` suns evenly round the sky, its own sun's axis read from
//! its shading: the catalogue views an index could hold so that a query under any sun meets
//! one lit about like it (issue 55, docs/results.md "A catalogue under several suns").
//!
//! cargo run --release -p craterdex-model --example relight_views -- N OUT_DIR IMAGE...
//! writes OUT_DIR/<stem>_relit<k>.png for k in 1..N (k = 0 is the image itself).

use craterdex_model::relight;
use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: relight_views N OUT_DIR IMAGE...";
    let n: usize = args.next().ok_or(usage)?.parse()?;
    let out = PathBuf::from(args.next().ok_or(usage)?);
    std::fs::create_dir_all(&out)?;
    for path in args {
        let img = image::open(&path)
            .map_err(|e| format!("{path}: {e}"))?
            .to_rgb32f();
        let axis = relight::shading_axis(&img);
        let stem = Path::new(&path)
            .file_stem()
            .ok_or_else(|| format!("{path}: no file name"))?
            .to_string_lossy()
            .into_owned();
        // turning the axis the other way round gives the same set of suns, relabelled: the
        // side the sun is on does not need to be known
        for k in 1..n {
            let to = axis + k as f32 * std::f32::consts::TAU / n as f32;
            let relit = relight::relight(&img, axis, to);
            let gray = image::DynamicImage::ImageRgb32F(relit).to_luma8();
            gray.save(out.join(format!("{stem}_relit{k}.png")))?;
        }
    }
    Ok(())
}
