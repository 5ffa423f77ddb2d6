//! What can go wrong linking, calibrating, deduplicating and discovering.

use craterdex_errors::{prefix, ErrorKind, HasKind, Invalid, IoError, Prefix};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Entries, metadata, a rule or options that cannot be used: the message names the file
    /// or field and says why.
    #[error("{0}")]
    Invalid(String),
    /// A calibration that cannot be fitted from the labelled entries given.
    #[error("{0}")]
    Calibration(String),
    #[error(transparent)]
    Engine(#[from] craterdex_engine::Error),
    #[error(transparent)]
    Io(#[from] IoError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl HasKind for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::Invalid(_) | Error::Calibration(_) => ErrorKind::InvalidInput,
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

/// Serialising craterdex's own records (rules, results).
impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Invalid(format!("JSON: {e}"))
    }
}

impl Prefix for Error {
    fn prefixed(self, p: &str) -> Self {
        match self {
            Error::Invalid(m) => Error::Invalid(prefix(p, &m)),
            Error::Calibration(m) => Error::Calibration(prefix(p, &m)),
            Error::Engine(e) => Error::Engine(e.prefixed(p)),
            Error::Io(e) => Error::Io(e.prefixed(p)),
        }
    }
}
