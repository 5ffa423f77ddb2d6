//! `craterdex.Model`: a loaded backbone that turns crater crops into features.

use crate::convert::{array_image, ensure_len, options_from_json, to_numpy_features};
use crate::failure::{invalid, Fallible, OrPy};
use crate::progress::PyProgress;
use craterdex_engine::{Extractor, FeatureSet, ModelOptions, Silent};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::Arc;

#[pyclass(name = "Model", module = "craterdex._native", frozen)]
pub struct PyModel {
    pub extractor: Arc<Extractor>,
}

impl PyModel {
    /// Features of images given as numpy arrays or as paths, named `ids`.
    pub fn features(
        &self,
        py: Python<'_>,
        ids: Vec<String>,
        images: Option<Vec<Bound<'_, PyAny>>>,
        paths: Option<Vec<PathBuf>>,
        progress: &PyProgress,
    ) -> Fallible<FeatureSet> {
        let x = self.extractor.clone();
        match (images, paths) {
            (Some(arrays), None) => {
                ensure_len(ids.len(), arrays.len())?;
                let images = arrays
                    .iter()
                    .enumerate()
                    .map(|(i, a)| array_image(a, i))
                    .collect::<Fallible<Vec<_>>>()?;
                Ok(py.detach(move || x.features_of_images(&ids, &images, progress))?)
            }
            (None, Some(paths)) => {
                ensure_len(ids.len(), paths.len())?;
                let items: Vec<(String, PathBuf)> = ids.into_iter().zip(paths).collect();
                Ok(py.detach(move || x.extract(&items, "images", progress))?)
            }
            _ => Err(invalid("give images (numpy arrays) or paths")),
        }
    }
}

#[pymethods]
impl PyModel {
    /// Loads the model `options_json` (a `ModelOptions`) names.
    #[staticmethod]
    #[pyo3(signature = (options_json, progress=None))]
    fn load(py: Python<'_>, options_json: &str, progress: Option<Py<PyAny>>) -> PyResult<Self> {
        let options: ModelOptions = options_from_json("model options", options_json).py_err()?;
        let progress = PyProgress::new(progress);
        let x = py
            .detach(move || Extractor::load(&options, &progress))
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

    #[getter]
    fn protocol_json(&self) -> String {
        serde_json::json!(self.extractor.protocol()).to_string()
    }

    #[pyo3(signature = (ids, images=None, paths=None, progress=None))]
    fn extract<'py>(
        &self,
        py: Python<'py>,
        ids: Vec<String>,
        images: Option<Vec<Bound<'py, PyAny>>>,
        paths: Option<Vec<PathBuf>>,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let f = self
            .features(py, ids, images, paths, &PyProgress::new(progress))
            .py_err()?;
        to_numpy_features(py, f)
    }

    /// Features of images at `paths` named `ids` in the views `views_json` names (a
    /// `QueryViews` as the engine serialises it, which a cluster's router sends): the ids of
    /// the images read and a dict of `ids`, `cls`, `patches`, `attention`, each image's
    /// views in a row.
    fn variant_features<'py>(
        &self,
        py: Python<'py>,
        ids: Vec<String>,
        paths: Vec<PathBuf>,
        views_json: &str,
    ) -> PyResult<(Vec<String>, Bound<'py, PyDict>)> {
        ensure_len(ids.len(), paths.len()).py_err()?;
        let views: craterdex_engine::QueryViews =
            options_from_json("views", views_json).py_err()?;
        let items: Vec<(String, PathBuf)> = ids.into_iter().zip(paths).collect();
        let x = self.extractor.clone();
        let (read, f) = py
            .detach(move || x.variant_features(&items, views, &Silent))
            .py_err()?;
        Ok((read, to_numpy_features(py, f)?))
    }
}
