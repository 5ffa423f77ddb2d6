//! What the service tells Prometheus at `GET /metrics` (OpenMetrics text): requests by route,
//! method and status; latency histograms by route; work in flight and the slots it holds
//! (model work included: requests waiting on the model hold an image slot); the index's
//! images and segments.

use crate::auth::authorize;
use crate::error::{ApiError, ApiResult};
use crate::Svc;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::time::Instant;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    method: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupLabels {
    group: String,
}

/// Latency buckets: 1 ms doubling to about 33 s (past the default timeout of 30).
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The service's metrics and the registry that encodes them.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram, fn() -> Histogram>,
    in_flight: Family<GroupLabels, Gauge>,
    slots: Family<GroupLabels, Gauge>,
    images: Gauge,
    segments: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("craterdex");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency: Family<RouteLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        let in_flight = Family::<GroupLabels, Gauge>::default();
        let slots = Family::<GroupLabels, Gauge>::default();
        let (images, segments) = (Gauge::default(), Gauge::default());
        registry.register(
            "http_requests",
            "Requests answered, by route template, method and status",
            requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "Time from a request's head to its answer, by route template",
            latency.clone(),
        );
        registry.register(
            "work_in_flight",
            "Slots taken by work running now, given-up work that has not stopped yet included (group search: every request doing work; image: those running the model)",
            in_flight.clone(),
        );
        registry.register(
            "work_slots",
            "Slots of each group (--max-concurrent, --max-concurrent-images)",
            slots.clone(),
        );
        registry.register("index_images", "Live images in the index", images.clone());
        registry.register(
            "index_segments",
            "Segments of the index (merged in the background)",
            segments.clone(),
        );
        Self {
            registry,
            requests,
            latency,
            in_flight,
            slots,
            images,
            segments,
        }
    }
}

/// Counts every answered request and times it, by the route template it matched (never
/// the raw path: ids would make a series each).
pub async fn observe(State(svc): State<Svc>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str)
        .to_string();
    let method = req.method().to_string();
    let started = Instant::now();
    let resp = next.run(req).await;
    let m = &svc.metrics;
    m.requests
        .get_or_create(&RequestLabels {
            route: route.clone(),
            method,
            status: resp.status().as_u16().to_string(),
        })
        .inc();
    m.latency
        .get_or_create(&RouteLabels { route })
        .observe(started.elapsed().as_secs_f64());
    resp
}

/// Metrics in the Prometheus text format (OpenMetrics); open like the other reads.
pub async fn metrics(State(svc): State<Svc>, headers: HeaderMap) -> ApiResult<Response> {
    authorize(&svc, &headers, false)?;
    let m = &svc.metrics;
    for (group, slots, capacity) in [
        ("search", &svc.search_slots, svc.config().max_concurrent),
        (
            "image",
            &svc.image_slots,
            svc.config().max_concurrent_images,
        ),
    ] {
        let labels = GroupLabels {
            group: group.into(),
        };
        let capacity = capacity.max(1);
        let taken = capacity.saturating_sub(slots.available_permits());
        m.in_flight.get_or_create(&labels).set(taken as i64);
        m.slots.get_or_create(&labels).set(capacity as i64);
    }
    if let Ok(engine) = svc.snapshot() {
        m.images.set(engine.index().live() as i64);
        m.segments.set(engine.index().segment_count() as i64);
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &m.registry)
        .map_err(ApiError::internal)?;
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        )],
        text,
    )
        .into_response())
}
