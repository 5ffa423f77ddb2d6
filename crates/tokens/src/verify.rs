//! Spatial verification, as instance-level retrieval verifies landmarks: do two images' patch
//! tokens match in one layout? Correspondences are the tokens that are each other's most
//! similar; a similarity transform of the patch grid (turn, scale, shift) is fitted from
//! pairs of them, and the correspondences it explains are the inliers. A wrong crater that
//! looks alike matches tokens too, but scattered: on the real benchmarks right candidates
//! gather two to four times the inliers of wrong ones (docs/results.md).

use crate::encoder::mutual_nearest;

/// How far (in patches) a transformed correspondence may land from its match and count.
pub const INLIER_TOLERANCE: f32 = 1.5;
/// Scales a fitted transform may have: a crater seen at up to twice (or half) the size.
const SCALES: (f32, f32) = (0.5, 2.0);
/// Pairs of correspondences tried as transforms at most (evenly spread over all pairs).
const MAX_PAIRS: usize = 2000;

/// A point of the patch grid (x right, y down, in patches), with the complex arithmetic a
/// similarity transform `z -> a z + b` needs.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Point {
    x: f32,
    y: f32,
}

impl Point {
    fn sub(self, o: Point) -> Point {
        Point {
            x: self.x - o.x,
            y: self.y - o.y,
        }
    }
    fn add(self, o: Point) -> Point {
        Point {
            x: self.x + o.x,
            y: self.y + o.y,
        }
    }
    fn mul(self, o: Point) -> Point {
        Point {
            x: self.x * o.x - self.y * o.y,
            y: self.x * o.y + self.y * o.x,
        }
    }
    fn norm2(self) -> f32 {
        self.x * self.x + self.y * self.y
    }
    /// `self / o`, `o` not zero.
    fn div(self, o: Point) -> Point {
        let n = o.norm2();
        Point {
            x: (self.x * o.x + self.y * o.y) / n,
            y: (self.y * o.x - self.x * o.y) / n,
        }
    }
}

/// The side of a square grid of `tokens` patches, if it is one.
pub fn grid_side(tokens: usize) -> Option<usize> {
    let side = (tokens as f64).sqrt().round() as usize;
    (side * side == tokens && side > 0).then_some(side)
}

fn position(index: usize, side: usize) -> Point {
    Point {
        x: (index % side) as f32,
        y: (index / side) as f32,
    }
}

/// The most correspondences one similarity transform explains between two square grids of
/// unit tokens `dim` wide (a query's and a candidate's, the same size): 0 when the grids
/// differ in size or are not square.
pub fn inliers(query: &[f32], candidate: &[f32], dim: usize) -> usize {
    let tokens = query.len() / dim.max(1);
    let Some(side) = grid_side(tokens).filter(|_| candidate.len() == query.len()) else {
        return 0;
    };
    let matches: Vec<(Point, Point)> = mutual_nearest(query, candidate, dim)
        .into_iter()
        .map(|(q, c)| (position(q, side), position(c, side)))
        .collect();
    most_explained(&matches)
}

/// The most of `matches` (source, target) that a transform fitted from two of them maps
/// within [`INLIER_TOLERANCE`] of their targets; one match alone explains itself.
fn most_explained(matches: &[(Point, Point)]) -> usize {
    let n = matches.len();
    if n < 2 {
        return n;
    }
    let pairs = n * (n - 1) / 2;
    let stride = pairs.div_ceil(MAX_PAIRS);
    let tolerance2 = INLIER_TOLERANCE * INLIER_TOLERANCE;
    let (lo2, hi2) = (SCALES.0 * SCALES.0, SCALES.1 * SCALES.1);
    let mut best = 1;
    let mut pair = 0usize;
    for i in 0..n {
        for j in i + 1..n {
            pair += 1;
            if !pair.is_multiple_of(stride) {
                continue;
            }
            let (si, ti) = matches[i];
            let (sj, tj) = matches[j];
            let ds = sj.sub(si);
            if ds.norm2() < 0.25 {
                continue;
            }
            let a = tj.sub(ti).div(ds);
            let scale2 = a.norm2();
            if scale2 <= lo2 || scale2 >= hi2 {
                continue;
            }
            let b = ti.sub(a.mul(si));
            let explained = matches
                .iter()
                .filter(|(s, t)| a.mul(*s).add(b).sub(*t).norm2() < tolerance2)
                .count();
            best = best.max(explained);
        }
    }
    best
}

/// The combined score verification ranks by: the late-interaction `score` plus `weight` for
/// every inlier beyond `floor` (the inliers any look-alike gathers by chance).
pub fn verified_score(score: f32, inliers: usize, floor: f32, weight: f32) -> f32 {
    score + weight * (inliers as f32 - floor).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// `side x side` random unit tokens of `dim`.
    fn grid(side: usize, dim: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut t: Vec<f32> = (0..side * side * dim)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        crate::l2_normalize_rows(&mut t, dim);
        t
    }

    /// The grid's tokens moved by `f` (new position of the token at (x, y)); positions left
    /// empty get fresh random tokens.
    fn moved(
        t: &[f32],
        side: usize,
        dim: usize,
        f: impl Fn(usize, usize) -> (usize, usize),
    ) -> Vec<f32> {
        let mut out = grid(side, dim, 99);
        for y in 0..side {
            for x in 0..side {
                let (nx, ny) = f(x, y);
                if nx < side && ny < side {
                    let (to, from) = ((ny * side + nx) * dim, (y * side + x) * dim);
                    out[to..to + dim].copy_from_slice(&t[from..from + dim]);
                }
            }
        }
        out
    }

    #[test]
    fn a_shifted_or_turned_copy_is_explained_and_a_stranger_is_not() {
        let (side, dim) = (12, 32);
        let q = grid(side, dim, 1);
        // itself: every token corresponds in place
        assert_eq!(inliers(&q, &q, dim), side * side);
        // shifted by three patches: the tokens still in view
        let shifted = moved(&q, side, dim, |x, y| (x + 3, y));
        let n = inliers(&q, &shifted, dim);
        assert!(n >= side * (side - 3), "{n}");
        // a quarter turn about the centre
        let turned = moved(&q, side, dim, |x, y| (side - 1 - y, x));
        assert_eq!(inliers(&q, &turned, dim), side * side);
        // an unrelated grid: only chance correspondences, of which a transform fitted from
        // two explains a few more by chance
        let stranger = grid(side, dim, 2);
        let n = inliers(&q, &stranger, dim);
        assert!(n < side * side / 10, "{n}");
    }

    #[test]
    fn shuffled_tokens_match_but_do_not_verify() {
        // the same tokens in another layout correspond one to one, yet no transform explains
        // them: verification tells look-alikes from the same crater seen again
        let (side, dim) = (10, 16);
        let q = grid(side, dim, 3);
        let mut order: Vec<usize> = (0..side * side).collect();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
        for i in (1..order.len()).rev() {
            order.swap(i, rng.gen_range(0..=i));
        }
        let shuffled: Vec<f32> = order
            .iter()
            .flat_map(|&i| q[i * dim..(i + 1) * dim].iter().copied())
            .collect();
        assert_eq!(mutual_nearest(&q, &shuffled, dim).len(), side * side);
        let n = inliers(&q, &shuffled, dim);
        assert!(n < side * side / 5, "{n}");
    }

    #[test]
    fn grids_of_other_shapes_give_no_inliers() {
        let q = grid(4, 8, 5);
        assert_eq!(inliers(&q, &q[..15 * 8], 8), 0);
        assert_eq!(inliers(&q[..15 * 8], &q[..15 * 8], 8), 0);
        assert_eq!(grid_side(256), Some(16));
        assert_eq!(grid_side(0), None);
    }

    #[test]
    fn the_verified_score_adds_the_weight_per_inlier_beyond_the_floor() {
        assert_eq!(verified_score(0.5, 0, 0.0, 0.01), 0.5);
        assert!((verified_score(0.5, 100, 0.0, 0.01) - 1.5).abs() < 1e-6);
        // below the floor nothing is added, above it only what exceeds it
        assert_eq!(verified_score(0.5, 40, 50.0, 0.01), 0.5);
        assert!((verified_score(0.5, 150, 50.0, 0.01) - 1.5).abs() < 1e-6);
    }
}
