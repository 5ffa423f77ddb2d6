//! The service itself: liveness, readiness, statistics, its OpenAPI document and the page.

use crate::api::{ErrorBody, HealthResponse, ReadyResponse, Requests, StatsResponse};
use crate::auth::authorize;
use crate::error::ApiResult;
use crate::Svc;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::sync::atomic::Ordering;

/// Liveness: the process answers.
#[utoipa::path(get, path = "/v1/health", responses((status = 200, description = "alive", body = HealthResponse)))]
pub async fn health() -> Json<HealthResponse> {
    Json(HealthResponse {
        status: "ok".into(),
    })
}

/// Readiness: index (and model) loaded and not shutting down.
#[utoipa::path(
    get,
    path = "/v1/ready",
    responses(
        (status = 200, description = "ready", body = ReadyResponse),
        (status = 503, description = "loading, failed to load, or shutting down", body = ReadyResponse),
    )
)]
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

/// Index statistics (what `craterdex index info` prints) and request counters.
#[utoipa::path(
    get,
    path = "/v1/stats",
    responses(
        (status = 200, description = "statistics", body = StatsResponse),
        (status = 401, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
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

/// This document.
#[utoipa::path(get, path = "/v1/openapi.json", responses((status = 200, description = "OpenAPI 3.1")))]
pub async fn openapi(State(svc): State<Svc>) -> Response {
    let feature_dim = svc.snapshot().ok().map(|e| e.index().feature_dim());
    Json(crate::openapi::document(svc.config(), feature_dim)).into_response()
}
