//! Python values into the engine's inputs and results back: JSON records and options,
//! numpy feature arrays and images.

use crate::failure::{invalid, Fallible};
use craterdex_engine::{FeatureSet, ImageMeta};
use numpy::{
    IntoPyArray, PyArrayMethods, PyReadonlyArray2, PyReadonlyArray3, PyReadonlyArrayDyn,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde::de::DeserializeOwned;

/// Metadata records from JSON (`[{"id": ..., "lat": ...}, ...]`).
pub fn metas_from_json(json: &str) -> Fallible<Vec<ImageMeta>> {
    serde_json::from_str(json).map_err(|e| invalid(format!("metadata records: {e}")))
}

/// Typed options (`ModelOptions`, `RecipeOptions`, ...) from their JSON, as Python's
/// keywords give them; unknown names and values are refused by the options themselves.
pub fn options_from_json<T: DeserializeOwned>(what: &str, json: &str) -> Fallible<T> {
    serde_json::from_str(json).map_err(|e| invalid(format!("{what}: {e}")))
}

/// JSON of craterdex's own results (serialising them does not fail in practice).
pub fn to_json(v: &impl serde::Serialize) -> Fallible<String> {
    serde_json::to_string(v).map_err(|e| invalid(format!("JSON: {e}")))
}

/// Features handed over from Python: ids, `cls` `[N, D]`, `patches` `[N, T, D]`,
/// `attention` `[N, T]`.
pub type NamedFeatures<'py> = (
    Vec<String>,
    PyReadonlyArray2<'py, f32>,
    PyReadonlyArray3<'py, f32>,
    PyReadonlyArray2<'py, f32>,
);
/// The same arrays for queries named by a separate list of ids.
pub type FeatureArrays<'py> = (
    PyReadonlyArray2<'py, f32>,
    PyReadonlyArray3<'py, f32>,
    PyReadonlyArray2<'py, f32>,
);

/// Features handed over as numpy arrays.
pub fn features_from_numpy(
    ids: Vec<String>,
    cls: PyReadonlyArray2<f32>,
    patches: PyReadonlyArray3<f32>,
    attention: PyReadonlyArray2<f32>,
) -> Fallible<FeatureSet> {
    let (n, d) = (cls.shape()[0], cls.shape()[1]);
    let t = patches.shape()[1];
    if ids.len() != n || patches.shape() != [n, t, d] || attention.shape() != [n, t] {
        return Err(invalid(format!(
            "features: {} ids, cls {:?}, patches {:?}, attention {:?}: give [N, D], [N, T, D], [N, T]",
            ids.len(),
            cls.shape(),
            patches.shape(),
            attention.shape()
        )));
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

/// Descriptors handed over as numpy arrays (`single` `[N, Ds]`, `tokens` `[N, K, Dt]`),
/// checked against the index they search.
pub fn descriptors_from_numpy(
    ids: &[String],
    single: numpy::PyReadonlyArray2<f32>,
    tokens: numpy::PyReadonlyArray3<f32>,
    index: &craterdex_engine::Index,
) -> Fallible<Vec<craterdex_engine::Descriptors>> {
    let n = ids.len();
    let (ds, k, dt) = (
        index.single_dim(),
        index.tokens_per_image(),
        index.token_dim(),
    );
    if single.shape() != [n, ds] || tokens.shape() != [n, k, dt] {
        return Err(invalid(format!(
            "descriptors: {n} ids, single {:?}, tokens {:?}: the index takes [N, {ds}] and [N, {k}, {dt}]",
            single.shape(),
            tokens.shape()
        )));
    }
    let (single, tokens) = (single.as_array(), tokens.as_array());
    Ok((0..n)
        .map(|i| craterdex_engine::Descriptors {
            single: single.row(i).iter().copied().collect(),
            tokens: tokens
                .index_axis(numpy::ndarray::Axis(0), i)
                .iter()
                .copied()
                .collect(),
        })
        .collect())
}

/// Features handed over, named by their own ids.
pub fn named_features(f: NamedFeatures<'_>) -> Fallible<FeatureSet> {
    let (ids, cls, patches, attention) = f;
    features_from_numpy(ids, cls, patches, attention)
}

/// A feature set as numpy arrays (`ids`, `cls`, `patches`, `attention`; no copy).
pub fn to_numpy_features<'py>(py: Python<'py>, f: FeatureSet) -> PyResult<Bound<'py, PyDict>> {
    let (n, t, d) = (f.len(), f.tokens, f.dim);
    let out = PyDict::new(py);
    out.set_item("ids", f.ids)?;
    out.set_item("cls", f.cls.into_pyarray(py).reshape([n, d])?)?;
    out.set_item("patches", f.patches.into_pyarray(py).reshape([n, t, d])?)?;
    out.set_item("attention", f.attention.into_pyarray(py).reshape([n, t])?)?;
    Ok(out)
}

/// A uint8 or uint16 array `[H, W]` or `[H, W, 3]` as an image, checked as a crater crop.
pub fn array_image(a: &Bound<'_, PyAny>, i: usize) -> Fallible<image::DynamicImage> {
    let bad = |why: String| invalid(format!("image {i}: {why}"));
    let image = if let Ok(a) = a.extract::<PyReadonlyArrayDyn<u8>>() {
        let shape = a.shape().to_vec();
        let data = a
            .as_slice()
            .map(<[u8]>::to_vec)
            .unwrap_or_else(|_| a.as_array().iter().copied().collect());
        match shape[..] {
            [h, w] => image::GrayImage::from_raw(w as u32, h as u32, data)
                .map(image::DynamicImage::ImageLuma8),
            [h, w, 3] => image::RgbImage::from_raw(w as u32, h as u32, data)
                .map(image::DynamicImage::ImageRgb8),
            _ => None,
        }
        .ok_or_else(|| bad(format!("shape {shape:?}: give [H, W] or [H, W, 3]")))?
    } else if let Ok(a) = a.extract::<PyReadonlyArrayDyn<u16>>() {
        let shape = a.shape().to_vec();
        let data: Vec<u16> = a.as_array().iter().copied().collect();
        match shape[..] {
            [h, w] => image::ImageBuffer::from_raw(w as u32, h as u32, data)
                .map(image::DynamicImage::ImageLuma16),
            _ => None,
        }
        .ok_or_else(|| bad(format!("uint16 shape {shape:?}: give [H, W]")))?
    } else {
        return Err(bad("not a uint8 or uint16 numpy array".into()));
    };
    use craterdex_model::preprocess::{check_crop_size, MAX_CROP_PIXELS};
    check_crop_size(image.width(), image.height(), MAX_CROP_PIXELS)
        .map_err(|e| invalid(format!("image {i}: {e}")))?;
    Ok(image)
}

pub fn ensure_len(ids: usize, images: usize) -> Fallible<()> {
    if ids != images {
        return Err(invalid(format!("{ids} ids for {images} images")));
    }
    Ok(())
}
