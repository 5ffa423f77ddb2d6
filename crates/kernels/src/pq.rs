//! Product quantisation: the nearest of 256 centroids to a sub-vector, for encoding.

use crate::level::{active, dispatch};

/// Centroids per sub-space.
pub const CENTROIDS: usize = 256;

/// The centroid with the largest `2 x.c - |c|^2` (the nearest in L2) among the 256 of `t`
/// (`[ds, 256]`, transposed) with squared norms `norms`; ties go to the lower index. The same
/// sums on every level (whole rows of 256, vectorised at the active level's width).
pub fn nearest(x: &[f32], t: &[f32], norms: &[f32]) -> usize {
    dispatch!(active(),
        avx512 => nearest_avx512(x, t, norms),
        avx2 => nearest_avx2(x, t, norms),
        portable => nearest_plain(x, t, norms))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn nearest_avx512(x: &[f32], t: &[f32], norms: &[f32]) -> usize {
    nearest_plain(x, t, norms)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn nearest_avx2(x: &[f32], t: &[f32], norms: &[f32]) -> usize {
    nearest_plain(x, t, norms)
}

#[inline(always)]
fn nearest_plain(x: &[f32], t: &[f32], norms: &[f32]) -> usize {
    let mut score = [0f32; CENTROIDS];
    score.iter_mut().zip(norms).for_each(|(s, n)| *s = -n);
    for (&xj, row) in x.iter().zip(t.chunks_exact(CENTROIDS)) {
        let xj = 2.0 * xj;
        score.iter_mut().zip(row).for_each(|(s, c)| *s += xj * c);
    }
    let best = score.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    score.iter().position(|&s| s == best).unwrap_or(0)
}
