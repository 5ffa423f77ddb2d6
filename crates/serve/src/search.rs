//! Searches: by an uploaded image, by posted backbone features, and by an indexed image's
//! stored descriptors. Each runs on a snapshot of the engine, off the async threads.

use crate::auth::{authorize, path_id};
use crate::error::{ApiError, ApiResult};
use crate::upload::{decode, read_multipart};
use crate::work::{run, Admission};
use crate::{Counters, Service, Svc};
use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Multipart, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::Extension;
use axum::Json;
use craterdex_api::readers::{checked_params, posted_features, refuse, thumbnail_url};
use craterdex_api::types::{ApiHit, QueryInfo, SearchEcho, SearchResponse, Timing};
use craterdex_engine::{
    Engine, Mode, QueryKind, SearchHit, SearchInput, SearchOptions, SearchParams,
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
    let limits = &svc.config().limits;
    let params = checked_params(&options, limits)?;
    Ok((options.within(limits), params))
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

/// `POST /v1/search/image`: [`craterdex_api::paths::search_image`].
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

/// `POST /v1/search/features`: [`craterdex_api::paths::search_features`].
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

/// `GET /v1/images/{id}/similar`: [`craterdex_api::paths::search_similar`].
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
