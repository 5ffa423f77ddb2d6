//! What can go wrong turning tokens into descriptors.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Parameters that cannot be used: a whitening or recipe read from a file that does not
    /// fit together, or too few samples to learn a whitening from.
    #[error("{0}")]
    Invalid(String),
    /// Samples a whitening cannot be learned from: they do not vary (images all alike), so
    /// the whitening would divide by zero. A build learns none instead, and says so.
    #[error("{0}")]
    Degenerate(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

craterdex_errors::error_kinds!(Error {
    messages: { Invalid => InvalidInput, Degenerate => InvalidInput },
});
