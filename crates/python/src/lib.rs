//! craterdex-python: the native module of the `craterdex` Python package (PyO3, abi3).
//!
//! Owns: turning Python values into the engine's inputs (paths, numpy images and feature
//! arrays, metadata as JSON records) and results into numpy arrays and JSON records that
//! the pure-Python layer (`python/craterdex`) turns into pandas DataFrames. Every job
//! goes through craterdex-engine, -eval and -workflows, exactly as the CLI's do; this crate
//! must not wire model, tokens and index itself. The GIL is released during model and
//! search work. Errors become the `craterdex.errors` class of their kind (all subclasses of
//! `CraterdexError`) with the library's message.

use craterdex_engine::inputs::metas_in_order;
use craterdex_engine::{
    learn_rows, BuildPlan, Codec, Engine, ExtractSettings, Extractor, FeatureSet, ImageMeta,
    IndexRecipe, IvfSetting, Mode, ModelSpec, Orientation, Pooling, Precision, ResizeMode,
    SearchParams, SeedStrategy, Silent,
};
use craterdex_errors::{ErrorKind, HasKind};
use craterdex_workflows::{DedupOptions, LinkOptions, LinkRule};
use numpy::{
    IntoPyArray, PyArrayMethods, PyReadonlyArray2, PyReadonlyArray3, PyReadonlyArrayDyn,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

/// A failure on its way to Python: its kind (none for failures outside the library's kinds)
/// and the library's message.
struct Failure {
    kind: Option<ErrorKind>,
    message: String,
}

/// JSON of craterdex's own results (serialising them does not fail in practice).
fn to_json(v: &impl serde::Serialize) -> Fallible<String> {
    serde_json::to_string(v).map_err(|e| invalid(format!("JSON: {e}")))
}

impl<E: HasKind + std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure {
            kind: Some(e.kind()),
            message: e.to_string(),
        }
    }
}

/// Image work on an index opened without a model, with the Python remedy.
fn no_model(what: &str) -> Failure {
    Failure {
        kind: Some(ErrorKind::Unsupported),
        message: format!("no model is loaded: {what} needs one (Index.open(path, model=...))"),
    }
}

/// Input from Python that cannot be used.
fn invalid(message: impl Into<String>) -> Failure {
    Failure {
        kind: Some(ErrorKind::InvalidInput),
        message: message.into(),
    }
}

/// The exception class of each kind in `craterdex.errors`, `CraterdexError` for none.
impl From<Failure> for PyErr {
    fn from(f: Failure) -> PyErr {
        Python::attach(|py| {
            let class = py.import("craterdex.errors").and_then(|m| {
                let name = f.kind.map_or("CraterdexError", exception_class);
                m.getattr(name)
            });
            match class.and_then(|c| c.call1((f.message,))) {
                Ok(exception) => PyErr::from_value(exception),
                Err(e) => e,
            }
        })
    }
}

fn exception_class(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidInput => "InvalidInputError",
        ErrorKind::NotFound => "NotFoundError",
        ErrorKind::Conflict => "ConflictError",
        ErrorKind::Corrupt => "CorruptDataError",
        ErrorKind::Unsupported => "UnsupportedError",
        ErrorKind::Io => "CraterdexIOError",
    }
}

type Fallible<T> = Result<T, Failure>;

trait OrPy<T> {
    fn py_err(self) -> PyResult<T>;
}
impl<T, E: Into<Failure>> OrPy<T> for Result<T, E> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(|e| e.into().into())
    }
}

fn parse<T: std::str::FromStr>(what: &str, v: &str) -> PyResult<T>
where
    T::Err: std::fmt::Display,
{
    v.parse::<T>()
        .map_err(|e| invalid(format!("{what} {v:?}: {e}")).into())
}

/// Metadata records from JSON (`[{"id": ..., "lat": ...}, ...]`).
fn metas_from_json(json: &str) -> PyResult<Vec<ImageMeta>> {
    serde_json::from_str(json)
        .map_err(|e| invalid(format!("metadata records: {e}")))
        .py_err()
}

/// `(id, path)` items of metadata records that name their image file.
fn items_of(metas: &[ImageMeta]) -> PyResult<Vec<(String, PathBuf)>> {
    metas
        .iter()
        .map(|m| match &m.path {
            Some(p) => Ok((m.id.clone(), PathBuf::from(p))),
            None => Err(PyErr::from(invalid(format!(
                "entry {:?} has no path: give a `path` column or features",
                m.id
            )))),
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Model

/// A loaded backbone (see `craterdex.Model`).
#[pyclass(name = "Model", module = "craterdex._native", frozen)]
struct PyModel {
    extractor: Arc<Extractor>,
}

fn to_numpy_features<'py>(py: Python<'py>, f: FeatureSet) -> PyResult<Bound<'py, PyDict>> {
    let (n, t, d) = (f.len(), f.tokens, f.dim);
    let out = PyDict::new(py);
    out.set_item("ids", f.ids)?;
    // the vectors move into numpy (no copy); reshape gives views
    out.set_item("cls", f.cls.into_pyarray(py).reshape([n, d])?)?;
    out.set_item("patches", f.patches.into_pyarray(py).reshape([n, t, d])?)?;
    out.set_item("attention", f.attention.into_pyarray(py).reshape([n, t])?)?;
    Ok(out)
}

/// A uint8 or uint16 array `[H, W]` or `[H, W, 3]` as an image.
fn array_image(a: &Bound<'_, PyAny>, i: usize) -> PyResult<image::DynamicImage> {
    let bad = |why: String| PyErr::from(invalid(format!("image {i}: {why}")));
    if let Ok(a) = a.extract::<PyReadonlyArrayDyn<u8>>() {
        let shape = a.shape().to_vec();
        let data = a
            .as_slice()
            .map(<[u8]>::to_vec)
            .unwrap_or_else(|_| a.as_array().iter().copied().collect());
        return match shape[..] {
            [h, w] => image::GrayImage::from_raw(w as u32, h as u32, data)
                .map(image::DynamicImage::ImageLuma8),
            [h, w, 3] => image::RgbImage::from_raw(w as u32, h as u32, data)
                .map(image::DynamicImage::ImageRgb8),
            _ => None,
        }
        .ok_or_else(|| bad(format!("shape {shape:?}: give [H, W] or [H, W, 3]")));
    }
    if let Ok(a) = a.extract::<PyReadonlyArrayDyn<u16>>() {
        let shape = a.shape().to_vec();
        let data: Vec<u16> = a.as_array().iter().copied().collect();
        return match shape[..] {
            [h, w] => image::ImageBuffer::from_raw(w as u32, h as u32, data)
                .map(image::DynamicImage::ImageLuma16),
            _ => None,
        }
        .ok_or_else(|| bad(format!("uint16 shape {shape:?}: give [H, W]")));
    }
    Err(bad("not a uint8 or uint16 numpy array".into()))
}

fn check_image_size(im: &image::DynamicImage, i: usize) -> PyResult<()> {
    use craterdex_model::preprocess::{check_crop_size, MAX_CROP_PIXELS};
    check_crop_size(im.width(), im.height(), MAX_CROP_PIXELS)
        .map_err(|e| invalid(format!("image {i}: {e}")))
        .py_err()
}

impl PyModel {
    fn features(
        &self,
        py: Python<'_>,
        ids: Vec<String>,
        images: Option<Vec<Bound<'_, PyAny>>>,
        paths: Option<Vec<PathBuf>>,
    ) -> PyResult<FeatureSet> {
        let x = self.extractor.clone();
        match (images, paths) {
            (Some(arrays), None) => {
                ensure_len(ids.len(), arrays.len())?;
                let images = arrays
                    .iter()
                    .enumerate()
                    .map(|(i, a)| {
                        let im = array_image(a, i)?;
                        check_image_size(&im, i)?;
                        Ok(im)
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                py.detach(move || x.features_of_images(&ids, &images))
                    .py_err()
            }
            (None, Some(paths)) => {
                ensure_len(ids.len(), paths.len())?;
                let items: Vec<(String, PathBuf)> = ids.into_iter().zip(paths).collect();
                py.detach(move || x.extract(&items, "images", &Silent))
                    .py_err()
            }
            _ => Err(PyErr::from(invalid("give images (numpy arrays) or paths"))),
        }
    }
}

fn ensure_len(ids: usize, images: usize) -> PyResult<()> {
    if ids != images {
        return Err(PyErr::from(invalid(format!(
            "{ids} ids for {images} images"
        ))));
    }
    Ok(())
}

#[pymethods]
impl PyModel {
    #[staticmethod]
    #[pyo3(signature = (path=None, size=None, precision="f32", resize="squash", orient="as-is", batch=16, cache=true))]
    #[allow(clippy::too_many_arguments)]
    fn load(
        py: Python<'_>,
        path: Option<PathBuf>,
        size: Option<usize>,
        precision: &str,
        resize: &str,
        orient: &str,
        batch: usize,
        cache: bool,
    ) -> PyResult<Self> {
        let spec = ModelSpec {
            dir: path,
            size,
            precision: parse::<Precision>("precision", precision)?,
            resize: parse::<ResizeMode>("resize", resize)?,
            orientation: parse::<Orientation>("orient", orient)?,
        };
        let settings = ExtractSettings {
            batch: batch.max(1),
            cache,
            allow_partial: false,
        };
        let x = py
            .detach(move || Extractor::load(&spec, settings, &Silent))
            .py_err()?;
        Ok(Self {
            extractor: Arc::new(x),
        })
    }

    #[staticmethod]
    #[pyo3(signature = (path, name))]
    fn import_file(py: Python<'_>, path: PathBuf, name: String) -> PyResult<String> {
        py.detach(move || {
            craterdex_model::import::import_file(&path, &name, &craterdex_fetch::models_dir())
        })
        .map(|(dir, _)| dir.display().to_string())
        .py_err()
    }

    #[getter]
    fn dim(&self) -> usize {
        self.extractor.dim()
    }

    #[getter]
    fn fingerprint(&self) -> String {
        self.extractor.fingerprint()
    }

    #[pyo3(signature = (ids, images=None, paths=None))]
    fn extract<'py>(
        &self,
        py: Python<'py>,
        ids: Vec<String>,
        images: Option<Vec<Bound<'py, PyAny>>>,
        paths: Option<Vec<PathBuf>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let f = self.features(py, ids, images, paths)?;
        to_numpy_features(py, f)
    }
}

/// Features handed over from Python: ids, `cls` `[N, D]`, `patches` `[N, T, D]`,
/// `attention` `[N, T]`.
type NamedFeatures<'py> = (
    Vec<String>,
    PyReadonlyArray2<'py, f32>,
    PyReadonlyArray3<'py, f32>,
    PyReadonlyArray2<'py, f32>,
);
/// The same arrays for queries named by a separate list of ids.
type FeatureArrays<'py> = (
    PyReadonlyArray2<'py, f32>,
    PyReadonlyArray3<'py, f32>,
    PyReadonlyArray2<'py, f32>,
);

/// Features handed over as numpy arrays (a dict of `ids`, `cls`, `patches`, `attention`).
fn features_from_numpy(
    ids: Vec<String>,
    cls: PyReadonlyArray2<f32>,
    patches: PyReadonlyArray3<f32>,
    attention: PyReadonlyArray2<f32>,
) -> PyResult<FeatureSet> {
    let (n, d) = (cls.shape()[0], cls.shape()[1]);
    let t = patches.shape()[1];
    if ids.len() != n || patches.shape() != [n, t, d] || attention.shape() != [n, t] {
        return Err(PyErr::from(invalid(format!(
            "features: {} ids, cls {:?}, patches {:?}, attention {:?}: give [N, D], [N, T, D], [N, T]",
            ids.len(),
            cls.shape(),
            patches.shape(),
            attention.shape()
        ))));
    }
    let v = |a: &numpy::ndarray::ArrayViewD<'_, f32>| a.iter().copied().collect::<Vec<f32>>();
    Ok(FeatureSet {
        ids,
        dim: d,
        tokens: t,
        cls: v(&cls.as_array().into_dyn()),
        patches: v(&patches.as_array().into_dyn()),
        attention: v(&attention.as_array().into_dyn()),
    })
}

// ---------------------------------------------------------------------------------------
// Index

/// An index and, optionally, the model that makes its image queries (see `craterdex.Index`).
#[pyclass(name = "Index", module = "craterdex._native", frozen)]
struct PyIndex {
    dir: PathBuf,
    engine: RwLock<Engine>,
}

/// The build recipe's options (`craterdex.Recipe`), as JSON; missing ones take the
/// shipped defaults.
#[derive(serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RecipeArgs {
    codec: String,
    k: usize,
    seeds: String,
    pooling: String,
    whiten: bool,
    pca_whitening: bool,
    ivf: String,
    nprobe: Option<usize>,
    seed: u64,
}

impl Default for RecipeArgs {
    fn default() -> Self {
        RecipeArgs {
            codec: "int8".into(),
            k: 32,
            seeds: "fps".into(),
            pooling: "cls".into(),
            whiten: true,
            pca_whitening: false,
            ivf: "auto".into(),
            nprobe: None,
            seed: 0,
        }
    }
}

fn recipe_from_json(json: &str) -> PyResult<IndexRecipe> {
    let a: RecipeArgs = serde_json::from_str(json)
        .map_err(|e| invalid(format!("recipe: {e}")))
        .py_err()?;
    let mut r = IndexRecipe {
        codec: parse::<Codec>("codec", &a.codec)?,
        ivf: parse::<IvfSetting>("ivf", &a.ivf)?,
        nprobe: a.nprobe,
        seed: a.seed,
        ..Default::default()
    };
    r.recipe.pooling = parse::<Pooling>("pooling", &a.pooling)?;
    r.recipe.whiten = a.whiten;
    if a.pca_whitening {
        r.recipe.whiten_pairs = None;
    }
    r.recipe.aggregation = craterdex_engine::Aggregation::Instance {
        seeds: parse::<SeedStrategy>("seeds", &a.seeds)?,
        k: a.k,
        soft_m: 1,
    };
    Ok(r)
}

fn search_params(
    top_k: usize,
    mode: &str,
    shortlist: usize,
    nprobe: Option<usize>,
    group_views: bool,
) -> PyResult<SearchParams> {
    Ok(SearchParams {
        top_k: top_k.max(1),
        shortlist: shortlist.max(1),
        mode: parse::<Mode>("mode", mode)?,
        stage1: craterdex_engine::Stage1::from_nprobe(nprobe),
        group_views,
    })
}

impl PyIndex {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Engine> {
        self.engine.read().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl PyIndex {
    /// Builds an index at `out` from `meta_json` records (with `path`, or with `features`).
    #[staticmethod]
    #[pyo3(signature = (out, meta_json, model=None, features=None, recipe_json="{}"))]
    fn build(
        py: Python<'_>,
        out: PathBuf,
        meta_json: &str,
        model: Option<&PyModel>,
        features: Option<NamedFeatures<'_>>,
        recipe_json: &str,
    ) -> PyResult<Self> {
        let recipe = recipe_from_json(recipe_json)?;
        let metas = metas_from_json(meta_json)?;
        let ids: Vec<String> = metas.iter().map(|m| m.id.clone()).collect();
        let feats = match features {
            Some((fids, cls, patches, attention)) => {
                features_from_numpy(fids, cls, patches, attention)?
            }
            None => {
                let m = model.ok_or_else(|| {
                    PyErr::from(invalid("give a model to read the images, or features"))
                })?;
                let items = items_of(&metas)?;
                let x = m.extractor.clone();
                py.detach(move || x.extract(&items, "images", &Silent))
                    .py_err()?
            }
        };
        let fingerprint = model.map(|m| m.extractor.fingerprint());
        let extractor = model.map(|m| m.extractor.clone());
        let out2 = out.clone();
        let engine = py
            .detach(move || -> Fallible<Engine> {
                let metas = metas_in_order(metas.iter().cloned(), &feats.ids)?;
                let learn = learn_rows(&ids, &feats.ids, recipe.seed);
                let encoder = recipe.learn_encoder(&feats, learn.as_deref(), &metas)?;
                recipe.write_index(
                    &out2,
                    &encoder,
                    &feats,
                    metas,
                    fingerprint,
                    learn.as_deref(),
                    &Silent,
                )?;
                Ok(Engine::open(&out2, extractor)?)
            })
            .py_err()?;
        Ok(Self {
            dir: out,
            engine: RwLock::new(engine),
        })
    }

    #[staticmethod]
    #[pyo3(signature = (path, model=None))]
    fn open(py: Python<'_>, path: PathBuf, model: Option<&PyModel>) -> PyResult<Self> {
        let x = model.map(|m| m.extractor.clone());
        let p = path.clone();
        let engine = py.detach(move || Engine::open(&p, x)).py_err()?;
        Ok(Self {
            dir: path,
            engine: RwLock::new(engine),
        })
    }

    #[getter]
    fn path(&self) -> String {
        self.dir.display().to_string()
    }

    fn __len__(&self) -> usize {
        self.read().index().live()
    }

    /// What the index holds, as JSON.
    fn info_json(&self) -> PyResult<String> {
        let e = self.read();
        let idx = e.index();
        Ok(serde_json::json!({
            "images": idx.live(), "removed": idx.rows() - idx.live(), "segments": idx.segment_count(),
            "model": idx.model(), "codec": idx.codec.codec.name(), "tokens_per_image": idx.tokens_per_image(),
            "token_dim": idx.token_dim(), "single_dim": idx.single_dim(), "token_bytes_per_image": idx.token_bytes_per_image(),
            "ivf_lists": idx.ivf().map(|(ivf, _)| ivf.lists()),
        })
        .to_string())
    }

    /// Every live image's metadata, as JSON records.
    fn metadata_json(&self) -> PyResult<String> {
        let e = self.read();
        let idx = e.index();
        let metas: Vec<&ImageMeta> = idx.live_rows().map(|r| idx.meta(r)).collect();
        serde_json::to_string(&metas).map_err(|e| PyErr::from(invalid(format!("JSON: {e}"))))
    }

    /// The stored descriptors of indexed images: single vectors `[N, Ds]` and decoded
    /// instance tokens `[N, K, Dt]`.
    fn descriptors<'py>(&self, py: Python<'py>, ids: Vec<String>) -> PyResult<Bound<'py, PyDict>> {
        let e = self.read();
        let idx = e.index();
        let (k, dt, ds) = (idx.tokens_per_image(), idx.token_dim(), idx.single_dim());
        let mut single = Vec::with_capacity(ids.len() * ds);
        let mut tokens = vec![0f32; ids.len() * k * dt];
        for (i, id) in ids.iter().enumerate() {
            let row = idx
                .row_of(id)
                .ok_or_else(|| PyErr::from(invalid(format!("no image {id:?} in the index"))))?;
            single.extend_from_slice(idx.single_of(row));
            idx.decode_tokens_into(row, &mut tokens[i * k * dt..(i + 1) * k * dt]);
        }
        let out = PyDict::new(py);
        out.set_item("single", single.into_pyarray(py).reshape([ids.len(), ds])?)?;
        out.set_item(
            "tokens",
            tokens.into_pyarray(py).reshape([ids.len(), k, dt])?,
        )?;
        Ok(out)
    }

    /// Searches with images (numpy arrays or paths) or features; results as JSON
    /// (`[{"query": ..., "results": [hit, ...]}, ...]`).
    #[pyo3(signature = (ids, images=None, paths=None, features=None, top_k=10, mode="two-stage", shortlist=100, nprobe=None, group_views=true))]
    #[allow(clippy::too_many_arguments)]
    fn search_json(
        &self,
        py: Python<'_>,
        ids: Vec<String>,
        images: Option<Vec<Bound<'_, PyAny>>>,
        paths: Option<Vec<PathBuf>>,
        features: Option<FeatureArrays<'_>>,
        top_k: usize,
        mode: &str,
        shortlist: usize,
        nprobe: Option<usize>,
        group_views: bool,
    ) -> PyResult<String> {
        let params = search_params(top_k, mode, shortlist, nprobe, group_views)?;
        let feats = match features {
            Some((cls, patches, attention)) => features_from_numpy(ids, cls, patches, attention)?,
            None => {
                let x = self
                    .read()
                    .extractor()
                    .cloned()
                    .ok_or_else(|| PyErr::from(no_model("image queries")))?;
                PyModel { extractor: x }.features(py, ids, images, paths)?
            }
        };
        let guard = self.read();
        let engine: &Engine = &guard;
        let hits = py.detach(|| engine.search_features(&feats, &params));
        Ok(to_json(&hits)?)
    }

    /// Adds images from `meta_json` records (with `path`, or with `features`); returns how
    /// many were added.
    #[pyo3(signature = (meta_json, features=None))]
    fn add(
        &self,
        py: Python<'_>,
        meta_json: &str,
        features: Option<NamedFeatures<'_>>,
    ) -> PyResult<usize> {
        let metas = metas_from_json(meta_json)?;
        let feats = match features {
            Some((fids, cls, patches, attention)) => {
                features_from_numpy(fids, cls, patches, attention)?
            }
            None => {
                let x = self
                    .read()
                    .extractor()
                    .cloned()
                    .ok_or_else(|| PyErr::from(no_model("adding images")))?;
                let items = items_of(&metas)?;
                py.detach(move || x.extract(&items, "add", &Silent))
                    .py_err()?
            }
        };
        let mut guard = self.engine.write().unwrap_or_else(|e| e.into_inner());
        let engine: &Engine = &guard;
        let (n, grown) = py
            .detach(|| {
                engine.add_features(metas_in_order(metas.iter().cloned(), &feats.ids)?, &feats)
            })
            .py_err()?;
        *guard = grown;
        Ok(n)
    }

    /// Removes images by id; returns how many were present.
    fn remove(&self, py: Python<'_>, ids: Vec<String>) -> PyResult<usize> {
        let mut guard = self.engine.write().unwrap_or_else(|e| e.into_inner());
        let engine: &Engine = &guard;
        let (n, shrunk) = py.detach(|| engine.remove(&ids)).py_err()?;
        *guard = shrunk;
        Ok(n)
    }

    /// Links entries (`meta_json` records with `path`, or `features`) to this index;
    /// rows as JSON. `partition`: one part of a set cut by position (no insertion; see
    /// `craterdex.dask.link`).
    #[pyo3(signature = (meta_json, features=None, rule_json=None, top_k=10, shortlist=100, insert_new=false, partition=false))]
    fn link_json(
        &self,
        py: Python<'_>,
        meta_json: &str,
        features: Option<NamedFeatures<'_>>,
        rule_json: Option<&str>,
        top_k: usize,
        shortlist: usize,
        insert_new: bool,
        partition: bool,
    ) -> PyResult<String> {
        let metas = metas_from_json(meta_json)?;
        let rule = self.rule(rule_json)?;
        let opts = LinkOptions {
            top_k,
            shortlist,
            insert_new,
            ..Default::default()
        };
        let mut guard = self.engine.write().unwrap_or_else(|e| e.into_inner());
        let engine: &Engine = &guard;
        let feats = match features {
            Some((fids, cls, patches, attention)) => {
                features_from_numpy(fids, cls, patches, attention)?
            }
            None => {
                let x = engine
                    .extractor()
                    .cloned()
                    .ok_or_else(|| PyErr::from(no_model("linking images")))?;
                let items = items_of(&metas)?;
                py.detach(move || x.extract(&items, "entries", &Silent))
                    .py_err()?
            }
        };
        let dir = &self.dir;
        let (rows, grown) = py
            .detach(
                || -> Fallible<(Vec<craterdex_workflows::LinkRow>, Option<Engine>)> {
                    let entries: Vec<_> = metas_in_order(metas.iter().cloned(), &feats.ids)?
                        .into_iter()
                        .zip(engine.encode(&feats))
                        .collect();
                    if partition {
                        return Ok((
                            craterdex_workflows::link_partition(
                                engine, &entries, &rule, &opts, &Silent,
                            )?,
                            None,
                        ));
                    }
                    // link takes the engine it may grow; this one stays valid until replaced
                    let current = Engine::open(dir, engine.extractor().cloned())?;
                    let (rows, grown) =
                        craterdex_workflows::link(current, entries, &rule, &opts, &Silent)?;
                    Ok((rows, Some(grown)))
                },
            )
            .py_err()?;
        if let Some(grown) = grown {
            *guard = grown;
        }
        serde_json::to_string(&rows).map_err(|e| PyErr::from(invalid(format!("JSON: {e}"))))
    }

    /// Groups of entries of one crater (JSON), over all live entries, or the dedup edges of
    /// the entries `ids` only (one partition; see `craterdex.dask.dedup`).
    #[pyo3(signature = (rule_json=None, top_k=10, shortlist=100, ids=None))]
    fn dedup_json(
        &self,
        py: Python<'_>,
        rule_json: Option<&str>,
        top_k: usize,
        shortlist: usize,
        ids: Option<Vec<String>>,
    ) -> PyResult<String> {
        let rule = self.rule(rule_json)?;
        let opts = DedupOptions {
            top_k,
            shortlist,
            ..Default::default()
        };
        let guard = self.read();
        let engine: &Engine = &guard;
        let json = py
            .detach(|| -> Fallible<String> {
                let idx = engine.index();
                Ok(match ids {
                    None => to_json(&craterdex_workflows::dedup(engine, &rule, &opts, &Silent)?)?,
                    Some(ids) => {
                        let rows = ids
                            .iter()
                            .map(|id| {
                                idx.row_of(id).ok_or_else(|| {
                                    craterdex_engine::Error::NoSuchImage(id.clone()).into()
                                })
                            })
                            .collect::<Fallible<Vec<usize>>>()?;
                        let core: Vec<ImageMeta> =
                            rows.iter().map(|&r| idx.meta(r).clone()).collect();
                        let near = craterdex_workflows::Neighbours::around(idx, &rule, &core);
                        to_json(&craterdex_workflows::dedup::edges(
                            engine, &near, &rule, &opts, &rows, &Silent,
                        ))?
                    }
                })
            })
            .py_err()?;
        Ok(json)
    }

    /// The groups that dedup edges of every live entry (JSON, from partitions) make.
    fn dedup_merge_json(&self, py: Python<'_>, edges_json: &str) -> PyResult<String> {
        let edges: Vec<craterdex_workflows::Edge> = serde_json::from_str(edges_json)
            .map_err(|e| invalid(format!("dedup edges: {e}")))
            .py_err()?;
        let guard = self.read();
        let engine: &Engine = &guard;
        let groups = py
            .detach(|| craterdex_workflows::dedup::merge(engine.index(), &edges))
            .py_err()?;
        serde_json::to_string(&groups).map_err(|e| PyErr::from(invalid(format!("JSON: {e}"))))
    }

    /// The decision rule this index uses (its calibrated `link-rule.json`, else the
    /// default), as JSON.
    fn rule_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.rule(None)?)
            .map_err(|e| PyErr::from(invalid(format!("JSON: {e}"))))
    }
}

impl PyIndex {
    fn rule(&self, json: Option<&str>) -> PyResult<LinkRule> {
        match json {
            Some(j) => serde_json::from_str(j)
                .map_err(|e| invalid(format!("link rule: {e}")))
                .py_err(),
            None => LinkRule::for_index(&self.dir).py_err(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Evaluation and builds in parts

/// Every regime of the CraterBench-R protocol on a manifest; results as JSON.
#[pyfunction]
#[pyo3(signature = (manifest, model, quick=true, root=None))]
fn evaluate_json(
    py: Python<'_>,
    manifest: PathBuf,
    model: &PyModel,
    quick: bool,
    root: Option<PathBuf>,
) -> PyResult<String> {
    let x = model.extractor.clone();
    py.detach(move || -> Fallible<String> {
        let b = craterdex_eval::manifest::load(&manifest, root.as_deref())?;
        if b.manifest.query_images.is_empty() {
            return Err(invalid(format!("{}: no query_images to evaluate", manifest.display())));
        }
        let gallery = x.extract(&b.gallery_items(), "gallery", &Silent)?;
        let queries = x.extract(&b.query_items(), "queries", &Silent)?;
        let o = if quick { craterdex_eval::regimes::EvalOptions::quick() } else { Default::default() };
        let results = craterdex_eval::regimes::run_on_benchmark(&b, &gallery, &queries, &o, &|_| {})?;
        Ok(craterdex_eval::regimes::to_json(&results, serde_json::json!({"manifest": manifest.display().to_string(), "model": x.fingerprint()})).to_string())
    })
    .py_err()
}

/// Positions (in input order) of the images a build of `n` learns from.
#[pyfunction]
#[pyo3(signature = (n, seed=0))]
fn learn_sample(n: usize, seed: u64) -> Vec<usize> {
    craterdex_engine::learn_sample(n, seed)
}

/// Learns a build plan from the sample's images (`meta_json` records with `path`) and
/// saves it at `plan_path`.
#[pyfunction]
#[pyo3(signature = (plan_path, meta_json, model, recipe_json="{}"))]
fn make_plan(
    py: Python<'_>,
    plan_path: PathBuf,
    meta_json: &str,
    model: &PyModel,
    recipe_json: &str,
) -> PyResult<usize> {
    let recipe = recipe_from_json(recipe_json)?;
    let metas = metas_from_json(meta_json)?;
    let items = items_of(&metas)?;
    let x = model.extractor.clone();
    py.detach(move || -> Fallible<usize> {
        let feats = x.extract(&items, "sample", &Silent)?;
        let metas = metas_in_order(metas, &feats.ids)?;
        recipe
            .plan(&feats, &metas, Some(x.fingerprint()))?
            .save(&plan_path)?;
        Ok(feats.len())
    })
    .py_err()
}

/// Extracts, encodes and writes one part (`meta_json` records with `path`) of a build.
#[pyfunction]
fn write_part(
    py: Python<'_>,
    plan_path: PathBuf,
    part_dir: PathBuf,
    meta_json: &str,
    model: &PyModel,
) -> PyResult<usize> {
    let metas = metas_from_json(meta_json)?;
    let items = items_of(&metas)?;
    let x = model.extractor.clone();
    py.detach(move || -> Fallible<usize> {
        let plan = BuildPlan::load(&plan_path)?;
        if let Some(m) = &plan.model {
            if *m != x.fingerprint() {
                return Err(invalid(format!(
                    "the plan was learned with model {m}, this worker runs {}",
                    x.fingerprint()
                )));
            }
        }
        let feats = x.extract(&items, "part", &Silent)?;
        Ok(plan.write_part(
            &part_dir,
            &feats,
            metas_in_order(metas.iter().cloned(), &feats.ids)?,
        )?)
    })
    .py_err()
}

/// Joins the parts (in order) into the index at `out`; returns the number of images.
#[pyfunction]
fn commit_parts(
    py: Python<'_>,
    plan_path: PathBuf,
    out: PathBuf,
    parts: Vec<PathBuf>,
) -> PyResult<usize> {
    py.detach(move || -> Fallible<usize> {
        if parts.is_empty() {
            return Err(invalid("no parts to commit"));
        }
        Ok(BuildPlan::load(&plan_path)?.commit(&out, &parts, &Silent)?)
    })
    .py_err()
}

/// The CPU and the kernel level in use (portable, avx2, avx512, amx), as `craterdex cpu`
/// prints them: every speed measured from Python should say which level produced it.
#[pyfunction]
fn cpu() -> String {
    craterdex_kernels::level::describe()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyModel>()?;
    m.add_class::<PyIndex>()?;
    m.add_function(wrap_pyfunction!(evaluate_json, m)?)?;
    m.add_function(wrap_pyfunction!(learn_sample, m)?)?;
    m.add_function(wrap_pyfunction!(make_plan, m)?)?;
    m.add_function(wrap_pyfunction!(write_part, m)?)?;
    m.add_function(wrap_pyfunction!(commit_parts, m)?)?;
    m.add_function(wrap_pyfunction!(cpu, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
