//! Exact inner-product search over single vectors: blocked matrix products (gemm) and a
//! bounded heap per query; parallel over queries, or over gallery blocks for few queries.

use gemm::Parallelism;
use rayon::prelude::*;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scored {
    pub row: usize,
    pub score: f32,
}

/// Heap entry ordered so the heap's top is the worst kept result (lowest score, then highest row).
#[derive(PartialEq)]
struct Worst(Scored);
impl Eq for Worst {}
impl Ord for Worst {
    fn cmp(&self, o: &Self) -> Ordering {
        o.0.score
            .total_cmp(&self.0.score)
            .then(self.0.row.cmp(&o.0.row))
    }
}
impl PartialOrd for Worst {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// Keeps the `k` best of a stream of scores.
pub struct TopK {
    k: usize,
    heap: BinaryHeap<Worst>,
}

impl TopK {
    /// The `k` best of several partial top lists (from threads that scanned parts).
    pub fn merge(parts: &[Vec<Scored>], k: usize) -> Vec<Scored> {
        let mut top = TopK::new(k);
        parts
            .iter()
            .flatten()
            .for_each(|s| top.push(s.row, s.score));
        top.into_sorted()
    }

    /// Per query, the `k` best of the partial lists that parts of a scan produced
    /// (`partials[part][query]`).
    pub fn merge_per_query(partials: &[Vec<Vec<Scored>>], nq: usize, k: usize) -> Vec<Vec<Scored>> {
        (0..nq)
            .map(|q| {
                let mut top = TopK::new(k);
                partials
                    .iter()
                    .flat_map(|p| &p[q])
                    .for_each(|s| top.push(s.row, s.score));
                top.into_sorted()
            })
            .collect()
    }

    pub fn new(k: usize) -> Self {
        Self {
            k,
            heap: BinaryHeap::with_capacity(k + 1),
        }
    }
    #[inline]
    pub fn push(&mut self, row: usize, score: f32) {
        if self.k == 0 {
            return;
        }
        if self.heap.len() < self.k {
            self.heap.push(Worst(Scored { row, score }));
        } else if let Some(top) = self.heap.peek() {
            if score > top.0.score || (score == top.0.score && row < top.0.row) {
                self.heap.pop();
                self.heap.push(Worst(Scored { row, score }));
            }
        }
    }
    /// Best first; ties by lower row.
    pub fn into_sorted(self) -> Vec<Scored> {
        let mut v: Vec<Scored> = self.heap.into_iter().map(|w| w.0).collect();
        sort_scored(&mut v);
        v
    }
}

pub fn sort_scored(v: &mut [Scored]) {
    v.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.row.cmp(&b.row)));
}

const BLOCK: usize = 4096;
const QUERY_CHUNK: usize = 64;

/// `out[i, j] = <a_i, b_j>` for row-major `a` `[m, d]` and `b` `[n, d]`: `out` becomes
/// `[m, n]` row-major. Single-threaded; callers parallelise around it.
///
/// `b` (gallery blocks, candidate tokens) is the large side and `a` (queries) the small one:
/// computing `out^T = b a^T` makes `b` gemm's left operand, streamed, and `a` the right
/// operand, which gemm packs — packing the large side instead cost more than the products.
pub fn products(a: &[f32], b: &[f32], d: usize, out: &mut Vec<f32>) {
    let (m, n) = (a.len() / d, b.len() / d);
    out.resize(m * n, 0.0);
    // SAFETY: dst element (r, i) of the [n, m] product is out[i * n + r] (column stride n,
    // row stride 1); lhs is b, [n, d] row-major; rhs is a^T, element (k, i) at a[i * d + k]
    // (column stride d, row stride 1). All extents lie inside the slices.
    unsafe {
        gemm::gemm(
            n,
            m,
            d,
            out.as_mut_ptr(),
            n as isize,
            1,
            false,
            b.as_ptr(),
            1,
            d as isize,
            a.as_ptr(),
            d as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
}

fn scan(
    queries: &[f32],
    gallery: &[f32],
    d: usize,
    first_row: usize,
    deleted: Option<&[bool]>,
    tops: &mut [TopK],
) {
    let mut scores = Vec::new();
    for (b, block) in gallery.chunks(BLOCK * d).enumerate() {
        products(queries, block, d, &mut scores);
        let nb = block.len() / d;
        for (qi, top) in tops.iter_mut().enumerate() {
            for (j, &s) in scores[qi * nb..(qi + 1) * nb].iter().enumerate() {
                let row = first_row + b * BLOCK + j;
                if deleted.is_some_and(|del| del[row]) {
                    continue;
                }
                top.push(row, s);
            }
        }
    }
}

/// The `k` best gallery rows for each query (`queries` `[nq, d]`, `gallery` `[n, d]`).
/// Rows flagged in `deleted` are skipped.
pub fn search(
    gallery: &[f32],
    d: usize,
    queries: &[f32],
    k: usize,
    deleted: Option<&[bool]>,
) -> Vec<Vec<Scored>> {
    let nq = queries.len() / d;
    let threads = rayon::current_num_threads();
    if nq >= 2 * threads || gallery.len() / d <= BLOCK {
        queries
            .par_chunks(QUERY_CHUNK * d)
            .flat_map_iter(|qc| {
                let mut tops: Vec<TopK> = (0..qc.len() / d).map(|_| TopK::new(k)).collect();
                scan(qc, gallery, d, 0, deleted, &mut tops);
                tops.into_iter().map(TopK::into_sorted)
            })
            .collect()
    } else {
        // few queries: split the gallery across threads and merge the partial top-k lists
        let part = (gallery.len() / d).div_ceil(threads).div_ceil(BLOCK) * BLOCK;
        let partials: Vec<Vec<Vec<Scored>>> = gallery
            .par_chunks(part * d)
            .enumerate()
            .map(|(p, g)| {
                let mut tops: Vec<TopK> = (0..nq).map(|_| TopK::new(k)).collect();
                scan(queries, g, d, p * part, deleted, &mut tops);
                tops.into_iter().map(TopK::into_sorted).collect()
            })
            .collect();
        TopK::merge_per_query(&partials, nq, k)
    }
}

/// Every query's inner product with every gallery row: `[nq, n]`, parallel over query chunks.
pub fn score_matrix(queries: &[f32], gallery: &[f32], d: usize) -> Vec<f32> {
    let n = gallery.len() / d;
    let mut out = vec![0f32; (queries.len() / d) * n];
    out.par_chunks_mut(QUERY_CHUNK * n)
        .zip(queries.par_chunks(QUERY_CHUNK * d))
        .for_each(|(o, qc)| {
            let mut s = Vec::new();
            products(qc, gallery, d, &mut s);
            o.copy_from_slice(&s);
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn brute(gallery: &[f32], d: usize, q: &[f32], k: usize) -> Vec<usize> {
        let mut v: Vec<Scored> = gallery
            .chunks(d)
            .enumerate()
            .map(|(row, g)| Scored {
                row,
                score: g.iter().zip(q).map(|(a, b)| a * b).sum(),
            })
            .collect();
        sort_scored(&mut v);
        v.truncate(k);
        v.iter().map(|s| s.row).collect()
    }

    #[test]
    fn matches_brute_force_in_both_parallel_modes() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let d = 24;
        let n = 3 * BLOCK + 17;
        let gallery: Vec<f32> = (0..n * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
        for nq in [1, 40] {
            let queries: Vec<f32> = (0..nq * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let got = search(&gallery, d, &queries, 10, None);
            for (qi, res) in got.iter().enumerate() {
                let want = brute(&gallery, d, &queries[qi * d..(qi + 1) * d], 10);
                assert_eq!(res.iter().map(|s| s.row).collect::<Vec<_>>(), want);
            }
        }
    }

    #[test]
    fn deleted_rows_are_skipped_and_ties_go_to_lower_rows() {
        let gallery = vec![1.0, 1.0, 1.0, 0.5];
        let mut del = vec![false; 4];
        assert_eq!(
            search(&gallery, 1, &[1.0], 2, Some(&del))[0]
                .iter()
                .map(|s| s.row)
                .collect::<Vec<_>>(),
            vec![0, 1]
        );
        del[0] = true;
        assert_eq!(
            search(&gallery, 1, &[1.0], 2, Some(&del))[0]
                .iter()
                .map(|s| s.row)
                .collect::<Vec<_>>(),
            vec![1, 2]
        );
    }
}
