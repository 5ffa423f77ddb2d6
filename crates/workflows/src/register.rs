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
//! centroid (the caller projects).

use crate::geometry::Position;
use craterdex_index::{ImageMeta, Index};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

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

/// Points on a uniform grid for radius and nearest-neighbour queries.
struct Grid {
    cell: f64,
    cells: HashMap<(i64, i64), Vec<u32>>,
}

impl Grid {
    fn of(points: &[Crater], cell: f64) -> Grid {
        let mut cells: HashMap<(i64, i64), Vec<u32>> = HashMap::new();
        for (i, p) in points.iter().enumerate() {
            cells
                .entry(Self::key(cell, p.x, p.y))
                .or_default()
                .push(i as u32);
        }
        Grid { cell, cells }
    }

    fn key(cell: f64, x: f64, y: f64) -> (i64, i64) {
        ((x / cell).floor() as i64, (y / cell).floor() as i64)
    }

    /// Every point within `r` of (x, y) (and a few beyond: the caller checks distances).
    fn around(&self, x: f64, y: f64, r: f64, mut f: impl FnMut(usize)) {
        let (x0, y0) = Self::key(self.cell, x - r, y - r);
        let (x1, y1) = Self::key(self.cell, x + r, y + r);
        let span = (x1 as f64 - x0 as f64 + 1.0) * (y1 as f64 - y0 as f64 + 1.0);
        if span > 4.0 * self.cells.len() as f64 {
            // a disc wider than the field: visiting the occupied cells is cheaper
            for (&(cx, cy), v) in &self.cells {
                if (x0..=x1).contains(&cx) && (y0..=y1).contains(&cy) {
                    v.iter().for_each(|&i| f(i as usize));
                }
            }
            return;
        }
        for cx in x0..=x1 {
            for cy in y0..=y1 {
                if let Some(v) = self.cells.get(&(cx, cy)) {
                    v.iter().for_each(|&i| f(i as usize));
                }
            }
        }
    }

    /// The `k` nearest points to `points[i]`, itself excluded, nearest first.
    fn nearest(&self, points: &[Crater], i: usize, k: usize) -> Vec<usize> {
        let p = points[i];
        let mut ring = 1.0;
        loop {
            let r = ring * self.cell;
            let mut found: Vec<(f64, usize)> = Vec::new();
            self.around(p.x, p.y, r, |j| {
                if j != i {
                    let d = (points[j].x - p.x).hypot(points[j].y - p.y);
                    if d <= r {
                        found.push((d, j));
                    }
                }
            });
            if found.len() >= k || found.len() + 1 >= points.len() || !r.is_finite() {
                found.sort_by(|a, b| a.0.total_cmp(&b.0));
                return found.into_iter().take(k).map(|(_, j)| j).collect();
            }
            ring *= 2.0;
        }
    }
}

/// (min x, min y, max x, max y) of the centres.
fn bounds(points: &[Crater]) -> (f64, f64, f64, f64) {
    points.iter().fold(
        (f64::MAX, f64::MAX, f64::MIN, f64::MIN),
        |(x0, y0, x1, y1), p| (x0.min(p.x), y0.min(p.y), x1.max(p.x), y1.max(p.y)),
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Grid cell for a point set: about one point per cell on average, never below the
/// median diameter.
fn cell_size(points: &[Crater]) -> f64 {
    let (x0, y0, x1, y1) = bounds(points);
    let area = ((x1 - x0) * (y1 - y0)).max(1e-12);
    let md = median(points.iter().map(|p| p.d).collect());
    (area / points.len().max(1) as f64).sqrt().max(md).max(1e-9)
}

/// Pattern key of crater `i` paired with crater `j`.
fn key(a: Crater, b: Crater) -> (f64, f64) {
    let dist = (b.x - a.x).hypot(b.y - a.y).max(1e-12);
    ((dist / a.d).ln(), (b.d / a.d).ln())
}

/// The pairs (i, j) of every crater with its nearest neighbours.
fn pairs(points: &[Crater], grid: &Grid, k: usize) -> Vec<(usize, usize)> {
    (0..points.len())
        .flat_map(|i| grid.nearest(points, i, k).into_iter().map(move |j| (i, j)))
        .collect()
}

/// The similarity mapping the source pair onto the catalogue pair.
fn pair_transform(s: (Crater, Crater), c: (Crater, Crater)) -> Option<Transform> {
    let (vx, vy) = (s.1.x - s.0.x, s.1.y - s.0.y);
    let (wx, wy) = (c.1.x - c.0.x, c.1.y - c.0.y);
    let n = vx * vx + vy * vy;
    if n <= 0.0 {
        return None;
    }
    // w = (a + ib) v as complex numbers
    let a = (wx * vx + wy * vy) / n;
    let b = (wy * vx - wx * vy) / n;
    let tx = c.0.x - (a * s.0.x - b * s.0.y);
    let ty = c.0.y - (b * s.0.x + a * s.0.y);
    Some(Transform {
        kind: TransformKind::Similarity,
        matrix: [a, -b, tx, b, a, ty],
    })
}

/// The catalogue crater a mapped source crater lands on, if any: the nearest in radii
/// among those of compatible diameter.
fn landing(cat: &[Crater], grid: &Grid, m: Crater, o: &RegisterOptions) -> Option<(usize, f64)> {
    let reach = o.tolerance_radii * m.d * o.max_diameter_ratio / 2.0;
    let mut best: Option<(usize, f64)> = None;
    grid.around(m.x, m.y, reach, |j| {
        let c = cat[j];
        let ratio = c.d.max(m.d) / c.d.min(m.d).max(1e-12);
        if ratio > o.max_diameter_ratio {
            return;
        }
        let off = (c.x - m.x).hypot(c.y - m.y) / (c.d / 2.0);
        if off <= o.tolerance_radii && best.is_none_or(|b| off < b.1) {
            best = Some((j, off));
        }
    });
    best
}

/// The inliers of `t`, one catalogue crater per source crater and the other way round
/// (the closer claim wins).
fn inliers_of(
    src: &[Crater],
    cat: &[Crater],
    grid: &Grid,
    t: &Transform,
    o: &RegisterOptions,
) -> Vec<(usize, usize, f64)> {
    let mut by_cat: HashMap<usize, (usize, f64)> = HashMap::new();
    for (i, s) in src.iter().enumerate() {
        if let Some((j, off)) = landing(cat, grid, t.map(*s), o) {
            let e = by_cat.entry(j).or_insert((i, off));
            if off < e.1 {
                *e = (i, off);
            }
        }
    }
    let mut v: Vec<(usize, usize, f64)> = by_cat
        .into_iter()
        .map(|(j, (i, off))| (i, j, off))
        .collect();
    v.sort_unstable_by_key(|p| p.0);
    v
}

/// (source index, catalogue index, offset in radii).
type Inlier = (usize, usize, f64);

/// Pair correspondences whose other neighbours land fewer times than this are dropped
/// before scoring.
const LOCAL_CONFIRMATIONS: usize = 2;

/// A source is ambiguous, and not registered, when a transform pairing mostly other craters
/// fits at least this share of the best one's inliers.
const AMBIGUITY: f64 = 0.8;

/// Rounds of [`refine`]: a warp is followed outwards from where the first fit holds.
const REFINE_ROUNDS: usize = 12;

/// Alternates fitting on the inliers and finding them again while the inliers do not
/// shrink.
fn refine(
    src: &[Crater],
    cat: &[Crater],
    grid: &Grid,
    start: Transform,
    kind: TransformKind,
    o: &RegisterOptions,
) -> (Transform, Vec<(usize, usize, f64)>) {
    let mut t = start;
    let mut inl = inliers_of(src, cat, grid, &t, o);
    for _ in 0..REFINE_ROUNDS {
        let Some(next) = fit(src, cat, &inl, kind) else {
            break;
        };
        let next_inl = inliers_of(src, cat, grid, &next, o);
        if next_inl.len() < inl.len() || next == t {
            break;
        }
        (t, inl) = (next, next_inl);
    }
    (t, inl)
}

/// Least-squares similarity (Umeyama, in 2-D closed form) or affine transform of the
/// matched pairs.
fn fit(
    src: &[Crater],
    cat: &[Crater],
    pairs: &[(usize, usize, f64)],
    kind: TransformKind,
) -> Option<Transform> {
    let n = pairs.len() as f64;
    if pairs.len() < 3 {
        return None;
    }
    let (mut sx, mut sy, mut cx, mut cy) = (0.0, 0.0, 0.0, 0.0);
    for &(i, j, _) in pairs {
        (sx, sy, cx, cy) = (sx + src[i].x, sy + src[i].y, cx + cat[j].x, cy + cat[j].y);
    }
    (sx, sy, cx, cy) = (sx / n, sy / n, cx / n, cy / n);
    match kind {
        TransformKind::Similarity => {
            let (mut a, mut b, mut nn) = (0.0, 0.0, 0.0);
            for &(i, j, _) in pairs {
                let (vx, vy) = (src[i].x - sx, src[i].y - sy);
                let (wx, wy) = (cat[j].x - cx, cat[j].y - cy);
                a += wx * vx + wy * vy;
                b += wy * vx - wx * vy;
                nn += vx * vx + vy * vy;
            }
            if nn <= 0.0 {
                return None;
            }
            let (a, b) = (a / nn, b / nn);
            Some(Transform {
                kind,
                matrix: [a, -b, cx - (a * sx - b * sy), b, a, cy - (b * sx + a * sy)],
            })
        }
        TransformKind::Affine => {
            // normal equations of [x y] -> x' and [x y] -> y' on centred coordinates
            let (mut sxx, mut sxy, mut syy) = (0.0, 0.0, 0.0);
            let (mut ux, mut uy, mut vx, mut vy) = (0.0, 0.0, 0.0, 0.0);
            for &(i, j, _) in pairs {
                let (x, y) = (src[i].x - sx, src[i].y - sy);
                let (u, v) = (cat[j].x - cx, cat[j].y - cy);
                (sxx, sxy, syy) = (sxx + x * x, sxy + x * y, syy + y * y);
                (ux, uy, vx, vy) = (ux + u * x, uy + u * y, vx + v * x, vy + v * y);
            }
            let det = sxx * syy - sxy * sxy;
            if det.abs() < 1e-12 * (sxx * syy).max(1e-300) {
                return None;
            }
            let solve =
                |px: f64, py: f64| ((px * syy - py * sxy) / det, (py * sxx - px * sxy) / det);
            let (a, b) = solve(ux, uy);
            let (d, e) = solve(vx, vy);
            Some(Transform {
                kind,
                matrix: [a, b, cx - a * sx - b * sy, d, e, cy - d * sx - e * sy],
            })
        }
    }
}

/// `ln P(X >= k)` for `X ~ Poisson(lambda)`.
fn ln_poisson_tail(lambda: f64, k: usize) -> f64 {
    if k == 0 {
        return 0.0;
    }
    if lambda <= 0.0 {
        return f64::NEG_INFINITY;
    }
    // sum from k upward of exp(-l) l^i / i!, in log space, until the terms vanish
    let mut ln_term = -lambda + k as f64 * lambda.ln() - ln_factorial(k);
    let mut total = ln_term;
    let mut i = k;
    loop {
        i += 1;
        ln_term += lambda.ln() - (i as f64).ln();
        let next = total.max(ln_term) + (-(total - ln_term).abs()).exp().ln_1p();
        if (next - total).abs() < 1e-12 || i > k + 10_000 {
            return next.min(0.0);
        }
        total = next;
    }
}

fn ln_factorial(k: usize) -> f64 {
    (2..=k).map(|i| (i as f64).ln()).sum()
}

/// Expected inliers of a random transform: for each mapped source crater, the number of
/// catalogue craters of compatible diameter per unit area times the inlier disc's area.
fn chance_inliers(src: &[Crater], cat: &[Crater], t: &Transform, o: &RegisterOptions) -> f64 {
    let (x0, y0, x1, y1) = bounds(cat);
    let md = median(cat.iter().map(|p| p.d).collect());
    let area = ((x1 - x0 + md) * (y1 - y0 + md)).max(1e-12);
    let mut diameters: Vec<f64> = cat.iter().map(|c| c.d).collect();
    diameters.sort_by(f64::total_cmp);
    let count_between = |lo: f64, hi: f64| {
        diameters.partition_point(|&d| d <= hi) - diameters.partition_point(|&d| d < lo)
    };
    src.iter()
        .map(|s| {
            let d = s.d * t.scale();
            let (lo, hi) = (d / o.max_diameter_ratio, d * o.max_diameter_ratio);
            // the disc is tolerance radii of the catalogue crater; its largest is at `hi`
            let r = o.tolerance_radii * hi / 2.0;
            (count_between(lo, hi) as f64 * std::f64::consts::PI * r * r / area).min(1.0)
        })
        .sum()
}

/// Registers `source` (one image's craters) to `catalogue` (the catalogue's craters around
/// it, in the same planar unit). Deterministic.
pub fn register(
    source: &[Crater],
    catalogue: &[Crater],
    o: &RegisterOptions,
) -> Result<Fit, NotRegistered> {
    register_seeded(source, catalogue, &[], o)
}

/// The median scale the seeds' pairs suggest (the reach of the catalogue they need).
fn seed_scale(src: &[Crater], cat: &[Crater], seeds: &[(usize, usize)]) -> f64 {
    let scales: Vec<f64> = seeds
        .windows(2)
        .filter_map(|w| pair_transform((src[w[0].0], src[w[1].0]), (cat[w[0].1], cat[w[1].1])))
        .map(|t| t.scale())
        .filter(|s| s.is_finite() && *s > 0.0)
        .collect();
    if scales.is_empty() {
        1.0
    } else {
        median(scales).clamp(1e-3, 1e3)
    }
}

/// Seeds of [`register_seeded`] whose pairs propose transforms (the first this many).
const MAX_SEEDS: usize = 64;

/// [`register`] with `seeds`, (source index, catalogue index) correspondences known by other
/// evidence (confident appearance matches): every two of them propose the similarity that
/// maps one onto the other, tried first, at any scale and without the neighbours'
/// confirmation (a source
/// whose craters' neighbourhoods differ from the catalogue's, e.g. seen at a coarser
/// resolution, has no pattern key in common with it). Wrong seeds are outvoted as any
/// hypothesis is, and count in the false-alarm bound.
pub fn register_seeded(
    source: &[Crater],
    catalogue: &[Crater],
    seeds: &[(usize, usize)],
    o: &RegisterOptions,
) -> Result<Fit, NotRegistered> {
    let refuse = |reason: String| NotRegistered { reason, best: None };
    for (name, craters) in [("source", source), ("catalogue", catalogue)] {
        if let Some(i) = craters.iter().position(|c| !c.is_usable()) {
            return Err(refuse(format!(
                "{name} crater {i}: centre and diameter must be finite, the diameter positive"
            )));
        }
    }
    if source.len() < o.min_inliers.max(3) {
        return Err(refuse(format!(
            "{} craters with positions, {} needed",
            source.len(),
            o.min_inliers.max(3)
        )));
    }
    if catalogue.len() < o.min_inliers.max(3) {
        return Err(refuse(format!(
            "{} catalogue craters around it, {} needed",
            catalogue.len(),
            o.min_inliers.max(3)
        )));
    }
    let src_grid = Grid::of(source, cell_size(source));
    let cat_grid = Grid::of(catalogue, cell_size(catalogue));
    let k = o.neighbours.max(1);
    let bin = o.key_tolerance.max(1e-3);
    let bin_of = |v: f64| (v / bin).floor() as i64;
    let mut table: HashMap<(i64, i64), Vec<(u32, u32)>> = HashMap::new();
    for (i, j) in pairs(catalogue, &cat_grid, k) {
        let (a, b) = key(catalogue[i], catalogue[j]);
        table
            .entry((bin_of(a), bin_of(b)))
            .or_default()
            .push((i as u32, j as u32));
    }
    let src_neighbours: Vec<Vec<usize>> = (0..source.len())
        .map(|i| src_grid.nearest(source, i, k))
        .collect();
    let mut hypotheses: Vec<Transform> = Vec::new();
    let mut generated = 0usize;
    let seeds: Vec<(usize, usize)> = seeds
        .iter()
        .copied()
        .filter(|&(i, j)| i < source.len() && j < catalogue.len())
        .take(MAX_SEEDS)
        .collect();
    for (a, &(i1, j1)) in seeds.iter().enumerate() {
        for &(i2, j2) in &seeds[a + 1..] {
            if i1 == i2 || j1 == j2 {
                continue;
            }
            let Some(t) = pair_transform((source[i1], source[i2]), (catalogue[j1], catalogue[j2]))
            else {
                continue;
            };
            // appearance is evidence enough for any scale (another instrument's resolution)
            if t.scale().is_finite() && t.scale() > 0.0 {
                generated += 1;
                hypotheses.push(t);
            }
        }
    }
    let cap = if o.max_hypotheses == 0 {
        usize::MAX
    } else {
        o.max_hypotheses
    };
    // largest first: their centres and diameters are the most reliable detections
    let mut order: Vec<usize> = (0..source.len()).collect();
    order.sort_by(|&a, &b| source[b].d.total_cmp(&source[a].d).then(a.cmp(&b)));
    for &i in &order {
        if hypotheses.len() >= cap {
            break;
        }
        let near = &src_neighbours[i];
        for &j in near {
            let (a, b) = key(source[i], source[j]);
            for ba in bin_of(a - bin)..=bin_of(a + bin) {
                for bb in bin_of(b - bin)..=bin_of(b + bin) {
                    let Some(cands) = table.get(&(ba, bb)) else {
                        continue;
                    };
                    for &(ci, cj) in cands {
                        let (ci, cj) = (ci as usize, cj as usize);
                        let (ca, cb) = key(catalogue[ci], catalogue[cj]);
                        if (ca - a).abs() > bin || (cb - b).abs() > bin {
                            continue;
                        }
                        let Some(t) =
                            pair_transform((source[i], source[j]), (catalogue[ci], catalogue[cj]))
                        else {
                            continue;
                        };
                        let s = t.scale();
                        if s < o.scale_range.0 || s > o.scale_range.1 {
                            continue;
                        }
                        generated += 1;
                        // local verification: the pair's other neighbours must land too,
                        // which a chance pair match rarely does
                        let confirmed = near
                            .iter()
                            .filter(|&&n| n != j)
                            .filter(|&&n| {
                                landing(catalogue, &cat_grid, t.map(source[n]), o).is_some()
                            })
                            .count();
                        if confirmed >= LOCAL_CONFIRMATIONS {
                            hypotheses.push(t);
                        }
                    }
                }
            }
        }
    }
    if hypotheses.is_empty() {
        return Err(refuse(format!(
            "no crater pattern in common with the catalogue ({generated} pair correspondences, none confirmed by their neighbours)"
        )));
    }
    // preemptive scoring on a fixed, spread sample of source craters
    let step = (source.len() as f64 / o.probe.max(1) as f64).max(1.0);
    let probe: Vec<Crater> = (0..o.probe.min(source.len()))
        .map(|i| source[((i as f64 * step) as usize).min(source.len() - 1)])
        .collect();
    let mut scored: Vec<(usize, usize)> = hypotheses
        .iter()
        .enumerate()
        .map(|(h, t)| {
            let hits = probe
                .iter()
                .filter(|s| landing(catalogue, &cat_grid, t.map(**s), o).is_some())
                .count();
            (hits, h)
        })
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let res = |v: &[(usize, usize, f64)]| median(v.iter().map(|p| p.2).collect());
    // refine the best-scored hypotheses that differ from each other (a periodic pattern
    // gives many good ones, which the ambiguity test below must see)
    let (cx, cy) = source
        .iter()
        .fold((0.0, 0.0), |a, c| (a.0 + c.x, a.1 + c.y));
    let centre = Crater {
        x: cx / source.len() as f64,
        y: cy / source.len() as f64,
        d: median(source.iter().map(|c| c.d).collect()),
    };
    let mut chosen: Vec<Crater> = Vec::new();
    let mut refined: Vec<(Transform, Vec<Inlier>)> = Vec::new();
    for &(_, h) in scored.iter() {
        if chosen.len() >= o.refine.max(1) {
            break;
        }
        let c = hypotheses[h].map(centre);
        if chosen
            .iter()
            .any(|p| (p.x - c.x).hypot(p.y - c.y) < c.d / 2.0)
        {
            continue;
        }
        chosen.push(c);
        refined.push(refine(
            source,
            catalogue,
            &cat_grid,
            hypotheses[h],
            TransformKind::Similarity,
            o,
        ));
    }
    let best_at = (0..refined.len())
        .max_by(|&a, &b| {
            let (x, y) = (&refined[a].1, &refined[b].1);
            x.len()
                .cmp(&y.len())
                .then(res(y).total_cmp(&res(x)))
                .then(b.cmp(&a))
        })
        .expect("one hypothesis at least");
    let best_pairs: std::collections::HashSet<(usize, usize)> =
        refined[best_at].1.iter().map(|p| (p.0, p.1)).collect();
    let rival = refined
        .iter()
        .filter(|(_, inl)| {
            let shared = inl
                .iter()
                .filter(|p| best_pairs.contains(&(p.0, p.1)))
                .count();
            (shared as f64) < 0.5 * inl.len() as f64
        })
        .map(|(_, inl)| inl.len())
        .max()
        .unwrap_or(0);
    let (mut t, mut inl) = refined.swap_remove(best_at);
    if inl.len() >= o.affine_min_inliers {
        let (affine, a_inl) = refine(source, catalogue, &cat_grid, t, TransformKind::Affine, o);
        let more = a_inl.len() as f64 > 1.2 * inl.len() as f64;
        let tighter = a_inl.len() >= inl.len() && res(&a_inl) < 0.8 * res(&inl);
        if affine.kind == TransformKind::Affine && (more || tighter) {
            (t, inl) = (affine, a_inl);
        }
    }
    let lambda = chance_inliers(source, catalogue, &t, o);
    let ln_fa = (generated.max(1) as f64).ln() + ln_poisson_tail(lambda, inl.len());
    let result = Fit {
        transform: t,
        inliers: inl.iter().map(|p| (p.0, p.1)).collect(),
        residual_radii: median(inl.iter().map(|p| p.2).collect()),
        chance_inliers: lambda,
        false_alarm: ln_fa.exp().min(1.0),
        hypotheses: generated,
    };
    if rival as f64 >= AMBIGUITY * inl.len() as f64 && inl.len() >= o.min_inliers {
        return Err(NotRegistered {
            reason: format!(
                "ambiguous: another transform fits {rival} craters, this one {} (a periodic pattern)",
                inl.len()
            ),
            best: Some(Box::new(result)),
        });
    }
    if inl.len() < o.min_inliers {
        return Err(NotRegistered {
            reason: format!("{} inliers, {} needed", inl.len(), o.min_inliers),
            best: Some(Box::new(result)),
        });
    }
    if ln_fa > o.false_alarm.ln() {
        return Err(NotRegistered {
            reason: format!(
                "{} inliers could arise by chance ({:.2} expected of a random transform, false-alarm bound {:.1e})",
                inl.len(),
                lambda,
                result.false_alarm
            ),
            best: Some(Box::new(result)),
        });
    }
    Ok(result)
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

/// The frame a source's positions were registered in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum FrameKind {
    /// `x`, `y`, `diameter_px` of one image frame.
    Pixels,
    /// `lat`, `lon`, `diameter_km`, registered in km on the tangent plane at `origin`.
    Body,
}

/// What registering one source image (the entries sharing a `source`) found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SourceRegistration {
    /// The entries' `source`; None for entries without one (registered together).
    pub source: Option<String>,
    pub frame: FrameKind,
    /// Tangent-plane origin (lat, lon) of a body frame.
    pub origin: Option<(f64, f64)>,
    /// Entries of the source with positions, and catalogue craters around them.
    pub entries: usize,
    pub catalogue: usize,
    pub registered: bool,
    /// Source frame to catalogue frame; present when registered.
    pub transform: Option<Transform>,
    pub rotation_deg: Option<f64>,
    pub scale: Option<f64>,
    pub inliers: usize,
    /// Median inlier offset after the transform, in radii.
    pub residual_radii: Option<f64>,
    pub chance_inliers: Option<f64>,
    pub false_alarm: Option<f64>,
    /// Why the source was not registered (its entries keep their positions as given).
    pub reason: Option<String>,
    /// Each inlier's offset after the transform (dx, dy), in radii of its catalogue crater.
    #[serde(skip)]
    pub residuals: Vec<(f64, f64)>,
}

impl SourceRegistration {
    /// One line on what registration found: the transform and its evidence, or why the
    /// source was not registered.
    pub fn summary(&self) -> String {
        if self.registered {
            format!(
                "registered, rotation {:.2} deg, scale {:.4}, {} inliers of {} entries, median residual {:.3} radii",
                self.rotation_deg.unwrap_or(f64::NAN),
                self.scale.unwrap_or(f64::NAN),
                self.inliers,
                self.entries,
                self.residual_radii.unwrap_or(f64::NAN)
            )
        } else {
            format!(
                "not registered ({})",
                self.reason.as_deref().unwrap_or("no positions")
            )
        }
    }
}

/// Where each source's entries lie in the catalogue's frame. A source absent from the map
/// is in the catalogue's frame already (the catalogue's own entries).
#[derive(Clone, Debug, Default)]
pub struct Frames {
    enabled: bool,
    by_source: HashMap<Option<String>, Arc<SourceRegistration>>,
    body_radius_km: f64,
}

/// An entry as placed in the catalogue's frame.
pub struct Placed<'a> {
    pub meta: Cow<'a, ImageMeta>,
    /// Its position is in the catalogue's frame by registration (or was there already).
    pub registered: bool,
    pub registration: Option<&'a Arc<SourceRegistration>>,
}

/// `meta`'s crater in the planar frame, when it has a usable one ([`Crater::is_usable`]).
fn planar_of(meta: &ImageMeta, kind: FrameKind, origin: (f64, f64), r_km: f64) -> Option<Crater> {
    let c = match (kind, Position::of(meta)?) {
        (FrameKind::Pixels, Position::Frame { x, y, diameter_px }) => Some(Crater {
            x,
            y,
            d: diameter_px,
        }),
        (
            FrameKind::Body,
            Position::Body {
                lat,
                lon,
                diameter_km,
            },
        ) => {
            let k = r_km * std::f64::consts::PI / 180.0;
            let dlon = (lon - origin.1 + 540.0).rem_euclid(360.0) - 180.0;
            Some(Crater {
                x: dlon * origin.0.to_radians().cos() * k,
                y: (lat - origin.0) * k,
                d: diameter_km,
            })
        }
        _ => None,
    }?;
    c.is_usable().then_some(c)
}

fn unplanar(
    c: Crater,
    meta: &ImageMeta,
    kind: FrameKind,
    origin: (f64, f64),
    r_km: f64,
) -> ImageMeta {
    let mut m = meta.clone();
    match kind {
        FrameKind::Pixels => {
            (m.x, m.y, m.diameter_px) = (Some(c.x), Some(c.y), Some(c.d));
        }
        FrameKind::Body => {
            let k = r_km * std::f64::consts::PI / 180.0;
            let lat = origin.0 + c.y / k;
            let lon = origin.1 + c.x / (k * origin.0.to_radians().cos().max(1e-6));
            (m.lat, m.lon, m.diameter_km) = (
                Some(lat),
                Some((lon + 540.0).rem_euclid(360.0) - 180.0),
                Some(c.d),
            );
        }
    }
    m
}

/// The kind of frame most of `metas` have positions in, and the centroid of those on the
/// body (the tangent plane's origin).
fn frame_of(metas: &[&ImageMeta]) -> Option<(FrameKind, (f64, f64))> {
    let (mut body, mut pixels, mut lat, mut east, mut north) = (0usize, 0usize, 0.0, 0.0, 0.0);
    for m in metas {
        match Position::of(m) {
            Some(Position::Body { lat: la, lon, .. }) => {
                body += 1;
                lat += la;
                east += lon.to_radians().cos();
                north += lon.to_radians().sin();
            }
            Some(Position::Frame { .. }) => pixels += 1,
            None => {}
        }
    }
    if body == 0 && pixels == 0 {
        return None;
    }
    Some(if body >= pixels {
        (
            FrameKind::Body,
            (lat / body as f64, north.atan2(east).to_degrees()),
        )
    } else {
        (FrameKind::Pixels, (0.0, 0.0))
    })
}

/// Registers one source's entries to `catalogue` (metas of the catalogue's frame); `wide`:
/// pixel positions that do not register against the catalogue around them are tried
/// against all of it (not for [`Frames::of_index`], where a source with nothing around it
/// anchors its own area).
fn register_source(
    source: Option<String>,
    entries: &[&ImageMeta],
    catalogue: &[&ImageMeta],
    o: &RegisterOptions,
    r_km: f64,
    wide: bool,
    seeds: &[(String, String)],
) -> Option<SourceRegistration> {
    let (kind, origin) = frame_of(entries)?;
    let (src, src_ids): (Vec<Crater>, Vec<&str>) = entries
        .iter()
        .filter_map(|m| Some((planar_of(m, kind, origin, r_km)?, m.id.as_str())))
        .unzip();
    let (x0, y0, x1, y1) = bounds(&src);
    let grow = o.margin * (x1 - x0).max(y1 - y0);
    let (all, all_ids): (Vec<Crater>, Vec<&str>) = catalogue
        .iter()
        .filter_map(|m| Some((planar_of(m, kind, origin, r_km)?, m.id.as_str())))
        .unzip();
    let within = |c: &Crater, (u0, v0, u1, v1): (f64, f64, f64, f64), g: f64| {
        c.x >= u0 - g && c.x <= u1 + g && c.y >= v0 - g && c.y <= v1 + g
    };
    let mut cat: Vec<Crater> = all
        .iter()
        .copied()
        .filter(|c| within(c, (x0, y0, x1, y1), grow))
        .collect();
    let mut attempt = register(&src, &cat, o);
    if attempt.is_err() && !seeds.is_empty() {
        // the catalogue around the seeds' catalogue craters, as far as the source could reach
        let at_src: HashMap<&str, usize> =
            src_ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
        let at_all: HashMap<&str, usize> =
            all_ids.iter().enumerate().map(|(j, id)| (*id, j)).collect();
        let pairs: Vec<(usize, usize)> = seeds
            .iter()
            .filter_map(|(e, c)| Some((*at_src.get(e.as_str())?, *at_all.get(c.as_str())?)))
            .collect();
        if pairs.len() >= 2 {
            let seen: Vec<Crater> = pairs.iter().map(|p| all[p.1]).collect();
            let reach = (x1 - x0).hypot(y1 - y0) * seed_scale(&src, &all, &pairs);
            let (near, index_of): (Vec<Crater>, Vec<usize>) = all
                .iter()
                .enumerate()
                .filter(|(_, c)| within(c, bounds(&seen), reach))
                .map(|(j, c)| (*c, j))
                .unzip();
            let at_near: HashMap<usize, usize> =
                index_of.iter().enumerate().map(|(k, j)| (*j, k)).collect();
            let local: Vec<(usize, usize)> = pairs
                .iter()
                .filter_map(|&(i, j)| Some((i, *at_near.get(&j)?)))
                .collect();
            let seeded = register_seeded(&src, &near, &local, o);
            if seeded.is_ok() {
                (cat, attempt) = (near, seeded);
            }
        }
    }
    // a body position is near its true place; a pixel position may instead be in the
    // source image's own frame, unrelated to the catalogue's: then the whole catalogue
    if wide && attempt.is_err() && kind == FrameKind::Pixels && all.len() > cat.len() {
        let wide = register(&src, &all, o);
        if wide.is_ok() {
            (cat, attempt) = (all.clone(), wide);
        }
    }
    // registered: the catalogue around where the source truly lies, registered again there
    // when that is other craters (a source far from its given place overlapped its box only
    // in part)
    if let Ok(f) = &attempt {
        let corners = [(x0, y0), (x1, y0), (x0, y1), (x1, y1)]
            .map(|(x, y)| f.transform.map(Crater { x, y, d: 1.0 }));
        let mapped = bounds(&corners);
        let grow = o.margin * (mapped.2 - mapped.0).max(mapped.3 - mapped.1);
        let there: Vec<Crater> = all
            .iter()
            .copied()
            .filter(|c| within(c, mapped, grow))
            .collect();
        if there != cat {
            if let Ok(g) = register(&src, &there, o) {
                if g.inliers.len() >= f.inliers.len() {
                    (cat, attempt) = (there, Ok(g));
                }
            }
        }
    }
    let mut out = SourceRegistration {
        source,
        frame: kind,
        origin: (kind == FrameKind::Body).then_some(origin),
        entries: src.len(),
        catalogue: cat.len(),
        registered: false,
        transform: None,
        rotation_deg: None,
        scale: None,
        inliers: 0,
        residual_radii: None,
        chance_inliers: None,
        false_alarm: None,
        reason: None,
        residuals: Vec::new(),
    };
    let (fit, reason) = match attempt {
        Ok(f) => (Some(f), None),
        Err(e) => (e.best.map(|b| *b), Some(e.reason)),
    };
    if let Some(f) = &fit {
        out.inliers = f.inliers.len();
        out.residual_radii = Some(f.residual_radii);
        out.chance_inliers = Some(f.chance_inliers);
        out.false_alarm = Some(f.false_alarm);
        if reason.is_none() {
            out.registered = true;
            out.transform = Some(f.transform);
            out.rotation_deg = Some(f.transform.rotation_deg());
            out.scale = Some(f.transform.scale());
            out.residuals = f
                .inliers
                .iter()
                .map(|&(i, j)| {
                    let m = f.transform.map(src[i]);
                    let r = cat[j].d / 2.0;
                    ((m.x - cat[j].x) / r, (m.y - cat[j].y) / r)
                })
                .collect();
        }
    }
    out.reason = reason;
    Some(out)
}

fn by_source<'a>(
    metas: impl IntoIterator<Item = &'a ImageMeta>,
) -> Vec<(Option<String>, Vec<&'a ImageMeta>)> {
    let mut groups: Vec<(Option<String>, Vec<&'a ImageMeta>)> = Vec::new();
    let mut at: HashMap<Option<String>, usize> = HashMap::new();
    for m in metas {
        let i = *at.entry(m.source.clone()).or_insert_with(|| {
            groups.push((m.source.clone(), Vec::new()));
            groups.len() - 1
        });
        groups[i].1.push(m);
    }
    groups
}

impl Frames {
    /// No registration: every entry keeps its position and today's rule applies.
    pub fn none() -> Frames {
        Frames::default()
    }

    /// Registers the sources of new `entries` (grouped by `source`; entries without one
    /// form one group) to the index's live entries of other sources.
    pub fn of_entries(
        index: &Index,
        entries: &[ImageMeta],
        o: &RegisterOptions,
        body_radius_km: f64,
    ) -> Frames {
        Self::of_entries_seeded(index, entries, &[], o, body_radius_km)
    }

    /// [`Frames::of_entries`] where `seeds`, (entry id, index entry id) pairs known to show
    /// one crater (confident appearance matches), seed the sources that crater patterns alone
    /// do not register ([`register_seeded`]).
    pub fn of_entries_seeded(
        index: &Index,
        entries: &[ImageMeta],
        seeds: &[(String, String)],
        o: &RegisterOptions,
        body_radius_km: f64,
    ) -> Frames {
        let groups = by_source(entries);
        let catalogue: Vec<&ImageMeta> = index.live_rows().map(|r| index.meta(r)).collect();
        let by_source = groups
            .into_iter()
            .filter_map(|(source, members)| {
                let others: Vec<&ImageMeta> = match &source {
                    Some(s) => catalogue
                        .iter()
                        .copied()
                        .filter(|m| m.source.as_ref() != Some(s))
                        .collect(),
                    None => catalogue.clone(),
                };
                let reg = register_source(
                    source.clone(),
                    &members,
                    &others,
                    o,
                    body_radius_km,
                    true,
                    seeds,
                )?;
                Some((source, Arc::new(reg)))
            })
            .collect();
        Frames {
            enabled: true,
            by_source,
            body_radius_km,
        }
    }

    /// Registers the sources of one index to each other, as for deduplication: the source
    /// with the most entries is the reference; each other source, largest first, is
    /// registered to the entries placed so far (the reference and the sources registered
    /// before it). A source with nothing placed around it is placed as given (an anchor:
    /// disjoint tiles each anchor their own area).
    pub fn of_index(index: &Index, o: &RegisterOptions, body_radius_km: f64) -> Frames {
        let metas: Vec<&ImageMeta> = index.live_rows().map(|r| index.meta(r)).collect();
        let mut groups = by_source(metas.iter().copied());
        groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
        let mut frames = Frames {
            enabled: true,
            by_source: HashMap::new(),
            body_radius_km,
        };
        let Some((_, reference)) = groups.first() else {
            return frames;
        };
        let mut placed: Vec<ImageMeta> = reference.iter().map(|m| (*m).clone()).collect();
        for (source, members) in groups.iter().skip(1) {
            let anchor: Vec<&ImageMeta> = placed.iter().collect();
            let Some(mut reg) = register_source(
                source.clone(),
                members,
                &anchor,
                o,
                body_radius_km,
                false,
                &[],
            ) else {
                continue;
            };
            if reg.catalogue == 0 {
                // nothing placed around it: its own positions define the frame there
                reg.registered = true;
                reg.transform = Some(Transform::IDENTITY);
                reg.reason = Some("nothing placed around it: an anchor of the frame".into());
            }
            let reg = Arc::new(reg);
            frames.by_source.insert(source.clone(), reg.clone());
            if reg.registered {
                placed.extend(members.iter().map(|m| frames.place(m).meta.into_owned()));
            }
        }
        frames
    }

    /// The frames that `registrations` (of [`Frames::registrations`], e.g. sent to the
    /// tasks of a distributed run) describe: every task places entries alike.
    pub fn of_registrations(
        registrations: impl IntoIterator<Item = SourceRegistration>,
        body_radius_km: f64,
    ) -> Frames {
        Frames {
            enabled: true,
            by_source: registrations
                .into_iter()
                .map(|r| (r.source.clone(), Arc::new(r)))
                .collect(),
            body_radius_km,
        }
    }

    /// Adds the registrations of `other` (of other sources).
    pub fn extend(&mut self, other: Frames) {
        self.enabled |= other.enabled;
        self.body_radius_km = other.body_radius_km;
        self.by_source.extend(other.by_source);
    }

    /// `meta` in the catalogue's frame.
    pub fn place<'a>(&'a self, meta: &'a ImageMeta) -> Placed<'a> {
        let as_given = |registered, registration| Placed {
            meta: Cow::Borrowed(meta),
            registered,
            registration,
        };
        if !self.enabled {
            return as_given(false, None);
        }
        let Some(reg) = self.by_source.get(&meta.source) else {
            return as_given(true, None);
        };
        let Some(t) = reg.transform.filter(|_| reg.registered) else {
            return as_given(false, Some(reg));
        };
        let origin = reg.origin.unwrap_or((0.0, 0.0));
        match planar_of(meta, reg.frame, origin, self.body_radius_km) {
            Some(c) => Placed {
                meta: Cow::Owned(unplanar(
                    t.map(c),
                    meta,
                    reg.frame,
                    origin,
                    self.body_radius_km,
                )),
                registered: true,
                registration: Some(reg),
            },
            None => as_given(false, Some(reg)),
        }
    }

    /// Every source's registration, in source order.
    pub fn registrations(&self) -> Vec<Arc<SourceRegistration>> {
        let mut v: Vec<Arc<SourceRegistration>> = self.by_source.values().cloned().collect();
        v.sort_by(|a, b| a.source.cmp(&b.source));
        v
    }
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

    #[test]
    fn poisson_tail_matches_direct_sums() {
        let direct = |l: f64, k: usize| -> f64 {
            1.0 - (0..k)
                .map(|i| (-l + i as f64 * l.ln() - ln_factorial(i)).exp())
                .sum::<f64>()
        };
        for (l, k) in [(0.5, 1), (2.0, 3), (4.0, 2), (1.0, 6)] {
            assert!((ln_poisson_tail(l, k).exp() - direct(l, k)).abs() < 1e-9);
        }
        assert!(ln_poisson_tail(0.1, 40) < -100.0);
    }
}
