//! The access log: one structured `tracing` event per request (method, path, status,
//! latency, request id) under the target `craterdex_serve::access`, and the request id
//! answered in `x-request-id`: the client's own when it sends a usable one (a proxy's), a
//! new one otherwise, so that a client's report and the log meet on one line.

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const HEADER: &str = "x-request-id";

/// Ids a client may choose: short, and plain enough to write into a log line as they are.
fn usable(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

/// A new id: this process's start (so ids differ across restarts) and a counter.
fn new_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static EPOCH: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let epoch = EPOCH.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    format!("{epoch:x}-{:x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

pub async fn log(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = req
        .headers()
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| usable(v))
        .map_or_else(new_id, str::to_string);
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let mut resp = next.run(req).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert(HEADER, v);
    }
    tracing::info!(
        target: "craterdex_serve::access",
        method = %method,
        path = %path,
        status = resp.status().as_u16(),
        latency_ms = (started.elapsed().as_secs_f64() * 1e4).round() / 10.0,
        request_id = %id,
        "request"
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_short_ids_are_taken_from_clients() {
        assert!(usable("abc-123_x.y:z"));
        assert!(!usable(""));
        assert!(!usable(&"a".repeat(65)));
        assert!(!usable("a b"));
        assert!(!usable("a\nb"));
        assert!(!usable("id\"quote"));
        let (a, b) = (new_id(), new_id());
        assert_ne!(a, b);
        assert!(usable(&a));
    }
}
