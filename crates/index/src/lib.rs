//! craterdex-index: stores descriptors compactly and searches them.
//!
//! Owns: token codecs (f32, f16, int8, PQ), the index directory format (manifest, immutable
//! checksummed segments, atomic updates), in-memory indexes, IVF stage 1 and two-stage
//! search. Scoring kernels come from craterdex-kernels. Knows nothing of images, models or
//! benchmarks: it takes descriptors made by craterdex-tokens.
//!
//! Layout, after tantivy's: [`files`] names every file; `manifest` reads and writes
//! `index.json`; `segment_writer` encodes and writes a segment; `segment` reads one; `index`
//! holds an open index and its writes; `merge` rewrites small segments as
//! larger ones in the background; [`parts`] joins segments written apart (a build
//! spread over many machines) into one index; `search` answers queries; [`shards`] cuts an index into a set of shard indexes.

pub mod codec;
mod error;
pub mod files;
mod index;
pub mod ivf;
mod manifest;
mod merge;
mod meta;
pub mod parts;
mod rows;
mod search;
mod segment;
mod segment_writer;
pub mod shards;
mod single_int8;
mod topk;

pub use codec::{Codec, TokenCodec};
pub use error::{Error, Result};
pub use index::{Index, IvfChoice};
pub use manifest::{INDEX_FORMAT, INDEX_VERSION};
pub use merge::{plan as plan_merge, MergePolicy, MergeReport, PreparedMerge, SegmentRows};
pub use meta::{columns, ImageMeta, MAX_DIAMETER_KM, MAX_PIXELS, MIN_DIAMETER};
pub use search::{order_by_crater, Hit, Mode, SearchParams, Stage1};
pub use topk::{Scored, TopK};
