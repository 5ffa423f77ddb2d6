//! The recipe that turns one image's features into its searchable descriptors, and the
//! whitening learned for it. Gallery and queries go through the same [`Encoder`].

use crate::aggregate::{aggregate, argmax, Aggregation, SeedStrategy, TokenView};
use crate::descriptors::{pool, Pooling};
use crate::error::{Error, Result};
use crate::l2_normalize;
use crate::whitening::{Whitening, DEFAULT_REGULARISATION};
use craterdex_errors::ensure;
use rand::{seq::index::sample, SeedableRng};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Recipe {
    pub pooling: Pooling,
    pub aggregation: Aggregation,
    /// Whiten tokens (before seed selection) and single vectors.
    pub whiten: bool,
    pub whiten_reg: f32,
    pub whiten_dim: Option<usize>,
    /// Learn the whitening from matching pairs (two views of one crater) blended with PCA
    /// by this weight ([`Whitening::learn_from_pairs`]) when the sample has such pairs; PCA
    /// whitening otherwise (`None`: always).
    #[serde(default)]
    pub whiten_pairs: Option<f32>,
}

/// The shipped recipe's stage-1 vector, instance-token seeds and tokens per image: the
/// defaults of [`Recipe`] and of the engine's `RecipeOptions` alike.
pub const SHIPPED_POOLING: Pooling = Pooling::Cls;
pub const SHIPPED_SEEDS: SeedStrategy = SeedStrategy::Fps;
pub const SHIPPED_K: usize = 32;

/// The blend of pair and total covariance the default recipe learns with: measured on the
/// Mars and NAC benchmarks (scripts/pair_whitening.py; 0.5 and 0.65 within 0.002 mAP).
pub const DEFAULT_PAIR_BLEND: f32 = 0.65;

impl Default for Recipe {
    fn default() -> Self {
        Self {
            pooling: SHIPPED_POOLING,
            aggregation: Aggregation::Instance {
                seeds: SHIPPED_SEEDS,
                k: SHIPPED_K,
                soft_m: 1,
            },
            whiten: true,
            whiten_reg: DEFAULT_REGULARISATION,
            whiten_dim: None,
            whiten_pairs: Some(DEFAULT_PAIR_BLEND),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Encoder {
    pub recipe: Recipe,
    pub token_whitening: Option<Whitening>,
    pub single_whitening: Option<Whitening>,
}

/// What is searched for one image: a single vector and `[K, D]` tokens, all unit length.
#[derive(Clone, Debug, PartialEq)]
pub struct Descriptors {
    pub single: Vec<f32>,
    pub tokens: Vec<f32>,
}

/// Raw features of one image, however they were made.
#[derive(Clone, Copy)]
pub struct FeatureRef<'a> {
    pub cls: &'a [f32],
    pub patches: &'a [f32],
    pub attention: &'a [f32],
}

/// Unit-normalised patch tokens and their norms before normalisation.
pub fn normalised_tokens(patches: &[f32], d: usize) -> (Vec<f32>, Vec<f32>) {
    let mut t = patches.to_vec();
    let norms = t
        .chunks_mut(d)
        .map(|r| {
            let n = r.iter().map(|x| x * x).sum::<f32>().sqrt();
            l2_normalize(r);
            n
        })
        .collect();
    (t, norms)
}

/// The differences of matching token pairs (mutual nearest unit tokens of the two views of
/// each pair) and of the pairs' single vectors (`singles`: one row of `d` per image).
fn pair_differences(
    images: &[FeatureRef],
    pairs: &[(usize, usize)],
    singles: &[f32],
    d: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut tokens = Vec::new();
    let mut single = Vec::new();
    for &(a, b) in pairs {
        let (ta, _) = normalised_tokens(images[a].patches, d);
        let (tb, _) = normalised_tokens(images[b].patches, d);
        for (i, j) in mutual_nearest(&ta, &tb, d) {
            let (x, y) = (&ta[i * d..(i + 1) * d], &tb[j * d..(j + 1) * d]);
            tokens.extend(x.iter().zip(y).map(|(x, y)| x - y));
        }
        let (x, y) = (&singles[a * d..(a + 1) * d], &singles[b * d..(b + 1) * d]);
        single.extend(x.iter().zip(y).map(|(x, y)| x - y));
    }
    (tokens, single)
}

/// Pairs `(i, j)` of rows of `a` and `b` (unit rows of `d`) that are each other's most
/// similar.
pub(crate) fn mutual_nearest(a: &[f32], b: &[f32], d: usize) -> Vec<(usize, usize)> {
    let (na, nb) = (a.len() / d, b.len() / d);
    if na == 0 || nb == 0 {
        return Vec::new();
    }
    let mut sims = vec![0f32; na * nb];
    let packed = craterdex_kernels::gemm::PackedF32::from_columns(b, nb, d, d);
    craterdex_kernels::gemm::matmul_f32(a, na, d, &packed, &mut sims, nb, false);
    let best_b: Vec<usize> = sims.chunks(nb).map(argmax).collect();
    // the best row of every column, in one pass over the rows (first best kept, as argmax)
    let mut best_a = vec![0usize; nb];
    for (i, row) in sims.chunks(nb).enumerate() {
        for (j, &s) in row.iter().enumerate() {
            if s > sims[best_a[j] * nb + j] {
                best_a[j] = i;
            }
        }
    }
    best_b
        .iter()
        .enumerate()
        .filter(|&(i, &j)| best_a[j] == i)
        .map(|(i, &j)| (i, j))
        .collect()
}

/// How many tokens per image and images at most feed the whitening estimate.
pub const WHITEN_TOKENS_PER_IMAGE: usize = 16;
pub const WHITEN_MAX_SAMPLES: usize = 100_000;

impl Encoder {
    /// An encoder without whitening.
    pub fn plain(recipe: Recipe) -> Self {
        Self {
            recipe,
            token_whitening: None,
            single_whitening: None,
        }
    }

    /// Learns the whitening of `recipe` (when on) from unlabelled gallery features.
    pub fn learn(recipe: Recipe, sample_images: &[FeatureRef], seed: u64) -> Result<Self> {
        Self::learn_with_pairs(recipe, sample_images, &[], seed)
    }

    /// [`Encoder::learn`], and where the recipe asks for pair whitening and `pairs` (of
    /// positions in `sample_images`, two views of one crater each) are given, whitening
    /// learned from them: token pairs are the mutual nearest tokens of the two views, single
    /// vector pairs the two views' single vectors.
    pub fn learn_with_pairs(
        recipe: Recipe,
        sample_images: &[FeatureRef],
        pairs: &[(usize, usize)],
        seed: u64,
    ) -> Result<Self> {
        if !recipe.whiten || sample_images.is_empty() {
            return Ok(Self::plain(recipe));
        }
        let d = sample_images[0].cls.len();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let per_image =
            WHITEN_TOKENS_PER_IMAGE.min(WHITEN_MAX_SAMPLES.div_ceil(sample_images.len()).max(1));
        let mut token_samples = Vec::new();
        let mut singles = Vec::new();
        for f in sample_images {
            let (t, _) = normalised_tokens(f.patches, d);
            let n = t.len() / d;
            for i in sample(&mut rng, n, per_image.min(n)) {
                token_samples.extend_from_slice(&t[i * d..(i + 1) * d]);
            }
            singles.extend(pool(f.cls, f.patches, d, recipe.pooling));
        }
        let learn = |samples: &[f32], differences: &[f32]| match recipe.whiten_pairs {
            Some(alpha) if differences.len() >= 2 * d => Whitening::learn_from_pairs(
                samples,
                differences,
                d,
                recipe.whiten_reg,
                alpha,
                recipe.whiten_dim,
            ),
            _ => Whitening::learn(samples, d, recipe.whiten_reg, recipe.whiten_dim),
        };
        let (token_differences, single_differences) = match recipe.whiten_pairs {
            Some(_) => pair_differences(sample_images, pairs, &singles, d),
            None => (Vec::new(), Vec::new()),
        };
        Ok(Self {
            token_whitening: Some(learn(&token_samples, &token_differences)?),
            single_whitening: Some(learn(&singles, &single_differences)?),
            recipe,
        })
    }

    /// Checks an encoder read from a file: whitening parameters consistent, token and single
    /// whitening on one feature width, and the recipe's sizes sane. Returns the feature width
    /// the encoder expects, when its whitening fixes one.
    pub fn validate(&self) -> Result<Option<usize>> {
        let mut width = None;
        for w in [&self.token_whitening, &self.single_whitening]
            .into_iter()
            .flatten()
        {
            w.validate()?;
            ensure!(
                width.is_none_or(|d| d == w.dim_in),
                Error::Invalid(
                    "the token and single-vector whitenings expect different feature widths"
                        .to_string()
                )
            );
            width = Some(w.dim_in);
        }
        let k = match self.recipe.aggregation {
            Aggregation::None | Aggregation::Full => 0,
            Aggregation::Raw { k, .. } | Aggregation::KMeans { k, .. } => k,
            Aggregation::Instance { k, soft_m, .. } => k.max(soft_m),
        };
        ensure!(
            k <= 4096,
            Error::Invalid(format!("the recipe asks for {k} tokens per image"))
        );
        if let Aggregation::KMeans { iterations, .. } = self.recipe.aggregation {
            ensure!(
                iterations <= 1000,
                Error::Invalid(format!("k-means with {iterations} iterations"))
            );
        }
        if let Pooling::Gem { p } = self.recipe.pooling {
            ensure!(
                p.is_finite() && p > 0.0,
                Error::Invalid(format!("GeM with p = {p}"))
            );
        }
        Ok(width)
    }

    pub fn token_dim(&self, d: usize) -> usize {
        self.token_whitening.as_ref().map_or(d, |w| w.dim_out)
    }
    pub fn single_dim(&self, d: usize) -> usize {
        self.single_whitening.as_ref().map_or(d, |w| w.dim_out)
    }

    /// The single vector of an image.
    pub fn single(&self, f: FeatureRef) -> Vec<f32> {
        let d = f.cls.len();
        let s = pool(f.cls, f.patches, d, self.recipe.pooling);
        match &self.single_whitening {
            Some(w) => w.apply(&s),
            None => s,
        }
    }

    /// The (whitened) unit-normalised tokens before aggregation, and their raw norms.
    pub fn prepared_tokens(&self, f: FeatureRef) -> (Vec<f32>, Vec<f32>) {
        let d = f.cls.len();
        let (t, norms) = normalised_tokens(f.patches, d);
        let t = match &self.token_whitening {
            Some(w) => w.apply_rows(&t),
            None => t,
        };
        (t, norms)
    }

    /// This encoder (same whitening) with another aggregation.
    pub fn with_aggregation(&self, aggregation: Aggregation) -> Self {
        let mut e = self.clone();
        e.recipe.aggregation = aggregation;
        e
    }

    /// Tokens of an image under an aggregation (the recipe's unless overridden).
    pub fn tokens_with(&self, f: FeatureRef, how: Aggregation) -> Vec<f32> {
        if how == Aggregation::None {
            return Vec::new();
        }
        let (t, norms) = self.prepared_tokens(f);
        let dim = self.token_dim(f.cls.len());
        aggregate(
            &TokenView {
                tokens: &t,
                dim,
                attention: f.attention,
                norms: &norms,
            },
            how,
        )
    }

    pub fn encode(&self, f: FeatureRef) -> Descriptors {
        Descriptors {
            single: self.single(f),
            tokens: self.tokens_with(f, self.recipe.aggregation),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feats(seed: u64, t: usize, d: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        use rand::Rng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let cls = (0..d).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let p = (0..t * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let a = (0..t).map(|_| rng.gen_range(0.0..1.0)).collect();
        (cls, p, a)
    }

    #[test]
    fn encoding_is_deterministic_and_unit_length() {
        let data: Vec<_> = (0..30).map(|s| feats(s, 16, 8)).collect();
        let refs: Vec<FeatureRef> = data
            .iter()
            .map(|(c, p, a)| FeatureRef {
                cls: c,
                patches: p,
                attention: a,
            })
            .collect();
        let recipe = Recipe {
            aggregation: Aggregation::Instance {
                seeds: SeedStrategy::Fps,
                k: 4,
                soft_m: 1,
            },
            ..Default::default()
        };
        let e1 = Encoder::learn(recipe.clone(), &refs, 3).unwrap();
        let e2 = Encoder::learn(recipe, &refs, 3).unwrap();
        assert_eq!(e1, e2);
        let d = e1.encode(refs[0]);
        assert_eq!(d, e2.encode(refs[0]));
        assert_eq!(d.tokens.len(), 4 * 8);
        for v in d.tokens.chunks(8).chain(std::iter::once(&d.single[..])) {
            assert!((v.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-4);
        }
    }

    #[test]
    fn whitening_off_means_no_parameters() {
        let (c, p, a) = feats(1, 16, 8);
        let r = [FeatureRef {
            cls: &c,
            patches: &p,
            attention: &a,
        }];
        let e = Encoder::learn(
            Recipe {
                whiten: false,
                ..Default::default()
            },
            &r,
            0,
        )
        .unwrap();
        assert!(e.token_whitening.is_none() && e.single_whitening.is_none());
    }
}
