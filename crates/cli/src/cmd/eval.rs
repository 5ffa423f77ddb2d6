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
    let info = serde_json::json!({
        "manifest": c.manifest.display().to_string(),
        "quick": c.quick,
        "model": extractor.fingerprint(),
    });
    write_outputs(
        &out,
        c.json.as_deref(),
        c.per_query.as_deref(),
        c.report.as_deref(),
        "craterdex evaluation",
        info,
    )?;
    if let Some((path, t)) = turned {
        let queries = extractor.extract(&t.query_items(), "turned queries", &Bars::new())?;
        let results = regimes::run_on_benchmark(&t, &out.gallery, &queries, &o, &|_| {})?;
        println!(
            "\n{}",
            turned_table(&out.results, &out.queries.ids, &results, &queries.ids)
        );
        if let Some(j) = &c.json {
            let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(j)?)?;
            v["rotated"] = regimes::to_json(
                &results,
                serde_json::json!({"manifest": path.display().to_string()}),
            );
            craterdex_durable::write_atomic(j, &serde_json::to_vec_pretty(&v)?)?;
        }
    }
    Ok(())
}

/// Each regime's mAP and R@1 over the query views that exist both as built and turned
/// (a turned crop that leaves the tile is missing), paired view by view, so that the loss
/// is what turning costs and nothing else.
fn turned_table(
    upright: &[regimes::RegimeResult],
    upright_ids: &[String],
    turned: &[regimes::RegimeResult],
    turned_ids: &[String],
) -> String {
    let position: std::collections::HashMap<&str, usize> = upright_ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    let pairs: Vec<(usize, usize)> = turned_ids
        .iter()
        .enumerate()
        .filter_map(|(t, id)| Some((*position.get(id.strip_suffix('r')?)?, t)))
        .collect();
    let mut table = format!(
        "{} query views as built and turned (paired)\n{:<30} {:>7} {:>7} {:>7} {:>6} {:>6}\n",
        pairs.len(),
        "regime",
        "mAP",
        "turned",
        "loss",
        "R@1",
        "turned"
    );
    for u in upright {
        let Some(r) = turned.iter().find(|r| r.name == u.name) else {
            continue;
        };
        let by_query =
            |res: &regimes::RegimeResult| -> std::collections::HashMap<usize, (f64, bool)> {
                res.per_query
                    .iter()
                    .filter_map(|q| {
                        Some((
                            q.query,
                            (q.average_precision?, q.first_relevant_rank == Some(1)),
                        ))
                    })
                    .collect()
            };
        let (bu, bt) = (by_query(u), by_query(r));
        let both: Vec<((f64, bool), (f64, bool))> = pairs
            .iter()
            .filter_map(|(i, t)| Some((*bu.get(i)?, *bt.get(t)?)))
            .collect();
        let n = both.len().max(1) as f64;
        let map_u = both.iter().map(|(a, _)| a.0).sum::<f64>() / n;
        let map_t = both.iter().map(|(_, b)| b.0).sum::<f64>() / n;
        let r1_u = both.iter().filter(|(a, _)| a.1).count() as f64 / n;
        let r1_t = both.iter().filter(|(_, b)| b.1).count() as f64 / n;
        table.push_str(&format!(
            "{:<30} {:>7.4} {:>7.4} {:>7.4} {:>6.3} {:>6.3}\n",
            u.name,
            map_u,
            map_t,
            map_u - map_t,
            r1_u,
            r1_t
        ));
    }
    table
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
