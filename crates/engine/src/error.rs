//! What can go wrong running the pipeline: each crate's own errors, and the engine's.

use craterdex_errors::{prefix, ErrorKind, HasKind, Invalid, IoError, Prefix};
use craterdex_model::Orientation;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Inputs or options that cannot be used as given: the message names them and why.
    #[error("{0}")]
    Invalid(String),
    /// An image id that is not in the index.
    #[error("no image {0:?} in the index")]
    NoSuchImage(String),
    /// Image queries and adds need a model, and none is loaded.
    #[error("no model is loaded: {0} needs one")]
    NoModel(&'static str),
    /// The index was built from crops turned another way than the loaded model turns them.
    #[error("the index was built with crops oriented {}; its queries need the same", built.name())]
    Orientation {
        built: Orientation,
        loaded: Orientation,
    },
    /// Changing an index that lives in memory only.
    #[error("an index held in memory cannot be changed")]
    InMemory,
    #[error(transparent)]
    Model(#[from] craterdex_model::Error),
    #[error(transparent)]
    Fetch(#[from] craterdex_fetch::Error),
    #[error(transparent)]
    Tokens(#[from] craterdex_tokens::Error),
    #[error(transparent)]
    Index(#[from] craterdex_index::Error),
    #[error(transparent)]
    Io(#[from] IoError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl HasKind for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::Invalid(_) | Error::Orientation { .. } => ErrorKind::InvalidInput,
            Error::NoSuchImage(_) => ErrorKind::NotFound,
            Error::NoModel(_) | Error::InMemory => ErrorKind::Unsupported,
            Error::Model(e) => e.kind(),
            Error::Fetch(e) => e.kind(),
            Error::Tokens(e) => e.kind(),
            Error::Index(e) => e.kind(),
            Error::Io(e) => e.kind(),
        }
    }
}

impl From<Invalid> for Error {
    fn from(e: Invalid) -> Self {
        Error::Invalid(e.0)
    }
}

/// Serialising craterdex's own records (build plans).
impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Invalid(format!("JSON: {e}"))
    }
}

impl Prefix for Error {
    fn prefixed(self, p: &str) -> Self {
        match self {
            Error::Invalid(m) => Error::Invalid(prefix(p, &m)),
            Error::Model(e) => Error::Model(e.prefixed(p)),
            Error::Fetch(e) => Error::Fetch(e.prefixed(p)),
            Error::Tokens(e) => Error::Tokens(e.prefixed(p)),
            Error::Index(e) => Error::Index(e.prefixed(p)),
            Error::Io(e) => Error::Io(e.prefixed(p)),
            // their message is whole as it is
            e @ (Error::NoSuchImage(_)
            | Error::NoModel(_)
            | Error::Orientation { .. }
            | Error::InMemory) => e,
        }
    }
}
