//! What can go wrong importing, loading and running detectors.

use craterdex_errors::IoError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An image, option or model file that cannot be used: the message names it and why.
    #[error("{0}")]
    Invalid(String),
    /// A detector directory whose files do not check out: import or fetch it again.
    #[error("{0}")]
    Corrupt(String),
    /// A layer or setting this runtime does not run (a Keras layer it does not know).
    #[error("{0}")]
    Unsupported(String),
    #[error(transparent)]
    Model(#[from] craterdex_model::Error),
    #[error(transparent)]
    Io(#[from] IoError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

craterdex_errors::error_kinds!(Error {
    messages: {
        Invalid => InvalidInput,
        Corrupt => Corrupt,
        Unsupported => Unsupported,
    },
    wrapped: { Model, Io },
});

impl From<safetensors::SafeTensorError> for Error {
    fn from(e: safetensors::SafeTensorError) -> Self {
        Error::Corrupt(format!("detector weights: {e}"))
    }
}
