//! What the pycda 0.1.16 sdist (MIT) gives: the sample Mars tile with its craters, and the
//! crater detector (its Keras U-Net), both fetched once into the cache.

use crate::{cache_dir, pip_download, Error, Result};
use craterdex_errors::IoContext;
use std::io::Read;
use std::path::PathBuf;

pub const PYCDA_VERSION: &str = "0.1.16";
const PYCDA_SDIST: &str = "pycda-0.1.16.tar.gz";
const PYCDA_SHA256: &str = "11cc0532db8b7eddcd88db8ee95ef6f7473a9f0136aa75d7c77ba63771fb8c5d";
const MEMBERS: [&str; 2] = ["holdout_tile.pgm", "holdout_tile_labels.csv"];

/// The Mars tile (1700x1700 PGM) and its 409 craters (pixels), fetched once into the cache.
pub fn pycda_mars_tile() -> Result<(PathBuf, PathBuf)> {
    let dir = cache_dir()
        .join("data")
        .join(format!("pycda-{PYCDA_VERSION}"));
    let (tile, labels) = (dir.join(MEMBERS[0]), dir.join(MEMBERS[1]));
    if tile.is_file() && labels.is_file() {
        return Ok((tile, labels));
    }
    let tmp = craterdex_durable::tempdir_beside(&dir)?;
    let members = sdist_members(&MEMBERS.map(|m| format!("sample_imgs/{m}")))?;
    for (name, bytes) in MEMBERS.iter().zip(members) {
        let member = tmp.join(name);
        std::fs::write(&member, bytes).io("write", &member)?;
    }
    craterdex_durable::replace_dir(&tmp, &dir)?;
    Ok((tile, labels))
}

/// The pycda sdist, downloaded once and checked against its pinned sha256.
pub fn pycda_sdist() -> Result<PathBuf> {
    pip_download(
        "pycda",
        PYCDA_VERSION,
        PYCDA_SDIST,
        PYCDA_SHA256,
        &cache_dir().join("downloads"),
    )
}

/// The bytes of the sdist's members whose paths end with `suffixes`, in their order.
fn sdist_members(suffixes: &[String]) -> Result<Vec<Vec<u8>>> {
    let sdist = pycda_sdist()?;
    let f = std::fs::File::open(&sdist).io("open", &sdist)?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(f));
    let not_tar = |e: std::io::Error| {
        Error::Corrupt(format!("{} is not a readable tar.gz: {e}", sdist.display()))
    };
    let mut found: Vec<Option<Vec<u8>>> = vec![None; suffixes.len()];
    for entry in archive.entries().map_err(not_tar)? {
        let mut entry = entry.map_err(not_tar)?;
        let path = entry.path().map_err(not_tar)?.to_path_buf();
        if let Some(i) = suffixes.iter().position(|s| path.ends_with(s)) {
            let mut buf = Vec::new();
            entry.read_to_end(&mut buf).map_err(not_tar)?;
            found[i] = Some(buf);
        }
    }
    found
        .into_iter()
        .zip(suffixes)
        .map(|(bytes, suffix)| {
            bytes.ok_or_else(|| {
                Error::Corrupt(format!("{} has no member {suffix}", sdist.display()))
            })
        })
        .collect()
}

/// The name of pycda's U-Net crater detector among craterdex's detectors.
pub const PYCDA_UNET: &str = "pycda-unet";
const PYCDA_UNET_MEMBER: &str = "pycda/models/unet.h5";

/// Where detectors live: `$CRATERDEX_HOME/detectors`.
pub fn detectors_dir() -> PathBuf {
    cache_dir().join("detectors")
}

/// The directory of the detector `named`: a detector directory, the name of one under
/// [`detectors_dir`] ([`PYCDA_UNET`] fetched on first use), or a Keras `.h5` or ONNX file of
/// a fully convolutional detector, imported there once (named by the file and its contents'
/// hash, so a changed file is imported again; `input_scale`: what 8-bit pixels are multiplied
/// by before its first layer).
pub fn detector_dir(named: &str, input_scale: f32) -> Result<PathBuf> {
    let path = std::path::Path::new(named);
    if path.is_dir() {
        return Ok(path.to_path_buf());
    }
    if path.is_file() {
        return imported_detector(path, input_scale);
    }
    if named == PYCDA_UNET {
        return fetch_pycda_unet(false);
    }
    let there = detectors_dir().join(named);
    if there.is_dir() {
        return Ok(there);
    }
    Err(Error::Invalid(format!(
        "no detector {named}: give a detector directory, a Keras or ONNX file, or one of those in {}",
        detectors_dir().display()
    )))
}

/// [`detector_dir`] of a file: imported under a lock (two processes importing one file at
/// once), once.
fn imported_detector(file: &std::path::Path, input_scale: f32) -> Result<PathBuf> {
    let bytes = std::fs::read(file).io("read", file)?;
    let sha = craterdex_model::store::sha256_hex(&bytes);
    let stem = file
        .file_stem()
        .map_or("detector".into(), |s| s.to_string_lossy());
    let scale = format!("{input_scale}").replace('.', "_");
    let dir = detectors_dir().join(format!("{stem}-{}-x{scale}", &sha[..12]));
    if craterdex_detect::read_detector_dir(&dir).is_ok() {
        return Ok(dir);
    }
    craterdex_durable::create_dir_all(&detectors_dir())?;
    let name = dir
        .file_name()
        .map_or_else(Default::default, |n| n.to_string_lossy());
    let _lock = craterdex_durable::lock(&detectors_dir().join(format!(".{name}.lock")))?;
    if craterdex_detect::read_detector_dir(&dir).is_err() {
        let what = file.display().to_string();
        let source = format!("file:{what}");
        craterdex_detect::import_detector(
            &bytes,
            &what,
            &stem,
            &source,
            "unknown",
            input_scale,
            &dir,
        )?;
        tracing::info!("imported {what} as detector {}", dir.display());
    }
    Ok(dir)
}

/// Fetches pycda's U-Net and imports it as the detector [`PYCDA_UNET`]; does nothing when
/// it is already there and reads back.
pub fn fetch_pycda_unet(force: bool) -> Result<PathBuf> {
    let dir = detectors_dir().join(PYCDA_UNET);
    if !force && craterdex_detect::read_detector_dir(&dir).is_ok() {
        return Ok(dir);
    }
    // one import at a time (tests and processes fetching together); the one that waited
    // finds the detector there
    craterdex_durable::create_dir_all(&detectors_dir())?;
    let _lock = craterdex_durable::lock(&detectors_dir().join(format!(".{PYCDA_UNET}.lock")))?;
    if !force && craterdex_detect::read_detector_dir(&dir).is_ok() {
        return Ok(dir);
    }
    let [h5] = <[Vec<u8>; 1]>::try_from(sdist_members(&[PYCDA_UNET_MEMBER.to_string()])?)
        .expect("one member asked for");
    let source = format!("pypi:pycda=={PYCDA_VERSION}/{PYCDA_UNET_MEMBER}");
    // pycda's models take 8-bit pixels / 255
    craterdex_detect::import_detector(
        &h5,
        PYCDA_UNET_MEMBER,
        PYCDA_UNET,
        &source,
        "MIT",
        1.0 / 255.0,
        &dir,
    )?;
    Ok(dir)
}
