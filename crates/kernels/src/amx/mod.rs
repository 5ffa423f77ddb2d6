//! Matrix products on Intel AMX tiles (int8 and bf16), used at [`Level::Amx`].
//!
//! Owns: detecting AMX and asking the operating system for the tile state, packing the
//! right-hand operand into tile layout, and the tile loops (inline assembly: the AMX
//! intrinsics are not stable Rust).
//!
//! Every product runs in tiles of 16 rows x 64 bytes (16 x 64 int8, 16 x 32 bf16), four
//! accumulators of 16 x 16 lanes, i.e. 32 x 32 outputs per pass over the shared dimension.
//! Tile state is per thread: each call loads the tile configuration and releases it on
//! return, so calls may run on any thread of any pool.

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

/// The right-hand side of bf16 products `A W`: `W` is `[k, n]` row-major f32 (e.g. a linear
/// layer's weight), rounded to bf16 and packed once. `n` must be a multiple of 16; `k` is
/// padded with zeros to a multiple of 32.
#[derive(Clone, Debug)]
pub struct PackedBf16 {
    /// `[col_blocks][k_blocks]` tiles of 16 rows (pairs along k) x 16 columns x 2 bf16.
    tiles: Vec<u16>,
    k: usize,
    n: usize,
}

/// bf16 elements in one tile row.
const BF16_PER_ROW: usize = TILE_BYTES / 2;

impl PackedBf16 {
    pub fn fits(n: usize) -> bool {
        n > 0 && n.is_multiple_of(TILE_ROWS)
    }

    pub fn new(w: &[f32], k: usize, n: usize) -> Self {
        assert!(
            Self::fits(n),
            "bf16 tile products need n a multiple of 16, got {n}"
        );
        assert_eq!(w.len(), k * n, "W must be [k, n]");
        let k_blocks = k.div_ceil(BF16_PER_ROW);
        let col_blocks = n / TILE_ROWS;
        let tile_len = TILE_ROWS * BF16_PER_ROW;
        let mut tiles = vec![0u16; col_blocks * k_blocks * tile_len];
        for (kk, row) in w.chunks_exact(n).enumerate() {
            let (kb, r, half) = (kk / BF16_PER_ROW, (kk % BF16_PER_ROW) / 2, kk % 2);
            for (j, &v) in row.iter().enumerate() {
                let (cb, c) = (j / TILE_ROWS, j % TILE_ROWS);
                tiles[(cb * k_blocks + kb) * tile_len + r * BF16_PER_ROW + c * 2 + half] =
                    bf16_bits(v);
            }
        }
        Self { tiles, k, n }
    }

    fn padded_k(&self) -> usize {
        self.k.div_ceil(BF16_PER_ROW) * BF16_PER_ROW
    }
}

/// `f32` to `bf16` with round-to-nearest-even (NaN kept NaN).
pub fn bf16_bits(v: f32) -> u16 {
    let bits = v.to_bits();
    if v.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// `out[m, n] += A W` with `A` `[m, k]` f32 rounded to bf16 and f32 accumulation.
/// Panics when [`available`] is false or the shapes disagree.
pub fn bf16_matmul_acc(a: &[f32], m: usize, w: &PackedBf16, out: &mut [f32]) {
    assert!(available(), "AMX tiles are not available");
    assert_eq!(a.len(), m * w.k, "A must be [m, k]");
    assert_eq!(out.len(), m * w.n, "out must be [m, n]");
    let kp = w.padded_k();
    let mut a16 = vec![0u16; m * kp];
    for (dst, src) in a16.chunks_exact_mut(kp).zip(a.chunks_exact(w.k.max(1))) {
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, &s)| *d = bf16_bits(s));
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: shapes checked above; tiles are available.
    unsafe {
        tiles::bf16_matmul_acc(&a16, m, kp, w, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_is_nearest_even() {
        assert_eq!(bf16_bits(1.0), 0x3f80);
        // 1 + 2^-8 is half-way between bf16 1.0 and 1.0078125: ties go to the even 1.0
        assert_eq!(bf16_bits(1.0 + 1.0 / 256.0), 0x3f80);
        assert_eq!(bf16_bits(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(bf16_bits(-2.0), 0xc000);
        assert!(f32::from_bits((bf16_bits(f32::NAN) as u32) << 16).is_nan());
    }
}
