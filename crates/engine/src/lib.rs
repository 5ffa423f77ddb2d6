//! craterdex-engine: the one pipeline behind every front end (CLI, service, evaluation,
//! benchmarks, and the catalogue workflows and Python package built on them).
//!
//! Owns: loading a model and extracting features with progress ([`Extractor`]), the build
//! recipe that turns features into an index on disk or in memory ([`IndexRecipe`]), and
//! searching and changing an index ([`Engine`]) with serialisable results ([`SearchHit`]),
//! and builds spread over many machines ([`BuildPlan`]: learn once, write parts, commit).
//! Data flows one way, images -> features -> descriptors -> index -> results; this crate
//! sits on model, tokens and index and must not know about benchmarks, reports, HTTP or the
//! command line.

mod build;
mod catalogue;
mod engine;
mod error;
mod extractor;
mod hits;
mod info;
pub mod inputs;
mod options;
mod plan;
mod progress;
mod recheck;
mod recipe;
mod search;
mod sharded;
mod shared;
#[cfg(test)]
mod test_images;
mod verify;
mod views;

pub use build::{Entries, LearnFrom};
pub use catalogue::{sun_sample, suns_from_samples, Catalogue};
pub use engine::{sun_headings_of, Engine, QueryFeatures};
pub use error::{Error, Result};
pub use extractor::Extractor;
pub use hits::{QueryHits, SearchHit};
pub use info::{IndexInfo, IvfInfo};
pub use options::{
    default_precision, verified_search_params, Defaults, ModelOptions, Protocol, ProtocolInfo,
    RecipeOptions, SearchLimits, SearchOptions, Whitening, DEFAULT_PRECISION_WHY,
    MAX_RECHECK_VIEWS, MAX_TURNS, MAX_VERIFY, OPPOSITE_SUN_MARGIN, SUN_APART_DEGREES, SUN_SAMPLE,
    SUN_SHARE, SUN_WINDOW_DEGREES, TURN_MARGIN, VERIFY_CHANCE_SHARE, VERIFY_SHORTLIST,
    VERIFY_VIEWS, VERIFY_VIEWS_PER_CRATER, VERIFY_WEIGHT,
};
pub use plan::{learn_rows, learn_sample, BuildPlan, LEARN_SAMPLE_IMAGES};
pub use progress::{Progress, Silent};
pub use recheck::{RecheckPlan, Stage, StageRun};
pub use recipe::{encode_all, feature_refs, IndexRecipe, IvfSetting, IVF_AUTO_MIN_IMAGES};
pub use search::{
    search, search_streamed, QueryKind, SearchAnswer, SearchInput, Timing, QUERY_BATCH,
};
pub use sharded::{merge_hits, OverShards, QueryEncoder, ShardCalls, ShardedEngine};
pub use shared::SharedEngine;
pub use verify::{PatchGrid, PatchGrids};
pub use views::{
    opposite_sun, sun_heading_of, sun_headings, OppositeSun, QueryViews, Suns, MAX_SUNS,
};

// What front ends need from the crates below to use the engine.
pub use craterdex_index::shards;
pub use craterdex_index::{
    Codec, Hit, ImageMeta, Index, MergePolicy, MergeReport, Mode, SearchParams, Stage1,
};
pub use craterdex_model::extract::FeatureSet;
pub use craterdex_model::{data_uri, data_uri_of, Brightness, Orientation, Precision, ResizeMode};
pub use craterdex_tokens::{Aggregation, Descriptors, Encoder, Pooling, Recipe, SeedStrategy};
