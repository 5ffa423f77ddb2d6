//! craterdex-tokens: turns one image's token arrays into what is searched — single-vector
//! descriptors (CLS, GAP, GeM, max) and K instance tokens — with optional PCA whitening.
//!
//! Owns: pooling, whitening, seed selection, instance-token aggregation, per-image k-means.
//! Knows nothing of how tokens were made (any `[T, D]` array will do), of files or of indexes.
//! Every function is deterministic: identical input (and seed) gives identical output.

pub mod aggregate;
pub mod descriptors;
pub mod encoder;
pub mod whitening;

pub use aggregate::{aggregate, Aggregation, SeedStrategy};
pub use descriptors::{pool, Pooling};
pub use encoder::{Descriptors, Encoder, FeatureRef, Recipe};
pub use whitening::Whitening;

/// Scales `v` to unit length (a zero vector stays zero).
pub fn l2_normalize(v: &mut [f32]) {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        let inv = 1.0 / n;
        v.iter_mut().for_each(|x| *x *= inv);
    }
}

/// Unit-normalises each `d`-wide row of a row-major matrix.
pub fn l2_normalize_rows(m: &mut [f32], d: usize) {
    m.chunks_mut(d).for_each(l2_normalize);
}

pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F (checked above).
            return unsafe { dot_avx512(a, b) };
        }
    }
    dot_lanes(a, b)
}

/// The same sums as `dot_lanes` (identical results), compiled for 512-bit vectors: the
/// build targets baseline x86-64, where the sixteen lanes take four SSE registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_avx512(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b)
}

#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    // Sixteen independent partial sums let the compiler vectorise (a single running sum
    // cannot be reordered); about 4x faster for 384-d tokens, and still deterministic.
    const LANES: usize = 16;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod dot_tests {
    use super::*;

    #[test]
    fn dispatched_dot_matches_the_portable_sums_exactly() {
        for n in [0usize, 1, 15, 16, 17, 384, 1000] {
            let a: Vec<f32> = (0..n).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.1).collect();
            let b: Vec<f32> = (0..n).map(|i| ((i * 13 % 7) as f32 - 3.0) * 0.3).collect();
            let naive: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (*x as f64) * (*y as f64))
                .sum();
            assert_eq!(dot(&a, &b).to_bits(), dot_lanes(&a, &b).to_bits(), "n={n}");
            assert!((dot(&a, &b) as f64 - naive).abs() < 1e-4, "n={n}");
        }
    }
}
