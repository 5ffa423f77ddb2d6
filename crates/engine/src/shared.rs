//! One engine shared by many readers and one writer at a time: what a long-running front
//! end (the service, a Python session) holds. Readers take a snapshot and keep it for the
//! whole request; a write goes through the index's atomic path and the engine over the
//! changed index then replaces the current one whole, so a reader sees the index wholly
//! before or wholly after a write. With [`SharedEngine::merge_in_background`], every write
//! wakes a merger thread (started by the first write: opening an index to read it never
//! changes it) that merges segments by the policy while searches and writes go on.

use crate::engine::Engine;
use crate::error::Result;
use craterdex_index::{MergePolicy, MergeReport};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, RwLock, Weak};

pub struct SharedEngine {
    inner: Arc<Inner>,
}

struct Inner {
    current: RwLock<Arc<Engine>>,
    writer: Mutex<()>,
    merger: Mutex<Merger>,
    /// The last error of the background merger (reported by `merge_error`).
    merge_error: Mutex<Option<String>>,
}

/// The background merger of a shared engine.
enum Merger {
    Off,
    /// To start at the first write.
    Ready(MergePolicy),
    /// Woken through the sender.
    Running(Sender<()>, MergePolicy),
}

impl Inner {
    fn snapshot(&self) -> Arc<Engine> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn replace(&self, engine: Engine) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(engine);
    }

    /// Makes a merge's engine the current one unless the current one shows a later state
    /// of the index (a write that committed after the merge).
    fn replace_unless_older(&self, engine: Engine) {
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        if engine.index().generation() > current.index().generation() {
            *current = Arc::new(engine);
        }
    }

    fn merge(&self, policy: &MergePolicy, wait: bool) -> Result<MergeReport> {
        let mut report = MergeReport {
            segments_before: self.snapshot().index().segment_count(),
            ..MergeReport::default()
        };
        // Writes go on meanwhile: the index's own write lock orders the commit with them on
        // disk, and the engine showing the later state is kept.
        while let Some(merge) = self.snapshot().prepare_merge(policy, wait)? {
            let (written, purged) = (merge.rows_written, merge.rows_purged);
            let Some(merged) = self.snapshot().commit_merge(merge)? else {
                break;
            };
            self.replace_unless_older(merged);
            report.merges += 1;
            report.rows_written += written;
            report.rows_purged += purged;
        }
        // another merger's commit may have landed after its engine was taken as current
        self.replace_unless_older(self.snapshot().reopened()?);
        report.segments_after = self.snapshot().index().segment_count();
        Ok(report)
    }
}

impl SharedEngine {
    pub fn new(engine: Engine) -> Self {
        Self {
            inner: Arc::new(Inner {
                current: RwLock::new(Arc::new(engine)),
                writer: Mutex::new(()),
                merger: Mutex::new(Merger::Off),
                merge_error: Mutex::new(None),
            }),
        }
    }

    /// The engine as it is now; it stays valid (and unchanged) while held.
    pub fn snapshot(&self) -> Arc<Engine> {
        self.inner.snapshot()
    }

    /// Runs `write` on the current engine with the writer lock held (writes are serialised;
    /// reads go on); a changed engine it returns replaces the current one whole, and wakes
    /// the background merger. A write that leaves more segments than the policy's
    /// `stall_segments` merges (after the merge in progress) before it returns: merges that
    /// fall behind slow writers down instead of searches.
    pub fn write<T, E>(
        &self,
        write: impl FnOnce(&Arc<Engine>) -> Result<(T, Option<Engine>), E>,
    ) -> Result<T, E> {
        let changed = {
            let _writer = self.inner.writer.lock().unwrap_or_else(|e| e.into_inner());
            let current = self.snapshot();
            let (out, changed) = write(&current)?;
            let was_changed = changed.is_some();
            if let Some(engine) = changed {
                self.inner.replace(engine);
            }
            (out, was_changed)
        };
        if changed.1 {
            if let Some(policy) = self.wake_merger() {
                if self.snapshot().index().segment_count() > policy.stall_segments {
                    // the write is committed: a failed merge is the merger's to report
                    if let Err(e) = self.inner.merge(&policy, true) {
                        *self
                            .inner
                            .merge_error
                            .lock()
                            .unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
                    }
                }
            }
        }
        Ok(changed.0)
    }

    /// Takes up what other processes wrote to the index since (a replica of a shard whose
    /// siblings take writes); `true` when there was something.
    pub fn refresh(&self) -> Result<bool> {
        if !self.snapshot().index().is_stale()? {
            return Ok(false);
        }
        let _writer = self.inner.writer.lock().unwrap_or_else(|e| e.into_inner());
        self.inner.replace(self.snapshot().reopened()?);
        Ok(true)
    }

    /// Merges segments by `policy` now, until it asks for nothing more (after the
    /// background merger's merge in progress, if any).
    pub fn merge(&self, policy: &MergePolicy) -> Result<MergeReport> {
        self.inner.merge(policy, true)
    }

    /// Merges by `policy` in a background thread after every write, from the first write
    /// on. The thread ends when this engine is dropped; a merge it was writing is left as a
    /// leftover that the next merge deletes. Indexes held in memory are never merged.
    pub fn merge_in_background(&self, policy: MergePolicy) {
        if self.snapshot().index().dir().is_some() {
            *self.inner.merger.lock().unwrap_or_else(|e| e.into_inner()) = Merger::Ready(policy);
        }
    }

    /// Wakes the merger (starting it at the first write); its policy, when it runs.
    fn wake_merger(&self) -> Option<MergePolicy> {
        let mut merger = self.inner.merger.lock().unwrap_or_else(|e| e.into_inner());
        if let Merger::Ready(policy) = &*merger {
            match self.start_merger(policy.clone()) {
                Ok(wake) => *merger = Merger::Running(wake, policy.clone()),
                Err(e) => {
                    // writes still work; segments are merged by the next explicit merge
                    tracing::warn!("no background merging (could not start its thread: {e})");
                    *merger = Merger::Off;
                }
            }
        }
        match &*merger {
            Merger::Running(wake, policy) => {
                let _ = wake.send(());
                Some(policy.clone())
            }
            _ => None,
        }
    }

    fn start_merger(&self, policy: MergePolicy) -> std::io::Result<Sender<()>> {
        let (wake, woken) = channel::<()>();
        let inner: Weak<Inner> = Arc::downgrade(&self.inner);
        std::thread::Builder::new()
            .name("craterdex-merge".into())
            .spawn(move || {
                while woken.recv().is_ok() {
                    // one pass serves every write that woke it meanwhile
                    while woken.try_recv().is_ok() {}
                    let Some(inner) = inner.upgrade() else {
                        return;
                    };
                    let outcome = inner.merge(&policy, false).err().map(|e| e.to_string());
                    if let Some(e) = &outcome {
                        let dir = inner
                            .current
                            .read()
                            .unwrap_or_else(|e| e.into_inner())
                            .index()
                            .dir()
                            .map(|d| d.display().to_string());
                        tracing::error!(
                            index = dir.unwrap_or_default(),
                            "background merge failed: {e}"
                        );
                    }
                    *inner.merge_error.lock().unwrap_or_else(|e| e.into_inner()) = outcome;
                }
            })?;
        Ok(wake)
    }

    /// The last background merge's error, if it failed.
    pub fn merge_error(&self) -> Option<String> {
        self.inner
            .merge_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_images::{image, write_index};
    use craterdex_index::{Index, SearchParams};

    /// Single adds while a searcher runs and segments merge in the background: every write
    /// is visible in every later snapshot (a merge finishing late never hides one), every
    /// search answers, and segments stay few.
    #[test]
    fn writes_stay_visible_while_merges_run_in_the_background() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("idx");
        let base: Vec<_> = (0..50).map(image).collect();
        write_index(&dir, &base);
        let shared = SharedEngine::new(Engine::open(&dir, None).unwrap());
        let policy = MergePolicy {
            merge_factor: 4,
            ..MergePolicy::default()
        };
        shared.merge_in_background(policy.clone());
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            let searcher = scope.spawn(|| {
                let q = [image(3).1];
                let mut searches = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let engine = shared.snapshot();
                    let hits = engine.search_descriptors(&q, &SearchParams::default());
                    assert_eq!(hits[0][0].id, "img3");
                    searches += 1;
                }
                searches
            });
            for i in 50..350 {
                let one = [image(i)];
                shared
                    .write(|e| e.add(&one).map(|(n, grown)| (n, Some(grown))))
                    .unwrap();
                let now = shared.snapshot();
                for j in (50..=i).step_by(37).chain([i]) {
                    assert!(
                        now.index().row_of(&format!("img{j}")).is_some(),
                        "img{j} after {i}"
                    );
                }
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            assert!(searcher.join().unwrap() > 0);
        });
        shared.merge(&policy).unwrap();
        assert_eq!(shared.merge_error(), None);
        let now = shared.snapshot();
        assert_eq!(now.index().live(), 350);
        // factor 4: at most 3 segments on each level up to 4^4 rows
        assert!(
            now.index().segment_count() <= 3 * 5,
            "{}",
            now.index().segment_count()
        );
        let reopened = Index::open(&dir).unwrap();
        assert_eq!(reopened.live(), 350);
        assert_eq!(reopened.segment_count(), now.index().segment_count());
    }

    /// Merges behind: a writer that never merges left 20 segments; the next write through
    /// an engine that merges stalls until merging brings them under `stall_segments`.
    #[test]
    fn a_write_past_the_stall_count_returns_only_once_merged() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("idx");
        write_index(&dir, &(0..10).map(image).collect::<Vec<_>>());
        let never_merges = SharedEngine::new(Engine::open(&dir, None).unwrap());
        for i in 10..30 {
            let one = [image(i)];
            never_merges
                .write(|e| e.add(&one).map(|(n, grown)| (n, Some(grown))))
                .unwrap();
        }
        assert_eq!(never_merges.snapshot().index().segment_count(), 21);
        let shared = SharedEngine::new(Engine::open(&dir, None).unwrap());
        shared.merge_in_background(MergePolicy {
            merge_factor: 4,
            stall_segments: 6,
            ..MergePolicy::default()
        });
        let one = [image(30)];
        shared
            .write(|e| e.add(&one).map(|(n, grown)| (n, Some(grown))))
            .unwrap();
        let now = shared.snapshot();
        assert!(
            now.index().segment_count() <= 6,
            "{}",
            now.index().segment_count()
        );
        assert_eq!(now.index().live(), 31);
        assert_eq!(shared.merge_error(), None);
    }
}
