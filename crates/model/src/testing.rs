//! Small generated checkpoints for tests and examples: real layouts, pseudo-random weights.

use std::path::{Path, PathBuf};

/// A one-block Meta/timm-layout ViT with deterministic pseudo-random weights.
pub fn write_tiny_checkpoint(dir: &Path, dim: usize, patch: usize, grid: usize) -> PathBuf {
    write_tiny_checkpoint_of_depth(dir, dim, patch, grid, 1)
}

/// [`write_tiny_checkpoint`] with `depth` blocks.
pub fn write_tiny_checkpoint_of_depth(
    dir: &Path,
    dim: usize,
    patch: usize,
    grid: usize,
    depth: usize,
) -> PathBuf {
    let (d, p, g) = (dim, patch, grid);
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("cls_token".into(), vec![1, 1, d]),
        ("pos_embed".into(), vec![1, 1 + g * g, d]),
        ("patch_embed.proj.weight".into(), vec![d, 3, p, p]),
        ("patch_embed.proj.bias".into(), vec![d]),
        ("norm.weight".into(), vec![d]),
        ("norm.bias".into(), vec![d]),
    ];
    // block by block, so that a shallower checkpoint's blocks are the first of a deeper one's
    for block in 0..depth {
        for (n, s) in [
            ("norm1.weight", vec![d]),
            ("norm1.bias", vec![d]),
            ("attn.qkv.weight", vec![3 * d, d]),
            ("attn.qkv.bias", vec![3 * d]),
            ("attn.proj.weight", vec![d, d]),
            ("attn.proj.bias", vec![d]),
            ("norm2.weight", vec![d]),
            ("norm2.bias", vec![d]),
            ("mlp.fc1.weight", vec![2 * d, d]),
            ("mlp.fc1.bias", vec![2 * d]),
            ("mlp.fc2.weight", vec![d, 2 * d]),
            ("mlp.fc2.bias", vec![d]),
        ] {
            shapes.push((format!("blocks.{block}.{n}"), s));
        }
    }
    let mut state = 12345u64;
    let bufs: Vec<(String, Vec<usize>, Vec<u8>)> = shapes
        .into_iter()
        .map(|(n, s)| {
            let count: usize = s.iter().product();
            let bytes = (0..count)
                .flat_map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let v = ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
                        * if n.contains("norm") && n.ends_with("weight") {
                            0.2
                        } else {
                            0.6
                        };
                    let v = if n.contains("norm") && n.ends_with("weight") {
                        1.0 + v
                    } else {
                        v
                    };
                    v.to_le_bytes()
                })
                .collect();
            (n, s, bytes)
        })
        .collect();
    std::fs::create_dir_all(dir).expect("writing a generated checkpoint");
    let path = dir.join("tiny.safetensors");
    std::fs::write(&path, f32_safetensors(&bufs)).expect("writing a generated checkpoint");
    std::fs::write(dir.join("config.json"), r#"{"num_heads": 2}"#)
        .expect("writing a generated checkpoint");
    path
}

/// [`write_tiny_checkpoint_of_depth`] into `root/ckpt-NAME`, imported as model `name` under
/// `root/models`: the model's directory, ready for [`crate::load`].
pub fn import_tiny_model(
    root: &Path,
    name: &str,
    dim: usize,
    patch: usize,
    grid: usize,
    depth: usize,
) -> PathBuf {
    let ckpt =
        write_tiny_checkpoint_of_depth(&root.join(format!("ckpt-{name}")), dim, patch, grid, depth);
    crate::import::import_file(&ckpt, name, &root.join("models"))
        .expect("importing a generated checkpoint")
        .0
}

/// A safetensors file of f32 tensors given as (name, shape, little-endian bytes).
pub fn f32_safetensors(tensors: &[(String, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                    .expect("shape and bytes of a generated tensor agree"),
            )
        })
        .collect();
    safetensors::serialize(views, &None).expect("serialising generated tensors")
}
