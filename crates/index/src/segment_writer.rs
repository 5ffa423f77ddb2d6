//! Turning encoded images into one segment: the arrays in memory ([`SegmentData::encode`]),
//! then, for indexes on disk, the files of an immutable segment directory
//! ([`SegmentData::write`]: a temporary directory, synced, renamed into place).

use crate::codec::TokenCodec;
use crate::files::SegmentFile;
use crate::ivf::Ivf;
use crate::manifest::{FileSum, SegmentInfo};
use crate::meta::ImageMeta;
use anyhow::{ensure, Context, Result};
use craterdex_durable::{failpoint, sync_tree, tempdir_beside};
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
                "image {}: single vector has {} values, index expects {single_dim}",
                m.id,
                desc.single.len()
            );
            ensure!(
                desc.tokens.len() == k * codec.dim,
                "image {}: {} token values, index expects {k} tokens x {}",
                m.id,
                desc.tokens.len(),
                codec.dim
            );
        }
        let mut order: Vec<usize> = (0..images.len()).collect();
        let mut assignment = Vec::new();
        if let Some(ivf) = ivf {
            let singles: Vec<f32> = images
                .iter()
                .flat_map(|(_, d)| d.single.iter().copied())
                .collect();
            assignment = ivf.assign(&singles);
            order.sort_by_key(|&i| (assignment[i], i));
        }
        // encoding (PQ above all) runs in parallel over chunks of images, then joins in order
        let encoded: Vec<(Vec<u8>, Vec<f32>)> = order
            .par_chunks(256)
            .map(|chunk| {
                let (mut p, mut sc) = (Vec::new(), Vec::new());
                for &i in chunk {
                    codec.encode(&images[i].1.tokens, &mut p, &mut sc);
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
        let mut metas = Vec::with_capacity(images.len());
        for &i in &order {
            let (m, desc) = &images[i];
            single.extend_from_slice(&desc.single);
            metas.push(m.clone());
        }
        Ok(Self {
            single,
            payload,
            scales,
            metas,
            lists: ivf.map(|_| order.iter().map(|&i| assignment[i]).collect()),
        })
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
            std::fs::write(&path, bytes)
                .with_context(|| format!("cannot write {}", path.display()))?;
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
            std::fs::remove_dir_all(&target)
                .with_context(|| format!("cannot remove stale {}", target.display()))?;
        }
        std::fs::rename(&tmp, &target)
            .with_context(|| format!("cannot move segment into {}", target.display()))?;
        Ok(SegmentInfo {
            name: name.to_string(),
            count: self.metas.len(),
            files,
        })
    }
}
