//! The errors of running the server. How a failed request is answered lives in
//! craterdex-api ([`craterdex_api::ApiError`]).

use craterdex_errors::{ErrorKind, HasKind, IoError};

pub use craterdex_api::{ApiError, ApiResult};

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The index (or the model) could not be loaded.
    #[error(transparent)]
    Load(#[from] craterdex_engine::Error),
    /// The address could not be listened on, or the connection loop failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// The loader thread stopped without an answer.
    #[error("the index loader stopped unexpectedly: {0}")]
    Loader(String),
}

impl HasKind for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::Load(e) => e.kind(),
            Error::Io(e) => e.kind(),
            Error::Loader(_) => ErrorKind::Io,
        }
    }
}
