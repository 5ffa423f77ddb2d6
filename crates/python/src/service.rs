//! The pieces of `craterdex serve`'s HTTP API that `craterdex.cluster`'s router answers
//! with (craterdex-api, which `craterdex serve` is built on too): the readers of entry forms and search options, upload
//! files and thumbnails, the OpenAPI document and the web page; and the cluster's link, each
//! shard's evidence decided as one index decides. A refusal is raised as `ApiRefusal(status,
//! message)`, the status `craterdex serve` answers for it.

use crate::convert::{metas_from_json, options_from_json, to_json};
use crate::failure::OrPy;
use craterdex_api::{page, readers, ApiError};
use craterdex_workflows::{Frames, LinkEvidence, LinkOptions, LinkRule};
use pyo3::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

pyo3::create_exception!(
    _native,
    ApiRefusal,
    pyo3::exceptions::PyException,
    "A request refused as craterdex serve refuses it: args (status, message)."
);

fn refused(e: ApiError) -> PyErr {
    ApiRefusal::new_err((e.status().as_u16(), e.message().to_string()))
}

/// The metadata (JSON) of an entry form's text fields, read and checked as `craterdex serve`
/// reads them; the id is empty when none was given.
#[pyfunction]
pub fn entry_meta_json(fields: HashMap<String, String>) -> PyResult<String> {
    readers::check_entry_fields(fields.keys().map(String::as_str)).map_err(refused)?;
    let fields: BTreeMap<String, String> = fields.into_iter().collect();
    to_json(&readers::entry_meta(&fields).map_err(refused)?).py_err()
}

/// The id of an upload given none, made from its bytes as `craterdex serve` makes it.
#[pyfunction]
pub fn upload_id(bytes: &[u8]) -> String {
    readers::upload_id(bytes)
}

/// `craterdex serve`'s default limits, bounded to `max_query_views` views of a query image
/// (`craterdex serve --max-query-views`) where given.
fn limits(max_query_views: Option<usize>) -> craterdex_engine::SearchLimits {
    craterdex_engine::SearchLimits {
        max_query_views,
        ..craterdex_api::DEFAULT_LIMITS
    }
}

/// The search options (JSON) of a query string, read and checked against `craterdex serve`'s
/// default limits (and `max_query_views`, as `craterdex serve --max-query-views` bounds them).
#[pyfunction]
#[pyo3(signature = (query, kind="image", max_query_views=None))]
pub fn search_options_json(
    query: &str,
    kind: &str,
    max_query_views: Option<usize>,
) -> PyResult<String> {
    let kind = match kind {
        "image" => craterdex_engine::QueryKind::Image,
        "features" => craterdex_engine::QueryKind::Features,
        "indexed" => craterdex_engine::QueryKind::Indexed,
        other => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "a query is an image, features or indexed, not {other}"
            )))
        }
    };
    let options =
        readers::search_options(query, &limits(max_query_views), kind).map_err(refused)?;
    to_json(&options).py_err()
}

/// Writes an upload's bytes into `dir` (named by their SHA-256); returns the file's path.
#[pyfunction]
pub fn store_upload(py: Python<'_>, dir: PathBuf, bytes: &[u8]) -> PyResult<String> {
    let format = image::guess_format(bytes)
        .map_err(|e| refused(ApiError::bad_request(format!("not an image: {e}"))))?;
    py.detach(|| readers::stored_upload(&dir, bytes, format))
        .map_err(refused)
}

/// A PNG thumbnail of the image file at `path`, at most `size` pixels on its longer side.
#[pyfunction]
pub fn thumbnail_png(py: Python<'_>, path: PathBuf, id: &str, size: u32) -> PyResult<Vec<u8>> {
    py.detach(|| readers::thumbnail_png(&path, id, size))
        .map_err(refused)
}

/// `craterdex serve`'s OpenAPI document (JSON) for features `feature_dim` wide, its limits
/// bounded to `max_query_views` where given.
#[pyfunction]
#[pyo3(signature = (feature_dim=None, max_query_views=None))]
pub fn service_document_json(feature_dim: Option<usize>, max_query_views: Option<usize>) -> String {
    serde_json::to_value(craterdex_api::document(
        &limits(max_query_views),
        feature_dim,
    ))
    .unwrap_or_default()
    .to_string()
}

/// `craterdex serve`'s web page.
#[pyfunction]
pub fn service_page() -> &'static str {
    page::PAGE
}

/// The headers `craterdex serve` answers its page with (content security policy, nosniff,
/// no framing), as `(name, value)` pairs.
#[pyfunction]
pub fn service_page_headers() -> Vec<(&'static str, String)> {
    page::page_headers()
}

/// The link rule stored with an index (its calibrated `link-rule.json`, else the default),
/// as JSON.
#[pyfunction]
pub fn link_rule_json(index_dir: PathBuf) -> PyResult<String> {
    to_json(&LinkRule::for_index(&index_dir).py_err()?).py_err()
}

/// The decision (a link row, JSON) for one entry (`meta_json`, one record) from its evidence
/// in every shard of a set (`evidence_json`, a list of what `Index.link_evidence_json`
/// answers), as one index holding them all decides.
#[pyfunction]
pub fn link_decision_json(
    rule_json: &str,
    meta_json: &str,
    evidence_json: &str,
    options_json: &str,
) -> PyResult<String> {
    let rule: LinkRule = options_from_json("link rule", rule_json).py_err()?;
    let opts: LinkOptions = options_from_json("link options", options_json).py_err()?;
    let meta = one_meta(meta_json)?;
    let parts: Vec<LinkEvidence> = options_from_json("link evidence", evidence_json).py_err()?;
    let row = craterdex_workflows::link_decision(&rule, &Frames::none(), &opts, meta, parts);
    to_json(&row).py_err()
}

pub fn one_meta(meta_json: &str) -> PyResult<craterdex_engine::ImageMeta> {
    let mut metas = metas_from_json(meta_json).py_err()?;
    match (metas.pop(), metas.is_empty()) {
        (Some(m), true) => Ok(m),
        _ => Err(crate::failure::invalid("give one metadata record")).py_err(),
    }
}

/// The width and height of an uploaded image, from its header.
#[pyfunction]
pub fn image_size(bytes: &[u8]) -> PyResult<(u32, u32)> {
    image::ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| e.to_string())
        .and_then(|r| r.into_dimensions().map_err(|e| e.to_string()))
        .map_err(|e| {
            refused(ApiError::new(
                craterdex_api::StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("not an image: {e}"),
            ))
        })
}
