//! What can go wrong turning tokens into descriptors.

use craterdex_errors::{prefix, ErrorKind, HasKind, Invalid, Prefix};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Parameters that cannot be used: a whitening or recipe read from a file that does not
    /// fit together, or too few samples to learn a whitening from.
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl HasKind for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::Invalid(_) => ErrorKind::InvalidInput,
        }
    }
}

impl From<Invalid> for Error {
    fn from(e: Invalid) -> Self {
        Error::Invalid(e.0)
    }
}

impl Prefix for Error {
    fn prefixed(self, p: &str) -> Self {
        match self {
            Error::Invalid(m) => Error::Invalid(prefix(p, &m)),
        }
    }
}
