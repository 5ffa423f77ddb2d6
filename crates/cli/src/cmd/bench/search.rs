//! `craterdex bench search`: latency per query for each stage, codec and mode, with the
//! reference (faiss-cpu flat IP, numpy MaxSim) timed on identical data in the same run.

use super::SearchBench;
use crate::output::{bar, Bars};
use anyhow::{Context, Result};
use craterdex_engine::{encode_all, Extractor, IndexRecipe};
use craterdex_index::codec::{Codec, TokenCodec};
use craterdex_index::{ImageMeta, Index};
use craterdex_index::{Mode, SearchParams};
use craterdex_tokens::{Descriptors, Encoder, Recipe};
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde::Serialize;
use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

#[derive(Serialize)]
struct Row {
    gallery: String,
    stage: String,
    #[serde(rename = "S")]
    s: Option<usize>,
    #[serde(rename = "K")]
    k: usize,
    codec: String,
    mode: String,
    p50_ms: f64,
    p95_ms: f64,
    reference_p50_ms: Option<f64>,
    recall_at_1: Option<f64>,
    /// Share of queries whose target is in the stage-1 shortlist.
    #[serde(skip_serializing_if = "Option::is_none")]
    shortlist_recall: Option<f64>,
    /// Index bytes one query reads (single vectors scanned, token codes scored).
    #[serde(skip_serializing_if = "Option::is_none")]
    mb_read_per_query: Option<f64>,
    /// Multiply-accumulates one query needs (stage 1 dot products plus MaxSim).
    #[serde(skip_serializing_if = "Option::is_none")]
    gmac_per_query: Option<f64>,
}

/// Read bandwidth of this machine with every worker thread streaming its own part of a
/// 1 GiB buffer (best of three): the bound a search that reads its codes from memory once
/// per query cannot beat.
fn memory_read_gbps() -> f64 {
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

fn unit_rows(rng: &mut rand_chacha::ChaCha8Rng, rows: usize, d: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..rows * d).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    craterdex_tokens::l2_normalize_rows(&mut v, d);
    v
}

/// Random unit descriptors, and queries that are noisy copies (cosine ~0.7) of random
/// gallery images, returned with their targets. Images pair up into craters (2i and 2i+1),
/// as a catalogue's 2x and 3x views do, so that grouped search has views to list.
fn synthetic(
    n: usize,
    nq: usize,
    k: usize,
    d: usize,
) -> (Vec<(ImageMeta, Descriptors)>, Vec<Descriptors>, Vec<usize>) {
    let gallery: Vec<(ImageMeta, Descriptors)> = (0..n)
        .into_par_iter()
        .map(|i| {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(i as u64);
            let meta = ImageMeta {
                id: format!("g{i}"),
                crater_id: Some(format!("c{}", i / 2)),
                ..Default::default()
            };
            (
                meta,
                Descriptors {
                    single: unit_rows(&mut rng, 1, d),
                    tokens: unit_rows(&mut rng, k, d),
                },
            )
        })
        .collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(u64::MAX);
    let targets: Vec<usize> = (0..nq).map(|_| rng.gen_range(0..n)).collect();
    let sigma = 1.0 / (d as f32).sqrt();
    let queries = targets
        .iter()
        .map(|&t| {
            let noisy = |v: &[f32], rng: &mut rand_chacha::ChaCha8Rng| {
                let mut o: Vec<f32> = v
                    .iter()
                    .map(|x| x + sigma * rng.gen_range(-1.7f32..1.7))
                    .collect();
                craterdex_tokens::l2_normalize_rows(&mut o, d);
                o
            };
            Descriptors {
                single: noisy(&gallery[t].1.single, &mut rng),
                tokens: noisy(&gallery[t].1.tokens, &mut rng),
            }
        })
        .collect();
    (gallery, queries, targets)
}

fn percentiles(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(f64::total_cmp);
    let at = |p: f64| super::percentile(&ms, p);
    (at(0.5), at(0.95))
}

fn write_f32(path: &Path, parts: impl Iterator<Item = f32>) -> Result<()> {
    let bytes: Vec<u8> = parts.flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

/// Runs the reference script on identical data; returns "stage/S/mode" -> p50 ms.
fn reference(
    dir: &Path,
    gallery: &[(ImageMeta, Descriptors)],
    queries: &[Descriptors],
    k: usize,
    d: usize,
    single: usize,
) -> Result<(String, HashMap<String, f64>)> {
    std::fs::create_dir_all(dir)?;
    write_f32(
        &dir.join("g_single"),
        gallery.iter().flat_map(|g| g.1.single.iter().copied()),
    )?;
    write_f32(
        &dir.join("g_tokens"),
        gallery.iter().flat_map(|g| g.1.tokens.iter().copied()),
    )?;
    write_f32(
        &dir.join("q_single"),
        queries.iter().flat_map(|q| q.single.iter().copied()),
    )?;
    write_f32(
        &dir.join("q_tokens"),
        queries.iter().flat_map(|q| q.tokens.iter().copied()),
    )?;
    let script = super::python::script_file("bench_search_ref.py", super::python::SEARCH_SCRIPT)?;
    let python = super::python::reference_python("numpy, faiss");
    eprintln!("reference Python: {}", python.origin);
    let threads = rayon::current_num_threads();
    let out = std::process::Command::new(&python.exe)
        .arg(&script)
        .arg(dir)
        .args([gallery.len(), queries.len(), k, d, threads, single].map(|v| v.to_string()))
        .env("OMP_NUM_THREADS", threads.to_string())
        .output()
        .context("cannot run python3 for the reference")?;
    let _ = std::fs::remove_file(&script);
    for f in ["g_single", "g_tokens", "q_single", "q_tokens"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    anyhow::ensure!(
        out.status.success(),
        "reference script failed under {} (needs numpy; faiss-cpu optional):\n{}",
        python.origin,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let engine = format!(
        "{} [BLAS: {}]",
        v["engine"].as_str().unwrap_or("?"),
        v["blas"]
            .as_array()
            .map(|a| a
                .iter()
                .filter_map(|x| x.as_str())
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default()
    );
    let map = v
        .as_object()
        .map(|o| {
            o.iter()
                .filter_map(|(key, x)| Some((key.clone(), x.get("p50_ms")?.as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    Ok((engine, map))
}

/// The stage name of grouped two-stage rows (the `search` default); the other rows list
/// image by image, as the reference does.
const GROUPED_STAGE: &str = "two_stage_grouped";

/// What listing views crater by crater costs: grouped over ungrouped two-stage p50 (S 100,
/// one query at a time), per gallery and codec.
fn grouping_ratios(rows: &[Row]) -> Vec<String> {
    let p50 = |r: &Row, stage: &str| {
        rows.iter()
            .find(|o| {
                o.gallery == r.gallery
                    && o.codec == r.codec
                    && o.mode == "single"
                    && o.s == Some(100)
                    && o.stage == stage
            })
            .map(|o| o.p50_ms)
    };
    rows.iter()
        .filter(|r| r.stage == GROUPED_STAGE && r.mode == "single")
        .filter_map(|r| {
            let plain = p50(r, "two_stage")?;
            Some(format!(
                "{} {}: grouped {:.3} ms / ungrouped {:.3} ms = {:.2}x",
                r.gallery,
                r.codec,
                r.p50_ms,
                plain,
                r.p50_ms / plain
            ))
        })
        .collect()
}

struct Setup<'a> {
    name: &'a str,
    k: usize,
    single: usize,
    reference: HashMap<String, f64>,
    targets: Option<&'a [usize]>,
}

fn time_index(
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

fn measure(
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
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// The descriptors of synthetic image `i` of a clustered gallery: the single vector lies
/// around one of `clusters` centres (cosine ~0.64 to it, ~0.4 to its cluster mates), the
/// tokens are random. Deterministic in `i`, so any image can be regenerated as a target.
fn clustered_image(i: usize, k: usize, d: usize, clusters: usize) -> Descriptors {
    let centre = unit_rows(
        &mut rand_chacha::ChaCha8Rng::seed_from_u64((1 << 40) + (i % clusters) as u64),
        1,
        d,
    );
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(i as u64);
    let spread = unit_rows(&mut rng, 1, d);
    let mut single: Vec<f32> = centre
        .iter()
        .zip(&spread)
        .map(|(c, s)| c + 1.2 * s)
        .collect();
    craterdex_tokens::l2_normalize_rows(&mut single, d);
    Descriptors {
        single,
        tokens: unit_rows(&mut rng, k, d),
    }
}

fn near_copy(v: &[f32], d: usize, rng: &mut rand_chacha::ChaCha8Rng) -> Vec<f32> {
    let sigma = 1.0 / (d as f32).sqrt();
    let mut o: Vec<f32> = v
        .iter()
        .map(|x| x + sigma * rng.gen_range(-1.7f32..1.7))
        .collect();
    craterdex_tokens::l2_normalize_rows(&mut o, d);
    o
}

fn dir_bytes(dir: &Path) -> u64 {
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
fn scale(b: &SearchBench, n: usize, work: &Path, rows: &mut Vec<Row>) -> Result<()> {
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
        super::proc_status_kb("/proc/self/status", "VmHWM:").unwrap_or(f64::NAN) / 1024.0 / 1024.0,
    );
    Ok(())
}

pub fn run(b: SearchBench) -> Result<()> {
    let work = b
        .workdir
        .clone()
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("craterdex-bench-search-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let mut rows = Vec::new();
    let mut engines = Vec::new();
    let result = (|| -> Result<()> {
        if let Some(n) = b.scale {
            return scale(&b, n, &work, &mut rows);
        }
        eprintln!(
            "synthetic gallery: {} images x {} tokens x {}-d, {} planted near-duplicate queries",
            b.gallery, b.k, b.dim, b.queries
        );
        let (gallery, queries, targets) = synthetic(b.gallery, b.queries, b.k, b.dim);
        let name = format!("synthetic-{}", b.gallery);
        let reference_map = if b.no_reference {
            HashMap::new()
        } else {
            let (engine, m) =
                reference(&work.join("ref"), &gallery, &queries, b.k, b.dim, b.single)?;
            engines.push(engine);
            m
        };
        let plain = Encoder::plain(Recipe::default());
        let setup = Setup {
            name: &name,
            k: b.k,
            single: b.single,
            reference: reference_map,
            targets: Some(&targets),
        };
        measure(
            &work, &gallery, &queries, &b.codecs, &plain, &setup, &mut rows,
        )?;
        drop(gallery);
        if let Some(m) = &b.real {
            let bench = craterdex_eval::manifest::load(m, None)?;
            let bars = Bars::new();
            let extractor = Extractor::load(&Default::default(), &bars)?;
            let gf = extractor.extract(&bench.gallery_items(), "gallery", &bars)?;
            let qf = extractor.extract(&bench.query_items(), "queries", &bars)?;
            let enc = IndexRecipe::default().learn_encoder(&gf, None, &[])?;
            let gallery: Vec<(ImageMeta, Descriptors)> = bench
                .gallery_metas(&gf.ids)
                .into_iter()
                .zip(encode_all(&enc, &gf))
                .collect();
            let queries = encode_all(&enc, &qf);
            let name = format!("real-{}", gallery.len());
            let reference_map = if b.no_reference {
                HashMap::new()
            } else {
                reference(
                    &work.join("ref"),
                    &gallery,
                    &queries,
                    32,
                    enc.token_dim(gf.dim),
                    b.single,
                )?
                .1
            };
            let setup = Setup {
                name: &name,
                k: 32,
                single: b.single,
                reference: reference_map,
                targets: None,
            };
            measure(
                &work, &gallery, &queries, &b.codecs, &enc, &setup, &mut rows,
            )?;
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&work);
    result?;
    println!("{}", craterdex_kernels::level::describe());
    let reference = match engines.first() {
        None => "none".to_string(),
        Some(e) if e.starts_with("faiss") => {
            format!("{} IndexFlatIP (stage 1) and numpy (MaxSim)", engines.join(", "))
        }
        Some(_) => format!(
            "{} for stage 1 AND MaxSim: faiss-cpu could not be imported, so stage 1 fell back to numpy",
            engines.join(", ")
        ),
    };
    println!(
        "threads {}; reference: {reference}",
        rayon::current_num_threads()
    );
    let gbps = memory_read_gbps();
    println!(
        "memory read bandwidth, all threads streaming: {gbps:.1} GB/s. MB/q: index bytes one \
         query reads; mem ms: that at this bandwidth (a floor only for codes not already in the \
         last-level cache); GMAC/s: multiply-accumulates done per second at p50, to set \
         against the kernel level's peak"
    );
    println!(
        "{:<18} {:<18} {:>4} {:>3} {:<6} {:<7} {:>9} {:>9} {:>9} {:>7} {:>5} {:>5} {:>7} {:>7} {:>7}",
        "gallery",
        "stage",
        "S",
        "K",
        "codec",
        "mode",
        "p50 ms",
        "p95 ms",
        "ref p50",
        "ref/us",
        "R@1",
        "R@S",
        "MB/q",
        "mem ms",
        "GMAC/s"
    );
    for r in &rows {
        let f = |v: Option<f64>| v.map(|x| format!("{x:.3}")).unwrap_or_else(|| "-".into());
        println!(
            "{:<18} {:<18} {:>4} {:>3} {:<6} {:<7} {:>9.3} {:>9.3} {:>9} {:>7} {:>5} {:>5} {:>7} {:>7} {:>7}",
            r.gallery,
            r.stage,
            r.s.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
            r.k,
            r.codec,
            r.mode,
            r.p50_ms,
            r.p95_ms,
            f(r.reference_p50_ms),
            r.reference_p50_ms
                .map(|x| format!("{:.1}x", x / r.p50_ms))
                .unwrap_or_else(|| "-".into()),
            r.recall_at_1
                .map(|x| format!("{x:.2}"))
                .unwrap_or_else(|| "-".into()),
            r.shortlist_recall
                .map(|x| format!("{x:.2}"))
                .unwrap_or_else(|| "-".into()),
            r.mb_read_per_query
                .map(|mb| format!("{mb:.1}"))
                .unwrap_or_else(|| "-".into()),
            r.mb_read_per_query
                .map(|mb| format!("{:.3}", mb / gbps))
                .unwrap_or_else(|| "-".into()),
            r.gmac_per_query
                .map(|g| format!("{:.1}", g / r.p50_ms * 1e3))
                .unwrap_or_else(|| "-".into())
        );
    }
    let ratios = grouping_ratios(&rows);
    if !ratios.is_empty() {
        println!("view grouping (two-stage S 100, single query p50):");
        for r in ratios {
            println!("  {r}");
        }
    }
    if let Some(j) = &b.json {
        craterdex_durable::write_atomic(j, &serde_json::to_vec_pretty(&rows)?)?;
        eprintln!("wrote {}", j.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(gallery: &str, stage: &str, codec: &str, mode: &str, p50_ms: f64) -> Row {
        Row {
            gallery: gallery.into(),
            stage: stage.into(),
            s: Some(100),
            k: 32,
            codec: codec.into(),
            mode: mode.into(),
            p50_ms,
            p95_ms: p50_ms,
            reference_p50_ms: None,
            recall_at_1: None,
            shortlist_recall: None,
            mb_read_per_query: None,
            gmac_per_query: None,
        }
    }

    #[test]
    fn grouping_is_set_against_the_ungrouped_run_of_its_own_gallery_and_codec() {
        let rows = vec![
            row("a", "two_stage", "int8", "single", 2.0),
            row("a", "two_stage", "int8", "batch", 1.0),
            row("a", "two_stage", "f16", "single", 8.0),
            row("b", "two_stage", "int8", "single", 10.0),
            row("a", GROUPED_STAGE, "int8", "single", 3.0),
            row("a", GROUPED_STAGE, "int8", "batch", 9.0),
            row("b", GROUPED_STAGE, "int8", "single", 12.0),
            row("c", GROUPED_STAGE, "int8", "single", 1.0),
        ];
        assert_eq!(
            grouping_ratios(&rows),
            vec![
                "a int8: grouped 3.000 ms / ungrouped 2.000 ms = 1.50x",
                "b int8: grouped 12.000 ms / ungrouped 10.000 ms = 1.20x",
            ]
        );
    }
}
