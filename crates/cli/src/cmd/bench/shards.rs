//! `craterdex bench shards`: an index cut into N shards and searched as one catalogue (the
//! work a cluster's shards and router do, here in one process) against the index itself on
//! a benchmark's real queries: how many of the top hits agree at the default shortlist,
//! whether hits and scores are equal with a shortlist of the whole index, and latency.

use super::{percentile, ShardsBench};
use crate::output::Bars;
use anyhow::{ensure, Result};
use craterdex_engine::{Engine, SearchHit, SearchParams, ShardedEngine};
use craterdex_tokens::Descriptors;
use std::sync::Arc;
use std::time::Instant;

fn ids(hits: &[SearchHit]) -> Vec<&str> {
    hits.iter().map(|h| h.id.as_str()).collect()
}

/// Hits and scores to 1e-6, for equality.
fn keyed(hits: &[SearchHit]) -> Vec<(&str, i64)> {
    hits.iter()
        .map(|h| (h.id.as_str(), (h.score as f64 * 1e6).round() as i64))
        .collect()
}

fn single_query_ms(search: impl Fn(&[Descriptors]), queries: &[Descriptors]) -> Vec<f64> {
    queries
        .iter()
        .map(|q| {
            let t = Instant::now();
            search(std::slice::from_ref(q));
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect()
}

pub fn run(b: ShardsBench) -> Result<()> {
    println!("{}", craterdex_kernels::level::describe());
    let bench = craterdex_eval::manifest::load(&b.manifest, None)?;
    let items = bench.query_items();
    ensure!(
        !items.is_empty(),
        "{}: no query images",
        b.manifest.display()
    );
    let extractor = Arc::new(b.model.load()?);
    let engine = Engine::open(&b.index, Some(extractor.clone()))?;
    let features = extractor.extract(&items, "queries", &Bars::new())?;
    let queries = engine.encode(&features);
    let params = SearchParams {
        top_k: b.top,
        ..Default::default()
    };
    let whole_list = SearchParams {
        shortlist: engine.index().live(),
        ..params
    };
    let single = engine.search_descriptors(&queries, &params);
    let single_exact = engine.search_descriptors(&queries, &whole_list);
    let work = tempfile::Builder::new()
        .prefix("craterdex-bench-shards")
        .tempdir_in(b.workdir.clone().unwrap_or_else(std::env::temp_dir))?;
    println!(
        "{} queries of {} on {} ({} images); two-stage, top {}, shortlist {} (default) and {} (the whole index); single queries timed one shard after another in one process",
        queries.len(),
        b.manifest.display(),
        b.index.display(),
        engine.index().live(),
        b.top,
        params.shortlist,
        whole_list.shortlist
    );
    println!(
        "{:>6} {:>16} {:>22} {:>20} {:>14} {:>14} {:>7}",
        "shards",
        "images/shard",
        "top hits agreeing",
        "equal (whole list)",
        "p50 index",
        "p50 shards",
        "ratio"
    );
    for &n in &b.shards {
        let set = engine
            .index()
            .split(&work.path().join(format!("s{n}")), n, &[])?;
        let sharded = ShardedEngine::open(&work.path().join(format!("s{n}")), None)?;
        let hits = sharded.search_descriptors(&queries, &params);
        let (mut agree, mut total) = (0usize, 0usize);
        for (a, b) in single.iter().zip(&hits) {
            let mine: std::collections::HashSet<&str> = ids(b).into_iter().collect();
            agree += ids(a).iter().filter(|id| mine.contains(*id)).count();
            total += a.len();
        }
        let exact = sharded.search_descriptors(&queries, &whole_list);
        let equal = single_exact
            .iter()
            .zip(&exact)
            .filter(|(a, b)| keyed(a) == keyed(b))
            .count();
        let (mut ta, mut tb) = (Vec::new(), Vec::new());
        for _ in 0..b.repeats.max(1) {
            ta.extend(single_query_ms(
                |q| drop(engine.search_descriptors(q, &params)),
                &queries,
            ));
            tb.extend(single_query_ms(
                |q| drop(sharded.search_descriptors(q, &params)),
                &queries,
            ));
        }
        ta.sort_by(f64::total_cmp);
        tb.sort_by(f64::total_cmp);
        let (pa, pb) = (percentile(&ta, 0.5), percentile(&tb, 0.5));
        let sizes: Vec<usize> = set.shards.iter().map(|s| s.images).collect();
        println!(
            "{n:>6} {:>16} {:>15} ({:.4}) {:>20} {:>11.3} ms {:>11.3} ms {:>6.2}x",
            format!(
                "{}-{}",
                sizes.iter().min().unwrap_or(&0),
                sizes.iter().max().unwrap_or(&0)
            ),
            format!("{agree}/{total}"),
            agree as f64 / total.max(1) as f64,
            format!("{equal}/{}", queries.len()),
            pa,
            pb,
            pb / pa
        );
    }
    Ok(())
}
