//! The recipe that turns one image's features into its searchable descriptors, and the
//! whitening learned for it. Gallery and queries go through the same [`Encoder`].

use crate::aggregate::{aggregate, Aggregation, SeedStrategy, TokenView};
use crate::descriptors::{pool, Pooling};
use crate::l2_normalize;
use crate::whitening::{Whitening, DEFAULT_REGULARISATION};
use anyhow::Result;
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
}

impl Default for Recipe {
    fn default() -> Self {
        Self {
            pooling: Pooling::Cls,
            aggregation: Aggregation::Instance {
                seeds: SeedStrategy::Fps,
                k: 32,
                soft_m: 1,
            },
            whiten: true,
            whiten_reg: DEFAULT_REGULARISATION,
            whiten_dim: None,
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
        let token_whitening = Some(Whitening::learn(
            &token_samples,
            d,
            recipe.whiten_reg,
            recipe.whiten_dim,
        )?);
        let single_whitening = Some(Whitening::learn(
            &singles,
            d,
            recipe.whiten_reg,
            recipe.whiten_dim,
        )?);
        Ok(Self {
            recipe,
            token_whitening,
            single_whitening,
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
            anyhow::ensure!(
                width.is_none_or(|d| d == w.dim_in),
                "the token and single-vector whitenings expect different feature widths"
            );
            width = Some(w.dim_in);
        }
        let k = match self.recipe.aggregation {
            Aggregation::None | Aggregation::Full => 0,
            Aggregation::Raw { k, .. } | Aggregation::KMeans { k, .. } => k,
            Aggregation::Instance { k, soft_m, .. } => k.max(soft_m),
        };
        anyhow::ensure!(k <= 4096, "the recipe asks for {k} tokens per image");
        if let Aggregation::KMeans { iterations, .. } = self.recipe.aggregation {
            anyhow::ensure!(iterations <= 1000, "k-means with {iterations} iterations");
        }
        if let Pooling::Gem { p } = self.recipe.pooling {
            anyhow::ensure!(p.is_finite() && p > 0.0, "GeM with p = {p}");
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
