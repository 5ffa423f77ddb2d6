//! Stage 1: the `k` best rows by single-vector inner product, exact (blocked GEMM, or int8
//! codes) or through the IVF lists.

use super::Stage1;
use crate::codec::Codec;
use crate::index::Index;
use crate::ivf::Ivf;
use crate::single_int8::Int8Queries;
use crate::topk::{Scored, TopK};
use craterdex_kernels::f32::F32Query;
use craterdex_kernels::gemm::{matmul_f32, PackedF32};
use rayon::prelude::*;

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
        let Some((ivf, nprobe)) = probe else {
            return self.stage1_exact(singles, k);
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
        let int8 = self.codec.codec == Codec::Int8;
        let segments = self.segment_parts(int8);
        let query8 = int8.then(|| Int8Queries::new(q, d));
        let query = (!int8).then(|| F32Query::new(q, d));
        let scan = |lists: &[u32]| {
            let (mut top, mut products, mut dots) = (TopK::new(k), Vec::new(), Vec::new());
            for seg in &segments {
                let (first, single) = (seg.first, seg.single);
                let Some(inverted) = seg.lists else { continue };
                let mut push = |_: usize, r: usize, score: f32| {
                    if !mask[first + r] {
                        top.push(first + r, score);
                    }
                };
                for &l in lists {
                    let rows = inverted.list(l);
                    let (Some(&lo), Some(&hi)) = (rows.first(), rows.last()) else {
                        continue;
                    };
                    let (lo, hi) = (lo as usize, hi as usize + 1);
                    // segments store their rows grouped by list, so a list is one run
                    let runs: Vec<(usize, usize)> = if hi - lo == rows.len() {
                        vec![(lo, hi)]
                    } else {
                        rows.iter().map(|&r| (r as usize, r as usize + 1)).collect()
                    };
                    for (lo, hi) in runs {
                        if let (Some(q8), Some(v)) = (&query8, seg.single_int8) {
                            q8.score_rows(v, lo, hi, &mut products, &mut push);
                        } else if let Some(q) = &query {
                            q.dots(&single[lo * d..hi * d], &mut dots);
                            for (i, &score) in dots.iter().enumerate() {
                                push(0, lo + i, score);
                            }
                        }
                    }
                }
            }
            top.into_sorted()
        };
        split_lists(&lists, parallel, k, scan)
    }

    /// Exact stage 1: one query splits the gallery over threads; many go in groups of
    /// [`Int8Queries::MAX`], in parallel. int8 indexes read their int8 single vectors.
    fn stage1_exact(&self, singles: &[f32], k: usize) -> Vec<Vec<Scored>> {
        const ROWS: usize = 2048;
        const F32_BATCH_GROUP: usize = 512;
        let d = self.single_dim();
        let mask = self.deleted_mask();
        let int8 = self.codec.codec == Codec::Int8;
        let segments = self.segment_parts(int8);
        // (segment, first row of the segment, rows lo..hi of it)
        let blocks: Vec<(usize, usize, usize, usize)> = segments
            .iter()
            .enumerate()
            .flat_map(|(s, seg)| {
                (0..seg.count)
                    .step_by(ROWS)
                    .map(move |lo| (s, seg.first, lo, (lo + ROWS).min(seg.count)))
            })
            .collect();
        enum Group<'q> {
            Int8(Int8Queries),
            F32(F32Query),
            /// Many f32 queries: a GEMM over each block of rows (packed once per block).
            F32Batch(&'q [f32]),
        }
        fn group_of(queries: &[f32], d: usize, int8: bool) -> Group<'_> {
            if int8 {
                Group::Int8(Int8Queries::new(queries, d))
            } else if queries.len() > F32Query::BATCH_FROM * d {
                Group::F32Batch(queries)
            } else {
                Group::F32(F32Query::new(queries, d))
            }
        }
        let scan = |group: &Group, tops: &mut [TopK], blocks: &[(usize, usize, usize, usize)]| {
            let (mut products, mut dots) = (Vec::new(), Vec::new());
            for &(s, first, lo, hi) in blocks {
                let mut push = |qi: usize, r: usize, score: f32| {
                    if !mask[first + r] {
                        tops[qi].push(first + r, score);
                    }
                };
                match (group, segments[s].single_int8) {
                    (Group::Int8(q), Some(v)) => q.score_rows(v, lo, hi, &mut products, &mut push),
                    (Group::Int8(_), None) => unreachable!("int8 copies are made for int8 groups"),
                    (Group::F32(q), _) => {
                        q.dots(&segments[s].single[lo * d..hi * d], &mut dots);
                        let nq = q.tokens();
                        for (r, row) in dots.chunks_exact(nq).enumerate() {
                            for (qi, &score) in row.iter().enumerate() {
                                push(qi, lo + r, score);
                            }
                        }
                    }
                    (Group::F32Batch(queries), _) => {
                        let (nq, n) = (queries.len() / d, hi - lo);
                        let block = PackedF32::from_columns(&segments[s].single[lo * d..], n, d, d);
                        dots.clear();
                        dots.resize(nq * n, 0.0);
                        matmul_f32(queries, nq, d, &block, &mut dots, n, false);
                        for (qi, row) in dots.chunks_exact(n).enumerate() {
                            for (r, &score) in row.iter().enumerate() {
                                push(qi, lo + r, score);
                            }
                        }
                    }
                }
            }
        };
        if singles.len() == d {
            let group = group_of(singles, d, int8);
            // one running top list per thread: every fresh list costs k insertions and a
            // burst of replacements before its threshold settles
            let per = blocks.len().div_ceil(rayon::current_num_threads()).max(1);
            let parts: Vec<Vec<Scored>> = blocks
                .par_chunks(per)
                .map(|blocks| {
                    let mut top = [TopK::new(k)];
                    scan(&group, &mut top, blocks);
                    let [top] = top;
                    top.into_sorted()
                })
                .collect();
            return vec![TopK::merge(&parts, k)];
        }
        // int8 groups are as large as the kernel's query block; f32 groups as large as keeps
        // one GEMM's queries and output rows in cache, so the gallery is read a few times
        // rather than once per 32 queries.
        let group = if int8 {
            Int8Queries::MAX
        } else {
            F32_BATCH_GROUP
        };
        singles
            .par_chunks(group * d)
            .flat_map_iter(|queries| {
                let group = group_of(queries, d, int8);
                let mut tops: Vec<TopK> = (0..queries.len() / d).map(|_| TopK::new(k)).collect();
                scan(&group, &mut tops, &blocks);
                tops.into_iter().map(TopK::into_sorted)
            })
            .collect()
    }
}
