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
    /// What one stage of a rechecked search did, in words. A note, except inside a streamed
    /// search, which sums its batches' stages into one note per stage at the end.
    fn stage_ran(&self, message: &str) {
        self.note(message)
    }
    /// One image of the job could not be used and was skipped (also listed in a note).
    fn skipped(&self, path: &std::path::Path, reason: &str) {
        let _ = (path, reason);
    }
    /// Whether whoever waits for the work has stopped waiting (a request that timed out):
    /// the work then ends at the next point where it can, with [`crate::Error::Cancelled`].
    /// Checked between forward passes and between a search's stages.
    fn cancelled(&self) -> bool {
        false
    }
}

/// Fails with [`crate::Error::Cancelled`] once `progress` says the work is no longer waited
/// for.
pub(crate) fn go_on(progress: &dyn Progress) -> crate::Result<()> {
    match progress.cancelled() {
        true => Err(crate::Error::Cancelled),
        false => Ok(()),
    }
}

/// Reports nothing.
pub struct Silent;

impl Progress for Silent {}

/// The notes, skipped images and cancellation of another [`Progress`], without its steps nor
/// its stages' notes: a batch inside a streamed search ([`crate::search_streamed`]), which
/// draws its own count and sums the stages of all its batches.
pub(crate) struct NotesOnly<'a>(pub &'a dyn Progress);

impl Progress for NotesOnly<'_> {
    fn note(&self, message: &str) {
        self.0.note(message)
    }
    fn stage_ran(&self, _message: &str) {}
    fn skipped(&self, path: &std::path::Path, reason: &str) {
        self.0.skipped(path, reason)
    }
    fn cancelled(&self) -> bool {
        self.0.cancelled()
    }
}
