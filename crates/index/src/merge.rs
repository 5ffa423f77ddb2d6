//! Merging segments, as tantivy and Lucene do: every add writes a segment of its own, so a
//! stream of single-image writes (the service, a pipeline adding as it detects) would leave
//! one segment per image and search would pay for each. A merge rewrites a few segments as
//! one, without their removed rows, beside the index; it becomes visible in one step, the
//! manifest naming the new segment instead of its sources, and the sources are deleted once
//! no manifest names them.
//!
//! Policy ([`MergePolicy`], log-structured as Lucene's `LogMergePolicy`): a segment's level
//! is `floor(log_F(live rows))` for the merge factor `F` (level 0 holds 1 to F-1 live rows,
//! level 1 F to F^2-1, ...). Once F segments lie on one level they are merged into one on the
//! next, so at most F-1 segments stay on each level: about (F-1) * log_F(N) segments for N
//! rows, and each row is rewritten about log_F(N) times. Segments of `max_merged_rows` live
//! rows or more are left alone (a built index's one big segment is never rewritten by adds).
//! A segment whose removed rows reach `purge_removed` of its rows is rewritten without them,
//! and one whose rows are all removed is dropped.
//!
//! Back-pressure (as Lucene's merge scheduler stalls indexing threads when merges fall
//! behind): a front end that merges in the background makes a write that leaves more than
//! `stall_segments` segments wait for the merge in progress and merge what the policy asks
//! before it returns. The default (64) lies above the (F-1) * log_F(max_merged_rows) = 42
//! segments the policy itself keeps at F = 8, so only merges falling behind stall writes.
//!
//! Crash safety: the merged segment is written under `.merge-staging` and renamed to its
//! segment name only while the write lock is held, just before the new manifest is written
//! atomically. Killed at any point, the index opens with the last manifest written, which
//! names only complete segments and keeps every acknowledged write; leftovers of a killed
//! merge or add are deleted by the next merge's commit.

use crate::error::Result;
use crate::files::{is_segment_dir_name, segment_dir, IndexFile};
use crate::index::Index;
use crate::manifest::{Manifest, SegmentInfo};
use crate::segment::Segment;
use craterdex_durable::{failpoint, FileLock};
use craterdex_errors::IoContext;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// When segments are merged (module docs).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MergePolicy {
    /// Segments of one level are merged once this many lie there (at least 2).
    pub merge_factor: usize,
    /// Segments with this many live rows or more are not merged with others.
    pub max_merged_rows: usize,
    /// A segment with at least this fraction of its rows removed is rewritten without them.
    pub purge_removed: f64,
    /// Merge every segment into one, without removed rows (Lucene's `forceMerge(1)`).
    pub into_one: bool,
    /// A write leaving more segments than this waits for merging (module docs).
    pub stall_segments: usize,
}

impl Default for MergePolicy {
    fn default() -> Self {
        Self {
            merge_factor: 8,
            max_merged_rows: 1 << 18,
            purge_removed: 0.25,
            into_one: false,
            stall_segments: 64,
        }
    }
}

impl MergePolicy {
    /// Every segment merged into one.
    pub fn into_one() -> Self {
        Self {
            into_one: true,
            ..Self::default()
        }
    }
}

/// Rows of one segment, as the policy sees them.
#[derive(Clone, Copy, Debug)]
pub struct SegmentRows {
    pub rows: usize,
    pub removed: usize,
}

impl SegmentRows {
    fn live(self) -> usize {
        self.rows - self.removed.min(self.rows)
    }
}

/// `floor(log_factor(live))`, with 0 for fewer than `factor` rows.
fn level(live: usize, factor: usize) -> u32 {
    let mut level = 0;
    let mut next = factor;
    while live >= next {
        level += 1;
        next = next.saturating_mul(factor);
    }
    level
}

/// The segments (positions in manifest order) the policy merges next; empty when none.
/// Never all segments into nothing: an index keeps at least one segment.
pub fn plan(segments: &[SegmentRows], policy: &MergePolicy) -> Vec<usize> {
    let all: Vec<usize> = (0..segments.len()).collect();
    let chosen = plan_any(segments, policy);
    let empties_all = chosen.len() == segments.len() && segments.iter().all(|s| s.live() == 0);
    if empties_all || (chosen == all && segments.len() == 1 && segments[0].removed == 0) {
        return Vec::new();
    }
    chosen
}

fn plan_any(segments: &[SegmentRows], policy: &MergePolicy) -> Vec<usize> {
    if policy.into_one {
        let needed = segments.len() > 1 || segments.iter().any(|s| s.removed > 0);
        return if needed {
            (0..segments.len()).collect()
        } else {
            Vec::new()
        };
    }
    // a segment whose every row is removed is dropped without writing anything
    if let Some(i) = segments.iter().position(|s| s.rows > 0 && s.live() == 0) {
        return vec![i];
    }
    let factor = policy.merge_factor.max(2);
    let mut levels: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, s) in segments.iter().enumerate() {
        if s.live() < policy.max_merged_rows {
            levels.entry(level(s.live(), factor)).or_default().push(i);
        }
    }
    if let Some(members) = levels.into_values().find(|m| m.len() >= factor) {
        return members;
    }
    segments
        .iter()
        .position(|s| s.removed > 0 && s.removed as f64 >= policy.purge_removed * s.rows as f64)
        .map_or_else(Vec::new, |i| vec![i])
}

/// What [`Index::merge`] did.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct MergeReport {
    pub merges: usize,
    /// Live rows copied into merged segments.
    pub rows_written: usize,
    /// Removed rows left out.
    pub rows_purged: usize,
    pub segments_before: usize,
    pub segments_after: usize,
}

/// A merged segment written beside the index, not yet named by its manifest
/// ([`Index::commit_merge`]). Holds the merge lock: one merger at a time.
pub struct PreparedMerge {
    dir: PathBuf,
    _merging: FileLock,
    sources: Vec<SegmentInfo>,
    /// `None` when every row of the sources was removed.
    staged: Option<SegmentInfo>,
    pub rows_written: usize,
    pub rows_purged: usize,
}

impl Drop for PreparedMerge {
    fn drop(&mut self) {
        if self.staged.is_some() {
            let _ = std::fs::remove_dir_all(self.dir.join(IndexFile::MergeStaging.name()));
        }
    }
}

impl Index {
    /// Writes the next merge the policy asks for beside this index's directory (as it is
    /// now); `None` when it asks for none, or when another merger is at work and `wait` is
    /// false (with `wait`, once it is done). Searches and writes go on meanwhile.
    pub fn prepare_merge(&self, policy: &MergePolicy, wait: bool) -> Result<Option<PreparedMerge>> {
        let dir = self.dir_or_err()?;
        let lock = dir.join(IndexFile::MergeLock.name());
        let merging = if wait {
            craterdex_durable::lock(&lock)?
        } else {
            match craterdex_durable::try_lock(&lock)? {
                Some(held) => held,
                None => return Ok(None),
            }
        };
        let idx = self.reopened()?;
        let rows: Vec<SegmentRows> = idx
            .segments
            .iter()
            .map(|s| SegmentRows {
                rows: s.count,
                removed: idx.deleted_rows[s.first_row..s.first_row + s.count]
                    .iter()
                    .filter(|&&d| d)
                    .count(),
            })
            .collect();
        let chosen = plan(&rows, policy);
        if chosen.is_empty() {
            return Ok(None);
        }
        let shape = idx.shape();
        let mut sources = Vec::new();
        let mut live = Vec::new();
        let mut rows_purged = 0;
        for &i in &chosen {
            let info = &idx.manifest.segments[i];
            let placed = &idx.segments[i];
            // the sources' checksums are verified: a merge must not carry a damaged file
            // into a new segment with fresh checksums
            Segment::open(dir, info, &shape, placed.first_row, true)?;
            for row in placed.first_row..placed.first_row + placed.count {
                if idx.deleted_rows[row] {
                    rows_purged += 1;
                } else {
                    live.push(row);
                }
            }
            sources.push(info.clone());
        }
        let mut data = idx.rows_data(&live);
        if let Some(ivf) = &idx.ivf {
            data = data.grouped_by_lists(ivf);
        }
        let rows_written = data.metas.len();
        let staged = if rows_written == 0 {
            None
        } else {
            Some(data.write(dir, IndexFile::MergeStaging.name(), idx.codec.has_scales())?)
        };
        failpoint("merge-after-staging");
        Ok(Some(PreparedMerge {
            dir: dir.to_path_buf(),
            _merging: merging,
            sources,
            staged,
            rows_written,
            rows_purged,
        }))
    }

    /// Makes a prepared merge visible: under the write lock, the merged segment takes its
    /// name and a new manifest names it instead of its sources. `false` (nothing changed)
    /// when the sources are no longer all in the index (it was rebuilt meanwhile).
    pub fn commit_merge(mut merge: PreparedMerge) -> Result<bool> {
        let dir = merge.dir.clone();
        let _writing = craterdex_durable::lock(&dir.join(IndexFile::WriteLock.name()))?;
        let mut manifest = Manifest::read(&dir)?;
        let positions: Option<Vec<usize>> = merge
            .sources
            .iter()
            .map(|s| manifest.segments.iter().position(|t| t == s))
            .collect();
        let Some(positions) = positions else {
            return Ok(false);
        };
        manifest.generation += 1;
        let mut merged = match merge.staged.take() {
            Some(mut info) => {
                let name = segment_dir(manifest.generation);
                let (from, to) = (dir.join(IndexFile::MergeStaging.name()), dir.join(&name));
                if to.exists() {
                    // an unreferenced leftover of a killed writer
                    std::fs::remove_dir_all(&to).io("remove the stale", &to)?;
                }
                std::fs::rename(&from, &to).io("move a merged segment into", &to)?;
                info.name = name;
                Some(info)
            }
            None => None,
        };
        let first = positions.iter().copied().min().unwrap_or(0);
        let mut segments = Vec::with_capacity(manifest.segments.len());
        for (i, s) in std::mem::take(&mut manifest.segments)
            .into_iter()
            .enumerate()
        {
            if i == first {
                segments.extend(merged.take());
            }
            if !positions.contains(&i) {
                segments.push(s);
            }
        }
        manifest.segments = segments;
        failpoint("merge-before-manifest");
        manifest.write(&dir)?;
        failpoint("merge-after-manifest");
        delete_unnamed(&dir, &manifest);
        Ok(true)
    }

    /// Merges by `policy` until it asks for nothing more (waiting for a merger at work first).
    pub fn merge(dir: &Path, policy: &MergePolicy) -> Result<MergeReport> {
        Ok(Self::open_with(dir, false)?.merged(policy)?.0)
    }

    /// Merges this index's directory by `policy` until it asks for nothing more (waiting for
    /// a merger at work first); returns what was done and the index as it then is.
    pub fn merged(&self, policy: &MergePolicy) -> Result<(MergeReport, Self)> {
        let mut idx = self.reopened()?;
        let mut report = MergeReport {
            segments_before: idx.segment_count(),
            ..MergeReport::default()
        };
        while let Some(merge) = idx.prepare_merge(policy, true)? {
            let (written, purged) = (merge.rows_written, merge.rows_purged);
            let committed = Self::commit_merge(merge)?;
            idx = idx.reopened()?;
            if !committed {
                break;
            }
            report.merges += 1;
            report.rows_written += written;
            report.rows_purged += purged;
        }
        report.segments_after = idx.segment_count();
        Ok((report, idx))
    }
}

/// Deletes what no manifest names any more: replaced segments, and the temporary
/// directories and manifests of killed writers. Called with the write and merge locks held, so no writer
/// is using them; readers that mapped a replaced segment keep their maps (on Windows the
/// deletion fails while one is open, and the next merge tries again).
fn delete_unnamed(dir: &Path, manifest: &Manifest) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let replaced =
            is_segment_dir_name(&name) && !manifest.segments.iter().any(|s| s.name == name);
        let path = entry.path();
        if path.is_dir() {
            let leftover = name.starts_with('.') && name.contains(".tmp-");
            if replaced || leftover {
                let _ = std::fs::remove_dir_all(&path);
            }
        } else if name.starts_with(&format!("{}.tmp-", IndexFile::Manifest.name())) {
            // a manifest whose writer was killed before renaming it into place
            let _ = std::fs::remove_file(&path);
        }
    }
    craterdex_durable::sync_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(live: &[usize]) -> Vec<SegmentRows> {
        live.iter()
            .map(|&rows| SegmentRows { rows, removed: 0 })
            .collect()
    }

    #[test]
    fn levels_are_powers_of_the_factor() {
        assert_eq!(
            [0, 1, 7, 8, 63, 64, 511, 512].map(|n| level(n, 8)),
            [0, 0, 0, 1, 1, 2, 2, 3]
        );
    }

    #[test]
    fn a_full_level_is_merged_and_others_wait() {
        let p = MergePolicy::default();
        assert!(plan(&rows(&[1; 7]), &p).is_empty());
        assert_eq!(plan(&rows(&[1; 8]), &p), (0..8).collect::<Vec<_>>());
        // seven small segments beside big ones: nothing yet; the eighth small one merges
        let mut segs = rows(&[5000, 64, 64]);
        segs.extend(rows(&[1; 7]));
        assert!(plan(&segs, &p).is_empty());
        segs.extend(rows(&[2]));
        assert_eq!(plan(&segs, &p), (3..11).collect::<Vec<_>>());
        // segments at the size cap are never merged
        let big = MergePolicy {
            max_merged_rows: 100,
            ..p.clone()
        };
        assert!(plan(&rows(&[100; 8]), &big).is_empty());
    }

    #[test]
    fn removed_rows_are_purged_and_empty_segments_dropped() {
        let p = MergePolicy::default();
        let mut segs = rows(&[1000, 3]);
        segs[0].removed = 100;
        assert!(plan(&segs, &p).is_empty(), "10% removed is kept");
        segs[0].removed = 300;
        assert_eq!(plan(&segs, &p), vec![0]);
        segs[1].removed = 3;
        assert_eq!(plan(&segs, &p), vec![1], "an emptied segment goes first");
        // but the last segment of an index is never merged into nothing
        let mut only = rows(&[4]);
        only[0].removed = 4;
        assert!(plan(&only, &p).is_empty());
        assert!(plan(&only, &MergePolicy::into_one()).is_empty());
    }

    #[test]
    fn into_one_merges_everything_once() {
        let p = MergePolicy::into_one();
        assert_eq!(plan(&rows(&[10, 1, 5]), &p), vec![0, 1, 2]);
        assert!(plan(&rows(&[10]), &p).is_empty());
        let mut one = rows(&[10]);
        one[0].removed = 1;
        assert_eq!(plan(&one, &p), vec![0]);
    }

    /// The bound the module docs state, by simulation of single adds.
    #[test]
    fn single_adds_keep_few_segments() {
        let p = MergePolicy::default();
        let mut segs: Vec<SegmentRows> = Vec::new();
        let mut written = 0usize;
        let mut most = 0;
        for _ in 0..10_000 {
            segs.push(SegmentRows {
                rows: 1,
                removed: 0,
            });
            written += 1;
            loop {
                let chosen = plan(&segs, &p);
                if chosen.is_empty() {
                    break;
                }
                let merged: usize = chosen.iter().map(|&i| segs[i].rows).sum();
                written += merged;
                let mut i = 0;
                segs.retain(|_| {
                    i += 1;
                    !chosen.contains(&(i - 1))
                });
                segs.push(SegmentRows {
                    rows: merged,
                    removed: 0,
                });
            }
            most = most.max(segs.len());
        }
        // (F-1) per level, levels 0..=4 for 10,000 rows at F = 8
        assert!(most <= 7 * 5, "{most} segments");
        assert_eq!(segs.iter().map(|s| s.rows).sum::<usize>(), 10_000);
        // each row written about 1 + log_8(10,000) ~ 5.4 times
        assert!(written < 10_000 * 6, "{written} rows written");
    }
}
