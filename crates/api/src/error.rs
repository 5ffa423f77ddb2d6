//! How failures are answered: `{"error": {"status", "message"}}` with the status of the
//! failure's kind, mapped here once ([`status_of`]), whichever front end answers.

use crate::types::{ErrorBody, ErrorDetail};
use craterdex_errors::{ErrorKind, HasKind, IoError};
use http::StatusCode;

/// The status of each kind of library failure: the request could not be used (422), what it
/// names is not there (404) or taken (409), the server's own data is damaged or a file
/// operation failed (500), or this server cannot do it (501).
pub fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::InvalidInput => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::Corrupt | ErrorKind::Io => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::Unsupported => StatusCode::NOT_IMPLEMENTED,
    }
}

/// An error answered to the client.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
    /// A request that cannot be parsed: its form, query or id.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }
    pub fn internal(e: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
    }
    pub fn status(&self) -> StatusCode {
        self.status
    }
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<craterdex_model::Error> for ApiError {
    /// Images are the one place a kind splits further: bytes that are no image (415) and
    /// images over the limits (413) have statuses of their own.
    fn from(e: craterdex_model::Error) -> Self {
        let status = match &e {
            craterdex_model::Error::NotAnImage(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            craterdex_model::Error::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            e => status_of(e.kind()),
        };
        Self::new(status, e.to_string())
    }
}

impl From<craterdex_engine::Error> for ApiError {
    fn from(e: craterdex_engine::Error) -> Self {
        match e {
            craterdex_engine::Error::Model(e) => e.into(),
            e => Self::new(status_of(e.kind()), e.to_string()),
        }
    }
}

impl From<craterdex_workflows::Error> for ApiError {
    fn from(e: craterdex_workflows::Error) -> Self {
        match e {
            craterdex_workflows::Error::Engine(e) => e.into(),
            e => Self::new(status_of(e.kind()), e.to_string()),
        }
    }
}

impl From<craterdex_detect::Error> for ApiError {
    fn from(e: craterdex_detect::Error) -> Self {
        Self::new(status_of(e.kind()), e.to_string())
    }
}

impl From<IoError> for ApiError {
    fn from(e: IoError) -> Self {
        Self::internal(e)
    }
}

impl ApiError {
    /// The body the error is answered with.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                status: self.status.as_u16(),
                message: self.message.clone(),
            },
        }
    }
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for ApiError {
    fn into_response(self) -> axum::response::Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
