//! What can go wrong turning checkpoints and images into features.

use craterdex_errors::IoError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An image, checkpoint, features file or option that cannot be used: the message names
    /// it and says why.
    #[error("{0}")]
    Invalid(String),
    /// An image that decodes only in part (a JPEG cut short or with bad entropy data);
    /// allowing partial images uses what can be decoded.
    #[error("{0}")]
    Truncated(String),
    /// Well-formed content that cannot be used (posted features of the wrong width, a binary
    /// body that is no safetensors file).
    #[error("{0}")]
    Unusable(String),
    /// Bytes that are no image craterdex reads (JPEG, PNG, TIFF, PNM).
    #[error("{0}")]
    NotAnImage(String),
    /// An image over the size limits (pixels, or pixels per side).
    #[error("{0}")]
    TooLarge(String),
    /// A model directory whose files do not check out (weights that fail their checksum):
    /// import or fetch the model again.
    #[error("{0}")]
    Corrupt(String),
    /// Valid, but not on this machine (bf16 linear layers without bf16 hardware).
    #[error("{0}")]
    Unsupported(String),
    #[error(transparent)]
    Io(#[from] IoError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

craterdex_errors::error_kinds!(Error {
    messages: {
        Invalid => InvalidInput,
        Truncated => InvalidInput,
        Unusable => InvalidInput,
        NotAnImage => InvalidInput,
        TooLarge => InvalidInput,
        Corrupt => Corrupt,
        Unsupported => Unsupported,
    },
    wrapped: { Io },
});

impl Error {
    /// An invalid-input error from anything printable (a parser's own error, say).
    pub fn invalid(e: impl std::fmt::Display) -> Self {
        Error::Invalid(e.to_string())
    }
}

/// Tensor views and files of features: a shape that does not fit its data.
impl From<safetensors::SafeTensorError> for Error {
    fn from(e: safetensors::SafeTensorError) -> Self {
        Error::Invalid(format!("safetensors: {e}"))
    }
}
