//! `fetch_hf` against a Hugging Face-like server on loopback serving a generated checkpoint.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;

fn tiny_dinov2_checkpoint() -> Vec<u8> {
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
    craterdex_model::testing::f32_safetensors(&bufs)
}

/// Serves `files` under `/{repo}/resolve/main/` for `requests` requests, then stops.
fn serve(
    files: Vec<(String, Vec<u8>)>,
    requests: usize,
) -> (String, std::thread::JoinHandle<Vec<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let handle = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for stream in listener.incoming().take(requests) {
            let mut stream = stream.unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap() == 0 || h == "\r\n" {
                    break;
                }
            }
            let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
            seen.push(path.clone());
            match files.iter().find(|(p, _)| *p == path) {
                Some((_, body)) => {
                    write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    )
                    .unwrap();
                    stream.write_all(body).unwrap();
                }
                None => write!(
                    stream,
                    "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                .unwrap(),
            }
        }
        seen
    });
    (addr, handle)
}

#[test]
fn downloads_and_imports_a_hub_checkpoint_from_a_loopback_server() {
    let repo = "facebook/dinov2-tiny-test";
    let config = br#"{"model_type": "dinov2", "num_attention_heads": 2, "layer_norm_eps": 1e-6, "image_size": 518}"#.to_vec();
    let files = vec![
        (format!("/{repo}/resolve/main/config.json"), config),
        (
            format!("/{repo}/resolve/main/model.safetensors"),
            tiny_dinov2_checkpoint(),
        ),
    ];
    let (endpoint, server) = serve(files, 2);
    let tmp = tempfile::tempdir().unwrap();
    let (dir, cfg) = craterdex_fetch::fetch_hf(repo, "main", &endpoint, tmp.path()).unwrap();
    assert_eq!(
        server.join().unwrap(),
        vec![
            format!("/{repo}/resolve/main/config.json"),
            format!("/{repo}/resolve/main/model.safetensors")
        ]
    );
    assert_eq!(
        (cfg.hidden_size, cfg.num_heads, cfg.depth, cfg.patch_size),
        (16, 2, 1, 2)
    );
    assert_eq!(cfg.provenance.source, format!("hf:{repo}@main"));
    assert_eq!(cfg.provenance.layout, "hf-dinov2");
    let vit = craterdex_model::load(&dir, Some(8)).unwrap();
    let out = vit.forward(&[vec![0.5; 3 * 8 * 8]]).unwrap();
    assert_eq!((out[0].cls.len(), out[0].attention.len()), (16, 16));
}

#[test]
fn a_missing_repository_is_a_clear_error() {
    let (endpoint, server) = serve(vec![], 1);
    let tmp = tempfile::tempdir().unwrap();
    let err = format!(
        "{:#}",
        craterdex_fetch::fetch_hf("nobody/nothing", "main", &endpoint, tmp.path()).unwrap_err()
    );
    server.join().unwrap();
    assert!(
        err.contains("nobody/nothing/resolve/main/config.json") && err.contains("404"),
        "{err}"
    );
    assert!(craterdex_fetch::fetch_hf("../etc", "main", &endpoint, tmp.path()).is_err());
}
