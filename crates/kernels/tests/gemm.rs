//! The packed matrix products at every level this CPU supports: f32 against f64 references
//! (strided operands, both packings, accumulation), int8 linear layers bit-identical across
//! levels, exact against an integer reference and close to f32.

use craterdex_kernels::gemm::{self, PackedF32, NB};
use craterdex_kernels::level::{self, Level};
use craterdex_kernels::linear_i8::{self, PackedI8Linear};
use rand::{Rng, SeedableRng};

fn levels() -> Vec<Level> {
    level::supported()
}

fn randn(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// (m, k, n): rows around the register blocks, widths around the 32-column blocks.
const SHAPES: [(usize, usize, usize); 8] = [
    (1, 1, 1),
    (7, 13, 33),
    (16, 64, 32),
    (37, 384, 70),
    (6, 588, 384),
    (25, 100, 5),
    (3, 4, 64),
    // more rows than one task takes, a depth of several slices (f32) and many groups (int8)
    (203, 1536, 48),
];

#[test]
fn f32_products_match_f64_on_every_level() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    for (m, k, n) in SHAPES {
        let (lda, ldo) = (k + 3, n + 5);
        let a = randn(&mut rng, m * lda);
        let b = randn(&mut rng, k * n);
        let prior = randn(&mut rng, m * ldo);
        let want = |r: usize, j: usize| -> f64 {
            (0..k)
                .map(|i| a[r * lda + i] as f64 * b[i * n + j] as f64)
                .sum()
        };
        let bt: Vec<f32> = (0..n)
            .flat_map(|j| (0..k).map(move |i| (i, j)))
            .map(|(i, j)| b[i * n + j])
            .collect();
        for l in levels() {
            for (packed, how) in [
                (PackedF32::from_kn_at(l, &b, k, n), "kn"),
                (PackedF32::from_columns(&bt, n, k, k), "columns"),
            ] {
                for accumulate in [false, true] {
                    let mut out = prior.clone();
                    gemm::matmul_f32(&a, m, lda, &packed, &mut out, ldo, accumulate);
                    for r in 0..m {
                        for j in 0..n {
                            let base = if accumulate {
                                prior[r * ldo + j] as f64
                            } else {
                                0.0
                            };
                            let got = out[r * ldo + j] as f64;
                            assert!(
                                (got - base - want(r, j)).abs() < 1e-4 * (k as f64).sqrt(),
                                "{l} {how} m{m} k{k} n{n} ({r},{j}) acc {accumulate}: {got} vs {}",
                                base + want(r, j)
                            );
                        }
                        // columns past n untouched
                        for j in n..ldo {
                            assert_eq!(out[r * ldo + j], prior[r * ldo + j]);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn int8_linear_layers_are_identical_on_every_level_exact_and_close_to_f32() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
    for (m, k, n) in SHAPES {
        let x: Vec<f32> = (0..m * k)
            .map(|i| rng.gen_range(-1.0f32..1.5) + (i % 3) as f32 * 0.1)
            .collect();
        let w = randn(&mut rng, k * n);
        let bias = randn(&mut rng, n);
        let mut reference: Option<Vec<f32>> = None;
        for l in levels() {
            let packed = PackedI8Linear::with_level(&w, k, n, l);
            let mut out = vec![f32::NAN; m * n];
            linear_i8::linear_i8(&x, m, &packed, &bias, &mut out);
            match &reference {
                None => reference = Some(out),
                Some(r) => assert_eq!(&out, r, "{l} m{m} k{k} n{n}"),
            }
        }
        let got = reference.unwrap();
        let mut f = vec![0f32; m * n];
        gemm::linear_f32(&x, m, &PackedF32::from_kn(&w, k, n), &bias, &mut f);
        // 8-bit codes per group: errors grow like sqrt(k) of the codes' steps
        for (i, (a, b)) in got.iter().zip(&f).enumerate() {
            assert!(
                (a - b).abs() < 0.02 * (k as f32).sqrt() + 1e-3,
                "m{m} k{k} n{n} [{i}]: {a} vs {b}"
            );
        }
    }
}

/// A map quantised once (into a reused buffer) and multiplied a run of rows at a time (a
/// convolution's taps) adds exactly what the int8 linear layer gives those rows, on every
/// level; the same rows gathered a few at a time (a concatenation's parts) give the same
/// sums.
#[test]
fn int8_products_of_quantised_runs_add_the_linear_layers_rows() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
    // one buffer refilled for every map, larger and smaller, deeper and shallower
    let mut rows = linear_i8::I8Rows::default();
    let mut gathered = linear_i8::I8Rows::default();
    for (m, k, n) in [
        (700, 64, 32),
        (613, 96, 64),
        (1100, 192, 33),
        (40, 384, 128),
    ] {
        let x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(0.0f32..2.0)).collect();
        let w = randn(&mut rng, k * n);
        let zero = vec![0f32; n];
        for l in levels() {
            let packed = PackedI8Linear::with_level(&w, k, n, l);
            linear_i8::requantise(&x, m, &packed, &mut rows);
            assert_eq!(rows.rows(), m);
            linear_i8::requantise_gathered(m, &packed, &mut gathered, |first, values| {
                assert_eq!(values.len() % k, 0);
                values.copy_from_slice(&x[first * k..first * k + values.len()]);
            });
            assert_eq!(gathered.rows(), m);
            // stale values in the scratch space must not reach the outputs
            let mut scratch = vec![f32::NAN; m * n + n];
            for (first, run) in [(0, m), (3, m - 3 - 5), (m / 2, m / 3)] {
                let prior = randn(&mut rng, run * n);
                let mut got = prior.clone();
                linear_i8::products_acc_i8(&rows, first, run, &packed, &mut got, &mut scratch);
                let mut from_gathered = prior.clone();
                let g = &gathered;
                linear_i8::products_acc_i8(
                    g,
                    first,
                    run,
                    &packed,
                    &mut from_gathered,
                    &mut scratch,
                );
                assert_eq!(from_gathered, got, "{l} m{m} k{k} n{n} first {first}");
                let mut layer = vec![f32::NAN; run * n];
                linear_i8::linear_i8(&x[first * k..], run, &packed, &zero, &mut layer);
                for (i, (g, (p, y))) in got.iter().zip(prior.iter().zip(&layer)).enumerate() {
                    assert_eq!(*g, p + y, "{l} m{m} k{k} n{n} first {first} [{i}]");
                }
            }
        }
    }
}

/// A linear layer added to a residual stream matches the layer's output added afterwards,
/// on every level.
#[test]
fn residual_linear_adds_the_layer_to_what_the_rows_hold() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
    for (m, k, n) in SHAPES {
        let x = randn(&mut rng, m * k);
        let w = randn(&mut rng, k * n);
        let bias = randn(&mut rng, n);
        let stream = randn(&mut rng, m * n);
        for l in levels() {
            let packed = PackedF32::from_kn_at(l, &w, k, n);
            let mut layer = vec![f32::NAN; m * n];
            gemm::linear_f32(&x, m, &packed, &bias, &mut layer);
            let mut got = stream.clone();
            gemm::linear_f32_residual(&x, m, &packed, &bias, &mut got);
            for (i, (g, (s, y))) in got.iter().zip(stream.iter().zip(&layer)).enumerate() {
                assert!(
                    (g - (s + y)).abs() < 1e-5 * (k as f32).sqrt(),
                    "{l} m{m} k{k} n{n} [{i}]: {g} vs {}",
                    s + y
                );
            }
        }
    }
}

/// The int8 path against the documented quantisation done by hand in integers and f64:
/// activations per row and group of 64, asymmetric with codes 0..=254; weights per column,
/// symmetric 8-bit.
#[test]
fn int8_linear_is_the_documented_quantisation() {
    let (m, k, n) = (5, 150, NB + 3);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let x = randn(&mut rng, m * k);
    let w = randn(&mut rng, k * n);
    let bias = vec![0.0; n];
    let mut out = vec![0f32; m * n];
    linear_i8::linear_i8(&x, m, &PackedI8Linear::new(&w, k, n), &bias, &mut out);
    let round = |v: f32| v.round_ties_even();
    for r in 0..m {
        for j in 0..n {
            let mut want = 0f64;
            for g0 in (0..k).step_by(linear_i8::GROUP) {
                let g1 = (g0 + linear_i8::GROUP).min(k);
                let part = &x[r * k + g0..r * k + g1];
                let lo = part.iter().fold(0f32, |a, &v| a.min(v));
                let hi = part.iter().fold(0f32, |a, &v| a.max(v));
                let s = (hi - lo) / 254.0;
                let z = round(-lo / s).clamp(0.0, 254.0);
                let max = (0..k).fold(0f32, |a, i| a.max(w[i * n + j].abs()));
                let sw = max / 127.0;
                let dot: i64 = (g0..g1)
                    .map(|i| {
                        let a = (round(x[r * k + i] / s) + z).clamp(0.0, 254.0) as i64 - z as i64;
                        let b = round(w[i * n + j] / sw).clamp(-127.0, 127.0) as i64;
                        a * b
                    })
                    .sum();
                want += dot as f64 * s as f64 * sw as f64;
            }
            assert!(
                (out[r * n + j] as f64 - want).abs() < 1e-4,
                "({r},{j}) {} vs {want}",
                out[r * n + j]
            );
        }
    }
}

#[test]
fn strided_packings_keep_every_value() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(6);
    for (_, k, n) in SHAPES {
        let b = randn(&mut rng, k * n);
        let rows: Vec<f32> = b
            .chunks_exact(n)
            .flat_map(|r| r.iter().copied().chain([f32::NAN; 7]))
            .collect();
        assert_eq!(
            PackedF32::from_rows(&rows, k, n, n + 7).unpack(),
            b,
            "rows k{k} n{n}"
        );
        let columns: Vec<f32> = (0..n)
            .flat_map(|j| (0..k).map(move |i| (i, j)))
            .map(|(i, j)| b[i * n + j])
            .collect::<Vec<_>>()
            .chunks_exact(k)
            .flat_map(|c| c.iter().copied().chain([f32::NAN; 5]))
            .collect();
        assert_eq!(
            PackedF32::from_columns(&columns, n, k, k + 5).unpack(),
            b,
            "columns k{k} n{n}"
        );
    }
}

/// One packing refilled shape after shape (as attention reuses a thread's buffers from head
/// to head) multiplies exactly as a fresh packing of each: no value of an earlier, larger
/// shape survives in the padding.
#[test]
fn refilled_packings_multiply_as_fresh_ones() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut by_rows = PackedF32::from_rows(&[], 0, 0, 0);
    let mut by_columns = PackedF32::from_columns(&[], 0, 0, 0);
    for (m, k, n) in SHAPES.iter().rev().chain(SHAPES.iter()).copied() {
        let b = randn(&mut rng, k * n);
        let bt: Vec<f32> = (0..n)
            .flat_map(|j| (0..k).map(move |i| (i, j)))
            .map(|(i, j)| b[i * n + j])
            .collect();
        let a = randn(&mut rng, m * k);
        by_rows.refill_from_rows(&b, k, n, n);
        by_columns.refill_from_columns(&bt, n, k, k);
        let product = |p: &PackedF32| {
            let mut out = vec![f32::NAN; m * n];
            gemm::matmul_f32(&a, m, k, p, &mut out, n, false);
            out
        };
        let fresh = product(&PackedF32::from_kn(&b, k, n));
        assert_eq!(product(&by_rows), fresh, "rows m{m} k{k} n{n}");
        assert_eq!(product(&by_columns), fresh, "columns m{m} k{k} n{n}");
    }
}
