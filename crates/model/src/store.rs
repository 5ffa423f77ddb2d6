//! The model directory: `config.json` plus `model.safetensors` in the craterdex layout.
//!
//! Directories are written beside their final place and renamed into it, so a crash never
//! leaves a half-written model where a reader would find it.

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::vit::{BlockWeights, VitWeights};
use craterdex_errors::{ensure, IoContext, OrInvalid, ResultExt};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const CONFIG_FILE: &str = "config.json";
pub const WEIGHTS_FILE: &str = "model.safetensors";

pub fn sha256_hex(bytes: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(bytes);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).io("open", path)?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).io("read", path)?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn named_tensors(w: &VitWeights) -> Vec<(String, &[f32])> {
    let mut v: Vec<(String, &[f32])> = vec![
        ("cls_token".into(), &w.cls_token),
        ("pos_embed".into(), &w.pos_embed),
        ("patch_embed.weight".into(), &w.patch_w),
        ("patch_embed.bias".into(), &w.patch_b),
        ("norm.weight".into(), &w.norm_w),
        ("norm.bias".into(), &w.norm_b),
    ];
    for (i, b) in w.blocks.iter().enumerate() {
        let mut push =
            |s: &str, t: &'static str, data| v.push((format!("blocks.{i}.{s}{t}"), data));
        push("norm1", ".weight", &b.norm1_w[..]);
        push("norm1", ".bias", &b.norm1_b[..]);
        push("attn.qkv", ".weight", &b.qkv_w[..]);
        push("attn.qkv", ".bias", &b.qkv_b[..]);
        push("attn.proj", ".weight", &b.proj_w[..]);
        push("attn.proj", ".bias", &b.proj_b[..]);
        push("norm2", ".weight", &b.norm2_w[..]);
        push("norm2", ".bias", &b.norm2_b[..]);
        push("mlp.fc1", ".weight", &b.fc1_w[..]);
        push("mlp.fc1", ".bias", &b.fc1_b[..]);
        push("mlp.fc2", ".weight", &b.fc2_w[..]);
        push("mlp.fc2", ".bias", &b.fc2_b[..]);
        if let Some(ls) = &b.ls1 {
            push("ls1", "", &ls[..]);
        }
        if let Some(ls) = &b.ls2 {
            push("ls2", "", &ls[..]);
        }
    }
    v
}

/// Serialises weights as flat f32 safetensors (shapes are described by the config).
pub fn weights_to_safetensors(w: &VitWeights) -> Result<Vec<u8>> {
    let tensors = named_tensors(w);
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, d)| {
            let bytes: &[u8] = bytemuck::cast_slice(d);
            Ok((
                n.clone(),
                safetensors::tensor::TensorView::new(
                    safetensors::Dtype::F32,
                    vec![d.len()],
                    bytes,
                )?,
            ))
        })
        .collect::<Result<_>>()?;
    Ok(safetensors::serialize(views, &None)?)
}

pub fn weights_from_safetensors(bytes: &[u8], depth: usize) -> Result<VitWeights> {
    let st = safetensors::SafeTensors::deserialize(bytes)
        .or_invalid("weights file is not valid safetensors")?;
    let get = |name: &str| -> Result<Vec<f32>> {
        let t = st
            .tensor(name)
            .or_invalid_with(|| format!("weights file has no tensor {name}"))?;
        ensure!(
            t.dtype() == safetensors::Dtype::F32,
            Error::Invalid(format!("tensor {name} is not f32"))
        );
        Ok(t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    };
    let opt = |name: &str| st.tensor(name).ok().map(|_| get(name)).transpose();
    let mut blocks = Vec::with_capacity(depth);
    for i in 0..depth {
        let n = |s: &str| format!("blocks.{i}.{s}");
        blocks.push(BlockWeights {
            norm1_w: get(&n("norm1.weight"))?,
            norm1_b: get(&n("norm1.bias"))?,
            qkv_w: get(&n("attn.qkv.weight"))?,
            qkv_b: get(&n("attn.qkv.bias"))?,
            proj_w: get(&n("attn.proj.weight"))?,
            proj_b: get(&n("attn.proj.bias"))?,
            ls1: opt(&n("ls1"))?,
            norm2_w: get(&n("norm2.weight"))?,
            norm2_b: get(&n("norm2.bias"))?,
            fc1_w: get(&n("mlp.fc1.weight"))?,
            fc1_b: get(&n("mlp.fc1.bias"))?,
            fc2_w: get(&n("mlp.fc2.weight"))?,
            fc2_b: get(&n("mlp.fc2.bias"))?,
            ls2: opt(&n("ls2"))?,
        });
    }
    Ok(VitWeights {
        cls_token: get("cls_token")?,
        pos_embed: get("pos_embed")?,
        patch_w: get("patch_embed.weight")?,
        patch_b: get("patch_embed.bias")?,
        blocks,
        norm_w: get("norm.weight")?,
        norm_b: get("norm.bias")?,
    })
}

/// Writes a model directory atomically: a sibling temporary directory renamed into place.
/// An existing directory at `dir` is replaced only after the new one is complete.
pub fn write_model_dir(
    dir: &Path,
    mut config: ModelConfig,
    weights: &VitWeights,
) -> Result<ModelConfig> {
    weights.validate(&config)?;
    let bytes = weights_to_safetensors(weights)?;
    config.weights_sha256 = sha256_hex(&bytes);
    let parent = dir.parent().or_invalid("model directory has no parent")?;
    std::fs::create_dir_all(parent).io("create", parent)?;
    let tmp = craterdex_durable::tempdir_beside(dir)?;
    let weights_path = tmp.join(WEIGHTS_FILE);
    std::fs::write(&weights_path, &bytes).io("write", &weights_path)?;
    let config_path = tmp.join(CONFIG_FILE);
    let config_bytes = serde_json::to_vec_pretty(&config).map_err(Error::invalid)?;
    std::fs::write(&config_path, config_bytes).io("write", &config_path)?;
    craterdex_durable::replace_dir(&tmp, dir)?;
    Ok(config)
}

/// Reads a model directory; `verify` re-hashes the weights against the config.
pub fn read_model_dir(dir: &Path, verify: bool) -> Result<(ModelConfig, VitWeights)> {
    let config = ModelConfig::read(&dir.join(CONFIG_FILE))?;
    let wpath = dir.join(WEIGHTS_FILE);
    let bytes = std::fs::read(&wpath).io("read", &wpath)?;
    if verify {
        let got = sha256_hex(&bytes);
        ensure!(
            got == config.weights_sha256,
            Error::Corrupt(format!(
                "{}: sha256 {got} does not match the config's {}; the model is damaged, import or fetch it again",
                wpath.display(),
                config.weights_sha256
            ))
        );
    }
    let weights = weights_from_safetensors(&bytes, config.depth)
        .with_context(|| format!("in {}", wpath.display()))?;
    weights
        .validate(&config)
        .with_context(|| format!("in {}", wpath.display()))?;
    Ok((config, weights))
}

/// Lists model directories (those holding a config) under `root`.
pub fn list_models(root: &Path) -> Vec<(PathBuf, ModelConfig)> {
    let mut out = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir(root) {
        for e in entries.flatten() {
            let p = e.path();
            if let Ok(c) = ModelConfig::read(&p.join(CONFIG_FILE)) {
                out.insert(p, c);
            }
        }
    }
    out.into_iter().collect()
}
