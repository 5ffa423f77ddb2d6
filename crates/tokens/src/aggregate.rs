//! From `T` patch tokens to `K` tokens: seed selection, instance tokens, raw selection,
//! per-image k-means, or all tokens.
//!
//! Inputs are L2-normalised (and optionally whitened) tokens `[T, D]`, the head-averaged
//! CLS attention `[T]` and the tokens' norms before normalisation `[T]`. Outputs are
//! L2-normalised `[K, D]`. Ties are broken towards the lower token index.

use crate::{dot, l2_normalize};
use rand::{seq::index::sample, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum SeedStrategy {
    /// Top-K by CLS attention.
    Attention,
    /// Farthest-point sampling in cosine distance, starting at the most-attended token.
    Fps,
    /// K distinct tokens drawn with a seeded generator.
    Random { seed: u64 },
    /// Top-K by token norm (before normalisation).
    Norm,
    /// Top-K by norm x attention.
    NormAttention,
}

impl SeedStrategy {
    /// The strategies a user names (`random` with seed 0).
    pub const OPTIONS: [SeedStrategy; 5] = [
        SeedStrategy::Fps,
        SeedStrategy::Attention,
        SeedStrategy::Random { seed: 0 },
        SeedStrategy::Norm,
        SeedStrategy::NormAttention,
    ];

    pub fn name(&self) -> &'static str {
        match self {
            SeedStrategy::Attention => "attn",
            SeedStrategy::Fps => "fps",
            SeedStrategy::Random { .. } => "random",
            SeedStrategy::Norm => "norm",
            SeedStrategy::NormAttention => "normattn",
        }
    }
}

impl std::fmt::Display for SeedStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SeedStrategy {
    type Err = craterdex_errors::Invalid;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let aliases = [
            ("attention", SeedStrategy::Attention),
            ("norm-attention", SeedStrategy::NormAttention),
        ];
        craterdex_errors::parse_named("seed strategy", s, Self::OPTIONS, &aliases)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Aggregation {
    /// No tokens: the image is searched by its single vector alone.
    None,
    /// Every patch token.
    Full,
    /// The seed tokens themselves.
    Raw { seeds: SeedStrategy, k: usize },
    /// Instance tokens: each non-seed token joins its most similar seed (`soft_m` > 1: its
    /// top-m seeds); `z_k = l2(seed_k + mean(members))`, an empty cluster keeps the seed.
    Instance {
        seeds: SeedStrategy,
        k: usize,
        soft_m: usize,
    },
    /// Per-image k-means (k-means++ seeding, Lloyd iterations, seeded).
    KMeans {
        k: usize,
        iterations: usize,
        seed: u64,
    },
}

/// One image's tokens as aggregation sees them.
pub struct TokenView<'a> {
    pub tokens: &'a [f32],
    pub dim: usize,
    pub attention: &'a [f32],
    pub norms: &'a [f32],
}

impl TokenView<'_> {
    fn len(&self) -> usize {
        self.tokens.len() / self.dim
    }
    fn row(&self, i: usize) -> &[f32] {
        &self.tokens[i * self.dim..(i + 1) * self.dim]
    }
}

/// Aggregates one image's tokens; returns `[K', D]` with `K' = min(K, T)`.
pub fn aggregate(v: &TokenView, how: Aggregation) -> Vec<f32> {
    match how {
        Aggregation::None => Vec::new(),
        Aggregation::Full => v.tokens.to_vec(),
        Aggregation::Raw { seeds, k } => select_seeds(v, seeds, k)
            .iter()
            .flat_map(|&i| v.row(i).to_vec())
            .collect(),
        Aggregation::Instance { seeds, k, soft_m } => {
            instance_tokens(v, &select_seeds(v, seeds, k), soft_m.max(1))
        }
        Aggregation::KMeans {
            k,
            iterations,
            seed,
        } => kmeans(v, k, iterations, seed),
    }
}

fn top_k_by(scores: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// The first position of the largest value (0 for an empty slice).
pub(crate) fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold(0, |best, (i, x)| if *x > v[best] { i } else { best })
}

/// The K seed indices in selection order.
pub fn select_seeds(v: &TokenView, strategy: SeedStrategy, k: usize) -> Vec<usize> {
    let t = v.len();
    let k = k.min(t);
    match strategy {
        SeedStrategy::Attention => top_k_by(v.attention, k),
        SeedStrategy::Norm => top_k_by(v.norms, k),
        SeedStrategy::NormAttention => {
            let s: Vec<f32> = v
                .norms
                .iter()
                .zip(v.attention)
                .map(|(n, a)| n * a)
                .collect();
            top_k_by(&s, k)
        }
        SeedStrategy::Random { seed } => {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            sample(&mut rng, t, k).into_vec()
        }
        SeedStrategy::Fps => {
            if k == 0 {
                return Vec::new();
            }
            let first = if v.attention.len() == t {
                argmax(v.attention)
            } else {
                0
            };
            let mut chosen = vec![first];
            let mut min_dist: Vec<f32> =
                (0..t).map(|i| 1.0 - dot(v.row(i), v.row(first))).collect();
            min_dist[first] = f32::NEG_INFINITY;
            while chosen.len() < k {
                let next = argmax(&min_dist);
                chosen.push(next);
                let r = v.row(next);
                for (i, md) in min_dist.iter_mut().enumerate() {
                    if *md != f32::NEG_INFINITY {
                        *md = md.min(1.0 - dot(v.row(i), r));
                    }
                }
                min_dist[next] = f32::NEG_INFINITY;
            }
            chosen
        }
    }
}

/// Instance tokens from chosen seeds (see [`Aggregation::Instance`]).
pub fn instance_tokens(v: &TokenView, seeds: &[usize], soft_m: usize) -> Vec<f32> {
    let d = v.dim;
    let k = seeds.len();
    let mut is_seed = vec![false; v.len()];
    seeds.iter().for_each(|&s| is_seed[s] = true);
    let mut sums = vec![0f32; k * d];
    let mut counts = vec![0usize; k];
    let mut sims = vec![0f32; k];
    for i in (0..v.len()).filter(|&i| !is_seed[i]) {
        let r = v.row(i);
        for (s, &seed) in sims.iter_mut().zip(seeds) {
            *s = dot(r, v.row(seed));
        }
        for c in top_k_by(&sims, soft_m) {
            sums[c * d..(c + 1) * d]
                .iter_mut()
                .zip(r)
                .for_each(|(a, x)| *a += x);
            counts[c] += 1;
        }
    }
    let mut out = Vec::with_capacity(k * d);
    for (c, &seed) in seeds.iter().enumerate() {
        let mut z = v.row(seed).to_vec();
        if counts[c] > 0 {
            let inv = 1.0 / counts[c] as f32;
            z.iter_mut()
                .zip(&sums[c * d..(c + 1) * d])
                .for_each(|(a, s)| *a += s * inv);
        }
        l2_normalize(&mut z);
        out.extend_from_slice(&z);
    }
    out
}

/// Per-image k-means ([`crate::kmeans`]): k-means++ seeding, `iterations` Lloyd steps in L2,
/// unit-normalised centroids.
pub fn kmeans(v: &TokenView, k: usize, iterations: usize, seed: u64) -> Vec<f32> {
    let (t, d) = (v.len(), v.dim);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let seeds = crate::kmeans::plus_plus(&v.tokens[..t * d], d, k, &mut rng);
    let k = seeds.len() / d.max(1);
    if k == 0 {
        return Vec::new();
    }
    let tokens = nalgebra::DMatrixView::<f32>::from_slice(v.tokens, d, t); // column i = token i
    let token_sq: Vec<f32> = (0..t).map(|i| dot(v.row(i), v.row(i))).collect();
    // |x - c|^2 = |x|^2 + |c|^2 - 2 x.c, with every x.c from one matrix product
    let nearest = |centres: &[f32]| -> Vec<usize> {
        let cm = nalgebra::DMatrixView::<f32>::from_slice(centres, d, k);
        let xc = tokens.transpose() * cm; // [t, k]
        let centre_sq: Vec<f32> = centres.chunks_exact(d).map(|c| dot(c, c)).collect();
        (0..t)
            .map(|i| {
                // first strictly closest centre: ties go to the lower index
                let mut best = (0, f32::INFINITY);
                for c in 0..k {
                    let dist = token_sq[i] + centre_sq[c] - 2.0 * xc[(i, c)];
                    if dist < best.1 {
                        best = (c, dist);
                    }
                }
                best.0
            })
            .collect()
    };
    let mut centres = crate::kmeans::lloyd(
        &v.tokens[..t * d],
        d,
        seeds,
        iterations,
        crate::kmeans::Centres::Mean,
        &mut rng,
        nearest,
    );
    centres.chunks_mut(d).for_each(l2_normalize);
    centres
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::l2_normalize_rows;

    fn view<'a>(
        tokens: &'a [f32],
        attention: &'a [f32],
        norms: &'a [f32],
        dim: usize,
    ) -> TokenView<'a> {
        TokenView {
            tokens,
            dim,
            attention,
            norms,
        }
    }

    #[test]
    fn attention_and_norm_seeds() {
        let toks = [1.0, 0.0, 0.0, 1.0, 0.6, 0.8];
        let att = [0.1, 0.5, 0.5];
        let norms = [3.0, 1.0, 2.0];
        let v = view(&toks, &att, &norms, 2);
        assert_eq!(select_seeds(&v, SeedStrategy::Attention, 2), vec![1, 2]); // tie -> lower index first
        assert_eq!(select_seeds(&v, SeedStrategy::Norm, 1), vec![0]);
        assert_eq!(select_seeds(&v, SeedStrategy::NormAttention, 1), vec![2]); // products 0.3, 0.5, 1.0
        assert_eq!(select_seeds(&v, SeedStrategy::Attention, 10).len(), 3);
    }

    #[test]
    fn fps_starts_at_most_attended_and_goes_far() {
        // tokens on the unit circle at 0, 10, 90, 180 degrees
        let deg = [0f32, 10.0, 90.0, 180.0];
        let toks: Vec<f32> = deg
            .iter()
            .flat_map(|a| [a.to_radians().cos(), a.to_radians().sin()])
            .collect();
        let att = [0.1, 0.7, 0.1, 0.1];
        let v = view(&toks, &att, &[1.0; 4], 2);
        // start at 10 deg; farthest is 180; then the one farthest from both: 90 (80 from 10 ... vs 0: 10 from 10)
        assert_eq!(select_seeds(&v, SeedStrategy::Fps, 3), vec![1, 3, 2]);
    }

    #[test]
    fn random_seeds_are_reproducible_and_distinct() {
        let toks = vec![0.5; 40];
        let v = view(&toks, &[0.0; 20], &[1.0; 20], 2);
        let a = select_seeds(&v, SeedStrategy::Random { seed: 9 }, 8);
        assert_eq!(a, select_seeds(&v, SeedStrategy::Random { seed: 9 }, 8));
        let mut s = a.clone();
        s.sort();
        s.dedup();
        assert_eq!(s.len(), 8);
    }

    #[test]
    fn instance_tokens_by_hand() {
        // seeds: token 0 (1,0) and token 2 (0,1); token 1 (0.8,0.6) joins seed 0; token 3 (0.6,0.8) joins seed 2
        let toks = [1.0, 0.0, 0.8, 0.6, 0.0, 1.0, 0.6, 0.8];
        let v = view(&toks, &[0.0; 4], &[1.0; 4], 2);
        let z = instance_tokens(&v, &[0, 2], 1);
        let mut e0 = vec![1.8, 0.6];
        let mut e1 = vec![0.6, 1.8];
        l2_normalize(&mut e0);
        l2_normalize(&mut e1);
        assert!((z[0] - e0[0]).abs() < 1e-6 && (z[1] - e0[1]).abs() < 1e-6);
        assert!((z[2] - e1[0]).abs() < 1e-6 && (z[3] - e1[1]).abs() < 1e-6);
        // an empty cluster keeps its seed: seed (-1, 0) is nobody's nearest
        let toks = [-1.0, 0.0, 1.0, 0.0, 0.8, 0.6, 0.6, 0.8];
        let v = view(&toks, &[0.0; 4], &[1.0; 4], 2);
        let z = instance_tokens(&v, &[0, 1], 1);
        assert_eq!(&z[..2], &[-1.0, 0.0]);
    }

    #[test]
    fn soft_assignment_counts_each_token_for_m_seeds() {
        let h = std::f32::consts::FRAC_1_SQRT_2;
        let toks = [1.0, 0.0, 0.0, 1.0, h, h];
        let v = view(&toks, &[0.0; 3], &[1.0; 3], 2);
        let hard = instance_tokens(&v, &[0, 1], 1);
        let soft = instance_tokens(&v, &[0, 1], 2);
        assert_ne!(hard, soft);
        // with m=2 the middle token joins both seeds symmetrically
        assert!((soft[0] - soft[3]).abs() < 1e-5);
    }

    #[test]
    fn kmeans_separates_two_clusters_and_is_deterministic() {
        let mut toks = Vec::new();
        for i in 0..10 {
            let e = i as f32 * 0.01;
            toks.extend_from_slice(&[1.0, e, 0.0]);
            toks.extend_from_slice(&[0.0, e, 1.0]);
        }
        l2_normalize_rows(&mut toks, 3);
        let v = view(&toks, &[0.0; 20], &[1.0; 20], 3);
        let c = kmeans(&v, 2, 20, 1);
        assert_eq!(c, kmeans(&v, 2, 20, 1));
        let near = |x: &[f32], y: [f32; 3]| x.iter().zip(y).all(|(a, b)| (a - b).abs() < 0.1);
        assert!(
            (near(&c[..3], [1.0, 0.05, 0.0]) && near(&c[3..], [0.0, 0.05, 1.0]))
                || (near(&c[3..], [1.0, 0.05, 0.0]) && near(&c[..3], [0.0, 0.05, 1.0])),
            "{c:?}"
        );
    }

    #[test]
    fn aggregate_shapes() {
        let mut toks: Vec<f32> = (0..64).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
        l2_normalize_rows(&mut toks, 4);
        let att: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let v = view(&toks, &att, &[1.0; 16], 4);
        assert_eq!(aggregate(&v, Aggregation::Full).len(), 64);
        assert_eq!(
            aggregate(
                &v,
                Aggregation::Raw {
                    seeds: SeedStrategy::Fps,
                    k: 3
                }
            )
            .len(),
            12
        );
        assert_eq!(
            aggregate(
                &v,
                Aggregation::Instance {
                    seeds: SeedStrategy::Attention,
                    k: 5,
                    soft_m: 1
                }
            )
            .len(),
            20
        );
        assert_eq!(
            aggregate(
                &v,
                Aggregation::KMeans {
                    k: 4,
                    iterations: 20,
                    seed: 0
                }
            )
            .len(),
            16
        );
        assert_eq!(
            aggregate(
                &v,
                Aggregation::Instance {
                    seeds: SeedStrategy::Fps,
                    k: 99,
                    soft_m: 1
                }
            )
            .len(),
            64
        );
    }
}
