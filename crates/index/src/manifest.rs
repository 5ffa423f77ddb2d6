//! The manifest (`index.json`): what an index holds and the size and CRC32 of every file it
//! names. It is the index's single point of truth: a file the manifest does not name does not
//! exist for readers, and a new manifest is written beside the old one and renamed over it.

use crate::codec::Codec;
use crate::error::{Error, Result};
use crate::files::IndexFile;
use craterdex_errors::{ensure, IoContext, ResultExt};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

pub const INDEX_FORMAT: &str = "craterdex-index";
pub const INDEX_VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FileSum {
    pub bytes: u64,
    pub crc32: u32,
}

impl FileSum {
    pub fn of(bytes: &[u8]) -> Self {
        Self {
            bytes: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
        }
    }

    /// Fails unless `bytes` (read from `path`) has this size and, with `verify`, this CRC32.
    pub fn check(&self, path: &Path, bytes: &[u8], verify: bool) -> Result<()> {
        ensure!(
            bytes.len() as u64 == self.bytes,
            Error::Corrupt(format!(
                "{}: {} bytes, the manifest says {} (truncated or overwritten file)",
                path.display(),
                bytes.len(),
                self.bytes
            ))
        );
        if verify {
            let got = crc32fast::hash(bytes);
            ensure!(
                got == self.crc32,
                Error::Corrupt(format!(
                    "{}: checksum {got:08x}, the manifest says {:08x} (corrupt file)",
                    path.display(),
                    self.crc32
                ))
            );
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SegmentInfo {
    pub name: String,
    pub count: usize,
    pub files: BTreeMap<String, FileSum>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IvfInfo {
    pub lists: usize,
    /// Lists a query scans unless told otherwise.
    pub nprobe: usize,
    pub centroids: FileSum,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub generation: u64,
    pub single_dim: usize,
    pub token_dim: usize,
    pub tokens_per_image: usize,
    pub codec: Codec,
    pub model: Option<String>,
    pub encoder: FileSum,
    pub codebooks: Option<FileSum>,
    pub segments: Vec<SegmentInfo>,
    /// Ids of removed images (ids are not reused before a rebuild).
    pub deleted: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ivf: Option<IvfInfo>,
}

impl Manifest {
    /// Reads and checks the manifest of the index in `dir`.
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(IndexFile::Manifest.name());
        let text = std::fs::read(&path)
            .io("read", &path)
            .with_context(|| format!("is {} an index?", dir.display()))?;
        Self::parse(&text).with_context(|| path.display().to_string())
    }

    /// Parses manifest bytes: the format and version first (so that an index of another
    /// version says so), then the whole document.
    pub fn parse(text: &[u8]) -> Result<Self> {
        let probe: serde_json::Value = serde_json::from_slice(text)
            .map_err(|e| Error::Corrupt(format!("not JSON (corrupt manifest): {e}")))?;
        ensure!(
            probe.get("format").and_then(|v| v.as_str()) == Some(INDEX_FORMAT),
            Error::Corrupt("not a craterdex index manifest".into())
        );
        let version = probe.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
        ensure!(
            version == INDEX_VERSION as u64,
            Error::Unsupported(format!(
                "index format version {version}, this craterdex reads version {INDEX_VERSION}; rebuild the index"
            ))
        );
        let m: Manifest = serde_json::from_slice(text)
            .map_err(|e| Error::Corrupt(format!("malformed manifest: {e}")))?;
        m.validate()?;
        Ok(m)
    }

    /// Checks what the rest of the code relies on, so that a hostile manifest is an error
    /// rather than an out-of-bounds access or an absurd allocation later.
    fn validate(&self) -> Result<()> {
        ensure!(
            self.single_dim > 0 && self.single_dim <= 1 << 16,
            Error::Corrupt(format!("single_dim {} out of range", self.single_dim))
        );
        ensure!(
            self.token_dim > 0 && self.token_dim <= 1 << 16,
            Error::Corrupt(format!("token_dim {} out of range", self.token_dim))
        );
        ensure!(
            self.tokens_per_image <= 1 << 16,
            Error::Corrupt(format!(
                "tokens_per_image {} out of range",
                self.tokens_per_image
            ))
        );
        if let Codec::Pq { m } = self.codec {
            ensure!(
                m > 0 && self.token_dim.is_multiple_of(m),
                Error::Corrupt(format!(
                    "PQ with m = {m} does not divide the token dimension {}",
                    self.token_dim
                ))
            );
        }
        let mut names = BTreeSet::new();
        for s in &self.segments {
            ensure!(
                crate::files::is_segment_dir_name(&s.name),
                Error::Corrupt(format!(
                    "segment name {:?} is not a segment directory name",
                    s.name
                ))
            );
            ensure!(
                names.insert(&s.name),
                Error::Corrupt(format!("segment {:?} listed twice", s.name))
            );
            ensure!(
                s.count <= 1 << 40,
                Error::Corrupt(format!("segment {}: {} images", s.name, s.count))
            );
        }
        if let Some(ivf) = &self.ivf {
            ensure!(
                ivf.lists >= 1 && ivf.lists <= 1 << 24,
                Error::Corrupt(format!("IVF lists {} out of range", ivf.lists))
            );
        }
        Ok(())
    }

    /// Replaces the manifest of `dir` atomically.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(IndexFile::Manifest.name());
        Ok(craterdex_durable::write_atomic(
            &path,
            &serde_json::to_vec_pretty(self)?,
        )?)
    }
}
