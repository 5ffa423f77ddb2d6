//! What can go wrong storing and searching descriptors.

use craterdex_errors::IoError;

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

craterdex_errors::error_kinds!(Error {
    messages: {
        Invalid => InvalidInput,
        Conflict => Conflict,
        Corrupt => Corrupt,
        Unsupported => Unsupported,
    },
    wrapped: { Tokens, Io },
});

/// Serialising craterdex's own records (manifests, encoders, part markers).
impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Invalid(format!("JSON: {e}"))
    }
}
