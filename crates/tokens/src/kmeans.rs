//! k-means, once: k-means++ seeding and Lloyd's iterations with one rule for an empty
//! cluster (it restarts at a training vector drawn from the caller's seeded generator).
//!
//! Three callers cluster with it: per-image instance tokens (the `kmeans` aggregation, in
//! this crate), the IVF lists and the PQ codebooks (craterdex-index). Each brings its own
//! assignment step (the nearest centre of every vector), because each has a kernel measured
//! fastest for its shape: a small GEMM per image here, blocked dot products over thousands
//! of lists for IVF, 256 centres per sub-space for PQ. What a centre becomes, and what an
//! empty cluster does, is decided here and nowhere else.

use crate::l2_normalize_rows;
use rand::Rng;

/// What a centre is after each update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Centres {
    /// The mean of its vectors (k-means in L2).
    Mean,
    /// The mean scaled to unit length (spherical k-means, for inner-product search).
    UnitMean,
}

/// Lloyd's iterations from `centres` (`[k, dim]`) over `data` (`[n, dim]`, n >= 1):
/// `nearest(centres)` gives each vector's centre; each centre becomes the mean of its
/// vectors ([`Centres`]); a centre left with no vector restarts at a training vector drawn
/// from `rng`, so every centre stays a place where data is.
pub fn lloyd(
    data: &[f32],
    dim: usize,
    mut centres: Vec<f32>,
    iterations: usize,
    update: Centres,
    rng: &mut impl Rng,
    nearest: impl Fn(&[f32]) -> Vec<usize>,
) -> Vec<f32> {
    let n = data.len().checked_div(dim).unwrap_or(0);
    let k = centres.len().checked_div(dim).unwrap_or(0);
    if n == 0 || k == 0 {
        return centres;
    }
    for _ in 0..iterations {
        let assign = nearest(&centres);
        let mut sums = vec![0f32; k * dim];
        let mut counts = vec![0usize; k];
        for (i, &c) in assign.iter().enumerate() {
            sums[c * dim..(c + 1) * dim]
                .iter_mut()
                .zip(&data[i * dim..(i + 1) * dim])
                .for_each(|(s, x)| *s += x);
            counts[c] += 1;
        }
        for c in 0..k {
            let centre = &mut centres[c * dim..(c + 1) * dim];
            if counts[c] == 0 {
                let r = rng.gen_range(0..n);
                centre.copy_from_slice(&data[r * dim..(r + 1) * dim]);
            } else {
                // a unit mean is the sum scaled to unit length: no division first
                let count = match update {
                    Centres::Mean => counts[c] as f32,
                    Centres::UnitMean => 1.0,
                };
                centre
                    .iter_mut()
                    .zip(&sums[c * dim..(c + 1) * dim])
                    .for_each(|(m, s)| *m = s / count);
            }
        }
        if update == Centres::UnitMean {
            l2_normalize_rows(&mut centres, dim);
        }
    }
    centres
}

/// k-means++ seeding: `k` (at most n) rows of `data`, the first uniform, each next one drawn
/// with probability proportional to its squared distance from the nearest chosen; when every
/// row coincides with a chosen one, the first row not on a centre (or row 0).
pub fn plus_plus(data: &[f32], dim: usize, k: usize, rng: &mut impl Rng) -> Vec<f32> {
    let n = data.len().checked_div(dim).unwrap_or(0);
    let k = k.min(n);
    if k == 0 {
        return Vec::new();
    }
    let row = |i: usize| &data[i * dim..(i + 1) * dim];
    let mut centres: Vec<f32> = row(rng.gen_range(0..n)).to_vec();
    let mut d2: Vec<f32> = (0..n).map(|i| sq_dist(row(i), &centres[..dim])).collect();
    while centres.len() < k * dim {
        let total: f64 = d2.iter().map(|&x| x as f64).sum();
        let pick = if total <= 0.0 {
            d2.iter().position(|&x| x > 0.0).unwrap_or(0)
        } else {
            let mut target = rng.gen::<f64>() * total;
            let mut chosen = n - 1;
            for (i, &x) in d2.iter().enumerate() {
                target -= x as f64;
                if target < 0.0 {
                    chosen = i;
                    break;
                }
            }
            chosen
        };
        let c = row(pick).to_vec();
        d2.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = x.min(sq_dist(row(i), &c)));
        centres.extend_from_slice(&c);
    }
    centres
}

fn sq_dist(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// Nearest centre in L2 by direct sums, ties to the lower index.
    fn nearest_l2(data: &[f32], dim: usize) -> impl Fn(&[f32]) -> Vec<usize> + '_ {
        move |centres: &[f32]| {
            data.chunks_exact(dim)
                .map(|x| {
                    let mut best = (0, f32::INFINITY);
                    for (c, centre) in centres.chunks_exact(dim).enumerate() {
                        let d = sq_dist(x, centre);
                        if d < best.1 {
                            best = (c, d);
                        }
                    }
                    best.0
                })
                .collect()
        }
    }

    #[test]
    fn an_empty_cluster_restarts_at_a_training_vector() {
        // two centres far from every vector: the second never wins and must move onto data
        let data = [0.0f32, 0.0, 0.1, 0.0, 10.0, 10.0, 10.1, 10.0];
        let start = vec![1.0f32, 1.0, 1000.0, 1000.0];
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let c = lloyd(
            &data,
            2,
            start,
            1,
            Centres::Mean,
            &mut rng,
            nearest_l2(&data, 2),
        );
        let on_data = data.chunks_exact(2).any(|x| x == &c[2..4]);
        assert!(on_data, "the empty centre stayed at {:?}", &c[2..4]);
        // the first centre took every vector: their mean
        assert!(
            (c[0] - 5.05).abs() < 1e-5 && (c[1] - 5.0).abs() < 1e-5,
            "{c:?}"
        );
    }

    #[test]
    fn lloyd_finds_two_clusters_and_unit_means_are_unit() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut data = Vec::new();
        for i in 0..40 {
            let (cx, cy) = if i % 2 == 0 { (1.0, 0.0) } else { (0.0, 1.0) };
            data.extend([
                cx + rng.gen_range(-0.05..0.05),
                cy + rng.gen_range(-0.05..0.05),
            ]);
        }
        let seeds = plus_plus(&data, 2, 2, &mut rng);
        let c = lloyd(
            &data,
            2,
            seeds,
            10,
            Centres::UnitMean,
            &mut rng,
            nearest_l2(&data, 2),
        );
        let mut found: Vec<(i32, i32)> = c
            .chunks_exact(2)
            .map(|v| ((v[0] * 10.0).round() as i32, (v[1] * 10.0).round() as i32))
            .collect();
        found.sort();
        assert_eq!(found, vec![(0, 10), (10, 0)]);
        for v in c.chunks_exact(2) {
            assert!((v[0] * v[0] + v[1] * v[1] - 1.0).abs() < 1e-5);
        }
    }

    #[test]
    fn plus_plus_picks_distinct_rows_and_stops_at_n() {
        let data = [0.0f32, 0.0, 1.0, 0.0, 0.0, 1.0];
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let c = plus_plus(&data, 2, 5, &mut rng);
        assert_eq!(c.len(), 6);
        let mut rows: Vec<Vec<u32>> = c
            .chunks(2)
            .map(|r| r.iter().map(|v| v.to_bits()).collect())
            .collect();
        rows.sort();
        rows.dedup();
        assert_eq!(rows.len(), 3);
    }
}
