//! What can go wrong building benchmarks and measuring retrieval.

use craterdex_errors::{prefix, ErrorKind, HasKind, Invalid, IoError, Prefix};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A manifest, crater list, tile or option that cannot be used: the message names the
    /// file or field and says why.
    #[error("{0}")]
    Invalid(String),
    /// Valid, but not in this build (georeferenced mosaics without GDAL).
    #[error("{0}")]
    Unsupported(String),
    #[error(transparent)]
    Engine(#[from] craterdex_engine::Error),
    #[error(transparent)]
    Io(#[from] IoError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl HasKind for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::Invalid(_) => ErrorKind::InvalidInput,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::Engine(e) => e.kind(),
            Error::Io(e) => e.kind(),
        }
    }
}

impl From<Invalid> for Error {
    fn from(e: Invalid) -> Self {
        Error::Invalid(e.0)
    }
}

impl From<craterdex_model::Error> for Error {
    fn from(e: craterdex_model::Error) -> Self {
        Error::Engine(e.into())
    }
}

impl From<craterdex_index::Error> for Error {
    fn from(e: craterdex_index::Error) -> Self {
        Error::Engine(e.into())
    }
}

/// Writing CSV tables (reading them names the file and line in its own messages).
impl From<csv::Error> for Error {
    fn from(e: csv::Error) -> Self {
        Error::Invalid(format!("CSV: {e}"))
    }
}

/// Serialising craterdex's own records (manifests, results).
impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Invalid(format!("JSON: {e}"))
    }
}

impl Prefix for Error {
    fn prefixed(self, p: &str) -> Self {
        match self {
            Error::Invalid(m) => Error::Invalid(prefix(p, &m)),
            Error::Unsupported(m) => Error::Unsupported(prefix(p, &m)),
            Error::Engine(e) => Error::Engine(e.prefixed(p)),
            Error::Io(e) => Error::Io(e.prefixed(p)),
        }
    }
}
