//! What an index holds, as every front end shows it: `craterdex index info`, Python's
//! `Index.info()` and the service's `/v1/stats`.

use crate::engine::Engine;
use craterdex_tokens::Recipe;
use serde::Serialize;

/// One index's sizes, codec, model and recipe.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct IndexInfo {
    /// Images a search can return.
    pub images: usize,
    /// Images removed since the index was built (their rows stay until a rebuild).
    pub removed: usize,
    pub segments: usize,
    /// The model fingerprint the index records (its queries must come from that model).
    pub model: Option<String>,
    /// The token codec, spelled as the build option (`int8`, `pq96`, ...).
    pub codec: String,
    pub tokens_per_image: usize,
    pub token_dim: usize,
    pub single_dim: usize,
    /// Width of the backbone features the encoder takes.
    pub feature_dim: usize,
    /// Bytes of stored tokens per image.
    pub token_bytes_per_image: usize,
    /// The descriptor recipe the index was built with (as `encoder.json` stores it).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub recipe: Recipe,
    /// Stage-1 IVF lists and the lists a query scans by default.
    pub ivf: Option<IvfInfo>,
    /// Whether a model is loaded for image queries.
    pub image_search: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct IvfInfo {
    pub lists: usize,
    pub nprobe: usize,
}

impl Engine {
    pub fn info(&self) -> IndexInfo {
        let idx = self.index();
        IndexInfo {
            images: idx.live(),
            removed: idx.rows() - idx.live(),
            segments: idx.segment_count(),
            model: idx.model().map(str::to_string),
            codec: idx.codec.codec.to_string(),
            tokens_per_image: idx.tokens_per_image(),
            token_dim: idx.token_dim(),
            single_dim: idx.single_dim(),
            feature_dim: idx.feature_dim(),
            token_bytes_per_image: idx.token_bytes_per_image(),
            recipe: idx.encoder.recipe.clone(),
            ivf: idx.ivf().map(|(ivf, nprobe)| IvfInfo {
                lists: ivf.lists(),
                nprobe,
            }),
            image_search: self.extractor().is_some(),
        }
    }
}
