//! The service itself: liveness, readiness, statistics, its OpenAPI document and the page.

use crate::auth::authorize;
use crate::error::ApiResult;
use crate::Svc;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use craterdex_api::types::{HealthResponse, ReadyResponse, Requests, StatsResponse};
use std::sync::atomic::Ordering;

/// `GET /v1/health`: [`craterdex_api::paths::health`].
pub async fn health() -> Json<HealthResponse> {
    Json(HealthResponse {
        status: "ok".into(),
    })
}

/// `GET /v1/ready`: [`craterdex_api::paths::ready`].
pub async fn ready(State(svc): State<Svc>) -> Response {
    let unready = |reason: String| {
        let body = ReadyResponse {
            ready: false,
            images: None,
            image_search: None,
            reason: Some(reason),
        };
        (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
    };
    if svc.draining.load(Ordering::SeqCst) {
        return unready("shutting down".into());
    }
    let load_error = svc
        .load_error
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if let Some(e) = load_error {
        return unready(format!("loading failed: {e}"));
    }
    match svc.snapshot() {
        Ok(engine) => Json(ReadyResponse {
            ready: true,
            images: Some(engine.index().live()),
            image_search: Some(engine.extractor().is_some()),
            reason: None,
        })
        .into_response(),
        Err(_) => unready("loading the index and model".into()),
    }
}

/// `GET /v1/stats`: [`craterdex_api::paths::stats`].
pub async fn stats(State(svc): State<Svc>, headers: HeaderMap) -> ApiResult<Json<StatsResponse>> {
    authorize(&svc, &headers, false)?;
    let engine = svc.snapshot()?;
    let c = &svc.counters;
    let n = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
    Ok(Json(StatsResponse {
        index: engine.info(),
        writes_enabled: svc.config().api_key.is_some(),
        requests: Requests {
            searches: n(&c.searches),
            image_searches: n(&c.image_searches),
            added: n(&c.added),
            removed: n(&c.removed),
            client_errors: n(&c.client_errors),
        },
    }))
}

/// `GET /v1/openapi.json`: [`craterdex_api::paths::openapi`].
pub async fn openapi(State(svc): State<Svc>) -> Response {
    let feature_dim = svc.snapshot().ok().map(|e| e.index().feature_dim());
    Json(craterdex_api::document(&svc.config().limits, feature_dim)).into_response()
}
