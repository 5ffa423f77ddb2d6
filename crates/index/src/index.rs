//! An open index, and the three writes to an index directory: build (a complete directory
//! beside the old one, swapped in), add (a new segment, then a new manifest), remove (a new
//! manifest). A crash at any point leaves the previous manifest, which names only complete,
//! checksummed segments. Indexes can also be held in memory only (evaluation).

use crate::codec::TokenCodec;
use crate::error::{Error, Result};
use crate::files::{segment_dir, IndexFile};
use crate::ivf::Ivf;
use crate::manifest::{FileSum, IvfInfo, Manifest, INDEX_FORMAT, INDEX_VERSION};
use crate::meta::ImageMeta;
use crate::segment::{Segment, Shape};
use crate::segment_writer::SegmentData;
use craterdex_durable::{failpoint, replace_dir, tempdir_beside};
use craterdex_errors::{ensure, IoContext};
use craterdex_tokens::{Descriptors, Encoder};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// An open index: arrays memory-mapped (or in memory), metadata in memory.
pub struct Index {
    dir: Option<PathBuf>,
    pub(crate) manifest: Manifest,
    pub encoder: Encoder,
    pub codec: TokenCodec,
    pub(crate) ivf: Option<Ivf>,
    pub(crate) segments: Vec<Segment>,
    pub(crate) metas: Vec<ImageMeta>,
    pub(crate) deleted_rows: Vec<bool>,
    rows_by_id: HashMap<String, usize>,
    /// Live rows of every crater seen in more than one image; made on the first search that
    /// groups views, so opening an index does not pay for it.
    pub(crate) views: std::sync::OnceLock<HashMap<String, Vec<usize>>>,
}

/// The IVF stage 1 to build with: centroids, and the `nprobe` queries use by default.
pub type IvfChoice<'a> = Option<(&'a Ivf, usize)>;

/// What learning made of an index (whitening, codebooks, IVF centroids), checked before it
/// is written as reading it back will check it: nothing non-finite reaches a file.
pub(crate) fn check_learned(encoder: &Encoder, codec: &TokenCodec, ivf: IvfChoice) -> Result<()> {
    encoder.validate()?;
    ensure!(
        codec.codebooks.iter().all(|v| v.is_finite())
            && ivf.is_none_or(|(i, _)| i.centroids.iter().all(|v| v.is_finite())),
        Error::Invalid("the codec's codebooks or the IVF centroids are not all finite".into())
    );
    Ok(())
}

/// Everything a new index is made of, before it is written or held in memory.
struct Assembled {
    manifest: Manifest,
    encoder_bytes: Vec<u8>,
    segment: SegmentData,
}

fn le_f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn read_file(path: &Path) -> Result<Vec<u8>> {
    Ok(std::fs::read(path).io("read", path)?)
}

impl Index {
    /// The manifest of a new index (no segments yet) of `single_dim`-d single vectors and
    /// `k` tokens per image.
    pub(crate) fn new_manifest(
        encoder_bytes: &[u8],
        codec: &TokenCodec,
        model: Option<String>,
        single_dim: usize,
        k: usize,
        ivf: IvfChoice,
    ) -> Result<Manifest> {
        let codebooks = (!codec.codebooks.is_empty())
            .then(|| FileSum::of(bytemuck::cast_slice(&codec.codebooks)));
        let ivf_info = match ivf {
            Some((ivf, nprobe)) => {
                ensure!(
                    ivf.dim == single_dim,
                    Error::Invalid(format!(
                        "IVF centroids are {}-d, single vectors {single_dim}-d",
                        ivf.dim
                    ))
                );
                Some(IvfInfo {
                    lists: ivf.lists(),
                    nprobe: nprobe.clamp(1, ivf.lists()),
                    centroids: FileSum::of(bytemuck::cast_slice(&ivf.centroids)),
                })
            }
            None => None,
        };
        Ok(Manifest {
            format: INDEX_FORMAT.into(),
            version: INDEX_VERSION,
            generation: 1,
            single_dim,
            token_dim: codec.dim,
            tokens_per_image: k,
            codec: codec.codec,
            model,
            encoder: FileSum::of(encoder_bytes),
            codebooks,
            segments: Vec::new(),
            deleted: BTreeSet::new(),
            ivf: ivf_info,
        })
    }

    fn assemble(
        encoder: &Encoder,
        codec: &TokenCodec,
        model: Option<String>,
        images: &[(ImageMeta, Descriptors)],
        ivf: IvfChoice,
    ) -> Result<Assembled> {
        ensure!(
            !images.is_empty(),
            Error::Invalid("cannot build an index from zero images".into())
        );
        check_unique(images.iter().map(|(m, _)| m.id.as_str()), &HashMap::new())?;
        check_learned(encoder, codec, ivf)?;
        let single_dim = images[0].1.single.len();
        let k = images[0].1.tokens.len() / codec.dim.max(1);
        let encoder_bytes = serde_json::to_vec(encoder)?;
        let manifest = Self::new_manifest(&encoder_bytes, codec, model, single_dim, k, ivf)?;
        let segment = SegmentData::encode(codec, k, single_dim, images, ivf.map(|(i, _)| i))?;
        Ok(Assembled {
            manifest,
            encoder_bytes,
            segment,
        })
    }

    /// Builds a new index at `dir` from encoded images, replacing any index there only once
    /// the new one is complete. With `ivf`, stage 1 goes through IVF lists; images added
    /// later are assigned to the same centroids.
    pub fn create(
        dir: &Path,
        encoder: &Encoder,
        codec: &TokenCodec,
        model: Option<String>,
        images: &[(ImageMeta, Descriptors)],
        ivf: IvfChoice,
    ) -> Result<()> {
        let a = Self::assemble(encoder, codec, model, images, ivf)?;
        Self::write_new(
            dir,
            a.manifest,
            &a.encoder_bytes,
            codec,
            ivf,
            std::iter::once(Ok(a.segment)),
        )
    }

    /// Writes a complete index with `manifest` (no segments yet) and `segments` beside
    /// `dir`, then swaps it in: a crash before the swap leaves the old index as it was.
    /// Image ids must be unique across the segments.
    pub(crate) fn write_new(
        dir: &Path,
        mut manifest: Manifest,
        encoder_bytes: &[u8],
        codec: &TokenCodec,
        ivf: IvfChoice,
        segments: impl Iterator<Item = Result<SegmentData>>,
    ) -> Result<()> {
        let tmp = tempdir_beside(dir)?;
        let written = (|| -> Result<()> {
            let write = |file: IndexFile, bytes: &[u8]| -> Result<()> {
                let p = tmp.join(file.name());
                Ok(std::fs::write(&p, bytes).io("write", &p)?)
            };
            write(IndexFile::Encoder, encoder_bytes)?;
            if manifest.codebooks.is_some() {
                write(IndexFile::Codebooks, bytemuck::cast_slice(&codec.codebooks))?;
            }
            if let Some((ivf, _)) = ivf {
                write(
                    IndexFile::IvfCentroids,
                    bytemuck::cast_slice(&ivf.centroids),
                )?;
            }
            let mut seen: BTreeSet<String> = BTreeSet::new();
            for (i, segment) in segments.enumerate() {
                let segment = segment?;
                for m in &segment.metas {
                    ensure!(
                        !m.id.is_empty(),
                        Error::Invalid("an image id is empty".into())
                    );
                    ensure!(
                        seen.insert(m.id.clone()),
                        Error::Invalid(format!("image id {:?} appears twice", m.id))
                    );
                }
                let info = segment.write(&tmp, &segment_dir(i as u64 + 1), codec.has_scales())?;
                manifest.segments.push(info);
            }
            ensure!(
                !seen.is_empty(),
                Error::Invalid("cannot build an index from zero images".into())
            );
            // later adds number their segments after the ones written here
            manifest.generation = manifest.segments.len() as u64;
            write(IndexFile::Manifest, &serde_json::to_vec_pretty(&manifest)?)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        failpoint("index-before-swap");
        // a merge committing into the old directory finishes first; after the swap it finds
        // its sources gone and gives up
        let _writing = dir
            .join(IndexFile::Manifest.name())
            .exists()
            .then(|| craterdex_durable::lock(&dir.join(IndexFile::WriteLock.name())))
            .transpose()?;
        Ok(replace_dir(&tmp, dir)?)
    }

    /// The same index as [`Index::create`] would write, held in memory only (it cannot be
    /// added to or removed from).
    pub fn in_memory(
        encoder: &Encoder,
        codec: &TokenCodec,
        model: Option<String>,
        images: &[(ImageMeta, Descriptors)],
        ivf: IvfChoice,
    ) -> Result<Self> {
        let a = Self::assemble(encoder, codec, model, images, ivf)?;
        let mut manifest = a.manifest;
        let lists = manifest.ivf.as_ref().map(|i| i.lists);
        let (segment, metas) = Segment::in_memory(a.segment, 0, codec.has_scales(), lists)?;
        manifest.segments.push(crate::manifest::SegmentInfo {
            name: segment_dir(1),
            count: segment.count,
            files: Default::default(),
        });
        Ok(Self::from_parts(
            None,
            manifest,
            encoder.clone(),
            codec.clone(),
            ivf.map(|(i, _)| i.clone()),
            vec![segment],
            metas,
        ))
    }

    fn from_parts(
        dir: Option<PathBuf>,
        manifest: Manifest,
        encoder: Encoder,
        codec: TokenCodec,
        ivf: Option<Ivf>,
        segments: Vec<Segment>,
        metas: Vec<ImageMeta>,
    ) -> Self {
        let deleted_rows: Vec<bool> = metas
            .iter()
            .map(|m| manifest.deleted.contains(&m.id))
            .collect();
        let rows_by_id = metas
            .iter()
            .enumerate()
            .filter(|(r, _)| !deleted_rows[*r])
            .map(|(r, m)| (m.id.clone(), r))
            .collect();
        Self {
            dir,
            manifest,
            encoder,
            codec,
            ivf,
            segments,
            metas,
            deleted_rows,
            rows_by_id,
            views: std::sync::OnceLock::new(),
        }
    }

    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_with(dir, true)
    }

    /// Opens an index; `verify` checks every file's CRC32 (sizes are always checked).
    pub fn open_with(dir: &Path, verify: bool) -> Result<Self> {
        // A merge deletes the segments it replaced once its manifest is written: a reader
        // that read the manifest just before may find one gone, and reads the new manifest.
        let mut attempt = 0;
        loop {
            let manifest = Manifest::read(dir)?;
            match Self::open_manifest(dir, manifest.clone(), verify) {
                Err(_) if attempt < 3 && Manifest::read(dir).is_ok_and(|m| m != manifest) => {
                    attempt += 1;
                }
                opened => return opened,
            }
        }
    }

    fn open_manifest(dir: &Path, manifest: Manifest, verify: bool) -> Result<Self> {
        let epath = dir.join(IndexFile::Encoder.name());
        let enc_bytes = read_file(&epath)?;
        manifest.encoder.check(&epath, &enc_bytes, verify)?;
        let encoder: Encoder = serde_json::from_slice(&enc_bytes)
            .map_err(|e| Error::Corrupt(format!("{}: malformed encoder: {e}", epath.display())))?;
        let width = encoder
            .validate()
            .map_err(|e| Error::Corrupt(format!("{}: invalid encoder: {e}", epath.display())))?;
        if let Some(d) = width {
            ensure!(
                encoder.token_dim(d) == manifest.token_dim && encoder.single_dim(d) == manifest.single_dim,
                Error::Corrupt(format!(
                    "{}: the encoder gives {}-d tokens and {}-d single vectors, the manifest says {} and {}",
                    epath.display(),
                    encoder.token_dim(d),
                    encoder.single_dim(d),
                    manifest.token_dim,
                    manifest.single_dim
                ))
            );
        }
        let mut codec = TokenCodec {
            codec: manifest.codec,
            dim: manifest.token_dim,
            codebooks: Vec::new(),
            pq_tables: Default::default(),
        };
        if let Some(sum) = &manifest.codebooks {
            let cpath = dir.join(IndexFile::Codebooks.name());
            let b = read_file(&cpath)?;
            sum.check(&cpath, &b, verify)?;
            ensure!(
                b.len() == codec.codebook_bytes(),
                Error::Corrupt(format!(
                    "{}: {} bytes, the codec needs {}",
                    cpath.display(),
                    b.len(),
                    codec.codebook_bytes()
                ))
            );
            codec.codebooks = le_f32s(&b);
        }
        let ivf = match &manifest.ivf {
            Some(info) => {
                let p = dir.join(IndexFile::IvfCentroids.name());
                let b = read_file(&p)?;
                info.centroids.check(&p, &b, verify)?;
                ensure!(
                    b.len() == info.lists * manifest.single_dim * 4,
                    Error::Corrupt(format!(
                        "{}: {} bytes for {} lists of {}-d",
                        p.display(),
                        b.len(),
                        info.lists,
                        manifest.single_dim
                    ))
                );
                Some(Ivf {
                    dim: manifest.single_dim,
                    centroids: le_f32s(&b),
                })
            }
            None => None,
        };
        let shape = Shape::of(&manifest, &codec);
        let mut segments = Vec::new();
        let mut metas = Vec::new();
        for s in &manifest.segments {
            let (segment, m) = Segment::open(dir, s, &shape, metas.len(), verify)?;
            segments.push(segment);
            metas.extend(m);
        }
        Ok(Self::from_parts(
            Some(dir.to_path_buf()),
            manifest,
            encoder,
            codec,
            ivf,
            segments,
            metas,
        ))
    }

    /// The write lock of the index in `dir` (adds, removes and merge commits take turns).
    fn write_lock(dir: &Path) -> Result<craterdex_durable::FileLock> {
        Manifest::read(dir)?;
        Ok(craterdex_durable::lock(
            &dir.join(IndexFile::WriteLock.name()),
        )?)
    }

    /// The shape of this index's segments.
    pub(crate) fn shape(&self) -> Shape {
        Shape::of(&self.manifest, &self.codec)
    }

    /// Appends images as a new segment. Ids must be new (or previously removed).
    pub fn add(dir: &Path, images: &[(ImageMeta, Descriptors)]) -> Result<usize> {
        // Sizes are checked; re-reading every segment for its CRC would make a long series
        // of adds quadratic.
        Ok(Self::open_with(dir, false)?.add_images(images)?.0)
    }

    /// Appends images to this index's directory as a new segment (with the write lock,
    /// on top of whatever other writers did since this index was opened). Returns how many
    /// were added and the index as it now is.
    pub fn add_images(&self, images: &[(ImageMeta, Descriptors)]) -> Result<(usize, Self)> {
        let dir = self.dir_or_err()?;
        let _writing = Self::write_lock(dir)?;
        let idx = self.reopened()?;
        check_unique(images.iter().map(|(m, _)| m.id.as_str()), &idx.rows_by_id)?;
        if images.is_empty() {
            return Ok((0, idx));
        }
        let re_added: BTreeSet<&str> = images
            .iter()
            .map(|(m, _)| m.id.as_str())
            .filter(|id| idx.manifest.deleted.contains(*id))
            .collect();
        ensure!(
            re_added.is_empty(),
            Error::Conflict(format!(
                "ids {re_added:?} were removed earlier; a removed id can be used again only once the index is rebuilt"
            ))
        );
        let mut manifest = idx.manifest.clone();
        manifest.generation += 1;
        let data = SegmentData::encode(
            &idx.codec,
            manifest.tokens_per_image,
            manifest.single_dim,
            images,
            idx.ivf.as_ref(),
        )?;
        let seg = data.write(
            dir,
            &segment_dir(manifest.generation),
            idx.codec.has_scales(),
        )?;
        failpoint("index-after-segment");
        manifest.segments.push(seg);
        manifest.write(dir)?;
        Ok((images.len(), idx.reopened()?))
    }

    /// Marks images as removed; returns how many of the ids were present.
    pub fn remove(dir: &Path, ids: &[String]) -> Result<usize> {
        Ok(Self::open_with(dir, false)?.remove_ids(ids)?.0)
    }

    /// Marks images of this index's directory as removed (with the write lock); returns
    /// how many of the ids were present and the index as it now is.
    pub fn remove_ids(&self, ids: &[String]) -> Result<(usize, Self)> {
        let dir = self.dir_or_err()?;
        let _writing = Self::write_lock(dir)?;
        let idx = self.reopened()?;
        let mut manifest = idx.manifest.clone();
        let present: Vec<&String> = ids
            .iter()
            .filter(|id| idx.rows_by_id.contains_key(*id))
            .collect();
        if present.is_empty() {
            return Ok((0, idx));
        }
        manifest.generation += 1;
        manifest
            .deleted
            .extend(present.iter().map(|s| s.to_string()));
        manifest.write(dir)?;
        Ok((present.len(), idx.reopened()?))
    }

    pub(crate) fn dir_or_err(&self) -> Result<&Path> {
        self.dir
            .as_deref()
            .ok_or_else(|| Error::Unsupported("an index held in memory cannot be changed".into()))
    }

    /// The index as its directory holds it now. Segments this index already has open are
    /// kept (their maps and int8 copies); only new ones are opened, with sizes checked.
    pub fn reopened(&self) -> Result<Self> {
        let dir = self.dir_or_err()?;
        for _ in 0..3 {
            let manifest = Manifest::read(dir)?;
            let same_base = manifest.encoder == self.manifest.encoder
                && manifest.codebooks == self.manifest.codebooks
                && manifest.ivf == self.manifest.ivf
                && manifest.codec == self.manifest.codec
                && (
                    manifest.single_dim,
                    manifest.token_dim,
                    manifest.tokens_per_image,
                ) == (
                    self.manifest.single_dim,
                    self.manifest.token_dim,
                    self.manifest.tokens_per_image,
                );
            if !same_base {
                // rebuilt meanwhile
                return Self::open_with(dir, false);
            }
            match self.with_segments_of(dir, manifest.clone()) {
                // a merge deleted a segment between our reads of the manifest and of it
                Err(_) if Manifest::read(dir).is_ok_and(|m| m != manifest) => continue,
                reopened => return reopened,
            }
        }
        Self::open_with(dir, false)
    }

    fn with_segments_of(&self, dir: &Path, manifest: Manifest) -> Result<Self> {
        let shape = self.shape();
        let mut segments = Vec::with_capacity(manifest.segments.len());
        let mut metas = Vec::with_capacity(self.metas.len());
        for info in &manifest.segments {
            match self.manifest.segments.iter().position(|s| s == info) {
                Some(i) => {
                    let kept = &self.segments[i];
                    segments.push(kept.placed_at(metas.len()));
                    metas.extend_from_slice(
                        &self.metas[kept.first_row..kept.first_row + kept.count],
                    );
                }
                None => {
                    let (segment, m) = Segment::open(dir, info, &shape, metas.len(), false)?;
                    segments.push(segment);
                    metas.extend(m);
                }
            }
        }
        Ok(Self::from_parts(
            Some(dir.to_path_buf()),
            manifest,
            self.encoder.clone(),
            self.codec.clone(),
            self.ivf.clone(),
            segments,
            metas,
        ))
    }

    /// The directory of an index opened from disk.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }
    /// Rows ever written (including removed ones).
    pub fn rows(&self) -> usize {
        self.metas.len()
    }
    /// Images that can be found.
    pub fn live(&self) -> usize {
        self.rows_by_id.len()
    }
    pub fn single_dim(&self) -> usize {
        self.manifest.single_dim
    }
    pub fn tokens_per_image(&self) -> usize {
        self.manifest.tokens_per_image
    }
    pub fn token_dim(&self) -> usize {
        self.manifest.token_dim
    }
    pub fn model(&self) -> Option<&str> {
        self.manifest.model.as_deref()
    }
    /// The IVF stage 1 and its default `nprobe`, when the index has one.
    pub fn ivf(&self) -> Option<(&Ivf, usize)> {
        Some((self.ivf.as_ref()?, self.manifest.ivf.as_ref()?.nprobe))
    }
    /// Grows with every change to the index's directory (add, remove, merge).
    pub fn generation(&self) -> u64 {
        self.manifest.generation
    }

    /// Whether the directory holds a later state than this index shows (another process
    /// wrote to it): one read of the manifest.
    pub fn is_stale(&self) -> Result<bool> {
        let on_disk = Manifest::read(self.dir_or_err()?)?;
        Ok(on_disk.generation != self.manifest.generation
            || on_disk.segments != self.manifest.segments)
    }
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
    pub fn meta(&self, row: usize) -> &ImageMeta {
        &self.metas[row]
    }
    pub fn row_of(&self, id: &str) -> Option<usize> {
        self.rows_by_id.get(id).copied()
    }
    /// Whether `id` was in the index and has been removed (ids are not reused before a rebuild).
    pub fn was_removed(&self, id: &str) -> bool {
        self.manifest.deleted.contains(id)
    }
    pub fn is_deleted(&self, row: usize) -> bool {
        self.deleted_rows[row]
    }
    /// The rows of the images that can be found, in row order.
    pub fn live_rows(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.rows()).filter(|&r| !self.deleted_rows[r])
    }
    pub fn deleted_mask(&self) -> &[bool] {
        &self.deleted_rows
    }
    /// Fails unless queries for this index may come from the model with `fingerprint`.
    pub fn check_model(&self, fingerprint: &str) -> Result<()> {
        if let Some(m) = self.model() {
            let name = self
                .dir
                .as_ref()
                .map_or("the index".to_string(), |d| d.display().to_string());
            ensure!(
                m == fingerprint,
                Error::Invalid(format!(
                    "{name} was built with model {m}, but {fingerprint} is loaded; use the index's model"
                ))
            );
        }
        Ok(())
    }

    /// The feature width the encoder expects from the backbone.
    pub fn feature_dim(&self) -> usize {
        self.encoder
            .token_whitening
            .as_ref()
            .map_or(self.token_dim(), |w| w.dim_in)
    }

    /// Bytes of stored tokens per image (int8 includes its scales).
    pub fn token_bytes_per_image(&self) -> usize {
        let k = self.manifest.tokens_per_image;
        k * self.codec.bytes_per_token() + if self.codec.has_scales() { k * 4 } else { 0 }
    }
}

fn check_unique<'a>(
    ids: impl Iterator<Item = &'a str>,
    existing: &HashMap<String, usize>,
) -> Result<()> {
    let mut seen = BTreeSet::new();
    for id in ids {
        ensure!(
            !id.is_empty(),
            Error::Invalid("an image id is empty".into())
        );
        ensure!(
            seen.insert(id),
            Error::Invalid(format!("image id {id:?} appears twice"))
        );
        ensure!(
            !existing.contains_key(id),
            Error::Conflict(format!("image id {id:?} is already in the index"))
        );
    }
    Ok(())
}
