//! craterdex-detect: finds craters in whole images, the step before linking when a new
//! observation arrives as an image and not as a crater list.
//!
//! Owns: detector models as layer graphs of plain operations (convolutions run as products
//! on craterdex's kernels at every level and precision), their import from Keras HDF5
//! files (pycda's U-Net) and ONNX files, the detector directory format, cutting an image of any size into
//! the detector's tiles over an image pyramid, and turning per-pixel crater likelihoods
//! into circles merged across tiles and scales.
//! Also fits a detector to labelled images: a new head on its frozen maps (`fit`), or every
//! layer (`train`).
//! Knows nothing of features, descriptors, indexes, searches or linking; scoring detections
//! against labelled craters is craterdex-eval's.

pub mod detect;
mod error;
pub mod fit;
pub mod graph;
pub mod keras;
pub mod net;
pub mod onnx;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
pub mod train;

pub use detect::{
    default_precision, detect, read_pyramid, DetectOptions, Detection, DiameterScales, GrayImage,
    Readings, DEFAULT_PRECISION_WHY,
};
pub use error::{Error, Result};
pub use graph::{Activation, Graph, Layer, Op, Padding};
pub use net::{FeatureMap, Net};
pub use store::{
    import_detector, read_detector_dir, read_detector_weights, write_detector_dir, DetectorConfig,
    DIAMETER_SCALES, DIAMETER_SCALES_PER_OCTAVE,
};
