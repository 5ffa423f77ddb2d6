//! The element-wise and row-wise operations of a transformer block: exact (erf) GELU, row
//! softmax, layer norm, and the residual add. Branch-free arithmetic, compiled for the
//! widest vectors of the active level through [`map_in_place_fused`].

use crate::f32::map_in_place_fused;
use crate::level::{active, dispatch, Level};
use rayon::prelude::*;

/// `erf(x)` as a rational function of `x` on [-4, 4] (|erf| rounds to 1 beyond), the form
/// XLA and Eigen use for f32: within 5e-7 (4 ulp near 1) of libm's erff (tested), branch-free
/// so that loops over it vectorise. libm's scalar erff took a third of the forward pass.
#[inline(always)]
pub fn erf_rational<const FUSED: bool>(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10_f32;
    p = mul_add::<FUSED>(p, x2, 2.770_681_4e-8);
    p = mul_add::<FUSED>(p, x2, -2.101_024e-6);
    p = mul_add::<FUSED>(p, x2, -5.692_506_4e-5);
    p = mul_add::<FUSED>(p, x2, -7.349_906_3e-4);
    p = mul_add::<FUSED>(p, x2, -2.954_6e-3);
    p = mul_add::<FUSED>(p, x2, -1.609_603_3e-2);
    let mut q = -1.456_607_2e-5_f32;
    q = mul_add::<FUSED>(q, x2, -2.133_740_6e-4);
    q = mul_add::<FUSED>(q, x2, -1.682_827e-3);
    q = mul_add::<FUSED>(q, x2, -7.373_329e-3);
    q = mul_add::<FUSED>(q, x2, -1.426_474e-2);
    x * p / q
}

/// `a * b + c`, rounded once where `FUSED`: for kernels inlined into functions compiled with
/// FMA, where it is one instruction instead of two (Rust does not contract `a * b + c` on
/// its own); rounded twice elsewhere, where a fused multiply-add would be a library call.
#[inline(always)]
fn mul_add<const FUSED: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FUSED {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Exact (erf) GELU, as in the reference DINO and DINOv2 code.
#[inline(always)]
pub fn gelu<const FUSED: bool>(x: f32) -> f32 {
    0.5 * x * (1.0 + erf_rational::<FUSED>(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// GELU over a buffer, in parallel chunks.
pub fn gelu_in_place(v: &mut [f32]) {
    v.par_chunks_mut(4096)
        .for_each(|c| map_in_place_fused(c, gelu::<true>, gelu::<false>));
}

/// `e^x` for `x <= 0` (softmax after subtracting the row maximum): `2^n e^r` with
/// `|r| <= ln2/2` and a degree-6 Taylor polynomial, branch-free so that it vectorises; within
/// 3 ulp of libm's expf (tested). Below -87 (e^x < 2^-125) the result is zero.
#[inline(always)]
pub fn exp_nonpositive<const FUSED: bool>(input: f32) -> f32 {
    let x = input.max(-87.0);
    // Round to nearest by adding and removing 1.5 * 2^23 (f32::round is not one instruction);
    // the sum's low mantissa bits are then n itself, read without a float-to-int conversion
    // (Rust's saturating `as i32` kept the loop from vectorising).
    const ROUNDER: f32 = 12_582_912.0;
    let shifted = mul_add::<FUSED>(x, std::f32::consts::LOG2_E, ROUNDER);
    let n = shifted - ROUNDER;
    // ln 2 split in two so that n * ln2 is exact in its high part.
    let r = mul_add::<FUSED>(-n, 1.428_606_8e-6, mul_add::<FUSED>(-n, 0.693_145_75, x));
    let mut p = 1.0 / 720.0;
    p = mul_add::<FUSED>(p, r, 1.0 / 120.0);
    p = mul_add::<FUSED>(p, r, 1.0 / 24.0);
    p = mul_add::<FUSED>(p, r, 1.0 / 6.0);
    p = mul_add::<FUSED>(p, r, 0.5);
    p = mul_add::<FUSED>(p, r, 1.0);
    p = mul_add::<FUSED>(p, r, 1.0);
    let n_bits = shifted.to_bits().wrapping_sub(ROUNDER.to_bits());
    let scale = f32::from_bits(n_bits.wrapping_add(127) << 23);
    if input < -87.0 {
        0.0
    } else {
        p * scale
    }
}

/// Lanes of the reductions in [`softmax_numerators`]: independent partial maxima and sums, so the
/// loops vectorise instead of waiting on one running value.
const LANES: usize = 16;

/// The numerators of `softmax(scale * row)` in place, `e^(scale (v - max))`, and their sum:
/// a caller that multiplies the row by a matrix divides the (narrower) product by the sum
/// instead of the row.
pub fn softmax_numerators(row: &mut [f32], scale: f32) -> f32 {
    softmax_numerators_at(active(), row, scale)
}

/// [`softmax_numerators`] with the kernels of `level` (capped at what the CPU has).
pub fn softmax_numerators_at(level: Level, row: &mut [f32], scale: f32) -> f32 {
    dispatch!(level,
        avx512 => x86::numerators_avx512(row, scale),
        avx2 => x86::numerators_avx2(row, scale),
        portable => numerators_lanes::<false>(row, scale))
}

#[inline(always)]
fn numerators_lanes<const FUSED: bool>(row: &mut [f32], scale: f32) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
    }
    let tail = chunks.remainder().iter().copied();
    let max = lanes
        .into_iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, f32::max);
    let mut sums = [0f32; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for (s, v) in sums.iter_mut().zip(c) {
            *v = exp_nonpositive::<FUSED>((*v - max) * scale);
            *s += *v;
        }
    }
    let mut sum: f32 = sums.iter().sum();
    for v in chunks.into_remainder() {
        *v = exp_nonpositive::<FUSED>((*v - max) * scale);
        sum += *v;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn layer_norm_avx2(r: &[f32], o: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
        super::layer_norm_row(r, o, w, b, eps)
    }
    #[target_feature(enable = "avx512f")]
    pub unsafe fn layer_norm_avx512(r: &[f32], o: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
        super::layer_norm_row(r, o, w, b, eps)
    }
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn numerators_avx2(row: &mut [f32], scale: f32) -> f32 {
        super::numerators_lanes::<true>(row, scale)
    }
    #[target_feature(enable = "avx512f")]
    pub unsafe fn numerators_avx512(row: &mut [f32], scale: f32) -> f32 {
        super::numerators_lanes::<true>(row, scale)
    }
}

/// Layer norm of each `d`-wide row of `x` into `out` (mean and variance in f64).
pub fn layer_norm(x: &[f32], out: &mut [f32], d: usize, w: &[f32], b: &[f32], eps: f32) {
    let level = active();
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .for_each(|(o, r)| layer_norm_row_at(level, r, o, w, b, eps));
}

/// One row of [`layer_norm`] with the kernels of `level` (capped at what the CPU has).
fn layer_norm_row_at(level: Level, r: &[f32], o: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    dispatch!(level,
        avx512 => x86::layer_norm_avx512(r, o, w, b, eps),
        avx2 => x86::layer_norm_avx2(r, o, w, b, eps),
        portable => layer_norm_row(r, o, w, b, eps))
}

/// Partial sums of [`layer_norm_row`]: independent lanes, so that the sums vectorise.
const NORM_LANES: usize = 8;

/// `sum f(v)` over `r` in [`NORM_LANES`] independent partial sums.
#[inline(always)]
fn lane_sum(r: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    let mut lanes = [0f64; NORM_LANES];
    let chunks = r.chunks_exact(NORM_LANES);
    let tail: f64 = chunks.remainder().iter().map(|&v| f(v)).sum();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += f(v);
        }
    }
    lanes.iter().sum::<f64>() + tail
}

#[inline(always)]
fn layer_norm_row(r: &[f32], o: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let d = r.len();
    let mean = lane_sum(r, |v| v as f64) / d as f64;
    let var = lane_sum(r, |v| (v as f64 - mean) * (v as f64 - mean)) / d as f64;
    let inv = 1.0 / (var + eps as f64).sqrt();
    for j in 0..d {
        o[j] = ((r[j] as f64 - mean) * inv) as f32 * w[j] + b[j];
    }
}

/// `x += y`, in parallel over rows of `d`.
pub fn add_residual(x: &mut [f32], y: &[f32], d: usize) {
    x.par_chunks_mut(d)
        .zip(y.par_chunks(d))
        .for_each(|(xr, yr)| xr.iter_mut().zip(yr).for_each(|(a, b)| *a += b));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rational_erf_matches_libm_everywhere() {
        let mut worst = 0f32;
        for i in -2_000_000..=2_000_000 {
            let x = i as f32 * 3e-6; // [-6, 6]
            let want = libm::erff(x);
            worst = worst.max((erf_rational::<false>(x) - want).abs());
            worst = worst.max((erf_rational::<true>(x) - want).abs());
        }
        assert!(worst < 5e-7, "worst |erf error| {worst}");
    }

    #[test]
    fn vectorised_exp_is_within_3_ulp() {
        let mut worst_ulp = 0i64;
        for i in 0..=1_000_000 {
            let x = -(i as f32) * 8.0e-5; // [-80, 0]
            let want = x.exp().to_bits() as i64;
            for got in [exp_nonpositive::<false>(x), exp_nonpositive::<true>(x)] {
                worst_ulp = worst_ulp.max((got.to_bits() as i64 - want).abs());
            }
        }
        assert!(worst_ulp <= 3, "worst error {worst_ulp} ulp");
        for exp in [exp_nonpositive::<false>, exp_nonpositive::<true>] {
            assert_eq!(exp(0.0), 1.0);
            assert_eq!(exp(-90.0), 0.0);
            assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        }
    }

    /// `softmax(scale * row)` from its numerators and their sum.
    fn normalised(row: &mut [f32], scale: f32) {
        let total = softmax_numerators(row, scale);
        row.iter_mut().for_each(|v| *v /= total);
    }

    #[test]
    fn softmax_rows_sum_to_one() {
        let mut r = vec![1.0, 2.0, 3.0, -1000.0];
        normalised(&mut r, 1.0);
        assert!((r.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(r[3], 0.0);
        let mut s = vec![2.0, 4.0];
        normalised(&mut s, 0.5);
        assert!((s[1] / s[0] - std::f32::consts::E).abs() < 1e-5);
    }

    #[test]
    fn long_rows_match_a_double_precision_softmax_on_every_level() {
        for level in crate::level::supported() {
            for len in [1usize, 15, 16, 17, 257, 1000] {
                let row: Vec<f32> = (0..len)
                    .map(|i| ((i * 7919 % 613) as f32 - 300.0) / 7.0)
                    .collect();
                let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
                let e: Vec<f64> = row
                    .iter()
                    .map(|&v| ((v as f64 - max) * 0.3).exp())
                    .collect();
                let total: f64 = e.iter().sum();
                let mut got = row.clone();
                let sum = softmax_numerators_at(level, &mut got, 0.3);
                got.iter_mut().for_each(|v| *v /= sum);
                for (i, (g, w)) in got.iter().zip(&e).enumerate() {
                    let want = w / total;
                    assert!(
                        (*g as f64 - want).abs() <= 1e-6 * want.max(1e-30) + 1e-12,
                        "{level} len {len} [{i}]: {g} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn gelu_and_layer_norm_by_hand() {
        let mut v = vec![0.0, 1.0, -1.0];
        gelu_in_place(&mut v);
        assert_eq!(v[0], 0.0);
        assert!((v[1] - 0.841_344_7).abs() < 1e-6 && (v[2] + 0.158_655_3).abs() < 1e-6);
        let mut out = vec![0.0; 4];
        layer_norm(
            &[1.0, 3.0, 5.0, 5.0],
            &mut out,
            2,
            &[1.0, 2.0],
            &[0.0, 1.0],
            1e-6,
        );
        for (o, want) in out.iter().zip([-1.0, 3.0, 0.0, 1.0]) {
            assert!((o - want).abs() < 1e-5, "{out:?}");
        }
    }
}
