//! Whole jobs: evaluation of a benchmark, builds in parts (plan, parts, commit), and what
//! the package reads from the engine (defaults, the CPU's kernel level).

use crate::convert::{metas_from_json, options_from_json, to_json};
use crate::failure::{invalid, Fallible, OrPy};
use crate::model::PyModel;
use craterdex_engine::{BuildPlan, Defaults, Entries, RecipeOptions, Silent};
use craterdex_workflows::{DedupOptions, LinkOptions};
use pyo3::prelude::*;
use std::path::PathBuf;

/// Every regime of the CraterBench-R protocol on a manifest; results as JSON.
#[pyfunction]
#[pyo3(signature = (manifest, model, quick=true, root=None, progress=None))]
pub fn evaluate_json(
    py: Python<'_>,
    manifest: PathBuf,
    model: &PyModel,
    quick: bool,
    root: Option<PathBuf>,
    progress: Option<Py<PyAny>>,
) -> PyResult<String> {
    let x = model.extractor.clone();
    let progress = crate::progress::PyProgress::new(progress);
    py.detach(move || -> Fallible<String> {
        use craterdex_eval::{regimes, run};
        let b = run::load_benchmark(&manifest, root.as_deref())?;
        let out = run::evaluate(b, &x, &run::eval_options(quick), &progress, &|_| {})?;
        let info = serde_json::json!({"manifest": manifest.display().to_string(), "model": x.fingerprint()});
        let mut v = regimes::to_json(&out.results, info);
        v["protocol"] = serde_json::json!(out.protocol);
        Ok(v.to_string())
    })
    .py_err()
}

/// The entry metadata of a crater table (`craterdex_workflows::entries::read_meta_csv`: its
/// own columns, a Robbins-format catalogue's, or the common spellings), as JSON records in
/// the file's order of ids.
#[pyfunction]
pub fn read_meta_csv_json(path: PathBuf) -> PyResult<String> {
    let metas = craterdex_workflows::entries::read_meta_csv(&path).py_err()?;
    let mut records: Vec<_> = metas.into_values().collect();
    records.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(serde_json::json!(records).to_string())
}

/// Positions (in input order) of the images a build of `n` learns from.
#[pyfunction]
#[pyo3(signature = (n, seed=0))]
pub fn learn_sample(n: usize, seed: u64) -> Vec<usize> {
    craterdex_engine::learn_sample(n, seed)
}

/// Learns a build plan from the sample's images (`meta_json` records with `path`) and
/// saves it at `plan_path`; returns how many images it learned from.
#[pyfunction]
#[pyo3(signature = (plan_path, meta_json, model, recipe_json="{}"))]
pub fn make_plan(
    py: Python<'_>,
    plan_path: PathBuf,
    meta_json: &str,
    model: &PyModel,
    recipe_json: &str,
) -> PyResult<usize> {
    let options: RecipeOptions = options_from_json("recipe", recipe_json).py_err()?;
    let entries = Entries::from_metas(metas_from_json(meta_json).py_err()?).py_err()?;
    let x = model.extractor.clone();
    py.detach(move || -> Fallible<usize> {
        Ok(BuildPlan::learn(
            &plan_path,
            &entries,
            &options.recipe()?,
            &x,
            &Silent,
        )?)
    })
    .py_err()
}

/// Extracts, encodes and writes one part (`meta_json` records with `path`) of a build.
#[pyfunction]
pub fn write_part(
    py: Python<'_>,
    plan_path: PathBuf,
    part_dir: PathBuf,
    meta_json: &str,
    model: &PyModel,
) -> PyResult<usize> {
    let entries = Entries::from_metas(metas_from_json(meta_json).py_err()?).py_err()?;
    let x = model.extractor.clone();
    py.detach(move || -> Fallible<usize> {
        Ok(BuildPlan::load(&plan_path)?.write_entries(&part_dir, &entries, &x, &Silent)?)
    })
    .py_err()
}

/// Joins the parts (in order) into the index at `out`; returns the number of images.
#[pyfunction]
pub fn commit_parts(
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

/// Commits each shard's parts as `out/shard-NNN` and writes `out/shards.json`; returns the
/// set's record as JSON.
#[pyfunction]
pub fn commit_shards(
    py: Python<'_>,
    plan_path: PathBuf,
    out: PathBuf,
    parts_by_shard: Vec<Vec<PathBuf>>,
) -> PyResult<String> {
    py.detach(move || -> Fallible<String> {
        let set = BuildPlan::load(&plan_path)?.commit_shards(&out, &parts_by_shard, &Silent)?;
        serde_json::to_string(&set).map_err(|e| invalid(e.to_string()))
    })
    .py_err()
}

/// The shard (among `shards`) of each of the `meta_json` records, as `craterdex index split`
/// places images.
#[pyfunction]
pub fn shards_of(meta_json: &str, shards: usize) -> PyResult<Vec<usize>> {
    use craterdex_engine::shards::{check_count, shard_of};
    check_count(shards)
        .map_err(craterdex_engine::Error::from)
        .py_err()?;
    let metas = metas_from_json(meta_json).py_err()?;
    Ok(metas.iter().map(|m| shard_of(m, shards)).collect())
}

/// The shards' hit lists of one query (JSON: a list of lists of hits, as `search_json`
/// gives them) merged into the first `top_k`, as `craterdex search --shards` merges them.
#[pyfunction]
pub fn merge_hits_json(lists_json: &str, top_k: usize, group_views: bool) -> PyResult<String> {
    let lists: Vec<Vec<craterdex_engine::SearchHit>> = serde_json::from_str(lists_json)
        .map_err(|e| invalid(format!("hit lists: {e}")))
        .py_err()?;
    to_json(&craterdex_engine::merge_hits(lists, top_k, group_views)).py_err()
}

/// The backbone features of one image posted to a service (a features JSON document or a
/// safetensors body, as `craterdex serve` reads them), checked against the width `dim`: a
/// dict of `ids`, `cls`, `patches`, `attention` (numpy), or `{"error": "malformed" |
/// "unusable", "message": ...}` for the front end to answer 400 or 422.
#[pyfunction]
pub fn posted_features<'py>(
    py: Python<'py>,
    body: &[u8],
    content_type: &str,
    dim: usize,
) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    use craterdex_model::posted;
    let read = py.detach(|| {
        posted::parse_features(body, content_type).and_then(|f| posted::check_features(f, dim))
    });
    match read {
        Ok(features) => crate::convert::to_numpy_features(py, features),
        Err(e) => {
            let out = pyo3::types::PyDict::new(py);
            let kind = match e {
                craterdex_model::Error::Invalid(_) => "malformed",
                _ => "unusable",
            };
            out.set_item("error", kind)?;
            out.set_item("message", e.to_string())?;
            Ok(out)
        }
    }
}

/// A shard set's shared encoder on its own (the bytes of a shard's `encoder.json`): what a
/// cluster's router holds to encode each query once.
#[pyclass(name = "QueryEncoder", module = "craterdex._native", frozen)]
pub struct PyQueryEncoder {
    encoder: craterdex_engine::QueryEncoder,
}

#[pymethods]
impl PyQueryEncoder {
    #[new]
    fn new(encoder_json: &[u8]) -> PyResult<Self> {
        Ok(Self {
            encoder: craterdex_engine::QueryEncoder::from_json(encoder_json).py_err()?,
        })
    }

    /// Searches a cluster's queries over the shards the router's `calls` reach, in the
    /// engine's order, with this encoder (`crate::cluster::cluster_search_json`; parsed once
    /// per router: a set's encoder.json holds its whitening, megabytes of JSON).
    fn search_cluster_json(
        &self,
        py: Python<'_>,
        feature_dim: usize,
        calls: Py<PyAny>,
        options_json: &str,
    ) -> PyResult<String> {
        crate::cluster::cluster_search_json(py, &self.encoder, feature_dim, calls, options_json)
    }

    /// Descriptors of features (`ids`, `cls` `[N, D]`, `patches` `[N, T, D]`, `attention`
    /// `[N, T]`): a dict of `single` `[N, Ds]` and `tokens` `[N, K, Dt]`.
    fn encode<'py>(
        &self,
        py: Python<'py>,
        ids: Vec<String>,
        cls: numpy::PyReadonlyArray2<f32>,
        patches: numpy::PyReadonlyArray3<f32>,
        attention: numpy::PyReadonlyArray2<f32>,
    ) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        use numpy::{IntoPyArray, PyArrayMethods};
        let features =
            crate::convert::features_from_numpy(ids, cls, patches, attention).py_err()?;
        let descs = py.detach(|| self.encoder.encode(&features)).py_err()?;
        let n = descs.len();
        let ds = descs.first().map_or(0, |d| d.single.len());
        let kd = descs.first().map_or(0, |d| d.tokens.len());
        let dt = self.encoder.token_dim(features.dim).max(1);
        let mut single = Vec::with_capacity(n * ds);
        let mut tokens = Vec::with_capacity(n * kd);
        for d in &descs {
            single.extend_from_slice(&d.single);
            tokens.extend_from_slice(&d.tokens);
        }
        let out = pyo3::types::PyDict::new(py);
        out.set_item("single", single.into_pyarray(py).reshape([n, ds])?)?;
        out.set_item("tokens", tokens.into_pyarray(py).reshape([n, kd / dt, dt])?)?;
        Ok(out)
    }
}

/// The CPU and the kernel level in use (portable, avx2, avx512, amx), as `craterdex cpu`
/// prints them: every speed measured from Python should say which level produced it.
#[pyfunction]
pub fn cpu() -> String {
    craterdex_kernels::level::describe()
}

/// The rechecked search's plan ([`craterdex_engine::RecheckPlan`]) for a catalogue whose suns
/// are unknown: its description and its stages (JSON `{"description", "unsure_share",
/// "stages"}`).
#[pyfunction]
pub fn recheck_plan_json() -> PyResult<String> {
    let plan = craterdex_engine::RecheckPlan::shipped();
    to_json(&serde_json::json!({
        "description": craterdex_engine::RecheckPlan::describe(),
        "unsure_share": plan.unsure_share,
        "stages": plan.stages,
    }))
    .py_err()
}

/// Every option's default (JSON), which the package's signatures read: `model`, `recipe`,
/// `search`, `link` and `dedup`.
#[pyfunction]
pub fn defaults_json() -> PyResult<String> {
    let defaults = serde_json::json!({
        "engine": Defaults::default(),
        "link": LinkOptions::default(),
        "dedup": DedupOptions::default(),
    });
    to_json(&defaults).py_err()
}
