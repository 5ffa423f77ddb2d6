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

/// The column names each field of [`ImageMeta`] goes by in the crater tables planetary
/// scientists hold, first choice first (matched case-insensitively): craterdex's own, the
/// Robbins global lunar and Martian databases (`CRATER_ID`, `LAT_CIRC_IMG`, `LON_CIRC_IMG`,
/// `DIAM_CIRC_IMG`, their ellipse fits after them) and the common spellings. Every reader of
/// a crater table takes its columns from here.
pub mod columns {
    /// An image's id; a table of one image per crater may name it by its crater instead
    /// ([`CRATER_ID`]).
    pub const ID: &[&str] = &["id", "image_id"];
    pub const CRATER_ID: &[&str] = &["crater_id"];
    pub const SOURCE: &[&str] = &["source"];
    pub const VIEW: &[&str] = &["view"];
    /// Degrees, planetocentric.
    pub const LAT: &[&str] = &["lat", "latitude", "lat_circ_img", "lat_elli_img"];
    /// Degrees east, 0-360 or -180..180 alike.
    pub const LON: &[&str] = &["lon", "longitude", "lon_circ_img", "lon_elli_img"];
    pub const DIAMETER_KM: &[&str] = &["diameter_km", "diam_km", "diam_circ_img"];
    pub const X: &[&str] = &["x"];
    pub const Y: &[&str] = &["y"];
    pub const DIAMETER_PX: &[&str] = &["diameter_px"];

    /// The position among `headers` of the first of `names` there, case-insensitively.
    pub fn find<'a>(
        headers: impl IntoIterator<Item = &'a str> + Clone,
        names: &[&str],
    ) -> Option<usize> {
        names.iter().find_map(|n| {
            headers
                .clone()
                .into_iter()
                .position(|h| h.trim().eq_ignore_ascii_case(n))
        })
    }
}

/// Largest pixel coordinate or diameter accepted: a global mosaic is about a million pixels
/// wide, and far beyond that sums and transforms of positions overflow to infinity.
pub const MAX_PIXELS: f64 = 1e9;

/// Largest crater diameter accepted, in km (the largest basins are a few thousand).
pub const MAX_DIAMETER_KM: f64 = 1e5;

/// Smallest diameter accepted, in km or pixels: offsets are measured in radii, and a
/// subnormal diameter would make them infinite.
pub const MIN_DIAMETER: f64 = 1e-6;

impl ImageMeta {
    /// The first position field out of its range, named with the range (None when all
    /// given fields are in range): latitude in [-90, 90] degrees, longitude in [-360, 360],
    /// diameters from [`MIN_DIAMETER`] (at most [`MAX_DIAMETER_KM`] km or [`MAX_PIXELS`] px), pixel
    /// centres within [`MAX_PIXELS`] of the frame's origin.
    pub fn position_problem(&self) -> Option<String> {
        let ranges = [
            ("lat", self.lat, -90.0, 90.0),
            ("lon", self.lon, -360.0, 360.0),
            (
                "diameter_km",
                self.diameter_km,
                MIN_DIAMETER,
                MAX_DIAMETER_KM,
            ),
            ("x", self.x, -MAX_PIXELS, MAX_PIXELS),
            ("y", self.y, -MAX_PIXELS, MAX_PIXELS),
            ("diameter_px", self.diameter_px, MIN_DIAMETER, MAX_PIXELS),
        ];
        ranges.into_iter().find_map(|(name, value, low, high)| {
            let v = value?;
            (!(low..=high).contains(&v))
                .then(|| format!("{name} {v:?} is out of range ({low:?} to {high:?})"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_out_of_range_are_named() {
        let ok = ImageMeta {
            lat: Some(-90.0),
            lon: Some(359.5),
            diameter_km: Some(2.0),
            x: Some(-4.0),
            y: Some(1e6),
            diameter_px: Some(0.5),
            ..ImageMeta::default()
        };
        assert_eq!(ok.position_problem(), None);
        assert_eq!(ImageMeta::default().position_problem(), None);
        let bad = |m: ImageMeta| m.position_problem().unwrap();
        assert!(bad(ImageMeta {
            lat: Some(-1.7e308),
            ..ok.clone()
        })
        .starts_with("lat "));
        assert!(bad(ImageMeta {
            lon: Some(f64::NAN),
            ..ok.clone()
        })
        .starts_with("lon "));
        assert!(bad(ImageMeta {
            diameter_km: Some(5e-324),
            ..ok.clone()
        })
        .ends_with("(1e-6 to 100000.0)"));
        assert!(bad(ImageMeta {
            y: Some(2e9),
            ..ok.clone()
        })
        .starts_with("y 2000000000.0 "));
        assert!(bad(ImageMeta {
            diameter_px: Some(-3.0),
            ..ok
        })
        .starts_with("diameter_px "));
    }
}
