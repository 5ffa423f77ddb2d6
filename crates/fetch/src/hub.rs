//! Checkpoints from a Hugging Face Hub or a mirror of one, through `hf-hub` (the Hugging
//! Face project's own Rust client): files stream into Hugging Face's cache layout (shared
//! with Python's `huggingface_hub`), an interrupted transfer resumes from its `.part` file,
//! failed transfers are retried, and large (LFS) files are checked against the sha256 the
//! Hub names them by. Single-file and sharded safetensors checkpoints are both imported.

use crate::error::{Error, Result};
use craterdex_errors::{ensure, IoContext, ResultExt};
use craterdex_model::config::ModelConfig;
use craterdex_model::store;
use hf_hub::api::sync::{ApiBuilder, ApiError, ApiRepo};
use hf_hub::{Cache, Repo, RepoType};
use std::path::{Path, PathBuf};

/// Transfers retried (each resuming where the last stopped) before a download fails.
const RETRIES: usize = 3;

/// Where a Hub checkpoint comes from.
#[derive(Clone, Debug)]
pub struct HubSource<'a> {
    /// `owner/name`.
    pub repo: &'a str,
    /// A branch, tag or commit.
    pub revision: &'a str,
    /// `https://huggingface.co` or a mirror.
    pub endpoint: &'a str,
    /// A read token for gated or private repositories; else the token file of the cache.
    pub token: Option<&'a str>,
    /// Hugging Face's cache directory; `None`: `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
    pub cache_dir: Option<&'a Path>,
}

/// Told about each file as it downloads (bytes).
pub trait DownloadProgress {
    fn start(&mut self, file: &str, bytes: u64);
    fn advance(&mut self, bytes: u64);
    fn finish(&mut self);
}

impl DownloadProgress for () {
    fn start(&mut self, _: &str, _: u64) {}
    fn advance(&mut self, _: u64) {}
    fn finish(&mut self) {}
}

struct Reporter<'p>(&'p mut dyn DownloadProgress);

impl hf_hub::api::Progress for Reporter<'_> {
    fn init(&mut self, size: usize, filename: &str) {
        self.0.start(filename, size as u64);
    }
    fn update(&mut self, size: usize) {
        self.0.advance(size as u64);
    }
    fn finish(&mut self) {
        self.0.finish();
    }
}

/// Downloads a Hub repository's `config.json` and its safetensors weights (one
/// `model.safetensors`, or the shards a `model.safetensors.index.json` names) and imports
/// them as model `owner--name` under `dest_root`. Files already in the cache for the
/// revision are used as they are, after their checksum is checked again.
pub fn fetch_hf(
    source: &HubSource,
    dest_root: &Path,
    progress: &mut dyn DownloadProgress,
) -> Result<(PathBuf, ModelConfig)> {
    let repo_name = source.repo;
    ensure!(
        !repo_name.is_empty()
            && repo_name
                .split('/')
                .all(|p| !p.is_empty() && p != ".." && p != "."),
        Error::Invalid(format!(
            "{repo_name:?} is not a Hub repository name (owner/name)"
        ))
    );
    let cache = match source.cache_dir {
        Some(dir) => Cache::new(dir.to_path_buf()),
        None => Cache::from_env(),
    };
    let mut builder = ApiBuilder::from_cache(cache.clone())
        .with_endpoint(source.endpoint.trim_end_matches('/').to_string())
        .with_progress(false)
        .with_retries(RETRIES);
    if let Some(token) = source.token {
        builder = builder.with_token(Some(token.to_string()));
    }
    let api = builder
        .build()
        .map_err(|e| Error::Download(format!("cannot set up the Hub client: {e}")))?;
    let repo = Repo::with_revision(
        repo_name.to_string(),
        RepoType::Model,
        source.revision.to_string(),
    );
    let hub = Hub {
        remote: api.repo(repo.clone()),
        cache,
        repo,
    };

    let config_path = hub
        .get("config.json", progress)
        .map_err(Missing::into_error)?;
    let config = std::fs::read(&config_path).io("read", &config_path)?;
    let name = repo_name.replace('/', "--");
    let provenance = format!("hf:{repo_name}@{}", source.revision);
    match hub.get("model.safetensors", progress) {
        Ok(weights) => {
            let bytes = std::fs::read(&weights).io("read", &weights)?;
            Ok(craterdex_model::import::import_safetensors(
                &bytes,
                Some(&config),
                &name,
                &provenance,
                dest_root,
            )
            .with_context(|| format!("model.safetensors of {repo_name}"))?)
        }
        Err(Missing::NotThere(_)) => {
            let index_path = hub
                .get("model.safetensors.index.json", progress)
                .map_err(|e| match e {
                    Missing::NotThere(url) => Error::Download(format!(
                        "{repo_name} has neither model.safetensors nor model.safetensors.index.json \
                         ({url}: 404); craterdex reads safetensors checkpoints only"
                    )),
                    Missing::Failed(e) => e,
                })?;
            let shards = shard_names(&index_path)?;
            let mut paths = Vec::with_capacity(shards.len());
            for shard in &shards {
                paths.push(hub.get(shard, progress).map_err(Missing::into_error)?);
            }
            Ok(craterdex_model::import::import_safetensors_shards(
                &paths,
                Some(&config),
                &name,
                &provenance,
                dest_root,
            )
            .with_context(|| format!("the {} shards of {repo_name}", shards.len()))?)
        }
        Err(Missing::Failed(e)) => Err(e),
    }
}

struct Hub {
    remote: ApiRepo,
    cache: Cache,
    repo: Repo,
}

/// A file the repository does not have (its URL), told apart from a download that failed.
enum Missing {
    NotThere(String),
    Failed(Error),
}

impl Missing {
    fn into_error(self) -> Error {
        match self {
            Missing::NotThere(url) => Error::Download(format!("cannot download {url}: 404")),
            Missing::Failed(e) => e,
        }
    }
}

impl Hub {
    /// The file in the cache, downloaded first when the revision does not have it there.
    fn get(
        &self,
        file: &str,
        progress: &mut dyn DownloadProgress,
    ) -> std::result::Result<PathBuf, Missing> {
        let url = self.remote.url(file);
        let path = match self.cache.repo(self.repo.clone()).get(file) {
            Some(path) => path,
            None => self
                .remote
                .download_with_progress(file, Reporter(progress))
                .map_err(|e| match e {
                    ApiError::RequestError(ref inner)
                        if matches!(**inner, ureq::Error::StatusCode(404)) =>
                    {
                        Missing::NotThere(url.clone())
                    }
                    e => Missing::Failed(Error::Download(format!("cannot download {url}: {e}"))),
                })?,
        };
        verify_blob(&path, &url).map_err(Missing::Failed)?;
        Ok(path)
    }
}

/// The cache names each blob by the Hub's ETag, which for large (LFS) files is the sha256
/// of their content: such a blob that does not hash to its name is removed, so the next
/// fetch downloads it again.
fn verify_blob(path: &Path, url: &str) -> Result<()> {
    let blob = std::fs::canonicalize(path)
        .map_err(|e| Error::Download(format!("cannot resolve {}: {e}", path.display())))?;
    let etag = blob
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    if etag.len() != 64 || !etag.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(());
    }
    let got = store::sha256_file(&blob)?;
    if got.eq_ignore_ascii_case(&etag) {
        return Ok(());
    }
    let _ = std::fs::remove_file(&blob);
    Err(Error::Corrupt(format!(
        "{url}: the download's sha256 is {got}, the Hub names it {etag}; removed it, fetch again"
    )))
}

/// The shard files a `model.safetensors.index.json` names, each once, in name order.
fn shard_names(index_path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read(index_path).io("read", index_path)?;
    let index: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
        Error::Corrupt(format!(
            "{}: not a safetensors index (JSON): {e}",
            index_path.display()
        ))
    })?;
    let Some(map) = index.get("weight_map").and_then(|m| m.as_object()) else {
        return Err(Error::Corrupt(format!(
            "{}: no weight_map",
            index_path.display()
        )));
    };
    let mut shards: Vec<String> = Vec::new();
    for file in map.values() {
        let Some(file) = file.as_str() else {
            return Err(Error::Corrupt(format!(
                "{}: weight_map values must be file names",
                index_path.display()
            )));
        };
        ensure!(
            !file.is_empty()
                && !file.contains(['/', '\\'])
                && file != ".."
                && file.ends_with(".safetensors"),
            Error::Corrupt(format!(
                "{}: {file:?} is not a safetensors file beside the index",
                index_path.display()
            ))
        );
        if !shards.iter().any(|s| s == file) {
            shards.push(file.to_string());
        }
    }
    shards.sort();
    ensure!(
        !shards.is_empty(),
        Error::Corrupt(format!("{}: the weight_map is empty", index_path.display()))
    );
    Ok(shards)
}
