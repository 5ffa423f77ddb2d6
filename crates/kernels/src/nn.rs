//! The element-wise and row-wise operations of a transformer block: exact (erf) GELU, row
//! softmax, layer norm, and the scaled residual add. Branch-free arithmetic, compiled for the
//! widest vectors of the active level through [`map_in_place`].

use crate::f32::map_in_place;
use rayon::prelude::*;

/// `erf(x)` as a rational function of `x` on [-4, 4] (|erf| rounds to 1 beyond), the form
/// XLA and Eigen use for f32: within 5e-7 (4 ulp near 1) of libm's erff (tested), branch-free
/// so that loops over it vectorise. libm's scalar erff took a third of the forward pass.
#[inline(always)]
pub fn erf_rational(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10_f32;
    p = p * x2 + 2.770_681_4e-8;
    p = p * x2 - 2.101_024e-6;
    p = p * x2 - 5.692_506_4e-5;
    p = p * x2 - 7.349_906_3e-4;
    p = p * x2 - 2.954_6e-3;
    p = p * x2 - 1.609_603_3e-2;
    let mut q = -1.456_607_2e-5_f32;
    q = q * x2 - 2.133_740_6e-4;
    q = q * x2 - 1.682_827e-3;
    q = q * x2 - 7.373_329e-3;
    q = q * x2 - 1.426_474e-2;
    x * p / q
}

/// Exact (erf) GELU, as in the reference DINO and DINOv2 code.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf_rational(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// GELU over a buffer, in parallel chunks.
pub fn gelu_in_place(v: &mut [f32]) {
    v.par_chunks_mut(4096).for_each(|c| map_in_place(c, gelu));
}

/// `e^x` for `x <= 0` (softmax after subtracting the row maximum): `2^n e^r` with
/// `|r| <= ln2/2` and a degree-6 Taylor polynomial, branch-free so that it vectorises; within
/// 3 ulp of libm's expf (tested). Below -87 (e^x < 2^-125) the result is zero.
#[inline(always)]
pub fn exp_nonpositive(input: f32) -> f32 {
    let x = input.max(-87.0);
    // Round to nearest by adding and removing 1.5 * 2^23 (f32::round is not one instruction).
    const ROUNDER: f32 = 12_582_912.0;
    let n = (x * std::f32::consts::LOG2_E + ROUNDER) - ROUNDER;
    // ln 2 split in two so that n * ln2 is exact in its high part.
    let r = (x - n * 0.693_145_75) - n * 1.428_606_8e-6;
    let mut p = 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    if input < -87.0 {
        0.0
    } else {
        p * scale
    }
}

/// `softmax(scale * row)` in place.
pub fn softmax_scaled(row: &mut [f32], scale: f32) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    map_in_place(row, |v| exp_nonpositive((v - max) * scale));
    let sum: f32 = row.iter().sum();
    let inv = 1.0 / sum;
    row.iter_mut().for_each(|v| *v *= inv);
}

/// Layer norm of each `d`-wide row of `x` into `out` (mean and variance in f64).
pub fn layer_norm(x: &[f32], out: &mut [f32], d: usize, w: &[f32], b: &[f32], eps: f32) {
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .for_each(|(o, r)| {
            let mean = r.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
            let var = r.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
            let inv = 1.0 / (var + eps as f64).sqrt();
            for j in 0..d {
                o[j] = ((r[j] as f64 - mean) * inv) as f32 * w[j] + b[j];
            }
        });
}

/// `x += y` row by row, with `y` scaled per column when `scale` is given (layer scale).
pub fn add_residual(x: &mut [f32], y: &[f32], scale: Option<&[f32]>, d: usize) {
    x.par_chunks_mut(d)
        .zip(y.par_chunks(d))
        .for_each(|(xr, yr)| match scale {
            Some(s) => xr
                .iter_mut()
                .zip(yr)
                .zip(s)
                .for_each(|((a, b), g)| *a += b * g),
            None => xr.iter_mut().zip(yr).for_each(|(a, b)| *a += b),
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rational_erf_matches_libm_everywhere() {
        let mut worst = 0f32;
        for i in -2_000_000..=2_000_000 {
            let x = i as f32 * 3e-6; // [-6, 6]
            worst = worst.max((erf_rational(x) - libm::erff(x)).abs());
        }
        assert!(worst < 5e-7, "worst |erf error| {worst}");
    }

    #[test]
    fn vectorised_exp_is_within_3_ulp() {
        let mut worst_ulp = 0i64;
        for i in 0..=1_000_000 {
            let x = -(i as f32) * 8.0e-5; // [-80, 0]
            let (got, want) = (exp_nonpositive(x), x.exp());
            worst_ulp = worst_ulp.max((got.to_bits() as i64 - want.to_bits() as i64).abs());
        }
        assert!(worst_ulp <= 3, "worst error {worst_ulp} ulp");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-90.0), 0.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn softmax_rows_sum_to_one() {
        let mut r = vec![1.0, 2.0, 3.0, -1000.0];
        softmax_scaled(&mut r, 1.0);
        assert!((r.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(r[3], 0.0);
        let mut s = vec![2.0, 4.0];
        softmax_scaled(&mut s, 0.5);
        assert!((s[1] / s[0] - std::f32::consts::E).abs() < 1e-5);
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
