//! bf16 linear layers `x W + b`: inputs and weights rounded to bf16, products accumulated in
//! f32, on whichever bf16 hardware the active level has.
//!
//! Owns: the packed bf16 weight (one layout for both kernels), rounding f32 rows to bf16,
//! and the products on AVX-512 BF16 dot products (`vdpbf16ps`, Intel Cooper Lake and Xeon
//! 4th generation, AMD Zen 4 and later) at [`Level::Avx512`]; at [`Level::Amx`] the same
//! packed weight goes to the tile kernel in `amx`. Levels without bf16 hardware have no bf16
//! kernel ([`levels`] says which run it): bf16 there would only be slower than f32.
//!
//! Both kernels multiply the same rounded values and add in f32, so they differ from each
//! other only by the order of the additions.

use crate::aligned::{Aligned, LINE};
use crate::amx;
use crate::level::{active, detected, Level};
use rayon::prelude::*;
use strum::IntoEnumIterator;

/// Output columns of one packed block (a 512-bit register of f32, a tile's 16 columns).
const BLOCK_COLUMNS: usize = 16;
/// bf16 elements of the shared dimension in one packed step of a block (a 64-byte tile row,
/// which is 16 columns x 2 consecutive k).
const PAIR_ROW: usize = 2 * BLOCK_COLUMNS;
/// The packed depth is padded with zeros to a multiple of this (a whole tile of k).
const K_ALIGN: usize = 32;

/// The weight `W` (`[k, n]` row-major f32) of bf16 products, rounded to bf16 and packed
/// once: blocks of 16 columns, each the whole (padded) depth as pairs of consecutive k side
/// by side per column, which is what one `vdpbf16ps` register and one AMX tile row take.
#[derive(Clone, Debug)]
pub struct PackedBf16 {
    /// `[n / 16][kp / 2][16 columns][2]`, depth past `k` zero.
    data: Aligned<u16>,
    pub(crate) k: usize,
    pub(crate) n: usize,
}

impl PackedBf16 {
    /// Whether `n` output columns can be packed (whole blocks of 16).
    pub fn fits(n: usize) -> bool {
        n > 0 && n.is_multiple_of(BLOCK_COLUMNS)
    }

    pub fn new(w: &[f32], k: usize, n: usize) -> Self {
        assert_eq!(w.len(), k * n, "W must be [k, n]");
        let mut packed = Self::empty();
        packed.refill_rows(w, k, n, n);
        packed
    }

    /// No weight yet, for buffers refilled in place ([`PackedBf16::refill_rows`]).
    pub fn empty() -> Self {
        Self {
            data: Aligned::zeroed(0),
            k: 0,
            n: 0,
        }
    }

    /// The packed values.
    pub(crate) fn data(&self) -> &[u16] {
        &self.data
    }

    fn data_mut(&mut self) -> &mut [u16] {
        &mut self.data
    }

    /// Refills with `W[kk, j] = src[kk * stride + j]` (`[k, n]` rows inside longer rows, e.g.
    /// an attention head's values), reusing the memory.
    pub fn refill_rows(&mut self, src: &[f32], k: usize, n: usize, stride: usize) {
        assert!(
            k == 0 || src.len() >= (k - 1) * stride + n,
            "src is shorter than k rows"
        );
        #[cfg(target_arch = "x86_64")]
        if has_avx512_bf16() && Self::fits(n) {
            self.shaped_for_pairs(k, n);
            // SAFETY: AVX-512 BF16 present; src holds k rows of n, stride apart; data is
            // [n / 16][kp / 2][32] for this k and n.
            unsafe { x86::pack_rows(src, k, n, stride, self.data_mut()) };
            return;
        }
        self.refill(k, n, |kk, j| src[kk * stride + j]);
    }

    /// Refills with `W[kk, j] = src[j * stride + kk]` for `j < rows` and zero for the columns
    /// after them up to `rows` rounded to 16 (e.g. an attention head's keys, transposed),
    /// reusing the memory.
    pub fn refill_transposed(&mut self, src: &[f32], k: usize, rows: usize, stride: usize) {
        assert!(
            rows == 0 || src.len() >= (rows - 1) * stride + k,
            "src is shorter than rows"
        );
        let n = whole_blocks(rows);
        #[cfg(target_arch = "x86_64")]
        if has_avx512_bf16() && k.is_multiple_of(2) && rows * stride * 4 < i32::MAX as usize {
            self.zeroed(k, n);
            // SAFETY: AVX-512 BF16 present; src holds `rows` rows of k (even), stride apart,
            // byte offsets within i32; data is [n / 16][kp / 2][32] for this k and n.
            unsafe { x86::pack_transposed(src, k, rows, stride, self.data_mut()) };
            return;
        }
        self.refill(
            k,
            n,
            |kk, j| if j < rows { src[j * stride + kk] } else { 0.0 },
        );
    }

    /// The memory of a `[k, n]` weight, reused, its values stale; the length of a block.
    fn shaped(&mut self, k: usize, n: usize) -> usize {
        assert!(
            Self::fits(n),
            "bf16 products need n a multiple of 16, got {n}"
        );
        self.k = k;
        self.n = n;
        let block_len = padded_depth(k) * BLOCK_COLUMNS;
        self.data
            .resize_for_overwrite(n / BLOCK_COLUMNS * block_len);
        block_len
    }

    /// Zeros for a `[k, n]` weight, reusing the memory.
    fn zeroed(&mut self, k: usize, n: usize) {
        self.shaped(k, n);
        self.data.fill(0);
    }

    /// A `[k, n]` weight's memory, reused, with only each block's pairs past `k` zeroed: for
    /// a packing that writes every pair below (`x86::pack_rows`). Packing a large operand
    /// (a detector fit packs a layer's patches) would otherwise write it twice.
    fn shaped_for_pairs(&mut self, k: usize, n: usize) {
        let block_len = self.shaped(k, n);
        let written = k.div_ceil(2) * PAIR_ROW;
        if block_len > written {
            self.data
                .chunks_exact_mut(block_len)
                .for_each(|block| block[written..].fill(0));
        }
    }

    fn refill(&mut self, k: usize, n: usize, value: impl Fn(usize, usize) -> f32) {
        self.zeroed(k, n);
        let block_len = padded_depth(k) * BLOCK_COLUMNS;
        for blk in 0..n / BLOCK_COLUMNS {
            let block = &mut self.data_mut()[blk * block_len..][..block_len];
            for (pair, step) in block
                .chunks_exact_mut(PAIR_ROW)
                .take(k.div_ceil(2))
                .enumerate()
            {
                for c in 0..BLOCK_COLUMNS {
                    let j = blk * BLOCK_COLUMNS + c;
                    step[2 * c] = bf16_bits(value(2 * pair, j));
                    if 2 * pair + 1 < k {
                        step[2 * c + 1] = bf16_bits(value(2 * pair + 1, j));
                    }
                }
            }
        }
    }

    pub fn k(&self) -> usize {
        self.k
    }

    pub fn n(&self) -> usize {
        self.n
    }

    /// The depth rounded up to whole tiles: the row length of `A` in bf16 products.
    pub fn padded_k(&self) -> usize {
        padded_depth(self.k)
    }
}

/// `columns` rounded up to whole packed blocks ([`BLOCK_COLUMNS`]).
pub fn whole_blocks(columns: usize) -> usize {
    columns.div_ceil(BLOCK_COLUMNS) * BLOCK_COLUMNS
}

fn padded_depth(k: usize) -> usize {
    k.div_ceil(K_ALIGN) * K_ALIGN
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

/// Whether this CPU has AVX-512 BF16 dot products (`vdpbf16ps`).
pub fn has_avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether `level` has a bf16 kernel on this CPU: AMX tiles, or AVX-512 with BF16 dot products.
fn runs_at(level: Level) -> bool {
    level <= detected()
        && match level {
            Level::Amx => true,
            Level::Avx512 => has_avx512_bf16(),
            Level::Avx2 | Level::Portable => false,
        }
}

/// The levels this CPU runs bf16 products at, lowest first (empty without bf16 hardware).
pub fn levels() -> Vec<Level> {
    Level::iter().filter(|&l| runs_at(l)).collect()
}

/// Whether bf16 products run at the active level.
pub fn available() -> bool {
    runs_at(active())
}

/// `out[m, n] = x[m, k] W + bias` (or `+=` with `residual`) with bf16 products at the
/// active level, in parallel over chunks of rows. Panics when [`available`] is false.
pub fn linear_bf16(
    x: &[f32],
    m: usize,
    w: &PackedBf16,
    bias: &[f32],
    out: &mut [f32],
    residual: bool,
) {
    linear_bf16_at(active(), x, m, w, bias, out, residual)
}

/// [`linear_bf16`] at `level` (which must run bf16 here: [`levels`]).
pub fn linear_bf16_at(
    level: Level,
    x: &[f32],
    m: usize,
    w: &PackedBf16,
    bias: &[f32],
    out: &mut [f32],
    residual: bool,
) {
    assert!(
        runs_at(level),
        "no bf16 kernel at level {level} on this CPU"
    );
    let (k, n) = (w.k, w.n);
    assert!(x.len() >= m * k && out.len() >= m * n && bias.len() == n);
    let rows = crate::gemm::task_rows(k, m);
    out[..m * n]
        .par_chunks_mut(rows * n)
        .zip(x[..m * k].par_chunks(rows * k.max(1)))
        .for_each(|(o, x)| {
            let mr = o.len() / n;
            let kp = w.padded_k();
            with_rounded(x, mr, k, kp, |a16| {
                if level == Level::Amx && !residual {
                    // the tiles start from the bias themselves
                    amx::bf16_tile_products(a16, mr, kp, w, amx::Start::Bias(bias), o);
                    return;
                }
                crate::gemm::start_with_bias(o, bias, residual);
                products_acc(level, a16, mr, w, o);
            })
        });
}

thread_local! {
    /// Each thread's rows rounded to bf16, reused from product to product.
    static ROUNDED: std::cell::RefCell<Vec<u16>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `f` of `x`'s `m` rows of `k` rounded to bf16 rows of `kp`, in this thread's reused memory
/// when it is free (a thread that steals another product's task while it waits inside `f`
/// finds it taken, and rounds into memory of its own).
fn with_rounded<R>(x: &[f32], m: usize, k: usize, kp: usize, f: impl FnOnce(&[u16]) -> R) -> R {
    ROUNDED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut a16) => {
            round_rows_into(x, m, k, k, kp, &mut a16);
            f(&a16)
        }
        Err(_) => f(&rows_to_bf16(x, m, k, kp)),
    })
}

/// `out[m, n] += A W` with `A` `[m, k]` f32 rounded to bf16, at `level` (which must run
/// bf16 here: [`levels`]). Panics when the shapes disagree.
pub fn bf16_matmul_acc_at(level: Level, a: &[f32], m: usize, w: &PackedBf16, out: &mut [f32]) {
    assert!(
        runs_at(level),
        "no bf16 kernel at level {level} on this CPU"
    );
    assert_eq!(a.len(), m * w.k, "A must be [m, k]");
    assert_eq!(out.len(), m * w.n, "out must be [m, n]");
    let a16 = rows_to_bf16(a, m, w.k, w.padded_k());
    products_acc(level, &a16, m, w, out);
}

/// `m` contiguous rows of `k` values of `x` rounded to bf16 into rows of `a16` `kp` apart
/// (`kp >= k`; the values between rows, and the last row's past `k`, left as they are):
/// e.g. each part of a concatenation into its channels of the joined map.
pub fn round_into(x: &[f32], m: usize, k: usize, a16: &mut [u16], kp: usize) {
    if k == 0 || m == 0 {
        return;
    }
    assert!(kp >= k && x.len() >= m * k && a16.len() >= (m - 1) * kp + k);
    #[cfg(target_arch = "x86_64")]
    if has_avx512_bf16() {
        // SAFETY: the CPU has AVX-512 BF16; x holds m rows of k, a16 m rows kp >= k apart
        // (the last one k long), checked above.
        unsafe { x86::round_rows(x, m, k, k, kp, a16) };
        return;
    }
    for (r, src) in x.chunks_exact(k).take(m).enumerate() {
        a16[r * kp..r * kp + k]
            .iter_mut()
            .zip(src)
            .for_each(|(d, &s)| *d = bf16_bits(s));
    }
}

fn products_acc(level: Level, a16: &[u16], m: usize, w: &PackedBf16, out: &mut [f32]) {
    let kp = w.padded_k();
    match level {
        Level::Amx => amx::bf16_tile_products(a16, m, kp, w, amx::Start::Out, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: runs_at(level) (checked by the callers) says AVX-512 BF16 exists; a16 is
        // [m, kp] and out [m, n].
        Level::Avx512 => unsafe { x86::dp_products(a16, m, kp, w, out, w.n, true) },
        _ => unreachable!("runs_at admits only Amx and Avx512"),
    }
}

/// `x` (`[m, k]` f32) rounded to bf16 rows of `kp` (zero past `k`).
pub(crate) fn rows_to_bf16(x: &[f32], m: usize, k: usize, kp: usize) -> Vec<u16> {
    let mut a16 = Vec::new();
    round_rows_into(x, m, k, k, kp, &mut a16);
    a16
}

/// Rows `x[r * stride..r * stride + k]` for `r < m` rounded to bf16 into `a16` as `[m, kp]`
/// (zero past `k`), reusing its memory.
pub(crate) fn round_rows_into(
    x: &[f32],
    m: usize,
    k: usize,
    stride: usize,
    kp: usize,
    a16: &mut Vec<u16>,
) {
    assert!(kp >= k && (m == 0 || x.len() >= (m - 1) * stride + k));
    // every value below `k` is written: only the padding past it is zeroed
    a16.resize(m * kp, 0);
    if kp > k {
        a16.chunks_exact_mut(kp).for_each(|row| row[k..].fill(0));
    }
    if k == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if has_avx512_bf16() {
        // SAFETY: the CPU has AVX-512 BF16; x holds m rows of k, stride apart, a16 m rows of
        // kp >= k.
        unsafe { x86::round_rows(x, m, k, stride, kp, a16) };
        return;
    }
    for (r, dst) in a16.chunks_exact_mut(kp).enumerate() {
        let src = &x[r * stride..r * stride + k];
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, &s)| *d = bf16_bits(s));
    }
}

/// Whether products of rows rounded to bf16 with a [`PackedBf16`] run on `vdpbf16ps` at the
/// active level (what [`products_into`] needs).
pub fn dot_products_available() -> bool {
    active() >= Level::Avx512 && has_avx512_bf16()
}

/// `out[r * ldo + j] (+)= sum_kk a16[r * kp + kk] W[kk, j]` for `r < m`, `j < w.n()`, with
/// `a16` rows from [`round_rows_into`] at the packed depth: a product inside a wider output
/// (e.g. one attention head's columns). Panics when [`dot_products_available`] is false.
pub fn products_into(
    a16: &[u16],
    m: usize,
    w: &PackedBf16,
    out: &mut [f32],
    ldo: usize,
    accumulate: bool,
) {
    assert!(dot_products_available(), "no AVX-512 BF16 at this level");
    let kp = w.padded_k();
    assert!(a16.len() >= m * kp, "A must be [m, kp]");
    assert!(ldo >= w.n && (m == 0 || out.len() >= (m - 1) * ldo + w.n));
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512 BF16 checked above; the shapes too.
    unsafe {
        x86::dp_products(a16, m, kp, w, out, ldo, accumulate)
    }
}

/// A convolution's filters (stride 1, no padding; Keras' `[kh][kw][channels][n]`) for bf16
/// products by kernel row ([`conv_rows_bf16`]): the `kw` taps of a kernel row read `kw`
/// neighbouring pixels, whose values lie side by side in the map, so each kernel row is one
/// product of depth `kw * channels` (rounded up to [`K_ALIGN`]) whose rows are `channels`
/// values apart, and every kernel row's products add up before they are stored. A layer of
/// 16 or 32 channels is then not mostly padding, and the sums of a block of outputs are
/// loaded and stored once per layer instead of once per tap.
#[derive(Clone, Debug)]
pub struct PackedConvBf16 {
    /// `[kh * depth, n]`: kernel row `i`'s weights at depths `i * depth..`, zero past `kw *
    /// channels`.
    w: PackedBf16,
    kernel: [usize; 2],
    channels: usize,
    depth: usize,
}

impl PackedConvBf16 {
    /// Whether `n` filters can be packed (whole blocks of 16).
    pub fn fits(n: usize) -> bool {
        PackedBf16::fits(n)
    }

    pub fn new(w: &[f32], [kh, kw]: [usize; 2], channels: usize, n: usize) -> Self {
        assert_eq!(
            w.len(),
            kh * kw * channels * n,
            "filters must be [kh, kw, c, n]"
        );
        assert!(kh > 0 && kw > 0 && channels > 0);
        let depth = padded_depth(kw * channels);
        let mut rows = vec![0f32; kh * depth * n];
        for i in 0..kh {
            let row = &w[i * kw * channels * n..(i + 1) * kw * channels * n];
            rows[i * depth * n..][..row.len()].copy_from_slice(row);
        }
        Self {
            w: PackedBf16::new(&rows, kh * depth, n),
            kernel: [kh, kw],
            channels,
            depth,
        }
    }

    pub fn n(&self) -> usize {
        self.w.n
    }
}

/// The room a map of `len` values rounded by [`round_map`] takes: its values from a cache
/// line's start (as a packed weight's, [`crate::aligned`]), then [`K_ALIGN`] zeros (a kernel row's product reads up to its
/// depth's rounding past a window's last pixel).
pub fn rounded_map_len(len: usize) -> usize {
    len + K_ALIGN + LINE / 2 - 1
}

/// Makes `map16` room for a rounded map of `len` values ([`rounded_map_len`]) and returns
/// where they start in it (its first cache line); the [`K_ALIGN`] values after
/// them are zero, the rest left as they were.
pub fn map_start(map16: &mut Vec<u16>, len: usize) -> usize {
    map16.resize(rounded_map_len(len), 0);
    let start = (map16.as_ptr() as usize).wrapping_neg() % LINE / 2;
    map16[start + len..start + len + K_ALIGN].fill(0);
    start
}

/// The values of a map (`len` of them) rounded to bf16 into `map16` for [`conv_rows_bf16`],
/// in parallel, reusing `map16`'s memory; returns where they start ([`map_start`]).
pub fn round_map(x: &[f32], len: usize, map16: &mut Vec<u16>) -> usize {
    const CHUNK: usize = 1 << 16;
    assert!(x.len() >= len, "the map holds fewer values");
    let start = map_start(map16, len);
    map16[start..start + len]
        .par_chunks_mut(CHUNK)
        .zip(x[..len].par_chunks(CHUNK))
        .for_each(|(dst, src)| round_into(src, 1, src.len(), dst, src.len()));
    start
}

/// `out[r * n + j] = bias[j] + sum_{i, t, c} map[first + r + i * width + t][c] * w[i][t][c][j]`
/// in bf16 (sums in f32) for the `m` outputs whose windows start at the map's pixels `first..first +
/// m` (`width` pixels a row): a run of one output row. `map16` is a map from [`round_map`],
/// from where it starts.
/// Panics when [`available`] is false or a window reaches past the map.
pub fn conv_rows_bf16(
    map16: &[u16],
    width: usize,
    first: usize,
    m: usize,
    w: &PackedConvBf16,
    bias: &[f32],
    out: &mut [f32],
) {
    conv_rows_bf16_at(active(), map16, width, first, m, w, bias, out)
}

/// [`conv_rows_bf16`] at `level` (which must run bf16 here: [`levels`]).
#[allow(clippy::too_many_arguments)]
pub fn conv_rows_bf16_at(
    level: Level,
    map16: &[u16],
    width: usize,
    first: usize,
    m: usize,
    w: &PackedConvBf16,
    bias: &[f32],
    out: &mut [f32],
) {
    assert!(
        runs_at(level),
        "no bf16 kernel at level {level} on this CPU"
    );
    let ([kh, kw], c, n) = (w.kernel, w.channels, w.w.n);
    assert!(out.len() >= m * n, "out must be [m, n]");
    assert_eq!(bias.len(), n, "one bias per output");
    if m == 0 {
        return;
    }
    assert!(width >= kw, "a map row narrower than the kernel");
    let last = first + m - 1 + (kh - 1) * width;
    assert!(
        (last + kw) * c + K_ALIGN <= map16.len(),
        "a window reaches past the map"
    );
    let a = &map16[first * c..];
    let row_step = width * c;
    match level {
        Level::Amx => {
            let shape = (c, row_step, w.depth / K_ALIGN);
            amx::bf16_conv_products(a, m, shape, &w.w, amx::Start::Bias(bias), out)
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: runs_at(level) says AVX-512 BF16 exists; every kernel row's rows lie in the
        // map (checked above: the depth's rounding past a window is in the K_ALIGN zeros).
        Level::Avx512 => unsafe {
            for o in out[..m * n].chunks_exact_mut(n) {
                o.copy_from_slice(bias);
            }
            for i in 0..kh {
                let part = (c, w.depth);
                let a = &a[i * row_step..];
                x86::dp_products_part(a, m, part, &w.w, i * w.depth, out, n, true);
            }
        },
        _ => unreachable!("runs_at admits only Amx and Avx512"),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{bf16_bits, PackedBf16, BLOCK_COLUMNS, PAIR_ROW};
    use core::arch::x86_64::*;

    /// Rows of a register block: 6 rows x 4 column blocks keep 24 accumulators, four weight
    /// registers and a broadcast in AVX-512's 32 registers.
    const ROWS: usize = 6;
    /// Column blocks of 16 per register block.
    const BLOCKS: usize = 4;

    /// Rounds the 32 floats `lo` then `hi` to bf16 (`vcvtne2ps2bf16`) and stores them at `dst`.
    #[inline(always)]
    unsafe fn store_rounded(dst: *mut u16, lo: __m512, hi: __m512) {
        // SAFETY: AVX-512 BF16 per the caller; dst holds 32 bf16.
        unsafe {
            let packed: __m512i = core::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_storeu_si512(dst.cast(), packed);
        }
    }

    /// Rounds rows of f32 to bf16 with `vcvtne2ps2bf16` (round to nearest even, as
    /// [`bf16_bits`]; the instruction flushes subnormal inputs to zero).
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn round_rows(
        x: &[f32],
        m: usize,
        k: usize,
        stride: usize,
        kp: usize,
        a16: &mut [u16],
    ) {
        for r in 0..m {
            let (src, dst) = (&x[r * stride..r * stride + k], &mut a16[r * kp..r * kp + k]);
            let whole = k / 32 * 32;
            for c in (0..whole).step_by(32) {
                // SAFETY: c + 32 <= k on both sides; AVX-512 BF16 per the caller.
                unsafe {
                    let lo = _mm512_loadu_ps(src.as_ptr().add(c));
                    let hi = _mm512_loadu_ps(src.as_ptr().add(c + 16));
                    store_rounded(dst.as_mut_ptr().add(c), lo, hi);
                }
            }
            for c in whole..k {
                dst[c] = bf16_bits(src[c]);
            }
        }
    }

    /// Packs `W[kk, j] = src[kk * stride + j]` (`[k, n]`): each step interleaves two rows'
    /// 16 columns into pairs and rounds them with one `vcvtne2ps2bf16`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn pack_rows(src: &[f32], k: usize, n: usize, stride: usize, data: &mut [u16]) {
        let block_len = (data.len() / (n / BLOCK_COLUMNS)).max(1);
        // SAFETY: (whole body) AVX-512 BF16 per the caller; rows kk < k of src hold n floats
        // from kk * stride; data holds n / 16 blocks of block_len >= k.div_ceil(2) * 32.
        unsafe {
            let low = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
            let high = _mm512_add_epi32(low, _mm512_set1_epi32(8));
            for pair in 0..k.div_ceil(2) {
                let r0 = src.as_ptr().add(2 * pair * stride);
                let second = 2 * pair + 1 < k;
                for blk in 0..n / BLOCK_COLUMNS {
                    let a = _mm512_loadu_ps(r0.add(blk * BLOCK_COLUMNS));
                    let b = if second {
                        _mm512_loadu_ps(r0.add(stride + blk * BLOCK_COLUMNS))
                    } else {
                        _mm512_setzero_ps()
                    };
                    let lo = _mm512_permutex2var_ps(a, low, b);
                    let hi = _mm512_permutex2var_ps(a, high, b);
                    let dst = data.as_mut_ptr().add(blk * block_len + pair * PAIR_ROW);
                    store_rounded(dst, lo, hi);
                }
            }
        }
    }

    /// Packs `W[kk, j] = src[j * stride + kk]` for `j < rows` (`k` even). Eight pairs of
    /// depths of 16 rows at a time: each row's 16 floats are eight 64-bit pairs, and two 8 x 8
    /// transposes of those pairs in registers give every pair's 16 rows in the packed order.
    /// The depth's last `k % 16` pairs are gathered, 64 bits per row. (Gathering every pair
    /// took a fifth of the bf16 attention's time on Zen 5: `vit_shapes attention` under perf.)
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn pack_transposed(
        src: &[f32],
        k: usize,
        rows: usize,
        stride: usize,
        data: &mut [u16],
    ) {
        let blocks = rows.div_ceil(BLOCK_COLUMNS);
        let block_len = (data.len() / blocks.max(1)).max(1);
        let whole = k / 16 * 16;
        // SAFETY: (whole body) AVX-512 BF16 per the caller; row j < rows of src holds k floats
        // from j * stride, every byte offset fits i32; data holds `blocks` blocks of
        // block_len >= k / 2 * 32; rows >= `rows` are masked off (read as zero, never touched).
        unsafe {
            let step = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let row_bytes = _mm256_set1_epi32((stride * 4) as i32);
            let zero = _mm512_setzero_pd();
            for blk in 0..blocks {
                let j0 = blk * BLOCK_COLUMNS;
                let live = |from: usize| -> __mmask8 {
                    let n = rows.saturating_sub(j0 + from).min(8);
                    ((1u32 << n) - 1) as __mmask8
                };
                let (m0, m1) = (live(0), live(8));
                let dst = data.as_mut_ptr().add(blk * block_len);
                for kk in (0..whole).step_by(16) {
                    let half = |from: usize, mask: __mmask8| -> [__m512d; 8] {
                        let rows: [__m512d; 8] = std::array::from_fn(|r| {
                            let m = if mask >> r & 1 == 1 { 0xFFFF } else { 0 };
                            let p = src.as_ptr().wrapping_add((j0 + from + r) * stride + kk);
                            _mm512_castps_pd(_mm512_maskz_loadu_ps(m, p))
                        });
                        transpose_pairs(rows)
                    };
                    let (lo, hi) = (half(0, m0), half(8, m1));
                    for (c, (lo, hi)) in lo.into_iter().zip(hi).enumerate() {
                        let at = dst.add((kk / 2 + c) * PAIR_ROW);
                        store_rounded(at, _mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
                    }
                }
                if whole < k {
                    let rows0 = _mm256_add_epi32(step, _mm256_set1_epi32(j0 as i32));
                    let first = _mm256_mullo_epi32(rows0, row_bytes);
                    let second =
                        _mm256_add_epi32(first, _mm256_set1_epi32((8 * stride * 4) as i32));
                    for pair in whole / 2..k / 2 {
                        let base = src.as_ptr().add(2 * pair).cast::<f64>();
                        let lo = _mm512_mask_i32gather_pd::<1>(zero, m0, first, base);
                        let hi = _mm512_mask_i32gather_pd::<1>(zero, m1, second, base);
                        let at = dst.add(pair * PAIR_ROW);
                        store_rounded(at, _mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
                    }
                }
            }
        }
    }

    /// The 8 x 8 transpose of 64-bit elements: element `c` of row `r` becomes element `r` of
    /// row `c` (pairs within 128-bit lanes, then lanes, twice).
    #[inline(always)]
    unsafe fn transpose_pairs(r: [__m512d; 8]) -> [__m512d; 8] {
        // SAFETY: (whole body) AVX-512F per the caller.
        unsafe {
            // t[2i]: elements 0, 2, 4, 6 of rows 2i and 2i + 1 interleaved; t[2i + 1]: 1, 3, 5, 7
            let t: [__m512d; 8] = std::array::from_fn(|i| match i % 2 {
                0 => _mm512_unpacklo_pd(r[i], r[i + 1]),
                _ => _mm512_unpackhi_pd(r[i - 1], r[i]),
            });
            // u[0], u[1]: elements (0, 4) and (2, 6) of rows 0..4; u[2], u[3]: (1, 5), (3, 7);
            // u[4..8] the same of rows 4..8
            let u = [
                _mm512_shuffle_f64x2::<0x88>(t[0], t[2]),
                _mm512_shuffle_f64x2::<0xDD>(t[0], t[2]),
                _mm512_shuffle_f64x2::<0x88>(t[1], t[3]),
                _mm512_shuffle_f64x2::<0xDD>(t[1], t[3]),
                _mm512_shuffle_f64x2::<0x88>(t[4], t[6]),
                _mm512_shuffle_f64x2::<0xDD>(t[4], t[6]),
                _mm512_shuffle_f64x2::<0x88>(t[5], t[7]),
                _mm512_shuffle_f64x2::<0xDD>(t[5], t[7]),
            ];
            [
                _mm512_shuffle_f64x2::<0x88>(u[0], u[4]),
                _mm512_shuffle_f64x2::<0x88>(u[2], u[6]),
                _mm512_shuffle_f64x2::<0x88>(u[1], u[5]),
                _mm512_shuffle_f64x2::<0x88>(u[3], u[7]),
                _mm512_shuffle_f64x2::<0xDD>(u[0], u[4]),
                _mm512_shuffle_f64x2::<0xDD>(u[2], u[6]),
                _mm512_shuffle_f64x2::<0xDD>(u[1], u[5]),
                _mm512_shuffle_f64x2::<0xDD>(u[3], u[7]),
            ]
        }
    }

    /// `out[m, n] (+)= A W` with rows `ldo` apart: `a16` `[m, kp]` bf16, blocks of 6 rows x 64
    /// columns whose sums stay in registers over the whole depth. A weight panel of 64
    /// columns (48 KiB at depth 384) is reused by every row block of the task from L1 or L2.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn dp_products(
        a16: &[u16],
        m: usize,
        kp: usize,
        w: &PackedBf16,
        out: &mut [f32],
        ldo: usize,
        accumulate: bool,
    ) {
        debug_assert!(a16.len() >= m * kp);
        // SAFETY: AVX-512 BF16 per the caller; A is [m, kp], the whole packed depth.
        unsafe { dp_products_part(a16, m, (kp, kp), w, 0, out, ldo, accumulate) }
    }

    /// [`dp_products`] over part of the packed depth: its `depth` values from `from` (a
    /// multiple of [`K_ALIGN`](super::K_ALIGN)) against rows of `a16` `lda` apart (which may
    /// overlap: a convolution's kernel row read in place).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn dp_products_part(
        a16: &[u16],
        m: usize,
        (lda, depth): (usize, usize),
        w: &PackedBf16,
        from: usize,
        out: &mut [f32],
        ldo: usize,
        accumulate: bool,
    ) {
        let n = w.n;
        let blocks = n / BLOCK_COLUMNS;
        let block_len = w.padded_k() * BLOCK_COLUMNS;
        let (pairs, w_from) = (depth / 2, from * BLOCK_COLUMNS);
        debug_assert!(m == 0 || a16.len() >= (m - 1) * lda + depth);
        debug_assert!(m == 0 || out.len() >= (m - 1) * ldo + n);
        debug_assert!(from + depth <= w.padded_k());
        let mut blk = 0;
        while blk < blocks {
            let wide = blocks - blk >= BLOCKS;
            let mut r = 0;
            while r < m {
                let full = m - r >= ROWS;
                // SAFETY: (all arms) rows r.. of a16 and out exist per the counts; the panel
                // starts at block blk and holds the blocks the arm reads; AVX-512 BF16 is
                // enabled on this function.
                unsafe {
                    let a = (a16.as_ptr().add(r * lda), lda, pairs);
                    let wp = w.data().as_ptr().add(w_from + blk * block_len);
                    let o = out.as_mut_ptr().add(r * ldo + blk * BLOCK_COLUMNS);
                    let acc = accumulate;
                    match (full, wide) {
                        (true, true) => block::<ROWS, BLOCKS>(a, wp, block_len, o, ldo, acc),
                        (true, false) => block::<ROWS, 1>(a, wp, block_len, o, ldo, acc),
                        (false, true) => block::<1, BLOCKS>(a, wp, block_len, o, ldo, acc),
                        (false, false) => block::<1, 1>(a, wp, block_len, o, ldo, acc),
                    }
                }
                r += if full { ROWS } else { 1 };
            }
            blk += if wide { BLOCKS } else { 1 };
        }
    }

    /// `R` rows x `C` column blocks over `pairs` pairs of the depth (rows of A `lda` apart),
    /// added into `out` (or stored).
    #[inline(always)]
    unsafe fn block<const R: usize, const C: usize>(
        (a, lda, pairs): (*const u16, usize, usize),
        w: *const u16,
        block_len: usize,
        out: *mut f32,
        ldo: usize,
        accumulate: bool,
    ) {
        // SAFETY: (whole body) AVX-512 BF16 per the caller; a holds R rows of 2 pairs bf16,
        // lda apart, w C blocks of pairs steps, block_len apart, out R rows of C * 16 floats,
        // ldo apart.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); C]; R];
            for pair in 0..pairs {
                let mut wv: [__m512bh; C] = core::mem::zeroed();
                for (c, wv) in wv.iter_mut().enumerate() {
                    let v = _mm512_loadu_si512(w.add(c * block_len + pair * PAIR_ROW).cast());
                    *wv = core::mem::transmute::<__m512i, __m512bh>(v);
                }
                for (i, acc) in acc.iter_mut().enumerate() {
                    let x = a.add(i * lda + 2 * pair).cast::<i32>().read_unaligned();
                    let x = core::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(x));
                    for (acc, &wv) in acc.iter_mut().zip(&wv) {
                        *acc = _mm512_dpbf16_ps(*acc, x, wv);
                    }
                }
            }
            for (i, acc) in acc.iter().enumerate() {
                for (c, acc) in acc.iter().enumerate() {
                    let o = out.add(i * ldo + c * BLOCK_COLUMNS);
                    let v = if accumulate {
                        _mm512_add_ps(_mm512_loadu_ps(o), *acc)
                    } else {
                        *acc
                    };
                    _mm512_storeu_ps(o, v);
                }
            }
        }
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

    /// The packed layout written out from its definition: element `(kk, j)` of `[k, n]` `w`
    /// at block `j / 16`, pair `kk / 2`, column `j % 16`, half `kk % 2`; zero elsewhere.
    fn by_definition(w: &[f32], k: usize, n: usize) -> Vec<u16> {
        let block_len = k.div_ceil(32) * 32 * 16;
        let mut data = vec![0u16; n / 16 * block_len];
        for kk in 0..k {
            for j in 0..n {
                let at = j / 16 * block_len + kk / 2 * 32 + j % 16 * 2 + kk % 2;
                data[at] = bf16_bits(w[kk * n + j]);
            }
        }
        data
    }

    /// Weights given whole and refilled weights (rows inside longer rows, or transposed with
    /// zero columns after the last row) are packed as the layout says, on the vector path
    /// where the CPU has one and on the plain one, odd depths included (transposed: depths
    /// in whole sixteens, with a rest and below sixteen).
    #[test]
    fn refilled_weights_pack_as_whole_ones() {
        let stride = 70;
        let src: Vec<f32> = (0..40 * stride)
            .map(|i| (i as f32 * 0.37).sin() * 3.0)
            .collect();
        let mut packed = PackedBf16::empty();
        for (k, n) in [(1, 16), (7, 32), (33, 64), (40, 48), (3, 16)] {
            let w: Vec<f32> = (0..k * n).map(|i| src[i / n * stride + i % n]).collect();
            // memory kept from the last weight holds no zeros to rely on
            packed.data_mut().fill(0xffff);
            packed.refill_rows(&src, k, n, stride);
            assert_eq!(packed.data(), by_definition(&w, k, n), "rows k {k} n {n}");
            assert_eq!(PackedBf16::new(&w, k, n).data(), by_definition(&w, k, n));
            packed.refill(k, n, |kk, j| src[kk * stride + j]);
            assert_eq!(packed.data(), by_definition(&w, k, n), "plain k {k} n {n}");
            assert_eq!(packed.data().as_ptr() as usize % crate::aligned::LINE, 0);
        }
        for (k, rows) in [
            (2, 1usize),
            (8, 17),
            (64, 33),
            (5, 40),
            (64, 16),
            (40, 20),
            (18, 33),
        ] {
            let n = rows.div_ceil(16) * 16;
            let w: Vec<f32> = (0..k * n)
                .map(|i| {
                    let (kk, j) = (i / n, i % n);
                    if j < rows {
                        src[j * stride + kk]
                    } else {
                        0.0
                    }
                })
                .collect();
            packed.refill_transposed(&src, k, rows, stride);
            assert_eq!((packed.k(), packed.n()), (k, n));
            assert_eq!(
                packed.data(),
                by_definition(&w, k, n),
                "transposed k {k} rows {rows}"
            );
        }
    }

    /// The vector rounding of rows agrees with the scalar one bit for bit on normal numbers,
    /// ties included, and pads each row with zeros.
    #[test]
    fn rows_round_alike_on_every_path() {
        let (m, k, kp) = (3, 45, 64);
        let x: Vec<f32> = (0..m * k)
            .map(|i| match i % 5 {
                0 => 1.0 + 1.0 / 256.0,
                1 => -(1.0 + 3.0 / 256.0),
                _ => (i as f32 * 0.731).sin() * 1e3,
            })
            .collect();
        // fresh memory, and memory kept from a larger use
        let mut kept = vec![0xffff; 2 * m * kp];
        round_rows_into(&x, m, k, k, kp, &mut kept);
        for a16 in [rows_to_bf16(&x, m, k, kp), kept] {
            assert_eq!(a16.len(), m * kp);
            for r in 0..m {
                for c in 0..kp {
                    let want = if c < k { bf16_bits(x[r * k + c]) } else { 0 };
                    assert_eq!(a16[r * kp + c], want, "row {r} column {c}");
                }
            }
        }
    }
}
