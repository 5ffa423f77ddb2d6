//! Backbone features posted for a search (`craterdex_model::posted` reads and checks
//! them): malformed JSON is a bad request, well-formed content that cannot be features is
//! unprocessable.

use crate::error::{ApiError, ApiResult};
use axum::http::StatusCode;
use craterdex_model::extract::FeatureSet;
use craterdex_model::posted;

fn api_error(e: craterdex_model::Error) -> ApiError {
    match e {
        craterdex_model::Error::Invalid(m) => ApiError::bad_request(m),
        other => ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, other.to_string()),
    }
}

/// The features of one image from a posted body, checked against the index's width `dim`.
pub fn posted_features(body: &[u8], content_type: &str, dim: usize) -> ApiResult<FeatureSet> {
    posted::parse_features(body, content_type)
        .and_then(|f| posted::check_features(f, dim))
        .map_err(api_error)
}
