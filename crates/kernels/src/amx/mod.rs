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

use crate::aligned::Aligned;
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

/// Whether the tile kernels can run here at all: the CPU has AMX and the tile state was
/// granted (what their safety rests on). Kernels packed for [`Level::Amx`] on purpose run
/// on the tiles even where `CRATERDEX_KERNEL` caps the default level below it.
fn granted() -> bool {
    crate::level::detected() == Level::Amx
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
    tiles: Aligned<i8>,
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
        let mut tiles = Aligned::zeroed(col_blocks * k_blocks * TILE_ROWS * TILE_BYTES);
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

    /// Where the tiles of column block `cb` (columns `16 cb..16 cb + 16`) begin; the next
    /// block's follow [`PackedI8::column_block_bytes`] later.
    pub(crate) fn column_block(&self, cb: usize) -> *const i8 {
        assert!(cb < self.columns() / TILE_ROWS);
        self.tiles[cb * self.column_block_bytes()..].as_ptr()
    }

    /// Bytes of one column block's tiles: one tile per 64 bytes of the shared dimension.
    pub(crate) fn column_block_bytes(&self) -> usize {
        self.k / TILE_BYTES * TILE_ROWS * TILE_BYTES
    }
}

/// The tile configuration loaded on this thread for as long as it lives (tile state is per
/// thread): what [`Tiles::i8_slice_block`] runs under. Not `Send`: it must be dropped on the
/// thread that made it.
pub(crate) struct Tiles {
    #[cfg(target_arch = "x86_64")]
    _configured: tiles::Configured,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Tiles {
    /// Panics where the tiles are not granted.
    pub(crate) fn configure() -> Self {
        Self::configure_rows(TILE_ROWS)
    }

    /// The tiles with blocks of `rows` rows of A (1..=16) instead of 16: the last rows of a
    /// product, read and written in place. Panics where the tiles are not granted.
    pub(crate) fn configure_rows(rows: usize) -> Self {
        assert!(granted(), "AMX tiles are not available");
        Self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the tiles are available (checked above).
            _configured: unsafe { tiles::Configured::with_rows(rows) },
            _not_send: std::marker::PhantomData,
        }
    }

    /// One 64-byte slice `s` of the shared dimension of int8 products: rows `a` (the
    /// configured rows, or twice them with `two_rows`; `lda` bytes apart, each holding the
    /// slice's 64 bytes) against column block `cb` of `b` (and `cb + 1` with `two_columns`),
    /// the int32 products stored into `out`, 32 a row (rows and columns past the block's are
    /// left as they were).
    ///
    /// # Safety
    /// `a` must point at that many readable rows of 64 bytes, `lda` apart (`two_rows` only
    /// with 16 configured rows); `cb` (and `cb + 1`) and `s` must lie in `b`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn i8_slice_block(
        &self,
        two_rows: bool,
        two_columns: bool,
        a: *const i8,
        lda: usize,
        b: &PackedI8,
        cb: usize,
        s: usize,
        out: &mut [[i32; 32]; 32],
    ) {
        assert!(s < b.k / TILE_BYTES && (!two_columns || cb + 1 < b.columns() / TILE_ROWS));
        #[cfg(target_arch = "x86_64")]
        // SAFETY: A per the caller; B's block (and the next) checked above; out holds 32 rows
        // of 32 int32; the tiles are configured on this thread (self).
        unsafe {
            tiles::i8_slice_block(
                two_rows,
                two_columns,
                a,
                lda,
                b.column_block(cb).add(s * TILE_ROWS * TILE_BYTES),
                b.column_block_bytes(),
                out.as_mut_ptr().cast(),
            )
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (two_rows, two_columns, a, lda, out);
    }
}

/// `out[m, columns] = A B^T` in exact int32 arithmetic, `A` `[m, k]` row-major int8.
/// Panics where the tiles are not granted or the shapes disagree.
pub fn i8_products(a: &[i8], m: usize, b: &PackedI8, out: &mut [i32]) {
    assert_eq!(a.len(), m * b.k, "A must be [m, k]");
    i8_products_of_parts(&[a], b, out);
}

/// [`i8_products`] for several separate row blocks of A (e.g. scattered documents) in one
/// call: `out` holds their outputs one after another, `[sum m_i, columns]`.
pub fn i8_products_of_parts(parts: &[&[i8]], b: &PackedI8, out: &mut [i32]) {
    assert!(granted(), "AMX tiles are not available");
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

/// `out[m, n] = start + A W` on the tiles: `a16` is `[m, kp]` bf16 with `kp` the packed
/// weight's padded depth. Panics where the tiles are not granted or the shapes disagree.
pub(crate) fn bf16_tile_products(
    a16: &[u16],
    m: usize,
    kp: usize,
    w: &PackedBf16,
    start: Start,
    out: &mut [f32],
) {
    assert_eq!(kp, w.padded_k(), "A's rows must have the packed depth");
    let per_row = kp * 2 / TILE_BYTES;
    bf16_conv_products(a16, m, (kp, 0, per_row), w, start, out)
}

/// Runs `each(tiles, r, rows, two_rows)` over `m` rows in blocks of 32 (`two_rows`), then 16,
/// then the last rows, with the tiles configured for each block's rows: the last rows under a
/// configuration of that many rows, read and written in place (no padded copies).
pub(crate) fn for_row_blocks(m: usize, mut each: impl FnMut(&Tiles, usize, usize, bool)) {
    let mut configured = Some(Tiles::configure());
    let mut r = 0;
    while r < m {
        let (rows, two_rows) = match m - r {
            32.. => (32, true),
            16..32 => (16, false),
            tail => {
                // the 16-row configuration released before the tail's is loaded
                drop(configured.take());
                configured = Some(Tiles::configure_rows(tail));
                (tail, false)
            }
        };
        each(
            configured.as_ref().expect("configured above"),
            r,
            rows,
            two_rows,
        );
        r += rows;
    }
}

/// Where the sums of bf16 tile products start.
#[derive(Clone, Copy)]
pub(crate) enum Start<'a> {
    /// One bias per output column.
    Bias(&'a [f32]),
    /// What the outputs hold: the products are added to it.
    Out,
}

/// `out[r * n + j] = start + sum_s A_s[r] W[s][j]` for the `m` rows of one convolution run,
/// on the tiles: A's 64-byte slice `s` of row `r` at `a16[r * lda + (s / per_row) * row_step + (s %
/// per_row) * 32]` (a kernel row's pixels side by side, the next kernel row `row_step` values
/// on), W packed over all the slices. Blocks of 32 rows (16 at the end, then the last rows with
/// tiles of that many rows) and 32 columns keep their sums in the tiles over every slice.
/// Panics where the tiles are not granted or the shapes disagree.
pub(crate) fn bf16_conv_products(
    a16: &[u16],
    m: usize,
    (lda, row_step, per_row): (usize, usize, usize),
    w: &PackedBf16,
    start: Start,
    out: &mut [f32],
) {
    assert!(granted(), "AMX tiles are not available");
    let (kp, n) = (w.padded_k(), w.n);
    if let Start::Bias(bias) = start {
        assert_eq!(bias.len(), n, "one bias per output");
    }
    let slices = kp * 2 / TILE_BYTES;
    assert!(per_row > 0 && slices.is_multiple_of(per_row) && out.len() >= m * n);
    if m == 0 {
        return;
    }
    // the last row's last slice
    let reach = (m - 1) * lda + (slices / per_row - 1) * row_step + per_row * TILE_BYTES / 2;
    assert!(reach <= a16.len(), "the run reads past A");
    let col_blocks = n / TILE_ROWS;
    let b_next = kp * TILE_ROWS * 2;
    #[cfg(target_arch = "x86_64")]
    for_row_blocks(m, |_tiles, r, _rows, two_rows| {
        for cb in (0..col_blocks).step_by(2) {
            let o = out[r * n + cb * TILE_ROWS..].as_mut_ptr();
            let init = match start {
                // one row read for every row: stride 0
                Start::Bias(bias) => (bias[cb * TILE_ROWS..].as_ptr(), 0),
                Start::Out => (o.cast_const(), n * 4),
            };
            // SAFETY: the block's rows of every slice lie in a16 (reach, above); out holds m
            // rows of n >= 16 (cb + 2) or 16 (cb + 1) columns, the bias as many; W's column
            // blocks cb (and cb + 1) hold `slices` tiles; the tiles are configured for the
            // block's rows on this thread (_tiles).
            unsafe {
                tiles::bf16_conv_block(
                    two_rows,
                    cb + 1 < col_blocks,
                    a16.as_ptr().add(r * lda),
                    lda * 2,
                    (row_step * 2, per_row, slices),
                    w.data().as_ptr().add(cb * kp * TILE_ROWS),
                    b_next,
                    init,
                    o,
                    n * 4,
                )
            };
        }
    });
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (lda, row_step, b_next, col_blocks);
}
