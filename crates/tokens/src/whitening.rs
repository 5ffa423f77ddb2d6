//! Unsupervised PCA whitening learned from unlabelled samples (docs/method.md):
//! `C = V diag(w) V^T`, `W = V diag(1 / sqrt(w + r * max(w)))`, `t -> l2((t - mu) W)`.

use crate::error::{Error, Result};
use crate::l2_normalize;
use craterdex_errors::ensure;
use craterdex_kernels::gemm::{matmul_f32, PackedF32};
use nalgebra::{DMatrix, SymmetricEigen};
use serde::{Deserialize, Serialize};

pub const DEFAULT_REGULARISATION: f32 = 1e-3;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Whitening {
    pub dim_in: usize,
    pub dim_out: usize,
    /// `[dim_in]`
    pub mean: Vec<f32>,
    /// `[dim_in, dim_out]` row-major.
    pub proj: Vec<f32>,
}

impl Whitening {
    /// Learns from `samples` (`n` rows of `d`, already L2-normalised). `reg` is `r` above;
    /// `dim_out` keeps the leading components (`None`: all).
    pub fn learn(samples: &[f32], d: usize, reg: f32, dim_out: Option<usize>) -> Result<Self> {
        let (mean, cov) = mean_and_covariance(samples, d)?;
        let dim_out = output_width(d, dim_out)?;
        let (values, vectors) = sorted_eigen(cov);
        varies(&values, samples.len() / d)?;
        let floor = reg as f64 * values[0].max(0.0) + f64::MIN_POSITIVE;
        let mut proj = vec![0f32; d * dim_out];
        for (col, v) in vectors.column_iter().take(dim_out).enumerate() {
            let scale = 1.0 / (values[col].max(0.0) + floor).sqrt();
            for row in 0..d {
                proj[row * dim_out + col] = (v[row] * scale) as f32;
            }
        }
        Self::from_parts(d, dim_out, mean, proj)
    }

    /// Learned whitening (Radenovic et al.) from matching pairs: whitens by the covariance
    /// `Cp` of `pair_differences` (rows `a - b` of two views of one instance), blended with
    /// the samples' covariance `Ct` as `alpha Cp / tr Cp + (1 - alpha) Ct / tr Ct`
    /// (regularised by `reg` of its largest eigenvalue), then rotates by PCA of the samples
    /// in that space so that `dim_out` keeps the leading components. `alpha` 0 is PCA
    /// whitening up to scale; 1 is the pairs alone.
    pub fn learn_from_pairs(
        samples: &[f32],
        pair_differences: &[f32],
        d: usize,
        reg: f32,
        alpha: f32,
        dim_out: Option<usize>,
    ) -> Result<Self> {
        ensure!(
            (0.0..=1.0).contains(&alpha),
            Error::Invalid(format!("pair whitening blend {alpha} is not in [0, 1]"))
        );
        let (mean, total) = mean_and_covariance(samples, d)?;
        varies(&sorted_eigen(total.clone()).0, samples.len() / d)?;
        let (_, pairs) = mean_and_covariance(pair_differences, d)?;
        let dim_out = output_width(d, dim_out)?;
        let alpha = alpha as f64;
        let blend = &pairs * (alpha / pairs.trace().max(f64::MIN_POSITIVE))
            + &total * ((1.0 - alpha) / total.trace().max(f64::MIN_POSITIVE));
        let (values, vectors) = sorted_eigen(blend);
        let floor = reg as f64 * values[0].max(0.0) + f64::MIN_POSITIVE;
        let inv_sqrt = DMatrix::from_diagonal(&nalgebra::DVector::from_iterator(
            d,
            values.iter().map(|w| 1.0 / (w.max(0.0) + floor).sqrt()),
        ));
        let to_white = &vectors * inv_sqrt * vectors.transpose();
        let (_, rotation) = sorted_eigen(&to_white.transpose() * &total * &to_white);
        let full = to_white * rotation;
        let mut proj = vec![0f32; d * dim_out];
        for col in 0..dim_out {
            for row in 0..d {
                proj[row * dim_out + col] = full[(row, col)] as f32;
            }
        }
        Self::from_parts(d, dim_out, mean, proj)
    }

    /// The whitening of these parts, checked as one read from a file is: learning never
    /// hands on what could not be used (a value past f32's range is not finite).
    fn from_parts(dim_in: usize, dim_out: usize, mean: Vec<f64>, proj: Vec<f32>) -> Result<Self> {
        let w = Self {
            dim_in,
            dim_out,
            mean: mean.iter().map(|&m| m as f32).collect(),
            proj,
        };
        w.validate()
            .map_err(|e| Error::Degenerate(format!("whitening learned: {e}")))?;
        Ok(w)
    }

    /// Fails unless the parameters agree with each other (a whitening read from a file may
    /// not): both widths positive, `mean` `[dim_in]`, `proj` `[dim_in, dim_out]`, all finite.
    pub fn validate(&self) -> Result<()> {
        ensure!(
            self.dim_in > 0
                && self.dim_out > 0
                && self.dim_out <= self.dim_in
                && self.dim_in <= 1 << 16,
            Error::Invalid(format!(
                "whitening widths {} -> {} out of range",
                self.dim_in, self.dim_out
            ))
        );
        ensure!(
            self.mean.len() == self.dim_in,
            Error::Invalid(format!(
                "whitening mean has {} values for width {}",
                self.mean.len(),
                self.dim_in
            ))
        );
        ensure!(
            self.proj.len() == self.dim_in * self.dim_out,
            Error::Invalid(format!(
                "whitening projection has {} values, {} x {} expected",
                self.proj.len(),
                self.dim_in,
                self.dim_out
            ))
        );
        ensure!(
            self.mean.iter().chain(&self.proj).all(|v| v.is_finite()),
            Error::Invalid("whitening parameters are not all finite".into())
        );
        Ok(())
    }

    /// `l2((t - mu) W)` for one vector.
    pub fn apply(&self, t: &[f32]) -> Vec<f32> {
        let centred: Vec<f32> = t.iter().zip(&self.mean).map(|(a, m)| a - m).collect();
        let mut out = vec![0f32; self.dim_out];
        for (i, c) in centred.iter().enumerate() {
            let row = &self.proj[i * self.dim_out..(i + 1) * self.dim_out];
            out.iter_mut().zip(row).for_each(|(o, w)| *o += c * w);
        }
        l2_normalize(&mut out);
        out
    }

    /// Applies to each `dim_in`-wide row: one `[n, dim_in] x [dim_in, dim_out]` product on
    /// the kernels (a per-row loop took 15 ms for 256 tokens x 384-d; the product about 1 ms).
    pub fn apply_rows(&self, rows: &[f32]) -> Vec<f32> {
        let n = rows.len() / self.dim_in;
        let centred: Vec<f32> = rows
            .chunks_exact(self.dim_in)
            .flat_map(|r| r.iter().zip(&self.mean).map(|(a, m)| a - m))
            .collect();
        let mut out = vec![0f32; n * self.dim_out];
        if n == 0 {
            return out;
        }
        // packing costs dim_in x dim_out per call, 0.4% of a 256-token product
        let proj = PackedF32::from_kn(&self.proj, self.dim_in, self.dim_out);
        matmul_f32(
            &centred,
            n,
            self.dim_in,
            &proj,
            &mut out,
            self.dim_out,
            false,
        );
        out.chunks_mut(self.dim_out).for_each(l2_normalize);
        out
    }
}

/// The mean and sample covariance of `n` rows of `d`.
fn mean_and_covariance(rows: &[f32], d: usize) -> Result<(Vec<f64>, DMatrix<f64>)> {
    let n = rows.len() / d.max(1);
    ensure!(
        n >= 2,
        Error::Invalid(format!("whitening needs at least two samples, got {n}"))
    );
    let mut mean = vec![0f64; d];
    rows.chunks(d)
        .for_each(|r| mean.iter_mut().zip(r).for_each(|(m, v)| *m += *v as f64));
    mean.iter_mut().for_each(|m| *m /= n as f64);
    let centred = DMatrix::<f64>::from_fn(n, d, |i, j| rows[i * d + j] as f64 - mean[j]);
    let cov = (centred.transpose() * &centred) / (n as f64 - 1.0).max(1.0);
    Ok((mean, cov))
}

/// Refuses samples (`n` of them) whose covariance, eigenvalues `values` largest first, has
/// no variance to whiten: all alike, up to f32 rounding.
fn varies(values: &[f64], n: usize) -> Result<()> {
    // unit-length samples that differ at all vary by far more than f32 rounding does
    const NO_VARIANCE: f64 = 1e-12;
    ensure!(
        values.first().is_some_and(|&w| w > NO_VARIANCE),
        Error::Degenerate(format!(
            "whitening cannot be learned from {n} samples that do not vary (images all alike)"
        ))
    );
    Ok(())
}

fn output_width(d: usize, dim_out: Option<usize>) -> Result<usize> {
    let dim_out = dim_out.unwrap_or(d).min(d);
    ensure!(
        dim_out > 0,
        Error::Invalid("whitening output dimension must be positive".into())
    );
    Ok(dim_out)
}

/// Eigenvalues of a symmetric matrix, largest first, and their eigenvectors as columns in
/// that order, each signed so that its largest entry is positive (the sign is arbitrary;
/// fixing it makes learning deterministic).
fn sorted_eigen(m: DMatrix<f64>) -> (Vec<f64>, DMatrix<f64>) {
    let d = m.nrows();
    let eig = SymmetricEigen::new(m);
    let mut order: Vec<usize> = (0..d).collect();
    order.sort_by(|&a, &b| {
        eig.eigenvalues[b]
            .total_cmp(&eig.eigenvalues[a])
            .then(a.cmp(&b))
    });
    let values = order.iter().map(|&k| eig.eigenvalues[k]).collect();
    let signs: Vec<f64> = order
        .iter()
        .map(|&k| {
            let largest = eig.eigenvectors.column(k).iter().fold(0f64, |m, x| {
                if x.abs() > m.abs() {
                    *x
                } else {
                    m
                }
            });
            if largest < 0.0 {
                -1.0
            } else {
                1.0
            }
        })
        .collect();
    let vectors = DMatrix::from_fn(d, d, |row, col| {
        eig.eigenvectors[(row, order[col])] * signs[col]
    });
    (values, vectors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Samples that do not vary (images all alike) give no whitening, named as such, where
    /// learning used to divide by zero and hand on infinities that became NaN in files.
    #[test]
    fn samples_that_do_not_vary_are_refused_by_name() {
        let one: Vec<f32> = (0..8).map(|i| (i as f32 + 1.0) / 10.0).collect();
        let alike: Vec<f32> = one.iter().cycle().take(8 * 12).copied().collect();
        let e = Whitening::learn(&alike, 8, 1e-3, None).unwrap_err();
        assert!(matches!(e, Error::Degenerate(_)), "{e}");
        assert!(e.to_string().contains("12 samples that do not vary"), "{e}");
        let differences = vec![0f32; 8 * 4];
        let e = Whitening::learn_from_pairs(&alike, &differences, 8, 1e-3, 0.5, None).unwrap_err();
        assert!(matches!(e, Error::Degenerate(_)), "{e}");
        // samples that vary in one direction only still whiten, and finitely
        let mut line = alike.clone();
        for (i, row) in line.chunks_mut(8).enumerate() {
            row[0] += i as f32 * 0.01;
        }
        let w = Whitening::learn(&line, 8, 1e-3, None).unwrap();
        assert!(w.validate().is_ok());
    }

    /// What a damaged or hand-edited encoder file may hold is refused before it is used.
    #[test]
    fn inconsistent_parameters_are_refused() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let x: Vec<f32> = (0..400 * 4).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let w = Whitening::learn(&x, 4, 1e-3, Some(3)).unwrap();
        w.validate().unwrap();
        let broken = [
            Whitening {
                dim_out: 5,
                ..w.clone()
            },
            Whitening {
                mean: vec![0.0; 3],
                ..w.clone()
            },
            Whitening {
                proj: w.proj[1..].to_vec(),
                ..w.clone()
            },
            Whitening {
                dim_in: 0,
                ..w.clone()
            },
            Whitening {
                mean: vec![f32::NAN; 4],
                ..w.clone()
            },
        ];
        for b in broken {
            assert!(b.validate().is_err(), "{b:?}");
        }
    }

    #[test]
    fn whitened_samples_have_identity_covariance() {
        // anisotropic 3-d data: scales 5, 1, 0.2 along rotated axes
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let n = 4000;
        let d = 3;
        let mut x = Vec::with_capacity(n * d);
        for _ in 0..n {
            let (a, b, c): (f32, f32, f32) = (
                rng.gen_range(-1.0..1.0) * 5.0,
                rng.gen_range(-1.0..1.0),
                rng.gen_range(-1.0..1.0) * 0.2,
            );
            x.extend_from_slice(&[a + b, a - b + c, c - 0.3 * a]);
        }
        let w = Whitening::learn(&x, d, 0.0, None).unwrap();
        // without the final l2, (x - mu) W has identity covariance
        let mut cov = [[0f64; 3]; 3];
        for r in x.chunks(d) {
            let mut y = [0f32; 3];
            for i in 0..d {
                for j in 0..d {
                    y[j] += (r[i] - w.mean[i]) * w.proj[i * d + j];
                }
            }
            for i in 0..3 {
                for j in 0..3 {
                    cov[i][j] += (y[i] * y[j]) as f64 / (n - 1) as f64;
                }
            }
        }
        for (i, row) in cov.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                let e = if i == j { 1.0 } else { 0.0 };
                assert!((v - e).abs() < 1e-3, "cov[{i}][{j}] = {v}");
            }
        }
        let out = w.apply(&x[..3]);
        assert!((out.iter().map(|v| v * v).sum::<f32>() - 1.0).abs() < 1e-5);
        let rows = w.apply_rows(&x[..9]);
        assert!(
            rows[..3]
                .iter()
                .zip(&out)
                .all(|(a, b)| (a - b).abs() < 1e-5),
            "row and batch paths agree"
        );
    }

    #[test]
    fn batch_product_matches_the_row_path_with_reduction() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let (n, d) = (300, 24);
        let x: Vec<f32> = (0..n * d).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let w = Whitening::learn(&x, d, 1e-3, Some(10)).unwrap();
        let rows = w.apply_rows(&x[..37 * d]);
        assert_eq!(rows.len(), 37 * 10);
        for (i, got) in rows.chunks(10).enumerate() {
            let want = w.apply(&x[i * d..(i + 1) * d]);
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "row {i}: {a} vs {b}");
            }
        }
        assert!(w.apply_rows(&[]).is_empty());
    }

    #[test]
    fn dimension_reduction_keeps_leading_components() {
        let x = [1.0, 0.0, -1.0, 0.0, 0.0, 0.1, 0.0, -0.1];
        let w = Whitening::learn(&x, 2, 1e-3, Some(1)).unwrap();
        assert_eq!(w.dim_out, 1);
        // the leading component is the first axis
        assert!(w.proj[0].abs() > 100.0 * w.proj[1].abs());
    }

    #[test]
    fn too_few_samples_is_an_error() {
        assert!(Whitening::learn(&[1.0, 0.0], 2, 1e-3, None).is_err());
    }

    /// Views of instances whose identity lives in dimensions 0-5 and whose nuisance (what
    /// changes between two views of one instance) is strong in dimension 6.
    fn two_views(n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut g = |s: f32| rng.gen_range(-1.0f32..1.0) * s;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let id: Vec<f32> = (0..8)
                .map(|k| g([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.05, 0.3][k]))
                .collect();
            for view in [&mut a, &mut b] {
                let nuisance: Vec<f32> = (0..8)
                    .map(|k| g([0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 3.0, 0.3][k]))
                    .collect();
                view.extend(id.iter().zip(nuisance).map(|(i, n)| i + n));
            }
        }
        (a, b)
    }

    /// How often view `a` of an instance finds its own view `b` first by cosine after `w`.
    fn top1(w: &Whitening, a: &[f32], b: &[f32]) -> f64 {
        let (wa, wb) = (w.apply_rows(a), w.apply_rows(b));
        let d = w.dim_out;
        let n = a.len() / w.dim_in;
        let hits = (0..n)
            .filter(|&i| {
                let q = &wa[i * d..(i + 1) * d];
                let best = (0..n)
                    .map(|j| {
                        (
                            j,
                            q.iter()
                                .zip(&wb[j * d..(j + 1) * d])
                                .map(|(x, y)| x * y)
                                .sum::<f32>(),
                        )
                    })
                    .fold((0, f32::MIN), |m, (j, s)| if s > m.1 { (j, s) } else { m });
                best.0 == i
            })
            .count();
        hits as f64 / n as f64
    }

    #[test]
    fn pair_whitening_suppresses_what_changes_between_views() {
        let d = 8;
        let (a, b) = two_views(400, 5);
        let samples: Vec<f32> = a.iter().chain(&b).copied().collect();
        let diffs: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x - y).collect();
        let pca = Whitening::learn(&samples, d, 1e-3, None).unwrap();
        let pairs = Whitening::learn_from_pairs(&samples, &diffs, d, 1e-3, 1.0, None).unwrap();
        pairs.validate().unwrap();
        // measured on new instances, not the ones it learned from
        let (qa, qb) = two_views(300, 6);
        let (p, q) = (top1(&pca, &qa, &qb), top1(&pairs, &qa, &qb));
        assert!(q > p + 0.2, "pairs {q} vs PCA {p}");
        // blend 0 is PCA whitening: the same rankings
        let blend0 = Whitening::learn_from_pairs(&samples, &diffs, d, 1e-3, 0.0, None).unwrap();
        assert!((top1(&blend0, &qa, &qb) - p).abs() < 1e-9);
        // a dimension cut keeps the leading components
        let cut = Whitening::learn_from_pairs(&samples, &diffs, d, 1e-3, 0.5, Some(2)).unwrap();
        assert_eq!((cut.dim_out, cut.proj.len()), (2, 16));
        assert!(Whitening::learn_from_pairs(&samples, &diffs, d, 1e-3, 1.5, None).is_err());
    }
}
