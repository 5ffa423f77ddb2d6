//! Registration of a new observation to the catalogue by crater pattern matching.
//!
//! A georeferencing error is not independent per crater: a whole image is shifted, turned
//! and scaled against the catalogue. The arrangement of craters (centres and diameters) is
//! distinctive and does not change when the image is turned or scaled, so a handful of
//! correct correspondences fixes the transform for every crater of the image.
//!
//! The method, in the order it runs:
//!
//! 1. Pattern keys. Every crater and each of its `neighbours` nearest craters form a pair;
//!    the pair's key is `(ln(distance / d_i), ln(d_j / d_i))`, unchanged by rotation, scale
//!    and shift. The catalogue's pairs are hashed by key.
//! 2. Hypotheses. Every source pair whose key lies within `key_tolerance` of a catalogue
//!    pair proposes the similarity transform that maps one onto the other, kept when its
//!    scale lies in `scale_range` and at least two of the pair's other neighbours land on
//!    catalogue craters under it (a chance key match rarely brings its neighbours along).
//!    Source craters are taken largest first and gathering stops at `max_hypotheses`
//!    confirmed ones: a right transform is confirmed by most true pairs, so it is among
//!    them many times over (`craterdex bench register` compares with every pair).
//! 3. Scoring (preemptive RANSAC). Each hypothesis is scored on a fixed sample of
//!    `probe` source craters: an inlier is a source crater whose mapped centre lies within
//!    `tolerance_radii` radii of a catalogue crater whose diameter agrees within
//!    `max_diameter_ratio`. The `refine` best are scored on every crater and refined by
//!    least squares on their inliers (one catalogue crater per source crater), three
//!    rounds (hypotheses that map the source's centre within a radius of one already
//!    refined are skipped, so the `refine` are distinct); an affine refinement replaces the similarity when there are at least
//!    `affine_min_inliers` inliers and it lowers the median residual by a fifth.
//! 4. Significance. A transform is accepted only when its inlier count could not have
//!    arisen by chance: with `λ` the expected number of chance inliers of one random
//!    transform (the sum over source craters of the catalogue's density of compatible
//!    craters times the inlier disc's area), the probability that any of the `H`
//!    hypotheses scored reaches `k` inliers is at most `H · P(Poisson(λ) >= k)`; it must be
//!    below `false_alarm`, with at least `min_inliers` inliers; and it must be unambiguous:
//!    no refined transform pairing mostly other craters may fit 80% as many (a periodic
//!    pattern fits many shifts equally). Otherwise the source is reported as not
//!    registered and linking falls back to the positions as given.
//!
//! Positions are planar: pixels of one frame, or km in the tangent plane of the source's
//!
//! [`matching`] holds the algorithm (steps 1-4); [`frames`] the bookkeeping of which frame
//! each source was registered in and how its craters are placed in the catalogue's.

mod frames;
mod matching;

pub use frames::{FrameKind, Frames, Placed, SourceRegistration};
use matching::bounds;
pub(crate) use matching::ln_poisson_tail;
pub use matching::{refine_similarity, register, register_seeded};

use serde::{Deserialize, Serialize};

/// A crater's centre and diameter in one planar frame.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Crater {
    pub x: f64,
    pub y: f64,
    pub d: f64,
}

impl Crater {
    /// Finite centre and a finite, positive diameter: what registration can use.
    pub fn is_usable(&self) -> bool {
        self.x.is_finite() && self.y.is_finite() && self.d.is_finite() && self.d > 0.0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum TransformKind {
    Similarity,
    Affine,
}

/// `x' = m[0] x + m[1] y + m[2]`, `y' = m[3] x + m[4] y + m[5]`: from the source's frame
/// to the catalogue's.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Transform {
    pub kind: TransformKind,
    pub matrix: [f64; 6],
}

impl Transform {
    pub const IDENTITY: Transform = Transform {
        kind: TransformKind::Similarity,
        matrix: [1.0, 0.0, 0.0, 0.0, 1.0, 0.0],
    };

    /// Scale `s`, counter-clockwise rotation `theta` (radians), then shift.
    pub fn similarity(s: f64, theta: f64, tx: f64, ty: f64) -> Transform {
        let (c, n) = (s * theta.cos(), s * theta.sin());
        Transform {
            kind: TransformKind::Similarity,
            matrix: [c, -n, tx, n, c, ty],
        }
    }

    pub fn apply(&self, x: f64, y: f64) -> (f64, f64) {
        let m = &self.matrix;
        (m[0] * x + m[1] * y + m[2], m[3] * x + m[4] * y + m[5])
    }

    /// Linear scale (square root of the area ratio).
    pub fn scale(&self) -> f64 {
        let m = &self.matrix;
        (m[0] * m[4] - m[1] * m[3]).abs().sqrt()
    }

    /// Rotation in degrees, counter-clockwise in the frame's axes: the angle by which the
    /// source must be turned to lie as the catalogue does.
    pub fn rotation_deg(&self) -> f64 {
        let m = &self.matrix;
        (m[3] - m[1]).atan2(m[0] + m[4]).to_degrees()
    }

    /// The transform from the catalogue's frame back to the source's.
    pub fn inverse(&self) -> Transform {
        let m = &self.matrix;
        let det = m[0] * m[4] - m[1] * m[3];
        let (a, b, d, e) = (m[4] / det, -m[1] / det, -m[3] / det, m[0] / det);
        Transform {
            kind: self.kind,
            matrix: [a, b, -(a * m[2] + b * m[5]), d, e, -(d * m[2] + e * m[5])],
        }
    }

    pub fn map(&self, c: Crater) -> Crater {
        let (x, y) = self.apply(c.x, c.y);
        Crater {
            x,
            y,
            d: c.d * self.scale(),
        }
    }
}

/// How [`register`] searches and what it accepts; `Default` is what linking uses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default, deny_unknown_fields)]
pub struct RegisterOptions {
    /// Nearest craters paired with each crater for the pattern keys.
    pub neighbours: usize,
    /// Largest difference of a pattern key's two logarithms for a correspondence.
    pub key_tolerance: f64,
    /// Smallest and largest scale from the source's frame to the catalogue's.
    pub scale_range: (f64, f64),
    /// An inlier's mapped centre lies within this many radii of its catalogue crater.
    pub tolerance_radii: f64,
    /// An inlier's mapped diameter agrees with its catalogue crater's within this ratio.
    pub max_diameter_ratio: f64,
    /// Source craters every hypothesis is first scored on.
    pub probe: usize,
    /// Hypotheses scored on every crater and refined.
    pub refine: usize,
    /// Confirmed hypotheses gathered before scoring, source craters taken largest first (a
    /// right transform is confirmed by most true pairs, so a few hundred hold it many times
    /// over; 0: every pair, the exhaustive reference of `bench register`).
    pub max_hypotheses: usize,
    pub min_inliers: usize,
    /// Largest probability that the accepted transform's inliers arose by chance.
    pub false_alarm: f64,
    /// Inliers needed before an affine transform is tried.
    pub affine_min_inliers: usize,
    /// Catalogue craters considered lie within the source's bounding box grown by this
    /// fraction of its size on every side (pixel positions, which may be in the source
    /// image's own frame, are tried against the whole catalogue when that fails).
    pub margin: f64,
}

impl Default for RegisterOptions {
    fn default() -> Self {
        RegisterOptions {
            neighbours: 6,
            key_tolerance: 0.2,
            scale_range: (0.5, 2.0),
            tolerance_radii: 1.0,
            max_diameter_ratio: 1.35,
            probe: 48,
            refine: 16,
            max_hypotheses: 512,
            min_inliers: 6,
            false_alarm: 1e-6,
            affine_min_inliers: 40,
            margin: 0.5,
        }
    }
}

/// A transform accepted by [`register`] and its evidence.
#[derive(Clone, Debug, PartialEq)]
pub struct Fit {
    pub transform: Transform,
    /// (source index, catalogue index) of every inlier.
    pub inliers: Vec<(usize, usize)>,
    /// Median offset of the inliers after the transform, in radii of the catalogue crater.
    pub residual_radii: f64,
    /// Expected inliers of one random transform.
    pub chance_inliers: f64,
    /// Bound on the probability that a transform this good arose by chance.
    pub false_alarm: f64,
    pub hypotheses: usize,
}

/// Why a source was not registered.
#[derive(Clone, Debug, PartialEq)]
pub struct NotRegistered {
    pub reason: String,
    /// The best transform found, rejected (for the report).
    pub best: Option<Box<Fit>>,
}

/// A second observation of `catalogue` simulated for tests and `bench register`: each
/// crater seen through the inverse of `to_catalogue` with 5% jitter of centre and diameter,
/// a share `missed` not seen, and `false_share` (of the catalogue's count) false detections
/// near real ones. Returns the detections and, for each, its catalogue crater (None: false).
pub fn observe(
    catalogue: &[Crater],
    to_catalogue: &Transform,
    missed: f64,
    false_share: f64,
    seed: u64,
) -> (Vec<Crater>, Vec<Option<usize>>) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let inv = to_catalogue.inverse();
    let (mut out, mut truth) = (Vec::new(), Vec::new());
    for (j, c) in catalogue.iter().enumerate() {
        if rng.gen_bool(missed.clamp(0.0, 1.0)) {
            continue;
        }
        let m = inv.map(*c);
        let jitter = 0.05 * m.d;
        out.push(Crater {
            x: m.x + jitter * rng.gen_range(-1.0..1.0),
            y: m.y + jitter * rng.gen_range(-1.0..1.0),
            d: m.d * (1.0 + 0.05 * rng.gen_range(-1.0..1.0)),
        });
        truth.push(Some(j));
    }
    if out.is_empty() {
        return (out, truth);
    }
    let (x0, y0, x1, y1) = bounds(&out);
    let reach = 0.15 * (x1 - x0).max(y1 - y0).max(1e-9);
    let seen = out.clone();
    for _ in 0..(false_share * catalogue.len() as f64) as usize {
        let a = seen[rng.gen_range(0..seen.len())];
        out.push(Crater {
            x: a.x + rng.gen_range(-reach..reach),
            y: a.y + rng.gen_range(-reach..reach),
            d: seen[rng.gen_range(0..seen.len())].d,
        });
        truth.push(None);
    }
    (out, truth)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// A crater field: diameters from a power law, as real size-frequency distributions.
    fn field(n: usize, side: f64, rng: &mut ChaCha8Rng) -> Vec<Crater> {
        (0..n)
            .map(|_| Crater {
                x: rng.gen_range(0.0..side),
                y: rng.gen_range(0.0..side),
                d: 10.0 * (1.0 - rng.gen_range(0.0..0.97f64)).powf(-0.6),
            })
            .collect()
    }

    #[test]
    fn recovers_a_turned_scaled_shifted_observation() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let cat = field(600, 2000.0, &mut rng);
        for (deg, s) in [(0.0, 1.0), (37.0, 0.8), (-150.0, 1.3), (179.0, 0.7)] {
            let truth_t = Transform::similarity(s, f64::to_radians(deg), 140.0, -60.0);
            let (src, truth) = observe(&cat, &truth_t, 0.1, 0.1, rng.gen());
            let f = register(&src, &cat, &RegisterOptions::default()).unwrap();
            assert!(
                (f.transform.rotation_deg() - deg).abs() < 0.5,
                "{deg}: {f:?}"
            );
            assert!((f.transform.scale() - s).abs() < 0.01 * s, "{s}: {f:?}");
            let right = f
                .inliers
                .iter()
                .filter(|(i, j)| truth[*i] == Some(*j))
                .count();
            assert!(right as f64 >= 0.97 * f.inliers.len() as f64);
            assert!(f.inliers.len() as f64 >= 0.8 * src.len() as f64 * 0.9);
            assert!(f.residual_radii < 0.2, "{f:?}");
            assert!(f.false_alarm < 1e-6);
        }
    }

    #[test]
    fn refuses_an_unrelated_field() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let cat = field(400, 2000.0, &mut rng);
        let other = field(300, 2000.0, &mut rng);
        let e = register(&other, &cat, &RegisterOptions::default()).unwrap_err();
        assert!(
            ["chance", "inliers", "ambiguous"]
                .iter()
                .any(|w| e.reason.contains(w)),
            "{e:?}"
        );
        let few = &cat[..4];
        assert!(register(few, &cat, &RegisterOptions::default())
            .unwrap_err()
            .reason
            .contains("needed"));
    }

    #[test]
    fn a_periodic_pattern_is_ambiguous_and_not_registered() {
        let lattice: Vec<Crater> = (0..200)
            .map(|i| Crater {
                x: (i % 20) as f64 * 50.0,
                y: (i / 20) as f64 * 50.0,
                d: 10.0,
            })
            .collect();
        let part: Vec<Crater> = lattice[40..120]
            .iter()
            .map(|c| Crater { x: c.x + 3.0, ..*c })
            .collect();
        let e = register(&part, &lattice, &RegisterOptions::default()).unwrap_err();
        assert!(e.reason.contains("ambiguous"), "{e:?}");
    }

    #[test]
    fn an_affine_warp_is_fitted_when_the_data_support_it() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let cat = field(800, 3000.0, &mut rng);
        let warp = Transform {
            kind: TransformKind::Affine,
            matrix: [1.03, 0.02, 30.0, -0.01, 0.97, 10.0],
        };
        let (src, _) = observe(&cat, &warp, 0.05, 0.0, rng.gen());
        let f = register(&src, &cat, &RegisterOptions::default()).unwrap();
        assert_eq!(f.transform.kind, TransformKind::Affine, "{f:?}");
        for (k, v) in f.transform.matrix.iter().enumerate() {
            let tol = if k % 3 == 2 { 3.0 } else { 0.01 };
            assert!((v - warp.matrix[k]).abs() < tol, "{f:?}");
        }
    }

    #[test]
    fn absurd_craters_are_refused_or_registered_without_hanging() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let cat = field(200, 2000.0, &mut rng);
        let mut src = cat.clone();
        src[3].d = f64::NAN;
        let e = register(&src, &cat, &RegisterOptions::default()).unwrap_err();
        assert!(e.reason.contains("source crater 3"), "{e:?}");
        // finite but absurd: a disc wider than any grid, a crater a world away
        let mut src = cat.clone();
        (src[5].d, src[6].x, src[7].y) = (1e300, 1e15, -1e300);
        let f = register(&src, &cat, &RegisterOptions::default()).unwrap();
        assert!(f.inliers.len() >= 190, "{f:?}");
    }
}
