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
    /// The feature cache served `served` of the `of` images of the step named `what`. A
    /// note, except inside a streamed search, which sums its batches into one note a step.
    fn cache_served(&self, what: &str, served: usize, of: usize) {
        self.note(&cache_note(what, served, of))
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

/// What [`Progress::cache_served`] says.
pub(crate) fn cache_note(what: &str, served: usize, of: usize) -> String {
    format!("{what}: {served} of {of} images from the feature cache")
}

/// One bar over several calls that each start their own step (a long job read a chunk at a
/// time): their counts go on from what the calls before them did; notes, skipped images
/// and cancellation pass through.
pub(crate) struct Continued<'a> {
    outer: &'a dyn Progress,
    before: std::sync::atomic::AtomicUsize,
}

impl<'a> Continued<'a> {
    pub(crate) fn new(outer: &'a dyn Progress) -> Self {
        Continued {
            outer,
            before: Default::default(),
        }
    }

    /// The call that just ended did `units`: the next one counts on from there.
    pub(crate) fn done_before(&self, units: usize) {
        self.before
            .fetch_add(units, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Progress for Continued<'_> {
    fn advance(&self, done: usize) {
        self.outer
            .advance(self.before.load(std::sync::atomic::Ordering::Relaxed) + done);
    }
    fn note(&self, message: &str) {
        self.outer.note(message)
    }
    fn cache_served(&self, what: &str, served: usize, of: usize) {
        self.outer.cache_served(what, served, of)
    }
    fn skipped(&self, path: &std::path::Path, reason: &str) {
        self.outer.skipped(path, reason)
    }
    fn cancelled(&self) -> bool {
        self.outer.cancelled()
    }
}

/// Reports nothing.
pub struct Silent;

impl Progress for Silent {}

/// The notes, skipped images and cancellation of another [`Progress`], without its steps,
/// its stages' notes nor its cache notes: a batch inside a streamed search
/// ([`crate::search_streamed`]), which draws its own count and sums the stages and the
/// cache's service of all its batches ([`NotesOnly::cache_notes`]).
pub(crate) struct NotesOnly<'a> {
    outer: &'a dyn Progress,
    /// Per step name, in the order first seen: images the cache served, and images.
    served: std::sync::Mutex<Vec<(String, usize, usize)>>,
}

impl<'a> NotesOnly<'a> {
    pub(crate) fn new(outer: &'a dyn Progress) -> Self {
        NotesOnly {
            outer,
            served: Default::default(),
        }
    }

    /// The cache's service summed over the batches: one note per step it served.
    pub(crate) fn cache_notes(&self) -> Vec<String> {
        let served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        served
            .iter()
            .map(|(what, served, of)| cache_note(what, *served, *of))
            .collect()
    }
}

impl Progress for NotesOnly<'_> {
    fn note(&self, message: &str) {
        self.outer.note(message)
    }
    fn stage_ran(&self, _message: &str) {}
    fn cache_served(&self, what: &str, served: usize, of: usize) {
        let mut all = self.served.lock().unwrap_or_else(|e| e.into_inner());
        match all.iter_mut().find(|(w, _, _)| w == what) {
            Some((_, s, o)) => {
                *s += served;
                *o += of;
            }
            None => all.push((what.to_string(), served, of)),
        }
    }
    fn skipped(&self, path: &std::path::Path, reason: &str) {
        self.outer.skipped(path, reason)
    }
    fn cancelled(&self) -> bool {
        self.outer.cancelled()
    }
}
