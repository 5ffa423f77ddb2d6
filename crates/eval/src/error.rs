//! What can go wrong building benchmarks and measuring retrieval.

use craterdex_errors::IoError;

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

craterdex_errors::error_kinds!(Error {
    messages: { Invalid => InvalidInput, Unsupported => Unsupported },
    wrapped: { Engine, Io },
});

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
