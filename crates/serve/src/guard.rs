//! What a browser may make the server do: requests are answered only for the host names the
//! server serves (a DNS-rebinding page names its own), requests that change state or run the
//! model only from the server's own page or from clients that are no browser page (a
//! cross-site form or script is refused before its body is read), and every response tells
//! browsers to sniff nothing, frame nothing and run only the page's own script.

use crate::error::ApiError;
use crate::Svc;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

/// The host names a server bound to a loopback address answers to by default.
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Refuses a request for a host the server does not serve, and a request from a browser
/// page of another site that would change state or run work; then adds the headers every
/// response carries.
pub async fn guard(State(svc): State<Svc>, req: Request, next: Next) -> Response {
    let refused = foreign_host(svc.config().allowed_hosts.as_deref(), req.headers())
        .or_else(|| cross_site(req.method(), req.headers()));
    let is_page = req.uri().path() == "/";
    let mut resp = match refused {
        Some(e) => axum::response::IntoResponse::into_response(e),
        None => next.run(req).await,
    };
    let h = resp.headers_mut();
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    let policy = if is_page {
        HeaderValue::from_static(craterdex_api::page::page_policy())
    } else {
        HeaderValue::from_static("default-src 'none'; frame-ancestors 'none'")
    };
    h.insert(header::CONTENT_SECURITY_POLICY, policy);
    resp
}

/// The host part of a `Host` header value: without its port, brackets taken off an IPv6
/// address, lowercase.
fn host_name(value: &str) -> String {
    let v = value.trim();
    let name = match v.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        // an IPv6 address without brackets has no port
        None if v.matches(':').count() > 1 => v,
        None => v.rsplit_once(':').map_or(v, |(h, port)| {
            if port.chars().all(|c| c.is_ascii_digit()) {
                h
            } else {
                v
            }
        }),
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// Why a request naming another host than `allowed` (`None` or `*` among them: any) is
/// refused. A request without `Host` (every browser sends one) passes.
fn foreign_host(allowed: Option<&[String]>, headers: &HeaderMap) -> Option<ApiError> {
    let allowed = allowed?;
    let host = headers.get(header::HOST)?;
    let name = host_name(host.to_str().unwrap_or(""));
    if allowed.iter().any(|a| a == "*" || host_name(a) == name) {
        return None;
    }
    Some(ApiError::new(
        StatusCode::MISDIRECTED_REQUEST,
        format!("this server does not answer for host {name:?} (craterdex serve --allowed-host)"),
    ))
}

/// Why a request that changes state or runs work, sent by a browser page of another
/// origin, is refused: browsers say where a request comes from (`Sec-Fetch-Site`, `Origin`),
/// and a form or script of another site must not make a visitor's browser use this server.
fn cross_site(method: &Method, headers: &HeaderMap) -> Option<ApiError> {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return None;
    }
    let site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    let from_elsewhere = match site {
        Some(s) => !matches!(s, "same-origin" | "none"),
        None => match (headers.get(header::ORIGIN), headers.get(header::HOST)) {
            (Some(origin), Some(host)) => {
                let origin = origin.to_str().unwrap_or("");
                let authority = origin.split_once("://").map_or("", |(_, a)| a);
                !authority.eq_ignore_ascii_case(host.to_str().unwrap_or(""))
            }
            _ => false,
        },
    };
    from_elsewhere.then(|| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "a request from another site's page is refused; call the API from a program or \
             from this server's own page",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_drop_ports_and_brackets() {
        assert_eq!(host_name("LocalHost:8080"), "localhost");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
        assert_eq!(host_name("[::1]:8080"), "::1");
        assert_eq!(host_name("::1"), "::1");
        assert_eq!(host_name("example.org."), "example.org");
        assert_eq!(host_name("evil.example:80"), "evil.example");
    }
}
