//! What can go wrong fetching models and data.

use craterdex_errors::IoError;

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
    /// The downloaded detector could not be imported.
    #[error(transparent)]
    Detector(#[from] craterdex_detect::Error),
    #[error(transparent)]
    Io(#[from] IoError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

craterdex_errors::error_kinds!(Error {
    messages: { Download => Io, Invalid => InvalidInput, Corrupt => Corrupt },
    wrapped: { Model, Detector, Io },
});
