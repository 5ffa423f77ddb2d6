//! Batched feature extraction over many images, with an on-disk cache, and the features file.
//!
//! Features file (`craterdex-features/1`): a safetensors file with `cls` f32 `[N, D]`,
//! `patch_tokens` f32 or f16 `[N, T, D]`, `attention` f32 `[N, T]`, and the image ids in
//! order as a JSON list in `<file>.ids.json`. numpy reads it with `safetensors.numpy.load_file`.

use crate::error::{Error, Result};
use crate::preprocess::{self, Preprocess};
use crate::store::sha256_hex;
use crate::vit::{ImageFeatures, Vit};
use craterdex_errors::{ensure, IoContext};
use half::f16;
use rayon::prelude::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub const FEATURES_FORMAT: &str = "craterdex-features/1";
/// The dtypes a features file may hold.
pub const FEATURE_DTYPES: &[safetensors::Dtype] =
    &[safetensors::Dtype::F32, safetensors::Dtype::F16];

/// Features of many images, in the order of `ids`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FeatureSet {
    pub ids: Vec<String>,
    pub dim: usize,
    pub tokens: usize,
    /// `[N, D]`
    pub cls: Vec<f32>,
    /// `[N, T, D]`
    pub patches: Vec<f32>,
    /// `[N, T]`
    pub attention: Vec<f32>,
}

impl FeatureSet {
    pub fn len(&self) -> usize {
        self.ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
    pub fn cls_of(&self, i: usize) -> &[f32] {
        &self.cls[i * self.dim..(i + 1) * self.dim]
    }
    pub fn patches_of(&self, i: usize) -> &[f32] {
        let n = self.tokens * self.dim;
        &self.patches[i * n..(i + 1) * n]
    }
    pub fn attention_of(&self, i: usize) -> &[f32] {
        &self.attention[i * self.tokens..(i + 1) * self.tokens]
    }

    pub fn push(&mut self, id: String, f: &ImageFeatures) {
        if self.ids.is_empty() {
            self.dim = f.cls.len();
            self.tokens = f.attention.len();
        }
        self.ids.push(id);
        self.cls.extend_from_slice(&f.cls);
        self.patches.extend_from_slice(&f.patches);
        self.attention.extend_from_slice(&f.attention);
    }

    /// Appends the images of `other` (features of the same model).
    pub fn append(&mut self, other: FeatureSet) {
        if self.ids.is_empty() {
            *self = other;
            return;
        }
        self.ids.extend(other.ids);
        self.cls.extend(other.cls);
        self.patches.extend(other.patches);
        self.attention.extend(other.attention);
    }

    /// The subset at `rows`, in that order.
    pub fn select(&self, rows: &[usize]) -> FeatureSet {
        let mut out = FeatureSet {
            dim: self.dim,
            tokens: self.tokens,
            ..Default::default()
        };
        for &r in rows {
            out.ids.push(self.ids[r].clone());
            out.cls.extend_from_slice(self.cls_of(r));
            out.patches.extend_from_slice(self.patches_of(r));
            out.attention.extend_from_slice(self.attention_of(r));
        }
        out
    }

    /// Writes `path` (safetensors) and `path.ids.json`, each atomically.
    pub fn write(
        &self,
        path: &Path,
        patches_f16: bool,
        metadata: HashMap<String, String>,
    ) -> Result<()> {
        let (n, t, d) = (self.len(), self.tokens, self.dim);
        let patch_bytes: Vec<u8> = if patches_f16 {
            let h: Vec<f16> = self.patches.iter().map(|&v| f16::from_f32(v)).collect();
            bytemuck::cast_slice(&h).to_vec()
        } else {
            bytemuck::cast_slice(&self.patches).to_vec()
        };
        let pdtype = if patches_f16 {
            safetensors::Dtype::F16
        } else {
            safetensors::Dtype::F32
        };
        let views = vec![
            (
                "cls",
                safetensors::tensor::TensorView::new(
                    safetensors::Dtype::F32,
                    vec![n, d],
                    bytemuck::cast_slice(&self.cls),
                )?,
            ),
            (
                "patch_tokens",
                safetensors::tensor::TensorView::new(pdtype, vec![n, t, d], &patch_bytes)?,
            ),
            (
                "attention",
                safetensors::tensor::TensorView::new(
                    safetensors::Dtype::F32,
                    vec![n, t],
                    bytemuck::cast_slice(&self.attention),
                )?,
            ),
        ];
        let mut meta = metadata;
        meta.insert("format".into(), FEATURES_FORMAT.into());
        let bytes = safetensors::serialize(views, &Some(meta))?;
        write_atomic(path, &bytes)?;
        let ids = serde_json::to_vec(&self.ids).map_err(Error::invalid)?;
        write_atomic(&ids_path(path), &ids)?;
        Ok(())
    }

    /// Reads the tensors of a features file whose ids are not needed (test references).
    pub fn read_reference(path: &Path) -> Result<Self> {
        Self::read_tensors(path, None)
    }

    pub fn read(path: &Path) -> Result<Self> {
        let ip = ids_path(path);
        let ids: Vec<String> = serde_json::from_slice(&std::fs::read(&ip).io("read", &ip)?)
            .map_err(|e| {
                Error::Invalid(format!(
                    "{} is not a JSON list of strings: {e}",
                    ip.display()
                ))
            })?;
        Self::read_tensors(path, Some(ids))
    }

    fn read_tensors(path: &Path, ids: Option<Vec<String>>) -> Result<Self> {
        let bytes = std::fs::read(path).io("read", path)?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| {
            Error::Invalid(format!("{} is not a safetensors file: {e}", path.display()))
        })?;
        let f32s = |name: &str| -> Result<(Vec<usize>, Vec<f32>)> {
            let t = st.tensor(name).map_err(|_| {
                Error::Invalid(format!("{} has no tensor {name:?}", path.display()))
            })?;
            let data = crate::layouts::tensor_floats_of(&t, FEATURE_DTYPES).ok_or_else(|| {
                Error::Invalid(format!(
                    "{}: tensor {name} has dtype {:?}, expected F32 or F16",
                    path.display(),
                    t.dtype()
                ))
            })?;
            Ok((t.shape().to_vec(), data))
        };
        let (cs, cls) = f32s("cls")?;
        let (ps, patches) = f32s("patch_tokens")?;
        let (as_, attention) = f32s("attention")?;
        ensure!(
            cs.len() == 2 && ps.len() == 3 && as_.len() == 2,
            Error::Invalid(format!(
                "{}: tensor ranks are not [N,D], [N,T,D], [N,T]",
                path.display()
            ))
        );
        ensure!(
            cs[0] == ps[0] && ps[0] == as_[0] && cs[1] == ps[2] && ps[1] == as_[1],
            Error::Invalid(format!(
                "{}: inconsistent shapes cls {cs:?}, patch_tokens {ps:?}, attention {as_:?}",
                path.display()
            ))
        );
        let ids = ids.unwrap_or_else(|| (0..cs[0]).map(|i| i.to_string()).collect());
        ensure!(
            ids.len() == cs[0],
            Error::Invalid(format!(
                "{} lists {} ids for {} images",
                ids_path(path).display(),
                ids.len(),
                cs[0]
            ))
        );
        Ok(Self {
            ids,
            dim: cs[1],
            tokens: ps[1],
            cls,
            patches,
            attention,
        })
    }
}

pub fn ids_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".ids.json");
    PathBuf::from(s)
}

pub use craterdex_durable::write_atomic;

/// One image that could not be used, and why.
#[derive(Clone, Debug)]
pub struct Failure {
    pub id: String,
    pub path: PathBuf,
    pub error: String,
    /// The image decodes in part (truncated or corrupt): allowing partial images would use it.
    pub truncated: bool,
}

impl Failure {
    fn new(id: &str, path: &Path, error: Error) -> Self {
        Self {
            id: id.to_string(),
            path: path.to_path_buf(),
            truncated: matches!(error, Error::Truncated(_)),
            error: error.to_string(),
        }
    }
}

/// Reads and decodes the image `id` at `path` as [`extract`] does (with `allow_partial`,
/// whatever the decoders make of a truncated file), for callers that prepare images
/// themselves (turned queries); a failure says why, as [`Extraction::failures`] do.
pub fn read_image(
    id: &str,
    path: &Path,
    allow_partial: bool,
) -> std::result::Result<image::DynamicImage, Failure> {
    std::fs::read(path)
        .map_err(|e| Error::Invalid(format!("cannot read: {e}")))
        .and_then(|bytes| preprocess::decode_image_with(&bytes, allow_partial))
        .map_err(|e| Failure::new(id, path, e))
}

pub struct ExtractOptions {
    pub batch_size: usize,
    pub preprocess: Preprocess,
    /// Per-image cache directory (None disables the cache).
    pub cache: Option<PathBuf>,
    /// Use what can be decoded of truncated or corrupt images instead of skipping them.
    pub allow_partial: bool,
}

/// The result of an extraction run.
pub struct Extraction {
    pub features: FeatureSet,
    pub failures: Vec<Failure>,
    pub cache_hits: usize,
    /// `progress` asked to stop: the features are those of the batches done before.
    pub stopped: bool,
}

/// Cache layout: `<cache>/<model fingerprint>/<preprocessing hash>/<ab>/<content sha256>.safetensors`.
fn cache_path(root: &Path, model_fp: &str, prep_key: &str, content_sha: &str) -> PathBuf {
    root.join(model_fp)
        .join(&sha256_hex(prep_key.as_bytes())[..16])
        .join(&content_sha[..2])
        .join(format!("{content_sha}.safetensors"))
}

pub fn f32_view(shape: Vec<usize>, data: &[f32]) -> Result<safetensors::tensor::TensorView<'_>> {
    Ok(safetensors::tensor::TensorView::new(
        safetensors::Dtype::F32,
        shape,
        bytemuck::cast_slice(data),
    )?)
}

fn write_cached(path: &Path, f: &ImageFeatures) -> Result<()> {
    let (dim, tokens) = (f.cls.len(), f.attention.len());
    let views = vec![
        ("cls", f32_view(vec![dim], &f.cls)?),
        ("patch_tokens", f32_view(vec![tokens, dim], &f.patches)?),
        ("attention", f32_view(vec![tokens], &f.attention)?),
    ];
    Ok(write_atomic(path, &safetensors::serialize(views, &None)?)?)
}

fn read_cached(path: &Path, dim: usize, tokens: usize) -> Option<ImageFeatures> {
    let bytes = std::fs::read(path).ok()?;
    let st = safetensors::SafeTensors::deserialize(&bytes).ok()?;
    let get = |n: &str, len: usize| -> Option<Vec<f32>> {
        let v = crate::layouts::tensor_floats_of(&st.tensor(n).ok()?, &[safetensors::Dtype::F32])?;
        (v.len() == len).then_some(v)
    };
    Some(ImageFeatures {
        cls: get("cls", dim)?,
        patches: get("patch_tokens", tokens * dim)?,
        attention: get("attention", tokens)?,
    })
}

/// An image ready for the model: its tensors at each input size, each size's views in
/// order ([`preprocess::to_tensors_at_each_size`]).
pub type ImageTensors = Vec<Vec<Vec<f32>>>;

/// One set of features per image of `images`: a forward pass per input size over every
/// image's views at that size, then each image's views and sizes pooled
/// ([`ImageFeatures::of_views`]: CLS averaged, patch tokens and attention of every view at
/// the first size, then at the next, ...).
pub fn features_of_tensors(
    vit: &Vit,
    images: Vec<ImageTensors>,
    views: usize,
) -> Result<Vec<ImageFeatures>> {
    let count = images.len();
    let sizes = images.first().map_or(0, Vec::len);
    ensure!(
        images.iter().all(|im| im.len() == sizes),
        Error::Invalid("images prepared at different numbers of input sizes".into())
    );
    let mut at_size: Vec<Vec<Vec<f32>>> = vec![Vec::with_capacity(count * views); sizes];
    for image in images {
        for (all, tensors) in at_size.iter_mut().zip(image) {
            all.extend(tensors);
        }
    }
    let mut per_size = Vec::with_capacity(sizes);
    for tensors in at_size {
        let features = ImageFeatures::group_views(vit.forward(&tensors)?, views);
        ensure!(
            features.len() == count,
            Error::Invalid(format!(
                "{} images prepared with {views} views each gave {} feature sets",
                count,
                features.len()
            ))
        );
        per_size.push(features.into_iter());
    }
    if sizes == 1 {
        return Ok(per_size.pop().map(Iterator::collect).unwrap_or_default());
    }
    Ok((0..count)
        .map(|_| ImageFeatures::of_views(per_size.iter_mut().filter_map(Iterator::next).collect()))
        .collect())
}

/// [`features_of_tensors`] of decoded images, prepared as `prep` says (in parallel).
pub fn features_of_images(
    vit: &Vit,
    images: &[image::DynamicImage],
    prep: &Preprocess,
) -> Result<Vec<ImageFeatures>> {
    let tensors = images
        .par_iter()
        .map(|im| preprocess::to_tensors_at_each_size(im, prep))
        .collect();
    features_of_tensors(vit, tensors, prep.orientation.views())
}

/// Extracts features for `(id, path)` pairs. Unreadable images are skipped and reported in
/// `failures`; they never stop the run. `progress` is called with the number of images done
/// after each batch, and says whether to go on (`false`: the extraction ends there,
/// [`Extraction::stopped`]).
pub fn extract(
    vit: &Vit,
    items: &[(String, PathBuf)],
    opts: &ExtractOptions,
    progress: &(dyn Fn(usize) -> bool + Sync),
) -> Result<Extraction> {
    let model_fp = vit.features_fingerprint();
    let prep_key = opts.preprocess.key();
    let views = opts.preprocess.orientation.views();
    let (dim, tokens) = (vit.dim(), vit.patches_per_view() * views);
    let mut features = FeatureSet {
        dim,
        tokens,
        ..Default::default()
    };
    let mut failures = Vec::new();
    let mut cache_hits = 0;
    let mut done = 0;
    for chunk in items.chunks(opts.batch_size.max(1)) {
        // Read, hash, look up the cache and preprocess in parallel.
        enum Prepared {
            Cached(ImageFeatures),
            Tensor(Option<PathBuf>),
            Failed(Error),
        }
        let (prepared, tensors): (Vec<Prepared>, Vec<Option<ImageTensors>>) = chunk
            .par_iter()
            .map(|(_, path)| {
                let bytes = match std::fs::read(path) {
                    Ok(b) => b,
                    Err(e) => {
                        let error = Error::Invalid(format!("cannot read: {e}"));
                        return (Prepared::Failed(error), None);
                    }
                };
                let cpath = opts
                    .cache
                    .as_ref()
                    .map(|root| cache_path(root, &model_fp, &prep_key, &sha256_hex(&bytes)));
                if let Some(f) = cpath.as_ref().and_then(|p| read_cached(p, dim, tokens)) {
                    return (Prepared::Cached(f), None);
                }
                match preprocess::decode_image_with(&bytes, opts.allow_partial) {
                    Ok(img) => {
                        let t = preprocess::to_tensors_at_each_size(&img, &opts.preprocess);
                        (Prepared::Tensor(cpath), Some(t))
                    }
                    Err(e) => (Prepared::Failed(e), None),
                }
            })
            .unzip();
        let tensors: Vec<ImageTensors> = tensors.into_iter().flatten().collect();
        let mut computed = features_of_tensors(vit, tensors, views)?.into_iter();
        for ((id, path), p) in chunk.iter().zip(prepared) {
            match p {
                Prepared::Cached(f) => {
                    cache_hits += 1;
                    features.push(id.clone(), &f);
                }
                Prepared::Tensor(cpath) => {
                    // the forward pass returns one feature set per prepared tensor
                    let Some(f) = computed.next() else {
                        unreachable!("the forward pass returned too few images")
                    };
                    if let Some(cp) = cpath {
                        // A cache write failure only costs speed next time.
                        let _ = write_cached(&cp, &f);
                    }
                    features.push(id.clone(), &f);
                }
                Prepared::Failed(error) => failures.push(Failure::new(id, path, error)),
            }
        }
        done += chunk.len();
        if !progress(done) {
            return Ok(Extraction {
                features,
                failures,
                cache_hits,
                stopped: true,
            });
        }
    }
    Ok(Extraction {
        features,
        failures,
        cache_hits,
        stopped: false,
    })
}
