//! craterdex-kernels: every SIMD, AMX and matrix-product kernel of craterdex, with its
//! run-time dispatch, behind a safe API.
//!
//! Owns: the kernel [`Level`]s (portable, AVX2 + FMA, AVX-512, AMX), detected once per
//! process and capped by `CRATERDEX_KERNEL`; dot products, late interaction (MaxSim) and
//! query-by-row products on f32 and on int8 codes; the int8 quantiser; nearest-centroid search
//! for product quantisation; element-wise maps; AMX tile products. Knows nothing of images,
//! models, descriptors or indexes: callers pass plain row-major slices.
//!
//! Results are identical across levels wherever the arithmetic is exact (every int8 path),
//! and differ only by the order of f32 additions elsewhere (bounded in the tests).

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod amx;
pub mod f32;
pub mod gemm;
pub mod int8;
pub mod level;
pub mod nn;
#[cfg(target_arch = "x86_64")]
mod simd;

pub use level::{active, detected, Level};
