//! The tile kernels against plain loops, over shapes around the 16/32-row and 16/32-column
//! blocks. Skipped (with a message) on machines without AMX.

use craterdex_kernels::amx::{
    available, bf16_bits, bf16_matmul_acc, i8_products, PackedBf16, PackedI8,
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

#[test]
fn bf16_products_match_the_rounded_inputs_and_add_to_out() {
    if skip("kernels::products::bf16_products_match_the_rounded_inputs_and_add_to_out") {
        return;
    }
    let round = |v: f32| f32::from_bits((bf16_bits(v) as u32) << 16);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
    for (m, k, n) in [
        (1, 1, 16),
        (17, 31, 32),
        (32, 32, 48),
        (45, 588, 64),
        (64, 384, 16),
    ] {
        let a: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let w: Vec<f32> = (0..k * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let bias: Vec<f32> = (0..m * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let packed = PackedBf16::new(&w, k, n);
        let mut out = bias.clone();
        bf16_matmul_acc(&a, m, &packed, &mut out);
        for i in 0..m {
            for j in 0..n {
                let want: f64 = bias[i * n + j] as f64
                    + (0..k)
                        .map(|t| round(a[i * k + t]) as f64 * round(w[t * n + j]) as f64)
                        .sum::<f64>();
                let got = out[i * n + j] as f64;
                assert!(
                    (got - want).abs() < 1e-4 * (k as f64).sqrt(),
                    "m {m} k {k} n {n} at ({i}, {j}): {got} vs {want}"
                );
            }
        }
    }
}
