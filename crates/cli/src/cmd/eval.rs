//! `craterdex eval`: every regime of the paper on a benchmark, through the shipped index
//! build and search; table, JSON, per-query CSV and HTML report.

use crate::args::ModelOpts;
use crate::output::Bars;
use anyhow::Result;
use clap::Args;
use craterdex_eval::run;
use std::path::PathBuf;

#[derive(Args)]
pub struct EvalCmd {
    #[arg(long)]
    manifest: PathBuf,
    /// Dataset root (default: found from the manifest's location).
    #[arg(long)]
    root: Option<PathBuf>,
    #[arg(long)]
    json: Option<PathBuf>,
    /// Per-query results as CSV, to diff two runs.
    #[arg(long)]
    per_query: Option<PathBuf>,
    #[arg(long)]
    report: Option<PathBuf>,
    /// Fewer regimes (K 16 and 32, S 100, int8, no full LI, no k-means).
    #[arg(long)]
    quick: bool,
    /// A second query set of the same gallery (`bench-build --rotated-split` writes
    /// splits/test_rotated.json; scripts/relight_bench.py one per sun): every regime is also
    /// run on it, paired view by view, and the table shows what turning (or relighting) the
    /// queries costs.
    #[arg(long, visible_alias = "second-queries")]
    rotated: Option<PathBuf>,
    /// Also run the shipped recipe with every query searched turned and mirrored at this many
    /// turns (`craterdex search --turns`), as `..._grouped_turnsN` (2N forward passes per
    /// query).
    #[arg(long, default_value_t = 1)]
    query_turns: usize,
    /// Also run the shipped recipe with every query searched under the opposite sun as well
    /// (its brightness inverted, `craterdex search --opposite-sun`), as `..._grouped_oppsun`
    /// (with --query-turns, `..._grouped_turnsN_oppsun`); twice the forward passes per query.
    #[arg(long)]
    opposite_sun: bool,
    /// Also run the shipped recipe with each query's first N hits spatially verified
    /// (`craterdex search --verify N`), as `..._verifyN`, views grouped and not. The gallery's
    /// patch tokens come from its features in memory; the query time shown includes
    /// verification but not extraction.
    #[arg(long, default_value_t = 0, value_name = "N")]
    verify: usize,
    /// Also run the shipped recipe rechecked, as `craterdex search` searches query images by
    /// default: each query verified, and where its first hit does not register with it
    /// searched again turned toward the gallery's suns, then in 12 turns and under the
    /// opposite sun where it still does not, as `..._grouped_recheck`. Runs the regimes it is
    /// made of too (`..._grouped_verify50` and `..._grouped_turns12_oppgiven_verify200`, as
    /// search's search again verifies 200); the search toward the suns has no row of its own.
    #[arg(long)]
    recheck: bool,
    #[command(flatten)]
    model: ModelOpts,
}

/// What the command line shows while regimes run: a spinner, or a line per regime with its
/// time when stderr is no terminal (CI logs).
pub struct RegimeProgress {
    pb: indicatif::ProgressBar,
    started: std::sync::Mutex<(String, std::time::Instant)>,
}

impl RegimeProgress {
    pub fn new() -> Self {
        Self {
            pb: indicatif::ProgressBar::new_spinner(),
            started: std::sync::Mutex::new((String::new(), std::time::Instant::now())),
        }
    }

    fn log_done(&self, s: &(String, std::time::Instant)) {
        if !s.0.is_empty() && self.pb.is_hidden() {
            eprintln!("  {:<28} {:>6.1}s", s.0, s.1.elapsed().as_secs_f64());
        }
    }

    /// Regime `name` starts.
    pub fn start(&self, name: &str) {
        let mut s = self.started.lock().unwrap_or_else(|e| e.into_inner());
        self.log_done(&s);
        *s = (name.to_string(), std::time::Instant::now());
        self.pb.set_message(format!("evaluating {name}"));
        self.pb.tick();
    }
}

impl Drop for RegimeProgress {
    fn drop(&mut self) {
        let s = self.started.lock().unwrap_or_else(|e| e.into_inner());
        self.log_done(&s);
        self.pb.finish_and_clear();
    }
}

pub fn run(mut c: EvalCmd) -> Result<()> {
    let mut views = craterdex_engine::QueryViews {
        turns: c.query_turns,
        opposite_sun: craterdex_engine::OppositeSun::every_if(c.opposite_sun),
        ..craterdex_engine::QueryViews::PLAIN
    };
    if c.recheck {
        let plan = craterdex_engine::RecheckPlan::shipped();
        let (first, last) = (plan.first(), plan.last());
        if ![1, last.views.turns].contains(&c.query_turns)
            || ![0, first.verify].contains(&c.verify)
            || c.opposite_sun
        {
            anyhow::bail!(
                "--recheck searches again in --query-turns {} and the query as given under the \
                 opposite sun, verifying {} as given, as search rechecks; leave out \
                 --query-turns, --verify and --opposite-sun or give those numbers",
                last.views.turns,
                first.verify
            );
        }
        (views, c.verify) = (last.views, first.verify);
    }
    let o = craterdex_eval::regimes::EvalOptions {
        views,
        verify: c.verify,
        recheck: c.recheck,
        ..run::eval_options(c.quick)
    };
    if !(1..=craterdex_engine::MAX_TURNS).contains(&o.views.turns) {
        anyhow::bail!(
            "--query-turns must be between 1 and {}",
            craterdex_engine::MAX_TURNS
        );
    }
    let b = run::load_benchmark(&c.manifest, c.root.as_deref())?;
    // a turned query set is checked before an hour of extraction, not after it
    let turned = match &c.rotated {
        Some(path) => Some((path, run::load_turned(path, c.root.as_deref(), &b)?)),
        None => None,
    };
    let extractor = c.model.load()?;
    eprintln!("{}", extractor.protocol());
    let bars = Bars::new();
    let regimes = RegimeProgress::new();
    let out = run::evaluate(b, &extractor, &o, &bars, &|name| regimes.start(name))?;
    drop(regimes);
    let turned_run = match turned {
        Some((path, t)) => Some(run::evaluate_turned(&out, &t, path, &extractor, &o, &bars)?),
        None => None,
    };
    let info = serde_json::json!({
        "manifest": c.manifest.display().to_string(),
        "quick": c.quick,
        "query_turns": o.views.turns,
        "opposite_sun": c.opposite_sun,
        "verify": c.verify,
        "recheck": c.recheck,
        "model": extractor.fingerprint(),
    });
    println!("{}", run::tables(&out, turned_run.as_ref(), None));
    run::write_outputs(
        &out,
        turned_run.as_ref(),
        None,
        run::OutputPaths {
            json: c.json.as_deref(),
            per_query: c.per_query.as_deref(),
            report: c.report.as_deref(),
        },
        "craterdex evaluation",
        info,
    )?;
    Ok(())
}
