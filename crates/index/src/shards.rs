//! A set of shard indexes: one catalogue cut into N ordinary indexes that a cluster serves
//! side by side. Every view of a crater lies in one shard (the key is the crater id, else the
//! image id), and every shard has the same encoder, codec and model, so scores from
//! different shards are comparable and a merged top-k is the top-k of the whole.
//!
//! ```text
//! shards.json         format "craterdex-shards", version 1, the key rule, each shard's
//!                     directory name and image count, the encoder's checksum
//! shard-NNN/          an ordinary craterdex index (crash-safe, merged, searched alone)
//! ```

use crate::error::{Error, Result};
use crate::files::IndexFile;
use crate::index::Index;
use crate::manifest::FileSum;
use crate::meta::ImageMeta;
use craterdex_errors::{ensure, IoContext, ResultExt};
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const SHARDS_FILE: &str = "shards.json";
pub const SHARDS_FORMAT: &str = "craterdex-shards";
/// How an image's shard is chosen, as `shards.json` records it.
pub const SHARD_KEY: &str = "crc32(crater_id, else image id) mod shards";

/// The most shards a set may have.
pub const MAX_SHARDS: usize = 4096;

/// What `shards.json` holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardSet {
    pub format: String,
    pub version: u32,
    pub key: String,
    pub shards: Vec<ShardEntry>,
    /// The `encoder.json` every shard shares.
    pub encoder: FileSum,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardEntry {
    /// Directory name inside the set (`shard-NNN`).
    pub name: String,
    pub images: usize,
}

/// The directory name of shard `i`.
pub fn shard_dir(i: usize) -> String {
    format!("shard-{i:03}")
}

/// The shard of an image with `crater_id` (or, without one, image id `id`) among `shards`.
pub fn shard_of_key(key: &str, shards: usize) -> usize {
    crc32fast::hash(key.as_bytes()) as usize % shards.max(1)
}

/// The shard of an image among `shards`: all views of one crater share it.
pub fn shard_of(meta: &ImageMeta, shards: usize) -> usize {
    let crater = meta.crater_id.as_deref().filter(|c| !c.is_empty());
    shard_of_key(crater.unwrap_or(&meta.id), shards)
}

/// Fails unless `shards` is a shard count a set may have.
pub fn check_count(shards: usize) -> Result<()> {
    ensure!(
        (1..=MAX_SHARDS).contains(&shards),
        Error::Invalid(format!("{shards} shards: give between 1 and {MAX_SHARDS}"))
    );
    Ok(())
}

impl ShardSet {
    /// The record of shard indexes already written as `out/shard-NNN` (`counts[i]` images
    /// in shard `i`), all with the encoder in `encoder_bytes`.
    pub fn new(counts: &[usize], encoder_bytes: &[u8]) -> Self {
        Self {
            format: SHARDS_FORMAT.into(),
            version: 1,
            key: SHARD_KEY.into(),
            shards: counts
                .iter()
                .enumerate()
                .map(|(i, &images)| ShardEntry {
                    name: shard_dir(i),
                    images,
                })
                .collect(),
            encoder: FileSum::of(encoder_bytes),
        }
    }

    /// Writes `out/shards.json` atomically: the last step of writing a set.
    pub fn write(&self, out: &Path) -> Result<()> {
        Ok(craterdex_durable::write_atomic(
            &out.join(SHARDS_FILE),
            &serde_json::to_vec_pretty(self)?,
        )?)
    }

    /// Reads and checks `dir/shards.json`: the format, the key rule, shard names, and that
    /// every shard's encoder is the one recorded (so that their scores are comparable).
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(SHARDS_FILE);
        let text = std::fs::read(&path)
            .io("read", &path)
            .with_context(|| format!("is {} a set of shards?", dir.display()))?;
        let set: ShardSet = serde_json::from_slice(&text)
            .map_err(|e| Error::Corrupt(format!("{}: malformed: {e}", path.display())))?;
        ensure!(
            set.format == SHARDS_FORMAT && set.version == 1,
            Error::Unsupported(format!(
                "{}: format {:?} version {}, this craterdex reads {SHARDS_FORMAT} version 1",
                path.display(),
                set.format,
                set.version
            ))
        );
        ensure!(
            set.key == SHARD_KEY,
            Error::Unsupported(format!("{}: shard key {:?}", path.display(), set.key))
        );
        check_count(set.shards.len()).with_context(|| path.display().to_string())?;
        for (i, s) in set.shards.iter().enumerate() {
            ensure!(
                s.name == shard_dir(i),
                Error::Corrupt(format!(
                    "{}: shard {i} is named {:?}, expected {:?}",
                    path.display(),
                    s.name,
                    shard_dir(i)
                ))
            );
            let epath = dir.join(&s.name).join(IndexFile::Encoder.name());
            let bytes = std::fs::read(&epath).io("read", &epath)?;
            ensure!(
                FileSum::of(&bytes) == set.encoder,
                Error::Corrupt(format!(
                    "{}: not the encoder of the other shards (scores would not compare)",
                    epath.display()
                ))
            );
        }
        Ok(set)
    }
}

impl Index {
    /// Writes this index's live images as `shards` shard indexes `out/shard-NNN` and
    /// `out/shards.json` (last). Each shard keeps this index's encoder, codec, model and
    /// IVF centroids, and a copy of each file named in `carried` that this index's directory
    /// holds (what workflows store beside an index, as a calibrated link rule). Fails,
    /// writing nothing, when a shard would hold no image.
    pub fn split(&self, out: &Path, shards: usize, carried: &[&str]) -> Result<ShardSet> {
        check_count(shards)?;
        let mut rows: Vec<Vec<usize>> = vec![Vec::new(); shards];
        for r in self.live_rows() {
            rows[shard_of(self.meta(r), shards)].push(r);
        }
        if let Some(empty) = rows.iter().position(Vec::is_empty) {
            return Err(Error::Invalid(format!(
                "shard {empty} of {shards} would hold no image ({} live images); use fewer shards",
                self.live()
            )));
        }
        craterdex_durable::create_dir_all(out)?;
        let encoder_bytes = serde_json::to_vec(&self.encoder)?;
        for (i, shard_rows) in rows.iter().enumerate() {
            let mut data = self.rows_data(shard_rows);
            if let Some(ivf) = &self.ivf {
                data = data.grouped_by_lists(ivf);
            }
            let manifest = Self::new_manifest(
                &encoder_bytes,
                &self.codec,
                self.model().map(str::to_string),
                self.single_dim(),
                self.tokens_per_image(),
                self.ivf(),
            )?;
            Self::write_new(
                &out.join(shard_dir(i)),
                manifest,
                &encoder_bytes,
                &self.codec,
                self.ivf(),
                std::iter::once(Ok(data)),
            )?;
            for name in carried {
                let Some(from) = self.dir().map(|d| d.join(name)).filter(|p| p.is_file()) else {
                    continue;
                };
                let bytes = std::fs::read(&from).io("read", &from)?;
                craterdex_durable::write_atomic(&out.join(shard_dir(i)).join(name), &bytes)?;
            }
        }
        let set = ShardSet::new(
            &rows.iter().map(Vec::len).collect::<Vec<_>>(),
            &encoder_bytes,
        );
        set.write(out)?;
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_of_a_crater_share_a_shard_and_keys_spread() {
        let view = |id: &str, crater: Option<&str>| ImageMeta {
            id: id.into(),
            crater_id: crater.map(str::to_string),
            ..Default::default()
        };
        for n in [2, 3, 7] {
            assert_eq!(
                shard_of(&view("a-2x", Some("c17")), n),
                shard_of(&view("a-3x", Some("c17")), n)
            );
        }
        assert_eq!(shard_of(&view("x", None), 5), shard_of_key("x", 5));
        let mut counts = [0usize; 4];
        for i in 0..4000 {
            counts[shard_of_key(&format!("crater-{i}"), 4)] += 1;
        }
        assert!(
            counts.iter().all(|&c| (900..1100).contains(&c)),
            "{counts:?}"
        );
    }
}
