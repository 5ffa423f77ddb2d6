//! The names of the files of an index directory, in one place.
//!
//! ```text
//! index.json          manifest: format, version, dimensions, codec, segments with per-file
//!                     sizes and CRC32s, removed image ids; replaced atomically on every change
//! encoder.json        the descriptor recipe and its whitening (shared by gallery and queries)
//! codebooks.f32       PQ codebooks (PQ codecs only)
//! ivf.f32             IVF centroids [lists, Ds] (IVF indexes only)
//! write.lock          held by a writer (add, remove, a merge's commit); readers never lock
//! merge.lock          held by the one merger at work
//! .merge-staging/     the segment a merge is writing, renamed to seg-NNNNNN at its commit
//! seg-NNNNNN/         immutable segment: single.f32 [n, Ds], tokens.bin [n, K, bytes/token],
//!                     scales.f32 [n, K] (int8 only), meta.jsonl (one ImageMeta per image),
//!                     lists.u32 [n] (IVF list of each image; IVF indexes only)
//! ```

/// Files at the top of an index directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexFile {
    Manifest,
    Encoder,
    Codebooks,
    IvfCentroids,
    WriteLock,
    MergeLock,
    MergeStaging,
}

impl IndexFile {
    pub fn name(self) -> &'static str {
        match self {
            IndexFile::Manifest => "index.json",
            IndexFile::Encoder => "encoder.json",
            IndexFile::Codebooks => "codebooks.f32",
            IndexFile::IvfCentroids => "ivf.f32",
            IndexFile::WriteLock => "write.lock",
            IndexFile::MergeLock => "merge.lock",
            IndexFile::MergeStaging => ".merge-staging",
        }
    }
}

/// Files of one segment directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentFile {
    /// Single vectors, f32 `[n, Ds]`.
    Single,
    /// Token codes `[n, K, bytes per token]`.
    Tokens,
    /// int8 scales, f32 `[n, K]`.
    Scales,
    /// One JSON `ImageMeta` per line.
    Meta,
    /// IVF list of each image, u32 `[n]`.
    Lists,
}

impl SegmentFile {
    pub fn name(self) -> &'static str {
        match self {
            SegmentFile::Single => "single.f32",
            SegmentFile::Tokens => "tokens.bin",
            SegmentFile::Scales => "scales.f32",
            SegmentFile::Meta => "meta.jsonl",
            SegmentFile::Lists => "lists.u32",
        }
    }
}

/// The directory name of the segment written at `generation`.
pub fn segment_dir(generation: u64) -> String {
    format!("seg-{generation:06}")
}

/// Whether `name` is one that [`segment_dir`] gives (a manifest naming anything else, such
/// as a path, is refused).
pub fn is_segment_dir_name(name: &str) -> bool {
    name.strip_prefix("seg-")
        .is_some_and(|n| !n.is_empty() && n.len() <= 20 && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_round_trip_and_paths_are_refused() {
        assert_eq!(segment_dir(7), "seg-000007");
        assert!(is_segment_dir_name(&segment_dir(123_456_789)));
        for bad in ["seg-", "seg-1/..", "../seg-1", "seg-x", "/etc", ""] {
            assert!(!is_segment_dir_name(bad), "{bad}");
        }
    }
}
