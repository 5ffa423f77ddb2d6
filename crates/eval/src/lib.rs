//! craterdex-eval: measures retrieval the CraterBench-R way and builds such benchmarks.
//!
//! Owns: the CraterBench-R manifest format, crater catalogues, the benchmark builder (from
//! image tiles, or from georeferenced mosaics through GDAL with the `gdal` feature),
//! metrics (Recall@K, cluster-tolerant mAP, R@S), the paper's evaluation regimes (each an
//! index built and searched through craterdex-engine, so the numbers measure the shipped
//! code) and the HTML report. Sits at the end of the data flow: it may use every other
//! crate, and none of them may use it.

pub mod benchbuild;
pub mod catalogue;
pub mod detection;
mod error;
#[cfg(feature = "gdal")]
pub mod georef;
pub mod image_link;
pub mod manifest;
pub mod metrics;
pub mod observations;
pub mod regime;
pub mod regimes;
pub mod report;
pub mod run;
pub mod tiles;
pub mod turned;

pub use error::{Error, Result};
