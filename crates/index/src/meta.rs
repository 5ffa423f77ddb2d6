//! What is stored about each image besides its descriptors.

use serde::{Deserialize, Serialize};

/// What is known about one indexed image.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImageMeta {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crater_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lat: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lon: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diameter_km: Option<f64>,
    /// Centre and diameter in pixels of one image frame (a tile or a mosaic), for catalogues
    /// without coordinates on the body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub y: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diameter_px: Option<f64>,
    /// The image file, for thumbnails and reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}
