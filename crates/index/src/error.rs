//! What can go wrong storing and searching descriptors.

use craterdex_errors::{prefix, ErrorKind, HasKind, Invalid, IoError, Prefix};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Images or settings that cannot be indexed as given (an empty or repeated id, zero
    /// images, descriptors of the wrong width): the message says which and why.
    #[error("{0}")]
    Invalid(String),
    /// An id that is already in the index, or was removed and cannot be reused before a
    /// rebuild.
    #[error("{0}")]
    Conflict(String),
    /// Index files that do not check out (a wrong size or checksum, a malformed manifest):
    /// the message names the file; rebuild the index or restore it.
    #[error("{0}")]
    Corrupt(String),
    /// An index of another format version, or an operation this index cannot do (changing
    /// an index held in memory).
    #[error("{0}")]
    Unsupported(String),
    #[error(transparent)]
    Tokens(#[from] craterdex_tokens::Error),
    #[error(transparent)]
    Io(#[from] IoError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl HasKind for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::Invalid(_) => ErrorKind::InvalidInput,
            Error::Conflict(_) => ErrorKind::Conflict,
            Error::Corrupt(_) => ErrorKind::Corrupt,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::Tokens(e) => e.kind(),
            Error::Io(e) => e.kind(),
        }
    }
}

impl From<Invalid> for Error {
    fn from(e: Invalid) -> Self {
        Error::Invalid(e.0)
    }
}

/// Serialising craterdex's own records (manifests, encoders, part markers).
impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Invalid(format!("JSON: {e}"))
    }
}

impl Prefix for Error {
    fn prefixed(self, p: &str) -> Self {
        match self {
            Error::Invalid(m) => Error::Invalid(prefix(p, &m)),
            Error::Conflict(m) => Error::Conflict(prefix(p, &m)),
            Error::Corrupt(m) => Error::Corrupt(prefix(p, &m)),
            Error::Unsupported(m) => Error::Unsupported(prefix(p, &m)),
            Error::Tokens(e) => Error::Tokens(e.prefixed(p)),
            Error::Io(e) => Error::Io(e.prefixed(p)),
        }
    }
}
