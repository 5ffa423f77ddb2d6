//! The pattern-matching algorithm of registration: keys, hypotheses, preemptive scoring,
//! least-squares refinement and the significance test (steps 1-4 of [`super`]).

use super::{Crater, Fit, NotRegistered, RegisterOptions, Transform, TransformKind};
use std::collections::HashMap;

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
pub(super) fn bounds(points: &[Crater]) -> (f64, f64, f64, f64) {
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

/// `start` refined on `source` against `catalogue` as a registration's hypotheses are
/// ([`refine`], a similarity): the transform, its inliers (source index, catalogue index) and
/// their median offset in radii.
pub fn refine_similarity(
    source: &[Crater],
    catalogue: &[Crater],
    start: Transform,
    o: &RegisterOptions,
) -> (Transform, Vec<(usize, usize)>, f64) {
    let grid = Grid::of(catalogue, cell_size(catalogue));
    let (t, inl) = refine(
        source,
        catalogue,
        &grid,
        start,
        TransformKind::Similarity,
        o,
    );
    let residual = median(inl.iter().map(|p| p.2).collect());
    (t, inl.iter().map(|p| (p.0, p.1)).collect(), residual)
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
pub(crate) fn ln_poisson_tail(lambda: f64, k: usize) -> f64 {
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
pub(super) fn seed_scale(src: &[Crater], cat: &[Crater], seeds: &[(usize, usize)]) -> f64 {
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

#[cfg(test)]
mod tests {
    use super::*;

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
