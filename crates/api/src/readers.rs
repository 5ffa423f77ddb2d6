//! Readers of what a request carries, shared by every front end of this API (`craterdex
//! serve`, and `craterdex.cluster`'s router on Ray Serve): search options, entry forms and
//! ids, and the files an upload becomes. Each refuses with the status the API documents.

use crate::error::{ApiError, ApiResult};
use craterdex_engine::{ImageMeta, QueryKind, SearchLimits, SearchOptions, SearchParams};
use craterdex_errors::IoContext;
use craterdex_model::preprocess;
use std::collections::BTreeMap;
use std::io::Cursor;

/// The largest searches a request may ask for, unless the server is told otherwise.
pub const DEFAULT_LIMITS: SearchLimits = SearchLimits {
    max_top_k: 1000,
    max_shortlist: 10_000,
    max_nprobe: 1_000_000,
    max_query_views: None,
};

/// Refuses, before any work, the options a query of `kind` cannot use
/// ([`QueryKind::refusal`]), saying which search takes them.
pub fn refuse(kind: QueryKind, options: &SearchOptions) -> ApiResult<()> {
    match kind.refusal(options) {
        None => Ok(()),
        Some(why) => Err(ApiError::bad_request(format!(
            "{why}: search by image (POST /v1/search/image){}",
            match kind {
                QueryKind::Indexed if options.verify > 0 => {
                    " or by features (POST /v1/search/features)"
                }
                _ => "",
            }
        ))),
    }
}

/// The search a request's options ask for, within `limits` (400 past them).
pub fn checked_params(options: &SearchOptions, limits: &SearchLimits) -> ApiResult<SearchParams> {
    options
        .params(limits)
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

/// Everything but unreserved URL characters is escaped, `/` included: an id is one segment.
const ID_ESCAPES: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

pub fn thumbnail_url(id: &str) -> String {
    format!(
        "/v1/images/{}/thumbnail",
        percent_encoding::utf8_percent_encode(id, ID_ESCAPES)
    )
}

/// The search options a query string asks for a query of `kind`, read, checked and refused
/// as `craterdex serve` reads them (400 with the reason otherwise).
pub fn search_options(
    query: &str,
    limits: &SearchLimits,
    kind: QueryKind,
) -> ApiResult<SearchOptions> {
    let options: SearchOptions = serde_urlencoded::from_str(query)
        .map_err(|e| ApiError::bad_request(format!("Failed to deserialize query string: {e}")))?;
    checked_params(&options, limits)?;
    refuse(kind, &options)?;
    Ok(kind.effective(&options.within(limits)))
}

/// A posted body that is no features: malformed is a bad request, well-formed but unusable
/// content unprocessable.
fn posted_error(e: craterdex_model::Error) -> ApiError {
    match e {
        craterdex_model::Error::Invalid(m) => ApiError::bad_request(m),
        other => ApiError::new(http::StatusCode::UNPROCESSABLE_ENTITY, other.to_string()),
    }
}

/// The features of one image from a posted body, checked against the index's width `dim`.
pub fn posted_features(
    body: &[u8],
    content_type: &str,
    dim: usize,
) -> ApiResult<craterdex_model::extract::FeatureSet> {
    craterdex_model::posted::parse_features(body, content_type)
        .and_then(|f| craterdex_model::posted::check_features(f, dim))
        .map_err(posted_error)
}

/// The text fields of an entry form.
pub const ENTRY_FIELDS: [&str; 10] = [
    "id",
    "crater_id",
    "source",
    "view",
    "lat",
    "lon",
    "diameter_km",
    "x",
    "y",
    "diameter_px",
];

fn number_field(fields: &BTreeMap<String, String>, name: &str) -> ApiResult<Option<f64>> {
    match fields.get(name).map(|s| s.trim()).filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(s) => s
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .map(Some)
            .ok_or_else(|| ApiError::bad_request(format!("{name}: {s:?} is not a number"))),
    }
}

/// Free text is checked as sent: trimming first would let a trailing control character
/// (form feed, vertical tab) through the check the schema documents.
fn text_field(fields: &BTreeMap<String, String>, name: &str) -> ApiResult<Option<String>> {
    match fields
        .get(name)
        .map(String::as_str)
        .filter(|s| !s.is_empty())
    {
        None => Ok(None),
        Some(s) if s.chars().count() <= 256 && !s.chars().any(char::is_control) => {
            Ok(Some(s.to_string()))
        }
        Some(_) => Err(ApiError::bad_request(format!(
            "{name}: at most 256 characters, no control characters"
        ))),
    }
}

/// The metadata of an entry form's text fields, checked (400 naming the field). The id is
/// empty when none was given (an upload's id is then made from its bytes).
pub fn entry_meta(fields: &BTreeMap<String, String>) -> ApiResult<ImageMeta> {
    // Unlike the free-text fields an id is not trimmed: it is a key matched exactly.
    let id = fields.get("id").filter(|id| !id.is_empty()).cloned();
    if let Some(id) = &id {
        if !valid_id(id) {
            return Err(ApiError::bad_request(format!("invalid image id {id:?}")));
        }
    }
    let meta = ImageMeta {
        id: id.unwrap_or_default(),
        crater_id: text_field(fields, "crater_id")?,
        source: text_field(fields, "source")?,
        view: text_field(fields, "view")?,
        lat: number_field(fields, "lat")?,
        lon: number_field(fields, "lon")?,
        diameter_km: number_field(fields, "diameter_km")?,
        x: number_field(fields, "x")?,
        y: number_field(fields, "y")?,
        diameter_px: number_field(fields, "diameter_px")?,
        ..ImageMeta::default()
    };
    match meta.position_problem() {
        Some(problem) => Err(ApiError::bad_request(problem)),
        None => Ok(meta),
    }
}

/// The fields an entry form may carry besides `image`; any other is refused.
pub fn check_entry_fields<'a>(names: impl IntoIterator<Item = &'a str>) -> ApiResult<()> {
    match names.into_iter().find(|n| !ENTRY_FIELDS.contains(n)) {
        None => Ok(()),
        Some(name) => Err(ApiError::bad_request(format!(
            "unknown form field {name:?}; expected image and {ENTRY_FIELDS:?}"
        ))),
    }
}

/// The id of an upload that was given none: `upload-` and its bytes' SHA-256, cut.
pub fn upload_id(bytes: &[u8]) -> String {
    let digest = craterdex_model::store::sha256_hex(bytes);
    format!("upload-{}", &digest[..16])
}

/// Ids are opaque keys, never file names; still, refuse anything that could be mistaken for
/// a path or break a URL or a log line: segments of ASCII letters, digits and `-_.:+`, none
/// empty or starting with a dot, joined by `/` (the OpenAPI document's `ID_PATTERN`).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 256
        && !id.starts_with('/')
        && !id
            .split('/')
            .any(|part| part.is_empty() || part.starts_with('.'))
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:/+".contains(c))
}

/// Writes an upload's bytes into `dir`, named by their SHA-256 and `format`'s extension;
/// returns the file's path.
pub fn stored_upload(
    dir: &std::path::Path,
    bytes: &[u8],
    format: image::ImageFormat,
) -> ApiResult<String> {
    let digest = craterdex_model::store::sha256_hex(bytes);
    let ext = format.extensions_str().first().copied().unwrap_or("img");
    std::fs::create_dir_all(dir).io("create", dir)?;
    let file = dir.join(format!("{digest}.{ext}"));
    craterdex_durable::write_atomic(&file, bytes)?;
    let path = std::fs::canonicalize(&file).unwrap_or(file);
    Ok(path.display().to_string())
}

/// A PNG thumbnail, at most `size` pixels on its longer side, of the image file at `path`
/// (one the index records, never one a request names).
pub fn thumbnail_png(path: &std::path::Path, id: &str, size: u32) -> ApiResult<Vec<u8>> {
    let img = preprocess::load_image(path).map_err(|e| {
        ApiError::not_found(format!("the image file of {id:?} cannot be read: {e}"))
    })?;
    // Never enlarged: small crops are shown at their own size.
    let side = size.min(img.width().max(img.height()));
    let thumb = img.thumbnail(side, side).to_rgb8();
    let mut out = Cursor::new(Vec::new());
    thumb
        .write_to(&mut out, image::ImageFormat::Png)
        .map_err(ApiError::internal)?;
    Ok(out.into_inner())
}
