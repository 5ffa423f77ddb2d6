//! Timing the shipped search: every stage, codec and mode on one gallery, the scale runs of
//! an index on disk, and the machine's memory bandwidth they are set against.

use super::super::SearchBench;
use super::data::{clustered_image, near_copy};
use super::table::{Row, GROUPED_STAGE};
use crate::output::bar;
use anyhow::{Context, Result};
use craterdex_engine::{feature_refs, Engine, FeatureSet, PatchGrid, PatchGrids, SearchHit};
use craterdex_index::codec::{Codec, TokenCodec};
use craterdex_index::{ImageMeta, Index, Mode, SearchParams};
use craterdex_tokens::{Descriptors, Encoder, Recipe};
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Read bandwidth of this machine with every worker thread streaming its own part of a
/// 1 GiB buffer (best of three): the bound a search that reads its codes from memory once
/// per query cannot beat.
pub(super) fn memory_read_gbps() -> f64 {
    let words = vec![1u64; 1 << 27];
    let chunk = words.len() / rayon::current_num_threads().max(1);
    (0..3)
        .map(|_| {
            let t = Instant::now();
            let sum: u64 = words
                .par_chunks(chunk.max(1))
                .map(|c| c.iter().fold(0u64, |a, &w| a.wrapping_add(w)))
                .sum();
            std::hint::black_box(sum);
            (words.len() * 8) as f64 / t.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}

pub(super) fn percentiles(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(f64::total_cmp);
    let at = |p: f64| super::super::percentile(&ms, p);
    (at(0.5), at(0.95))
}

pub(super) struct Setup<'a> {
    pub(super) name: &'a str,
    pub(super) k: usize,
    pub(super) single: usize,
    pub(super) reference: HashMap<String, f64>,
    pub(super) targets: Option<&'a [usize]>,
    /// The patch grids the verification rows verify.
    pub(super) grids: Grids<'a>,
}

/// Where the patch grids of the verification rows come from.
pub(super) enum Grids<'a> {
    /// A real benchmark's features, queries and gallery.
    Real {
        queries: &'a FeatureSet,
        gallery: &'a FeatureSet,
    },
    /// Every query the same random grid of `tokens` x `dim` and every candidate a noisy copy
    /// of it: every patch corresponds, the most work verification can meet.
    WorstCase { tokens: usize, dim: usize },
}

/// Patch tokens per image of the synthetic verification rows: a 224 px crop's 16 x 16.
pub(super) const WORST_CASE_TOKENS: usize = 256;

/// Candidates verified per query in the verification rows: those a query image's default,
/// rechecked search verifies (`search --verify 50`).
pub(super) fn verified() -> usize {
    craterdex_engine::RecheckPlan::shipped().first().verify
}

/// Times the grouped two-stage search of the index in `dir` with each query's first
/// [`verified`] images spatially verified (`search --verify`), one query at a time, beside
/// the same search unverified in the same loop.
fn time_verification(
    dir: &Path,
    queries: &[Descriptors],
    codec: &str,
    s: &Setup,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let engine = Engine::new(Index::open(dir)?, None)?;
    let params = SearchParams {
        top_k: 10,
        shortlist: 100,
        mode: Mode::TwoStage,
        group_views: true,
        ..Default::default()
    };
    let n = s.single.min(queries.len());
    let (query_grids, real_gallery, copy): (Vec<PatchGrid>, _, _) = match &s.grids {
        Grids::Real { queries, gallery } => (
            feature_refs(queries)
                .into_iter()
                .take(n)
                .map(|f| engine.patch_grid(f))
                .collect(),
            Some(PatchGrids::new(gallery)),
            None,
        ),
        Grids::WorstCase { tokens, dim } => {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
            let mut unit = |noise: f32, base: &[f32]| -> Vec<f32> {
                let mut t: Vec<f32> = base
                    .iter()
                    .map(|&x| x + noise * rng.gen_range(-1.0f32..1.0))
                    .collect();
                craterdex_tokens::l2_normalize_rows(&mut t, *dim);
                t
            };
            let base = unit(1.0, &vec![0.0; tokens * dim]);
            let candidate = Arc::new(PatchGrid {
                tokens: unit(0.05, &base),
                dim: *dim,
            });
            let grid = PatchGrid {
                tokens: base,
                dim: *dim,
            };
            (vec![grid; n], None, Some(candidate))
        }
    };
    let candidate = |h: &SearchHit| match (&real_gallery, &copy) {
        (Some(g), _) => g.get(&engine, &h.id),
        (None, c) => c.clone(),
    };
    // the first pass makes the real gallery's grids (an index with stored patch tokens would
    // read them); the timed pass verifies
    for q in 0..n {
        engine.search_verified(
            &queries[q..q + 1],
            &query_grids[q..q + 1],
            &params,
            verified(),
            &candidate,
        );
    }
    let (mut plain_ms, mut verified_ms) = (Vec::new(), Vec::new());
    for q in 0..n {
        let t = Instant::now();
        std::hint::black_box(engine.search_descriptors(&queries[q..q + 1], &params));
        plain_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        std::hint::black_box(engine.search_verified(
            &queries[q..q + 1],
            &query_grids[q..q + 1],
            &params,
            verified(),
            &candidate,
        ));
        verified_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    // a verified search reranks a deeper shortlist than the plain one it is timed beside
    let verified_shortlist = craterdex_engine::verified_search_params(&params).shortlist;
    for (stage, shortlist, ms) in [
        (GROUPED_STAGE.to_string(), params.shortlist, plain_ms),
        (verified_stage(), verified_shortlist, verified_ms),
    ] {
        let (p50, p95) = percentiles(ms);
        rows.push(Row {
            gallery: s.name.to_string(),
            stage,
            s: Some(shortlist),
            k: s.k,
            codec: codec.to_string(),
            mode: "same loop".into(),
            p50_ms: p50,
            p95_ms: p95,
            reference_p50_ms: None,
            recall_at_1: None,
            shortlist_recall: None,
            mb_read_per_query: None,
            gmac_per_query: None,
        });
    }
    Ok(())
}

/// The stage name of the verification rows.
pub(super) fn verified_stage() -> String {
    format!("{GROUPED_STAGE}_verify{}", verified())
}

pub(super) fn time_index(
    idx: &Index,
    queries: &[Descriptors],
    codec: &str,
    s: &Setup,
    stage1_too: bool,
    rows: &mut Vec<Row>,
) {
    let nq = queries.len();
    let single_n = s.single.min(nq);
    // (stage, S, mode, views grouped by crater)
    let mut cases: Vec<(&str, Option<usize>, Mode, bool)> = Vec::new();
    if stage1_too {
        cases.push(("stage1", Some(100), Mode::Stage1, false));
    }
    cases.extend([
        ("two_stage", Some(100), Mode::TwoStage, false),
        (GROUPED_STAGE, Some(100), Mode::TwoStage, true),
        ("two_stage", Some(500), Mode::TwoStage, false),
        ("exhaustive", None, Mode::Exhaustive, false),
    ]);
    for (stage, sz, mode, group_views) in cases {
        let params = SearchParams {
            top_k: 10,
            shortlist: sz.unwrap_or(0),
            mode,
            group_views,
            ..Default::default()
        };
        let (single_q, batch_q, reps) = if mode == Mode::Exhaustive {
            (single_n.min(10), nq.min(50), 1)
        } else {
            (single_n, nq, 3)
        };
        let mut single_ms = Vec::new();
        let mut hits_at_1 = 0;
        for (i, q) in queries.iter().take(single_q).enumerate() {
            let t = Instant::now();
            let r = idx.search(std::slice::from_ref(q), &params);
            single_ms.push(t.elapsed().as_secs_f64() * 1e3);
            if s.targets
                .is_some_and(|tg| r[0].first().is_some_and(|h| h.row == tg[i]))
            {
                hits_at_1 += 1;
            }
        }
        let mut batch_ms = Vec::new();
        for _ in 0..reps {
            let t = Instant::now();
            idx.search(&queries[..batch_q], &params);
            batch_ms.push(t.elapsed().as_secs_f64() * 1e3 / batch_q as f64);
        }
        let key = |m: &str| format!("{stage}/{}/{m}", sz.unwrap_or(0));
        let (n, d) = (idx.live() as f64, idx.single_dim() as f64);
        let single_bytes = if codec == "int8" { d } else { 4.0 * d };
        let token_bytes = idx.token_bytes_per_image() as f64;
        let pair_macs = (s.k * s.k) as f64 * d;
        let (bytes, macs) = match (mode, sz) {
            (Mode::Stage1, _) => (n * single_bytes, n * d),
            (Mode::TwoStage, Some(sl)) => (
                n * single_bytes + sl as f64 * token_bytes,
                n * d + sl as f64 * pair_macs,
            ),
            _ => (n * token_bytes, n * pair_macs),
        };
        let recall = s.targets.map(|_| hits_at_1 as f64 / single_q.max(1) as f64);
        for (mode_name, ms) in [("single", single_ms), ("batch", batch_ms)] {
            let (p50, p95) = percentiles(ms);
            rows.push(Row {
                gallery: s.name.to_string(),
                stage: stage.to_string(),
                s: sz,
                k: s.k,
                codec: match mode {
                    // stage 1 reads f32 single vectors, or int8 copies in int8 indexes
                    Mode::Stage1 if codec != "int8" => "f32".into(),
                    _ => codec.to_string(),
                },
                mode: mode_name.into(),
                p50_ms: p50,
                p95_ms: p95,
                reference_p50_ms: s.reference.get(&key(mode_name)).copied(),
                recall_at_1: if mode_name == "single" { recall } else { None },
                shortlist_recall: None,
                mb_read_per_query: Some(bytes / 1e6),
                gmac_per_query: Some(macs / 1e9),
            });
        }
    }
}

pub(super) fn measure(
    work: &Path,
    gallery: &[(ImageMeta, Descriptors)],
    queries: &[Descriptors],
    codecs: &[Codec],
    encoder: &Encoder,
    s: &Setup,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let d = queries[0].tokens.len() / s.k;
    let sample: Vec<f32> = gallery
        .iter()
        .take(1000)
        .flat_map(|g| g.1.tokens.iter().copied())
        .collect();
    for (i, &codec) in codecs.iter().enumerate() {
        let dir = work.join(format!("{}-{}", s.name, codec.name()));
        let t = Instant::now();
        let tc = TokenCodec::train(codec, d, &sample, 0)?;
        Index::create(&dir, encoder, &tc, None, gallery, None)?;
        let idx = Index::open(&dir)?;
        eprintln!(
            "{}: built {} index of {} images in {:.1}s; timing",
            s.name,
            codec.name(),
            idx.live(),
            t.elapsed().as_secs_f64()
        );
        // stage 1 reads int8 single vectors in int8 indexes and f32 ones in the others:
        // time each kind once
        let first_of_kind = !codecs[..i]
            .iter()
            .any(|c| (*c == Codec::Int8) == (codec == Codec::Int8));
        time_index(&idx, queries, &codec.name(), s, first_of_kind, rows);
        drop(idx);
        // verification once per gallery, on the shipped codec where it is timed
        let shipped = codecs.iter().position(|&c| c == Codec::Int8).unwrap_or(0);
        if i == shipped {
            time_verification(&dir, queries, &codec.name(), s, rows)?;
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// The descriptors of synthetic image `i` of a clustered gallery: the single vector lies
/// around one of `clusters` centres (cosine ~0.64 to it, ~0.4 to its cluster mates), the
/// tokens are random. Deterministic in `i`, so any image can be regenerated as a target.
pub(super) fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .map(|e| {
                    let p = e.path();
                    if p.is_dir() {
                        dir_bytes(&p)
                    } else {
                        e.metadata().map_or(0, |m| m.len())
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

/// The million-image run: build chunk by chunk, then time IVF and exact stage 1 and
/// two-stage search, with shortlist recall of planted near-duplicates.
pub(super) fn scale(b: &SearchBench, n: usize, work: &Path, rows: &mut Vec<Row>) -> Result<()> {
    use craterdex_index::ivf::{default_lists, default_nprobe, Ivf};
    use craterdex_index::Stage1;
    let (k, d) = (b.k, b.dim);
    let clusters = (n / 100).max(1);
    let chunk = 50_000;
    let dir = work.join(format!("clustered-{n}"));
    let encoder = Encoder::plain(Recipe::default());
    let codec = TokenCodec::train(Codec::Int8, d, &[], 0)?;
    let lists = default_lists(n);
    let t0 = Instant::now();
    let pb = bar(n, "build");
    for start in (0..n).step_by(chunk) {
        let imgs: Vec<(ImageMeta, Descriptors)> = (start..(start + chunk).min(n))
            .into_par_iter()
            .map(|i| {
                let meta = ImageMeta {
                    id: format!("g{i}"),
                    crater_id: Some(format!("c{i}")),
                    ..Default::default()
                };
                (meta, clustered_image(i, k, d, clusters))
            })
            .collect();
        if start == 0 {
            let singles: Vec<f32> = imgs
                .iter()
                .flat_map(|g| g.1.single.iter().copied())
                .collect();
            let ivf = Ivf::train(&singles, d, lists.min(imgs.len()), 0)?;
            Index::create(
                &dir,
                &encoder,
                &codec,
                None,
                &imgs,
                Some((&ivf, default_nprobe(lists))),
            )?;
        } else {
            Index::add(&dir, &imgs)?;
        }
        pb.set_position((start + imgs.len()) as u64);
    }
    pb.finish_and_clear();
    let build_s = t0.elapsed().as_secs_f64();
    let t = Instant::now();
    let idx = Index::open(&dir)?;
    let open_s = t.elapsed().as_secs_f64();
    let (_, nprobe) = idx.ivf().context("the scale index has no IVF lists")?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(u64::MAX);
    let picks: Vec<usize> = (0..b.queries).map(|_| rng.gen_range(0..n)).collect();
    // Rows of the targets (IVF segments store images grouped by list).
    let targets: Vec<usize> = picks
        .iter()
        .map(|&t| idx.row_of(&format!("g{t}")).context("a target is missing"))
        .collect::<Result<_>>()?;
    let queries: Vec<Descriptors> = picks
        .iter()
        .map(|&t| {
            let g = clustered_image(t, k, d, clusters);
            Descriptors {
                single: near_copy(&g.single, d, &mut rng),
                tokens: near_copy(&g.tokens, d, &mut rng),
            }
        })
        .collect();
    let name = format!("clustered-{n}");
    let cases = [
        ("stage1-ivf", Stage1::Auto, Mode::Stage1, b.single, true),
        (
            "stage1-ivf",
            Stage1::Probe(nprobe * 4),
            Mode::Stage1,
            b.single,
            true,
        ),
        (
            "stage1-exact",
            Stage1::Exact,
            Mode::Stage1,
            b.single.min(20),
            false,
        ),
        (
            "two_stage-ivf",
            Stage1::Auto,
            Mode::TwoStage,
            b.single,
            true,
        ),
        (
            "two_stage-ivf",
            Stage1::Probe(nprobe * 4),
            Mode::TwoStage,
            b.single,
            true,
        ),
    ];
    for (stage, how, mode, single_n, batch) in cases {
        let params = SearchParams {
            top_k: 10,
            shortlist: 100,
            mode,
            stage1: how,
            group_views: false,
        };
        let probe = match how {
            Stage1::Auto => nprobe,
            Stage1::Probe(p) => p,
            Stage1::Exact => 0,
        };
        let shortlist_recall = {
            let singles: Vec<f32> = queries
                .iter()
                .take(single_n.max(100))
                .flat_map(|q| q.single.iter().copied())
                .collect();
            let lists = idx.stage1(&singles, 100, how);
            let hit = lists
                .iter()
                .zip(&targets)
                .filter(|(l, &t)| l.iter().any(|s| s.row == t))
                .count();
            hit as f64 / lists.len() as f64
        };
        let mut single_ms = Vec::new();
        let mut hits = 0;
        for (q, &t) in queries.iter().zip(&targets).take(single_n) {
            let t0 = Instant::now();
            let r = idx.search(std::slice::from_ref(q), &params);
            single_ms.push(t0.elapsed().as_secs_f64() * 1e3);
            hits += r[0].first().is_some_and(|h| h.row == t) as usize;
        }
        let mut measured = vec![("single", single_ms)];
        if batch {
            let t0 = Instant::now();
            idx.search(&queries, &params);
            measured.push((
                "batch",
                vec![t0.elapsed().as_secs_f64() * 1e3 / queries.len() as f64],
            ));
        }
        for (mode_name, ms) in measured {
            let (p50, p95) = percentiles(ms);
            rows.push(Row {
                gallery: name.clone(),
                stage: if probe > 0 {
                    format!("{stage}/p{probe}")
                } else {
                    stage.to_string()
                },
                s: Some(100),
                k,
                // an int8 index: stage 1 reads int8 single vectors too
                codec: "int8".into(),
                mode: mode_name.into(),
                p50_ms: p50,
                p95_ms: p95,
                reference_p50_ms: None,
                recall_at_1: (mode_name == "single").then(|| hits as f64 / single_n.max(1) as f64),
                shortlist_recall: (mode_name == "single").then_some(shortlist_recall),
                mb_read_per_query: None,
                gmac_per_query: None,
            });
        }
    }
    eprintln!(
        "{name}: {lists} IVF lists (default nprobe {nprobe}), {clusters} generating clusters; built in {build_s:.0} s \
         ({} segments), {:.2} GB on disk, opened (CRC-verified) in {open_s:.1} s; peak RSS {:.2} GB",
        idx.segment_count(),
        dir_bytes(&dir) as f64 / 1e9,
        super::super::proc_status_kb("/proc/self/status", "VmHWM:").unwrap_or(f64::NAN) / 1024.0 / 1024.0,
    );
    Ok(())
}
