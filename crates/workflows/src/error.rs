//! What can go wrong linking, calibrating, deduplicating and discovering.

use craterdex_errors::IoError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Entries, metadata, a rule or options that cannot be used: the message names the file
    /// or field and says why.
    #[error("{0}")]
    Invalid(String),
    /// A calibration that cannot be fitted from the labelled entries given.
    #[error("{0}")]
    Calibration(String),
    /// A map layer GDAL could not write (a GeoPackage): the message names the file.
    #[error("{0}")]
    MapLayer(String),
    #[error(transparent)]
    Engine(#[from] craterdex_engine::Error),
    #[error(transparent)]
    Io(#[from] IoError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

craterdex_errors::error_kinds!(Error {
    messages: { Invalid => InvalidInput, Calibration => InvalidInput, MapLayer => Io },
    wrapped: { Engine, Io },
});

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
