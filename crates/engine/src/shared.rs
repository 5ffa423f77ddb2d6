//! One engine shared by many readers and one writer at a time: what a long-running front
//! end (the service, a Python session) holds. Readers take a snapshot and keep it for the
//! whole request; a write goes through the index's atomic path and the engine over the
//! changed index then replaces the current one whole, so a reader sees the index wholly
//! before or wholly after a write.

use crate::engine::Engine;
use std::sync::{Arc, Mutex, RwLock};

pub struct SharedEngine {
    current: RwLock<Arc<Engine>>,
    writer: Mutex<()>,
}

impl SharedEngine {
    pub fn new(engine: Engine) -> Self {
        Self {
            current: RwLock::new(Arc::new(engine)),
            writer: Mutex::new(()),
        }
    }

    /// The engine as it is now; it stays valid (and unchanged) while held.
    pub fn snapshot(&self) -> Arc<Engine> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Runs `write` on the current engine with the writer lock held (writes are serialised;
    /// reads go on); a changed engine it returns replaces the current one whole.
    pub fn write<T, E>(
        &self,
        write: impl FnOnce(&Arc<Engine>) -> Result<(T, Option<Engine>), E>,
    ) -> Result<T, E> {
        let _writer = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.snapshot();
        let (out, changed) = write(&current)?;
        if let Some(engine) = changed {
            *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(engine);
        }
        Ok(out)
    }
}
