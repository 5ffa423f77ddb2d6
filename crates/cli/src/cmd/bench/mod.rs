//! `craterdex bench`: speed against reference implementations measured in the same run on
//! the same machine, printed as ratios (never asserted by tests: machines are noisy). Every
//! bench prints the CPU and the kernel level that produced its numbers.

mod client;
mod detect;
mod eval;
mod extract;
mod python;
mod register;
mod search;
mod search_images;
mod serve;
mod shards;
mod writes;

use anyhow::Result;
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Feature extraction: images/s and peak RSS against onnxruntime on the same backbone.
    #[command(
        after_help = "Example:\n  craterdex bench extract --dir craterdex-demo/bench/images/gallery --images 64"
    )]
    Extract(ExtractBench),
    /// Crater detection in whole labelled tiles at every kernel level and precision, against
    /// pycda's own pipeline (TensorFlow) on the same tiles in the same run: images/s,
    /// megapixels/s and F1 per size bin.
    #[command(
        after_help = "Example:\n  craterdex bench detect --tile a.png --craters a.txt --tile b.png --craters b.txt"
    )]
    Detect(detect::DetectBench),
    /// Search latency (stage 1, two-stage at S=100/500, exhaustive LI) per codec, single
    /// queries and batches, on a synthetic gallery with planted near-duplicates and optionally
    /// on real features, against faiss-cpu and numpy on identical data.
    #[command(
        after_help = "Example:\n  craterdex bench search --json search.json\n  craterdex bench search --gallery 5000 --real craterdex-demo/bench/splits/test.json"
    )]
    Search(SearchBench),
    /// The default search of query images by kind of query (upright, turned, relit: each a
    /// benchmark split, of one catalogue or several) at every kernel level, in one run:
    /// latency p50/p99, forward passes and stages per query, each kind's cost against the
    /// first kind's.
    #[command(
        name = "search-images",
        after_help = "Example:\n  craterdex bench search-images --index idx --split upright=bench/splits/test.json \\\n    --split turned=bench/splits/test_rotated.json --queries 20"
    )]
    SearchImages(search_images::SearchImagesBench),
    /// Load test of `craterdex serve` on loopback: feature and image searches per second,
    /// p50/p99 latency, errors and server memory over the run.
    #[command(
        after_help = "Example:\n  craterdex bench serve --index nac-index --manifest nac-bench/splits/test.json --seconds 30"
    )]
    Serve(serve::ServeBench),
    /// Time and memory of the evaluation's regimes (extraction excluded) on a synthetic
    /// benchmark, projected to the full CraterBench-R (50,000 x 5,000).
    #[command(after_help = "Example:\n  craterdex bench eval --gallery 10000 --queries 1000")]
    Eval(EvalBench),
    /// Registration of simulated second observations (turned, rescaled, shifted, 10% missed
    /// and 10% false craters) of real crater lists, with the default hypothesis budget
    /// against every pair in the same run.
    #[command(
        after_help = "Example:\n  craterdex bench register --craters nac/M1.txt --craters nac/M2.txt --min-diameter 8"
    )]
    Register(RegisterBench),
    /// A stream of single-image adds (one searcher meanwhile, segments merged in the
    /// background as the service does): add latency, segment count, and search latency on
    /// the grown index against a fresh build of the same images; the same stream without
    /// merging for reference.
    #[command(after_help = "Example:\n  craterdex bench writes --adds 10000")]
    Writes(WritesBench),
    /// An index cut into shards and searched as one catalogue (the work of a cluster's
    /// shards and router, in one process) against the index on a benchmark's queries: top
    /// hits agreeing at the default shortlist, equality with the whole index as shortlist,
    /// latency.
    #[command(
        after_help = "Example:\n  craterdex bench shards --index craterdex-demo/index --manifest craterdex-demo/bench/splits/test.json"
    )]
    Shards(ShardsBench),
}

#[derive(Args)]
pub struct ShardsBench {
    #[arg(long)]
    pub(crate) index: PathBuf,
    /// The benchmark whose query images are searched.
    #[arg(long)]
    pub(crate) manifest: PathBuf,
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    pub(crate) shards: Vec<usize>,
    /// Hits compared per query.
    #[arg(long, default_value_t = 10)]
    pub(crate) top: usize,
    /// Timing rounds over the queries.
    #[arg(long, default_value_t = 3)]
    pub(crate) repeats: usize,
    #[command(flatten)]
    pub(crate) model: crate::args::ModelOpts,
    /// Where the shard sets go (default: the system temp dir).
    #[arg(long)]
    pub(crate) workdir: Option<PathBuf>,
}

#[derive(Args)]
pub struct WritesBench {
    /// Images in the index before the stream.
    #[arg(long, default_value_t = 1000)]
    pub(crate) base: usize,
    /// Single-image adds with merging.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) adds: usize,
    /// Single-image adds without merging, for reference (0: skip).
    #[arg(long, default_value_t = 1000)]
    pub(crate) reference_adds: usize,
    /// Queries timed on each index.
    #[arg(long, default_value_t = 200)]
    pub(crate) queries: usize,
    #[arg(long, default_value_t = 32)]
    pub(crate) k: usize,
    #[arg(long, default_value_t = 384)]
    pub(crate) dim: usize,
    #[arg(long, default_value = "int8")]
    pub(crate) codec: craterdex_index::Codec,
    #[arg(long, value_parser = clap::value_parser!(u64).range(2..=1024))]
    pub(crate) merge_factor: Option<u64>,
    /// Where the temporary indexes go (default: the system temp dir).
    #[arg(long)]
    pub(crate) workdir: Option<PathBuf>,
}

#[derive(Args)]
pub struct RegisterBench {
    /// Crater lists in pixels (pycda CSV or NAC format); each is the catalogue of its own
    /// simulated observations.
    #[arg(long, required = true)]
    pub(crate) craters: Vec<PathBuf>,
    #[arg(long, default_value_t = 8.0)]
    pub(crate) min_diameter: f64,
    /// Timings per registration (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub(crate) repeats: usize,
    /// Skip the exhaustive reference.
    #[arg(long)]
    pub(crate) no_reference: bool,
}

#[derive(Args)]
pub struct EvalBench {
    #[arg(long, default_value_t = 10_000)]
    pub(crate) gallery: usize,
    #[arg(long, default_value_t = 1_000)]
    pub(crate) queries: usize,
    #[arg(long, default_value_t = 256)]
    pub(crate) tokens: usize,
    #[arg(long, default_value_t = 384)]
    pub(crate) dim: usize,
    /// The full regime set instead of --quick's.
    #[arg(long)]
    pub(crate) full: bool,
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
    pub(crate) dir: PathBuf,
    #[arg(long, default_value_t = 64)]
    pub(crate) images: usize,
    /// Rounds; each times one pass per engine, the engines taking turns.
    #[arg(long, default_value_t = 5)]
    pub(crate) repeats: usize,
    /// Skip the onnxruntime reference.
    #[arg(long)]
    pub(crate) no_reference: bool,
    /// Also time each engine on one thread and on all, in batches of 1 and of --batch.
    #[arg(long)]
    pub(crate) scaling: bool,
    #[command(flatten)]
    pub(crate) model: crate::args::ModelOpts,
}

pub fn run(c: BenchCmd) -> Result<()> {
    match c {
        BenchCmd::Extract(b) => extract::run(b),
        BenchCmd::Detect(b) => detect::run(b),
        BenchCmd::Search(b) => search::run(b),
        BenchCmd::SearchImages(b) => search_images::run(b),
        BenchCmd::Serve(b) => serve::run(b),
        BenchCmd::Eval(b) => eval::run(b),
        BenchCmd::Register(b) => register::run(b),
        BenchCmd::Writes(b) => writes::run(b),
        BenchCmd::Shards(b) => shards::run(b),
    }
}

/// The kernel levels named (`--levels`), or every level this CPU runs where none is; a
/// named level this CPU does not run is an error.
pub fn chosen_levels(names: &[String]) -> Result<Vec<craterdex_kernels::level::Level>> {
    let supported = craterdex_kernels::level::supported();
    if names.is_empty() {
        return Ok(supported);
    }
    let runs: Vec<_> = supported
        .iter()
        .copied()
        .filter(|l| names.iter().any(|n| n == l.name()))
        .collect();
    anyhow::ensure!(
        runs.len() == names.len(),
        "this CPU runs the levels {}, not all of {}",
        supported
            .iter()
            .map(|l| l.name())
            .collect::<Vec<_>>()
            .join(", "),
        names.join(", ")
    );
    Ok(runs)
}

/// This command run again at each of `levels`, each in a child process with
/// `CRATERDEX_KERNEL` set (the level is fixed per process) and `--worker FILE` added: the
/// rows each child wrote to its file, in order.
pub fn rows_per_level<R: serde::de::DeserializeOwned>(
    levels: &[craterdex_kernels::level::Level],
) -> Result<Vec<R>> {
    let exe = std::env::current_exe()?;
    let mut rows = Vec::new();
    for level in levels {
        eprintln!("running at {level}");
        let out = std::env::temp_dir().join(format!(
            "craterdex-{}-bench-{level}.json",
            std::process::id()
        ));
        let status = std::process::Command::new(&exe)
            .args(std::env::args_os().skip(1))
            .arg("--worker")
            .arg(&out)
            .env(craterdex_kernels::level::ENV, level.to_string())
            .status()?;
        anyhow::ensure!(status.success(), "the run at {level} failed ({status})");
        let read = std::fs::read(&out)?;
        let _ = std::fs::remove_file(&out);
        rows.extend(serde_json::from_slice::<Vec<R>>(&read)?);
    }
    Ok(rows)
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
