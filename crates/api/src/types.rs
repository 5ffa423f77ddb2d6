//! What the API takes and answers, as Rust types: front ends read and build these, and the
//! OpenAPI document is generated from them (`openapi.rs`), so the two cannot drift apart.

use craterdex_engine::{ImageMeta, IndexInfo, SearchHit};
use craterdex_workflows::{Candidate, Decision};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// An indexed image, named in the path.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ImageId {
    /// The image id: an opaque key of segments of letters, digits and `-_.:+`, none
    /// starting with a dot, joined by `/` (percent-encoded in the path; `auth::valid_id`).
    #[param(
        pattern = "^[A-Za-z0-9_:+-][A-Za-z0-9._:+-]*(/[A-Za-z0-9_:+-][A-Za-z0-9._:+-]*)*$",
        max_length = 256
    )]
    pub id: String,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ThumbnailQuery {
    /// Longest side in pixels (never enlarged beyond the image's own).
    #[param(minimum = 16, maximum = 512, default = 160)]
    pub size: Option<u32>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LinkQuery {
    /// Add the entry when it is decided `new` (needs the API key); decided and added under
    /// the writer lock, so concurrent links see each other.
    #[serde(default)]
    #[param(default = false)]
    pub insert: bool,
}

/// An image upload for a search.
#[allow(dead_code)] // a schema: the form is read part by part (`upload.rs`)
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageForm {
    /// JPEG, PNG, TIFF or PNM.
    #[schema(value_type = String, format = Binary)]
    pub image: Vec<u8>,
}

/// An image upload with what is known of its crater (an add or a link).
#[allow(dead_code)] // a schema: the form is read part by part (`upload.rs`)
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EntryForm {
    /// JPEG, PNG, TIFF or PNM.
    #[schema(value_type = String, format = Binary)]
    pub image: Vec<u8>,
    /// Default: `upload-<sha256 prefix>`.
    #[schema(
        nullable = false,
        max_length = 256,
        pattern = "^$|^[A-Za-z0-9_:+-][A-Za-z0-9._:+-]*(/[A-Za-z0-9_:+-][A-Za-z0-9._:+-]*)*$"
    )]
    pub id: Option<String>,
    #[schema(
        nullable = false,
        max_length = 256,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*$"
    )]
    pub crater_id: Option<String>,
    #[schema(
        nullable = false,
        max_length = 256,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*$"
    )]
    pub source: Option<String>,
    #[schema(
        nullable = false,
        max_length = 256,
        pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*$"
    )]
    pub view: Option<String>,
    #[schema(nullable = false, minimum = -90, maximum = 90)]
    pub lat: Option<f64>,
    #[schema(nullable = false, minimum = -360, maximum = 360)]
    pub lon: Option<f64>,
    #[schema(nullable = false, minimum = 1e-6, maximum = 1e5)]
    pub diameter_km: Option<f64>,
    /// Centre and diameter in the `source` image's pixels (what `POST /v1/register` took).
    #[schema(nullable = false, minimum = -1e9, maximum = 1e9)]
    pub x: Option<f64>,
    #[schema(nullable = false, minimum = -1e9, maximum = 1e9)]
    pub y: Option<f64>,
    #[schema(nullable = false, minimum = 1e-6, maximum = 1e9)]
    pub diameter_px: Option<f64>,
}

/// Backbone features of one image as JSON.
#[allow(dead_code)] // a schema: the body is read by `craterdex_model::posted::parse_features`
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Features {
    /// `[D]` CLS token after the final norm.
    pub cls: Vec<f32>,
    /// `[T, D]` patch tokens, flat or nested.
    #[schema(schema_with = patches_schema)]
    pub patches: Vec<f32>,
    /// `[T]` last-layer CLS-to-patch attention.
    pub attention: Vec<f32>,
}

fn patches_schema() -> utoipa::openapi::Schema {
    use utoipa::openapi::{schema::ArrayBuilder, ObjectBuilder, OneOfBuilder, Type};
    let number = || ObjectBuilder::new().schema_type(Type::Number);
    OneOfBuilder::new()
        .description(Some("[T, D] patch tokens, flat or nested"))
        .item(ArrayBuilder::new().items(number()))
        .item(ArrayBuilder::new().items(ArrayBuilder::new().items(number())))
        .build()
        .into()
}

/// What a search was asked with.
#[derive(Serialize, ToSchema)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum QueryInfo {
    /// An uploaded image.
    Image {
        width: u32,
        height: u32,
        bytes: usize,
    },
    /// Posted backbone features.
    Features,
    /// An indexed image's stored descriptors.
    Indexed { id: String },
}

/// The search as it ran.
#[derive(Serialize, ToSchema)]
pub struct SearchEcho {
    #[schema(value_type = String)]
    pub mode: craterdex_engine::Mode,
    pub top_k: usize,
    /// The shortlist size S (two-stage only).
    pub shortlist: Option<usize>,
}

/// Milliseconds per step.
#[derive(Serialize, ToSchema)]
pub struct Timing {
    /// The forward pass of an uploaded image (left out where a rechecked search interleaves
    /// extraction with search: all of it counts as search).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub features: Option<f64>,
    /// Encoding the query's features into descriptors (left out where it counts as search).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encode: Option<f64>,
    pub search: f64,
}

/// A hit and where its thumbnail is.
#[derive(Serialize, ToSchema)]
pub struct ApiHit {
    #[serde(flatten)]
    pub hit: SearchHit,
    pub thumbnail: String,
}

#[derive(Serialize, ToSchema)]
pub struct SearchResponse {
    pub query: QueryInfo,
    pub params: SearchEcho,
    pub timing_ms: Timing,
    pub results: Vec<ApiHit>,
    /// Some shards of a cluster (`craterdex.cluster`) did not answer: `results` are the
    /// other shards' hits. Always false from `craterdex serve` (one index).
    pub partial: bool,
    /// The shards that did not answer, by name.
    pub missing_shards: Vec<String>,
}

#[derive(Serialize, ToSchema)]
pub struct ImageResponse {
    pub id: String,
    pub meta: ImageMeta,
    pub thumbnail: String,
}

#[derive(Serialize, ToSchema)]
pub struct AddedResponse {
    pub id: String,
    /// Images the index now holds.
    pub images: usize,
    pub thumbnail: String,
}

#[derive(Serialize, ToSchema)]
pub struct RemovedResponse {
    pub removed: String,
    /// Images the index now holds.
    pub images: usize,
}

/// A link candidate and where its thumbnail is.
#[derive(Serialize, ToSchema)]
pub struct LinkCandidate {
    #[serde(flatten)]
    pub candidate: Candidate,
    pub thumbnail: String,
}

#[derive(Serialize, ToSchema)]
pub struct LinkResponse {
    pub query: ImageMeta,
    pub decision: Decision,
    #[schema(minimum = 0, maximum = 1)]
    pub confidence: f64,
    pub best: Option<LinkCandidate>,
    /// The best candidate of another crater than `best`.
    pub second: Option<LinkCandidate>,
    pub inserted: bool,
    /// Images the index now holds.
    pub images: usize,
    /// Where the decision rule came from (its calibration, or the default).
    pub rule: String,
    /// The entry was placed by its source's registration (`POST /v1/register`).
    pub registered: bool,
    /// Its source's registration, when the source was registered before.
    pub registration: Option<craterdex_workflows::SourceRegistration>,
}

/// One crater of a whole image linked to the catalogue (`POST /v1/link/image`).
#[derive(Serialize, ToSchema)]
pub struct ImageCraterLink {
    pub id: String,
    /// Centre and diameter in the uploaded image's pixels.
    pub x: f64,
    pub y: f64,
    pub diameter_px: f64,
    pub found_by: craterdex_workflows::images::FoundBy,
    /// The detector's likelihood (craters the detector found).
    pub detector_score: Option<f32>,
    pub decision: craterdex_workflows::images::ImageDecision,
    #[schema(minimum = 0, maximum = 1)]
    pub confidence: f64,
    /// The catalogue entry it was compared with last: its match when decided `match`.
    pub best: Option<LinkCandidate>,
    pub second: Option<LinkCandidate>,
}

/// A whole image's craters, detected and looked for where the catalogue's should be, each
/// linked to the catalogue.
#[derive(Serialize, ToSchema)]
pub struct ImageLinkResponse {
    /// What was found, the image's registration to the catalogue by crater pattern, and why
    /// its results are weaker where they are.
    pub image: craterdex_workflows::images::ImageSummary,
    pub craters: Vec<ImageCraterLink>,
    /// The detector that found the craters.
    pub detector: String,
    /// The arithmetic it ran in (`serve --detector-precision`): f32, bf16 or int8.
    pub detector_precision: String,
    /// Where the decision rule came from.
    pub rule: String,
}

/// Requests answered since the server started.
#[derive(Serialize, ToSchema)]
pub struct Requests {
    pub searches: u64,
    pub image_searches: u64,
    pub added: u64,
    pub removed: u64,
    pub client_errors: u64,
}

#[derive(Serialize, ToSchema)]
pub struct StatsResponse {
    #[serde(flatten)]
    pub index: IndexInfo,
    pub writes_enabled: bool,
    pub requests: Requests,
}

#[derive(Serialize, ToSchema)]
pub struct HealthResponse {
    pub status: String,
}

#[derive(Serialize, ToSchema)]
pub struct ReadyResponse {
    pub ready: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub images: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_search: Option<bool>,
    /// Why the server is not ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Every failed request: `{"error": {"status", "message"}}`.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    pub status: u16,
    pub message: String,
}

/// The craters of one new image (its `source`), in its pixel frame or on the body.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterRequest {
    /// The image's name, as the `source` field of the crops then linked.
    #[schema(min_length = 1, max_length = 256)]
    pub source: String,
    #[schema(min_items = 1)]
    pub craters: Vec<CraterPosition>,
}

/// A crater's centre and diameter: `x`, `y`, `diameter_px` in the image, or `lat`, `lon`,
/// `diameter_km` on the body.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CraterPosition {
    #[schema(nullable = false, minimum = -1e9, maximum = 1e9)]
    pub x: Option<f64>,
    #[schema(nullable = false, minimum = -1e9, maximum = 1e9)]
    pub y: Option<f64>,
    #[schema(nullable = false, minimum = 1e-6, maximum = 1e9)]
    pub diameter_px: Option<f64>,
    #[schema(nullable = false, minimum = -90, maximum = 90)]
    pub lat: Option<f64>,
    #[schema(nullable = false, minimum = -360, maximum = 360)]
    pub lon: Option<f64>,
    #[schema(nullable = false, minimum = 1e-6, maximum = 1e5)]
    pub diameter_km: Option<f64>,
}
