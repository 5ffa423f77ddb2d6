//! Reading one segment: its arrays memory-mapped from disk (checked against the manifest),
//! or held in memory for an index that was never written.

use crate::error::{Error, Result};
use crate::files::SegmentFile;
use crate::ivf::InvertedLists;
use crate::manifest::SegmentInfo;
use crate::meta::ImageMeta;
use crate::segment_writer::SegmentData;
use crate::single_int8::Int8Vectors;
use craterdex_errors::{ensure, IoContext, ResultExt};
use memmap2::Mmap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// A segment array: a read-only map of its file, or owned words (4-byte aligned, so the
/// bytes can be viewed as f32 or u32).
pub(crate) enum Bytes {
    Mapped(Mmap),
    Owned { words: Vec<u32>, len: usize },
}

impl Bytes {
    fn owned(bytes: &[u8]) -> Self {
        let mut words = vec![0u32; bytes.len().div_ceil(4)];
        bytemuck::cast_slice_mut::<u32, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        Bytes::Owned {
            words,
            len: bytes.len(),
        }
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned { words, len } => &bytemuck::cast_slice(words)[..*len],
        }
    }
}

fn map(path: &Path) -> Result<Mmap> {
    let f = std::fs::File::open(path).io("open", path)?;
    // SAFETY: segment files are immutable once named by a manifest; craterdex never rewrites
    // them (a rebuild writes a new directory and swaps it in).
    Ok(unsafe { Mmap::map(&f) }.io("map", path)?)
}

/// The shape of the index a segment belongs to.
pub(crate) struct Shape {
    pub single_dim: usize,
    pub tokens_per_image: usize,
    pub bytes_per_token: usize,
    pub has_scales: bool,
    /// IVF list count, for IVF indexes.
    pub lists: Option<usize>,
}

impl Shape {
    pub fn of(manifest: &crate::manifest::Manifest, codec: &crate::codec::TokenCodec) -> Self {
        Self {
            single_dim: manifest.single_dim,
            tokens_per_image: manifest.tokens_per_image,
            bytes_per_token: codec.bytes_per_token(),
            has_scales: codec.has_scales(),
            lists: manifest.ivf.as_ref().map(|i| i.lists),
        }
    }
}

/// A segment placed in an index: its rows are `first_row..first_row + count` of the index.
/// The arrays are shared, so an index reopened after a write keeps the segments it had
/// (maps, int8 copies) and opens only the new ones.
#[derive(Clone)]
pub(crate) struct Segment {
    pub first_row: usize,
    pub count: usize,
    arrays: Arc<Arrays>,
}

struct Arrays {
    single: Bytes,
    tokens: Bytes,
    scales: Option<Bytes>,
    lists: Option<InvertedLists>,
    /// int8 copies of the single vectors, made on first use (int8 indexes' stage 1).
    single_int8: OnceLock<Int8Vectors>,
}

impl Segment {
    /// Opens segment `info` of the index in `dir`: every file's size is checked against the
    /// manifest and the index's shape, and with `verify` its CRC32. Returns the segment and
    /// the metadata of its images.
    pub fn open(
        dir: &Path,
        info: &SegmentInfo,
        shape: &Shape,
        first_row: usize,
        verify: bool,
    ) -> Result<(Self, Vec<ImageMeta>)> {
        let sdir = dir.join(&info.name);
        let n = info.count;
        let open = |file: SegmentFile, expect: Option<usize>| -> Result<Mmap> {
            let p = sdir.join(file.name());
            let sum = info.files.get(file.name()).ok_or_else(|| {
                Error::Corrupt(format!(
                    "{}: manifest lists no {}",
                    sdir.display(),
                    file.name()
                ))
            })?;
            if let Some(expect) = expect {
                ensure!(
                    sum.bytes as usize == expect,
                    Error::Corrupt(format!(
                        "{}: manifest size {} disagrees with {n} images",
                        p.display(),
                        sum.bytes
                    ))
                );
            }
            let m = map(&p)?;
            sum.check(&p, &m, verify)?;
            Ok(m)
        };
        let elements = |per_image: usize| n.checked_mul(per_image).and_then(|v| v.checked_mul(4));
        let sizes = (
            elements(shape.single_dim),
            n.checked_mul(shape.tokens_per_image)
                .and_then(|v| v.checked_mul(shape.bytes_per_token)),
            elements(shape.tokens_per_image),
        );
        let (Some(single_bytes), Some(token_bytes), Some(scale_bytes)) = sizes else {
            return Err(crate::Error::Corrupt(format!(
                "{}: {n} images overflow the array sizes",
                sdir.display()
            )));
        };
        let single = open(SegmentFile::Single, Some(single_bytes))?;
        let tokens = open(SegmentFile::Tokens, Some(token_bytes))?;
        let scales = if shape.has_scales {
            Some(Bytes::Mapped(open(SegmentFile::Scales, Some(scale_bytes))?))
        } else {
            None
        };
        let meta_bytes = open(SegmentFile::Meta, None)?;
        let mut metas = Vec::with_capacity(n);
        for (line_no, line) in meta_bytes
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .enumerate()
        {
            metas.push(serde_json::from_slice::<ImageMeta>(line).map_err(|e| {
                Error::Corrupt(format!(
                    "{}/{} line {}: malformed: {e}",
                    sdir.display(),
                    SegmentFile::Meta.name(),
                    line_no + 1
                ))
            })?);
        }
        ensure!(
            metas.len() == n,
            Error::Corrupt(format!(
                "{}/{}: {} records, expected {n}",
                sdir.display(),
                SegmentFile::Meta.name(),
                metas.len()
            ))
        );
        let lists =
            match shape.lists {
                Some(lists) => {
                    let m = open(SegmentFile::Lists, elements(1))?;
                    let assignment: Vec<u32> = m
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                    Some(InvertedLists::build(&assignment, lists).with_context(|| {
                        format!("{}/{}", sdir.display(), SegmentFile::Lists.name())
                    })?)
                }
                None => None,
            };
        Ok((
            Self {
                first_row,
                count: n,
                arrays: Arc::new(Arrays {
                    single: Bytes::Mapped(single),
                    tokens: Bytes::Mapped(tokens),
                    scales,
                    lists,
                    single_int8: OnceLock::new(),
                }),
            },
            metas,
        ))
    }

    /// A segment held in memory.
    pub fn in_memory(
        data: SegmentData,
        first_row: usize,
        has_scales: bool,
        lists: Option<usize>,
    ) -> Result<(Self, Vec<ImageMeta>)> {
        let lists = match (data.lists.as_deref(), lists) {
            (Some(assignment), Some(lists)) => Some(InvertedLists::build(assignment, lists)?),
            _ => None,
        };
        Ok((
            Self {
                first_row,
                count: data.metas.len(),
                arrays: Arc::new(Arrays {
                    single: Bytes::owned(bytemuck::cast_slice(&data.single)),
                    tokens: Bytes::owned(&data.payload),
                    scales: has_scales.then(|| Bytes::owned(bytemuck::cast_slice(&data.scales))),
                    lists,
                    single_int8: OnceLock::new(),
                }),
            },
            data.metas,
        ))
    }

    /// The same segment at rows `first_row..` of another index.
    pub fn placed_at(&self, first_row: usize) -> Self {
        Self {
            first_row,
            ..self.clone()
        }
    }

    /// `[count, Ds]`
    pub fn single(&self) -> &[f32] {
        bytemuck::cast_slice(&self.arrays.single)
    }
    /// `[count, K, bytes per token]`
    pub fn tokens(&self) -> &[u8] {
        &self.arrays.tokens
    }
    /// `[count, K]` (int8 only).
    pub fn scales(&self) -> Option<&[f32]> {
        self.arrays.scales.as_deref().map(bytemuck::cast_slice)
    }
    pub fn lists(&self) -> Option<&InvertedLists> {
        self.arrays.lists.as_ref()
    }
    /// The int8 copies of the single vectors, quantised on first use.
    pub fn single_int8(&self, dim: usize) -> &Int8Vectors {
        self.arrays
            .single_int8
            .get_or_init(|| Int8Vectors::quantise(self.single(), dim))
    }
}
