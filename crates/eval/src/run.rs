//! An evaluation run end to end, as `craterdex eval`, the demo and Python's `evaluate` run
//! it: a benchmark loaded (and refused without queries), its gallery and queries extracted
//! once, every regime run, optionally again on a turned query set of the same gallery, and
//! the outputs written (table, JSON, per-query CSV, HTML report).

use crate::error::{Error, Result};
use crate::regime::{RegimeId, Tokens, Whiten};
use crate::{manifest, regimes, turned};
use craterdex_engine::{Extractor, FeatureSet, Progress, ProtocolInfo, RecheckPlan, Stage, Suns};
use craterdex_errors::ensure;
use std::path::{Path, PathBuf};

pub struct EvalOutcome {
    /// What the features were extracted under.
    pub protocol: ProtocolInfo,
    pub results: Vec<regimes::RegimeResult>,
    pub benchmark: manifest::Benchmark,
    pub gallery: FeatureSet,
    pub queries: FeatureSet,
    /// The gallery's suns ([`gallery_suns`]) where the options recheck: a turned run of the
    /// same gallery searches toward them too.
    pub suns: Option<Suns>,
}

/// The regimes of a quick run, or all of them.
pub fn eval_options(quick: bool) -> regimes::EvalOptions {
    if quick {
        regimes::EvalOptions::quick()
    } else {
        regimes::EvalOptions::default()
    }
}

/// Extracts a benchmark once with `extractor` and runs every regime on it; `on_regime`
/// hears each regime's name as it starts.
pub fn evaluate(
    b: manifest::Benchmark,
    extractor: &Extractor,
    o: &regimes::EvalOptions,
    progress: &dyn Progress,
    on_regime: &dyn Fn(&str),
) -> Result<EvalOutcome> {
    let gallery = extractor.extract(&b.gallery_items(), "gallery", progress)?;
    let queries = extractor.extract(&b.query_items(), "queries", progress)?;
    let variants = query_views(extractor, &b, o, progress)?;
    let suns = o.recheck.then(|| gallery_suns(&b, progress));
    let toward = query_toward(extractor, &b, suns, progress)?;
    let results = regimes::run_on_benchmark(
        &b,
        &gallery,
        &queries,
        variants.as_ref(),
        toward.iter().map(|(stage, f)| (*stage, f)).collect(),
        o,
        on_regime,
    )?;
    Ok(EvalOutcome {
        protocol: extractor.protocol(),
        results,
        benchmark: b,
        gallery,
        queries,
        suns,
    })
}

/// The suns of `gallery`'s images as an engine measures those of its index
/// ([`craterdex_engine::sun_sample`], [`craterdex_engine::sun_headings_of`]).
fn gallery_suns(gallery: &manifest::Benchmark, progress: &dyn Progress) -> Suns {
    let items = gallery.gallery_items();
    let sample =
        craterdex_engine::sun_sample(items.iter().map(|(id, p)| (id.as_str(), p.as_path())));
    let suns = craterdex_engine::sun_headings_of(&sample);
    progress.note(&format!("the gallery's suns: {suns}"));
    suns
}

/// The features of the queries of `b` in the views of each search again toward `suns`
/// (the [`RecheckPlan`]'s stages toward them: turned, then relit), with the images each verifies;
/// none without suns (the options do not recheck, or the gallery shows no sun).
fn query_toward(
    extractor: &Extractor,
    b: &manifest::Benchmark,
    suns: Option<Suns>,
    progress: &dyn Progress,
) -> Result<Vec<(Stage, FeatureSet)>> {
    let Some(suns) = suns else {
        return Ok(Vec::new());
    };
    RecheckPlan::for_suns(suns)
        .again()
        .iter()
        .filter(|stage| !stage.views.toward.is_empty())
        .map(|&stage| {
            let (_, features) =
                extractor.variant_features(&b.query_items(), stage.views, progress)?;
            Ok((stage, features))
        })
        .collect()
}

/// The features of the queries' views when the options ask for a regime in views.
fn query_views(
    extractor: &Extractor,
    b: &manifest::Benchmark,
    o: &regimes::EvalOptions,
    progress: &dyn Progress,
) -> Result<Option<FeatureSet>> {
    if o.views.is_plain() {
        return Ok(None);
    }
    let (_, features) = extractor.variant_features(&b.query_items(), o.views, progress)?;
    Ok(Some(features))
}

/// The benchmark at `path`, refused when it has no query to evaluate.
pub fn load_benchmark(path: &Path, root: Option<&Path>) -> Result<manifest::Benchmark> {
    let b = manifest::load(path, root)?;
    ensure!(
        !b.manifest.query_images.is_empty(),
        Error::Invalid(format!("{}: no query_images to evaluate", path.display()))
    );
    Ok(b)
}

/// The turned query set at `path`, refused unless its gallery is `upright`'s.
pub fn load_turned(
    path: &Path,
    root: Option<&Path>,
    upright: &manifest::Benchmark,
) -> Result<manifest::Benchmark> {
    let t = load_benchmark(path, root)?;
    let (a, b) = (&t.manifest.gallery_images, &upright.manifest.gallery_images);
    let same_gallery = a.len() == b.len() && a.iter().zip(b).all(|(a, g)| a.image_id == g.image_id);
    ensure!(
        same_gallery,
        Error::Invalid(format!(
            "{}: its gallery is not the gallery of the benchmark evaluated",
            path.display()
        ))
    );
    Ok(t)
}

/// Every regime run again on the queries of `turned` (a turned set of the same gallery),
/// paired with the upright run view by view.
pub fn evaluate_turned(
    upright: &EvalOutcome,
    turned: &manifest::Benchmark,
    manifest_path: &Path,
    extractor: &Extractor,
    o: &regimes::EvalOptions,
    progress: &dyn Progress,
) -> Result<TurnedOutcome> {
    let queries = extractor.extract(&turned.query_items(), "turned queries", progress)?;
    let variants = query_views(extractor, turned, o, progress)?;
    let toward = query_toward(extractor, turned, upright.suns, progress)?;
    let results = regimes::run_on_benchmark(
        turned,
        &upright.gallery,
        &queries,
        variants.as_ref(),
        toward.iter().map(|(stage, f)| (*stage, f)).collect(),
        o,
        &|_| {},
    )?;
    let comparison = turned::Turned {
        split: turned.manifest.split_name.clone(),
        ..turned::compare(
            &upright.results,
            &upright.queries.ids,
            &results,
            &queries.ids,
        )
    };
    Ok(TurnedOutcome {
        manifest: manifest_path.to_path_buf(),
        results,
        comparison,
        query_ids: queries.ids,
    })
}

/// Runs every regime on features already extracted from benchmark `b` under `protocol`.
pub fn evaluate_features(
    b: manifest::Benchmark,
    protocol: ProtocolInfo,
    gallery: FeatureSet,
    queries: FeatureSet,
    query_variants: Option<&FeatureSet>,
    o: &regimes::EvalOptions,
    on_regime: &dyn Fn(&str),
) -> Result<EvalOutcome> {
    let results = regimes::run_on_benchmark(
        &b,
        &gallery,
        &queries,
        query_variants,
        Vec::new(),
        o,
        on_regime,
    )?;
    Ok(EvalOutcome {
        protocol,
        results,
        benchmark: b,
        gallery,
        queries,
        suns: None,
    })
}

/// The regimes of the CraterBench-R paper alone, as it ran them (unwhitened), enough to
/// check its five findings: the reduced set and full late interaction. What a run under
/// the paper's protocol beside the shipped one needs (the demo's); `craterdex eval
/// --protocol paper` runs every regime.
pub fn paper_options() -> regimes::EvalOptions {
    regimes::EvalOptions {
        whitening: vec![Whiten::Off],
        default_recipe: false,
        full_li: true,
        ..eval_options(true)
    }
}

/// Every regime run again on a turned query set of the same gallery.
pub struct TurnedOutcome {
    pub manifest: PathBuf,
    pub results: Vec<regimes::RegimeResult>,
    /// Paired with the upright run view by view.
    pub comparison: turned::Turned,
    /// The turned or relit query views, in the order of the results' per-query rows.
    pub query_ids: Vec<String>,
}

/// Where an evaluation's outputs go, beside the table it prints.
#[derive(Clone, Copy, Debug, Default)]
pub struct OutputPaths<'a> {
    pub json: Option<&'a Path>,
    pub per_query: Option<&'a Path>,
    pub report: Option<&'a Path>,
}

/// The result tables of an evaluation as the command line prints them: each run's protocol,
/// then its regimes; the turned comparison and the paper's run follow where there are.
pub fn tables(
    out: &EvalOutcome,
    turned_run: Option<&TurnedOutcome>,
    paper: Option<&EvalOutcome>,
) -> String {
    let mut text = format!("{}\n{}", out.protocol, regimes::table(&out.results));
    if let Some(t) = turned_run {
        text.push_str(&format!("\n\n{}", turned::table(&t.comparison)));
    }
    if let Some(p) = paper {
        text.push_str(&format!(
            "\n\n{}\n{}",
            p.protocol,
            regimes::table(&p.results)
        ));
    }
    text
}

/// Writes the JSON, per-query CSV and HTML report of an evaluation, each headed by
/// the protocol it ran under. `paper` is a second run of the paper's regimes under the
/// paper's protocol (the demo's): its table follows, the JSON holds it under `paper`, its
/// per-query rows go to a file of their own (`..._paper.csv`) and the report checks the
/// paper's findings on it.
pub fn write_outputs(
    out: &EvalOutcome,
    turned_run: Option<&TurnedOutcome>,
    paper: Option<&EvalOutcome>,
    paths: OutputPaths,
    title: &str,
    run_info: serde_json::Value,
) -> Result<()> {
    if let Some(j) = paths.json {
        let mut v = regimes::to_json(&out.results, run_info.clone());
        v["protocol"] = serde_json::to_value(&out.protocol)?;
        if let Some(p) = paper {
            v["paper"] = serde_json::json!({
                "protocol": p.protocol,
                "regimes": regimes::to_json(&p.results, serde_json::Value::Null)["regimes"],
            });
        }
        if let Some(t) = turned_run {
            v["rotated"] = regimes::to_json(
                &t.results,
                serde_json::json!({"manifest": t.manifest.display().to_string()}),
            );
            v["turned_paired"] = serde_json::to_value(&t.comparison)?;
        }
        craterdex_durable::write_atomic(j, &serde_json::to_vec_pretty(&v)?)?;
        tracing::info!("wrote {}", j.display());
    }
    if let Some(p) = paths.per_query {
        let mut csv = per_query_csv(out);
        if let Some(t) = turned_run {
            csv.push_str(&regimes::per_query_rows(
                &t.comparison.split,
                &t.results,
                &t.query_ids,
                &out.gallery.ids,
            ));
        }
        craterdex_durable::write_atomic(p, csv.as_bytes())?;
        tracing::info!("wrote {}", p.display());
        if let Some(paper) = paper {
            let path = paper_sibling(p);
            craterdex_durable::write_atomic(&path, per_query_csv(paper).as_bytes())?;
            tracing::info!("wrote {}", path.display());
        }
    }
    if let Some(r) = paths.report {
        let b = &out.benchmark;
        let a = b.align(&out.gallery.ids, &out.queries.ids);
        // the examples show the strongest whitening the run has
        let cls = RegimeId::of(Tokens::Single(craterdex_engine::Pooling::Cls));
        let two_stage = RegimeId {
            shortlist: Some(100),
            ..RegimeId::fps(32)
        };
        let has = |id: RegimeId| out.results.iter().any(|r| r.id == id);
        let white = [Whiten::Pairs, Whiten::Pca]
            .into_iter()
            .find(|&w| has(two_stage.whitened(w)))
            .unwrap_or(Whiten::Off);
        let (before, after) = (cls.whitened(white), two_stage.whitened(white));
        // show queries where reranking changed the top result, then others, 8 in all
        let (bi, ai) = (
            out.results.iter().position(|r| r.id == before),
            out.results.iter().position(|r| r.id == after),
        );
        let mut show: Vec<usize> = (0..out.queries.len()).collect();
        if let (Some(bi), Some(ai)) = (bi, ai) {
            let changed =
                |q: &usize| out.results[bi].top[*q].first() != out.results[ai].top[*q].first();
            show.sort_by_key(|q| !changed(q));
        }
        show.truncate(8);
        show.sort_unstable();
        let ex = crate::report::Examples {
            query_paths: &a.query_paths,
            query_ids: &out.queries.ids,
            gallery_paths: &a.gallery_paths,
            gallery_craters: &a.gallery_craters,
            relevance: &a.relevance,
            show,
        };
        let intro = format!(
            "{} gallery and {} query images.",
            out.gallery.len(),
            out.queries.len()
        );
        let run_rows = describe_run(&run_info);
        let runs = crate::report::Runs {
            protocol: &out.protocol,
            results: &out.results,
            paper: paper.map(|p| (&p.protocol, p.results.as_slice())),
        };
        let html = crate::report::render(
            title,
            &intro,
            &run_rows,
            &runs,
            turned_run.map(|t| &t.comparison),
            Some(&ex),
            before,
            after,
        );
        craterdex_durable::write_atomic(r, html.as_bytes())?;
        tracing::info!("wrote {}", r.display());
    }
    Ok(())
}

/// The per-query CSV of `out`, its first line a comment naming the protocol it ran under
/// (`pandas.read_csv(path, comment="#")`).
fn per_query_csv(out: &EvalOutcome) -> String {
    format!(
        "# {}\n{}",
        out.protocol,
        regimes::per_query_csv(
            &out.benchmark.manifest.split_name,
            &out.results,
            &out.queries.ids,
            &out.gallery.ids,
        )
    )
}

/// `dir/name_paper.ext` beside `dir/name.ext`.
fn paper_sibling(path: &Path) -> PathBuf {
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let name = match path.extension() {
        Some(ext) => format!("{stem}_paper.{}", ext.to_string_lossy()),
        None => format!("{stem}_paper"),
    };
    path.with_file_name(name)
}

/// The run's settings and measures as rows of the report's run table: each top-level key
/// (underscores read as spaces) and its value; an object's members on one row.
pub fn describe_run(v: &serde_json::Value) -> Vec<(String, String)> {
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
            .map(|(k, v)| {
                let value = match v.as_object() {
                    Some(inner) => inner
                        .iter()
                        .map(|(ik, iv)| format!("{} {}", ik.replace('_', " "), scalar(iv)))
                        .collect::<Vec<_>>()
                        .join(", "),
                    None => scalar(v),
                };
                (k.replace('_', " "), value)
            })
            .collect(),
        None => vec![("run".into(), scalar(v))],
    }
}

#[cfg(test)]
mod tests {
    use super::describe_run;

    #[test]
    fn run_descriptions_are_rows_of_a_table() {
        let v = serde_json::json!({"model": "m", "quick": true, "index_x": {"R@1": 0.91596, "ms": 2.0}});
        let rows = describe_run(&v);
        let rows: Vec<(&str, &str)> = rows.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            rows,
            [
                ("index x", "R@1 0.916, ms 2"),
                ("model", "m"),
                ("quick", "yes")
            ]
        );
    }
}
