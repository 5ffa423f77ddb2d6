//! Who may do what: the API key for writes (and reads with `--protect-reads`), and the
//! shape of image ids, which are opaque keys and never become paths.

use crate::error::{ApiError, ApiResult};
use crate::Service;
use axum::extract::rejection::PathRejection;
use axum::extract::Path;
use axum::http::{header, HeaderMap, StatusCode};
use craterdex_api::readers::valid_id;

fn unauthorized(svc: &Service, headers: &HeaderMap, write: bool) -> Option<ApiError> {
    if !write && !svc.config().protect_reads {
        return None;
    }
    let Some(key) = &svc.config().api_key else {
        return Some(ApiError::new(
            StatusCode::FORBIDDEN,
            "this server was started without an API key; writes are disabled",
        ));
    };
    let given = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .or_else(|| {
            headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(bearer_token)
        });
    match given {
        Some(g) if constant_time_eq(g.as_bytes(), key.as_bytes()) => None,
        Some(_) => Some(ApiError::new(StatusCode::UNAUTHORIZED, "wrong API key")),
        None => Some(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "an API key is required (header X-Api-Key or Authorization: Bearer)",
        )),
    }
}

/// The token of an `Authorization: Bearer <token>` value; the scheme is case-insensitive
/// (RFC 9110, section 11.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub fn authorize(svc: &Service, headers: &HeaderMap, write: bool) -> ApiResult<()> {
    unauthorized(svc, headers, write).map_or(Ok(()), Err)
}

/// For a request that changes what the server keeps without writing the index (a
/// registration): it needs the write key where the server has one, and is open like a read
/// where it has none.
pub fn authorize_change(svc: &Service, headers: &HeaderMap) -> ApiResult<()> {
    authorize(svc, headers, svc.config().api_key.is_some())
}

pub fn path_id(p: Result<Path<String>, PathRejection>) -> ApiResult<String> {
    let Path(id) = p.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if !valid_id(&id) {
        return Err(ApiError::bad_request(format!("invalid image id {id:?}")));
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_look_like_paths_are_refused() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "a/./b",
            "a b",
            "a\nb",
            "x%2e",
        ] {
            assert!(!valid_id(bad), "{bad:?} accepted");
        }
        for good in [
            "holdout_tile-00025_2x",
            "M1.tile/crater-7",
            "upload-0a1b",
            "c:12+3",
        ] {
            assert!(valid_id(good), "{good:?} refused");
        }
    }

    #[test]
    fn the_bearer_scheme_is_read_in_any_case() {
        for v in ["Bearer k1", "bearer k1", "BEARER  k1 ", " Bearer k1"] {
            assert_eq!(bearer_token(v), Some("k1"), "{v:?}");
        }
        for v in ["Basic k1", "Bearer", "Bearer  ", "Bearerk1", ""] {
            assert_eq!(bearer_token(v), None, "{v:?}");
        }
    }

    #[test]
    fn keys_compare_exactly() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
    }
}
