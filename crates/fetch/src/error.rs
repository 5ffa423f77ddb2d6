//! What can go wrong fetching models and data.

use craterdex_errors::{prefix, ErrorKind, HasKind, Invalid, IoError, Prefix};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A download that could not be made (no network, no pip, an HTTP error): the message
    /// names what and from where.
    #[error("{0}")]
    Download(String),
    /// A request that cannot be made as given (a malformed repository name).
    #[error("{0}")]
    Invalid(String),
    /// A downloaded archive that does not check out (a wrong sha256, a missing member).
    #[error("{0}")]
    Corrupt(String),
    /// The downloaded checkpoint could not be imported.
    #[error(transparent)]
    Model(#[from] craterdex_model::Error),
    #[error(transparent)]
    Io(#[from] IoError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl HasKind for Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::Download(_) => ErrorKind::Io,
            Error::Invalid(_) => ErrorKind::InvalidInput,
            Error::Corrupt(_) => ErrorKind::Corrupt,
            Error::Model(e) => e.kind(),
            Error::Io(e) => e.kind(),
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
            Error::Download(m) => Error::Download(prefix(p, &m)),
            Error::Invalid(m) => Error::Invalid(prefix(p, &m)),
            Error::Corrupt(m) => Error::Corrupt(prefix(p, &m)),
            Error::Model(e) => Error::Model(e.prefixed(p)),
            Error::Io(e) => Error::Io(e.prefixed(p)),
        }
    }
}
