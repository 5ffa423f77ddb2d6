//! Late interaction: `s(q, g) = (1/K_q) sum_i max_j <q_i, g_j>` over unit-length tokens.
//!
//! Reranking and exhaustive search score one query against many documents: [`QueryKernel`]
//! transposes the query once and, on AVX-512 CPUs, runs a register-blocked kernel with no
//! horizontal reductions in its inner loop; elsewhere it falls back to [`maxsim`], a portable
//! per-pair loop the compiler vectorises. Other codecs decode a document
//! into f32 first (decoding costs K*D, the dots K_q*K*D) — see `codec`.

use crate::flat_int8::Int8Vectors;
use craterdex_amx::PackedI8;

/// Per query token, the best dot product against `doc` (`[kd, d]`), written to `best` (`[kq]`).
pub fn max_dots(q: &[f32], doc: &[f32], d: usize, best: &mut [f32]) {
    debug_assert_eq!(best.len(), q.len() / d);
    best.iter_mut().for_each(|b| *b = f32::NEG_INFINITY);
    for g in doc.chunks_exact(d) {
        for (b, qi) in best.iter_mut().zip(q.chunks_exact(d)) {
            *b = b.max(dot_portable(qi, g));
        }
    }
}

/// The MaxSim score of one document.
pub fn maxsim(q: &[f32], doc: &[f32], d: usize, scratch: &mut Vec<f32>) -> f32 {
    let kq = q.len() / d;
    if kq == 0 || doc.is_empty() {
        return 0.0;
    }
    scratch.resize(kq, 0.0);
    max_dots(q, doc, d, scratch);
    scratch.iter().sum::<f32>() / kq as f32
}

/// A query ready for scoring many documents: on AVX-512 CPUs its tokens are transposed once
/// to `[d, kq padded to 32]` for the register-blocked kernel (8 document tokens x 32 query
/// tokens per block, document values broadcast against the query, maxima folded in
/// registers); elsewhere [`maxsim`] per document.
pub struct QueryKernel<'a> {
    q: &'a [f32],
    d: usize,
    kq: usize,
    transposed: Option<(Vec<f32>, usize)>,
}

impl<'a> QueryKernel<'a> {
    pub fn new(q: &'a [f32], d: usize) -> Self {
        let kq = q.len() / d;
        let mut transposed = None;
        #[cfg(target_arch = "x86_64")]
        {
            if kq > 0 && std::arch::is_x86_feature_detected!("avx512f") {
                let kp = kq.div_ceil(32) * 32;
                let mut qt = vec![0f32; d * kp];
                for (i, row) in q.chunks_exact(d).enumerate() {
                    for (k, v) in row.iter().enumerate() {
                        qt[k * kp + i] = *v;
                    }
                }
                transposed = Some((qt, kp));
            }
        }
        Self {
            q,
            d,
            kq,
            transposed,
        }
    }

    /// The MaxSim score of one document `[kd, d]`.
    pub fn score(&self, doc: &[f32], scratch: &mut Vec<f32>) -> f32 {
        let kd = doc.len() / self.d;
        if self.kq == 0 || kd == 0 {
            return 0.0;
        }
        #[cfg(target_arch = "x86_64")]
        {
            if let Some((qt, kp)) = &self.transposed {
                // SAFETY: `transposed` is only built after avx512f was detected; qt is
                // [d, kp] and doc [kd, d].
                return unsafe { x86::maxsim_transposed(qt, *kp, self.kq, doc, kd, self.d) };
            }
        }
        maxsim(self.q, doc, self.d, scratch)
    }
}

/// A query for int8 documents on AMX tiles: its tokens are quantised the way stored tokens
/// are (symmetric, one scale per token) and packed once; documents are then scored from
/// their codes with exact int32 products, scaled per token pair. Quantising the query adds
/// an error of the same size as the stored codes' (bounded in a test below).
pub struct Int8Query {
    packed: PackedI8,
    tokens: Int8Vectors,
}

impl Int8Query {
    /// `None` where the tiles are unavailable or `d` does not fit them.
    pub fn new(q: &[f32], d: usize) -> Option<Self> {
        if d == 0 || q.len() < d {
            return None;
        }
        let tokens = Int8Vectors::quantise(q, d);
        Some(Self {
            packed: tokens.tile_columns()?,
            tokens,
        })
    }

    /// Appends the MaxSim scores of consecutive documents of `kd` tokens: `codes`
    /// `[n * kd, d]`, `scales` `[n * kd]`. `products` is scratch.
    pub fn score_docs(
        &self,
        codes: &[i8],
        scales: &[f32],
        kd: usize,
        products: &mut Vec<i32>,
        out: &mut Vec<f32>,
    ) {
        self.score_parts(&[(codes, scales)], kd, products, out);
    }

    /// [`Int8Query::score_docs`] over several runs of documents (e.g. a shortlist's
    /// scattered rows) in one pass over the tiles.
    pub fn score_parts(
        &self,
        parts: &[(&[i8], &[f32])],
        kd: usize,
        products: &mut Vec<i32>,
        out: &mut Vec<f32>,
    ) {
        let rows: usize = parts.iter().map(|p| p.1.len()).sum();
        if kd == 0 || rows == 0 {
            return;
        }
        let cols = self.packed.columns();
        products.resize(rows * cols, 0);
        let codes: Vec<&[i8]> = parts.iter().map(|p| p.0).collect();
        craterdex_amx::i8_products_of_parts(&codes, &self.packed, products);
        let mut best = vec![f32::NEG_INFINITY; cols];
        let doc_scales = parts.iter().flat_map(|p| p.1.chunks_exact(kd));
        #[cfg(target_arch = "x86_64")]
        let wide = std::arch::is_x86_feature_detected!("avx512f");
        for (doc, doc_scales) in products.chunks_exact(kd * cols).zip(doc_scales) {
            #[cfg(target_arch = "x86_64")]
            if wide {
                // SAFETY: the CPU supports AVX-512F (checked above).
                unsafe { best_scaled_avx512(doc, doc_scales, &mut best) };
            } else {
                best_scaled(doc, doc_scales, &mut best);
            }
            #[cfg(not(target_arch = "x86_64"))]
            best_scaled(doc, doc_scales, &mut best);
            let scales = self.tokens.scales();
            let total: f32 = best.iter().zip(scales).map(|(b, s)| b * s).sum();
            out.push(total / scales.len() as f32);
        }
    }
}

/// Per query token (column), the best product over a document's rows, each row scaled by
/// its token's scale.
#[inline(always)]
fn best_scaled(doc: &[i32], scales: &[f32], best: &mut [f32]) {
    best.iter_mut().for_each(|b| *b = f32::NEG_INFINITY);
    for (row, &s) in doc.chunks_exact(best.len()).zip(scales) {
        for (b, &p) in best.iter_mut().zip(row) {
            *b = b.max(p as f32 * s);
        }
    }
}

/// [`best_scaled`] compiled for 512-bit vectors: the build targets baseline x86-64, where
/// this fold cost about as much as the tile products (exhaustive batch 35 -> 24 ms/query).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn best_scaled_avx512(doc: &[i32], scales: &[f32], best: &mut [f32]) {
    best_scaled(doc, scales, best)
}

/// MaxSim of one query against many documents of `kd` tokens each, stored contiguously
/// (`docs` is `[n * kd, d]`). Appends `n` scores to `out`.
pub fn maxsim_many(
    q: &[f32],
    docs: &[f32],
    kd: usize,
    d: usize,
    scratch: &mut Vec<f32>,
    out: &mut Vec<f32>,
) {
    let kernel = QueryKernel::new(q, d);
    out.extend(
        docs.chunks_exact((kd * d).max(1))
            .map(|doc| kernel.score(doc, scratch)),
    );
}

pub fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + ra.iter().zip(rb).map(|(x, y)| x * y).sum::<f32>()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// MaxSim of one document `[kd, d]` against a transposed query `qt` `[d, kp]` (`kp` a
    /// multiple of 32, lanes past `kq` zero).
    #[target_feature(enable = "avx512f")]
    pub unsafe fn maxsim_transposed(
        qt: &[f32],
        kp: usize,
        kq: usize,
        doc: &[f32],
        kd: usize,
        d: usize,
    ) -> f32 {
        let qp = qt.as_ptr();
        let gp = doc.as_ptr();
        let mut total = 0f32;
        for qc in (0..kp).step_by(32) {
            let mut max0 = _mm512_set1_ps(f32::NEG_INFINITY);
            let mut max1 = _mm512_set1_ps(f32::NEG_INFINITY);
            let mut r = 0;
            while r + 8 <= kd {
                let mut acc = [_mm512_setzero_ps(); 16];
                for k in 0..d {
                    let q0 = _mm512_loadu_ps(qp.add(k * kp + qc));
                    let q1 = _mm512_loadu_ps(qp.add(k * kp + qc + 16));
                    for rr in 0..8 {
                        let g = _mm512_set1_ps(*gp.add((r + rr) * d + k));
                        acc[2 * rr] = _mm512_fmadd_ps(g, q0, acc[2 * rr]);
                        acc[2 * rr + 1] = _mm512_fmadd_ps(g, q1, acc[2 * rr + 1]);
                    }
                }
                for rr in 0..8 {
                    max0 = _mm512_max_ps(max0, acc[2 * rr]);
                    max1 = _mm512_max_ps(max1, acc[2 * rr + 1]);
                }
                r += 8;
            }
            while r < kd {
                let mut a0 = _mm512_setzero_ps();
                let mut a1 = _mm512_setzero_ps();
                for k in 0..d {
                    let g = _mm512_set1_ps(*gp.add(r * d + k));
                    a0 = _mm512_fmadd_ps(g, _mm512_loadu_ps(qp.add(k * kp + qc)), a0);
                    a1 = _mm512_fmadd_ps(g, _mm512_loadu_ps(qp.add(k * kp + qc + 16)), a1);
                }
                max0 = _mm512_max_ps(max0, a0);
                max1 = _mm512_max_ps(max1, a1);
                r += 1;
            }
            // only the lanes of real query tokens count
            let live = kq.saturating_sub(qc).min(32);
            let m0: u16 = if live >= 16 {
                0xffff
            } else {
                ((1u32 << live) - 1) as u16
            };
            let m1: u16 = if live >= 32 {
                0xffff
            } else if live > 16 {
                ((1u32 << (live - 16)) - 1) as u16
            } else {
                0
            };
            total += _mm512_mask_reduce_add_ps(m0, max0) + _mm512_mask_reduce_add_ps(m1, max1);
        }
        total / kq as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::int8_quantise;
    use rand::{Rng, SeedableRng};

    /// Property: the tile path's scores (query quantised too) stay within the int8 codec's
    /// error bound of exact f32 MaxSim, for documents around the 16-row tile blocks.
    #[test]
    fn int8_tile_scores_stay_close_to_f32() {
        let d = 128;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let mut unit = |n: usize| -> Vec<f32> {
            let mut v: Vec<f32> = (0..n * d).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            for r in v.chunks_mut(d) {
                let n = r.iter().map(|x| x * x).sum::<f32>().sqrt();
                r.iter_mut().for_each(|x| *x /= n);
            }
            v
        };
        let q = unit(20);
        let Some(kernel) = Int8Query::new(&q, d) else {
            eprintln!("no AMX tiles on this machine: skipped");
            return;
        };
        for kd in [1, 7, 16, 32] {
            let n = 9;
            let docs = unit(n * kd);
            let (mut codes, mut scales) = (Vec::new(), Vec::new());
            for t in docs.chunks_exact(d) {
                scales.push(int8_quantise(t, &mut codes));
            }
            let mut out = Vec::new();
            kernel.score_docs(
                bytemuck::cast_slice(&codes),
                &scales,
                kd,
                &mut Vec::new(),
                &mut out,
            );
            assert_eq!(out.len(), n);
            for (i, s) in out.iter().enumerate() {
                let exact = maxsim(&q, &docs[i * kd * d..(i + 1) * kd * d], d, &mut Vec::new());
                assert!(
                    (s - exact).abs() < 1.5e-2,
                    "kd {kd} doc {i}: {s} vs {exact}"
                );
            }
        }
    }

    #[test]
    fn maxsim_by_hand() {
        let q = [1.0, 0.0, 0.0, 1.0];
        let g = [0.6, 0.8, 1.0, 0.0, -1.0, 0.0];
        // token 1 best: 1.0 ; token 2 best: 0.8 -> mean 0.9
        assert!((maxsim(&q, &g, 2, &mut Vec::new()) - 0.9).abs() < 1e-6);
    }

    #[test]
    fn many_documents_at_once_match_one_by_one() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
        // query token counts around the 16/32-lane blocks, document token counts around the 8-row blocks
        for (d, kq, kd, n) in [
            (40, 5, 7, 1500),
            (24, 32, 32, 40),
            (16, 33, 9, 30),
            (8, 16, 8, 20),
            (12, 70, 17, 10),
        ] {
            let q: Vec<f32> = (0..kq * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let docs: Vec<f32> = (0..n * kd * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let mut out = Vec::new();
            maxsim_many(&q, &docs, kd, d, &mut Vec::new(), &mut out);
            assert_eq!(out.len(), n);
            for (i, s) in out.iter().enumerate() {
                let mut best = vec![f32::NEG_INFINITY; kq];
                max_dots(&q, &docs[i * kd * d..(i + 1) * kd * d], d, &mut best);
                let one = best.iter().sum::<f32>() / kq as f32;
                assert!(
                    (s - one).abs() < 1e-4,
                    "kq {kq} kd {kd} doc {i}: {s} vs {one}"
                );
            }
        }
    }
}
