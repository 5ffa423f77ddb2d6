//! Two-stage search: a single-vector shortlist of S candidates, then late-interaction
//! reranking of the shortlist with the stored instance tokens; or exhaustive MaxSim.

use crate::codec::Codec;
use crate::flat::{self, Scored, TopK};
use crate::flat_int8::{Int8Queries, Int8Vectors};
use crate::ivf::Ivf;
use crate::maxsim::{Int8Query, QueryKernel};
use crate::store::Index;
use craterdex_tokens::Descriptors;
use rayon::prelude::*;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Single-vector search only.
    Stage1,
    /// Shortlist then rerank.
    TwoStage,
    /// MaxSim against every image.
    Exhaustive,
}

/// How stage 1 finds its shortlist.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Stage1 {
    /// IVF with the index's default `nprobe` when the index has IVF lists, exact otherwise.
    #[default]
    Auto,
    /// Every single vector.
    Exact,
    /// `n` IVF lists (exact when the index has none).
    Probe(usize),
}

impl Stage1 {
    /// From an `nprobe` option: none is `Auto`, 0 is `Exact`.
    pub fn from_nprobe(nprobe: Option<usize>) -> Self {
        match nprobe {
            None => Stage1::Auto,
            Some(0) => Stage1::Exact,
            Some(n) => Stage1::Probe(n),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct SearchParams {
    pub top_k: usize,
    /// Shortlist size S (two-stage only).
    pub shortlist: usize,
    pub mode: Mode,
    pub stage1: Stage1,
}

impl std::str::FromStr for Mode {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        Ok(match s {
            "two-stage" | "two_stage" => Mode::TwoStage,
            "stage1" | "single" => Mode::Stage1,
            "exhaustive" | "li" => Mode::Exhaustive,
            _ => anyhow::bail!("unknown mode {s:?}: use two-stage, stage1 or exhaustive"),
        })
    }
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Stage1 => "stage1",
            Mode::TwoStage => "two-stage",
            Mode::Exhaustive => "exhaustive",
        }
    }
}

impl Default for SearchParams {
    fn default() -> Self {
        Self {
            top_k: 10,
            shortlist: 100,
            mode: Mode::TwoStage,
            stage1: Stage1::Auto,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Hit {
    pub row: usize,
    /// The score the ranking used.
    pub score: f32,
    pub stage1: Option<f32>,
    pub stage2: Option<f32>,
}

/// Results of a one-stage search: the score is stage 1's or stage 2's, by `mode`.
fn hits_of(lists: Vec<Vec<Scored>>, mode: Mode) -> Vec<Vec<Hit>> {
    let stage1 = mode == Mode::Stage1;
    lists
        .into_iter()
        .map(|l| {
            l.into_iter()
                .map(|s| Hit {
                    row: s.row,
                    score: s.score,
                    stage1: stage1.then_some(s.score),
                    stage2: (!stage1).then_some(s.score),
                })
                .collect()
        })
        .collect()
}

/// Runs `scan` over the probed lists: on one thread, or split over the pool (one query
/// alone) with the partial top lists merged.
fn split_lists(
    lists: &[u32],
    parallel: bool,
    k: usize,
    scan: impl Fn(&[u32]) -> Vec<Scored> + Sync + Send,
) -> Vec<Scored> {
    if !parallel {
        return scan(lists);
    }
    let per = lists.len().div_ceil(rayon::current_num_threads()).max(1);
    let parts: Vec<Vec<Scored>> = lists.par_chunks(per).map(scan).collect();
    TopK::merge(&parts, k)
}

impl Index {
    /// The `k` best live rows by single-vector inner product, per query (`singles` `[nq, Ds]`),
    /// exact or through the IVF lists.
    pub fn stage1(&self, singles: &[f32], k: usize, how: Stage1) -> Vec<Vec<Scored>> {
        let probe = match (how, self.ivf()) {
            (Stage1::Exact, _) | (_, None) => None,
            (Stage1::Auto, Some((ivf, n))) => Some((ivf, n)),
            (Stage1::Probe(n), Some((ivf, _))) => Some((ivf, n.max(1))),
        };
        let int8 = self.codec.codec == Codec::Int8;
        let Some((ivf, nprobe)) = probe else {
            return if int8 {
                self.stage1_exact_int8(singles, k)
            } else {
                self.stage1_exact(singles, k)
            };
        };
        let d = self.single_dim();
        if singles.len() == d {
            vec![self.stage1_ivf(ivf, singles, k, nprobe, true)]
        } else {
            singles
                .par_chunks(d)
                .map(|q| self.stage1_ivf(ivf, q, k, nprobe, false))
                .collect()
        }
    }

    /// Scans the `nprobe` best lists; `parallel` splits the lists over the thread pool (one
    /// query alone; a batch is already parallel over its queries).
    fn stage1_ivf(
        &self,
        ivf: &Ivf,
        q: &[f32],
        k: usize,
        nprobe: usize,
        parallel: bool,
    ) -> Vec<Scored> {
        let d = self.single_dim();
        let lists = ivf.probe(q, nprobe);
        let mask = self.deleted_mask();
        if self.codec.codec == Codec::Int8 {
            let segments = self.int8_single_segments();
            let query = Int8Queries::new(q, d);
            let scan = |lists: &[u32]| {
                let (mut top, mut products) = (TopK::new(k), Vec::new());
                for &(first, vectors, inverted) in &segments {
                    let Some(inverted) = inverted else { continue };
                    let mut push = |_: usize, r: usize, s: f32| {
                        if !mask[first + r] {
                            top.push(first + r, s);
                        }
                    };
                    for &l in lists {
                        let rows = inverted.list(l);
                        let (Some(&lo), Some(&hi)) = (rows.first(), rows.last()) else {
                            continue;
                        };
                        let (lo, hi) = (lo as usize, hi as usize + 1);
                        // segments store their rows grouped by list, so a list is one run
                        if hi - lo == rows.len() {
                            query.score_rows(vectors, lo, hi, &mut products, &mut push);
                        } else {
                            for &r in rows {
                                let r = r as usize;
                                query.score_rows(vectors, r, r + 1, &mut products, &mut push);
                            }
                        }
                    }
                }
                top.into_sorted()
            };
            return split_lists(&lists, parallel, k, scan);
        }
        let scan = |lists: &[u32]| {
            let mut top = TopK::new(k);
            for (first, single, inverted) in self.ivf_segments() {
                for &l in lists {
                    for &r in inverted.list(l) {
                        let (r, row) = (r as usize, first + r as usize);
                        if !mask[row] {
                            top.push(row, craterdex_tokens::dot(q, &single[r * d..(r + 1) * d]));
                        }
                    }
                }
            }
            top.into_sorted()
        };
        split_lists(&lists, parallel, k, scan)
    }

    /// Exact stage 1 of an int8 index from its int8 single vectors: one query splits the
    /// gallery over threads; many go in groups of [`Int8Queries::MAX`], in parallel.
    fn stage1_exact_int8(&self, singles: &[f32], k: usize) -> Vec<Vec<Scored>> {
        const ROWS: usize = 2048;
        let d = self.single_dim();
        let mask = self.deleted_mask();
        let segments = self.int8_single_segments();
        let scan = |query: &Int8Queries,
                    tops: &mut [TopK],
                    first: usize,
                    v,
                    lo,
                    hi,
                    products: &mut Vec<i32>| {
            query.score_rows(v, lo, hi, products, |qi, r, s| {
                if !mask[first + r] {
                    tops[qi].push(first + r, s);
                }
            });
        };
        if singles.len() == d {
            let query = Int8Queries::new(singles, d);
            let blocks: Vec<(usize, &Int8Vectors, usize, usize)> = segments
                .iter()
                .flat_map(|&(first, v, _)| {
                    (0..v.len())
                        .step_by(ROWS)
                        .map(move |lo| (first, v, lo, (lo + ROWS).min(v.len())))
                })
                .collect();
            // one running top list per thread: every fresh list costs k insertions and a
            // burst of replacements before its threshold settles
            let per = blocks.len().div_ceil(rayon::current_num_threads()).max(1);
            let parts: Vec<Vec<Scored>> = blocks
                .par_chunks(per)
                .map(|blocks| {
                    let (mut top, mut products) = ([TopK::new(k)], Vec::new());
                    for &(first, v, lo, hi) in blocks {
                        scan(&query, &mut top, first, v, lo, hi, &mut products);
                    }
                    let [top] = top;
                    top.into_sorted()
                })
                .collect();
            return vec![TopK::merge(&parts, k)];
        }
        singles
            .par_chunks(Int8Queries::MAX * d)
            .flat_map_iter(|group| {
                let query = Int8Queries::new(group, d);
                let mut tops: Vec<TopK> = (0..query.len()).map(|_| TopK::new(k)).collect();
                let mut products = Vec::new();
                for &(first, v, _) in &segments {
                    for lo in (0..v.len()).step_by(ROWS) {
                        let hi = (lo + ROWS).min(v.len());
                        scan(&query, &mut tops, first, v, lo, hi, &mut products);
                    }
                }
                tops.into_iter().map(TopK::into_sorted)
            })
            .collect()
    }

    fn stage1_exact(&self, singles: &[f32], k: usize) -> Vec<Vec<Scored>> {
        let d = self.single_dim();
        let nq = singles.len() / d;
        let mut tops: Vec<TopK> = (0..nq).map(|_| TopK::new(k)).collect();
        let mask = self.deleted_mask();
        for (first, block) in self.single_blocks() {
            let n = block.len() / d;
            let part = flat::search(block, d, singles, k, Some(&mask[first..first + n]));
            for (top, res) in tops.iter_mut().zip(part) {
                res.iter().for_each(|s| top.push(first + s.row, s.score));
            }
        }
        tops.into_iter().map(TopK::into_sorted).collect()
    }

    /// The int8 tile kernel for a query, when the index is int8 and the CPU has AMX.
    fn int8_query(&self, tokens: &[f32]) -> Option<Int8Query> {
        if self.codec.codec != Codec::Int8 {
            return None;
        }
        Int8Query::new(tokens, self.token_dim())
    }

    /// MaxSim scores of one query's tokens against the given rows: int8 codes straight on
    /// AMX tiles, otherwise each row decoded into one reused buffer.
    pub fn late_interaction(&self, tokens: &[f32], rows: &[usize]) -> Vec<f32> {
        if let Some(q8) = self.int8_query(tokens) {
            let parts: Vec<(&[i8], &[f32])> =
                rows.iter().filter_map(|&r| self.int8_tokens(r)).collect();
            let mut out = Vec::with_capacity(rows.len());
            q8.score_parts(&parts, self.tokens_per_image(), &mut Vec::new(), &mut out);
            return out;
        }
        let kernel = QueryKernel::new(tokens, self.token_dim());
        let mut doc = vec![0f32; self.tokens_per_image() * self.token_dim()];
        let mut scratch = Vec::new();
        rows.iter()
            .map(|&r| {
                self.decode_tokens_into(r, &mut doc);
                kernel.score(&doc, &mut scratch)
            })
            .collect()
    }

    /// Exhaustive MaxSim for decoded tokens (codecs without a tile kernel).
    fn exhaustive(&self, tokens: &[f32], k: usize, parallel: bool) -> Vec<Scored> {
        let rows: Vec<usize> = (0..self.rows()).filter(|&r| !self.is_deleted(r)).collect();
        let score_chunk = |chunk: &[usize]| {
            let mut top = TopK::new(k);
            for block in chunk.chunks(256) {
                for (&r, s) in block.iter().zip(self.late_interaction(tokens, block)) {
                    top.push(r, s);
                }
            }
            top.into_sorted()
        };
        let parts: Vec<Vec<Scored>> = if parallel {
            rows.par_chunks(2048).map(score_chunk).collect()
        } else {
            vec![score_chunk(&rows)]
        };
        TopK::merge(&parts, k)
    }

    /// Exhaustive MaxSim from the int8 codes for a batch of queries: runs of consecutive
    /// documents small enough to stay in cache are scored against every query in turn, so
    /// a batch reads the gallery from memory once rather than once per query.
    fn exhaustive_int8(&self, queries: &[Int8Query], k: usize) -> Vec<Vec<Scored>> {
        const DOCS: usize = 32;
        let (kd, d) = (self.tokens_per_image(), self.token_dim());
        let mut runs = Vec::new();
        for (first, codes, scales) in self.int8_segments() {
            for (i, sc) in scales.chunks(DOCS * kd.max(1)).enumerate() {
                let start = i * DOCS * kd;
                runs.push((
                    first + i * DOCS,
                    &codes[start * d..(start + sc.len()) * d],
                    sc,
                ));
            }
        }
        let mask = self.deleted_mask();
        let parts: Vec<Vec<Vec<Scored>>> = runs
            .par_chunks(32)
            .map(|runs| {
                let mut tops: Vec<TopK> = queries.iter().map(|_| TopK::new(k)).collect();
                let (mut products, mut scores) = (Vec::new(), Vec::new());
                for &(first, codes, scales) in runs {
                    for (q, top) in queries.iter().zip(&mut tops) {
                        scores.clear();
                        q.score_docs(codes, scales, kd, &mut products, &mut scores);
                        for (i, &s) in scores.iter().enumerate() {
                            if !mask[first + i] {
                                top.push(first + i, s);
                            }
                        }
                    }
                }
                tops.into_iter().map(TopK::into_sorted).collect()
            })
            .collect();
        TopK::merge_per_query(&parts, queries.len(), k)
    }

    fn rerank(&self, tokens: &[f32], shortlist: &[Scored], k: usize, parallel: bool) -> Vec<Hit> {
        let rows: Vec<usize> = shortlist.iter().map(|s| s.row).collect();
        let scores = if parallel && rows.len() >= 32 {
            let per = rows.len().div_ceil(rayon::current_num_threads());
            rows.par_chunks(per)
                .flat_map_iter(|c| self.late_interaction(tokens, c))
                .collect()
        } else {
            self.late_interaction(tokens, &rows)
        };
        let mut hits: Vec<Hit> = shortlist
            .iter()
            .zip(scores)
            .map(|(s, li)| Hit {
                row: s.row,
                score: li,
                stage1: Some(s.score),
                stage2: Some(li),
            })
            .collect();
        hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.row.cmp(&b.row)));
        hits.truncate(k);
        hits
    }

    /// Searches many queries at once (parallel over queries).
    pub fn search(&self, queries: &[Descriptors], params: &SearchParams) -> Vec<Vec<Hit>> {
        if queries.is_empty() {
            return Vec::new();
        }
        let single = queries.len() == 1;
        match params.mode {
            Mode::Exhaustive => {
                let tiles: Option<Vec<Int8Query>> =
                    queries.iter().map(|q| self.int8_query(&q.tokens)).collect();
                let lists = if let Some(tiles) = tiles {
                    self.exhaustive_int8(&tiles, params.top_k)
                } else if single {
                    vec![self.exhaustive(&queries[0].tokens, params.top_k, true)]
                } else {
                    queries
                        .par_iter()
                        .map(|q| self.exhaustive(&q.tokens, params.top_k, false))
                        .collect()
                };
                hits_of(lists, Mode::Exhaustive)
            }
            Mode::Stage1 | Mode::TwoStage => {
                let singles: Vec<f32> = queries
                    .iter()
                    .flat_map(|q| q.single.iter().copied())
                    .collect();
                let s = if params.mode == Mode::Stage1 {
                    params.top_k
                } else {
                    params.shortlist.max(params.top_k)
                };
                let lists = self.stage1(&singles, s, params.stage1);
                if params.mode == Mode::Stage1 {
                    return hits_of(lists, Mode::Stage1);
                }
                if single {
                    return vec![self.rerank(&queries[0].tokens, &lists[0], params.top_k, true)];
                }
                queries
                    .par_iter()
                    .zip(lists.par_iter())
                    .map(|(q, l)| self.rerank(&q.tokens, l, params.top_k, false))
                    .collect()
            }
        }
    }
}
