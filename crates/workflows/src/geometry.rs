//! Geometric evidence between two catalogue entries: how far apart their centres are, in
//! crater radii, and how different their diameters are.

use craterdex_index::ImageMeta;

/// Mean radius of Mars in km (IAU), the default body.
pub const MARS_RADIUS_KM: f64 = 3389.5;

/// A crater's centre and size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Position {
    pub lat: f64,
    pub lon: f64,
    pub diameter_km: f64,
}

impl Position {
    /// The position recorded in an entry's metadata, when it has all three values.
    pub fn of(meta: &ImageMeta) -> Option<Position> {
        Some(Position {
            lat: meta.lat?,
            lon: meta.lon?,
            diameter_km: meta.diameter_km.filter(|d| *d > 0.0)?,
        })
    }
}

/// Great-circle distance in km on a sphere of `radius_km` (haversine: exact at the small
/// separations that matter here, where the law of cosines loses its digits).
pub fn distance_km(a: Position, b: Position, radius_km: f64) -> f64 {
    let (p1, p2) = (a.lat.to_radians(), b.lat.to_radians());
    let dp = p2 - p1;
    let dl = (b.lon - a.lon).to_radians();
    let h = (dp / 2.0).sin().powi(2) + p1.cos() * p2.cos() * (dl / 2.0).sin().powi(2);
    2.0 * radius_km * h.sqrt().min(1.0).asin()
}

/// Centre offset in radii of the larger crater, and the diameter ratio (>= 1).
pub fn evidence(a: Position, b: Position, radius_km: f64) -> (f64, f64) {
    let big = a.diameter_km.max(b.diameter_km);
    let small = a.diameter_km.min(b.diameter_km);
    (distance_km(a, b, radius_km) / (big / 2.0), big / small)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_in_radii_of_the_larger_crater() {
        let a = Position {
            lat: 0.0,
            lon: 0.0,
            diameter_km: 2.0,
        };
        // one degree of longitude at the equator of Mars is 59.16 km
        let b = Position {
            lat: 0.0,
            lon: 1.0,
            diameter_km: 4.0,
        };
        let (offset, ratio) = evidence(a, b, MARS_RADIUS_KM);
        assert!((offset - 59.157 / 2.0).abs() < 0.01, "{offset}");
        assert_eq!(ratio, 2.0);
        assert_eq!(evidence(a, a, MARS_RADIUS_KM), (0.0, 1.0));
        // across the antimeridian
        let c = Position { lon: 179.99, ..a };
        let d = Position { lon: -179.99, ..a };
        assert!(distance_km(c, d, MARS_RADIUS_KM) < 1.2);
    }
}
