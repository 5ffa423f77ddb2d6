//! Two-stage search: a single-vector shortlist of S candidates, then late-interaction
//! reranking of the shortlist with the stored instance tokens; or exhaustive MaxSim.
//!
//! Every score comes from the kernels crate at the active level: int8 indexes are scored
//! straight from their codes (the query quantised like the stored tokens), other codecs
//! decode documents to f32 first.
//!
//! [`params`] holds what a search is asked and answers; [`stage1`] the single-vector
//! shortlist, exact or through the IVF lists.

mod params;
mod stage1;

use params::{hits_of, one_stage_hit};
pub use params::{Hit, Mode, SearchParams, Stage1};

use crate::codec::Codec;
use crate::index::Index;
use crate::single_int8::Int8Queries;
use crate::topk::{Scored, TopK};
use craterdex_kernels::f32::F32Query;
use craterdex_kernels::int8::I8Query;
use craterdex_tokens::Descriptors;
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};

/// Orders `hits` crater by crater: by the best score among a crater's hits, then the
/// crater's hits together, best first; a hit without a crater is a crater of its own.
/// Ties keep the order of rows, so the result does not depend on the order given.
/// `score_row` gives a hit's score and row, `crater_of` a row's crater.
pub fn order_by_crater<'m, T>(
    hits: &mut Vec<T>,
    score_row: impl Fn(&T) -> (f32, usize),
    crater_of: impl Fn(usize) -> Option<&'m str>,
) {
    let craters: Vec<Option<&str>> = hits.iter().map(|h| crater_of(score_row(h).1)).collect();
    let mut best: HashMap<&str, (f32, usize)> = HashMap::new();
    for (h, c) in hits.iter().zip(&craters) {
        if let Some(c) = c {
            let (score, row) = score_row(h);
            let b = best.entry(c).or_insert((score, row));
            if score > b.0 || (score == b.0 && row < b.1) {
                *b = (score, row);
            }
        }
    }
    // (the crater's best score and row, then the hit's own): one key per hit, not per comparison
    type ScoreRow = (f32, usize);
    let mut keyed: Vec<(ScoreRow, ScoreRow, T)> = hits
        .drain(..)
        .zip(craters)
        .map(|(h, c)| {
            let own = score_row(&h);
            (c.map_or(own, |c| best[c]), own, h)
        })
        .collect();
    keyed.sort_by(|(ka, a, _), (kb, b, _)| {
        kb.0.total_cmp(&ka.0)
            .then(ka.1.cmp(&kb.1))
            .then(b.0.total_cmp(&a.0))
            .then(a.1.cmp(&b.1))
    });
    hits.extend(keyed.into_iter().map(|(_, _, h)| h));
}
/// A query's tokens packed for the index's codec: int8 codes for int8 indexes, f32
/// otherwise.
enum TokenQuery {
    Int8(I8Query),
    F32(F32Query),
}

/// Bytes of decoded or stored tokens per run of documents scored together: a run stays in
/// L2 while every query of a batch meets it.
const RUN_BYTES: usize = 256 << 10;

impl Index {
    fn token_query(&self, tokens: &[f32]) -> TokenQuery {
        if self.codec.codec == Codec::Int8 {
            TokenQuery::Int8(I8Query::new(tokens, self.token_dim()))
        } else {
            TokenQuery::F32(F32Query::new(tokens, self.token_dim()))
        }
    }

    /// Documents per run of the exhaustive scan.
    fn docs_per_run(&self) -> usize {
        let per_doc = self.tokens_per_image()
            * self.token_dim()
            * match self.codec.codec {
                Codec::Int8 => 1,
                _ => 4,
            };
        (RUN_BYTES / per_doc.max(1)).clamp(1, 256)
    }

    /// MaxSim scores of one query's tokens against the given rows: int8 codes straight from
    /// the index, other codecs decoded row by row into one reused buffer.
    pub fn late_interaction(&self, tokens: &[f32], rows: &[usize]) -> Vec<f32> {
        let mut out = Vec::with_capacity(rows.len());
        self.score_rows(&self.token_query(tokens), rows, &mut out);
        out
    }

    fn score_rows(&self, query: &TokenQuery, rows: &[usize], out: &mut Vec<f32>) {
        let kd = self.tokens_per_image();
        match query {
            TokenQuery::Int8(q) => {
                let runs: Vec<(&[i8], &[f32])> =
                    rows.iter().filter_map(|&r| self.int8_tokens(r)).collect();
                q.maxsim(&runs, kd, out);
            }
            TokenQuery::F32(q) => {
                let mut doc = vec![0f32; kd * self.token_dim()];
                for &r in rows {
                    self.decode_tokens_into(r, &mut doc);
                    q.maxsim(&doc, kd, out);
                }
            }
        }
    }

    /// Exhaustive MaxSim for a batch of queries (one or many): runs of consecutive documents
    /// small enough to stay in cache are decoded once (int8 and f32 are read as stored) and
    /// scored against every query in turn, so a batch reads the gallery from memory once.
    fn exhaustive(&self, queries: &[Descriptors], k: usize) -> Vec<Vec<Scored>> {
        let (kd, d) = (self.tokens_per_image(), self.token_dim());
        let kernels: Vec<TokenQuery> = queries
            .iter()
            .map(|q| self.token_query(&q.tokens))
            .collect();
        let per_run = self.docs_per_run();
        let runs: Vec<(usize, usize)> = self
            .segment_parts(false)
            .iter()
            .flat_map(|seg| {
                let end = seg.first + seg.count;
                (seg.first..end)
                    .step_by(per_run)
                    .map(move |lo| (lo, (lo + per_run).min(end)))
            })
            .collect();
        let mask = self.deleted_mask();
        let parts: Vec<Vec<Vec<Scored>>> = runs
            .par_chunks(runs.len().div_ceil(4 * rayon::current_num_threads()).max(1))
            .map(|runs| {
                let mut tops: Vec<TopK> = queries.iter().map(|_| TopK::new(k)).collect();
                let (mut scores, mut decoded) = (Vec::new(), Vec::new());
                for &(lo, hi) in runs {
                    let stored = self.token_run(lo, hi);
                    for (q, top) in kernels.iter().zip(&mut tops) {
                        scores.clear();
                        match (q, &stored) {
                            (TokenQuery::Int8(q), TokenRun::Int8(runs)) => {
                                q.maxsim(runs, kd, &mut scores)
                            }
                            (TokenQuery::F32(q), TokenRun::F32(docs)) => {
                                q.maxsim(docs, kd, &mut scores)
                            }
                            (TokenQuery::F32(q), TokenRun::Coded) => {
                                if decoded.is_empty() {
                                    decoded.resize((hi - lo) * kd * d, 0.0);
                                    for (r, doc) in (lo..hi).zip(decoded.chunks_exact_mut(kd * d)) {
                                        self.decode_tokens_into(r, doc);
                                    }
                                }
                                q.maxsim(&decoded, kd, &mut scores)
                            }
                            _ => unreachable!("query kernels follow the index codec"),
                        }
                        for (i, &s) in scores.iter().enumerate() {
                            if !mask[lo + i] {
                                top.push(lo + i, s);
                            }
                        }
                    }
                    decoded.clear();
                }
                tops.into_iter().map(TopK::into_sorted).collect()
            })
            .collect();
        TopK::merge_per_query(&parts, queries.len(), k)
    }

    /// Reranks the first `shortlist` candidates by late interaction; the candidates after
    /// them keep their stage-1 order behind the reranked ones (`stage2` empty). `k` results.
    fn rerank(
        &self,
        tokens: &[f32],
        candidates: &[Scored],
        shortlist: usize,
        k: usize,
        parallel: bool,
        group_views: bool,
    ) -> Vec<Hit> {
        let (head, tail) = candidates.split_at(shortlist.min(candidates.len()));
        let mut rows: Vec<usize> = head.iter().map(|s| s.row).collect();
        if group_views {
            rows.extend(self.missing_views(&rows));
        }
        let query = self.token_query(tokens);
        let scores = if parallel && rows.len() >= 32 {
            let per = rows.len().div_ceil(rayon::current_num_threads());
            rows.par_chunks(per)
                .flat_map_iter(|c| {
                    let mut out = Vec::with_capacity(c.len());
                    self.score_rows(&query, c, &mut out);
                    out
                })
                .collect()
        } else {
            let mut out = Vec::with_capacity(rows.len());
            self.score_rows(&query, &rows, &mut out);
            out
        };
        let stage1 = head
            .iter()
            .map(|s| Some(s.score))
            .chain(std::iter::repeat(None));
        let mut hits: Vec<Hit> = rows
            .iter()
            .zip(scores)
            .zip(stage1)
            .map(|((&row, li), stage1)| Hit {
                row,
                score: li,
                stage1,
                stage2: Some(li),
            })
            .collect();
        if group_views {
            self.order_by_crater(&mut hits);
        } else {
            hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.row.cmp(&b.row)));
        }
        let reranked: HashSet<usize> = rows[head.len()..].iter().copied().collect();
        hits.extend(
            tail.iter()
                .filter(|s| !reranked.contains(&s.row))
                .map(|s| one_stage_hit(s.row, s.score, Mode::Stage1)),
        );
        hits.truncate(k);
        hits
    }

    /// Live rows of the craters of `rows` that `rows` lacks, each once.
    fn missing_views(&self, rows: &[usize]) -> Vec<usize> {
        let mut seen: HashSet<usize> = rows.iter().copied().collect();
        let mut out = Vec::new();
        for &r in rows {
            out.extend(self.other_views(r).filter(|&v| seen.insert(v)));
        }
        out
    }

    fn order_by_crater(&self, hits: &mut Vec<Hit>) {
        order_by_crater(
            hits,
            |h| (h.score, h.row),
            |row| self.meta(row).crater_id.as_deref(),
        );
    }

    /// Groups the hits of a one-stage search (`mode`) per query: adds the views missing from
    /// each list, scored as `mode` scores, orders crater by crater and keeps `k`: the same `k`
    /// as grouping the whole ranking, since a crater in the first `k` places has its best
    /// view among the `k` best hits.
    fn group_hits(
        &self,
        queries: &[Descriptors],
        lists: Vec<Vec<Hit>>,
        k: usize,
        mode: Mode,
    ) -> Vec<Vec<Hit>> {
        queries
            .par_iter()
            .zip(lists)
            .map(|(q, hits)| self.group_query_hits(q, hits, k, mode))
            .collect()
    }

    fn group_query_hits(
        &self,
        q: &Descriptors,
        mut hits: Vec<Hit>,
        k: usize,
        mode: Mode,
    ) -> Vec<Hit> {
        let rows: Vec<usize> = hits.iter().map(|h| h.row).collect();
        let missing = self.missing_views(&rows);
        let scores = if mode == Mode::Stage1 {
            self.stage1_rows(&q.single, &missing)
        } else {
            self.late_interaction(&q.tokens, &missing)
        };
        hits.extend(
            missing
                .into_iter()
                .zip(scores)
                .map(|(row, score)| one_stage_hit(row, score, mode)),
        );
        self.order_by_crater(&mut hits);
        hits.truncate(k);
        hits
    }

    /// Single-vector scores of one query (`single`) against `rows`, as stage 1 scores them.
    fn stage1_rows(&self, single: &[f32], rows: &[usize]) -> Vec<f32> {
        let d = self.single_dim();
        let mut out = Vec::with_capacity(rows.len());
        if self.codec.codec == Codec::Int8 {
            let query = Int8Queries::new(single, d);
            let mut products = Vec::new();
            for &r in rows {
                let seg = self.segment_of(r);
                let local = r - seg.first_row;
                query.score_rows(
                    seg.single_int8(d),
                    local,
                    local + 1,
                    &mut products,
                    |_, _, s| out.push(s),
                );
            }
        } else {
            let query = F32Query::new(single, d);
            let mut dots = Vec::new();
            for &r in rows {
                query.dots(self.single_of(r), &mut dots);
                out.push(dots[0]);
            }
        }
        out
    }

    /// Searches many queries at once (parallel over queries).
    pub fn search(&self, queries: &[Descriptors], params: &SearchParams) -> Vec<Vec<Hit>> {
        if queries.is_empty() {
            return Vec::new();
        }
        let single = queries.len() == 1;
        let (k, group) = (params.top_k, params.group_views);
        match params.mode {
            Mode::Exhaustive => {
                let hits = hits_of(self.exhaustive(queries, k), Mode::Exhaustive);
                if !group {
                    return hits;
                }
                self.group_hits(queries, hits, k, Mode::Exhaustive)
            }
            Mode::Stage1 | Mode::TwoStage => {
                let singles: Vec<f32> = queries
                    .iter()
                    .flat_map(|q| q.single.iter().copied())
                    .collect();
                let s = if params.mode == Mode::Stage1 {
                    k
                } else {
                    params.shortlist.max(k)
                };
                let lists = self.stage1(&singles, s, params.stage1);
                if params.mode == Mode::Stage1 {
                    let hits = hits_of(lists, Mode::Stage1);
                    if !group {
                        return hits;
                    }
                    return self.group_hits(queries, hits, k, Mode::Stage1);
                }
                let shortlist = params.shortlist;
                if single {
                    let q = &queries[0];
                    return vec![self.rerank(&q.tokens, &lists[0], shortlist, k, true, group)];
                }
                queries
                    .par_iter()
                    .zip(lists.par_iter())
                    .map(|(q, l)| self.rerank(&q.tokens, l, shortlist, k, false, group))
                    .collect()
            }
        }
    }
}

impl Index {
    /// Searches each query as several variants of one image (`queries[q]`: its variants, the
    /// image as given first; e.g. the same crop turned and mirrored) and ranks every image by
    /// its best score over them, the variants after the first counted `margin` lower, so that
    /// a query that needs no variant keeps its own answer unless another is clearly better.
    /// Exact over each variant's ranking: an image in the fused first `top_k` is in the
    /// first `top_k` of the variant that gives its score.
    pub fn search_variants(
        &self,
        queries: &[Vec<Descriptors>],
        params: &SearchParams,
        margins: &[f32],
    ) -> Vec<Vec<Hit>> {
        let flat: Vec<Descriptors> = queries.iter().flatten().cloned().collect();
        if flat.len() == queries.len() {
            // one variant each: a plain search, ranked as the plain search ranks
            return self.search(&flat, params);
        }
        let mut lists = self.search(&flat, params).into_iter();
        queries
            .iter()
            .map(|variants| {
                let lists: Vec<Vec<Hit>> = lists.by_ref().take(variants.len()).collect();
                let mut hits = best_of_variants(lists, margins);
                // as a plain search lists them: reranked hits (grouped when asked), then the
                // shortlist's tail by its stage-1 scores
                let tail_from = hits
                    .iter()
                    .position(|h| !is_reranked(h, params.mode))
                    .unwrap_or(hits.len());
                let mut tail = hits.split_off(tail_from);
                if params.group_views {
                    self.order_by_crater(&mut hits);
                }
                hits.append(&mut tail);
                hits.truncate(params.top_k);
                hits
            })
            .collect()
    }
}

/// A two-stage hit late interaction scored (the others carry stage-1 scores, on another
/// scale); every hit of a one-stage search.
fn is_reranked(h: &Hit, mode: Mode) -> bool {
    mode != Mode::TwoStage || h.stage2.is_some()
}

/// Each row's hit with the best score over the variants' lists (variant `v`'s scores
/// `margins[v]` lower, 0 past the end; a late-interaction score before any stage-1 one),
/// reranked hits first, each part best first.
fn best_of_variants(lists: Vec<Vec<Hit>>, margins: &[f32]) -> Vec<Hit> {
    let key = |h: &Hit| (h.stage2.is_some(), h.score);
    let mut best: HashMap<usize, Hit> = HashMap::new();
    for (v, list) in lists.into_iter().enumerate() {
        let penalty = margins.get(v).copied().unwrap_or(0.0);
        for h in list {
            let h = Hit {
                score: h.score - penalty,
                ..h
            };
            match best.get(&h.row) {
                Some(b) if key(b) >= key(&h) => {}
                _ => {
                    best.insert(h.row, h);
                }
            }
        }
    }
    let mut hits: Vec<Hit> = best.into_values().collect();
    hits.sort_by(|a, b| {
        b.stage2
            .is_some()
            .cmp(&a.stage2.is_some())
            .then(b.score.total_cmp(&a.score))
            .then(a.row.cmp(&b.row))
    });
    hits
}

/// The stored tokens of a run of documents, as the kernels read them.
enum TokenRun<'a> {
    /// int8 codes and scales.
    Int8([(&'a [i8], &'a [f32]); 1]),
    /// f32 tokens as stored.
    F32(&'a [f32]),
    /// Another codec: decoded on demand.
    Coded,
}

impl Index {
    fn token_run(&self, lo: usize, hi: usize) -> TokenRun<'_> {
        match self.codec.codec {
            Codec::Int8 => {
                let (codes, scales) = self.int8_run(lo, hi);
                TokenRun::Int8([(codes, scales)])
            }
            Codec::F32 => TokenRun::F32(self.f32_run(lo, hi)),
            _ => TokenRun::Coded,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(row: usize, score: f32) -> Hit {
        Hit {
            row,
            score,
            stage1: None,
            stage2: Some(score),
        }
    }

    #[test]
    fn variants_keep_each_rows_best_score_the_others_a_margin_lower() {
        let as_given = vec![hit(1, 0.60), hit(2, 0.50)];
        let turned = vec![hit(2, 0.64), hit(3, 0.70)];
        let fused = best_of_variants(vec![as_given.clone(), turned.clone()], &[0.0, 0.05]);
        let rows: Vec<(usize, f32)> = fused.iter().map(|h| (h.row, h.score)).collect();
        // row 3 only through the turned variant (0.65), row 1 as given (0.60), row 2's
        // turned 0.64 - 0.05 = 0.59 beats its 0.50
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].0, 3);
        assert_eq!(rows[1], (1, 0.60));
        assert_eq!(rows[2].0, 2);
        assert!((rows[2].1 - 0.59).abs() < 1e-6 && (rows[0].1 - 0.65).abs() < 1e-6);
        // a margin larger than the gap keeps the query's own first answer
        let fused = best_of_variants(vec![as_given.clone(), turned.clone()], &[0.0, 0.2]);
        assert_eq!(fused[0].row, 1);
        // a shortlist's tail (stage-1 scores, another scale) stays behind reranked hits,
        // and a row reranked in one variant keeps that score
        let tail = |row, score| Hit {
            stage2: None,
            stage1: Some(score),
            ..hit(row, score)
        };
        // each variant its own margin: the first list may count lower too
        let fused = best_of_variants(vec![as_given.clone(), turned], &[0.2, 0.0]);
        assert_eq!(fused[0].row, 3);
        assert!((fused[0].score - 0.70).abs() < 1e-6);
        let fused = best_of_variants(
            vec![as_given, vec![tail(4, 0.95), tail(1, 0.99)]],
            &[0.0, 0.05],
        );
        let rows: Vec<usize> = fused.iter().map(|h| h.row).collect();
        assert_eq!(rows, [1, 2, 4]);
        assert_eq!(fused[0].score, 0.60);
    }
}
