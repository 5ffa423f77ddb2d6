//! craterdex-kernels: every SIMD, AMX and matrix-product kernel of craterdex, with its
//! run-time dispatch, behind a safe API.
//!
//! Owns: the kernel [`Level`]s (portable, AVX2 + FMA, AVX-512, AMX), detected once per
//! process and capped by `CRATERDEX_KERNEL`; dot products, late interaction (MaxSim) and
//! query-by-row products on f32 and on int8 codes (`f32`, `int8`); matrix products with a
//! packed right-hand side and the f32 and int8 linear layers of the ViT (`gemm`); the ViT's
//! element-wise and row-wise maps (`nn`); multi-head attention over fused q|k|v rows
//! (`attention`); the int8 quantiser; nearest-centroid search for product quantisation
//! (`pq`); bf16 linear layers and convolutions on AVX-512 BF16 or AMX (`bf16`); AMX tile
//! products (`amx`); 3x3 and 2x2 convolutions by Winograd's F(4x4, 3x3) and F(3x3, 2x2)
//! blocks (`winograd`). Knows nothing of images, models, descriptors or indexes: callers pass
//! plain row-major slices.
//!
//! Results are identical across levels wherever the arithmetic is exact (every int8 path),
//! and differ only by the order of f32 additions elsewhere (bounded in the tests).

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod aligned;
pub mod amx;
pub mod attention;
pub mod bf16;
pub mod f32;
pub mod gemm;
mod i8_block;
pub mod int8;
pub mod level;
pub mod linear_i8;
pub mod nn;
pub mod pq;
#[cfg(target_arch = "x86_64")]
mod simd;
pub mod winograd;

pub use level::{active, detected, Level};
