//! The paper's evaluation regimes over one feature extraction of a benchmark.
//!
//! Names: `cls`, `gap`, `gem`, `max`; `raw_attn_kK`; `inst_attn_kK`, `inst_fps_kK`;
//! `kmeans_kK`; `full_li`; `two_stage_sS_k32` (CLS shortlist, `inst_fps_k32` rerank);
//! `inst_fps_k32_{f16,int8,pq96,pq48}`. Each also with whitening, suffixed `_white`; the
//! whitening is learned only from gallery images of craters that no query finds relevant.

use crate::metrics::{evaluate_query, shortlist_recall, summarise, QueryResult, Summary};
use anyhow::Result;
use craterdex_index::codec::{Codec, TokenCodec};
use craterdex_kernels::f32::F32Query;
use craterdex_model::extract::FeatureSet;
use craterdex_tokens::aggregate::{aggregate, Aggregation, SeedStrategy, TokenView};
use craterdex_tokens::encoder::normalised_tokens;
use craterdex_tokens::whitening::{Whitening, DEFAULT_REGULARISATION};
use craterdex_tokens::{pool, Pooling};
use rayon::prelude::*;
use serde::Serialize;
use std::collections::BTreeSet;

#[derive(Clone, Debug)]
pub struct EvalOptions {
    pub ks: Vec<usize>,
    pub kmeans_ks: Vec<usize>,
    pub shortlists: Vec<usize>,
    pub codecs: Vec<Codec>,
    pub full_li: bool,
    /// Which whitening variants to run: false = plain, true = `_white`.
    pub whitening: Vec<bool>,
    pub whiten_reg: f32,
    pub seed: u64,
}

impl Default for EvalOptions {
    fn default() -> Self {
        Self {
            ks: vec![8, 16, 32, 64, 128],
            kmeans_ks: vec![16, 32],
            shortlists: vec![50, 100, 200, 500],
            codecs: vec![
                Codec::F16,
                Codec::Int8,
                Codec::Pq { m: 96 },
                Codec::Pq { m: 48 },
            ],
            full_li: true,
            whitening: vec![false, true],
            whiten_reg: DEFAULT_REGULARISATION,
            seed: 0,
        }
    }
}

/// The regime family, for plots.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    Single,
    Raw,
    InstAttn,
    InstFps,
    KMeans,
    FullLi,
    TwoStage,
    Codec,
}

#[derive(Clone, Debug, Serialize)]
pub struct RegimeResult {
    pub name: String,
    pub family: Family,
    pub whitened: bool,
    #[serde(flatten)]
    pub summary: Summary,
    /// Tokens per image (token regimes).
    #[serde(rename = "K", skip_serializing_if = "Option::is_none")]
    pub k: Option<usize>,
    /// Stored bytes per image for the searched representation.
    pub bytes_per_image: usize,
    /// Shortlist recall R@S (two-stage regimes).
    #[serde(rename = "R@S", skip_serializing_if = "Option::is_none")]
    pub shortlist_recall: Option<f64>,
    #[serde(skip)]
    pub per_query: Vec<QueryResult>,
    /// The 10 best gallery indices per query.
    #[serde(skip)]
    pub top: Vec<Vec<usize>>,
}

pub struct EvalInput<'a> {
    pub gallery: &'a FeatureSet,
    pub queries: &'a FeatureSet,
    pub gallery_craters: &'a [String],
    pub relevance: &'a [BTreeSet<String>],
}

impl EvalInput<'_> {
    /// Gallery rows whose crater no query finds relevant: the only ones whitening may see.
    pub fn whitening_rows(&self) -> Vec<usize> {
        let query_ids: BTreeSet<&String> = self.relevance.iter().flatten().collect();
        (0..self.gallery.len())
            .filter(|&i| !query_ids.contains(&self.gallery_craters[i]))
            .collect()
    }
}

/// Normalised (and optionally whitened) patch tokens of every image, and their raw norms.
struct Prepared {
    tokens: Vec<Vec<f32>>,
    norms: Vec<Vec<f32>>,
    attention: Vec<Vec<f32>>,
    dim: usize,
}

fn prepare(f: &FeatureSet, w: Option<&Whitening>) -> Prepared {
    let (tokens, norms): (Vec<Vec<f32>>, Vec<Vec<f32>>) = (0..f.len())
        .into_par_iter()
        .map(|i| {
            let (t, n) = normalised_tokens(f.patches_of(i), f.dim);
            (w.map_or(t.clone(), |w| w.apply_rows(&t)), n)
        })
        .unzip();
    let attention = (0..f.len()).map(|i| f.attention_of(i).to_vec()).collect();
    Prepared {
        tokens,
        norms,
        attention,
        dim: w.map_or(f.dim, |w| w.dim_out),
    }
}

fn aggregate_all(p: &Prepared, how: Aggregation) -> Vec<Vec<f32>> {
    (0..p.tokens.len())
        .into_par_iter()
        .map(|i| {
            aggregate(
                &TokenView {
                    tokens: &p.tokens[i],
                    dim: p.dim,
                    attention: &p.attention[i],
                    norms: &p.norms[i],
                },
                how,
            )
        })
        .collect()
}

/// Every query's inner product with every gallery row: `[nq, n]`.
fn score_matrix(queries: &[f32], gallery: &[f32], d: usize) -> Vec<f32> {
    let n = gallery.len() / d;
    let block = craterdex_kernels::f32::BLOCK;
    let parts: Vec<Vec<f32>> = queries
        .par_chunks(block * d)
        .map(|qc| {
            let nq = qc.len() / d;
            let mut dots = Vec::new();
            F32Query::new(qc, d).dots(gallery, &mut dots);
            let mut out = vec![0f32; nq * n];
            for (r, row) in dots.chunks_exact(nq).enumerate() {
                for (q, &v) in row.iter().enumerate() {
                    out[q * n + r] = v;
                }
            }
            out
        })
        .collect();
    parts.concat()
}

/// `[nq, ng]` MaxSim scores. Every gallery image has the same token count (K' = min(K, T)).
fn maxsim_matrix(q: &[Vec<f32>], g: &[Vec<f32>], d: usize) -> Vec<f32> {
    let kd = g.first().map_or(0, |t| t.len() / d);
    let docs: Vec<f32> = g.concat();
    q.par_iter()
        .flat_map_iter(|qt| {
            let mut out = Vec::with_capacity(g.len());
            F32Query::new(qt, d).maxsim(&docs, kd, &mut out);
            out
        })
        .collect()
}

fn results_from_scores(scores: &[f32], input: &EvalInput) -> (Vec<QueryResult>, Vec<Vec<usize>>) {
    let n = input.gallery.len();
    scores
        .par_chunks(n)
        .enumerate()
        .map(|(q, s)| {
            let r = evaluate_query(q, s, input.gallery_craters, &input.relevance[q]);
            let mut idx: Vec<usize> = (0..n).collect();
            let k = 10.min(n);
            if k > 0 {
                idx.select_nth_unstable_by(k - 1, |&a, &b| s[b].total_cmp(&s[a]).then(a.cmp(&b)));
            }
            idx.truncate(k);
            idx.sort_by(|&a, &b| s[b].total_cmp(&s[a]).then(a.cmp(&b)));
            (r, idx)
        })
        .unzip()
}

/// Runs every regime; `progress` receives each regime's name as it starts.
pub fn run(
    input: &EvalInput,
    o: &EvalOptions,
    progress: &dyn Fn(&str),
) -> Result<Vec<RegimeResult>> {
    let d = input.gallery.dim;
    let n = input.gallery.len();
    let mut out = Vec::new();
    let white_rows = input.whitening_rows();
    for &white in &o.whitening {
        let suffix = if white { "_white" } else { "" };
        let push = |name: String,
                    family: Family,
                    k: Option<usize>,
                    bytes: usize,
                    scores: &[f32],
                    rs: Option<f64>,
                    out: &mut Vec<RegimeResult>| {
            let (per_query, top) = results_from_scores(scores, input);
            out.push(RegimeResult {
                name,
                family,
                whitened: white,
                summary: summarise(&per_query),
                k,
                bytes_per_image: bytes,
                shortlist_recall: rs,
                per_query,
                top,
            });
        };
        // single vectors
        let mut cls_scores = Vec::new();
        for pooling in [
            Pooling::Cls,
            Pooling::Gap,
            Pooling::Gem { p: 3.0 },
            Pooling::Max,
        ] {
            let name = format!("{}{suffix}", pooling.name());
            progress(&name);
            let pooled = |f: &FeatureSet, i: usize| pool(f.cls_of(i), f.patches_of(i), d, pooling);
            let g: Vec<Vec<f32>> = (0..n)
                .into_par_iter()
                .map(|i| pooled(input.gallery, i))
                .collect();
            let q: Vec<Vec<f32>> = (0..input.queries.len())
                .into_par_iter()
                .map(|i| pooled(input.queries, i))
                .collect();
            let (g, q) = if white {
                let sample: Vec<f32> = white_rows
                    .iter()
                    .flat_map(|&i| g[i].iter().copied())
                    .collect();
                let w = Whitening::learn(&sample, d, o.whiten_reg, None)?;
                (
                    g.iter().map(|v| w.apply(v)).collect::<Vec<_>>(),
                    q.iter().map(|v| w.apply(v)).collect::<Vec<_>>(),
                )
            } else {
                (g, q)
            };
            let dd = g[0].len();
            let scores = score_matrix(&q.concat(), &g.concat(), dd);
            push(name, Family::Single, None, dd * 4, &scores, None, &mut out);
            if pooling == Pooling::Cls {
                cls_scores = scores;
            }
        }
        // token regimes on (whitened) normalised tokens
        let token_w = if white {
            let sample_set = input.gallery.select(&white_rows);
            let refs: Vec<craterdex_tokens::FeatureRef> = (0..sample_set.len())
                .map(|i| craterdex_tokens::FeatureRef {
                    cls: sample_set.cls_of(i),
                    patches: sample_set.patches_of(i),
                    attention: sample_set.attention_of(i),
                })
                .collect();
            let recipe = craterdex_tokens::Recipe {
                whiten: true,
                whiten_reg: o.whiten_reg,
                ..Default::default()
            };
            craterdex_tokens::Encoder::learn(recipe, &refs, o.seed)?.token_whitening
        } else {
            None
        };
        let gp = prepare(input.gallery, token_w.as_ref());
        let qp = prepare(input.queries, token_w.as_ref());
        let td = gp.dim;
        let token_regime = |name: String,
                            family: Family,
                            how: Aggregation,
                            k: usize,
                            out: &mut Vec<RegimeResult>|
         -> Vec<Vec<f32>> {
            progress(&name);
            let g = aggregate_all(&gp, how);
            let q = aggregate_all(&qp, how);
            let scores = maxsim_matrix(&q, &g, td);
            let (per_query, top) = results_from_scores(&scores, input);
            out.push(RegimeResult {
                name,
                family,
                whitened: white,
                summary: summarise(&per_query),
                k: Some(k),
                bytes_per_image: k * td * 4,
                shortlist_recall: None,
                per_query,
                top,
            });
            g
        };
        let mut fps32 = None;
        let mut fps32_scores = Vec::new();
        for &k in &o.ks {
            token_regime(
                format!("raw_attn_k{k}{suffix}"),
                Family::Raw,
                Aggregation::Raw {
                    seeds: SeedStrategy::Attention,
                    k,
                },
                k,
                &mut out,
            );
            token_regime(
                format!("inst_attn_k{k}{suffix}"),
                Family::InstAttn,
                Aggregation::Instance {
                    seeds: SeedStrategy::Attention,
                    k,
                    soft_m: 1,
                },
                k,
                &mut out,
            );
            let g = token_regime(
                format!("inst_fps_k{k}{suffix}"),
                Family::InstFps,
                Aggregation::Instance {
                    seeds: SeedStrategy::Fps,
                    k,
                    soft_m: 1,
                },
                k,
                &mut out,
            );
            if k == 32 {
                fps32 = Some(g);
            }
        }
        for &k in &o.kmeans_ks {
            token_regime(
                format!("kmeans_k{k}{suffix}"),
                Family::KMeans,
                Aggregation::KMeans {
                    k,
                    iterations: 20,
                    seed: o.seed,
                },
                k,
                &mut out,
            );
        }
        if o.full_li {
            let t = input.gallery.tokens;
            token_regime(
                format!("full_li{suffix}"),
                Family::FullLi,
                Aggregation::Full,
                t,
                &mut out,
            );
        }
        // K=32 FPS instance tokens: two-stage and codecs
        let g32 = match fps32 {
            Some(g) => g,
            None => aggregate_all(
                &gp,
                Aggregation::Instance {
                    seeds: SeedStrategy::Fps,
                    k: 32,
                    soft_m: 1,
                },
            ),
        };
        let q32 = aggregate_all(
            &qp,
            Aggregation::Instance {
                seeds: SeedStrategy::Fps,
                k: 32,
                soft_m: 1,
            },
        );
        if !o.shortlists.is_empty() {
            fps32_scores = maxsim_matrix(&q32, &g32, td);
        }
        for &s in &o.shortlists {
            let name = format!("two_stage_s{s}_k32{suffix}");
            progress(&name);
            // shortlisted images rank first by their rerank score, the rest by stage 1
            let mut scores = vec![0f32; cls_scores.len()];
            let mut stage1 = Vec::with_capacity(input.queries.len());
            for q in 0..input.queries.len() {
                let c = &cls_scores[q * n..(q + 1) * n];
                let mut idx: Vec<usize> = (0..n).collect();
                let keep = s.min(n);
                if keep > 0 && keep < n {
                    idx.select_nth_unstable_by(keep - 1, |&a, &b| {
                        c[b].total_cmp(&c[a]).then(a.cmp(&b))
                    });
                }
                let row = &mut scores[q * n..(q + 1) * n];
                row.iter_mut().zip(c).for_each(|(r, v)| *r = v - 10.0);
                for &i in &idx[..keep] {
                    row[i] = fps32_scores[q * n + i] + 10.0;
                }
                stage1.push(evaluate_query(
                    q,
                    c,
                    input.gallery_craters,
                    &input.relevance[q],
                ));
            }
            let rs = shortlist_recall(&stage1, s);
            push(
                name,
                Family::TwoStage,
                Some(32),
                32 * td * 4 + td * 4,
                &scores,
                Some(rs),
                &mut out,
            );
        }
        let sample: Vec<f32> = g32.iter().take(2000).flatten().copied().collect();
        for &codec in &o.codecs {
            let name = format!("inst_fps_k32_{}{suffix}", codec.name());
            progress(&name);
            let tc = match TokenCodec::train(codec, td, &sample, o.seed) {
                Ok(tc) => tc,
                Err(e) => {
                    eprintln!("skipping {name}: {e:#}");
                    continue;
                }
            };
            let decoded: Vec<Vec<f32>> = g32
                .par_iter()
                .map(|t| {
                    let (mut p, mut sc) = (Vec::new(), Vec::new());
                    tc.encode(t, &mut p, &mut sc);
                    let mut o = vec![0f32; t.len()];
                    tc.decode(&p, &sc, &mut o);
                    o
                })
                .collect();
            let scores = maxsim_matrix(&q32, &decoded, td);
            let bytes = 32 * tc.bytes_per_token() + if tc.has_scales() { 32 * 4 } else { 0 };
            push(
                name,
                Family::Codec,
                Some(32),
                bytes,
                &scores,
                None,
                &mut out,
            );
        }
    }
    Ok(out)
}

/// `{"regimes": {name: {...}}}` as written by `craterdex eval --json`.
pub fn to_json(results: &[RegimeResult], extra: serde_json::Value) -> serde_json::Value {
    let mut regimes = serde_json::Map::new();
    for r in results {
        regimes.insert(r.name.clone(), serde_json::to_value(r).unwrap_or_default());
    }
    serde_json::json!({"regimes": regimes, "run": extra})
}

/// Per-query rows for diffing two runs: regime, query id, first relevant rank, AP.
pub fn per_query_csv(results: &[RegimeResult], query_ids: &[String]) -> String {
    let mut s = String::from("regime,query_id,first_relevant_rank,average_precision,relevant\n");
    for r in results {
        for q in &r.per_query {
            s.push_str(&format!(
                "{},{},{},{},{}\n",
                r.name,
                query_ids[q.query],
                q.first_relevant_rank
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
                q.average_precision
                    .map(|v| format!("{v:.6}"))
                    .unwrap_or_default(),
                q.relevant
            ));
        }
    }
    s
}

/// The paper-style table.
pub fn table(results: &[RegimeResult]) -> String {
    let mut s = format!(
        "{:<28} {:>6} {:>6} {:>6} {:>6} {:>8} {:>6}\n",
        "regime", "R@1", "R@5", "R@10", "mAP", "bytes", "R@S"
    );
    for r in results {
        s.push_str(&format!(
            "{:<28} {:>6.3} {:>6.3} {:>6.3} {:>6.3} {:>8} {:>6}\n",
            r.name,
            r.summary.r1,
            r.summary.r5,
            r.summary.r10,
            r.summary.map,
            r.bytes_per_image,
            r.shortlist_recall
                .map(|v| format!("{v:.3}"))
                .unwrap_or_default()
        ));
    }
    s
}
