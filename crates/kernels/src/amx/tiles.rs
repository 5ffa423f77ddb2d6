//! The tile loops, in inline assembly (the AMX intrinsics are not stable Rust).
//!
//! Registers: tmm0-3 accumulate a 32 x 32 output block (2 x 2 tiles of 16 x 16), tmm4-5
//! hold two 16-row slices of A, tmm6-7 two 16-column slices of packed B. Tile registers
//! are invisible to the compiler, so they keep their values between the `asm!` blocks of
//! one call; nothing between them calls out of this module.

use super::{PackedI8, TILE_BYTES, TILE_ROWS};
use core::arch::asm;
use core::arch::x86_64::{__cpuid, __cpuid_count};

const TILE_LEN: usize = TILE_ROWS * TILE_BYTES;

pub fn cpu_has_amx() -> bool {
    if __cpuid(0).eax < 7 {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    let (bf16, tile, int8) = (edx >> 22 & 1, edx >> 24 & 1, edx >> 25 & 1);
    bf16 == 1 && tile == 1 && int8 == 1
}

/// Linux hands out the (8 KiB) tile data state only on request, once per process.
pub fn request_tile_state() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain system call with integer arguments.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

/// Palette 1, eight tiles of 16 rows x 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// Loads the tile configuration on this thread and releases the tiles when dropped.
pub(super) struct Configured;

impl Configured {
    pub(super) unsafe fn new() -> Self {
        // SAFETY: per the caller.
        unsafe { Self::with_rows(TILE_ROWS) }
    }

    /// The configuration with the accumulators (tmm0-3) and A's tiles (tmm4-5) `rows` rows
    /// tall (1..=16), B's (tmm6-7) whole: products of fewer than 16 rows of A, read and
    /// written in place.
    pub(super) unsafe fn with_rows(rows: usize) -> Self {
        assert!((1..=TILE_ROWS).contains(&rows));
        // SAFETY: ldtilecfg reads the 64-byte configuration above; the caller checked that
        // the tiles are available on this CPU and granted by the kernel.
        unsafe {
            let mut cfg = TileConfig {
                palette: 1,
                start_row: 0,
                reserved: [0; 14],
                colsb: [0; 16],
                rows: [0; 16],
            };
            for t in 0..8 {
                cfg.colsb[t] = TILE_BYTES as u16;
                cfg.rows[t] = if t < 6 { rows } else { TILE_ROWS } as u8;
            }
            asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
            Configured
        }
    }
}

impl Drop for Configured {
    fn drop(&mut self) {
        // SAFETY: only built after ldtilecfg succeeded on this thread.
        unsafe { asm!("tilerelease", options(nostack, nomem)) }
    }
}

macro_rules! tile_load {
    ($t:literal, $ptr:expr, $stride:expr) => {
        asm!(concat!("tileloadd tmm", $t, ", [{p} + {s}*1]"),
            p = in(reg) $ptr, s = in(reg) $stride, options(nostack, readonly))
    };
}
macro_rules! tile_store {
    ($t:literal, $ptr:expr, $stride:expr) => {
        asm!(concat!("tilestored [{p} + {s}*1], tmm", $t),
            p = in(reg) $ptr, s = in(reg) $stride, options(nostack))
    };
}
macro_rules! tile_zero {
    ($t:literal) => {
        asm!(concat!("tilezero tmm", $t), options(nostack, nomem))
    };
}
macro_rules! tile_dot {
    ($bf16:expr, $c:literal, $a:literal, $b:literal) => {
        if $bf16 {
            asm!(
                concat!("tdpbf16ps tmm", $c, ", tmm", $a, ", tmm", $b),
                options(nostack, nomem)
            )
        } else {
            asm!(
                concat!("tdpbssd tmm", $c, ", tmm", $a, ", tmm", $b),
                options(nostack, nomem)
            )
        }
    };
}

/// All column blocks of one row block (16 or 32 rows).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn row_block<const R2: bool>(
    a: *const u8,
    lda: usize,
    b: *const u8,
    col_blocks: usize,
    k_blocks: usize,
    out: *mut u8,
    ldo: usize,
) {
    // SAFETY: as for `block`, over col_blocks column blocks of packed B.
    unsafe {
        let panel = k_blocks * TILE_LEN;
        let mut cb = 0;
        while cb + 2 <= col_blocks {
            block::<R2, true, false>(
                a,
                lda,
                (0, k_blocks, k_blocks),
                b.add(cb * panel),
                panel,
                None,
                out.add(cb * 64),
                ldo,
            );
            cb += 2;
        }
        if cb < col_blocks {
            block::<R2, false, false>(
                a,
                lda,
                (0, k_blocks, k_blocks),
                b.add(cb * panel),
                panel,
                None,
                out.add(cb * 64),
                ldo,
            );
        }
    }
}

/// Runs `m` rows of A (`lda` bytes apart) against packed B into `out` (`ldo` bytes per row,
/// int32). Rows past the last whole 16 go through zero-padded copies.
#[allow(clippy::too_many_arguments)]
unsafe fn rows(
    a: *const u8,
    m: usize,
    lda: usize,
    b: *const u8,
    col_blocks: usize,
    k_blocks: usize,
    out: *mut u8,
    ldo: usize,
) {
    // SAFETY: a holds m rows lda bytes apart, out m rows ldo bytes apart, b the packed
    // operand; the tail goes through padded copies of whole tiles.
    unsafe {
        let mut r = 0;
        while r + 2 * TILE_ROWS <= m {
            row_block::<true>(
                a.add(r * lda),
                lda,
                b,
                col_blocks,
                k_blocks,
                out.add(r * ldo),
                ldo,
            );
            r += 2 * TILE_ROWS;
        }
        if r + TILE_ROWS <= m {
            row_block::<false>(
                a.add(r * lda),
                lda,
                b,
                col_blocks,
                k_blocks,
                out.add(r * ldo),
                ldo,
            );
            r += TILE_ROWS;
        }
        let tail = m - r;
        if tail > 0 {
            let mut a_pad = vec![0u8; TILE_ROWS * lda];
            let mut out_pad = vec![0u8; TILE_ROWS * ldo];
            std::ptr::copy_nonoverlapping(a.add(r * lda), a_pad.as_mut_ptr(), tail * lda);
            row_block::<false>(
                a_pad.as_ptr(),
                lda,
                b,
                col_blocks,
                k_blocks,
                out_pad.as_mut_ptr(),
                ldo,
            );
            std::ptr::copy_nonoverlapping(out_pad.as_ptr(), out.add(r * ldo), tail * ldo);
        }
    }
}

/// One 64-byte slice of the shared dimension: a block of 16 or 32 rows of A (`lda` bytes
/// apart) against one or two column blocks of packed B (the second `b_next` bytes after the
/// first), the int32 products stored (not added) into `out`, 32 lanes a row.
#[allow(clippy::too_many_arguments)]
pub unsafe fn i8_slice_block(
    two_rows: bool,
    two_columns: bool,
    a: *const i8,
    lda: usize,
    b: *const i8,
    b_next: usize,
    out: *mut i32,
) {
    let (a, b, out, ldo, one) = (a.cast(), b.cast(), out.cast(), 32 * 4, (0, 1, 1));
    // SAFETY: the caller passes a block of 16 (32) rows of A, the tiles of one slice of B's
    // one (two) column blocks and 16 (32) rows of 32 int32 at out, on a configured thread.
    unsafe {
        match (two_rows, two_columns) {
            (true, true) => block::<true, true, false>(a, lda, one, b, b_next, None, out, ldo),
            (true, false) => block::<true, false, false>(a, lda, one, b, b_next, None, out, ldo),
            (false, true) => block::<false, true, false>(a, lda, one, b, b_next, None, out, ldo),
            (false, false) => block::<false, false, false>(a, lda, one, b, b_next, None, out, ldo),
        }
    }
}

/// One output block of 16 or 32 rows x 16 or 32 columns (1 or 2 x 1 or 2 tiles) of int8
/// or (`BF16`) bf16 products: the shared dimension in `slices` 64-byte slices, slice `kb` of A
/// at `a + (kb / per_row) * row_step + (kb % per_row) * 64` (rows `lda` bytes apart; a
/// convolution's kernel rows read in place from the map, one row of `slices` for a plain
/// product), of B at `b + kb` tiles (the second column block `b_next` bytes later). The sums
/// start from zero, or from `init` (`init_step` bytes a row: 0 repeats one row, a bias), and
/// are stored into `out` (`ldo` bytes a row: int32 or f32).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn block<const R2: bool, const C2: bool, const BF16: bool>(
    a: *const u8,
    lda: usize,
    (row_step, per_row, slices): (usize, usize, usize),
    b: *const u8,
    b_next: usize,
    init: Option<(*const u8, usize)>,
    out: *mut u8,
    ldo: usize,
) {
    // SAFETY: the caller passes A's slices (16 or 32 rows each), B's tiles, the start and the
    // output block as described, on a thread with tiles configured.
    unsafe {
        if let Some((init, init_step)) = init {
            let init_lower = init.add(TILE_ROWS * init_step);
            tile_load!("0", init, init_step);
            if C2 {
                tile_load!("1", init.add(64), init_step);
            }
            if R2 {
                tile_load!("2", init_lower, init_step);
                if C2 {
                    tile_load!("3", init_lower.add(64), init_step);
                }
            }
        } else {
            tile_zero!("0");
            if C2 {
                tile_zero!("1");
            }
            if R2 {
                tile_zero!("2");
                if C2 {
                    tile_zero!("3");
                }
            }
        }
        for kb in 0..slices {
            let at = a.add((kb / per_row) * row_step + (kb % per_row) * TILE_BYTES);
            let bt = b.add(kb * TILE_LEN);
            tile_load!("4", at, lda);
            tile_load!("6", bt, TILE_BYTES);
            tile_dot!(BF16, "0", "4", "6");
            if C2 {
                tile_load!("7", bt.add(b_next), TILE_BYTES);
                tile_dot!(BF16, "1", "4", "7");
            }
            if R2 {
                tile_load!("5", at.add(TILE_ROWS * lda), lda);
                tile_dot!(BF16, "2", "5", "6");
                if C2 {
                    tile_dot!(BF16, "3", "5", "7");
                }
            }
        }
        let lower = out.add(TILE_ROWS * ldo);
        tile_store!("0", out, ldo);
        if C2 {
            tile_store!("1", out.add(64), ldo);
        }
        if R2 {
            tile_store!("2", lower, ldo);
            if C2 {
                tile_store!("3", lower.add(64), ldo);
            }
        }
    }
}

/// A bf16 convolution's [`block`], for the four shapes of block.
#[allow(clippy::too_many_arguments)]
pub unsafe fn bf16_conv_block(
    two_rows: bool,
    two_columns: bool,
    a: *const u16,
    lda: usize,
    slices: (usize, usize, usize),
    b: *const u16,
    b_next: usize,
    (init, init_step): (*const f32, usize),
    out: *mut f32,
    ldo: usize,
) {
    let (a, b, out, start) = (
        a.cast(),
        b.cast(),
        out.cast(),
        Some((init.cast(), init_step)),
    );
    // SAFETY: per the caller, as for block.
    unsafe {
        match (two_rows, two_columns) {
            (true, true) => block::<true, true, true>(a, lda, slices, b, b_next, start, out, ldo),
            (true, false) => block::<true, false, true>(a, lda, slices, b, b_next, start, out, ldo),
            (false, true) => block::<false, true, true>(a, lda, slices, b, b_next, start, out, ldo),
            (false, false) => {
                block::<false, false, true>(a, lda, slices, b, b_next, start, out, ldo)
            }
        }
    }
}

/// Each part `[m_i, k]` against packed B, outputs one after another; one tile
/// configuration for all of them.
pub unsafe fn i8_products(parts: &[&[i8]], b: &PackedI8, out: &mut [i32]) {
    // SAFETY: the caller checked the shapes (each part [m_i, k], out [rows, columns]) and
    // that the tiles are available.
    unsafe {
        let _tiles = Configured::new();
        let cols = b.columns();
        let mut at = 0;
        for a in parts {
            let m = a.len() / b.k;
            rows(
                a.as_ptr().cast(),
                m,
                b.k,
                b.tiles.as_ptr().cast(),
                cols / TILE_ROWS,
                b.k / TILE_BYTES,
                out.as_mut_ptr().add(at).cast(),
                cols * 4,
            );
            at += m * cols;
        }
    }
}
