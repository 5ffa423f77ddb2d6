//! How a gallery becomes an index: the descriptor recipe (pooling, aggregation, whitening),
//! the token codec and the stage-1 IVF lists. `index build`, the service, the evaluation and
//! the benchmarks all build through [`IndexRecipe`].

use crate::error::Result;
use crate::progress::Progress;
use craterdex_index::ivf::{default_lists, default_nprobe, Ivf};
use craterdex_index::{Codec, ImageMeta, Index, TokenCodec};
use craterdex_model::extract::FeatureSet;
use craterdex_tokens::{Descriptors, Encoder, FeatureRef, Recipe};
use rayon::prelude::*;
use std::path::Path;

/// Galleries from this size up get IVF lists under [`IvfSetting::Auto`].
pub const IVF_AUTO_MIN_IMAGES: usize = 100_000;
/// Images whose tokens train the codec (PQ codebooks).
const CODEC_SAMPLE_IMAGES: usize = 4000;

/// Whether stage 1 goes through IVF lists: `auto`, `off` or a number of lists.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde_with::SerializeDisplay,
    serde_with::DeserializeFromStr,
)]
pub enum IvfSetting {
    /// About 4 sqrt(n) lists from [`IVF_AUTO_MIN_IMAGES`] images up, exact below.
    #[default]
    Auto,
    Off,
    Lists(usize),
}

impl std::fmt::Display for IvfSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IvfSetting::Auto => f.write_str("auto"),
            IvfSetting::Off => f.write_str("off"),
            IvfSetting::Lists(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for IvfSetting {
    type Err = craterdex_errors::Invalid;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Ok(match s.trim() {
            "auto" => IvfSetting::Auto,
            "off" | "none" => IvfSetting::Off,
            v => match v.parse::<usize>() {
                Ok(n) if n >= 1 => IvfSetting::Lists(n),
                _ => {
                    return Err(craterdex_errors::Invalid(format!(
                        "ivf {v:?}: use auto, off, or a number of lists"
                    )))
                }
            },
        })
    }
}

/// The whole build recipe, what evaluation regimes vary too; users set
/// [`crate::RecipeOptions`], whose `Default` makes `IndexRecipe::default()`: what craterdex
/// ships.
#[derive(Clone, Debug)]
pub struct IndexRecipe {
    pub recipe: Recipe,
    pub codec: Codec,
    pub ivf: IvfSetting,
    /// IVF lists a query scans by default (`None`: 1/32 of them, at least 8).
    pub nprobe: Option<usize>,
    pub seed: u64,
}

impl Default for IndexRecipe {
    fn default() -> Self {
        crate::RecipeOptions::default()
            .recipe()
            .expect("the default options make a recipe")
    }
}

/// The views of a feature set the encoder reads.
pub fn feature_refs(f: &FeatureSet) -> Vec<FeatureRef<'_>> {
    (0..f.len())
        .map(|i| FeatureRef {
            cls: f.cls_of(i),
            patches: f.patches_of(i),
            attention: f.attention_of(i),
        })
        .collect()
}

/// Every image's descriptors under `encoder`, in parallel.
pub fn encode_all(encoder: &Encoder, f: &FeatureSet) -> Vec<Descriptors> {
    feature_refs(f)
        .par_iter()
        .map(|r| encoder.encode(*r))
        .collect()
}

impl IndexRecipe {
    /// The IVF lists to build for `n` images.
    pub fn ivf_lists(&self, n: usize) -> Result<Option<usize>> {
        Ok(match self.ivf {
            IvfSetting::Auto => (n >= IVF_AUTO_MIN_IMAGES).then(|| default_lists(n)),
            IvfSetting::Off => None,
            IvfSetting::Lists(lists) if lists <= n => Some(lists),
            IvfSetting::Lists(lists) => {
                return Err(crate::Error::Invalid(format!(
                    "ivf: {lists} lists, more than the {n} images of the gallery"
                )))
            }
        })
    }

    /// Learns the encoder's whitening (when the recipe whitens) from the images at
    /// `learn_from` (all of `feats` when `None`). `metas` (in `feats` order; may be empty)
    /// name each image's crater: two images of one crater are a matching pair for pair
    /// whitening, the only label it uses. Images that do not vary (all alike) give no
    /// whitening: the encoder then whitens nothing, and `progress` hears why.
    pub fn learn_encoder(
        &self,
        feats: &FeatureSet,
        learn_from: Option<&[usize]>,
        metas: &[ImageMeta],
        progress: &dyn Progress,
    ) -> Result<Encoder> {
        let refs = feature_refs(feats);
        let rows: Vec<usize> = match learn_from {
            Some(rows) => rows.to_vec(),
            None => (0..refs.len()).collect(),
        };
        let sample: Vec<FeatureRef> = rows.iter().map(|&r| refs[r]).collect();
        let craters: Vec<Option<&str>> = rows
            .iter()
            .map(|&r| metas.get(r).and_then(|m| m.crater_id.as_deref()))
            .collect();
        let pairs = view_pairs(&craters);
        match Encoder::learn_with_pairs(self.recipe.clone(), &sample, &pairs, self.seed) {
            Err(craterdex_tokens::Error::Degenerate(why)) => {
                progress.note(&format!("{why}: the index whitens nothing"));
                Ok(Encoder::plain(Recipe {
                    whiten: false,
                    whiten_pairs: None,
                    ..self.recipe.clone()
                }))
            }
            learned => Ok(learned?),
        }
    }

    /// Trains the codec on the tokens of the first of `sample_descs`.
    pub(crate) fn train_codec(
        &self,
        encoder: &Encoder,
        sample_descs: &[Descriptors],
        feature_dim: usize,
    ) -> Result<TokenCodec> {
        let sample: Vec<f32> = sample_descs
            .iter()
            .take(CODEC_SAMPLE_IMAGES)
            .flat_map(|d| d.tokens.iter().copied())
            .collect();
        Ok(TokenCodec::train(
            self.codec,
            encoder.token_dim(feature_dim),
            &sample,
            self.seed,
        )?)
    }

    /// The IVF lists of `descs` and the lists a query scans, when the recipe asks for them.
    fn train_ivf(&self, descs: &[Descriptors]) -> Result<Option<(Ivf, usize)>> {
        if self.ivf_lists(descs.len())?.is_none() {
            return Ok(None);
        }
        let singles: Vec<f32> = descs
            .iter()
            .flat_map(|d| d.single.iter().copied())
            .collect();
        self.train_ivf_on(&singles, descs[0].single.len())
    }

    /// The IVF lists of the `dim`-d single vectors `singles` (all of a gallery's, in
    /// order) and the lists a query scans, when the recipe asks for them.
    pub(crate) fn train_ivf_on(&self, singles: &[f32], dim: usize) -> Result<Option<(Ivf, usize)>> {
        Ok(match self.ivf_lists(singles.len() / dim.max(1))? {
            Some(lists) => {
                let ivf = Ivf::train(singles, dim, lists, self.seed)?;
                let nprobe = self.nprobe.unwrap_or(default_nprobe(lists));
                Some((ivf, nprobe))
            }
            None => None,
        })
    }

    /// Builds the index of `feats` (with `metas`, in the same order) at `dir`, replacing
    /// any index there once the new one is complete. The codec learns from the images at
    /// `learn_from` (all when `None`), as the encoder did.
    pub fn write_index(
        &self,
        dir: &Path,
        encoder: &Encoder,
        feats: &FeatureSet,
        metas: Vec<ImageMeta>,
        model: Option<String>,
        learn_from: Option<&[usize]>,
        progress: &dyn Progress,
    ) -> Result<()> {
        progress.start("encode", feats.len());
        let descs = encode_all(encoder, feats);
        progress.finish();
        let codec = match learn_from {
            Some(rows) => {
                let sample: Vec<Descriptors> = rows.iter().map(|&r| descs[r].clone()).collect();
                self.train_codec(encoder, &sample, feats.dim)?
            }
            None => self.train_codec(encoder, &descs, feats.dim)?,
        };
        let ivf = self.train_ivf(&descs)?;
        let images: Vec<(ImageMeta, Descriptors)> = metas.into_iter().zip(descs).collect();
        Ok(Index::create(
            dir,
            encoder,
            &codec,
            model,
            &images,
            ivf.as_ref().map(|(i, n)| (i, *n)),
        )?)
    }

    /// The same index as [`IndexRecipe::write_index`], held in memory.
    pub fn index_in_memory(
        &self,
        encoder: &Encoder,
        feats: &FeatureSet,
        metas: Vec<ImageMeta>,
        model: Option<String>,
    ) -> Result<Index> {
        let descs = encode_all(encoder, feats);
        self.index_from_descriptors(encoder, feats.dim, descs, metas, model)
    }

    /// An index in memory from descriptors `encoder` already made of features of width
    /// `feature_dim` (several codecs can then share one encoding of a gallery).
    pub fn index_from_descriptors(
        &self,
        encoder: &Encoder,
        feature_dim: usize,
        descs: Vec<Descriptors>,
        metas: Vec<ImageMeta>,
        model: Option<String>,
    ) -> Result<Index> {
        let codec = self.train_codec(encoder, &descs, feature_dim)?;
        let ivf = self.train_ivf(&descs)?;
        let images: Vec<(ImageMeta, Descriptors)> = metas.into_iter().zip(descs).collect();
        Ok(Index::in_memory(
            encoder,
            &codec,
            model,
            &images,
            ivf.as_ref().map(|(i, n)| (i, *n)),
        )?)
    }
}

/// Pairs of positions whose images show one crater (consecutive views of each crater, in
/// order); images without a crater id pair with nothing.
pub fn view_pairs(craters: &[Option<&str>]) -> Vec<(usize, usize)> {
    let mut last: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut pairs = Vec::new();
    for (i, c) in craters.iter().enumerate() {
        if let Some(c) = c.filter(|c| !c.is_empty()) {
            if let Some(prev) = last.insert(c, i) {
                pairs.push((prev, i));
            }
        }
    }
    pairs
}
