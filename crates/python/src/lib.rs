//! craterdex-python: the native module of the `craterdex` Python package (PyO3, abi3).
//!
//! Owns: turning Python values into the engine's inputs (paths, numpy images and feature
//! arrays, metadata and typed options as JSON) and results into numpy arrays and JSON
//! records that the pure-Python layer (`python/craterdex`) turns into pandas DataFrames.
//! Every job is one call into craterdex-engine, -eval or -workflows, as the CLI's are; this
//! crate must not wire model, tokens and index itself. The GIL is released during model and
//! search work. Errors become the `craterdex.errors` class of their kind.
//!
//! Modules: `failure` (errors to exceptions), `convert` (values in and out), `model` and
//! `index` (the classes), `jobs` (evaluation, builds in parts, defaults), `service` (the
//! HTTP API's pieces `craterdex.cluster`'s router answers with, from craterdex-serve),
//! `cluster` (the router's calls to its shards as the engine's shard calls).

mod cluster;
mod convert;
mod failure;
mod index;
mod jobs;
mod model;
mod progress;
mod service;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // the libraries' events go to Python's logging (loggers named after their crates:
    // craterdex_engine.shared, craterdex_kernels.level, ...)
    pyo3_log::init();
    m.add_class::<model::PyModel>()?;
    m.add_class::<index::PyIndex>()?;
    m.add_class::<jobs::PyQueryEncoder>()?;
    m.add_function(wrap_pyfunction!(jobs::evaluate_json, m)?)?;
    m.add_function(wrap_pyfunction!(jobs::learn_sample, m)?)?;
    m.add_function(wrap_pyfunction!(jobs::make_plan, m)?)?;
    m.add_function(wrap_pyfunction!(jobs::write_part, m)?)?;
    m.add_function(wrap_pyfunction!(jobs::commit_parts, m)?)?;
    m.add_function(wrap_pyfunction!(jobs::commit_shards, m)?)?;
    m.add_function(wrap_pyfunction!(jobs::shards_of, m)?)?;
    m.add_function(wrap_pyfunction!(jobs::merge_hits_json, m)?)?;
    m.add_function(wrap_pyfunction!(jobs::posted_features, m)?)?;
    m.add_function(wrap_pyfunction!(jobs::cpu, m)?)?;
    m.add_function(wrap_pyfunction!(jobs::defaults_json, m)?)?;
    m.add_function(wrap_pyfunction!(jobs::recheck_plan_json, m)?)?;
    m.add("ApiRefusal", m.py().get_type::<service::ApiRefusal>())?;
    m.add_function(wrap_pyfunction!(service::entry_meta_json, m)?)?;
    m.add_function(wrap_pyfunction!(service::upload_id, m)?)?;
    m.add_function(wrap_pyfunction!(service::image_size, m)?)?;
    m.add_function(wrap_pyfunction!(service::search_options_json, m)?)?;
    m.add_function(wrap_pyfunction!(service::store_upload, m)?)?;
    m.add_function(wrap_pyfunction!(service::thumbnail_png, m)?)?;
    m.add_function(wrap_pyfunction!(service::service_document_json, m)?)?;
    m.add_function(wrap_pyfunction!(jobs::read_meta_csv_json, m)?)?;
    m.add_function(wrap_pyfunction!(service::service_page, m)?)?;
    m.add_function(wrap_pyfunction!(service::service_page_headers, m)?)?;
    m.add_function(wrap_pyfunction!(service::link_rule_json, m)?)?;
    m.add_function(wrap_pyfunction!(service::link_decision_json, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
