//! Stage 1 from int8 copies of the single vectors (int8 indexes): a quarter of the bytes
//! of f32 to stream per query, which is what bounds a single query's exact scan.
//!
//! Vectors and queries are quantised with the int8 codec's quantiser (one symmetric scale
//! each); the integer products are exact, on AMX tiles where the CPU has them and in a
//! portable loop elsewhere, so scores are the same on every machine:
//! `score = (int dot) * scale_gallery * scale_query`.

use crate::codec::int8_quantise;
use craterdex_amx::PackedI8;
use rayon::prelude::*;

/// `[n, dim]` int8 codes with one scale per vector.
pub struct Int8Vectors {
    codes: Vec<i8>,
    scales: Vec<f32>,
    dim: usize,
}

impl Int8Vectors {
    pub fn quantise(vectors: &[f32], dim: usize) -> Self {
        let parts: Vec<(Vec<u8>, Vec<f32>)> = vectors
            .par_chunks(4096 * dim.max(1))
            .map(|chunk| {
                let mut codes = Vec::with_capacity(chunk.len());
                let scales = chunk
                    .chunks_exact(dim)
                    .map(|v| int8_quantise(v, &mut codes))
                    .collect();
                (codes, scales)
            })
            .collect();
        let mut codes = Vec::with_capacity(vectors.len());
        let mut scales = Vec::with_capacity(vectors.len() / dim.max(1));
        for (c, s) in parts {
            codes.extend_from_slice(bytemuck::cast_slice(&c));
            scales.extend(s);
        }
        Self { codes, scales, dim }
    }

    /// These vectors as the columns of int8 tile products, where the tiles are available
    /// and `dim` fits them.
    pub fn tile_columns(&self) -> Option<PackedI8> {
        (PackedI8::fits(self.dim) && craterdex_amx::available())
            .then(|| PackedI8::new(&self.codes, self.len(), self.dim))
    }

    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    pub fn len(&self) -> usize {
        self.scales.len()
    }
    pub fn is_empty(&self) -> bool {
        self.scales.is_empty()
    }
}

/// Queries ready for int8 scoring (at most [`Int8Queries::MAX`] at a time).
pub struct Int8Queries {
    vectors: Int8Vectors,
    packed: Option<PackedI8>,
}

impl Int8Queries {
    /// Queries per group: two column tiles.
    pub const MAX: usize = 32;

    pub fn new(queries: &[f32], dim: usize) -> Self {
        let vectors = Int8Vectors::quantise(queries, dim);
        debug_assert!(vectors.len() <= Self::MAX);
        let packed = vectors.tile_columns();
        Self { vectors, packed }
    }

    pub fn len(&self) -> usize {
        self.vectors.len()
    }
    pub fn is_empty(&self) -> bool {
        self.vectors.is_empty()
    }

    /// Scores gallery rows `lo..hi` against every query: `emit(query, row, score)`.
    /// `products` is scratch.
    pub fn score_rows(
        &self,
        gallery: &Int8Vectors,
        lo: usize,
        hi: usize,
        products: &mut Vec<i32>,
        mut emit: impl FnMut(usize, usize, f32),
    ) {
        let d = self.vectors.dim;
        debug_assert_eq!(gallery.dim, d);
        let rows = &gallery.codes[lo * d..hi * d];
        let q = &self.vectors;
        // short runs (IVF lists) go to the vector loop: a tile pass has a fixed cost and
        // pads runs under 16 rows through a copy; both give the same integers
        const TILE_MIN_ROWS: usize = 64;
        match &self.packed {
            Some(packed) if hi - lo >= TILE_MIN_ROWS => {
                let cols = packed.columns();
                products.resize((hi - lo) * cols, 0);
                craterdex_amx::i8_products(rows, hi - lo, packed, products);
                for (r, p) in products.chunks_exact(cols).enumerate() {
                    let sg = gallery.scales[lo + r];
                    for (qi, &sq) in q.scales.iter().enumerate() {
                        emit(qi, lo + r, score(p[qi], sg, sq));
                    }
                }
            }
            _ => {
                for (r, g) in rows.chunks_exact(d).enumerate() {
                    let sg = gallery.scales[lo + r];
                    for (qi, (qv, &sq)) in q.codes.chunks_exact(d).zip(&q.scales).enumerate() {
                        emit(qi, lo + r, score(int_dot(qv, g), sg, sq));
                    }
                }
            }
        }
    }
}

fn score(product: i32, scale_gallery: f32, scale_query: f32) -> f32 {
    product as f32 * scale_gallery * scale_query
}

/// Exact integer dot product: AVX-512BW or AVX2 where present (runtime check), plain
/// code elsewhere; all give the same integer.
fn int_dot(a: &[i8], b: &[i8]) -> i32 {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512bw") {
            // SAFETY: the CPU supports AVX-512BW (checked above).
            return unsafe { int_dot_avx512(a, b) };
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked above).
            return unsafe { int_dot_avx2(a, b) };
        }
    }
    int_dot_lanes(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512bw")]
unsafe fn int_dot_avx512(a: &[i8], b: &[i8]) -> i32 {
    int_dot_lanes(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn int_dot_avx2(a: &[i8], b: &[i8]) -> i32 {
    int_dot_lanes(a, b)
}

#[inline(always)]
fn int_dot_lanes(a: &[i8], b: &[i8]) -> i32 {
    // 32 independent i16 x i16 -> i32 sums: the shape the compiler turns into
    // multiply-add-pairs instructions (baseline x86-64 builds get none of that).
    const LANES: usize = 32;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0i32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: i32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(&x, &y)| x as i32 * y as i32)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += (x[i] as i16 * y[i] as i16) as i32;
        }
    }
    acc.iter().sum::<i32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn integer_dots_agree_across_kernels() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(6);
        for n in [0, 1, 31, 32, 33, 384, 1000] {
            let a: Vec<i8> = (0..n).map(|_| rng.gen_range(-127..=127)).collect();
            let b: Vec<i8> = (0..n).map(|_| rng.gen_range(-127..=127)).collect();
            let naive: i32 = a.iter().zip(&b).map(|(&x, &y)| x as i32 * y as i32).sum();
            assert_eq!(int_dot(&a, &b), naive, "n {n}");
            assert_eq!(int_dot_lanes(&a, &b), naive, "n {n}");
        }
    }

    /// The tile path and the portable loop give bit-identical scores, close to f32 dots.
    #[test]
    fn int8_scores_are_exact_integer_products_close_to_f32() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        // runs of 64 rows and more go to the tiles, shorter ones to the vector loop
        for (d, n, nq) in [(64, 150, 1), (384, 137, 32), (384, 37, 2), (40, 20, 3)] {
            let g: Vec<f32> = (0..n * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let q: Vec<f32> = (0..nq * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let gallery = Int8Vectors::quantise(&g, d);
            let queries = Int8Queries::new(&q, d);
            let mut got = vec![f32::NAN; nq * n];
            queries.score_rows(&gallery, 0, n, &mut Vec::new(), |qi, r, s| {
                got[qi * n + r] = s
            });
            for qi in 0..nq {
                for r in 0..n {
                    let (qc, gc) = (&queries.vectors.codes, &gallery.codes);
                    let want = score(
                        int_dot(&qc[qi * d..(qi + 1) * d], &gc[r * d..(r + 1) * d]),
                        gallery.scales[r],
                        queries.vectors.scales[qi],
                    );
                    assert_eq!(got[qi * n + r], want, "d {d} query {qi} row {r}");
                    let exact: f32 = (0..d).map(|t| q[qi * d + t] * g[r * d + t]).sum();
                    assert!(
                        (want - exact).abs() < 0.02 * (d as f32).sqrt(),
                        "d {d}: {want} vs {exact}"
                    );
                }
            }
        }
    }
}
