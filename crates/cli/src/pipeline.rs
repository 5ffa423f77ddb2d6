//! The steps commands share: loading a model, extracting features with a progress bar,
//! turning a benchmark's gallery into an index, encoding queries.

use anyhow::{bail, Context, Result};
use craterdex_eval::manifest::Benchmark;
use craterdex_index::codec::{Codec, TokenCodec};
use craterdex_index::{ImageMeta, Index};
use craterdex_model::extract::{self, ExtractOptions, FeatureSet};
use craterdex_model::{fetch, Precision, ResizeMode, Vit};
use craterdex_tokens::{Descriptors, Encoder, FeatureRef, Recipe};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};

pub struct ModelArgs {
    pub model: Option<PathBuf>,
    pub size: Option<usize>,
    pub precision: Precision,
}

/// Loads `--model DIR`, or the default model (fetched on first use).
pub fn load_model(args: &ModelArgs) -> Result<Vit> {
    let dir = match &args.model {
        Some(d) => d.clone(),
        None => {
            let dir = fetch::default_model_dir();
            if !dir.join(craterdex_model::store::CONFIG_FILE).exists() {
                eprintln!("default model not found; fetching it (craterdex model fetch)");
                fetch::fetch_default(false)?;
            }
            dir
        }
    };
    craterdex_model::load(&dir, args.size)
        .with_context(|| format!("cannot load the model in {}", dir.display()))?
        .with_precision(args.precision)
}

pub fn bar(len: usize, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len as u64);
    pb.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:32}] {pos}/{len} {per_sec} ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

pub struct ExtractArgs {
    pub batch: usize,
    pub no_cache: bool,
    pub resize: ResizeMode,
}

/// Extracts features for `(id, path)` items; failures are listed on stderr, never fatal.
pub fn extract_items(
    vit: &Vit,
    items: &[(String, PathBuf)],
    a: &ExtractArgs,
    what: &str,
) -> Result<FeatureSet> {
    let opts = ExtractOptions {
        batch_size: a.batch,
        preprocess: vit.preprocess(a.resize),
        cache: (!a.no_cache).then(|| fetch::cache_dir().join("features")),
    };
    let pb = bar(items.len(), what);
    let res = extract::extract(vit, items, &opts, &|done| pb.set_position(done as u64))?;
    pb.finish();
    if res.cache_hits > 0 {
        eprintln!(
            "{what}: {} of {} images from the feature cache",
            res.cache_hits,
            items.len()
        );
    }
    if !res.failures.is_empty() {
        eprintln!(
            "{what}: {} images could not be used and were skipped:",
            res.failures.len()
        );
        for f in &res.failures {
            eprintln!("  {}: {}", f.path.display(), f.error);
        }
    }
    if res.features.is_empty() {
        bail!("{what}: no image could be read");
    }
    Ok(res.features)
}

pub fn feature_refs(f: &FeatureSet) -> Vec<FeatureRef<'_>> {
    (0..f.len())
        .map(|i| FeatureRef {
            cls: f.cls_of(i),
            patches: f.patches_of(i),
            attention: f.attention_of(i),
        })
        .collect()
}

pub fn encode_all(enc: &Encoder, f: &FeatureSet) -> Vec<Descriptors> {
    use rayon::prelude::*;
    feature_refs(f).par_iter().map(|r| enc.encode(*r)).collect()
}

/// Every image file (jpg, jpeg, png, tif, tiff, pgm) under `dir`, sorted, with its stem as id.
pub fn images_in(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("cannot list {}", d.display()))? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().and_then(|e| e.to_str()).is_some_and(|e| {
                ["jpg", "jpeg", "png", "tif", "tiff", "pgm", "ppm"]
                    .contains(&e.to_ascii_lowercase().as_str())
            }) {
                let id = p
                    .strip_prefix(dir)
                    .unwrap_or(&p)
                    .with_extension("")
                    .to_string_lossy()
                    .replace(std::path::MAIN_SEPARATOR, "/");
                out.push((id, p));
            }
        }
    }
    out.sort();
    if out.is_empty() {
        bail!("{}: no images (jpg, png, tif, pgm) found", dir.display());
    }
    Ok(out)
}

/// Lines of an image list: one path per line, relative to the list's folder; ids are the paths.
pub fn images_in_list(list: &Path) -> Result<Vec<(String, PathBuf)>> {
    let text =
        std::fs::read_to_string(list).with_context(|| format!("cannot read {}", list.display()))?;
    let base = list.parent().unwrap_or(Path::new("."));
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| (l.to_string(), base.join(l)))
        .collect())
}

pub fn gallery_items(b: &Benchmark) -> Vec<(String, PathBuf)> {
    b.manifest
        .gallery_images
        .iter()
        .enumerate()
        .map(|(i, e)| (e.image_id.clone(), b.gallery_path(i)))
        .collect()
}

pub fn query_items(b: &Benchmark) -> Vec<(String, PathBuf)> {
    b.manifest
        .query_images
        .iter()
        .enumerate()
        .map(|(i, e)| (e.image_id.clone(), b.query_path(i)))
        .collect()
}

pub struct IndexArgs {
    pub recipe: Recipe,
    pub codec: Codec,
    /// "auto", "off" or a number of IVF lists.
    pub ivf: String,
    pub nprobe: Option<usize>,
}

/// Galleries from this size up get IVF lists under `--ivf auto`.
pub const IVF_AUTO_MIN_IMAGES: usize = 100_000;

/// The IVF lists to build for `n` images, from `--ivf`.
pub fn ivf_lists(choice: &str, n: usize) -> Result<Option<usize>> {
    Ok(match choice {
        "auto" => (n >= IVF_AUTO_MIN_IMAGES).then(|| craterdex_index::ivf::default_lists(n)),
        "off" | "none" => None,
        v => match v.parse::<usize>() {
            Ok(lists) if lists >= 1 && lists <= n => Some(lists),
            _ => bail!(
                "--ivf {v:?}: use auto, off, or a number of lists between 1 and the {n} images"
            ),
        },
    })
}

/// Learns the encoder on the gallery itself (no labels), encodes and writes the index.
pub fn build_index(
    out: &Path,
    vit: &Vit,
    feats: &FeatureSet,
    metas: Vec<ImageMeta>,
    a: &IndexArgs,
) -> Result<()> {
    let refs = feature_refs(feats);
    let enc = Encoder::learn(a.recipe.clone(), &refs, 0)?;
    let pb = bar(feats.len(), "encode");
    let descs = encode_all(&enc, feats);
    pb.finish_and_clear();
    let sample: Vec<f32> = descs
        .iter()
        .take(4000)
        .flat_map(|d| d.tokens.iter().copied())
        .collect();
    let codec = TokenCodec::train(a.codec, enc.token_dim(feats.dim), &sample, 0)?;
    let ivf = match ivf_lists(&a.ivf, descs.len())? {
        Some(lists) => {
            let singles: Vec<f32> = descs
                .iter()
                .flat_map(|d| d.single.iter().copied())
                .collect();
            let ivf = craterdex_index::ivf::Ivf::train(&singles, descs[0].single.len(), lists, 0)?;
            let nprobe = a
                .nprobe
                .unwrap_or(craterdex_index::ivf::default_nprobe(lists));
            Some((ivf, nprobe))
        }
        None => None,
    };
    let images: Vec<(ImageMeta, Descriptors)> = metas.into_iter().zip(descs).collect();
    Index::create(
        out,
        &enc,
        &codec,
        Some(vit.config().fingerprint()),
        &images,
        ivf.as_ref().map(|(i, n)| (i, *n)),
    )
}

pub fn metas_from_benchmark(b: &Benchmark, feats: &FeatureSet) -> Vec<ImageMeta> {
    let by_id = craterdex_eval::manifest::positions(&b.manifest.gallery_images);
    feats
        .ids
        .iter()
        .map(|id| {
            let i = by_id[id.as_str()];
            let e = &b.manifest.gallery_images[i];
            ImageMeta {
                id: id.clone(),
                crater_id: Some(e.crater_id.clone()),
                source: Some(e.path.clone()),
                view: e.view_type.clone(),
                lat: e.lat,
                lon: e.lon,
                diameter_km: e.diameter_km,
                path: Some(b.gallery_path(i).display().to_string()),
            }
        })
        .collect()
}
