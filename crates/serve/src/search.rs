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
    Engine, Mode, QueryHits, SearchHit, SearchLimits, SearchOptions, SearchParams,
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

/// Turning or relighting needs the query image: only a search by image takes `turns` or
/// `opposite_sun`.
fn refuse_views(options: &SearchOptions) -> ApiResult<()> {
    if !options.views().is_plain() {
        return Err(ApiError::bad_request(
            "turns and opposite_sun need the query image: search by image (POST /v1/search/image)",
        ));
    }
    Ok(())
}

/// Verification needs the query's patch tokens: an image or posted features.
fn refuse_verify(options: &SearchOptions) -> ApiResult<()> {
    if options.verify > 0 {
        return Err(ApiError::bad_request(
            "verify needs the query's patch tokens: search by image (POST /v1/search/image) \
             or by features (POST /v1/search/features)",
        ));
    }
    Ok(())
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

fn first(mut hits: Vec<Vec<SearchHit>>) -> Vec<SearchHit> {
    hits.pop().unwrap_or_default()
}

fn first_named(hits: Vec<QueryHits>) -> Vec<SearchHit> {
    first(hits.into_iter().map(|q| q.results).collect())
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
        // the candidates' forward passes of a verified search count as search time
        let (hits, features, search) = if o.rechecks() {
            // extraction and search interleave (a query searched again is extracted again)
            let ids = ["query".to_string()];
            let images = std::slice::from_ref(&up.image);
            let hits = engine.search_decoded(&ids, images, &p, &o, ticket)?;
            (first_named(hits), None, ms(t))
        } else if o.verify > 0 {
            let ids = ["query".to_string()];
            let variants = engine.decoded_variant_features(
                &ids,
                std::slice::from_ref(&up.image),
                o.views(),
                ticket,
            )?;
            let features = ms(t);
            let t = Instant::now();
            let hits = engine.search_variants_verified(
                &ids,
                &variants,
                o.views(),
                &p,
                o.verify,
                ticket,
            )?;
            (first_named(hits), Some(features), ms(t))
        } else {
            let variants = engine.encode_image_variants(&up.image, o.views(), ticket)?;
            let features = ms(t);
            let t = Instant::now();
            let hits = first(engine.search_views(&[variants], o.views(), &p));
            (hits, Some(features), ms(t))
        };
        let timing = Timing {
            features,
            encode: None,
            search,
        };
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
    refuse_views(&o)?;
    let engine = svc.snapshot()?;
    if o.verify > 0 && engine.extractor().is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "verify runs the candidates' images through the model; this server has none loaded",
        ));
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let features = posted_features(&body, content_type, engine.index().feature_dim())?;
    Counters::count(&svc.counters.searches);
    let svc2 = svc.clone();
    run(admission, None, move |ticket| {
        let t = Instant::now();
        let (hits, timing) = if o.verify > 0 {
            let hits = engine.search_features_verified(&features, &p, o.verify, ticket)?;
            let timing = Timing {
                features: None,
                encode: None,
                search: ms(t),
            };
            (first_named(hits), timing)
        } else {
            let descs = engine.encode(&features);
            let encode = ms(t);
            let t = Instant::now();
            let hits = first(engine.search(&descs, &p));
            let timing = Timing {
                features: None,
                encode: Some(encode),
                search: ms(t),
            };
            (hits, timing)
        };
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
    refuse_views(&o)?;
    refuse_verify(&o)?;
    let engine = svc.snapshot()?;
    Counters::count(&svc.counters.searches);
    let svc2 = svc.clone();
    run(admission, None, move |_| {
        let t = Instant::now();
        let hits = engine.similar(&id, &p)?;
        let timing = Timing {
            features: None,
            encode: None,
            search: ms(t),
        };
        Ok(response(&svc2, hits, &p, QueryInfo::Indexed { id }, timing))
    })
    .await
}
