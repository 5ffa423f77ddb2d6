//! Failures on their way to Python: every library error becomes the `craterdex.errors` class
//! of its kind (all subclasses of `CraterdexError`), with the library's message.

use craterdex_errors::{ErrorKind, HasKind};
use pyo3::prelude::*;

/// A failure: its kind (none for failures outside the library's kinds) and message.
pub struct Failure {
    kind: Option<ErrorKind>,
    message: String,
}

impl<E: HasKind + std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure {
            kind: Some(e.kind()),
            message: e.to_string(),
        }
    }
}

/// Input from Python that cannot be used.
pub fn invalid(message: impl Into<String>) -> Failure {
    Failure {
        kind: Some(ErrorKind::InvalidInput),
        message: message.into(),
    }
}

/// Image work on an index opened without a model, with the Python remedy.
pub fn no_model(what: &str) -> Failure {
    Failure {
        kind: Some(ErrorKind::Unsupported),
        message: format!("no model is loaded: {what} needs one (Index.open(path, model=...))"),
    }
}

/// The exception class of a kind, in `craterdex.errors`.
fn exception_class(kind: Option<ErrorKind>) -> &'static str {
    match kind {
        None => "CraterdexError",
        Some(ErrorKind::InvalidInput) => "InvalidInputError",
        Some(ErrorKind::NotFound) => "NotFoundError",
        Some(ErrorKind::Conflict) => "ConflictError",
        Some(ErrorKind::Corrupt) => "CorruptDataError",
        Some(ErrorKind::Unsupported) => "UnsupportedError",
        Some(ErrorKind::Io) => "CraterdexIOError",
    }
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> PyErr {
        Python::attach(|py| {
            let class = py
                .import("craterdex.errors")
                .and_then(|m| m.getattr(exception_class(f.kind)));
            match class.and_then(|c| c.call1((f.message,))) {
                Ok(exception) => PyErr::from_value(exception),
                Err(e) => e,
            }
        })
    }
}

pub type Fallible<T> = Result<T, Failure>;

/// `?` from any library error into a Python exception.
pub trait OrPy<T> {
    fn py_err(self) -> PyResult<T>;
}

impl<T, E: Into<Failure>> OrPy<T> for Result<T, E> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(|e| e.into().into())
    }
}
