//! `fetch_hf` against a Hugging Face-like server on loopback serving a generated checkpoint.

use craterdex_errors::HasKind;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;

fn tiny_dinov2_tensors() -> Vec<(String, Vec<usize>, Vec<u8>)> {
    let (d, p, g, mlp) = (16usize, 2usize, 2usize, 32usize);
    let mut tensors: Vec<(String, Vec<usize>)> = vec![
        ("embeddings.cls_token".into(), vec![1, 1, d]),
        ("embeddings.mask_token".into(), vec![1, d]),
        (
            "embeddings.position_embeddings".into(),
            vec![1, 1 + g * g, d],
        ),
        (
            "embeddings.patch_embeddings.projection.weight".into(),
            vec![d, 3, p, p],
        ),
        (
            "embeddings.patch_embeddings.projection.bias".into(),
            vec![d],
        ),
        ("layernorm.weight".into(), vec![d]),
        ("layernorm.bias".into(), vec![d]),
    ];
    let l = "encoder.layer.0.";
    for (n, s) in [
        ("norm1.weight", vec![d]),
        ("norm1.bias", vec![d]),
        ("attention.attention.query.weight", vec![d, d]),
        ("attention.attention.query.bias", vec![d]),
        ("attention.attention.key.weight", vec![d, d]),
        ("attention.attention.key.bias", vec![d]),
        ("attention.attention.value.weight", vec![d, d]),
        ("attention.attention.value.bias", vec![d]),
        ("attention.output.dense.weight", vec![d, d]),
        ("attention.output.dense.bias", vec![d]),
        ("layer_scale1.lambda1", vec![d]),
        ("norm2.weight", vec![d]),
        ("norm2.bias", vec![d]),
        ("mlp.fc1.weight", vec![mlp, d]),
        ("mlp.fc1.bias", vec![mlp]),
        ("mlp.fc2.weight", vec![d, mlp]),
        ("mlp.fc2.bias", vec![d]),
        ("layer_scale2.lambda1", vec![d]),
    ] {
        tensors.push((format!("{l}{n}"), s));
    }
    let bufs: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .enumerate()
        .map(|(i, (n, s))| {
            let count: usize = s.iter().product();
            let bytes = (0..count)
                .flat_map(|j| (((i * 31 + j * 7) % 13) as f32 * 0.01 - 0.06).to_le_bytes())
                .collect();
            (n, s, bytes)
        })
        .collect();
    bufs
}

fn tiny_dinov2_checkpoint() -> Vec<u8> {
    craterdex_model::testing::f32_safetensors(&tiny_dinov2_tensors())
}

/// How the loopback Hub misbehaves.
#[derive(Clone, Copy, Default)]
struct Faults {
    /// The first full transfer of each large file stops after half its bytes.
    cut_first_transfer: bool,
    /// Large files are announced under the sha256 of other bytes.
    wrong_checksum: bool,
}

/// A Hugging Face Hub on loopback, as hf-hub talks to it: `GET /{repo}/resolve/{rev}/{file}`
/// with `Range: bytes=0-0` for the metadata (commit, ETag, size in Content-Range), then
/// `Range: bytes=N-` for the content. Files over 100 bytes are LFS files, whose ETag is
/// their sha256. Serves `requests` requests, then returns each one's path and range.
fn serve(
    files: Vec<(String, Vec<u8>)>,
    requests: usize,
    faults: Faults,
) -> (String, std::thread::JoinHandle<Vec<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let handle = std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut cut = std::collections::HashSet::new();
        for stream in listener.incoming().take(requests) {
            let mut stream = stream.unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let mut start = 0usize;
            let mut end = None;
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap() == 0 || h == "\r\n" {
                    break;
                }
                if let Some(r) = h.to_ascii_lowercase().strip_prefix("range: bytes=") {
                    let (a, b) = r.trim().split_once('-').unwrap();
                    start = a.parse().unwrap();
                    end = b.parse::<usize>().ok();
                }
            }
            let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
            seen.push(format!(
                "{path} {start}-{}",
                end.map(|e| e.to_string()).unwrap_or_default()
            ));
            let Some((_, body)) = files.iter().find(|(p, _)| *p == path) else {
                write!(
                    stream,
                    "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                .unwrap();
                continue;
            };
            let lfs = body.len() > 100;
            let etag = if !lfs {
                "\"0123456789abcdef0123456789abcdef01234567\"".to_string()
            } else if faults.wrong_checksum {
                craterdex_model::store::sha256_hex(b"other bytes")
            } else {
                craterdex_model::store::sha256_hex(body)
            };
            let last = end.unwrap_or(body.len() - 1).min(body.len() - 1);
            let part = &body[start..=last];
            write!(
                stream,
                "HTTP/1.1 206 Partial Content\r\nX-Repo-Commit: 4a4b4c4d4e4f50515253545556575859606162\r\n\
                 {}: {etag}\r\nContent-Range: bytes {start}-{last}/{}\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n",
                if lfs { "X-Linked-Etag" } else { "ETag" },
                body.len(),
                part.len()
            )
            .unwrap();
            let whole = end.is_none() && start == 0 && lfs;
            if whole && faults.cut_first_transfer && cut.insert(path.clone()) {
                stream.write_all(&part[..part.len() / 2]).unwrap();
            } else {
                stream.write_all(part).unwrap();
            }
        }
        seen
    });
    (addr, handle)
}

fn source<'a>(
    repo: &'a str,
    endpoint: &'a str,
    cache: &'a std::path::Path,
) -> craterdex_fetch::HubSource<'a> {
    craterdex_fetch::HubSource {
        repo,
        revision: "main",
        endpoint,
        token: None,
        cache_dir: Some(cache),
    }
}

const CONFIG: &[u8] = br#"{"model_type": "dinov2", "num_attention_heads": 2, "layer_norm_eps": 1e-6, "image_size": 518}"#;

/// Counts what the fetch reports, as the command line's bars do.
#[derive(Default)]
struct Counted {
    files: Vec<(String, u64)>,
    bytes: u64,
}

impl craterdex_fetch::DownloadProgress for Counted {
    fn start(&mut self, file: &str, bytes: u64) {
        self.files.push((file.to_string(), bytes));
    }
    fn advance(&mut self, bytes: u64) {
        self.bytes += bytes;
    }
    fn finish(&mut self) {}
}

fn check_imported(dir: &std::path::Path, cfg: &craterdex_model::config::ModelConfig, repo: &str) {
    assert_eq!(
        (cfg.hidden_size, cfg.num_heads, cfg.depth, cfg.patch_size),
        (16, 2, 1, 2)
    );
    assert_eq!(cfg.provenance.source, format!("hf:{repo}@main"));
    assert_eq!(cfg.provenance.layout, "hf-dinov2");
    let vit = craterdex_model::load(dir, Some(8)).unwrap();
    let out = vit.forward(&[vec![0.5; 3 * 8 * 8]]).unwrap();
    assert_eq!((out[0].cls.len(), out[0].attention.len()), (16, 16));
}

/// Fetches `repo` from `endpoint` into a fresh cache and models directory (kept while the
/// first value lives).
fn fetch(
    repo: &str,
    endpoint: &str,
) -> (
    (tempfile::TempDir, tempfile::TempDir),
    craterdex_fetch::Result<(std::path::PathBuf, craterdex_model::config::ModelConfig)>,
) {
    let (cache, models) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let fetched = craterdex_fetch::fetch_hf(
        &source(repo, endpoint, cache.path()),
        models.path(),
        &mut (),
    );
    ((cache, models), fetched)
}

/// A repository of `config.json` and one `model.safetensors` holding `weights`.
fn single_file_repo(repo: &str, weights: &[u8]) -> Vec<(String, Vec<u8>)> {
    vec![
        (format!("/{repo}/resolve/main/config.json"), CONFIG.to_vec()),
        (
            format!("/{repo}/resolve/main/model.safetensors"),
            weights.to_vec(),
        ),
    ]
}

#[test]
fn downloads_and_imports_a_hub_checkpoint_from_a_loopback_server() {
    let repo = "facebook/dinov2-tiny-test";
    let weights = tiny_dinov2_checkpoint();
    let files = single_file_repo(repo, &weights);
    let (endpoint, server) = serve(files, 4, Faults::default());
    let (cache, models) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut progress = Counted::default();
    let (dir, cfg) = craterdex_fetch::fetch_hf(
        &source(repo, &endpoint, cache.path()),
        models.path(),
        &mut progress,
    )
    .unwrap();
    assert_eq!(
        server.join().unwrap(),
        vec![
            format!("/{repo}/resolve/main/config.json 0-0"),
            format!("/{repo}/resolve/main/config.json 0-"),
            format!("/{repo}/resolve/main/model.safetensors 0-0"),
            format!("/{repo}/resolve/main/model.safetensors 0-"),
        ]
    );
    check_imported(&dir, &cfg, repo);
    assert_eq!(
        progress.files.last(),
        Some(&("model.safetensors".to_string(), weights.len() as u64))
    );
    assert_eq!(progress.bytes, (CONFIG.len() + weights.len()) as u64);
    // streamed into Hugging Face's cache layout, the large file under its sha256
    let blob = cache
        .path()
        .join("models--facebook--dinov2-tiny-test/blobs")
        .join(craterdex_model::store::sha256_hex(&weights));
    assert_eq!(std::fs::read(&blob).unwrap(), weights);

    // a second fetch uses the cache and makes no request
    let models2 = tempfile::tempdir().unwrap();
    let (_, again) = craterdex_fetch::fetch_hf(
        &source(repo, "http://127.0.0.1:9", cache.path()),
        models2.path(),
        &mut (),
    )
    .unwrap();
    assert_eq!(again.weights_sha256, cfg.weights_sha256);
}

#[test]
fn an_interrupted_download_resumes_where_it_stopped() {
    let repo = "facebook/dinov2-tiny-test";
    let weights = tiny_dinov2_checkpoint();
    let files = single_file_repo(repo, &weights);
    let faults = Faults {
        cut_first_transfer: true,
        ..Faults::default()
    };
    let (endpoint, server) = serve(files, 5, faults);
    let (_dirs, fetched) = fetch(repo, &endpoint);
    let (dir, cfg) = fetched.unwrap();
    let seen = server.join().unwrap();
    assert_eq!(
        seen.last().unwrap(),
        &format!(
            "/{repo}/resolve/main/model.safetensors {}-",
            weights.len() / 2
        ),
        "{seen:?}"
    );
    check_imported(&dir, &cfg, repo);
}

#[test]
fn a_download_that_does_not_match_its_checksum_is_refused_and_removed() {
    let repo = "facebook/dinov2-tiny-test";
    let files = single_file_repo(repo, &tiny_dinov2_checkpoint());
    let faults = Faults {
        wrong_checksum: true,
        ..Faults::default()
    };
    let (endpoint, server) = serve(files, 4, faults);
    let (cache, models) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let err = craterdex_fetch::fetch_hf(
        &source(repo, &endpoint, cache.path()),
        models.path(),
        &mut (),
    )
    .unwrap_err();
    server.join().unwrap();
    let message = err.to_string();
    assert!(
        message.contains("sha256") && message.contains("model.safetensors"),
        "{message}"
    );
    assert_eq!(err.kind(), craterdex_errors::ErrorKind::Corrupt);
    let blob = cache
        .path()
        .join("models--facebook--dinov2-tiny-test/blobs")
        .join(craterdex_model::store::sha256_hex(b"other bytes"));
    assert!(!blob.exists());
    assert!(std::fs::read_dir(models.path()).unwrap().next().is_none());
}

#[test]
fn a_sharded_checkpoint_is_fetched_shard_by_shard() {
    let repo = "facebook/dinov2-sharded-test";
    let tensors = tiny_dinov2_tensors();
    let (first, second) = tensors.split_at(tensors.len() / 2);
    let names = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    let mut weight_map = serde_json::Map::new();
    for (shard, part) in names.iter().zip([first, second]) {
        for (tensor, _, _) in part {
            weight_map.insert(tensor.clone(), serde_json::json!(shard));
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    let files = vec![
        (format!("/{repo}/resolve/main/config.json"), CONFIG.to_vec()),
        (
            format!("/{repo}/resolve/main/model.safetensors.index.json"),
            serde_json::to_vec(&index).unwrap(),
        ),
        (
            format!("/{repo}/resolve/main/{}", names[0]),
            craterdex_model::testing::f32_safetensors(first),
        ),
        (
            format!("/{repo}/resolve/main/{}", names[1]),
            craterdex_model::testing::f32_safetensors(second),
        ),
    ];
    // config (2), model.safetensors (404), the index (2), two shards (2 each)
    let (endpoint, server) = serve(files, 9, Faults::default());
    let (_dirs, fetched) = fetch(repo, &endpoint);
    let (dir, cfg) = fetched.unwrap();
    let seen = server.join().unwrap();
    assert!(seen.contains(&format!("/{repo}/resolve/main/model.safetensors 0-0")));
    assert!(seen.contains(&format!("/{repo}/resolve/main/{} 0-", names[1])));
    check_imported(&dir, &cfg, repo);
}

#[test]
fn a_missing_repository_is_a_clear_error() {
    let (endpoint, server) = serve(vec![], 1, Faults::default());
    let (cache, models) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let err = format!(
        "{:#}",
        craterdex_fetch::fetch_hf(
            &source("nobody/nothing", &endpoint, cache.path()),
            models.path(),
            &mut ()
        )
        .unwrap_err()
    );
    server.join().unwrap();
    assert!(
        err.contains("nobody/nothing/resolve/main/config.json") && err.contains("404"),
        "{err}"
    );
    assert!(craterdex_fetch::fetch_hf(
        &source("../etc", &endpoint, cache.path()),
        models.path(),
        &mut ()
    )
    .is_err());
}
