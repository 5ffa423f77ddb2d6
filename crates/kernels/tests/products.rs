//! The AMX tile and bf16 kernels against plain loops, over shapes around the 16/32-row and
//! 16/32/64-column blocks. Skipped (with a message) on machines without the hardware.

use craterdex_kernels::amx::{available, i8_products, PackedI8};
use craterdex_kernels::bf16::{
    self, bf16_bits, bf16_matmul_acc_at, conv_rows_bf16_at, linear_bf16_at, PackedBf16,
    PackedConvBf16,
};
use rand::{Rng, SeedableRng};

/// Whether `test` must be skipped here: the tile kernels cannot run without AMX.
fn skip(test: &str) -> bool {
    if !available() {
        craterdex_testkit::skip(test, "no AMX tiles on this CPU (or CRATERDEX_NO_AMX set)");
        return true;
    }
    false
}

#[test]
fn int8_products_are_exact() {
    if skip("kernels::products::int8_products_are_exact") {
        return;
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    for (m, n, k) in [
        (1, 1, 64),
        (15, 16, 64),
        (16, 17, 128),
        (33, 32, 384),
        (70, 50, 192),
        (32, 5, 64),
    ] {
        let a: Vec<i8> = (0..m * k).map(|_| rng.gen_range(-127..=127)).collect();
        let b: Vec<i8> = (0..n * k).map(|_| rng.gen_range(-127..=127)).collect();
        let packed = PackedI8::new(&b, n, k);
        let cols = packed.columns();
        let mut out = vec![7i32; m * cols];
        i8_products(&a, m, &packed, &mut out);
        for i in 0..m {
            for j in 0..cols {
                let want: i32 = if j < n {
                    (0..k)
                        .map(|t| a[i * k + t] as i32 * b[j * k + t] as i32)
                        .sum()
                } else {
                    0
                };
                assert_eq!(out[i * cols + j], want, "m {m} n {n} k {k} at ({i}, {j})");
            }
        }
    }
}

/// Every level with a bf16 kernel here (AVX-512 BF16 dot products, AMX tiles) multiplies
/// the rounded inputs and adds to what `out` held, over shapes around the 6-row and
/// 16/64-column register blocks and depths that are not whole pairs or tiles.
#[test]
fn bf16_products_match_the_rounded_inputs_and_add_to_out() {
    let levels = bf16::levels();
    if levels.is_empty() {
        craterdex_testkit::skip(
            "kernels::products::bf16_products_match_the_rounded_inputs_and_add_to_out",
            "no bf16 hardware on this CPU (AVX-512 BF16 or AMX)",
        );
        return;
    }
    let round = |v: f32| f32::from_bits((bf16_bits(v) as u32) << 16);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
    for (m, k, n) in [
        (1, 1, 16),
        (17, 31, 32),
        (32, 32, 48),
        (7, 33, 80),
        (45, 588, 64),
        (64, 384, 16),
        (13, 1536, 128),
    ] {
        let a: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let w: Vec<f32> = (0..k * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let bias: Vec<f32> = (0..m * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let packed = PackedBf16::new(&w, k, n);
        for &level in &levels {
            let mut out = bias.clone();
            bf16_matmul_acc_at(level, &a, m, &packed, &mut out);
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = bias[i * n + j] as f64
                        + (0..k)
                            .map(|t| round(a[i * k + t]) as f64 * round(w[t * n + j]) as f64)
                            .sum::<f64>();
                    let got = out[i * n + j] as f64;
                    assert!(
                        (got - want).abs() < 1e-4 * (k as f64).sqrt(),
                        "{level}: m {m} k {k} n {n} at ({i}, {j}): {got} vs {want}"
                    );
                }
            }
        }
    }
}

/// A bf16 linear layer is its products plus the bias, written or added to a residual, the
/// same on every level that runs it (to the order of f32 additions), on more rows than one
/// task takes.
#[test]
fn bf16_linear_layers_add_the_bias_or_the_residual() {
    let levels = bf16::levels();
    if levels.is_empty() {
        craterdex_testkit::skip(
            "kernels::products::bf16_linear_layers_add_the_bias_or_the_residual",
            "no bf16 hardware on this CPU (AVX-512 BF16 or AMX)",
        );
        return;
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let (m, k, n) = (1000, 96, 64);
    let x: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let w: Vec<f32> = (0..k * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let bias: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let residual: Vec<f32> = (0..m * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let packed = PackedBf16::new(&w, k, n);
    let mut products = vec![0f32; m * n];
    bf16_matmul_acc_at(levels[0], &x, m, &packed, &mut products);
    for &level in &levels {
        let mut plain = vec![f32::NAN; m * n];
        linear_bf16_at(level, &x, m, &packed, &bias, &mut plain, false);
        let mut added = residual.clone();
        linear_bf16_at(level, &x, m, &packed, &bias, &mut added, true);
        for i in 0..m * n {
            let want = products[i] + bias[i % n];
            assert!(
                (plain[i] - want).abs() < 1e-4,
                "{level} at {i}: {} vs {want}",
                plain[i]
            );
            let want = want + residual[i];
            assert!(
                (added[i] - want).abs() < 1e-4,
                "{level} at {i}: {} vs {want}",
                added[i]
            );
        }
    }
}

/// A convolution by kernel rows in bf16 is the bias plus the products of the rounded map and
/// filters, whatever `out` held, on every level with a bf16 kernel: the U-Net's narrow and wide layers, a kernel
/// row that fills its slices exactly and one that is mostly padding, runs of one output row
/// longer than two tile blocks and of single pixels, and the map's last window.
#[test]
fn bf16_convolutions_by_kernel_rows_match_the_rounded_inputs() {
    let levels = bf16::levels();
    if levels.is_empty() {
        craterdex_testkit::skip(
            "kernels::products::bf16_convolutions_by_kernel_rows_match_the_rounded_inputs",
            "no bf16 hardware on this CPU (AVX-512 BF16 or AMX)",
        );
        return;
    }
    let round = |v: f32| f32::from_bits((bf16_bits(v) as u32) << 16);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
    // a buffer of stale NaNs (bf16 0xffff), reused from shape to shape: what lies past a map
    // must be zero, or products with the padding's zero weights would be NaN
    let mut map16 = vec![0xffffu16; 1 << 20];
    for (kh, kw, c, n) in [
        (3, 3, 16, 32),
        (3, 3, 32, 64),
        (3, 3, 96, 32),
        (3, 3, 64, 16),
        (2, 3, 8, 48),
        (1, 1, 64, 16),
    ] {
        let (h, width) = (kh + 3, 70);
        let x: Vec<f32> = (0..h * width * c)
            .map(|_| rng.gen_range(-1.0..2.0))
            .collect();
        let w: Vec<f32> = (0..kh * kw * c * n)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let packed = PackedConvBf16::new(&w, [kh, kw], c, n);
        let start = bf16::round_map(&x, x.len(), &mut map16);
        assert_eq!(map16[start..].as_ptr() as usize % 64, 0);
        let map16 = &map16[start..];
        let (oh, ow) = (h - kh + 1, width - kw + 1);
        for (first, m) in [
            (0, ow),
            (width + 3, ow - 5),
            (2 * width + 1, 1),
            (width * (oh - 1), ow),
        ] {
            let bias: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect();
            for &level in &levels {
                let mut out = vec![f32::NAN; m * n];
                conv_rows_bf16_at(level, map16, width, first, m, &packed, &bias, &mut out);
                for r in 0..m {
                    for j in 0..n {
                        let mut want = bias[j] as f64;
                        for i in 0..kh {
                            for t in 0..kw {
                                for ch in 0..c {
                                    let v = x[(first + r + i * width + t) * c + ch];
                                    let f = w[((i * kw + t) * c + ch) * n + j];
                                    want += round(v) as f64 * round(f) as f64;
                                }
                            }
                        }
                        let got = out[r * n + j] as f64;
                        let k = (kh * kw * c) as f64;
                        assert!(
                            (got - want).abs() < 1e-4 * k.sqrt(),
                            "{level} {kh}x{kw} c{c} n{n} run {first}+{r} [{j}]: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
