//! Two-stage search: a single-vector shortlist of S candidates, then late-interaction
//! reranking of the shortlist with the stored instance tokens; or exhaustive MaxSim.

use crate::flat::{self, Scored, TopK};
use crate::maxsim::QueryKernel;
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

#[derive(Clone, Copy, Debug)]
pub struct SearchParams {
    pub top_k: usize,
    /// Shortlist size S (two-stage only).
    pub shortlist: usize,
    pub mode: Mode,
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

impl Index {
    /// The `k` best live rows by single-vector inner product, per query (`singles` `[nq, Ds]`).
    pub fn stage1(&self, singles: &[f32], k: usize) -> Vec<Vec<Scored>> {
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

    /// MaxSim scores of one query's tokens against the given rows, each decoded into one
    /// reused buffer.
    pub fn late_interaction(&self, tokens: &[f32], rows: &[usize]) -> Vec<f32> {
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

    fn exhaustive(&self, tokens: &[f32], k: usize, parallel: bool) -> Vec<Hit> {
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
        let mut top = TopK::new(k);
        parts
            .iter()
            .flatten()
            .for_each(|s| top.push(s.row, s.score));
        top.into_sorted()
            .into_iter()
            .map(|s| Hit {
                row: s.row,
                score: s.score,
                stage1: None,
                stage2: Some(s.score),
            })
            .collect()
    }

    fn rerank(&self, tokens: &[f32], shortlist: &[Scored], k: usize) -> Vec<Hit> {
        let rows: Vec<usize> = shortlist.iter().map(|s| s.row).collect();
        let scores = self.late_interaction(tokens, &rows);
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
                if single {
                    vec![self.exhaustive(&queries[0].tokens, params.top_k, true)]
                } else {
                    queries
                        .par_iter()
                        .map(|q| self.exhaustive(&q.tokens, params.top_k, false))
                        .collect()
                }
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
                let lists = self.stage1(&singles, s);
                if params.mode == Mode::Stage1 {
                    return lists
                        .into_iter()
                        .map(|l| {
                            l.into_iter()
                                .map(|s| Hit {
                                    row: s.row,
                                    score: s.score,
                                    stage1: Some(s.score),
                                    stage2: None,
                                })
                                .collect()
                        })
                        .collect();
                }
                queries
                    .par_iter()
                    .zip(lists.par_iter())
                    .map(|(q, l)| self.rerank(&q.tokens, l, params.top_k))
                    .collect()
            }
        }
    }
}
