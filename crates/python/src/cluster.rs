//! A shard set served on a cluster (`craterdex.cluster`): the router's calls to its shard
//! replicas made into the engine's [`ShardCalls`], so that a query image is searched over
//! the cluster in the engine's own order (rechecked, in views, verified; [`craterdex_engine::search()`]) and a
//! number measured on one index measures the cluster's answer too. The router's methods run
//! in Python (they await Ray Serve's handles); this module calls them from the engine's
//! thread and reads their answers.

use crate::convert::{features_from_numpy, to_json, to_numpy_features};
use crate::failure::{invalid, Fallible, OrPy};
use craterdex_engine::{
    Descriptors, Error, FeatureSet, OverShards, QueryEncoder, QueryViews, SearchHit, SearchInput,
    SearchOptions, SearchParams, ShardCalls, Silent, Suns,
};
use numpy::{
    IntoPyArray, PyArrayMethods, PyReadonlyArray2, PyReadonlyArray3, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::collections::HashSet;
use std::sync::Mutex;

/// The router's calls (a Python object with `features`, `search_views`, `verify_chosen`,
/// `views_per_crater` and `sun_samples`, each answering per shard a JSON string or None where
/// the shard failed)
/// and the set's shared encoder.
struct RouterCalls<'a> {
    encoder: &'a QueryEncoder,
    /// The width of the model's features, which sets the width of the encoder's tokens.
    feature_dim: usize,
    calls: Py<PyAny>,
    /// The exception a call raised, handed back to the router as it was raised.
    raised: Mutex<Option<PyErr>>,
}

impl RouterCalls<'_> {
    /// `method` of the router's calls with `args`, its answer read by `read`; an exception
    /// is kept to be raised again once the engine returns.
    fn call<T>(
        &self,
        method: &str,
        args: impl FnOnce(Python<'_>) -> PyResult<Py<pyo3::types::PyTuple>>,
        read: impl FnOnce(&Bound<'_, PyAny>) -> PyResult<T>,
    ) -> craterdex_engine::Result<T> {
        Python::attach(|py| {
            args(py)
                .and_then(|a| self.calls.bind(py).call_method1(method, a.bind(py)))
                .and_then(|answer| read(&answer))
                .map_err(|e| {
                    let message = format!("the cluster's {method}: {e}");
                    *self.raised.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    Error::Invalid(message)
                })
        })
    }

    /// Per shard, the JSON answer as `T`, or `T::default()` where the shard failed.
    fn per_shard<T: serde::de::DeserializeOwned + Default>(
        method: &str,
        answer: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<T>> {
        answer
            .extract::<Vec<Option<String>>>()?
            .into_iter()
            .map(|a| match a {
                None => Ok(T::default()),
                Some(json) => serde_json::from_str(&json).map_err(|e| {
                    pyo3::exceptions::PyValueError::new_err(format!(
                        "a shard's answer to {method}: {e}"
                    ))
                }),
            })
            .collect()
    }
}

fn wire(v: &impl serde::Serialize) -> PyResult<String> {
    serde_json::to_string(v).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))
}

/// Lists for `queries` queries: a failed shard's empty answer made one empty list per query.
fn padded(lists: Vec<Vec<Vec<SearchHit>>>, queries: usize) -> Vec<Vec<Vec<SearchHit>>> {
    lists
        .into_iter()
        .map(|l| match l.is_empty() {
            true => vec![Vec::new(); queries],
            false => l,
        })
        .collect()
}

impl ShardCalls for RouterCalls<'_> {
    fn encode(&self, features: &FeatureSet) -> craterdex_engine::Result<Vec<Descriptors>> {
        self.encoder.encode(features)
    }

    fn search_views(
        &self,
        queries: &[Vec<Descriptors>],
        views: QueryViews,
        params: &SearchParams,
    ) -> craterdex_engine::Result<Vec<Vec<Vec<SearchHit>>>> {
        let flat: Vec<&Descriptors> = queries.iter().flatten().collect();
        let n = flat.len();
        let ds = flat.first().map_or(0, |d| d.single.len());
        let kd = flat.first().map_or(0, |d| d.tokens.len());
        let dt = self.encoder.token_dim(self.feature_dim).max(1);
        let lists = self.call(
            "search_views",
            |py| {
                let single: Vec<f32> = flat.iter().flat_map(|d| d.single.clone()).collect();
                let tokens: Vec<f32> = flat.iter().flat_map(|d| d.tokens.clone()).collect();
                let single = single.into_pyarray(py).reshape([n, ds])?;
                let tokens = tokens.into_pyarray(py).reshape([n, kd / dt, dt])?;
                Ok((single, tokens, wire(&views)?, wire(params)?)
                    .into_pyobject(py)?
                    .unbind())
            },
            |a| Self::per_shard("search_views", a),
        )?;
        Ok(padded(lists, queries.len()))
    }

    fn verify_chosen(
        &self,
        ids: &[String],
        variants: &FeatureSet,
        views: QueryViews,
        params: &SearchParams,
        top: usize,
        chosen: &[Vec<HashSet<String>>],
        _progress: &dyn craterdex_engine::Progress,
    ) -> craterdex_engine::Result<Vec<Vec<Vec<SearchHit>>>> {
        let lists = self.call(
            "verify_chosen",
            |py| {
                let features = to_numpy_features(py, variants.clone())?;
                let chosen = chosen.iter().map(wire).collect::<PyResult<Vec<_>>>()?;
                Ok((
                    ids.to_vec(),
                    features,
                    wire(&views)?,
                    wire(params)?,
                    top,
                    chosen,
                )
                    .into_pyobject(py)?
                    .unbind())
            },
            |a| Self::per_shard("verify_chosen", a),
        )?;
        Ok(padded(lists, ids.len()))
    }

    fn views_per_crater(&self) -> usize {
        let per_shard: Vec<usize> = self
            .call(
                "views_per_crater",
                |py| Ok(pyo3::types::PyTuple::empty(py).unbind()),
                |a| Self::per_shard("views_per_crater", a),
            )
            .unwrap_or_default();
        // a shard that failed answers 0; where none could say, the deepest list
        match per_shard.into_iter().max() {
            Some(most) if most > 0 => most,
            _ => craterdex_engine::VERIFY_VIEWS_PER_CRATER,
        }
    }

    fn suns(&self) -> craterdex_engine::Result<Suns> {
        let samples: Vec<Vec<(String, Option<f32>)>> = self.call(
            "sun_samples",
            |py| Ok(pyo3::types::PyTuple::empty(py).unbind()),
            |a| Self::per_shard("sun_samples", a),
        )?;
        Ok(craterdex_engine::suns_from_samples(samples))
    }
}

/// Searches the router's queries over the shards its `calls` reach, their descriptors made by
/// the set's shared `encoder`
/// (`calls.features(only, views_json)` gives the ids of the queries `only` names, or of all,
/// and their features in some views: a dict of `ids`, `cls`, `patches`, `attention`, each
/// query's views in a row; the model's features are `feature_dim` wide), as `options_json`
/// (a `SearchOptions`) asks: rechecked, in views,
/// verified or plainly, in the engine's order ([`craterdex_engine::search()`]). The hits
/// per query (JSON, as `search_json` gives them). An exception a call raised is raised
/// again as it was.
pub fn cluster_search_json(
    py: Python<'_>,
    encoder: &QueryEncoder,
    feature_dim: usize,
    calls: Py<PyAny>,
    options_json: &str,
) -> PyResult<String> {
    let options: SearchOptions =
        crate::convert::options_from_json("search options", options_json).py_err()?;
    let router = RouterCalls {
        encoder,
        feature_dim,
        calls,
        raised: Mutex::new(None),
    };
    let features = |only: Option<&HashSet<String>>, views: QueryViews| {
        router.call(
            "features",
            |py| {
                let only: Option<Vec<String>> = only.map(|o| o.iter().cloned().collect());
                Ok((only, wire(&views)?).into_pyobject(py)?.unbind())
            },
            |answer| {
                let (ids, f): (Vec<String>, Bound<'_, PyDict>) = answer.extract()?;
                let item = |k: &str| {
                    f.get_item(k)?.ok_or_else(|| {
                        pyo3::exceptions::PyKeyError::new_err(format!("features without {k}"))
                    })
                };
                let set = features_from_numpy(
                    item("ids")?.extract()?,
                    item("cls")?.extract()?,
                    item("patches")?.extract()?,
                    item("attention")?.extract()?,
                )
                .map_err(PyErr::from)?;
                Ok((ids, set))
            },
        )
    };
    let hits = py.detach(|| {
        craterdex_engine::search(
            &OverShards(&router),
            SearchInput::Viewed(&features),
            &options,
            &Silent,
        )
    });
    if let Some(e) = router
        .raised
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    {
        return Err(e);
    }
    to_json(&hits.py_err()?.hits).py_err()
}

/// A shard replica's answers to the router's calls ([`cluster_search_json`]), each as JSON.
pub(crate) mod shard {
    use super::*;
    use craterdex_engine::Engine;

    fn read<T: serde::de::DeserializeOwned>(what: &str, json: &str) -> Fallible<T> {
        serde_json::from_str(json).map_err(|e| invalid(format!("{what}: {e}")))
    }

    /// Every query's hits in its views: descriptors `single` `[N * V, Ds]`, `tokens`
    /// `[N * V, K, Dt]`, each query's V views in a row.
    pub fn search_views(
        py: Python<'_>,
        engine: &Engine,
        single: PyReadonlyArray2<f32>,
        tokens: PyReadonlyArray3<f32>,
        views_json: &str,
        params_json: &str,
    ) -> PyResult<String> {
        let views: QueryViews = read("views", views_json).py_err()?;
        let params: SearchParams = read("search params", params_json).py_err()?;
        let names: Vec<String> = (0..single.shape()[0]).map(|i| i.to_string()).collect();
        let descs = crate::convert::descriptors_from_numpy(&names, single, tokens, engine.index())
            .py_err()?;
        if descs.len() % views.count() != 0 {
            return Err(invalid(format!(
                "{} descriptors for queries of {} views each",
                descs.len(),
                views.count()
            )))
            .py_err();
        }
        let queries: Vec<Vec<Descriptors>> =
            descs.chunks(views.count()).map(<[_]>::to_vec).collect();
        let hits = py.detach(|| engine.search_views(&queries, views, &params));
        to_json(&hits).py_err()
    }

    /// This shard's verified hits ([`Engine::verify_chosen`]).
    #[allow(clippy::too_many_arguments)]
    pub fn verify_chosen(
        py: Python<'_>,
        engine: &Engine,
        ids: Vec<String>,
        variants: FeatureSet,
        views_json: &str,
        params_json: &str,
        top: usize,
        chosen_json: &str,
    ) -> PyResult<String> {
        let views: QueryViews = read("views", views_json).py_err()?;
        let params: SearchParams = read("search params", params_json).py_err()?;
        let chosen: Vec<HashSet<String>> = read("chosen candidates", chosen_json).py_err()?;
        let hits = py.detach(|| {
            engine.verify_chosen(&ids, &variants, views, &params, top, &chosen, &Silent)
        });
        to_json(&hits.py_err()?).py_err()
    }
}
