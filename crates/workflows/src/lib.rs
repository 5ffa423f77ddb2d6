//! The scientists' jobs on top of the one pipeline: link new observations to a catalogue
//! index (`match` / `new` / `ambiguous`, with appearance and geometric evidence), calibrate
//! the decision rule on labelled pairs, deduplicate an index into groups of one crater,
//! grow a landmark database by inserting what is new, and rank a mosaic's windows by
//! their likeness to exemplar craters; and the measures of each against the truth.
//!
//! Owns the decision rule, its calibration, grouping, discovery and the outputs: CSV tables,
//! map layers (GeoJSON on the body's IAU coordinate system, rim polygons, QGIS styles; a
//! GeoPackage with the `gdal` feature) and HTML review pages. Searches only through
//! [`craterdex_engine::Engine`]; knows nothing of image decoding, the CLI or HTTP.

pub mod calibrate;
pub mod dedup;
pub mod discover;
pub mod entries;
mod error;
pub mod evaluate;
pub mod geometry;
#[cfg(feature = "gdal")]
mod gpkg;
pub mod images;
pub mod link;
pub mod output;
pub mod register;
pub mod review;
pub mod rule;
pub mod style;

pub use calibrate::{calibrate, Calibration};
pub use dedup::{dedup, DedupGroup, DedupOptions, Edge};
pub use error::{Error, Result};
pub use images::{link_images, ImageLinkOptions, ImageLinks, ObservedImage};
pub use link::{
    link, link_decision, link_evidence, link_one, link_partition, merged_evidence,
    register_entries, register_entries_seeded, registrations, Candidate, Decision, LinkEvidence,
    LinkOptions, LinkRow, NearHit, Neighbours,
};
pub use register::{Frames, RegisterOptions, SourceRegistration, Transform};
pub use rule::{Geometry, LinkRule, RegisteredRule};
