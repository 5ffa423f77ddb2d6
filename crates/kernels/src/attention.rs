//! Multi-head self-attention over fused q|k|v rows: `softmax(Q K^T / sqrt(dh)) V` per image
//! and head, written straight into the heads' columns of the output.
//!
//! Work is split by rows of the output (all of an image's rows when there are at least as
//! many images as threads, else a share of them), so every task owns a contiguous slice of
//! the output and writes its products there with the output's row stride: no per-head
//! buffer, no copy afterwards. Each thread reuses one set of buffers (packed keys and values,
//! scores) from head to head and call to call. The softmax's division is applied to the
//! `[rows, dh]` product instead of the `[rows, T]` probabilities.
//!
//! [`Products::Bf16`] multiplies queries, keys, probabilities and values rounded to bf16 with
//! f32 sums (`vdpbf16ps`), the softmax staying f32: the attention of bf16 extraction.

use crate::bf16::{self, PackedBf16};
use crate::gemm::{matmul_f32, PackedF32};
use crate::nn::softmax_numerators;
use rayon::prelude::*;
use std::cell::RefCell;

/// One thread's buffers, kept between heads and calls.
struct HeadScratch {
    keys: PackedF32,
    values: PackedF32,
    /// `[rows, T]` scores, then softmax numerators.
    scores: Vec<f32>,
    /// Per row, the reciprocal of its numerators' sum.
    inverse_sums: Vec<f32>,
    /// The same for bf16 products: keys transposed and values packed, queries and
    /// probabilities rounded.
    keys16: PackedBf16,
    values16: PackedBf16,
    rows16: Vec<u16>,
}

/// The arithmetic of the attention's two products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Products {
    F32,
    /// Operands rounded to bf16, sums in f32; needs [`bf16::dot_products_available`].
    Bf16,
}

thread_local! {
    static SCRATCH: RefCell<HeadScratch> = RefCell::new(HeadScratch {
        keys: PackedF32::from_rows(&[], 0, 0, 0),
        values: PackedF32::from_rows(&[], 0, 0, 0),
        scores: Vec::new(),
        inverse_sums: Vec::new(),
        keys16: PackedBf16::empty(),
        values16: PackedBf16::empty(),
        rows16: Vec::new(),
    });
}

/// `out[B * T, D]` = every head's attention of `qkv` (`[B * T, 3 D]`, rows q|k|v, each split
/// into `heads` column groups). With `cls_attention` (`[B, T - 1]`), also the first token's
/// attention to the others, averaged over the heads.
pub fn multi_head(
    qkv: &[f32],
    images: usize,
    tokens: usize,
    d: usize,
    heads: usize,
    out: &mut [f32],
    cls_attention: Option<&mut [f32]>,
) {
    multi_head_with(
        Products::F32,
        qkv,
        images,
        tokens,
        d,
        heads,
        out,
        cls_attention,
    )
}

/// Whether [`multi_head_with`] can run `products` here for heads of `d / heads` columns
/// (bf16 needs AVX-512 BF16 at the active level and heads a multiple of 16 wide).
pub fn runs(products: Products, d: usize, heads: usize) -> bool {
    match products {
        Products::F32 => true,
        Products::Bf16 => {
            bf16::dot_products_available() && heads > 0 && PackedBf16::fits(d / heads)
        }
    }
}

/// [`multi_head`] with the products in `products` arithmetic (which must [`runs`] here).
#[allow(clippy::too_many_arguments)]
pub fn multi_head_with(
    products: Products,
    qkv: &[f32],
    images: usize,
    tokens: usize,
    d: usize,
    heads: usize,
    out: &mut [f32],
    cls_attention: Option<&mut [f32]>,
) {
    let (b, t) = (images, tokens);
    assert!(
        heads > 0 && d.is_multiple_of(heads),
        "{d} columns do not split into {heads} heads"
    );
    assert!(
        runs(products, d, heads),
        "{products:?} attention does not run here"
    );
    assert!(qkv.len() >= b * t * 3 * d && out.len() >= b * t * d);
    if b == 0 || t == 0 {
        return;
    }
    // enough row shares for every thread, each image's rows split evenly
    let threads = rayon::current_num_threads().max(1);
    let shares = threads.div_ceil(b).min(t);
    let rows = t.div_ceil(shares);
    // per image, its CLS row (none to fill for a lone token)
    let mut cls: Vec<Option<&mut [f32]>> = match cls_attention {
        Some(c) if t > 1 => {
            assert!(c.len() >= b * (t - 1));
            c.chunks_mut(t - 1).take(b).map(Some).collect()
        }
        _ => (0..b).map(|_| None).collect(),
    };
    out[..b * t * d]
        .par_chunks_mut(t * d)
        .zip(qkv.par_chunks(t * 3 * d))
        .zip(cls.par_iter_mut())
        .for_each(|((out, qkv), cls)| {
            // the CLS row goes to the share that holds the first token
            let mut cls_of_share: Vec<Option<&mut [f32]>> = vec![cls.take()];
            cls_of_share.resize_with(t.div_ceil(rows), || None);
            out.par_chunks_mut(rows * d)
                .zip(cls_of_share.into_par_iter())
                .enumerate()
                .for_each(|(share, (out, cls))| {
                    SCRATCH.with_borrow_mut(|s| {
                        image_rows(products, qkv, t, d, heads, share * rows, out, cls, s)
                    })
                });
        });
}

/// Rows `first..first + out.len() / d` of one image's attention, head after head.
#[allow(clippy::too_many_arguments)]
fn image_rows(
    products: Products,
    qkv: &[f32],
    t: usize,
    d: usize,
    heads: usize,
    first: usize,
    out: &mut [f32],
    mut cls: Option<&mut [f32]>,
    s: &mut HeadScratch,
) {
    let (dh, stride) = (d / heads, 3 * d);
    let m = out.len() / d;
    let scale = 1.0 / (dh as f32).sqrt();
    // bf16 scores come in whole blocks of 16 keys; the padding columns stay outside the softmax
    let width = match products {
        Products::F32 => t,
        Products::Bf16 => bf16::whole_blocks(t),
    };
    s.scores.resize(m * width, 0.0);
    s.inverse_sums.resize(m, 0.0);
    if let Some(c) = cls.as_deref_mut() {
        c.fill(0.0);
    }
    for head in 0..heads {
        let col = head * dh;
        let (keys, values) = (&qkv[d + col..], &qkv[2 * d + col..]);
        let queries = &qkv[first * stride + col..];
        match products {
            Products::F32 => {
                s.keys.refill_from_columns(keys, t, dh, stride);
                s.values.refill_from_rows(values, t, dh, stride);
                matmul_f32(queries, m, stride, &s.keys, &mut s.scores, t, false);
            }
            Products::Bf16 => {
                s.keys16.refill_transposed(keys, dh, t, stride);
                s.values16.refill_rows(values, t, dh, stride);
                let kp = s.keys16.padded_k();
                bf16::round_rows_into(queries, m, dh, stride, kp, &mut s.rows16);
                bf16::products_into(&s.rows16, m, &s.keys16, &mut s.scores, width, false);
            }
        }
        for (row, inv) in s.scores.chunks_exact_mut(width).zip(&mut s.inverse_sums) {
            *inv = 1.0 / softmax_numerators(&mut row[..t], scale);
        }
        match products {
            Products::F32 => matmul_f32(&s.scores, m, t, &s.values, &mut out[col..], d, false),
            Products::Bf16 => {
                let kp = s.values16.padded_k();
                bf16::round_rows_into(&s.scores, m, t, width, kp, &mut s.rows16);
                bf16::products_into(&s.rows16, m, &s.values16, &mut out[col..], d, false);
            }
        }
        for (row, &inv) in out.chunks_exact_mut(d).zip(&s.inverse_sums) {
            row[col..col + dh].iter_mut().for_each(|v| *v *= inv);
        }
        if let Some(c) = cls.as_deref_mut() {
            // the first token's probabilities over the others, this head's share of the mean
            let w = s.inverse_sums[0] / heads as f32;
            c.iter_mut()
                .zip(&s.scores[1..t])
                .for_each(|(c, &p)| *c += p * w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attention of one image and head in f64, straight from the definition.
    fn reference(
        qkv: &[f32],
        t: usize,
        d: usize,
        heads: usize,
        img: usize,
        head: usize,
    ) -> Vec<f64> {
        let dh = d / heads;
        let at = |r: usize, part: usize, j: usize| {
            qkv[(img * t + r) * 3 * d + part * d + head * dh + j] as f64
        };
        let mut out = vec![0f64; t * dh + t];
        for r in 0..t {
            let s: Vec<f64> = (0..t)
                .map(|c| {
                    (0..dh).map(|j| at(r, 0, j) * at(c, 1, j)).sum::<f64>() / (dh as f64).sqrt()
                })
                .collect();
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|v| (v - max).exp()).collect();
            let total: f64 = e.iter().sum();
            for j in 0..dh {
                out[r * dh + j] = (0..t).map(|c| e[c] / total * at(c, 2, j)).sum();
            }
            if r == 0 {
                for c in 0..t {
                    out[t * dh + c] = e[c] / total;
                }
            }
        }
        out
    }

    /// Images x tokens to check: one token, two, counts that are not whole blocks of 16, and
    /// several images.
    const SHAPES: [(usize, usize); 6] = [(1, 1), (1, 2), (1, 37), (3, 33), (5, 17), (1, 257)];

    /// The worst absolute error of the outputs and of the CLS attention against the
    /// definition, for `products` on 1 and on 4 threads (an image's rows split into shares).
    fn worst_errors(
        products: Products,
        qkv: &[f32],
        b: usize,
        t: usize,
        d: usize,
        heads: usize,
    ) -> (f64, f64) {
        let dh = d / heads;
        let mut want_out = vec![0f64; b * t * d];
        let mut want_cls = vec![0f64; b * (t - 1)];
        for img in 0..b {
            for head in 0..heads {
                let want = reference(qkv, t, d, heads, img, head);
                for r in 0..t {
                    for j in 0..dh {
                        want_out[(img * t + r) * d + head * dh + j] = want[r * dh + j];
                    }
                }
                for c in 1..t {
                    want_cls[img * (t - 1) + c - 1] += want[t * dh + c] / heads as f64;
                }
            }
        }
        let (mut worst_out, mut worst_cls) = (0f64, 0f64);
        for threads in [1, 4] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut out = vec![f32::NAN; b * t * d];
            let mut cls = vec![f32::NAN; b * (t - 1)];
            pool.install(|| {
                multi_head_with(products, qkv, b, t, d, heads, &mut out, Some(&mut cls[..]))
            });
            let worst = |got: &[f32], want: &[f64]| {
                got.iter()
                    .zip(want)
                    .map(|(&g, w)| (g as f64 - w).abs())
                    .fold(0f64, |a, e| {
                        if e.is_nan() || a.is_nan() {
                            f64::NAN
                        } else {
                            a.max(e)
                        }
                    })
            };
            worst_out = worst_out.max(worst(&out, &want_out));
            worst_cls = worst_cls.max(worst(&cls, &want_cls));
        }
        (worst_out, worst_cls)
    }

    #[test]
    fn every_head_matches_the_definition_whatever_the_split() {
        let (d, heads) = (48, 3);
        for (b, t) in SHAPES {
            let qkv: Vec<f32> = (0..b * t * 3 * d)
                .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 3.0)
                .collect();
            let (out, cls) = worst_errors(Products::F32, &qkv, b, t, d, heads);
            assert!(out < 1e-5, "b{b} t{t}: outputs {out} off");
            assert!(cls < 1e-6, "b{b} t{t}: CLS attention {cls} off");
        }
    }

    /// bf16 products (operands rounded to 8 significant bits, f32 sums) stay within a bf16
    /// rounding's reach of the definition.
    #[test]
    fn bf16_products_stay_near_the_definition() {
        let (d, heads) = (128, 2);
        if !runs(Products::Bf16, d, heads) {
            craterdex_testkit::skip(
                "kernels::attention::bf16_products_stay_near_the_definition",
                "no AVX-512 BF16 at this level",
            );
            return;
        }
        for (b, t) in SHAPES {
            let qkv: Vec<f32> = (0..b * t * 3 * d)
                .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 0.6)
                .collect();
            let (out, cls) = worst_errors(Products::Bf16, &qkv, b, t, d, heads);
            // values of size 0.3 rounded to bf16 are 1e-3 off at most; the probabilities'
            // and scores' roundings add as much again
            assert!(out < 2e-3, "b{b} t{t}: outputs {out} off");
            assert!(cls < 1e-5, "b{b} t{t}: CLS attention {cls} off");
        }
    }

    #[test]
    fn a_lone_token_attends_to_itself_and_has_no_cls_row_to_fill() {
        let (d, heads) = (8, 2);
        let qkv: Vec<f32> = (0..3 * d).map(|i| i as f32 * 0.1).collect();
        let mut out = vec![f32::NAN; d];
        let mut cls: Vec<f32> = Vec::new();
        multi_head(&qkv, 1, 1, d, heads, &mut out, Some(&mut cls[..]));
        assert_eq!(out, qkv[2 * d..].to_vec());
    }
}
