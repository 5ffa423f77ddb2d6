//! `craterdex eval`: every regime of the paper on a benchmark, through the shipped index
//! build and search; table, JSON, per-query CSV and HTML report.

use crate::args::ModelOpts;
use crate::output::Bars;
use anyhow::{bail, Context, Result};
use clap::Args;
use craterdex_engine::FeatureSet;
use craterdex_eval::{manifest, regimes, turned};
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
    /// splits/test_rotated.json): every regime is also run on it, and the table shows what
    /// turning the queries costs.
    #[arg(long)]
    rotated: Option<PathBuf>,
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

/// Extracts a benchmark once with `extractor` and runs every regime on it.
pub fn evaluate(
    b: manifest::Benchmark,
    extractor: &craterdex_engine::Extractor,
    o: &regimes::EvalOptions,
) -> Result<EvalOutcome> {
    let bars = Bars::new();
    let gallery = extractor.extract(&b.gallery_items(), "gallery", &bars)?;
    let queries = extractor.extract(&b.query_items(), "queries", &bars)?;
    evaluate_features(b, gallery, queries, o)
}

/// The benchmark at `path`, refused when it has no query to evaluate.
fn load_benchmark(
    path: &std::path::Path,
    root: Option<&std::path::Path>,
) -> Result<manifest::Benchmark> {
    let b = manifest::load(path, root)?;
    if b.manifest.query_images.is_empty() {
        bail!("{}: no query_images to evaluate", path.display());
    }
    Ok(b)
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

/// Every regime run again on a turned query set of the same gallery.
pub struct TurnedOutcome {
    pub manifest: PathBuf,
    pub results: Vec<regimes::RegimeResult>,
    /// Paired with the upright run view by view.
    pub comparison: turned::Turned,
}

/// Writes the table, JSON, per-query CSV and HTML report of an evaluation.
pub fn write_outputs(
    out: &EvalOutcome,
    turned_run: Option<&TurnedOutcome>,
    json: Option<&std::path::Path>,
    per_query: Option<&std::path::Path>,
    report: Option<&std::path::Path>,
    title: &str,
    run_info: serde_json::Value,
) -> Result<()> {
    println!("{}", regimes::table(&out.results));
    if let Some(t) = turned_run {
        println!("\n{}", turned::table(&t.comparison));
    }
    if let Some(j) = json {
        let mut v = regimes::to_json(&out.results, run_info.clone());
        if let Some(t) = turned_run {
            v["rotated"] = regimes::to_json(
                &t.results,
                serde_json::json!({"manifest": t.manifest.display().to_string()}),
            );
            v["turned_paired"] = serde_json::to_value(&t.comparison)?;
        }
        craterdex_durable::write_atomic(j, &serde_json::to_vec_pretty(&v)?)?;
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
        // the examples show the strongest whitening the run has
        let has = |name: &str| out.results.iter().any(|r| r.name == name);
        let (before, after) = if has("two_stage_s100_k32_pairwhite") {
            ("cls_pairwhite", "two_stage_s100_k32_pairwhite")
        } else if has("two_stage_s100_k32_white") {
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
        let html = craterdex_eval::report::render(
            title,
            &intro,
            &out.results,
            turned_run.map(|t| &t.comparison),
            Some(&ex),
            before,
            after,
        );
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
    let b = load_benchmark(&c.manifest, c.root.as_deref())?;
    // a turned query set is checked before an hour of extraction, not after it
    let turned = match &c.rotated {
        Some(path) => {
            let t = load_benchmark(path, c.root.as_deref())?;
            let same_gallery = t.manifest.gallery_images.len() == b.manifest.gallery_images.len()
                && t.manifest
                    .gallery_images
                    .iter()
                    .zip(&b.manifest.gallery_images)
                    .all(|(a, g)| a.image_id == g.image_id);
            if !same_gallery {
                bail!(
                    "{}: its gallery is not the gallery of {}",
                    path.display(),
                    c.manifest.display()
                );
            }
            Some((path, t))
        }
        None => None,
    };
    let extractor = c.model.load()?;
    let out = evaluate(b, &extractor, &o)?;
    let turned_run = match turned {
        Some((path, t)) => {
            let queries = extractor.extract(&t.query_items(), "turned queries", &Bars::new())?;
            let results = regimes::run_on_benchmark(&t, &out.gallery, &queries, &o, &|_| {})?;
            let comparison =
                turned::compare(&out.results, &out.queries.ids, &results, &queries.ids);
            Some(TurnedOutcome {
                manifest: path.clone(),
                results,
                comparison,
            })
        }
        None => None,
    };
    let info = serde_json::json!({
        "manifest": c.manifest.display().to_string(),
        "quick": c.quick,
        "model": extractor.fingerprint(),
    });
    write_outputs(
        &out,
        turned_run.as_ref(),
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
