//! How instance tokens are stored: f32, f16, int8 with one symmetric scale per vector, or
//! product quantisation (m sub-vectors, 256 centroids each, 8-bit codes) scored
//! asymmetrically — the query stays f32 and meets the reconstructed document tokens, which
//! equals summing per-sub-vector lookup tables.

use crate::error::{Error, Result};
use craterdex_errors::ensure;
use half::f16;
use rand::{seq::index::sample, SeedableRng};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Codec {
    F32,
    F16,
    Int8,
    Pq { m: usize },
}

impl Codec {
    pub fn name(&self) -> String {
        match self {
            Codec::F32 => "f32".into(),
            Codec::F16 => "f16".into(),
            Codec::Int8 => "int8".into(),
            Codec::Pq { m } => format!("pq{m}"),
        }
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// `f32`, `f16`, `int8` or `pqM` (M subquantisers, e.g. `pq96`).
impl std::str::FromStr for Codec {
    type Err = craterdex_errors::Invalid;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let s = s.trim();
        Ok(match s {
            "f32" => Codec::F32,
            "f16" | "fp16" => Codec::F16,
            "int8" | "i8" => Codec::Int8,
            _ => match s
                .strip_prefix("pq")
                .and_then(|m| m.trim_start_matches(':').parse().ok())
            {
                Some(m) if m > 0 => Codec::Pq { m },
                _ => {
                    return Err(craterdex_errors::Invalid(format!(
                        "unknown codec {s:?}: use f32, f16, int8 or pqM (e.g. pq96)"
                    )))
                }
            },
        })
    }
}

pub const PQ_CENTROIDS: usize = craterdex_kernels::pq::CENTROIDS;
const PQ_TRAIN_MAX: usize = 32_768;
const PQ_ITERATIONS: usize = 12;

/// A codec with its trained parameters (PQ codebooks `[m, 256, d/m]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenCodec {
    pub codec: Codec,
    pub dim: usize,
    #[serde(skip)]
    pub codebooks: Vec<f32>,
    /// The codebooks laid out for fast encoding, derived on first use (codebooks are
    /// filled in before a codec encodes anything).
    #[serde(skip)]
    pub pq_tables: OnceLock<PqTables>,
}

/// Per sub-space, the centroids transposed (`[ds, 256]`) and their squared norms: the
/// nearest centroid is the largest `2 x.c - |c|^2`, computed for all 256 at once.
#[derive(Clone, Debug, PartialEq)]
pub struct PqTables {
    transposed: Vec<f32>,
    norms: Vec<f32>,
    ds: usize,
}

impl PqTables {
    fn new(codebooks: &[f32], m: usize, ds: usize) -> Self {
        let mut transposed = vec![0f32; m * ds * PQ_CENTROIDS];
        let mut norms = vec![0f32; m * PQ_CENTROIDS];
        for s in 0..m {
            for c in 0..PQ_CENTROIDS {
                let cb = &codebooks[(s * PQ_CENTROIDS + c) * ds..][..ds];
                norms[s * PQ_CENTROIDS + c] = cb.iter().map(|v| v * v).sum();
                for (j, &v) in cb.iter().enumerate() {
                    transposed[(s * ds + j) * PQ_CENTROIDS + c] = v;
                }
            }
        }
        Self {
            transposed,
            norms,
            ds,
        }
    }

    /// The nearest centroid of sub-space `s` to `x`.
    fn nearest(&self, s: usize, x: &[f32]) -> usize {
        let ds = self.ds;
        let t = &self.transposed[s * ds * PQ_CENTROIDS..(s + 1) * ds * PQ_CENTROIDS];
        let norms = &self.norms[s * PQ_CENTROIDS..(s + 1) * PQ_CENTROIDS];
        craterdex_kernels::pq::nearest(x, t, norms)
    }
}

impl TokenCodec {
    /// Prepares a codec; PQ trains its codebooks on `sample` (unit tokens, `[n, dim]`).
    pub fn train(codec: Codec, dim: usize, sample_tokens: &[f32], seed: u64) -> Result<Self> {
        let codebooks = match codec {
            Codec::Pq { m } => {
                ensure!(
                    dim.is_multiple_of(m),
                    Error::Invalid(format!(
                        "PQ needs the token dimension {dim} to be divisible by m = {m}"
                    ))
                );
                let n = sample_tokens.len() / dim;
                ensure!(
                    n >= PQ_CENTROIDS,
                    Error::Invalid(format!(
                        "PQ training needs at least {PQ_CENTROIDS} tokens, got {n}"
                    ))
                );
                train_pq(sample_tokens, dim, m, seed)
            }
            _ => Vec::new(),
        };
        Ok(Self {
            codec,
            dim,
            codebooks,
            pq_tables: OnceLock::new(),
        })
    }

    /// Stored bytes per token (int8 adds a 4-byte scale kept in a separate array).
    pub fn bytes_per_token(&self) -> usize {
        match self.codec {
            Codec::F32 => self.dim * 4,
            Codec::F16 => self.dim * 2,
            Codec::Int8 => self.dim,
            Codec::Pq { m } => m,
        }
    }

    /// Bytes of trained parameters (PQ codebooks: 256 centroids per sub-space, f32).
    pub fn codebook_bytes(&self) -> usize {
        match self.codec {
            Codec::Pq { .. } => PQ_CENTROIDS * self.dim * 4,
            _ => 0,
        }
    }

    pub fn has_scales(&self) -> bool {
        self.codec == Codec::Int8
    }

    /// Appends the encoding of `tokens` (`[k, dim]`) to `payload` (and `scales` for int8).
    pub fn encode(&self, tokens: &[f32], payload: &mut Vec<u8>, scales: &mut Vec<f32>) {
        let d = self.dim;
        match self.codec {
            Codec::F32 => payload.extend_from_slice(bytemuck::cast_slice(tokens)),
            Codec::F16 => tokens
                .iter()
                .for_each(|&v| payload.extend_from_slice(&f16::from_f32(v).to_le_bytes())),
            Codec::Int8 => {
                for t in tokens.chunks_exact(d) {
                    scales.push(int8_quantise(t, payload));
                }
            }
            Codec::Pq { m } => {
                let ds = d / m;
                let tables = self
                    .pq_tables
                    .get_or_init(|| PqTables::new(&self.codebooks, m, ds));
                for t in tokens.chunks_exact(d) {
                    for s in 0..m {
                        payload.push(tables.nearest(s, &t[s * ds..(s + 1) * ds]) as u8);
                    }
                }
            }
        }
    }

    /// Decodes `k` tokens into `out` (`[k, dim]`).
    pub fn decode(&self, payload: &[u8], scales: &[f32], out: &mut [f32]) {
        let d = self.dim;
        match self.codec {
            Codec::F32 => out.copy_from_slice(bytemuck::cast_slice(payload)),
            Codec::F16 => match bytemuck::try_cast_slice::<u8, f16>(payload) {
                // aligned (always, for mapped segments): the SIMD (F16C) slice conversion
                Ok(h) => half::slice::HalfFloatSliceExt::convert_to_f32_slice(h, out),
                Err(_) => {
                    for (o, c) in out.iter_mut().zip(payload.chunks_exact(2)) {
                        *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
                    }
                }
            },
            Codec::Int8 => {
                for ((o, p), s) in out
                    .chunks_exact_mut(d)
                    .zip(payload.chunks_exact(d))
                    .zip(scales)
                {
                    o.iter_mut()
                        .zip(p)
                        .for_each(|(o, &b)| *o = (b as i8) as f32 * s);
                }
            }
            Codec::Pq { m } => {
                let ds = d / m;
                for (o, codes) in out.chunks_exact_mut(d).zip(payload.chunks_exact(m)) {
                    for (s, &c) in codes.iter().enumerate() {
                        let cb = &self.codebooks[(s * PQ_CENTROIDS + c as usize) * ds..][..ds];
                        o[s * ds..(s + 1) * ds].copy_from_slice(cb);
                    }
                }
            }
        }
    }
}

/// Symmetric int8 for one vector: appends `round(v / scale)` in [-127, 127] to `codes` and
/// returns the scale (`max |v| / 127`, 1 for a zero vector).
pub fn int8_quantise(v: &[f32], codes: &mut Vec<u8>) -> f32 {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let scale = if max > 0.0 { max / 127.0 } else { 1.0 };
    codes.extend(
        v.iter()
            .map(|x| round_small(x / scale).clamp(-127.0, 127.0) as i8 as u8),
    );
    scale
}

/// Round to nearest (ties to even) for |x| < 2^22 by adding and removing 1.5 * 2^23: plain
/// arithmetic the compiler vectorises, where `round()` on baseline x86-64 is a libm call
/// per value (it was a tenth of the time to build an int8 index).
fn round_small(x: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0;
    (x + SHIFT) - SHIFT
}

/// k-means per sub-space ([`craterdex_tokens::kmeans`], from random distinct training
/// vectors), in parallel.
fn train_pq(samples: &[f32], d: usize, m: usize, seed: u64) -> Vec<f32> {
    let n_all = samples.len() / d;
    let ds = d / m;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let rows: Vec<usize> = if n_all > PQ_TRAIN_MAX {
        sample(&mut rng, n_all, PQ_TRAIN_MAX).into_vec()
    } else {
        (0..n_all).collect()
    };
    let books: Vec<Vec<f32>> = (0..m)
        .into_par_iter()
        .map(|s| {
            let sub: Vec<f32> = rows
                .iter()
                .flat_map(|&r| {
                    samples[r * d + s * ds..r * d + (s + 1) * ds]
                        .iter()
                        .copied()
                })
                .collect();
            let n = rows.len();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(
                seed ^ (s as u64 + 1).wrapping_mul(0x9E37_79B9),
            );
            let cent: Vec<f32> = sample(&mut rng, n, PQ_CENTROIDS)
                .iter()
                .flat_map(|i| sub[i * ds..(i + 1) * ds].to_vec())
                .collect();
            craterdex_tokens::kmeans::lloyd(
                &sub,
                ds,
                cent,
                PQ_ITERATIONS,
                craterdex_tokens::kmeans::Centres::Mean,
                &mut rng,
                |cent: &[f32]| {
                    let tables = PqTables::new(cent, 1, ds);
                    sub.chunks_exact(ds).map(|x| tables.nearest(0, x)).collect()
                },
            )
        })
        .collect();
    books.concat()
}

#[cfg(test)]
mod tests {
    use super::*;
    use craterdex_kernels::f32::maxsim;
    use rand::Rng;

    fn unit_tokens(n: usize, d: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut v: Vec<f32> = (0..n * d).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        for r in v.chunks_mut(d) {
            let n = r.iter().map(|x| x * x).sum::<f32>().sqrt();
            r.iter_mut().for_each(|x| *x /= n);
        }
        v
    }

    fn roundtrip(c: &TokenCodec, t: &[f32]) -> Vec<f32> {
        let (mut p, mut s) = (Vec::new(), Vec::new());
        c.encode(t, &mut p, &mut s);
        assert_eq!(p.len(), t.len() / c.dim * c.bytes_per_token());
        let mut out = vec![0f32; t.len()];
        c.decode(&p, &s, &mut out);
        out
    }

    /// Property: for random unit queries and documents, each codec's MaxSim score stays
    /// within its bound of the f32 score.
    #[test]
    fn codec_score_error_is_bounded() {
        let d = 96;
        let train = unit_tokens(4000, d, 1);
        for (codec, bound) in [
            (Codec::F32, 1e-6),
            (Codec::F16, 2e-3),
            (Codec::Int8, 1.5e-2),
            (Codec::Pq { m: 24 }, 0.25),
        ] {
            let c = TokenCodec::train(codec, d, &train, 7).unwrap();
            let mut worst = 0f32;
            for trial in 0..40 {
                let q = unit_tokens(8, d, 100 + trial);
                let g = unit_tokens(8, d, 500 + trial);
                let exact = maxsim(&q, &g, d);
                let approx = maxsim(&q, &roundtrip(&c, &g), d);
                worst = worst.max((exact - approx).abs());
            }
            assert!(worst <= bound, "{codec:?}: score error {worst} > {bound}");
        }
    }

    /// The vectorised search picks a centroid as near as the brute-force one.
    #[test]
    fn pq_nearest_centroid_matches_brute_force() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for ds in [1, 4, 8] {
            let books: Vec<f32> = (0..PQ_CENTROIDS * ds)
                .map(|_| rng.gen_range(-1.0..1.0))
                .collect();
            let tables = PqTables::new(&books, 1, ds);
            let dist = |x: &[f32], c: usize| -> f32 {
                x.iter()
                    .zip(&books[c * ds..(c + 1) * ds])
                    .map(|(a, b)| (a - b) * (a - b))
                    .sum()
            };
            for _ in 0..500 {
                let x: Vec<f32> = (0..ds).map(|_| rng.gen_range(-1.2..1.2)).collect();
                let got = tables.nearest(0, &x);
                let best = (0..PQ_CENTROIDS)
                    .map(|c| dist(&x, c))
                    .fold(f32::INFINITY, f32::min);
                assert!(
                    dist(&x, got) <= best + 1e-5,
                    "ds {ds}: {} vs {best}",
                    dist(&x, got)
                );
            }
        }
    }

    #[test]
    fn small_rounding_matches_ties_to_even() {
        for x in [
            0.0f32, 0.4999, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5001, 126.5, -127.49, 3.7,
        ] {
            assert_eq!(round_small(x), x.round_ties_even(), "{x}");
        }
    }

    #[test]
    fn int8_uses_the_full_range_and_zero_is_safe() {
        let c = TokenCodec::train(Codec::Int8, 4, &[], 0).unwrap();
        let (mut p, mut s) = (Vec::new(), Vec::new());
        c.encode(&[0.5, -1.0, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0], &mut p, &mut s);
        assert_eq!(p[1] as i8, -127);
        assert_eq!(s[1], 1.0);
        assert_eq!(roundtrip(&c, &[0.0; 4]), vec![0.0; 4]);
    }

    #[test]
    fn pq_on_codebook_points_is_exact_and_parse_names() {
        let d = 8;
        let train = unit_tokens(600, d, 2);
        let c = TokenCodec::train(Codec::Pq { m: 4 }, d, &train, 1).unwrap();
        let point: Vec<f32> = (0..4)
            .flat_map(|s| c.codebooks[(s * PQ_CENTROIDS + 3) * 2..][..2].to_vec())
            .collect();
        assert_eq!(roundtrip(&c, &point), point);
        assert_eq!("pq96".parse::<Codec>().unwrap(), Codec::Pq { m: 96 });
        assert!("pq".parse::<Codec>().is_err());
        assert!(TokenCodec::train(Codec::Pq { m: 3 }, d, &train, 1).is_err());
    }
}
