//! The index directory.
//!
//! ```text
//! index.json          manifest: format, version, dimensions, codec, segments with per-file
//!                     sizes and CRC32s, deleted image ids; replaced atomically on every change
//! encoder.json        the descriptor recipe and its whitening (shared by gallery and queries)
//! codebooks.f32       PQ codebooks (PQ codecs only)
//! ivf.f32             IVF centroids [lists, Ds] (IVF indexes only)
//! seg-NNNNNN/         immutable segment: single.f32 [n, Ds], tokens.bin [n, K, bytes/token],
//!                     scales.f32 [n, K] (int8 only), meta.jsonl (one ImageMeta per image),
//!                     lists.u32 [n] (IVF list of each image; IVF indexes only)
//! ```
//! Building writes a complete directory beside the old one and swaps it in. Adding writes a
//! new segment directory, then the manifest; removing rewrites only the manifest. A crash at
//! any point leaves the previous manifest, which names only complete, checksummed segments.

use crate::codec::{Codec, TokenCodec};
use crate::ivf::{InvertedLists, Ivf};
use crate::single_int8::Int8Vectors;
use anyhow::{ensure, Context, Result};
use craterdex_durable::{failpoint, replace_dir, sync_tree, tempdir_beside, write_atomic};
use craterdex_tokens::{Descriptors, Encoder};
use memmap2::Mmap;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub const INDEX_FORMAT: &str = "craterdex-index";
pub const INDEX_VERSION: u32 = 1;
const MANIFEST: &str = "index.json";
const ENCODER: &str = "encoder.json";
const CODEBOOKS: &str = "codebooks.f32";
const IVF_CENTROIDS: &str = "ivf.f32";

/// What is known about one indexed image.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ImageMeta {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crater_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lat: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lon: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diameter_km: Option<f64>,
    /// The image file, for thumbnails and reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct FileSum {
    bytes: u64,
    crc32: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct SegmentInfo {
    name: String,
    count: usize,
    files: BTreeMap<String, FileSum>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Manifest {
    format: String,
    version: u32,
    generation: u64,
    single_dim: usize,
    token_dim: usize,
    tokens_per_image: usize,
    codec: Codec,
    model: Option<String>,
    encoder: FileSum,
    codebooks: Option<FileSum>,
    segments: Vec<SegmentInfo>,
    deleted: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ivf: Option<IvfInfo>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct IvfInfo {
    lists: usize,
    /// Lists a query scans unless told otherwise.
    nprobe: usize,
    centroids: FileSum,
}

struct Segment {
    first_row: usize,
    count: usize,
    single: Mmap,
    tokens: Mmap,
    scales: Option<Mmap>,
    lists: Option<InvertedLists>,
    /// int8 copies of the single vectors, made on first use (int8 indexes' stage 1).
    single_int8: OnceLock<Int8Vectors>,
}

/// An open index. Arrays are memory-mapped; metadata is in memory.
pub struct Index {
    dir: PathBuf,
    manifest: Manifest,
    pub encoder: Encoder,
    pub codec: TokenCodec,
    ivf: Option<Ivf>,
    segments: Vec<Segment>,
    metas: Vec<ImageMeta>,
    deleted_rows: Vec<bool>,
    rows_by_id: HashMap<String, usize>,
}

fn checksum(bytes: &[u8]) -> FileSum {
    FileSum {
        bytes: bytes.len() as u64,
        crc32: crc32fast::hash(bytes),
    }
}

fn check_file(path: &Path, bytes: &[u8], want: &FileSum, verify: bool) -> Result<()> {
    ensure!(
        bytes.len() as u64 == want.bytes,
        "{}: {} bytes, the manifest says {} (truncated or overwritten file)",
        path.display(),
        bytes.len(),
        want.bytes
    );
    if verify {
        let got = crc32fast::hash(bytes);
        ensure!(
            got == want.crc32,
            "{}: checksum {got:08x}, the manifest says {:08x} (corrupt file)",
            path.display(),
            want.crc32
        );
    }
    Ok(())
}

fn le_f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn map(path: &Path) -> Result<Mmap> {
    let f = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: segment files are immutable once named by a manifest; craterdex never rewrites them.
    unsafe { Mmap::map(&f) }.with_context(|| format!("cannot map {}", path.display()))
}

/// Writes one segment into `dir` and returns its description.
fn write_segment(
    dir: &Path,
    name: &str,
    codec: &TokenCodec,
    k: usize,
    single_dim: usize,
    images: &[(ImageMeta, Descriptors)],
    ivf: Option<&Ivf>,
) -> Result<SegmentInfo> {
    let mut single = Vec::with_capacity(images.len() * single_dim);
    let mut payload = Vec::with_capacity(images.len() * k * codec.bytes_per_token());
    let mut scales = Vec::new();
    let mut meta = Vec::new();
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
    // With IVF, a segment stores its images grouped by list, so that scanning a list reads
    // one contiguous run of single vectors.
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
    for (p, sc) in encoded {
        payload.extend_from_slice(&p);
        scales.extend_from_slice(&sc);
    }
    for &i in &order {
        let (m, desc) = &images[i];
        single.extend_from_slice(&desc.single);
        serde_json::to_writer(&mut meta, m)?;
        meta.push(b'\n');
    }
    let tmp = tempdir_beside(&dir.join(name))?;
    let mut files = BTreeMap::new();
    let mut put = |file: &str, bytes: &[u8]| -> Result<()> {
        std::fs::write(tmp.join(file), bytes)
            .with_context(|| format!("cannot write {}", tmp.join(file).display()))?;
        files.insert(file.to_string(), checksum(bytes));
        Ok(())
    };
    put("single.f32", bytemuck::cast_slice(&single))?;
    failpoint("index-mid-segment");
    put("tokens.bin", &payload)?;
    if codec.has_scales() {
        put("scales.f32", bytemuck::cast_slice(&scales))?;
    }
    put("meta.jsonl", &meta)?;
    if ivf.is_some() {
        let sorted: Vec<u32> = order.iter().map(|&i| assignment[i]).collect();
        put("lists.u32", bytemuck::cast_slice(&sorted))?;
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
        count: images.len(),
        files,
    })
}

fn segment_name(generation: u64) -> String {
    format!("seg-{generation:06}")
}

impl Index {
    /// Builds a new index at `dir` from encoded images, replacing any index there only once
    /// the new one is complete.
    pub fn create(
        dir: &Path,
        encoder: &Encoder,
        codec: &TokenCodec,
        model: Option<String>,
        images: &[(ImageMeta, Descriptors)],
    ) -> Result<()> {
        Self::create_with_ivf(dir, encoder, codec, model, images, None)
    }

    /// As `create`, with an IVF stage 1 (`ivf`: the centroids and the default `nprobe`).
    /// Images added later are assigned to the same centroids.
    pub fn create_with_ivf(
        dir: &Path,
        encoder: &Encoder,
        codec: &TokenCodec,
        model: Option<String>,
        images: &[(ImageMeta, Descriptors)],
        ivf: Option<(&Ivf, usize)>,
    ) -> Result<()> {
        ensure!(!images.is_empty(), "cannot build an index from zero images");
        check_unique(images.iter().map(|(m, _)| m.id.as_str()), &HashMap::new())?;
        let single_dim = images[0].1.single.len();
        let k = images[0].1.tokens.len() / codec.dim;
        let tmp = tempdir_beside(dir)?;
        let enc_bytes = serde_json::to_vec(encoder)?;
        std::fs::write(tmp.join(ENCODER), &enc_bytes)?;
        let codebooks = if codec.codebooks.is_empty() {
            None
        } else {
            let b: &[u8] = bytemuck::cast_slice(&codec.codebooks);
            std::fs::write(tmp.join(CODEBOOKS), b)?;
            Some(checksum(b))
        };
        let ivf_info = match ivf {
            Some((ivf, nprobe)) => {
                ensure!(
                    ivf.dim == single_dim,
                    "IVF centroids are {}-d, single vectors {single_dim}-d",
                    ivf.dim
                );
                let b: &[u8] = bytemuck::cast_slice(&ivf.centroids);
                std::fs::write(tmp.join(IVF_CENTROIDS), b)?;
                Some(IvfInfo {
                    lists: ivf.lists(),
                    nprobe: nprobe.clamp(1, ivf.lists()),
                    centroids: checksum(b),
                })
            }
            None => None,
        };
        let seg = write_segment(
            &tmp,
            &segment_name(1),
            codec,
            k,
            single_dim,
            images,
            ivf.map(|(i, _)| i),
        )?;
        let manifest = Manifest {
            format: INDEX_FORMAT.into(),
            version: INDEX_VERSION,
            generation: 1,
            single_dim,
            token_dim: codec.dim,
            tokens_per_image: k,
            codec: codec.codec,
            model,
            encoder: checksum(&enc_bytes),
            codebooks,
            segments: vec![seg],
            deleted: BTreeSet::new(),
            ivf: ivf_info,
        };
        std::fs::write(tmp.join(MANIFEST), serde_json::to_vec_pretty(&manifest)?)?;
        failpoint("index-before-swap");
        replace_dir(&tmp, dir)
    }

    pub fn open(dir: &Path) -> Result<Self> {
        Self::open_with(dir, true)
    }

    /// Opens an index; `verify` checks every file's CRC32 (sizes are always checked).
    pub fn open_with(dir: &Path, verify: bool) -> Result<Self> {
        let mpath = dir.join(MANIFEST);
        let text = std::fs::read(&mpath).with_context(|| {
            format!(
                "cannot read {} (is {} an index?)",
                mpath.display(),
                dir.display()
            )
        })?;
        let probe: serde_json::Value = serde_json::from_slice(&text)
            .with_context(|| format!("{} is not JSON (corrupt manifest)", mpath.display()))?;
        ensure!(
            probe.get("format").and_then(|v| v.as_str()) == Some(INDEX_FORMAT),
            "{} is not a craterdex index manifest",
            mpath.display()
        );
        let version = probe.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
        ensure!(
            version == INDEX_VERSION as u64,
            "{}: index format version {version}, this craterdex reads version {INDEX_VERSION}; rebuild the index",
            mpath.display()
        );
        let manifest: Manifest = serde_json::from_slice(&text)
            .with_context(|| format!("{}: malformed manifest", mpath.display()))?;
        let epath = dir.join(ENCODER);
        let enc_bytes =
            std::fs::read(&epath).with_context(|| format!("cannot read {}", epath.display()))?;
        check_file(&epath, &enc_bytes, &manifest.encoder, verify)?;
        let encoder: Encoder = serde_json::from_slice(&enc_bytes)
            .with_context(|| format!("{}: malformed encoder", epath.display()))?;
        let mut codec = TokenCodec {
            codec: manifest.codec,
            dim: manifest.token_dim,
            codebooks: Vec::new(),
            pq_tables: Default::default(),
        };
        if let Some(sum) = &manifest.codebooks {
            let cpath = dir.join(CODEBOOKS);
            let b = std::fs::read(&cpath)
                .with_context(|| format!("cannot read {}", cpath.display()))?;
            check_file(&cpath, &b, sum, verify)?;
            codec.codebooks = le_f32s(&b);
        }
        let ivf = match &manifest.ivf {
            Some(info) => {
                let p = dir.join(IVF_CENTROIDS);
                let b =
                    std::fs::read(&p).with_context(|| format!("cannot read {}", p.display()))?;
                check_file(&p, &b, &info.centroids, verify)?;
                ensure!(
                    b.len() == info.lists * manifest.single_dim * 4,
                    "{}: {} bytes for {} lists of {}-d",
                    p.display(),
                    b.len(),
                    info.lists,
                    manifest.single_dim
                );
                Some(Ivf {
                    dim: manifest.single_dim,
                    centroids: le_f32s(&b),
                })
            }
            None => None,
        };
        let k = manifest.tokens_per_image;
        let mut segments = Vec::new();
        let mut metas = Vec::new();
        let mut first_row = 0;
        for s in &manifest.segments {
            let sdir = dir.join(&s.name);
            let open = |file: &str, expect_bytes: usize| -> Result<Mmap> {
                let p = sdir.join(file);
                let sum = s
                    .files
                    .get(file)
                    .with_context(|| format!("{}: manifest lists no {file}", sdir.display()))?;
                ensure!(
                    sum.bytes as usize == expect_bytes,
                    "{}: manifest size {} disagrees with {} images",
                    p.display(),
                    sum.bytes,
                    s.count
                );
                let m = map(&p)?;
                check_file(&p, &m, sum, verify)?;
                Ok(m)
            };
            let single = open("single.f32", s.count * manifest.single_dim * 4)?;
            let tokens = open("tokens.bin", s.count * k * codec.bytes_per_token())?;
            let scales = if codec.has_scales() {
                Some(open("scales.f32", s.count * k * 4)?)
            } else {
                None
            };
            let meta_bytes = open(
                "meta.jsonl",
                s.files.get("meta.jsonl").map_or(0, |f| f.bytes as usize),
            )?;
            for (line_no, line) in meta_bytes
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
                .enumerate()
            {
                metas.push(serde_json::from_slice::<ImageMeta>(line).with_context(|| {
                    format!(
                        "{}/meta.jsonl line {}: malformed",
                        sdir.display(),
                        line_no + 1
                    )
                })?);
            }
            ensure!(
                metas.len() == first_row + s.count,
                "{}/meta.jsonl: expected {} records",
                sdir.display(),
                s.count
            );
            let lists = match &manifest.ivf {
                Some(info) => {
                    let m = open("lists.u32", s.count * 4)?;
                    let assignment: Vec<u32> = m
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                    Some(
                        InvertedLists::build(&assignment, info.lists)
                            .with_context(|| format!("{}/lists.u32", sdir.display()))?,
                    )
                }
                None => None,
            };
            segments.push(Segment {
                first_row,
                count: s.count,
                single,
                tokens,
                scales,
                lists,
                single_int8: OnceLock::new(),
            });
            first_row += s.count;
        }
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
        Ok(Self {
            dir: dir.to_path_buf(),
            manifest,
            encoder,
            codec,
            ivf,
            segments,
            metas,
            deleted_rows,
            rows_by_id,
        })
    }

    /// Appends images as a new segment. Ids must be new (or previously removed).
    pub fn add(dir: &Path, images: &[(ImageMeta, Descriptors)]) -> Result<usize> {
        // Sizes are checked; re-reading every segment for its CRC would make a long series
        // of adds quadratic.
        let idx = Self::open_with(dir, false)?;
        check_unique(images.iter().map(|(m, _)| m.id.as_str()), &idx.rows_by_id)?;
        if images.is_empty() {
            return Ok(0);
        }
        let re_added: BTreeSet<&str> = images
            .iter()
            .map(|(m, _)| m.id.as_str())
            .filter(|id| idx.manifest.deleted.contains(*id))
            .collect();
        ensure!(re_added.is_empty(), "ids {re_added:?} were removed earlier; re-adding a removed id needs a rebuild (craterdex index build)");
        let mut manifest = idx.manifest.clone();
        manifest.generation += 1;
        let seg = write_segment(
            dir,
            &segment_name(manifest.generation),
            &idx.codec,
            manifest.tokens_per_image,
            manifest.single_dim,
            images,
            idx.ivf.as_ref(),
        )?;
        failpoint("index-after-segment");
        manifest.segments.push(seg);
        write_atomic(&dir.join(MANIFEST), &serde_json::to_vec_pretty(&manifest)?)?;
        Ok(images.len())
    }

    /// Marks images as removed; returns how many of the ids were present.
    pub fn remove(dir: &Path, ids: &[String]) -> Result<usize> {
        let idx = Self::open_with(dir, false)?;
        let mut manifest = idx.manifest.clone();
        let present: Vec<&String> = ids
            .iter()
            .filter(|id| idx.rows_by_id.contains_key(*id))
            .collect();
        if present.is_empty() {
            return Ok(0);
        }
        manifest.generation += 1;
        manifest
            .deleted
            .extend(present.iter().map(|s| s.to_string()));
        write_atomic(&dir.join(MANIFEST), &serde_json::to_vec_pretty(&manifest)?)?;
        Ok(present.len())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
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

    /// What search reads of each segment; `int8_singles` makes (once per segment, in
    /// parallel chunks) and includes the int8 copies of the single vectors.
    pub(crate) fn segment_parts(&self, int8_singles: bool) -> Vec<SegmentParts<'_>> {
        let d = self.single_dim();
        self.segments
            .iter()
            .map(|s| SegmentParts {
                first: s.first_row,
                count: s.count,
                single: bytemuck::cast_slice::<u8, f32>(&s.single),
                lists: s.lists.as_ref(),
                single_int8: int8_singles.then(|| {
                    s.single_int8.get_or_init(|| {
                        Int8Vectors::quantise(bytemuck::cast_slice::<u8, f32>(&s.single), d)
                    })
                }),
            })
            .collect()
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
    pub fn deleted_mask(&self) -> &[bool] {
        &self.deleted_rows
    }
    /// Bytes of stored tokens per image (int8 includes its scales).
    pub fn token_bytes_per_image(&self) -> usize {
        let k = self.manifest.tokens_per_image;
        k * self.codec.bytes_per_token() + if self.codec.has_scales() { k * 4 } else { 0 }
    }

    /// Each segment's first row and single vectors `[n, Ds]`.
    pub fn single_blocks(&self) -> impl Iterator<Item = (usize, &[f32])> {
        self.segments
            .iter()
            .map(|s| (s.first_row, bytemuck::cast_slice::<u8, f32>(&s.single)))
    }

    fn segment_of(&self, row: usize) -> &Segment {
        let i = self
            .segments
            .partition_point(|s| s.first_row + s.count <= row);
        &self.segments[i]
    }

    /// The single vector of `row` as stored.
    pub fn single_of(&self, row: usize) -> &[f32] {
        let s = self.segment_of(row);
        let d = self.single_dim();
        let local = row - s.first_row;
        &bytemuck::cast_slice::<u8, f32>(&s.single)[local * d..(local + 1) * d]
    }

    /// The descriptors of an indexed image as stored (tokens decoded by the codec), to search
    /// with an image that is already in the index.
    pub fn descriptors_of(&self, row: usize) -> Descriptors {
        let mut tokens = Vec::new();
        self.decode_tokens(row, &mut tokens);
        Descriptors {
            single: self.single_of(row).to_vec(),
            tokens,
        }
    }

    /// Fails unless queries for this index may come from the model with `fingerprint`.
    pub fn check_model(&self, fingerprint: &str) -> Result<()> {
        if let Some(m) = self.model() {
            ensure!(
                m == fingerprint,
                "{} was built with model {m}, but {fingerprint} is loaded; use the index's model",
                self.dir.display()
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

    /// The int8 codes `[n * K, D]` and scales `[n * K]` of rows `lo..hi` of one segment
    /// (int8 indexes).
    pub(crate) fn int8_run(&self, lo: usize, hi: usize) -> (&[i8], &[f32]) {
        let (payload, scales) = self.stored_run(lo, hi);
        (bytemuck::cast_slice(payload), scales)
    }

    /// The f32 tokens `[n * K, D]` of rows `lo..hi` of one segment (f32 indexes).
    pub(crate) fn f32_run(&self, lo: usize, hi: usize) -> &[f32] {
        bytemuck::cast_slice(self.stored_run(lo, hi).0)
    }

    /// For an int8 index, the codes `[K, D]` and scales `[K]` of `row`.
    pub fn int8_tokens(&self, row: usize) -> Option<(&[i8], &[f32])> {
        let (payload, scales) = self.stored_tokens(row);
        (self.codec.codec == Codec::Int8).then(|| (bytemuck::cast_slice(payload), scales))
    }

    /// The stored token bytes of `row` and its scales (empty but for int8).
    fn stored_tokens(&self, row: usize) -> (&[u8], &[f32]) {
        self.stored_run(row, row + 1)
    }

    /// The stored token bytes and scales of rows `lo..hi`, which lie in one segment.
    fn stored_run(&self, lo: usize, hi: usize) -> (&[u8], &[f32]) {
        let s = self.segment_of(lo);
        assert!(
            hi <= s.first_row + s.count,
            "rows {lo}..{hi} cross a segment boundary"
        );
        let (lo, hi) = (lo - s.first_row, hi - s.first_row);
        let k = self.manifest.tokens_per_image;
        let bpt = self.codec.bytes_per_token();
        let payload = &s.tokens[lo * k * bpt..hi * k * bpt];
        let scales: &[f32] = match &s.scales {
            Some(m) => &bytemuck::cast_slice::<u8, f32>(m)[lo * k..hi * k],
            None => &[],
        };
        (payload, scales)
    }

    /// Decodes the stored tokens of `row` into `out` (`[K, D]`).
    pub fn decode_tokens(&self, row: usize, out: &mut Vec<f32>) {
        out.resize(self.manifest.tokens_per_image * self.codec.dim, 0.0);
        self.decode_tokens_into(row, out);
    }

    /// Decodes the stored tokens of `row` into a slice of exactly `K * D` floats.
    pub fn decode_tokens_into(&self, row: usize, out: &mut [f32]) {
        let (payload, scales) = self.stored_tokens(row);
        self.codec.decode(payload, scales, out);
    }
}

/// What search reads of one segment.
pub(crate) struct SegmentParts<'a> {
    pub first: usize,
    pub count: usize,
    /// `[count, Ds]`
    pub single: &'a [f32],
    pub lists: Option<&'a InvertedLists>,
    pub single_int8: Option<&'a Int8Vectors>,
}

fn check_unique<'a>(
    ids: impl Iterator<Item = &'a str>,
    existing: &HashMap<String, usize>,
) -> Result<()> {
    let mut seen = BTreeSet::new();
    for id in ids {
        ensure!(!id.is_empty(), "an image id is empty");
        ensure!(seen.insert(id), "image id {id:?} appears twice");
        ensure!(
            !existing.contains_key(id),
            "image id {id:?} is already in the index"
        );
    }
    Ok(())
}
