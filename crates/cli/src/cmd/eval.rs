//! `craterdex eval`: every regime of the paper on a benchmark, through the shipped index
//! build and search; table, JSON, per-query CSV and HTML report.

use crate::args::ModelOpts;
use crate::output::Bars;
use anyhow::{bail, Context, Result};
use clap::Args;
use craterdex_engine::FeatureSet;
use craterdex_eval::{manifest, regimes};
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
    #[command(flatten)]
    model: ModelOpts,
}

pub struct EvalOutcome {
    pub results: Vec<regimes::RegimeResult>,
    pub benchmark: manifest::Benchmark,
    pub gallery: FeatureSet,
    pub queries: FeatureSet,
}

pub fn eval_options(quick: bool) -> regimes::EvalOptions {
    if quick {
        regimes::EvalOptions::quick()
    } else {
        regimes::EvalOptions::default()
    }
}

/// Extracts a benchmark once and runs every regime on it.
pub fn evaluate(
    manifest_path: &std::path::Path,
    root: Option<&std::path::Path>,
    model: &ModelOpts,
    o: &regimes::EvalOptions,
) -> Result<EvalOutcome> {
    let b = manifest::load(manifest_path, root)?;
    if b.manifest.query_images.is_empty() {
        bail!("{}: no query_images to evaluate", manifest_path.display());
    }
    let extractor = model.load()?;
    let bars = Bars::new();
    let gallery = extractor.extract(&b.gallery_items(), "gallery", &bars)?;
    let queries = extractor.extract(&b.query_items(), "queries", &bars)?;
    evaluate_features(b, gallery, queries, o)
}

/// Runs every regime on features already extracted from benchmark `b`.
pub fn evaluate_features(
    b: manifest::Benchmark,
    gallery: FeatureSet,
    queries: FeatureSet,
    o: &regimes::EvalOptions,
) -> Result<EvalOutcome> {
    let pb = indicatif::ProgressBar::new_spinner();
    let started = std::sync::Mutex::new((String::new(), std::time::Instant::now()));
    let log_done = || {
        let s = started.lock().unwrap();
        if !s.0.is_empty() && pb.is_hidden() {
            eprintln!("  {:<28} {:>6.1}s", s.0, s.1.elapsed().as_secs_f64());
        }
    };
    let results = regimes::run_on_benchmark(&b, &gallery, &queries, o, &|name| {
        log_done();
        *started.lock().unwrap() = (name.to_string(), std::time::Instant::now());
        pb.set_message(format!("evaluating {name}"));
        pb.tick();
    })
    .context("evaluation failed")?;
    log_done();
    pb.finish_and_clear();
    Ok(EvalOutcome {
        results,
        benchmark: b,
        gallery,
        queries,
    })
}

/// Writes the table, JSON, per-query CSV and HTML report of an evaluation.
pub fn write_outputs(
    out: &EvalOutcome,
    json: Option<&std::path::Path>,
    per_query: Option<&std::path::Path>,
    report: Option<&std::path::Path>,
    title: &str,
    run_info: serde_json::Value,
) -> Result<()> {
    println!("{}", regimes::table(&out.results));
    if let Some(j) = json {
        craterdex_durable::write_atomic(
            j,
            &serde_json::to_vec_pretty(&regimes::to_json(&out.results, run_info.clone()))?,
        )?;
        eprintln!("wrote {}", j.display());
    }
    if let Some(p) = per_query {
        craterdex_durable::write_atomic(
            p,
            regimes::per_query_csv(&out.results, &out.queries.ids, &out.gallery.ids).as_bytes(),
        )?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(r) = report {
        let b = &out.benchmark;
        let a = b.align(&out.gallery.ids, &out.queries.ids);
        let white = out
            .results
            .iter()
            .any(|r| r.name == "two_stage_s100_k32_white");
        let (before, after) = if white {
            ("cls_white", "two_stage_s100_k32_white")
        } else {
            ("cls", "two_stage_s100_k32")
        };
        // show queries where reranking changed the top result, then others, 8 in all
        let (bi, ai) = (
            out.results.iter().position(|r| r.name == before),
            out.results.iter().position(|r| r.name == after),
        );
        let mut show: Vec<usize> = (0..out.queries.len()).collect();
        if let (Some(bi), Some(ai)) = (bi, ai) {
            let changed =
                |q: &usize| out.results[bi].top[*q].first() != out.results[ai].top[*q].first();
            show.sort_by_key(|q| !changed(q));
        }
        show.truncate(8);
        show.sort_unstable();
        let ex = craterdex_eval::report::Examples {
            query_paths: &a.query_paths,
            query_ids: &out.queries.ids,
            gallery_paths: &a.gallery_paths,
            gallery_craters: &a.gallery_craters,
            relevance: &a.relevance,
            show,
        };
        let intro = format!(
            "{} gallery and {} query images. {}",
            out.gallery.len(),
            out.queries.len(),
            describe_run(&run_info)
        );
        let html =
            craterdex_eval::report::render(title, &intro, &out.results, Some(&ex), before, after);
        craterdex_durable::write_atomic(r, html.as_bytes())?;
        eprintln!("wrote {}", r.display());
    }
    Ok(())
}

/// `key: value; key: a 0.916, b 0.975` from a run description, for people to read.
fn describe_run(v: &serde_json::Value) -> String {
    fn scalar(v: &serde_json::Value) -> String {
        match v {
            serde_json::Value::Number(n) => n
                .as_f64()
                .map(|f| {
                    if f.fract() == 0.0 {
                        format!("{f}")
                    } else {
                        format!("{f:.3}")
                    }
                })
                .unwrap_or_default(),
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Bool(b) => (if *b { "yes" } else { "no" }).into(),
            other => other.to_string(),
        }
    }
    match v.as_object() {
        Some(map) => map
            .iter()
            .map(|(k, v)| match v.as_object() {
                Some(inner) => format!(
                    "{}: {}",
                    k.replace('_', " "),
                    inner
                        .iter()
                        .map(|(ik, iv)| format!("{} {}", ik.replace('_', " "), scalar(iv)))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None => format!("{}: {}", k.replace('_', " "), scalar(v)),
            })
            .collect::<Vec<_>>()
            .join("; "),
        None => scalar(v),
    }
}

pub fn run(c: EvalCmd) -> Result<()> {
    let o = eval_options(c.quick);
    let out = evaluate(&c.manifest, c.root.as_deref(), &c.model, &o)?;
    let info = serde_json::json!({"manifest": c.manifest.display().to_string(), "quick": c.quick});
    write_outputs(
        &out,
        c.json.as_deref(),
        c.per_query.as_deref(),
        c.report.as_deref(),
        "craterdex evaluation",
        info,
    )
}

#[cfg(test)]
mod tests {
    use super::describe_run;

    #[test]
    fn run_descriptions_read_as_text() {
        let v = serde_json::json!({"model": "m", "quick": true, "index_x": {"R@1": 0.91596, "ms": 2.0}});
        assert_eq!(
            describe_run(&v),
            "index x: R@1 0.916, ms 2; model: m; quick: yes"
        );
    }
}
