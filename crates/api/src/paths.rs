//! Every route of the API as the OpenAPI document declares it: its method and path, what it
//! takes and answers, and its description. The functions are markers the document is
//! generated from; `craterdex serve`'s handlers of the same names answer the routes, and
//! `craterdex.cluster`'s router answers the same document.
#![allow(dead_code)]

use crate::types::*;
use craterdex_engine::SearchOptions;
use craterdex_workflows::SourceRegistration;

/// Liveness: the process answers.
#[utoipa::path(get, path = "/v1/health", responses((status = 200, description = "alive", body = HealthResponse)))]
pub fn health() {}

/// Readiness: index (and model) loaded and not shutting down.
#[utoipa::path(
    get,
    path = "/v1/ready",
    responses(
        (status = 200, description = "ready", body = ReadyResponse),
        (status = 503, description = "loading, failed to load, or shutting down", body = ReadyResponse),
    )
)]
pub fn ready() {}

/// Index statistics (what `craterdex index info` prints) and request counters.
#[utoipa::path(
    get,
    path = "/v1/stats",
    responses(
        (status = 200, description = "statistics", body = StatsResponse),
        (status = 401, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
pub fn stats() {}

/// This document.
#[utoipa::path(get, path = "/v1/openapi.json", responses((status = 200, description = "OpenAPI 3.1")))]
pub fn openapi() {}

/// Search with an uploaded image (needs a model).
#[utoipa::path(
    post,
    path = "/v1/search/image",
    params(SearchOptions),
    request_body(content = ImageForm, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "ranked results", body = SearchResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 501, body = ErrorBody),
        (status = 503, body = ErrorBody),
    )
)]
pub fn search_image() {}

/// Search with precomputed backbone features: JSON, or a safetensors file as `craterdex
/// extract` writes it for one image (`cls`, `patch_tokens`, `attention`; f32 or f16; faster
/// to send and parse).
#[utoipa::path(
    post,
    path = "/v1/search/features",
    params(SearchOptions),
    request_body(content(
        (Features = "application/json"),
        (Vec<u8> = "application/octet-stream"),
    )),
    responses(
        (status = 200, description = "ranked results", body = SearchResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
pub fn search_features() {}

/// Search with an indexed image's stored descriptors.
#[utoipa::path(
    get,
    path = "/v1/images/{id}/similar",
    params(ImageId, SearchOptions),
    responses(
        (status = 200, description = "ranked results", body = SearchResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
pub fn search_similar() {}

/// Metadata of an indexed image.
#[utoipa::path(
    get,
    path = "/v1/images/{id}",
    params(ImageId),
    responses(
        (status = 200, description = "metadata", body = ImageResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
pub fn image_meta() {}

/// PNG thumbnail of an indexed image.
#[utoipa::path(
    get,
    path = "/v1/images/{id}/thumbnail",
    params(ImageId, ThumbnailQuery),
    responses(
        (status = 200, description = "PNG", content_type = "image/png"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
pub fn thumbnail() {}

/// Add an image to the index (API key).
#[utoipa::path(
    post,
    path = "/v1/images",
    request_body(content = EntryForm, content_type = "multipart/form-data"),
    security(("apiKey" = []), ("bearer" = [])),
    responses(
        (status = 201, description = "added", body = AddedResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 501, body = ErrorBody),
        (status = 503, body = ErrorBody),
    )
)]
pub fn add_image() {}

/// Remove an image from the index (API key).
#[utoipa::path(
    delete,
    path = "/v1/images/{id}",
    params(ImageId),
    security(("apiKey" = []), ("bearer" = [])),
    responses(
        (status = 200, description = "removed", body = RemovedResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody),
    )
)]
pub fn remove_image() {}

/// Link an image of a crater to the index: match, new or ambiguous, with the evidence
/// (`insert=true` adds it when new; API key). A crop whose `source` was registered before
/// (`POST /v1/register`) is placed by that transform and compared turned as the catalogue
/// sees it; otherwise its position is taken as given.
#[utoipa::path(
    post,
    path = "/v1/link",
    params(LinkQuery),
    request_body(content = EntryForm, content_type = "multipart/form-data"),
    security((), ("apiKey" = []), ("bearer" = [])),
    responses(
        (status = 200, description = "the decision", body = LinkResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 501, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
pub fn link_image() {}

/// Find the craters of a whole new image and link them to the catalogue: the image's craters
/// are detected (the server's `--detector`), the image is registered to the catalogue by
/// their pattern (turned and scaled any way), every catalogue crater the registration places
/// inside it is looked for where it should be, and each crater is decided `match`, `new`,
/// `ambiguous` or `unconfirmed` (a catalogue crater placed here that does not look like its
/// entry). Nothing is added. Bounded as an image search is (the server's largest image side,
/// the model's slots and the request timeout); 501 when the server has no detector.
#[utoipa::path(
    post,
    path = "/v1/link/image",
    request_body(content = ImageForm, content_type = "multipart/form-data"),
    security((), ("apiKey" = []), ("bearer" = [])),
    responses(
        (status = 200, description = "the image's craters and their decisions", body = ImageLinkResponse),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 408, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 422, body = ErrorBody),
        (status = 501, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
pub fn link_whole_image() {}

/// Register a new image's craters to the catalogue by their pattern (rotation, scale and
/// shift found by pattern matching with a significance test), so that its crops linked
/// afterwards with the same `source` are placed and turned as the catalogue sees them.
#[utoipa::path(
    post,
    path = "/v1/register",
    request_body = RegisterRequest,
    security((), ("apiKey" = []), ("bearer" = [])),
    responses(
        (status = 200, description = "the registration (registered or why not)", body = SourceRegistration),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
pub fn register_source() {}
