//! Routes, limits (body size, concurrency with load shedding, timeouts) and the counting of
//! client errors.

use crate::error::ApiError;
use crate::images::{add_image, image_meta, remove_image, thumbnail};
use crate::link::link_image;
use crate::register::register_source;
use crate::search::{search_features, search_image, search_similar};
use crate::status::{health, openapi, ready, stats};
use crate::Svc;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{Html, Response};
use axum::routing::{get, post};
use axum::{BoxError, Router};
use tower::limit::GlobalConcurrencyLimitLayer;
use tower::ServiceBuilder;
use tower_http::timeout::TimeoutLayer;

/// The whole application: page, OpenAPI document and `/v1`.
pub fn router(svc: Svc) -> Router {
    let c = svc.config().clone();
    // One semaphore per group, shared by all its routes (a plain ConcurrencyLimitLayer would
    // give each route its own).
    let shed = |limit: usize| {
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(overloaded))
            .load_shed()
            .layer(GlobalConcurrencyLimitLayer::new(limit))
    };
    let image_work = Router::new()
        .route("/v1/search/image", post(search_image))
        .route("/v1/images", post(add_image))
        .route("/v1/link", post(link_image))
        .layer(shed(c.max_concurrent_images));
    let search_work = Router::new()
        .route("/v1/search/features", post(search_features))
        .route("/v1/images/{id}/similar", get(search_similar))
        .route("/v1/images/{id}/thumbnail", get(thumbnail))
        .route("/v1/images/{id}", get(image_meta).delete(remove_image))
        .route("/v1/stats", get(stats))
        .route("/v1/register", post(register_source))
        .merge(image_work)
        .layer(shed(c.max_concurrent))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            c.request_timeout,
        ));
    Router::new()
        .route("/", get(|| async { Html(crate::adapter::PAGE) }))
        .route("/v1/health", get(health))
        .route("/v1/ready", get(ready))
        .route("/v1/openapi.json", get(openapi))
        .merge(search_work)
        .fallback(|| async { ApiError::not_found("no such endpoint; see /v1/openapi.json") })
        .layer(DefaultBodyLimit::max(c.max_upload_bytes))
        .layer(axum::middleware::from_fn_with_state(
            svc.clone(),
            count_client_errors,
        ))
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

async fn overloaded(err: BoxError) -> ApiError {
    if err.is::<tower::load_shed::error::Overloaded>() {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many requests in flight; retry shortly",
        )
    } else {
        ApiError::internal(err)
    }
}
