//! Routes, limits (body size, concurrency with load shedding, timeouts) and the counting of
//! client errors.

use crate::error::ApiError;
use crate::images::{add_image, image_meta, remove_image, thumbnail};
use crate::link::{link_image, link_whole_image};
use crate::register::register_source;
use crate::search::{search_features, search_image, search_similar};
use crate::status::{health, openapi, ready, stats};
use crate::Svc;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tower_http::timeout::TimeoutLayer;

/// The whole application: page, OpenAPI document and `/v1`.
pub fn router(svc: Svc) -> Router {
    let c = svc.config().clone();
    // Every request that does work takes one of `max_concurrent` slots, and one that runs
    // the model also one of `max_concurrent_images`; each slot is held until the work has
    // ended, so a request given up (a timeout) keeps its slots until its work has stopped.
    let admit = |slots: &Arc<Semaphore>| {
        axum::middleware::from_fn_with_state(slots.clone(), crate::work::admit)
    };
    let image_reads = Router::new()
        .route("/v1/search/image", post(search_image))
        .route("/v1/link/image", post(link_whole_image))
        .layer(admit(&svc.image_slots));
    let reads = Router::new()
        .route("/v1/search/features", post(search_features))
        .route("/v1/images/{id}/similar", get(search_similar))
        .route("/v1/images/{id}/thumbnail", get(thumbnail))
        .route("/v1/stats", get(stats))
        .merge(image_reads)
        .layer(admit(&svc.search_slots))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            c.request_timeout,
        ));
    // Writes answer their own timeouts ([`crate::work::run`]): one that has passed its
    // commit point is answered with its outcome, never with a 408 over a done write.
    let image_writes = Router::new()
        .route("/v1/images", post(add_image))
        .route("/v1/link", post(link_image))
        .layer(admit(&svc.image_slots));
    let writes = Router::new()
        .route("/v1/images/{id}", get(image_meta).delete(remove_image))
        .route("/v1/register", post(register_source))
        .merge(image_writes)
        .layer(admit(&svc.search_slots));
    Router::new()
        .route("/", get(|| async { Html(craterdex_api::page::PAGE) }))
        .route("/v1/health", get(health))
        .route("/v1/ready", get(ready))
        .route("/v1/openapi.json", get(openapi))
        .route("/metrics", get(crate::metrics::metrics))
        .merge(reads)
        .merge(writes)
        .fallback(|| async { ApiError::not_found("no such endpoint; see /v1/openapi.json") })
        .layer(DefaultBodyLimit::max(c.max_upload_bytes))
        .layer(axum::middleware::from_fn_with_state(
            svc.clone(),
            count_client_errors,
        ))
        .layer(axum::middleware::from_fn_with_state(
            svc.clone(),
            crate::metrics::observe,
        ))
        .layer(axum::middleware::map_response_with_state(
            c.request_timeout,
            json_errors,
        ))
        .layer(axum::middleware::from_fn_with_state(
            svc.clone(),
            crate::guard::guard,
        ))
        // outermost: every request is logged, those the guard refuses included
        .layer(axum::middleware::from_fn(crate::access::log))
        .with_state(svc)
}

async fn count_client_errors(
    State(svc): State<Svc>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let resp = next.run(req).await;
    if resp.status().is_client_error() {
        crate::Counters::count(&svc.counters.client_errors);
    }
    resp
}

/// The largest error body read back to be rewritten as JSON: the framework's own are a line.
const PLAIN_ERROR_BYTES: usize = 4096;

/// Every error answered as the documented JSON (`{"error": {"status", "message"}}`), those
/// of the framework and its layers included: a timeout's empty 408, a wrong method's 405, a
/// body over the limit's plain-text 413.
async fn json_errors(State(timeout): State<std::time::Duration>, resp: Response) -> Response {
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, PLAIN_ERROR_BYTES)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = match status {
        StatusCode::REQUEST_TIMEOUT => format!(
            "the request took longer than the server's timeout ({} s); its work was stopped",
            timeout.as_secs()
        ),
        StatusCode::METHOD_NOT_ALLOWED => "this endpoint does not take that method; see \
             /v1/openapi.json"
            .to_string(),
        _ if !text.is_empty() => text,
        _ => status.canonical_reason().unwrap_or("error").to_lowercase(),
    };
    let mut json = ApiError::new(status, message).into_response();
    // what the framework set besides the body (Allow on a 405) stays
    for (name, value) in &parts.headers {
        if name != axum::http::header::CONTENT_TYPE && name != axum::http::header::CONTENT_LENGTH {
            json.headers_mut().insert(name, value.clone());
        }
    }
    json
}
