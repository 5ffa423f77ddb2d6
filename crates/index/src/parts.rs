//! Building an index in parts, for builds spread over many processes or machines: each
//! part is a segment written on its own ([`write_part`], by any worker, into a staging
//! directory on a shared filesystem), and [`commit_parts`] joins them, in order, into one
//! index through the same atomic path as a one-shot build. A part is complete once its
//! `part.json` exists; a part written again (a retried task) is replaced whole.

use crate::codec::TokenCodec;
use crate::error::{Error, Result};
use crate::index::{Index, IvfChoice};
use crate::manifest::SegmentInfo;
use crate::meta::ImageMeta;
use crate::segment::{Segment, Shape};
use crate::segment_writer::SegmentData;
use craterdex_durable::write_atomic;
use craterdex_errors::{ensure, IoContext, OrInvalid};
use craterdex_tokens::{Descriptors, Encoder};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The file that marks a part complete and records its files' sizes and checksums.
pub const PART_FILE: &str = "part.json";

#[derive(Serialize, Deserialize)]
struct PartInfo {
    single_dim: usize,
    tokens_per_image: usize,
    segment: SegmentInfo,
}

fn parent_and_name(dir: &Path) -> Result<(PathBuf, String)> {
    let name = dir
        .file_name()
        .or_invalid_with(|| format!("{}: a part needs a directory name", dir.display()))?
        .to_string_lossy()
        .to_string();
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name))
}

/// Encodes `images` with `codec` and writes them as the part at `dir` (replacing a part
/// there). Returns how many images it holds.
pub fn write_part(
    dir: &Path,
    codec: &TokenCodec,
    images: &[(ImageMeta, Descriptors)],
) -> Result<usize> {
    ensure!(
        !images.is_empty(),
        Error::Invalid(format!(
            "{}: a part needs at least one image",
            dir.display()
        ))
    );
    let single_dim = images[0].1.single.len();
    let k = images[0].1.tokens.len() / codec.dim.max(1);
    let data = SegmentData::encode(codec, k, single_dim, images, None)?;
    let (parent, name) = parent_and_name(dir)?;
    let marker = dir.join(PART_FILE);
    if marker.exists() {
        std::fs::remove_file(&marker).io("remove", &marker)?;
    }
    std::fs::create_dir_all(&parent).io("create", &parent)?;
    let segment = data.write(&parent, &name, codec.has_scales())?;
    let info = PartInfo {
        single_dim,
        tokens_per_image: k,
        segment,
    };
    write_atomic(&marker, &serde_json::to_vec_pretty(&info)?)?;
    Ok(images.len())
}

/// An open, checked part.
struct Part {
    segment: Segment,
    metas: Vec<ImageMeta>,
}

/// The record that marks the part at `dir` complete.
fn read_info(dir: &Path) -> Result<PartInfo> {
    let marker = dir.join(PART_FILE);
    let bytes = std::fs::read(&marker).or_invalid_with(|| {
        format!(
            "{}: the part is incomplete (no {PART_FILE}); write it again",
            dir.display()
        )
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| Error::Corrupt(format!("{}: malformed: {e}", marker.display())))
}

/// How many images the part at `dir` holds (from its record; nothing else is read).
pub fn part_images(dir: &Path) -> Result<usize> {
    Ok(read_info(dir)?.segment.count)
}

fn open_part(dir: &Path, codec: &TokenCodec) -> Result<(Part, usize, usize)> {
    let mut info = read_info(dir)?;
    let (parent, name) = parent_and_name(dir)?;
    info.segment.name = name;
    let shape = Shape {
        single_dim: info.single_dim,
        tokens_per_image: info.tokens_per_image,
        bytes_per_token: codec.bytes_per_token(),
        has_scales: codec.has_scales(),
        lists: None,
    };
    let (segment, metas) = Segment::open(&parent, &info.segment, &shape, 0, true)?;
    Ok((
        Part { segment, metas },
        info.single_dim,
        info.tokens_per_image,
    ))
}

/// The single vectors of the part at `dir`, `[n, Ds]` (what IVF lists are trained on).
pub fn part_singles(dir: &Path, codec: &TokenCodec) -> Result<Vec<f32>> {
    Ok(open_part(dir, codec)?.0.segment.single().to_vec())
}

/// Joins the parts at `parts` (in order: their rows become the index's rows in that order,
/// grouped by IVF list within each part when `ivf` is given) into a new index at `dir`,
/// replacing any index there once the new one is complete. Every part's files are checked
/// against the checksums its writer recorded. Returns the number of images.
pub fn commit_parts(
    dir: &Path,
    encoder: &Encoder,
    codec: &TokenCodec,
    model: Option<String>,
    parts: &[PathBuf],
    ivf: IvfChoice,
) -> Result<usize> {
    ensure!(
        !parts.is_empty(),
        Error::Invalid("no parts to commit".into())
    );
    crate::index::check_learned(encoder, codec, ivf)?;
    let first = read_info(&parts[0])?;
    let (single_dim, k) = (first.single_dim, first.tokens_per_image);
    let encoder_bytes = serde_json::to_vec(encoder)?;
    let manifest = Index::new_manifest(&encoder_bytes, codec, model, single_dim, k, ivf)?;
    let mut images = 0;
    let segments = parts.iter().map(|p| -> Result<SegmentData> {
        let (part, ds, kk) = open_part(p, codec)?;
        ensure!(
            ds == single_dim && kk == k,
            Error::Invalid(format!(
                "{}: {kk} tokens and {ds}-d single vectors per image, the first part has {k} and {single_dim}",
                p.display()
            ))
        );
        images += part.metas.len();
        let data = SegmentData {
            single: part.segment.single().to_vec(),
            payload: part.segment.tokens().to_vec(),
            scales: part.segment.scales().map(<[f32]>::to_vec).unwrap_or_default(),
            metas: part.metas,
            lists: None,
        };
        Ok(match ivf {
            Some((ivf, _)) => data.grouped_by_lists(ivf),
            None => data,
        })
    });
    Index::write_new(dir, manifest, &encoder_bytes, codec, ivf, segments)?;
    Ok(images)
}
