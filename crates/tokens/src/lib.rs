//! craterdex-tokens: turns one image's token arrays into what is searched — single-vector
//! descriptors (CLS, GAP, GeM, max) and K instance tokens — with optional PCA whitening.
//!
//! Owns: pooling, whitening, seed selection, instance-token aggregation, k-means (per image, and for the index's IVF and PQ),
//! spatial verification of two images' patch tokens.
//! Knows nothing of how tokens were made (any `[T, D]` array will do), of files or of indexes.
//! Every function is deterministic: identical input (and seed) gives identical output.

pub mod aggregate;
pub mod descriptors;
pub mod encoder;
mod error;
pub mod kmeans;
pub mod verify;
pub mod whitening;

pub use aggregate::{aggregate, Aggregation, SeedStrategy};
pub use descriptors::{pool, Pooling};
pub use encoder::{
    Descriptors, Encoder, FeatureRef, Recipe, DEFAULT_PAIR_BLEND, SHIPPED_K, SHIPPED_POOLING,
    SHIPPED_SEEDS,
};
pub use error::{Error, Result};
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

/// `sum a_i b_i` (the kernels crate's, identical on every kernel level: sixteen running sums
/// in a fixed order).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    craterdex_kernels::f32::dot(a, b)
}
