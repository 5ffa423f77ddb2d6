//! The engine's progress handed to a Python callable, `callback(event, *args)`: `"start"`
//! (what, total), `"advance"` (done), `"finish"`, `"note"` (message) and `"skipped"` (path,
//! reason). The package's `_Reporter` draws bars (tqdm where installed) and turns skipped
//! images into warnings. Called from the engine's threads with the GIL taken for the call
//! only; an exception in the callback is reported as unraisable and the work goes on.

use craterdex_engine::Progress;
use pyo3::prelude::*;

pub struct PyProgress(Option<Py<PyAny>>);

impl PyProgress {
    pub fn new(callback: Option<Py<PyAny>>) -> Self {
        PyProgress(callback)
    }

    fn call(
        &self,
        args: impl for<'py> FnOnce(Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyTuple>>,
    ) {
        let Some(callback) = &self.0 else { return };
        Python::attach(|py| {
            if let Err(e) = args(py).and_then(|a| callback.call1(py, a)) {
                e.write_unraisable(py, Some(callback.bind(py)));
            }
        });
    }
}

impl Progress for PyProgress {
    fn start(&self, what: &str, total: usize) {
        self.call(|py| ("start", what, total).into_pyobject(py));
    }
    fn advance(&self, done: usize) {
        self.call(|py| ("advance", done).into_pyobject(py));
    }
    fn finish(&self) {
        self.call(|py| ("finish",).into_pyobject(py));
    }
    fn note(&self, message: &str) {
        self.call(|py| ("note", message).into_pyobject(py));
    }
    fn skipped(&self, path: &std::path::Path, reason: &str) {
        let path = path.display().to_string();
        self.call(|py| ("skipped", path, reason).into_pyobject(py));
    }
}
