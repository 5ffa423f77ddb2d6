//! int8 copies of the single vectors, for the stage 1 of int8 indexes: a quarter of the
//! bytes of f32 to stream per query, which is what bounds a single query's exact scan.
//!
//! Vectors and queries are quantised with the int8 codec's quantiser (one symmetric scale
//! each); the integer products are exact on every kernel level, so scores are the same on
//! every machine: `score = (int dot) * scale_gallery * scale_query`.

use craterdex_kernels::int8::{self, I8Query};
use rayon::prelude::*;

/// `[n, dim]` int8 codes with one scale per vector.
pub struct Int8Vectors {
    codes: Vec<i8>,
    scales: Vec<f32>,
    dim: usize,
}

impl Int8Vectors {
    pub fn quantise(vectors: &[f32], dim: usize) -> Self {
        let parts: Vec<(Vec<i8>, Vec<f32>)> = vectors
            .par_chunks(4096 * dim.max(1))
            .map(|chunk| {
                let (mut codes, mut scales) = (Vec::new(), Vec::new());
                int8::quantise_rows(chunk, dim, &mut codes, &mut scales);
                (codes, scales)
            })
            .collect();
        let mut codes = Vec::with_capacity(vectors.len());
        let mut scales = Vec::with_capacity(vectors.len() / dim.max(1));
        for (c, s) in parts {
            codes.extend_from_slice(&c);
            scales.extend(s);
        }
        Self { codes, scales, dim }
    }
}

/// Up to [`Int8Queries::MAX`] queries quantised like the vectors they are scored against.
pub struct Int8Queries {
    query: I8Query,
}

impl Int8Queries {
    /// Queries per group: one packed block of the kernels.
    pub const MAX: usize = int8::BLOCK;

    pub fn new(queries: &[f32], dim: usize) -> Self {
        debug_assert!(queries.len() <= Self::MAX * dim);
        Self {
            query: I8Query::new(queries, dim),
        }
    }

    pub fn len(&self) -> usize {
        self.query.tokens()
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
        let d = gallery.dim;
        self.query
            .products(&gallery.codes[lo * d..hi * d], products);
        let nq = self.len();
        let scales = self.query.scales();
        for (r, p) in products.chunks_exact(nq).enumerate() {
            let sg = gallery.scales[lo + r];
            for (qi, (&p, &sq)) in p.iter().zip(scales).enumerate() {
                emit(qi, lo + r, p as f32 * sg * sq);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Scores are the exact integer products, scaled, and close to the f32 dots.
    #[test]
    fn int8_scores_are_exact_integer_products_close_to_f32() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
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
                    let qc = &queries.query.codes()[qi * d..(qi + 1) * d];
                    let gc = &gallery.codes[r * d..(r + 1) * d];
                    let want =
                        int8::dot(qc, gc) as f32 * gallery.scales[r] * queries.query.scales()[qi];
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
