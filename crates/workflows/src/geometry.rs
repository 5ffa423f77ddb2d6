//! Geometric evidence between two catalogue entries: how far apart their centres are, in
//! crater radii, and how different their diameters are.

use craterdex_index::ImageMeta;

/// Mean radius of Mars in km (IAU), the default body.
pub const MARS_RADIUS_KM: f64 = 3389.5;

/// The bodies whose geographic coordinate systems PROJ knows by their IAU 2015 codes, by
/// their mean and equatorial radii in km: what GIS tools need to place a crater table of that
/// body (a GeoJSON without it lands on Earth's WGS 84 in QGIS).
const IAU_BODIES: [(&str, f64, f64); 4] = [
    ("IAU_2015:19900", 2439.4, 2440.53), // Mercury
    ("IAU_2015:29900", 6051.8, 6051.8),  // Venus
    ("IAU_2015:30100", 1737.4, 1737.4),  // the Moon
    ("IAU_2015:49900", 3389.5, 3396.19), // Mars
];

/// The IAU 2015 code of the geographic (ocentric) coordinate system of the body of
/// `radius_km` (its mean or equatorial radius, to 1%), where it is one PROJ knows.
pub fn iau_crs(radius_km: f64) -> Option<&'static str> {
    IAU_BODIES
        .iter()
        .find(|(_, mean, equator)| {
            [mean, equator]
                .iter()
                .any(|r| (radius_km - **r).abs() <= 0.01 * **r)
        })
        .map(|(code, _, _)| *code)
}

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

/// A crater's rim as a closed ring of `vertices` + 1 (longitude, latitude) points, each
/// `diameter_km / 2` from the centre along a great circle of the sphere of `radius_km`, in
/// GeoJSON's order (counterclockwise, the first point repeated last). Longitudes continue
/// from the centre's (a rim across 0/360 goes past 360 rather than jumping back), so the
/// ring is one simple polygon in the catalogue's own longitude convention. `None` where the
/// rim would reach a pole (no simple ring in longitude and latitude) or the size is unusable.
pub fn rim_ring(
    lat: f64,
    lon: f64,
    diameter_km: f64,
    radius_km: f64,
    vertices: usize,
) -> Option<Vec<[f64; 2]>> {
    let angular = diameter_km / 2.0 / radius_km;
    let usable = diameter_km.is_finite() && diameter_km > 0.0 && radius_km > 0.0 && vertices >= 3;
    if !usable || lat.abs() + angular.to_degrees() >= 90.0 {
        return None;
    }
    let (phi, (sin_d, cos_d)) = (lat.to_radians(), angular.sin_cos());
    let mut ring: Vec<[f64; 2]> = (0..vertices)
        .map(|i| {
            // bearings from north turning west: counterclockwise on the map
            let bearing = -(i as f64) * std::f64::consts::TAU / vertices as f64;
            let sin_p2 = phi.sin() * cos_d + phi.cos() * sin_d * bearing.cos();
            let p2 = sin_p2.clamp(-1.0, 1.0).asin();
            let dl = (bearing.sin() * sin_d * phi.cos()).atan2(cos_d - phi.sin() * sin_p2);
            [lon + dl.to_degrees(), p2.to_degrees()]
        })
        .collect();
    ring.push(ring[0]);
    Some(ring)
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

/// A longitude in [-180, 180): catalogues in 0-360 and in -180..180 compared alike.
pub fn wrapped_lon(lon: f64) -> f64 {
    (lon + 180.0).rem_euclid(360.0) - 180.0
}

/// A position as planar coordinates (km on the body, its longitude wrapped to [-180, 180);
/// pixels in a frame), its diameter in the same unit, and which kind of frame it is in.
fn planar(p: Position, body_radius_km: f64) -> (f64, f64, f64, bool) {
    match p {
        Position::Body {
            lat,
            lon,
            diameter_km,
        } => {
            let k = body_radius_km * std::f64::consts::PI / 180.0;
            let x = wrapped_lon(lon) * lat.to_radians().cos() * k;
            (x, lat * k, diameter_km, true)
        }
        Position::Frame { x, y, diameter_px } => (x, y, diameter_px, false),
    }
}

/// The planar width of a full turn of longitude at `p`'s latitude (km; none in a frame):
/// what a lookup near the antimeridian also looks across.
fn turn_width(p: Position, body_radius_km: f64) -> Option<f64> {
    match p {
        Position::Body { lat, .. } => {
            let k = body_radius_km * std::f64::consts::PI / 180.0;
            Some(360.0 * k * lat.to_radians().cos())
        }
        Position::Frame { .. } => None,
    }
}

/// The diameter (km on the body, pixels in a frame) of the largest of `positions`.
pub fn largest_diameter(positions: impl IntoIterator<Item = Position>) -> f64 {
    positions
        .into_iter()
        .map(|p| match p {
            Position::Body { diameter_km, .. } => diameter_km,
            Position::Frame { diameter_px, .. } => diameter_px,
        })
        .fold(0.0, f64::max)
}

/// Whether `p` is on the body, and the band of latitude (degrees; body) or frame y
/// (pixels) outside which no crater can be the one at `p`: a match lies within
/// `reach_radii` radii of the larger crater, which is at most `max_ratio` times `p`'s, and
/// a great-circle distance is at least the distance along a meridian (a frame distance at
/// least the y difference). What lets a catalogue be cut into bands with a halo.
pub fn reach_band(
    p: Position,
    reach_radii: f64,
    max_ratio: f64,
    body_radius_km: f64,
) -> (bool, f64, f64) {
    let (_, _, d, body) = planar(p, body_radius_km);
    let reach = reach_radii * max_ratio * d / 2.0;
    match p {
        Position::Body { lat, .. } => {
            let deg = reach / (body_radius_km * std::f64::consts::PI / 180.0);
            (body, lat - deg, lat + deg)
        }
        Position::Frame { y, .. } => (body, y - reach, y + reach),
    }
}

/// Whether `q` lies in a band of [`reach_band`].
pub fn in_band(q: Position, band: (bool, f64, f64)) -> bool {
    match q {
        Position::Body { lat, .. } => band.0 && lat >= band.1 && lat <= band.2,
        Position::Frame { y, .. } => !band.0 && y >= band.1 && y <= band.2,
    }
}

/// Items with positions on a uniform grid, to find the ones that can be the same crater
/// as a position without looking at all of them (a grid, since craters of one catalogue
/// are spread about evenly). Body positions are placed on a local equirectangular plane
/// for the lookup only; offsets are always measured exactly.
pub struct SpatialGrid {
    reach_radii: f64,
    max_ratio: f64,
    body_radius_km: f64,
    cell: f64,
    cells: std::collections::HashMap<(i64, i64, bool), Vec<(usize, Position)>>,
}

impl SpatialGrid {
    /// A grid for lookups within `reach_radii` radii of the larger crater and a diameter
    /// ratio of at most `max_ratio`, sized for craters up to `largest` across (units of
    /// the positions; larger ones are still found, the lookup just reads more cells).
    pub fn new(reach_radii: f64, max_ratio: f64, body_radius_km: f64, largest: f64) -> Self {
        SpatialGrid {
            reach_radii,
            max_ratio,
            body_radius_km,
            cell: (reach_radii * largest * max_ratio / 2.0).max(1e-9),
            cells: Default::default(),
        }
    }

    /// A grid of `items`, sized for craters up to `largest` across.
    pub fn of(
        items: impl IntoIterator<Item = (usize, Position)>,
        reach_radii: f64,
        max_ratio: f64,
        body_radius_km: f64,
        largest: f64,
    ) -> Self {
        let mut g = SpatialGrid::new(reach_radii, max_ratio, body_radius_km, largest);
        for (i, p) in items {
            g.insert(i, p);
        }
        g
    }

    fn key(&self, p: Position) -> (i64, i64, bool) {
        let (x, y, _, body) = planar(p, self.body_radius_km);
        (
            (x / self.cell).floor() as i64,
            (y / self.cell).floor() as i64,
            body,
        )
    }

    pub fn insert(&mut self, item: usize, p: Position) {
        let k = self.key(p);
        self.cells.entry(k).or_default().push((item, p));
    }

    /// `(item, offset in radii, diameter ratio)` of every item that can be the crater at
    /// `p`, nearest first. Near the antimeridian the lookup also looks a turn of longitude
    /// east and west, so that craters either side of the seam find each other.
    pub fn near(&self, p: Position) -> Vec<(usize, f64, f64)> {
        let (x, y, d, body) = planar(p, self.body_radius_km);
        // the farthest a match can lie: reach x half the larger diameter, which is at most
        // max_ratio x the query's
        let reach = self.reach_radii * d * self.max_ratio / 2.0;
        let span = (reach / self.cell).ceil().max(1.0);
        let mut shifts = vec![0.0];
        if let Some(turn) = turn_width(p, self.body_radius_km) {
            if x.abs() + reach + self.cell >= turn / 2.0 {
                shifts.extend([turn, -turn]);
            }
        }
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        let mut look = |items: &Vec<(usize, Position)>| {
            for &(i, q) in items {
                if let Some((offset, ratio)) = evidence(p, q, self.body_radius_km) {
                    if offset <= self.reach_radii && ratio <= self.max_ratio && seen.insert(i) {
                        out.push((i, offset, ratio));
                    }
                }
            }
        };
        for shift in shifts {
            let (cx, cy) = (((x + shift) / self.cell).floor(), (y / self.cell).floor());
            // A window wider than the grid has cells (a huge diameter, say, from an upload)
            // reads the cells there are instead, so a lookup never costs more than a scan.
            if (2.0 * span + 1.0).powi(2) > self.cells.len() as f64 {
                for (key, items) in &self.cells {
                    let (gx, gy) = (key.0 as f64, key.1 as f64);
                    if key.2 == body && (gx - cx).abs() <= span && (gy - cy).abs() <= span {
                        look(items);
                    }
                }
            } else {
                let (span, cx, cy) = (span as i64, cx as i64, cy as i64);
                for gx in cx.saturating_sub(span)..=cx.saturating_add(span) {
                    for gy in cy.saturating_sub(span)..=cy.saturating_add(span) {
                        if let Some(items) = self.cells.get(&(gx, gy, body)) {
                            look(items);
                        }
                    }
                }
            }
        }
        out.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        out
    }
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

    #[test]
    fn a_rim_ring_lies_on_the_rim_counterclockwise_and_closed() {
        // a 40 km crater at 60 N on the Moon, and one on the 0/360 seam
        for (lat, lon) in [(60.0, 120.0), (-5.0, 359.9), (0.0, 0.0)] {
            let ring = rim_ring(lat, lon, 40.0, 1737.4, 64).unwrap();
            assert_eq!(ring.len(), 65);
            assert_eq!(ring[0], ring[64]);
            for p in &ring {
                let d = distance_km((lat, lon), (p[1], p[0]), 1737.4);
                assert!((d - 20.0).abs() < 1e-6, "{d}");
                // continuous with the centre's longitude, not wrapped
                assert!((p[0] - lon).abs() < 5.0, "{p:?}");
            }
            // shoelace: positive area is counterclockwise (x east, y north)
            let twice_area: f64 = ring
                .windows(2)
                .map(|w| w[0][0] * w[1][1] - w[1][0] * w[0][1])
                .sum();
            assert!(twice_area > 0.0, "{twice_area}");
        }
        // a rim over the pole, and sizes that cannot be drawn
        assert!(rim_ring(89.9, 0.0, 40.0, 1737.4, 64).is_none());
        assert!(rim_ring(10.0, 0.0, 0.0, 1737.4, 64).is_none());
        assert!(rim_ring(10.0, 0.0, f64::NAN, 1737.4, 64).is_none());
    }

    #[test]
    fn bodies_are_known_by_their_mean_or_equatorial_radius() {
        assert_eq!(iau_crs(1737.4), Some("IAU_2015:30100"));
        assert_eq!(iau_crs(MARS_RADIUS_KM), Some("IAU_2015:49900"));
        assert_eq!(iau_crs(3396.19), Some("IAU_2015:49900"));
        assert_eq!(iau_crs(2439.4), Some("IAU_2015:19900"));
        assert_eq!(iau_crs(6371.0), None, "Earth is EPSG's, not IAU's");
        assert_eq!(iau_crs(500.0), None);
    }

    /// Craters either side of the 0/360 seam, and of the antimeridian, in either longitude
    /// convention, find each other; the grid finds what a full scan of the exact distances
    /// finds.
    #[test]
    fn the_grid_looks_across_the_seam_in_either_convention() {
        let body = |lat, lon| Position::Body {
            lat,
            lon,
            diameter_km: 2.0,
        };
        let items = [
            body(10.0, 359.99),
            body(10.0, -0.01),
            body(10.0, 180.01),
            body(10.0, -179.99),
            body(10.0, 90.0),
        ];
        let grid = SpatialGrid::of(
            items.iter().copied().enumerate(),
            3.0,
            1.5,
            MARS_RADIUS_KM,
            2.0,
        );
        let found = |q| {
            let mut ids: Vec<usize> = grid.near(q).into_iter().map(|h| h.0).collect();
            ids.sort_unstable();
            ids
        };
        // 0.02 degrees of longitude at 10 degrees latitude: 1.2 km, within 3 radii
        assert_eq!(found(body(10.0, 0.0)), vec![0, 1]);
        assert_eq!(found(body(10.0, 360.0)), vec![0, 1]);
        assert_eq!(found(body(10.0, 180.0)), vec![2, 3]);
        assert_eq!(found(body(10.0, -180.0)), vec![2, 3]);
        assert_eq!(found(body(10.0, 450.0)), vec![4]);
    }

    #[test]
    fn the_grid_finds_exactly_what_a_full_scan_finds() {
        let frame = |x: f64, y: f64, d: f64| Position::Frame {
            x,
            y,
            diameter_px: d,
        };
        let items: Vec<Position> = (0..400)
            .map(|i| {
                let f = i as f64;
                frame(
                    (f * 37.0) % 500.0,
                    (f * 53.0) % 500.0,
                    4.0 + (f * 7.0) % 30.0,
                )
            })
            .collect();
        let largest = largest_diameter(items.iter().copied());
        let grid = SpatialGrid::of(items.iter().copied().enumerate(), 3.0, 1.5, 1.0, largest);
        for q in [
            frame(250.0, 250.0, 10.0),
            frame(3.0, 490.0, 30.0),
            frame(100.0, 7.0, 5.0),
            // wider than the grid: the lookup scans the cells there are
            frame(250.0, 250.0, 45.0),
            frame(250.0, 250.0, 1e12),
            frame(1e300, -1e300, 20.0),
            Position::Body {
                lat: 10.0,
                lon: 20.0,
                diameter_km: 1e15,
            },
        ] {
            let mut want: Vec<(usize, f64, f64)> = items
                .iter()
                .enumerate()
                .filter_map(|(i, &p)| {
                    let (o, r) = evidence(q, p, 1.0)?;
                    (o <= 3.0 && r <= 1.5).then_some((i, o, r))
                })
                .collect();
            want.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
            assert_eq!(grid.near(q), want);
        }
        // an index without positions sizes its grid for craters of no size at all: a
        // positioned query once looped over (10^10)^2 cells there (POST /v1/link hung;
        // found by schemathesis)
        let empty = SpatialGrid::of(std::iter::empty(), 3.0, 1.5, 1.0, 0.0);
        let q = Position::Body {
            lat: 10.0,
            lon: 20.0,
            diameter_km: 3.0,
        };
        assert!(empty.near(q).is_empty());
    }
}
