//! Multi-head self-attention over fused q|k|v rows: `softmax(Q K^T / sqrt(dh)) V` per image
//! and head, written straight into the heads' columns of the output.
//!
//! Work is split by rows of the output (all of an image's rows when there are at least as
//! many images as threads, else a share of them), so every task owns a contiguous slice of
//! the output and writes its products there with the output's row stride: no per-head
//! buffer, no copy afterwards. Each thread reuses one set of buffers (packed keys and values,
//! scores) from head to head and call to call. The softmax's division is applied to the
//! `[rows, dh]` product instead of the `[rows, T]` probabilities.

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
}

thread_local! {
    static SCRATCH: RefCell<HeadScratch> = RefCell::new(HeadScratch {
        keys: PackedF32::from_rows(&[], 0, 0, 0),
        values: PackedF32::from_rows(&[], 0, 0, 0),
        scores: Vec::new(),
        inverse_sums: Vec::new(),
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
    let (b, t) = (images, tokens);
    assert!(
        heads > 0 && d.is_multiple_of(heads),
        "{d} columns do not split into {heads} heads"
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
                        image_rows(qkv, t, d, heads, share * rows, out, cls, s)
                    })
                });
        });
}

/// Rows `first..first + out.len() / d` of one image's attention, head after head.
#[allow(clippy::too_many_arguments)]
fn image_rows(
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
    s.scores.resize(m * t, 0.0);
    s.inverse_sums.resize(m, 0.0);
    if let Some(c) = cls.as_deref_mut() {
        c.fill(0.0);
    }
    for head in 0..heads {
        let col = head * dh;
        s.keys.refill_from_columns(&qkv[d + col..], t, dh, stride);
        s.values
            .refill_from_rows(&qkv[2 * d + col..], t, dh, stride);
        let queries = &qkv[first * stride + col..];
        matmul_f32(queries, m, stride, &s.keys, &mut s.scores, t, false);
        for (row, inv) in s.scores.chunks_exact_mut(t).zip(&mut s.inverse_sums) {
            *inv = 1.0 / softmax_numerators(row, scale);
        }
        matmul_f32(&s.scores, m, t, &s.values, &mut out[col..], d, false);
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

    #[test]
    fn every_head_matches_the_definition_whatever_the_split() {
        let (d, heads) = (48, 3);
        for (b, t) in [(1, 1), (1, 2), (1, 37), (3, 33), (5, 17)] {
            let qkv: Vec<f32> = (0..b * t * 3 * d)
                .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 3.0)
                .collect();
            for threads in [1, 4] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                pool.install(|| check(&qkv, b, t, d, heads));
            }
        }
    }

    fn check(qkv: &[f32], b: usize, t: usize, d: usize, heads: usize) {
        let mut out = vec![f32::NAN; b * t * d];
        let mut cls = vec![f32::NAN; b * (t - 1)];
        multi_head(qkv, b, t, d, heads, &mut out, Some(&mut cls[..]));
        let dh = d / heads;
        let mut cls_want = vec![0f64; b * (t - 1)];
        for img in 0..b {
            for head in 0..heads {
                let want = reference(qkv, t, d, heads, img, head);
                for r in 0..t {
                    for j in 0..dh {
                        let got = out[(img * t + r) * d + head * dh + j] as f64;
                        assert!(
                            (got - want[r * dh + j]).abs() < 1e-5,
                            "b{b} t{t} img{img} head{head} ({r},{j}): {got} vs {}",
                            want[r * dh + j]
                        );
                    }
                }
                for c in 1..t {
                    cls_want[img * (t - 1) + c - 1] += want[t * dh + c] / heads as f64;
                }
            }
        }
        for (g, w) in cls.iter().zip(&cls_want) {
            assert!((*g as f64 - w).abs() < 1e-6, "b{b} t{t} cls {g} vs {w}");
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
