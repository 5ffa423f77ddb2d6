//! craterdex-index: stores descriptors compactly on disk and searches them.
//!
//! Owns: token codecs (f32, f16, int8, PQ), late-interaction (MaxSim) kernels, exact
//! single-vector search, the index directory format (segments, manifest, checksums,
//! atomic updates) and two-stage search. Knows nothing of images, models or benchmarks:
//! it takes descriptors made by craterdex-tokens.

pub mod codec;
pub mod flat;
pub mod ivf;
pub mod search;
mod single_int8;
pub mod store;

pub use codec::{Codec, TokenCodec};
pub use search::{Hit, SearchParams};
pub use store::{ImageMeta, Index};
