//! Turning encoded images into one segment: the arrays in memory ([`SegmentData::encode`]),
//! then, for indexes on disk, the files of an immutable segment directory
//! ([`SegmentData::write`]: a temporary directory, synced, renamed into place).

use crate::codec::TokenCodec;
use crate::error::{Error, Result};
use crate::files::SegmentFile;
use crate::ivf::Ivf;
use crate::manifest::{FileSum, SegmentInfo};
use crate::meta::ImageMeta;
use craterdex_durable::{failpoint, sync_tree, tempdir_beside};
use craterdex_errors::{ensure, IoContext};
use craterdex_tokens::Descriptors;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

/// A segment's arrays, in row order.
pub struct SegmentData {
    /// `[n, Ds]`
    pub single: Vec<f32>,
    /// `[n, K, bytes per token]`
    pub payload: Vec<u8>,
    /// `[n, K]` (int8 only, else empty)
    pub scales: Vec<f32>,
    pub metas: Vec<ImageMeta>,
    /// The IVF list of each row (IVF indexes only).
    pub lists: Option<Vec<u32>>,
}

impl SegmentData {
    /// Checks and encodes `images`. With IVF, rows are grouped by list, so that scanning a
    /// list reads one contiguous run of single vectors.
    pub fn encode(
        codec: &TokenCodec,
        k: usize,
        single_dim: usize,
        images: &[(ImageMeta, Descriptors)],
        ivf: Option<&Ivf>,
    ) -> Result<Self> {
        for (m, desc) in images {
            ensure!(
                desc.single.len() == single_dim,
                Error::Invalid(format!(
                    "image {}: single vector has {} values, index expects {single_dim}",
                    m.id,
                    desc.single.len()
                ))
            );
            ensure!(
                desc.tokens.len() == k * codec.dim,
                Error::Invalid(format!(
                    "image {}: {} token values, index expects {k} tokens x {}",
                    m.id,
                    desc.tokens.len(),
                    codec.dim
                ))
            );
            // nothing non-finite reaches a file: it would poison every score it meets
            ensure!(
                desc.single
                    .iter()
                    .chain(&desc.tokens)
                    .all(|v| v.is_finite()),
                Error::Invalid(format!(
                    "image {}: its descriptors are not all finite numbers",
                    m.id
                ))
            );
        }
        // encoding (PQ above all) runs in parallel over chunks of images, then joins in order
        let encoded: Vec<(Vec<u8>, Vec<f32>)> = images
            .par_chunks(256)
            .map(|chunk| {
                let (mut p, mut sc) = (Vec::new(), Vec::new());
                for (_, desc) in chunk {
                    codec.encode(&desc.tokens, &mut p, &mut sc);
                }
                (p, sc)
            })
            .collect();
        let mut payload = Vec::with_capacity(images.len() * k * codec.bytes_per_token());
        let mut scales = Vec::new();
        for (p, sc) in encoded {
            payload.extend_from_slice(&p);
            scales.extend_from_slice(&sc);
        }
        let mut single = Vec::with_capacity(images.len() * single_dim);
        for (_, desc) in images {
            single.extend_from_slice(&desc.single);
        }
        let data = Self {
            single,
            payload,
            scales,
            metas: images.iter().map(|(m, _)| m.clone()).collect(),
            lists: None,
        };
        Ok(match ivf {
            Some(ivf) => data.grouped_by_lists(ivf),
            None => data,
        })
    }

    /// The same rows grouped by IVF list (in their order within a list), each row's list
    /// recorded.
    pub fn grouped_by_lists(self, ivf: &Ivf) -> Self {
        let n = self.metas.len();
        if n == 0 {
            return Self {
                lists: Some(Vec::new()),
                ..self
            };
        }
        let ds = self.single.len() / n;
        let (bytes_per_row, scales_per_row) = (self.payload.len() / n, self.scales.len() / n);
        let assignment = ivf.assign(&self.single);
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| (assignment[i], i));
        let gather = |v: &[f32], w: usize| -> Vec<f32> {
            order
                .iter()
                .flat_map(|&i| v[i * w..(i + 1) * w].iter().copied())
                .collect()
        };
        Self {
            single: gather(&self.single, ds),
            payload: order
                .iter()
                .flat_map(|&i| {
                    self.payload[i * bytes_per_row..(i + 1) * bytes_per_row]
                        .iter()
                        .copied()
                })
                .collect(),
            scales: gather(&self.scales, scales_per_row),
            metas: order.iter().map(|&i| self.metas[i].clone()).collect(),
            lists: Some(order.iter().map(|&i| assignment[i]).collect()),
        }
    }

    /// Writes the segment as `dir/name` and returns its manifest entry.
    pub fn write(&self, dir: &Path, name: &str, has_scales: bool) -> Result<SegmentInfo> {
        let mut meta = Vec::new();
        for m in &self.metas {
            serde_json::to_writer(&mut meta, m)?;
            meta.push(b'\n');
        }
        let tmp = tempdir_beside(&dir.join(name))?;
        let mut files = BTreeMap::new();
        let mut put = |file: SegmentFile, bytes: &[u8]| -> Result<()> {
            let path = tmp.join(file.name());
            std::fs::write(&path, bytes).io("write", &path)?;
            files.insert(file.name().to_string(), FileSum::of(bytes));
            Ok(())
        };
        put(SegmentFile::Single, bytemuck::cast_slice(&self.single))?;
        failpoint("index-mid-segment");
        put(SegmentFile::Tokens, &self.payload)?;
        if has_scales {
            put(SegmentFile::Scales, bytemuck::cast_slice(&self.scales))?;
        }
        put(SegmentFile::Meta, &meta)?;
        if let Some(lists) = &self.lists {
            put(SegmentFile::Lists, bytemuck::cast_slice(lists))?;
        }
        sync_tree(&tmp);
        let target = dir.join(name);
        if target.exists() {
            // an unreferenced leftover of an interrupted add
            std::fs::remove_dir_all(&target).io("remove the stale", &target)?;
        }
        std::fs::rename(&tmp, &target).io("move a segment into", &target)?;
        Ok(SegmentInfo {
            name: name.to_string(),
            count: self.metas.len(),
            files,
        })
    }
}
