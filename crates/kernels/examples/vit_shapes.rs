//! GFLOP/s of the f32 and int8 kernels (and the bf16 ones, where the CPU has bf16 hardware) on the shapes of one ViT-S/14 block over a batch of 16 images
//! at 224 px (4,112 rows): the four linear layers and the attention, best of 30 runs each, on
//! the threads of the global pool (`RAYON_NUM_THREADS`) and the level of `CRATERDEX_KERNEL`.
//! A tuning aid for the kernels' blocking; `craterdex bench extract` times the whole pass.

use craterdex_kernels::attention::{self, multi_head, multi_head_with, Products};
use craterdex_kernels::bf16::{self, linear_bf16, PackedBf16};
use craterdex_kernels::gemm::{linear_f32, PackedF32};
use craterdex_kernels::linear_i8::{linear_i8, PackedI8Linear};
use std::time::Instant;

fn best_seconds(mut run: impl FnMut()) -> f64 {
    (0..30)
        .map(|_| {
            let start = Instant::now();
            run();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919 + seed) % 1013) as f32 / 506.5 - 1.0)
        .collect()
}

/// `vit_shapes [NAME]`: only the shape NAME (qkv, proj, fc1, fc2, attention) when given.
fn main() {
    let only = std::env::args().nth(1);
    let wanted = |name: &str| only.as_deref().is_none_or(|o| o == name);
    let (images, tokens, d, heads) = (16, 257, 384, 6);
    let m = images * tokens;
    println!("{}", craterdex_kernels::level::describe());
    for (name, k, n) in [
        ("qkv", d, 3 * d),
        ("proj", d, d),
        ("fc1", d, 4 * d),
        ("fc2", 4 * d, d),
    ] {
        if !wanted(name) {
            continue;
        }
        let x = values(m * k, 1);
        let w = PackedF32::from_kn(&values(k * n, 2), k, n);
        let bias = values(n, 3);
        let mut out = vec![0f32; m * n];
        let secs = best_seconds(|| linear_f32(&x, m, &w, &bias, &mut out));
        let gflops = 2.0 * (m * k * n) as f64 / secs / 1e9;
        println!(
            "{name:>9} [{m} x {k}] x [{k} x {n}]: {:7.2} ms {gflops:6.1} GFLOP/s",
            secs * 1e3
        );
        if bf16::available() {
            let w = PackedBf16::new(&values(k * n, 2), k, n);
            let secs = best_seconds(|| linear_bf16(&x, m, &w, &bias, &mut out, false));
            let gflops = 2.0 * (m * k * n) as f64 / secs / 1e9;
            println!("{:>9} bf16: {:7.2} ms {gflops:6.1} GFLOP/s", "", secs * 1e3);
        }
        let w = PackedI8Linear::new(&values(k * n, 2), k, n);
        let secs = best_seconds(|| linear_i8(&x, m, &w, &bias, &mut out));
        let gops = 2.0 * (m * k * n) as f64 / secs / 1e9;
        println!("{:>9} int8: {:7.2} ms {gops:6.1} GOP/s", "", secs * 1e3);
    }
    if !wanted("attention") {
        return;
    }
    let qkv = values(m * 3 * d, 4);
    let mut out = vec![0f32; m * d];
    let mut cls = vec![0f32; images * (tokens - 1)];
    let secs =
        best_seconds(|| multi_head(&qkv, images, tokens, d, heads, &mut out, Some(&mut cls)));
    let gflops = 4.0 * (images * tokens * tokens * d) as f64 / secs / 1e9;
    println!(
        "attention {images} x {heads} heads of {tokens} tokens: {:7.2} ms {gflops:6.1} GFLOP/s",
        secs * 1e3
    );
    if attention::runs(Products::Bf16, d, heads) {
        let secs = best_seconds(|| {
            multi_head_with(
                Products::Bf16,
                &qkv,
                images,
                tokens,
                d,
                heads,
                &mut out,
                Some(&mut cls),
            )
        });
        let gflops = 4.0 * (images * tokens * tokens * d) as f64 / secs / 1e9;
        println!("{:>9} bf16: {:7.2} ms {gflops:6.1} GFLOP/s", "", secs * 1e3);
    }
}
