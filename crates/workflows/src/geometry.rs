//! Geometric evidence between two catalogue entries: how far apart their centres are, in
//! crater radii, and how different their diameters are.

use craterdex_index::ImageMeta;

/// Mean radius of Mars in km (IAU), the default body.
pub const MARS_RADIUS_KM: f64 = 3389.5;

/// A crater's centre and size on the body (degrees, km) or in one image frame (pixels).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Position {
    Body {
        lat: f64,
        lon: f64,
        diameter_km: f64,
    },
    Frame {
        x: f64,
        y: f64,
        diameter_px: f64,
    },
}

impl Position {
    /// The position recorded in an entry's metadata: on the body when it has latitude,
    /// longitude and diameter, else in its image frame when it has x, y and diameter.
    pub fn of(meta: &ImageMeta) -> Option<Position> {
        let body = || {
            Some(Position::Body {
                lat: meta.lat?,
                lon: meta.lon?,
                diameter_km: meta.diameter_km.filter(|d| *d > 0.0)?,
            })
        };
        let frame = || {
            Some(Position::Frame {
                x: meta.x?,
                y: meta.y?,
                diameter_px: meta.diameter_px.filter(|d| *d > 0.0)?,
            })
        };
        body().or_else(frame)
    }
}

/// Great-circle distance in km on a sphere of `radius_km` (haversine: exact at the small
/// separations that matter here, where the law of cosines loses its digits).
pub fn distance_km(a: (f64, f64), b: (f64, f64), radius_km: f64) -> f64 {
    let (p1, p2) = (a.0.to_radians(), b.0.to_radians());
    let dp = p2 - p1;
    let dl = (b.1 - a.1).to_radians();
    let h = (dp / 2.0).sin().powi(2) + p1.cos() * p2.cos() * (dl / 2.0).sin().powi(2);
    2.0 * radius_km * h.sqrt().min(1.0).asin()
}

/// Centre offset in radii of the larger crater, and the diameter ratio (>= 1); None when
/// the two positions are not in the same kind of frame.
pub fn evidence(a: Position, b: Position, radius_km: f64) -> Option<(f64, f64)> {
    let (dist, da, db) = match (a, b) {
        (
            Position::Body {
                lat,
                lon,
                diameter_km,
            },
            Position::Body {
                lat: lat2,
                lon: lon2,
                diameter_km: d2,
            },
        ) => (
            distance_km((lat, lon), (lat2, lon2), radius_km),
            diameter_km,
            d2,
        ),
        (
            Position::Frame { x, y, diameter_px },
            Position::Frame {
                x: x2,
                y: y2,
                diameter_px: d2,
            },
        ) => ((x - x2).hypot(y - y2), diameter_px, d2),
        _ => return None,
    };
    let (big, small) = (da.max(db), da.min(db));
    Some((dist / (big / 2.0), big / small))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_in_radii_of_the_larger_crater() {
        let body = |lat, lon, diameter_km| Position::Body {
            lat,
            lon,
            diameter_km,
        };
        // one degree of longitude at the equator of Mars is 59.16 km
        let (offset, ratio) =
            evidence(body(0.0, 0.0, 2.0), body(0.0, 1.0, 4.0), MARS_RADIUS_KM).unwrap();
        assert!((offset - 59.157 / 2.0).abs() < 0.01, "{offset}");
        assert_eq!(ratio, 2.0);
        let a = body(0.0, 0.0, 2.0);
        assert_eq!(evidence(a, a, MARS_RADIUS_KM), Some((0.0, 1.0)));
        // across the antimeridian
        assert!(distance_km((0.0, 179.99), (0.0, -179.99), MARS_RADIUS_KM) < 1.2);
        // pixels: 30 px apart, 20 px and 10 px across
        let frame = |x, y, diameter_px| Position::Frame { x, y, diameter_px };
        assert_eq!(
            evidence(frame(0.0, 0.0, 20.0), frame(18.0, 24.0, 10.0), 1.0),
            Some((3.0, 2.0))
        );
        // a position on the body and one in pixels cannot be compared
        assert_eq!(evidence(a, frame(0.0, 0.0, 1.0), 1.0), None);
    }
}
