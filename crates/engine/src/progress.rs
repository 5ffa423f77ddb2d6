//! How long work reports itself. The library only counts; front ends draw (the CLI a bar
//! with rate and ETA, Python whatever a notebook likes, the service nothing).

/// Receives the progress of long steps and the notes worth showing a person.
pub trait Progress: Sync {
    /// A step named `what` starts with `total` units of work.
    fn start(&self, what: &str, total: usize) {
        let _ = (what, total);
    }
    /// `done` units of the current step are finished.
    fn advance(&self, done: usize) {
        let _ = done;
    }
    /// The current step is over.
    fn finish(&self) {}
    /// A message for the person running the job (skipped images, cache use, downloads).
    fn note(&self, message: &str) {
        let _ = message;
    }
}

/// Reports nothing.
pub struct Silent;

impl Progress for Silent {}
