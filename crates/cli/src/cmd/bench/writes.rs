//! `craterdex bench writes`: a stream of single-image adds through the engine the service
//! holds (one writer, a searcher running meanwhile, segments merged in the background), then
//! search latency on the grown index against a fresh build of the same images in the same
//! run, and the same stream without merging for reference.

use super::search::data::synthetic;
use super::{percentile, WritesBench};
use crate::output::bar;
use anyhow::{ensure, Result};
use craterdex_engine::{Engine, MergePolicy, SharedEngine};
use craterdex_index::codec::TokenCodec;
use craterdex_index::{ImageMeta, Index, SearchParams};
use craterdex_tokens::{Descriptors, Encoder, Recipe};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

type Images = [(ImageMeta, Descriptors)];

fn create(dir: &Path, images: &Images, codec: &TokenCodec) -> Result<()> {
    Index::create(
        dir,
        &Encoder::plain(Recipe::default()),
        codec,
        None,
        images,
        None,
    )?;
    Ok(())
}

/// What one stream of adds did.
struct Stream {
    add_ms: Vec<f64>,
    most_segments: usize,
    segments: usize,
    searches: usize,
    search_errors: usize,
    seconds: f64,
}

/// Adds `images` one at a time through a [`SharedEngine`] over the index in `dir`, merging
/// by `policy` in the background, while one thread searches.
fn stream(
    dir: &Path,
    images: &Images,
    queries: &[Descriptors],
    policy: Option<&MergePolicy>,
) -> Result<Stream> {
    let shared = SharedEngine::new(Engine::open(dir, None)?);
    if let Some(p) = policy {
        shared.merge_in_background(p.clone());
    }
    let stop = AtomicBool::new(false);
    let (searches, search_errors) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let started = Instant::now();
    let mut out = std::thread::scope(|scope| -> Result<Stream> {
        scope.spawn(|| {
            let params = SearchParams::default();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let engine = shared.snapshot();
                let hits = engine
                    .search_descriptors(std::slice::from_ref(&queries[i % queries.len()]), &params);
                if hits[0].is_empty() {
                    search_errors.fetch_add(1, Ordering::Relaxed);
                }
                searches.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        });
        let pb = bar(images.len(), "single adds");
        let mut add_ms = Vec::with_capacity(images.len());
        let mut most_segments = 0;
        let added = (|| -> Result<()> {
            for one in images.chunks(1) {
                let t = Instant::now();
                shared.write(|e| e.add(one).map(|(n, grown)| (n, Some(grown))))?;
                add_ms.push(t.elapsed().as_secs_f64() * 1e3);
                most_segments = most_segments.max(shared.snapshot().index().segment_count());
                pb.inc(1);
            }
            Ok(())
        })();
        stop.store(true, Ordering::Relaxed);
        pb.finish_and_clear();
        added?;
        Ok(Stream {
            add_ms,
            most_segments,
            segments: 0,
            searches: 0,
            search_errors: 0,
            seconds: started.elapsed().as_secs_f64(),
        })
    })?;
    if let Some(p) = policy {
        // the merges the last adds woke finish as a service's would
        shared.merge(p)?;
    }
    out.segments = shared.snapshot().index().segment_count();
    out.most_segments = out.most_segments.max(out.segments);
    out.searches = searches.into_inner();
    out.search_errors = search_errors.into_inner();
    if let Some(e) = shared.merge_error() {
        anyhow::bail!("a background merge failed: {e}");
    }
    Ok(out)
}

/// p50 of single two-stage searches (default parameters) on each index, the indexes taking
/// turns so that both see the same machine; and how many top hits the two agree on.
fn search_p50(a: &Index, b: &Index, queries: &[Descriptors], rounds: usize) -> (f64, f64, usize) {
    let params = SearchParams::default();
    let (mut ta, mut tb) = (Vec::new(), Vec::new());
    let mut agree = 0;
    for round in 0..rounds.max(1) {
        for q in queries {
            let q = std::slice::from_ref(q);
            let t = Instant::now();
            let ha = a.search(q, &params);
            ta.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            let hb = b.search(q, &params);
            tb.push(t.elapsed().as_secs_f64() * 1e3);
            let top = |idx: &Index, h: &[Vec<craterdex_index::Hit>]| {
                h[0].first().map(|h| idx.meta(h.row).id.clone())
            };
            if round == 0 && top(a, &ha) == top(b, &hb) {
                agree += 1;
            }
        }
    }
    ta.sort_by(f64::total_cmp);
    tb.sort_by(f64::total_cmp);
    (percentile(&ta, 0.5), percentile(&tb, 0.5), agree)
}

fn report(name: &str, s: &Stream, grown: &Index, fresh: &Index, queries: &[Descriptors]) {
    let mut ms = s.add_ms.clone();
    ms.sort_by(f64::total_cmp);
    let (p50, fresh_p50, agree) = search_p50(grown, fresh, queries, 3);
    println!(
        "{name:<10} {:>6} {:>8.2} {:>8.2} {:>9} {:>9} {:>9} {:>10.3} {:>10.3} {:>7.2}x {:>6}/{}",
        s.add_ms.len(),
        percentile(&ms, 0.5),
        percentile(&ms, 0.95),
        s.most_segments,
        s.segments,
        format!("{}/{}", s.searches, s.search_errors),
        p50,
        fresh_p50,
        p50 / fresh_p50,
        agree,
        queries.len()
    );
    eprintln!(
        "  {name}: {:.1} s for the stream ({:.0} adds/s)",
        s.seconds,
        s.add_ms.len() as f64 / s.seconds
    );
}

pub fn run(b: WritesBench) -> Result<()> {
    ensure!(b.base >= 1, "--base must be at least 1");
    println!("{}", craterdex_kernels::level::describe());
    let total = b.base + b.adds.max(b.reference_adds);
    let (gallery, queries, _) = synthetic(total, b.queries, b.k, b.dim);
    let sample: Vec<f32> = gallery
        .iter()
        .take(2000)
        .flat_map(|(_, d)| d.tokens.iter().copied())
        .collect();
    let codec = TokenCodec::train(b.codec, b.dim, &sample, 0)?;
    let work = tempfile::Builder::new()
        .prefix("craterdex-bench-writes")
        .tempdir_in(b.workdir.clone().unwrap_or_else(std::env::temp_dir))?;
    println!(
        "{} single adds onto an index of {} ({} tokens x {}-d, {}), one searcher meanwhile; search p50 of {} single two-stage queries (default parameters) against a fresh build of the same images",
        b.adds, b.base, b.k, b.dim, b.codec, b.queries
    );
    println!(
        "{:<10} {:>6} {:>8} {:>8} {:>9} {:>9} {:>9} {:>10} {:>10} {:>8} {:>8}",
        "merging",
        "adds",
        "add p50",
        "add p95",
        "most segs",
        "segments",
        "searches/err",
        "search p50",
        "fresh p50",
        "ratio",
        "same top-1"
    );
    let policy = MergePolicy {
        merge_factor: b
            .merge_factor
            .map_or(MergePolicy::default().merge_factor, |f| f as usize),
        ..MergePolicy::default()
    };
    let runs: Vec<(&str, usize, Option<&MergePolicy>)> = [
        ("policy", b.adds, Some(&policy)),
        ("none", b.reference_adds, None),
    ]
    .into_iter()
    .filter(|(_, n, _)| *n > 0)
    .collect();
    for (name, adds, merging) in runs {
        let (dir, fresh_dir) = (
            work.path().join(name),
            work.path().join(format!("{name}-fresh")),
        );
        create(&dir, &gallery[..b.base], &codec)?;
        let s = stream(&dir, &gallery[b.base..b.base + adds], &queries, merging)?;
        create(&fresh_dir, &gallery[..b.base + adds], &codec)?;
        let (grown, fresh) = (Index::open(&dir)?, Index::open(&fresh_dir)?);
        ensure!(
            grown.live() == b.base + adds,
            "{name}: {} images after the adds, expected {}",
            grown.live(),
            b.base + adds
        );
        report(name, &s, &grown, &fresh, &queries);
    }
    Ok(())
}
