//! What can go wrong running the pipeline: each crate's own errors, and the engine's.

use craterdex_errors::IoError;
use craterdex_model::{Brightness, Orientation};

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
    /// The index was built from crops whose brightness was set another way than the loaded
    /// model sets it.
    #[error("the index was built with crops' brightness {}; its queries need the same", built.name())]
    Brightness {
        built: Brightness,
        loaded: Brightness,
    },
    /// Changing an index that lives in memory only.
    #[error("an index held in memory cannot be changed")]
    InMemory,
    /// Work stopped before it finished because nothing waited for it any more
    /// ([`crate::Progress::cancelled`]: a request that timed out); nothing was written.
    #[error("stopped before it finished: no one waited for it any more")]
    Cancelled,
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

craterdex_errors::error_kinds!(Error {
    messages: { Invalid => InvalidInput },
    wrapped: { Model, Fetch, Tokens, Index, Io },
    // their message is whole as it is
    whole: {
        Error::Orientation { .. } | Error::Brightness { .. } => InvalidInput,
        Error::NoSuchImage(_) => NotFound,
        Error::NoModel(_) | Error::InMemory => Unsupported,
        // an operational failure, as a timed-out I/O operation is
        Error::Cancelled => Io,
    },
});

/// Serialising craterdex's own records (build plans).
impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Invalid(format!("JSON: {e}"))
    }
}
