//! Searches: by an uploaded image, by posted backbone features, and by an indexed image's
//! stored descriptors. Each runs on a snapshot of the engine, off the async threads.

use crate::api::{
    ApiHit, ErrorBody, Features, ImageForm, ImageId, QueryInfo, SearchEcho, SearchResponse, Timing,
};
use crate::auth::{authorize, path_id};
use crate::error::{ApiError, ApiResult};
use crate::features::posted_features;
use crate::upload::{decode, read_multipart};
use crate::work::{run, Admission};
use crate::{Counters, Service, Svc};
use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Multipart, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::Extension;
use axum::Json;
use craterdex_engine::{
    Engine, Mode, QueryKind, SearchHit, SearchInput, SearchLimits, SearchOptions, SearchParams,
};
use std::sync::Arc;
use std::time::Instant;

/// The search a query string asks for, within the service's limits (a malformed or
/// out-of-range parameter is a bad request), and the options it was read from.
fn search_query(
    svc: &Service,
    q: Result<Query<SearchOptions>, QueryRejection>,
) -> ApiResult<(SearchOptions, SearchParams)> {
    let Query(options) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let params = checked_params(&options, &svc.config().limits)?;
    Ok((options, params))
}

/// Refuses, before any work, the options a query of `kind` cannot use
/// ([`QueryKind::refusal`]), saying which search takes them.
pub(crate) fn refuse(kind: QueryKind, options: &SearchOptions) -> ApiResult<()> {
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

/// The engine, refused with 501 when the server runs without a model.
pub fn image_engine(svc: &Service) -> ApiResult<Arc<Engine>> {
    let engine = svc.snapshot()?;
    if engine.extractor().is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "this server has no model loaded; search with features instead",
        ));
    }
    Ok(engine)
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

fn ms(t: Instant) -> f64 {
    (t.elapsed().as_secs_f64() * 1e6).round() / 1e3
}

fn response(
    svc: &Service,
    hits: Vec<SearchHit>,
    p: &SearchParams,
    query: QueryInfo,
    timing_ms: Timing,
) -> Json<SearchResponse> {
    let results = hits
        .into_iter()
        .map(|hit| ApiHit {
            thumbnail: thumbnail_url(&hit.id),
            hit: SearchHit {
                meta: svc.shown(hit.meta),
                ..hit
            },
        })
        .collect();
    Json(SearchResponse {
        query,
        params: SearchEcho {
            mode: p.mode,
            top_k: p.top_k,
            shortlist: (p.mode == Mode::TwoStage).then_some(p.shortlist),
        },
        timing_ms,
        results,
        partial: false,
        missing_shards: Vec::new(),
    })
}

/// The engine's timing as a response shows it, to the microsecond.
fn timing_of(t: &craterdex_engine::Timing) -> Timing {
    let us = |ms: f64| (ms * 1e3).round() / 1e3;
    Timing {
        features: t.features_ms.map(us),
        encode: t.encode_ms.map(us),
        search: us(t.search_ms),
    }
}

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
pub async fn search_image(
    State(svc): State<Svc>,
    Extension(admission): Extension<Admission>,
    headers: HeaderMap,
    q: Result<Query<SearchOptions>, QueryRejection>,
    mp: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> ApiResult<Json<SearchResponse>> {
    authorize(&svc, &headers, false)?;
    let (o, p) = search_query(&svc, q)?;
    let mp = mp.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let (bytes, _) = read_multipart(mp, &[]).await?;
    let engine = image_engine(&svc)?;
    Counters::count(&svc.counters.image_searches);
    let svc2 = svc.clone();
    run(admission, None, move |ticket| {
        let t = Instant::now();
        let up = decode(&svc2, &engine, bytes)?;
        let decoding = ms(t);
        let ids = ["query".to_string()];
        let input = SearchInput::Decoded {
            ids: &ids,
            images: std::slice::from_ref(&up.image),
        };
        let answer = engine.search(input, &o, ticket)?;
        // decoding the upload counts as its forward pass's time, or as search where the
        // forward passes count as search (a rechecked search extracts as it searches)
        let mut timing = timing_of(&answer.timing);
        match &mut timing.features {
            Some(f) => *f += decoding,
            None => timing.search += decoding,
        }
        let hits = answer.into_first();
        let query = QueryInfo::Image {
            width: up.width,
            height: up.height,
            bytes: up.bytes.len(),
        };
        Ok(response(&svc2, hits, &p, query, timing))
    })
    .await
}

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
pub async fn search_features(
    State(svc): State<Svc>,
    Extension(admission): Extension<Admission>,
    headers: HeaderMap,
    q: Result<Query<SearchOptions>, QueryRejection>,
    body: Bytes,
) -> ApiResult<Json<SearchResponse>> {
    authorize(&svc, &headers, false)?;
    let (o, p) = search_query(&svc, q)?;
    refuse(QueryKind::Features, &o)?;
    let engine = svc.snapshot()?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let features = posted_features(&body, content_type, engine.index().feature_dim())?;
    Counters::count(&svc.counters.searches);
    let svc2 = svc.clone();
    run(admission, None, move |ticket| {
        let answer = engine.search(SearchInput::Features(&features), &o, ticket)?;
        let timing = timing_of(&answer.timing);
        let hits = answer.into_first();
        Ok(response(&svc2, hits, &p, QueryInfo::Features, timing))
    })
    .await
}

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
pub async fn search_similar(
    State(svc): State<Svc>,
    Extension(admission): Extension<Admission>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<SearchOptions>, QueryRejection>,
) -> ApiResult<Json<SearchResponse>> {
    authorize(&svc, &headers, false)?;
    let id = path_id(id)?;
    let (o, p) = search_query(&svc, q)?;
    refuse(QueryKind::Indexed, &o)?;
    let engine = svc.snapshot()?;
    Counters::count(&svc.counters.searches);
    let svc2 = svc.clone();
    run(admission, None, move |ticket| {
        let answer = engine.search(SearchInput::Indexed(&id), &o, ticket)?;
        let timing = timing_of(&answer.timing);
        let hits = answer.into_first();
        Ok(response(&svc2, hits, &p, QueryInfo::Indexed { id }, timing))
    })
    .await
}
