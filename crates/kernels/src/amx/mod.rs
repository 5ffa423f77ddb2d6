//! Matrix products on Intel AMX tiles (int8 and bf16), used at [`Level::Amx`].
//!
//! Owns: detecting AMX and asking the operating system for the tile state, packing the
//! right-hand operand of int8 products into tile layout (bf16 weights come packed by `bf16`,
//! in a layout both of its kernels read), and the tile loops (inline assembly: the AMX
//! intrinsics are not stable Rust).
//!
//! Every product runs in tiles of 16 rows x 64 bytes (16 x 64 int8, 16 x 32 bf16), four
//! accumulators of 16 x 16 lanes, i.e. 32 x 32 outputs per pass over the shared dimension.
//! Tile state is per thread: each call loads the tile configuration and releases it on
//! return, so calls may run on any thread of any pool.

use crate::bf16::PackedBf16;
use crate::level::{active, Level};

#[cfg(target_arch = "x86_64")]
mod tiles;

const TILE_ROWS: usize = 16;
/// Bytes in one tile row: 64 int8 or 32 bf16 of the shared dimension.
const TILE_BYTES: usize = 64;

/// Whether the tile kernels run here: the active level is [`Level::Amx`] (AMX present, tile
/// state granted, and not capped by `CRATERDEX_KERNEL`).
pub fn available() -> bool {
    active() == Level::Amx
}

/// Whether the CPU has AMX int8 and bf16 tiles (CPUID leaf 7).
pub(crate) fn cpu_has_amx() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        tiles::cpu_has_amx()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Asks Linux for the tile data state (once per process); false where it is refused.
pub(crate) fn request_tile_state() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        tiles::request_tile_state()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The right-hand side of int8 products `A B^T`: `B` is `[n, k]` row-major (e.g. a query's
/// tokens), packed once into tiles. `k` must be a multiple of 64 (see [`PackedI8::fits`]).
#[derive(Clone, Debug)]
pub struct PackedI8 {
    /// `[col_blocks][k_blocks]` tiles of 16 rows (groups of 4 along k) x 16 columns x 4 bytes.
    tiles: Vec<i8>,
    n: usize,
    k: usize,
}

impl PackedI8 {
    /// Whether a shared dimension `k` can use the int8 tile kernel (rows of `A` are read in
    /// whole 64-byte steps).
    pub fn fits(k: usize) -> bool {
        k > 0 && k.is_multiple_of(TILE_BYTES)
    }

    pub fn new(b: &[i8], n: usize, k: usize) -> Self {
        assert!(
            Self::fits(k),
            "int8 tile products need k a multiple of 64, got {k}"
        );
        assert_eq!(b.len(), n * k, "B must be [n, k]");
        let col_blocks = n.div_ceil(TILE_ROWS);
        let k_blocks = k / TILE_BYTES;
        let mut tiles = vec![0i8; col_blocks * k_blocks * TILE_ROWS * TILE_BYTES];
        for (j, row) in b.chunks_exact(k).enumerate() {
            let (cb, c) = (j / TILE_ROWS, j % TILE_ROWS);
            for (kb, chunk) in row.chunks_exact(TILE_BYTES).enumerate() {
                let tile = &mut tiles[(cb * k_blocks + kb) * TILE_ROWS * TILE_BYTES..];
                for (r, quad) in chunk.chunks_exact(4).enumerate() {
                    tile[r * TILE_BYTES + c * 4..][..4].copy_from_slice(quad);
                }
            }
        }
        Self { tiles, n, k }
    }

    /// Output columns per row: `n` rounded up to 16 (the padding columns are zero).
    pub fn columns(&self) -> usize {
        self.n.div_ceil(TILE_ROWS) * TILE_ROWS
    }
}

/// `out[m, columns] = A B^T` in exact int32 arithmetic, `A` `[m, k]` row-major int8.
/// Panics when [`available`] is false or the shapes disagree.
pub fn i8_products(a: &[i8], m: usize, b: &PackedI8, out: &mut [i32]) {
    assert_eq!(a.len(), m * b.k, "A must be [m, k]");
    i8_products_of_parts(&[a], b, out);
}

/// [`i8_products`] for several separate row blocks of A (e.g. scattered documents) in one
/// call: `out` holds their outputs one after another, `[sum m_i, columns]`.
pub fn i8_products_of_parts(parts: &[&[i8]], b: &PackedI8, out: &mut [i32]) {
    assert!(available(), "AMX tiles are not available");
    let mut rows = 0;
    for a in parts {
        assert!(a.len().is_multiple_of(b.k), "each part must be [m, k]");
        rows += a.len() / b.k;
    }
    assert_eq!(out.len(), rows * b.columns(), "out must be [rows, columns]");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: shapes checked above; tiles are available.
    unsafe {
        tiles::i8_products(parts, b, out)
    }
}

/// `out[m, n] += A W` on the tiles: `a16` is `[m, kp]` bf16 with `kp` the packed weight's
/// padded depth. Panics when [`available`] is false or the shapes disagree.
pub(crate) fn bf16_tile_products(
    a16: &[u16],
    m: usize,
    kp: usize,
    w: &PackedBf16,
    out: &mut [f32],
) {
    assert!(available(), "AMX tiles are not available");
    assert_eq!(kp, w.padded_k(), "A's rows must have the packed depth");
    assert!(
        a16.len() >= m * kp && out.len() >= m * w.n,
        "A [m, kp] and out [m, n]"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: shapes checked above; tiles are available.
    unsafe {
        tiles::bf16_matmul_acc(a16, m, kp, w, out)
    }
}
