//! The ViT's int8 linear layers `x W + b`, and the detector's convolutions tap by tap (each
//! tap a product of the input's rows, quantised once: [`requantise`], [`products_acc_i8`]).
//! `x` is quantised dynamically per row and per group of [`GROUP`] inputs (asymmetric, 255 levels: GELU outputs are lopsided) and `W` per
//! column (symmetric, 8 bits). Both are stored as signed bytes, whose products every kernel
//! computes exactly, group by group: the sign trick through the int8 block kernel of
//! `i8_block` on AVX2 and AVX-512, `vpdpbusd` straight on the activations' codes plus 128 on
//! AVX-512 VNNI, AMX tiles. Each group's zero point (plus what the kernel's codes add to it)
//! times the group's weight column sums is taken out of its products as an exact integer in
//! f32, and what is left is scaled into f32 sums by the same operations on all levels, so
//! int8 outputs are bit-identical across levels. Token cosine to f32 on real crater crops: see
//! the model crate's parity test.

use crate::aligned::Aligned;
use crate::amx::PackedI8;
use crate::gemm::{task_rows, NB};
use crate::i8_block;
use crate::int8::round_small;
use crate::level::{active, detected, dispatch, Level};
use rayon::prelude::*;

/// Inputs per quantisation group: each row of `x` and each column of `W` has its own scale
/// per group (and `x` its own zero point), which keeps outlier channels from costing the
/// rest their precision.
pub const GROUP: usize = 64;

// the packed weight blocks are the int8 block kernel's
const _: () = assert!(NB == i8_block::COLUMNS);

/// A linear layer's weight `W` (`[k, n]`) as signed 8-bit codes with one scale per column,
/// packed for one level.
#[derive(Clone, Debug)]
pub struct PackedI8Linear {
    k: usize,
    /// `k` rounded up to whole groups (the padding is zero).
    kp: usize,
    n: usize,
    level: Level,
    /// `[blocks][kp / 4][NB][4]`.
    codes: Vec<i8>,
    /// `[n]`
    scales: Vec<f32>,
    /// `[groups][n]`: each group's column sums of codes (exact small integers, kept as f32):
    /// a group's zero point times these is what its codes' products hold beyond those of the
    /// codes minus the zero point.
    colsums: Vec<f32>,
    /// AMX: the codes as the columns of signed tile products (each group one 64-byte slice
    /// of their depth).
    tiles: Option<PackedI8>,
}

impl PackedI8Linear {
    /// Quantises and packs `W` given row-major (`w[i * n + j] = W[i, j]`).
    pub fn new(w: &[f32], k: usize, n: usize) -> Self {
        Self::with_level(w, k, n, active())
    }

    /// [`PackedI8Linear::new`] for the kernels of `level` (capped at what the CPU has).
    pub fn with_level(w: &[f32], k: usize, n: usize, level: Level) -> Self {
        let level = level.min(detected());
        let kp = k.div_ceil(GROUP) * GROUP;
        let groups = kp / GROUP;
        let mut scales = vec![1f32; n];
        let mut colsums = vec![0f32; groups * n];
        let mut columns = vec![0i8; n * kp]; // [n, kp]
        for j in 0..n {
            let max = (0..k).fold(0f32, |m, i| m.max(w[i * n + j].abs()));
            let s = if max > 0.0 { max / 127.0 } else { 1.0 };
            scales[j] = s;
            for i in 0..k {
                let c = round_small(w[i * n + j] / s).clamp(-127.0, 127.0) as i8;
                columns[j * kp + i] = c;
                colsums[(i / GROUP) * n + j] += c as f32;
            }
        }
        let blocks = n.div_ceil(NB);
        let mut codes = vec![0i8; blocks * kp * NB];
        for j in 0..n {
            let (b, c) = (j / NB, j % NB);
            for i in 0..kp {
                codes[((b * kp / 4 + i / 4) * NB + c) * 4 + i % 4] = columns[j * kp + i];
            }
        }
        let tiles = (level == Level::Amx).then(|| PackedI8::new(&columns, n, kp));
        Self {
            k,
            kp,
            n,
            level,
            codes,
            scales,
            colsums,
            tiles,
        }
    }

    pub fn k(&self) -> usize {
        self.k
    }
    pub fn n(&self) -> usize {
        self.n
    }
    fn groups(&self) -> usize {
        self.kp / GROUP
    }

    /// Whether its products take the activations' codes as unsigned bytes (the VNNI kernel).
    fn multiplies_unsigned(&self) -> bool {
        cfg!(target_arch = "x86_64")
            && self.tiles.is_none()
            && self.level == Level::Avx512
            && crate::level::has_avx512_vnni()
    }
}

/// Rows of `x` quantised per group of [`GROUP`] inputs: `x ~ scale * (code - zero)` with
/// codes in 0..=254 (the range widened to hold 0), stored minus 127 as signed bytes so that
/// every kernel multiplies signed by signed: the zero point then becomes `zero - 127`.
struct QuantisedRows {
    /// Row length of `codes`: `k` rounded up to whole groups.
    kp: usize,
    /// `[m, kp]`: `code - 127`, padding zero.
    codes: Aligned<i8>,
    /// `[m, groups]`
    scales: Vec<f32>,
    /// `[m, groups]`: `zero - 127`.
    zeros: Vec<i32>,
}

impl QuantisedRows {
    fn new(m: usize, kp: usize) -> Self {
        let groups = kp / GROUP;
        Self {
            kp,
            codes: Aligned::zeroed(m * kp),
            scales: vec![1f32; m * groups],
            zeros: vec![0i32; m * groups],
        }
    }

    /// Its rows `first..first + m`, as the products read them.
    fn rows(&self, first: usize, m: usize) -> Rows<'_> {
        let groups = self.kp / GROUP;
        Rows {
            kp: self.kp,
            codes: &self.codes[first * self.kp..(first + m) * self.kp],
            scales: &self.scales[first * groups..(first + m) * groups],
            zeros: &self.zeros[first * groups..(first + m) * groups],
            unsigned: None,
        }
    }

    fn as_mut(&mut self) -> RowsMut<'_> {
        RowsMut {
            kp: self.kp,
            codes: &mut self.codes,
            scales: &mut self.scales,
            zeros: &mut self.zeros,
        }
    }
}

/// A run of quantised rows ([`QuantisedRows`]), read by the products.
#[derive(Clone, Copy)]
struct Rows<'a> {
    kp: usize,
    codes: &'a [i8],
    scales: &'a [f32],
    zeros: &'a [i32],
    /// The codes plus 128 as unsigned bytes, where they were made once for many products
    /// (VNNI multiplies unsigned by signed bytes); else the VNNI kernel makes them.
    unsigned: Option<&'a [u8]>,
}

impl Rows<'_> {
    /// Row `r`'s zero point in group `g` as the signed codes carry it (`zero - 127`).
    #[inline(always)]
    fn zero(&self, r: usize, g: usize) -> f32 {
        self.zeros[r * (self.kp / GROUP) + g] as f32
    }
}

/// A run of quantised rows being written by the quantiser.
struct RowsMut<'a> {
    kp: usize,
    codes: &'a mut [i8],
    scales: &'a mut [f32],
    zeros: &'a mut [i32],
}

fn quantise_rows(x: &[f32], m: usize, k: usize, kp: usize, level: Level) -> QuantisedRows {
    let mut q = QuantisedRows::new(m, kp);
    quantise_at(level, x, k, &mut q.as_mut());
    q
}

fn quantise_at(level: Level, x: &[f32], k: usize, q: &mut RowsMut) {
    dispatch!(level,
        avx512 => x86::quantise_avx512(x, k, q),
        avx2 => x86::quantise_avx2(x, k, q),
        portable => quantise_into(x, k, q));
}

/// The quantiser: the same operations on every level (compiled wider where the CPU allows).
#[inline(always)]
fn quantise_into(x: &[f32], k: usize, q: &mut RowsMut) {
    quantise_groups_with(x, k, q, quantise_group)
}

/// Every row's groups through `group` (a group's values, its `GROUP` code bytes -> its scale
/// and zero point minus 127), into `q`.
#[inline(always)]
fn quantise_groups_with(
    x: &[f32],
    k: usize,
    q: &mut RowsMut,
    mut group: impl FnMut(&[f32], &mut [i8]) -> (f32, i32),
) {
    let (kp, groups) = (q.kp, q.kp / GROUP);
    for (r, (row, dst)) in x
        .chunks_exact(k)
        .zip(q.codes.chunks_exact_mut(kp))
        .enumerate()
    {
        for (g, (part, dst)) in row
            .chunks(GROUP)
            .zip(dst.chunks_exact_mut(GROUP))
            .enumerate()
        {
            let (scale, zero) = group(part, dst);
            q.scales[r * groups + g] = scale;
            q.zeros[r * groups + g] = zero;
        }
    }
}

/// One group's scale and zero point (minus 127), its codes into `dst` (`GROUP` bytes; the
/// padding past `part` at the zero point, so that it multiplies zero weights to nothing).
#[inline(always)]
fn quantise_group(part: &[f32], dst: &mut [i8]) -> (f32, i32) {
    // plain comparisons (not f32::min, whose NaN rules keep it scalar)
    let (mut lo, mut hi) = ([0f32; 8], [0f32; 8]);
    let chunks = part.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..8 {
            lo[l] = if c[l] < lo[l] { c[l] } else { lo[l] };
            hi[l] = if c[l] > hi[l] { c[l] } else { hi[l] };
        }
    }
    for &v in tail {
        lo[0] = if v < lo[0] { v } else { lo[0] };
        hi[0] = if v > hi[0] { v } else { hi[0] };
    }
    let lo = lo.iter().fold(0f32, |a, &v| if v < a { v } else { a });
    let hi = hi.iter().fold(0f32, |a, &v| if v > a { v } else { a });
    let (scale, inv, zero) = group_scale(lo, hi);
    for (d, &v) in dst.iter_mut().zip(part) {
        let c = round_small(v * inv) + zero;
        let c = c.clamp(0.0, 254.0);
        *d = code_byte(c);
    }
    for d in dst[part.len()..].iter_mut() {
        *d = (zero - 127.0) as i8;
    }
    (scale, zero as i32 - 127)
}

/// A group's scale, its inverse and its zero point from the group's range (`lo <= 0 <= hi`).
#[inline(always)]
pub(crate) fn group_scale(lo: f32, hi: f32) -> (f32, f32, f32) {
    let scale = if hi > lo { (hi - lo) / 254.0 } else { 1.0 };
    let inv = 1.0 / scale;
    let zero = round_small(-lo * inv).clamp(0.0, 254.0);
    (scale, inv, zero)
}

/// The signed byte `c - 127` of a whole-number code `c` in 0..=254, read from the bits of
/// `c + 1.5 * 2^23` (whose low byte is `c`): a float-to-int `as` saturates and keeps the
/// quantiser's loop from vectorising.
#[inline(always)]
pub(crate) fn code_byte(c: f32) -> i8 {
    ((c + 12_582_912.0).to_bits() as u8).wrapping_sub(127) as i8
}

/// `out[m, n] = x[m, k] W + bias` with int8 products; in parallel over chunks of rows.
pub fn linear_i8(x: &[f32], m: usize, w: &PackedI8Linear, bias: &[f32], out: &mut [f32]) {
    let (k, n) = (w.k, w.n);
    assert!(x.len() >= m * k && out.len() >= m * n && bias.len() == n);
    let rows = task_rows(k, m);
    out[..m * n]
        .par_chunks_mut(rows * n)
        .zip(x[..m * k].par_chunks(rows * k))
        .for_each(|(o, x)| {
            let mr = x.len() / k;
            let q = quantise_rows(x, mr, k, w.kp, w.level);
            let done = int8_products(&q.rows(0, mr), mr, w, Finish::Bias(bias), o);
            for (r, o) in o.chunks_exact_mut(n).enumerate() {
                let first = if r < done.rows { done.columns } else { 0 };
                finish_columns(o, w, bias, first);
            }
        });
}

/// A map's rows (pixels of `k` channels) quantised once for several int8 products with
/// weights of depth `k` ([`products_acc_i8`]): each tap of a convolution reads a run of them,
/// so the map is quantised once instead of once per tap. Refilled in place
/// ([`requantise`]), so that a caller can keep its memory from layer to layer.
pub struct I8Rows {
    q: QuantisedRows,
    k: usize,
    m: usize,
    /// `q.codes` plus 128 as unsigned bytes, for the VNNI kernel (empty elsewhere): made
    /// once here instead of once per product.
    unsigned: Vec<u8>,
}

impl Default for I8Rows {
    fn default() -> Self {
        Self {
            q: QuantisedRows::new(0, 0),
            k: 0,
            m: 0,
            unsigned: Vec::new(),
        }
    }
}

impl I8Rows {
    pub fn rows(&self) -> usize {
        self.m
    }
}

/// Rows quantised per task of [`requantise`].
const QUANTISE_ROWS: usize = 512;

/// `m` rows of `x` (`k` values each) quantised for products with `w` (its depth `k`, its
/// level) into `rows`, in parallel over rows; `rows`' memory is reused (every value is
/// written: nothing is cleared).
pub fn requantise(x: &[f32], m: usize, w: &PackedI8Linear, rows: &mut I8Rows) {
    let k = w.k;
    assert!(x.len() >= m * k);
    refill(m, w, rows, |first, n, q| {
        quantise_at(w.level, &x[first * k..(first + n) * k], k, q)
    });
}

/// Rows gathered and quantised at a time by [`requantise_gathered`]: their values stay in
/// L2 between the gathering and the quantising.
const GATHERED_ROWS: usize = 64;

/// [`requantise`] of `m` rows that are nowhere in memory as one array (a concatenation's
/// parts, say): `gather(first, values)` writes rows `first..` into `values` (a whole number
/// of rows of `k`), a few rows at a time, each thread into its own buffer. The same codes
/// as [`requantise`] of the rows written out.
pub fn requantise_gathered(
    m: usize,
    w: &PackedI8Linear,
    rows: &mut I8Rows,
    gather: impl Fn(usize, &mut [f32]) + Sync,
) {
    let k = w.k;
    refill(m, w, rows, |first, n, q| {
        let mut values = vec![0f32; GATHERED_ROWS.min(n) * k];
        let groups = q.kp / GROUP;
        for at in (0..n).step_by(GATHERED_ROWS) {
            let len = GATHERED_ROWS.min(n - at);
            let values = &mut values[..len * k];
            gather(first + at, values);
            let mut part = RowsMut {
                kp: q.kp,
                codes: &mut q.codes[at * q.kp..(at + len) * q.kp],
                scales: &mut q.scales[at * groups..(at + len) * groups],
                zeros: &mut q.zeros[at * groups..(at + len) * groups],
            };
            quantise_at(w.level, values, k, &mut part);
        }
    });
}

/// `rows` made `m` rows for `w`'s products, each task's run of rows quantised by
/// `quantise(first, rows, into)` and, for the VNNI kernel, made unsigned while they are
/// in cache.
fn refill(
    m: usize,
    w: &PackedI8Linear,
    rows: &mut I8Rows,
    quantise: impl Fn(usize, usize, &mut RowsMut) + Sync,
) {
    let kp = w.kp;
    let groups = kp / GROUP;
    let q = &mut rows.q;
    q.kp = kp;
    q.codes.resize_for_overwrite(m * kp);
    q.scales.resize(m * groups, 0.0);
    q.zeros.resize(m * groups, 0);
    rows.unsigned.clear();
    let task = |task: usize, codes: &mut [i8], scales, zeros, unsigned: Option<&mut [u8]>| {
        let n = codes.len() / kp;
        let mut part = RowsMut {
            kp,
            codes,
            scales,
            zeros,
        };
        quantise(task * QUANTISE_ROWS, n, &mut part);
        if let Some(u) = unsigned {
            unsigned_codes(part.codes, u);
        }
    };
    let tasks = q
        .codes
        .par_chunks_mut(QUANTISE_ROWS * kp)
        .zip(q.scales.par_chunks_mut(QUANTISE_ROWS * groups))
        .zip(q.zeros.par_chunks_mut(QUANTISE_ROWS * groups))
        .enumerate();
    if w.multiplies_unsigned() {
        rows.unsigned.resize(m * kp, 0);
        tasks
            .zip(rows.unsigned.par_chunks_mut(QUANTISE_ROWS * kp))
            .for_each(|((t, ((c, s), z)), u)| task(t, c, s, z, Some(u)));
    } else {
        tasks.for_each(|(t, ((c, s), z))| task(t, c, s, z, None));
    }
    rows.k = w.k;
    rows.m = m;
}

/// `out[m, n] += rows[first..first + m] W` with int8 products and no bias, on the calling
/// thread (a task of the caller's). `scratch` holds the products before they are added. The
/// sums are those of [`linear_i8`] on the same rows with a zero bias, on every level.
pub fn products_acc_i8(
    rows: &I8Rows,
    first: usize,
    m: usize,
    w: &PackedI8Linear,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    let n = w.n;
    assert!(rows.k == w.k && rows.q.kp == w.kp && first + m <= rows.m && out.len() >= m * n);
    // the products (every kernel sets its sums: no clearing), then a zero bias for the
    // kernels that finish outputs themselves
    if scratch.len() < m * n + n {
        scratch.resize(m * n + n, 0.0);
    }
    let (sums, bias) = scratch[..m * n + n].split_at_mut(m * n);
    bias.fill(0.0);
    let mut run = rows.q.rows(first, m);
    if !rows.unsigned.is_empty() {
        run.unsigned = Some(&rows.unsigned[first * w.kp..(first + m) * w.kp]);
    }
    // what the kernel finishes it adds to `out` itself; the rest is finished and added here
    let done = int8_products(&run, m, w, Finish::AddTo(out.as_mut_ptr()), sums);
    for (r, (o, s)) in out[..m * n]
        .chunks_exact_mut(n)
        .zip(sums.chunks_exact_mut(n))
        .enumerate()
    {
        let finished = if r < done.rows { done.columns } else { 0 };
        finish_columns(s, w, bias, finished);
        for (o, s) in o[finished..].iter_mut().zip(&s[finished..]) {
            *o += s;
        }
    }
}

/// The signed codes `c` as the VNNI kernel's unsigned bytes (plus 128).
fn unsigned_codes(c: &[i8], u: &mut [u8]) {
    for (u, &c) in u.iter_mut().zip(c) {
        *u = (c as u8) ^ 0x80;
    }
}

/// Turns one row's sums (its columns from `first` on) into outputs: `out = sums * w_scale +
/// bias`, the operations every level uses (the VNNI kernel too, in registers), so that they
/// round alike.
#[inline(always)]
fn finish_columns(out: &mut [f32], w: &PackedI8Linear, bias: &[f32], first: usize) {
    for ((o, &scale), &b) in out[first..w.n]
        .iter_mut()
        .zip(&w.scales[first..w.n])
        .zip(&bias[first..w.n])
    {
        *o = *o * scale + b;
    }
}

/// The outputs a products kernel left final (its rows `..rows`, columns `..columns`); the
/// rest hold group sums for [`finish_columns`].
struct Finished {
    rows: usize,
    columns: usize,
}

impl Finished {
    const NONE: Finished = Finished {
        rows: 0,
        columns: 0,
    };
}

/// One group's integer products into the running sums of one row: `sums[j] += (p[j] - zero *
/// colsums[j]) * scale` (the first group sets them). `zero` is the zero point the kernel's
/// codes carry (theirs minus 127 for the signed kernels, 128 more for VNNI's unsigned
/// bytes), so `p - zero * colsums` is the same integer on every level: the products of the
/// codes minus the group's zero point, exact in f32 (checked below). The f32 operations that
/// follow are the same on every level, so the outputs are identical.
#[inline(always)]
fn add_group(sums: &mut [f32], p: &[i32], colsums: &[f32], zero: f32, scale: f32, first: bool) {
    for j in 0..sums.len() {
        let v = (p[j] as f32 - zero * colsums[j]) * scale;
        sums[j] = if first { v } else { sums[j] + v };
    }
}

// Every integer in a group's rescaling is below 2^24, so f32 holds it, and the products with
// the zero point and their difference, exactly: a group's products of unsigned bytes with
// codes of at most 127 in magnitude, and the zero point (at most 255) times a column sum.
const _: () = assert!(GROUP * 255 * 127 < 1 << 24);
// whole groups fill whole registers of 16 floats (the AVX-512 quantiser)
const _: () = assert!(GROUP.is_multiple_of(16));

/// How a products kernel that finishes outputs itself (VNNI) finishes them.
#[derive(Clone, Copy)]
enum Finish<'a> {
    /// `out = sums * scale + bias`, in the products' own buffer (a linear layer).
    Bias(&'a [f32]),
    /// `into += sums * scale`, `into` being `[m, n]` apart from the products' buffer (a tap
    /// of a convolution added to the others').
    AddTo(*mut f32),
}

/// `out[r * n + j] = sum_g scale[r, g] * sum_{i in g} code[r, i] * W8[i, j]`, group by
/// group; where the kernel finishes outputs itself (VNNI), those it returns are final, as
/// `finish` says.
fn int8_products(
    q: &Rows,
    m: usize,
    w: &PackedI8Linear,
    finish: Finish,
    out: &mut [f32],
) -> Finished {
    if let Some(tiles) = &w.tiles {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: tiles are packed only at the AMX level, capped at what this CPU has, so
        // AVX-512 is here (and `Tiles::configure` checks the tiles themselves).
        return unsafe { x86::int8_products_amx(q, m, w, tiles, finish, out) };
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("no tiles off x86-64: {}", tiles.columns());
    }
    // q.codes is [m, kp], out [m, n], the packed codes [blocks][kp / 4][NB][4]
    dispatch!(w.level,
        avx512 => x86::int8_products_avx512(q, m, w, finish, out),
        avx2 => x86::int8_products_avx2(q, m, w, out),
        portable => int8_products_plain(q, m, w, out))
}

fn int8_products_plain(q: &Rows, m: usize, w: &PackedI8Linear, out: &mut [f32]) -> Finished {
    let (kp, n, groups) = (w.kp, w.n, w.groups());
    let mut p = [0i32; NB];
    for (blk, panel) in w.codes.chunks_exact(kp * NB).enumerate() {
        let width = NB.min(n - blk * NB);
        let col = blk * NB;
        for r in 0..m {
            let row = &q.codes[r * kp..(r + 1) * kp];
            for g in 0..groups {
                let group = &panel[g * GROUP * NB..(g + 1) * GROUP * NB];
                let codes = &row[g * GROUP..(g + 1) * GROUP];
                i8_block::products_plain(group, GROUP / 4, codes, GROUP, &mut p);
                add_group(
                    &mut out[r * n + col..r * n + col + width],
                    &p[..width],
                    &w.colsums[g * n + col..g * n + col + width],
                    q.zero(r, g),
                    q.scales[r * groups + g],
                    g == 0,
                );
            }
        }
    }
    Finished::NONE
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{
        add_group, group_scale, quantise_group, quantise_groups_with, quantise_into, Finish,
        Finished, PackedI8Linear, Rows, RowsMut, GROUP, NB,
    };
    use crate::amx::PackedI8;
    use crate::level::has_avx512_vnni;
    use crate::simd::{Avx2, Avx512, Avx512Vnni, Vector};
    use std::arch::x86_64::*;

    /// Integer products of `R` rows of signed codes (row stride `kp`) with one packed block,
    /// over one group (`GROUP / 4` steps of four bytes from `a` and `w`).
    #[inline(always)]
    unsafe fn group_block<V: Vector, const R: usize, const NV: usize>(
        w: *const i8,
        a: *const i8,
        kp: usize,
    ) -> [[V::I; NV]; R] {
        // SAFETY: features of V per the caller; w holds GROUP / 4 steps of NB * 4 bytes, a R
        // rows of GROUP bytes, kp apart; NB is the block kernel's column count.
        unsafe { crate::i8_block::products::<V, R, NV>(w, a, kp, GROUP / 4) }
    }

    /// Group `g`'s products of the `R` rows from `r` with the block at column `col` added
    /// to their f32 sums in registers, as [`add_group`] does it: `sum += (p - zero * colsum) *
    /// scale`, the first group setting them, where `zero` is the row's zero point plus
    /// `extra_zero` (what the kernel added to the signed codes). The integer part is exact
    /// (so a fused multiply-add gives it too); the rescaling is not fused, so that every
    /// level rounds alike.
    #[inline(always)]
    unsafe fn add_group_registers<V: Vector, const R: usize, const NV: usize>(
        sums: &mut [[V::F; NV]; R],
        acc: &[[V::I; NV]; R],
        q: &Rows,
        w: &PackedI8Linear,
        (r, col, g): (usize, usize, usize),
        extra_zero: f32,
    ) {
        // SAFETY: (whole body) features of V per the caller; colsums holds groups rows of n
        // floats, with NV * LANES columns from col.
        unsafe {
            let colsums = w.colsums.as_ptr().add(g * w.n + col);
            let c: [V::F; NV] = std::array::from_fn(|v| V::load_f(colsums.add(v * V::LANES)));
            for (i, (a, s)) in acc.iter().zip(sums.iter_mut()).enumerate() {
                let scale = V::splat_f(q.scales[(r + i) * w.groups() + g]);
                let zero = V::splat_f(-(q.zero(r + i, g) + extra_zero));
                for v in 0..NV {
                    let p = V::mul_f(V::fmadd(zero, c[v], V::to_f(a[v])), scale);
                    s[v] = if g == 0 { p } else { V::add_f(s[v], p) };
                }
            }
        }
    }

    /// [`add_group_registers`] on sums kept in `out` (`[m, n]`): loaded (after the first
    /// group), added to and stored back.
    #[inline(always)]
    unsafe fn flush<V: Vector, const R: usize, const NV: usize>(
        acc: &[[V::I; NV]; R],
        q: &Rows,
        w: &PackedI8Linear,
        (r, col, g): (usize, usize, usize),
        extra_zero: f32,
        out: *mut f32,
    ) {
        let n = w.n;
        // SAFETY: (whole body) features of V per the caller; out holds rows r..r + R of n
        // floats, each with NV * LANES columns from col.
        unsafe {
            let at = |i: usize, v: usize| out.add((r + i) * n + col + v * V::LANES);
            let mut sums: [[V::F; NV]; R] = std::array::from_fn(|i| {
                std::array::from_fn(|v| {
                    if g == 0 {
                        V::zero_f()
                    } else {
                        V::load_f(at(i, v))
                    }
                })
            });
            add_group_registers::<V, R, NV>(&mut sums, acc, q, w, (r, col, g), extra_zero);
            for (i, s) in sums.iter().enumerate() {
                for (v, s) in s.iter().enumerate() {
                    V::store_f(at(i, v), *s);
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn int8_generic<V: Vector, const R: usize, const NV: usize>(
        q: &Rows,
        m: usize,
        w: &PackedI8Linear,
        out: &mut [f32],
    ) {
        let (kp, n, groups) = (w.kp, w.n, w.groups());
        let full = n / NB;
        // SAFETY: (whole body) features of V per the caller; q.codes is [m, kp], out [m, n],
        // each packed block kp / 4 * NB * 4 bytes, w.colsums [groups, n].
        unsafe {
            // whole blocks: flushed in registers, straight into `out`
            for (blk, panel) in w.codes.chunks_exact(kp * NB).take(full).enumerate() {
                let col = blk * NB;
                let mut r = 0;
                while r + R <= m {
                    for g in 0..groups {
                        let acc = group_block::<V, R, NV>(
                            panel.as_ptr().add(g * GROUP * NB),
                            q.codes.as_ptr().add(r * kp + g * GROUP),
                            kp,
                        );
                        flush::<V, R, NV>(&acc, q, w, (r, col, g), 0.0, out.as_mut_ptr());
                    }
                    r += R;
                }
                while r < m {
                    for g in 0..groups {
                        let acc = group_block::<V, 1, NV>(
                            panel.as_ptr().add(g * GROUP * NB),
                            q.codes.as_ptr().add(r * kp + g * GROUP),
                            kp,
                        );
                        flush::<V, 1, NV>(&acc, q, w, (r, col, g), 0.0, out.as_mut_ptr());
                    }
                    r += 1;
                }
            }
            // the last, narrower block goes through a buffer and the scalar flush
            if full * NB < n {
                let panel = w.codes.as_ptr().add(full * kp * NB);
                let (col, width) = (full * NB, n - full * NB);
                let mut buf = [0i32; NB];
                for r in 0..m {
                    for g in 0..groups {
                        let [acc] = group_block::<V, 1, NV>(
                            panel.add(g * GROUP * NB),
                            q.codes.as_ptr().add(r * kp + g * GROUP),
                            kp,
                        );
                        for (v, a) in acc.iter().enumerate() {
                            V::store_i(buf.as_mut_ptr().add(v * V::LANES), *a);
                        }
                        add_group(
                            &mut out[r * n + col..r * n + col + width],
                            &buf[..width],
                            &w.colsums[g * n + col..g * n + col + width],
                            q.zero(r, g),
                            q.scales[r * groups + g],
                            g == 0,
                        );
                    }
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn quantise_avx2(x: &[f32], k: usize, q: &mut RowsMut) {
        quantise_into(x, k, q)
    }
    /// [`quantise_into`] with whole groups in registers (`GROUP / 16` each): the same
    /// operations (and so the same codes) as the portable quantiser, which takes a row's last,
    /// partial group.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn quantise_avx512(x: &[f32], k: usize, q: &mut RowsMut) {
        const SHIFT: f32 = 12_582_912.0;
        quantise_groups_with(x, k, q, |part, dst| {
            if part.len() < GROUP {
                return quantise_group(part, dst);
            }
            // SAFETY: AVX-512 per the caller; a whole group reads GROUP floats of its row and
            // writes GROUP bytes of its codes.
            unsafe {
                let v: [__m512; GROUP / 16] =
                    std::array::from_fn(|i| _mm512_loadu_ps(part.as_ptr().add(16 * i)));
                let (mut lo, mut hi) = (_mm512_setzero_ps(), _mm512_setzero_ps());
                for v in v {
                    lo = _mm512_min_ps(lo, v);
                    hi = _mm512_max_ps(hi, v);
                }
                let (lo, hi) = (_mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi));
                let (scale, inv, zero) = group_scale(lo, hi);
                let (inv, zerov) = (_mm512_set1_ps(inv), _mm512_set1_ps(zero));
                let (shift, top) = (_mm512_set1_ps(SHIFT), _mm512_set1_ps(254.0));
                for (i, v) in v.into_iter().enumerate() {
                    // round_small(v * inv) + zero, clamped, then code_byte
                    let c = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(v, inv), shift), shift);
                    let c = _mm512_add_ps(c, zerov);
                    let c = _mm512_min_ps(_mm512_max_ps(c, _mm512_setzero_ps()), top);
                    let bits = _mm512_castps_si512(_mm512_add_ps(c, shift));
                    let bytes = _mm512_cvtepi32_epi8(bits);
                    let codes = _mm_sub_epi8(bytes, _mm_set1_epi8(127));
                    _mm_storeu_si128(dst.as_mut_ptr().add(16 * i).cast(), codes);
                }
                (scale, zero as i32 - 127)
            }
        })
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn int8_avx2(q: &Rows, m: usize, w: &PackedI8Linear, out: &mut [f32]) {
        // SAFETY: the features are enabled on this function.
        unsafe { int8_generic::<Avx2, 2, 4>(q, m, w, out) }
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn int8_avx512(q: &Rows, m: usize, w: &PackedI8Linear, out: &mut [f32]) {
        // SAFETY: the features are enabled on this function.
        unsafe { int8_generic::<Avx512, 6, 2>(q, m, w, out) }
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn int8_vnni(
        q: &Rows,
        m: usize,
        w: &PackedI8Linear,
        finish: Finish,
        out: &mut [f32],
    ) -> Finished {
        // six rows: their 12 integer and 12 f32 accumulators, two weight registers and a
        // broadcast fit the 32 registers, so every group's sums stay there (Zen 5, bench
        // extract: 12 rows flushed through memory 72 images/s, kept 83 with spills, 6 rows 96)
        // SAFETY: the features are enabled on this function.
        unsafe { vnni_unsigned::<6>(q, m, w, finish, out) }
    }

    /// One group's products of `R` rows of unsigned codes (`a`, rows `kp` apart) with one
    /// packed block, `vpdpbusd` straight on the bytes (no sign trick: one instruction per
    /// register of products).
    #[inline(always)]
    unsafe fn vnni_group<const R: usize>(
        w: *const i8,
        a: *const u8,
        kp: usize,
    ) -> [[__m512i; 2]; R] {
        // SAFETY: (whole body) AVX-512 VNNI per the caller; w holds GROUP / 4 steps of NB * 4
        // bytes, a R rows of GROUP bytes, kp apart.
        unsafe {
            let mut acc = [[_mm512_setzero_si512(); 2]; R];
            for s in 0..GROUP / 4 {
                let w0 = _mm512_loadu_si512(w.add(s * NB * 4).cast());
                let w1 = _mm512_loadu_si512(w.add(s * NB * 4 + 64).cast());
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = _mm512_set1_epi32(a.add(r * kp + 4 * s).cast::<i32>().read_unaligned());
                    acc[0] = _mm512_dpbusd_epi32(acc[0], x, w0);
                    acc[1] = _mm512_dpbusd_epi32(acc[1], x, w1);
                }
            }
            acc
        }
    }

    /// One group's integer products of `rows` rows from `r` (unsigned codes, `[m, kp]`) with
    /// packed block `blk` into `dst`.
    #[inline(always)]
    unsafe fn vnni_group_rows<const R: usize>(
        w: &PackedI8Linear,
        codes: &[u8],
        r: usize,
        rows: usize,
        blk: usize,
        g: usize,
        dst: &mut [[__m512i; 2]],
    ) {
        let kp = w.kp;
        // SAFETY: (whole body) AVX-512 VNNI per the caller; codes holds rows r..r + rows of kp
        // bytes, the packed block kp / 4 * NB * 4 bytes.
        unsafe {
            let panel = w.codes.as_ptr().add(blk * kp * NB + g * GROUP * NB);
            let a = codes.as_ptr().add(r * kp + g * GROUP);
            if rows == R {
                let acc = vnni_group::<R>(panel, a, kp);
                dst[..R].copy_from_slice(&acc);
            } else {
                for i in 0..rows {
                    let [acc] = vnni_group::<1>(panel, a.add(i * kp), kp);
                    dst[i] = acc;
                }
            }
        }
    }

    /// [`int8_generic`] on VNNI with the activations' codes made unsigned (plus 128): the
    /// products of a group are then `sum (c + 128) w`, and the zero point they carry is 128
    /// more than the signed codes' ([`add_group`]), so the sums (and the outputs) are exactly
    /// those of the signed kernels on every other level. Whole blocks of `R` rows and 32
    /// columns keep their sums in registers across the groups and are finished there (as
    /// [`finish_columns`](super::finish_columns) would); what it returns says which outputs
    /// are final.
    #[inline(always)]
    unsafe fn vnni_unsigned<const R: usize>(
        q: &Rows,
        m: usize,
        w: &PackedI8Linear,
        finish: Finish,
        out: &mut [f32],
    ) -> Finished {
        let (n, groups) = (w.n, w.groups());
        // the signed codes plus 128, as unsigned bytes
        let made: Vec<u8>;
        let codes: &[u8] = match q.unsigned {
            Some(codes) => codes,
            None => {
                made = {
                    let mut u = vec![0u8; q.codes.len()];
                    super::unsigned_codes(q.codes, &mut u);
                    u
                };
                &made
            }
        };
        // SAFETY: (whole body) AVX-512 VNNI per the caller; codes is [m, kp], out [m, n], each
        // packed block kp / 4 * NB * 4 bytes, w.colsums [groups, n], q.scales [m, groups].
        unsafe {
            let mut acc = [[_mm512_setzero_si512(); 2]; R];
            let mut buf = [0i32; NB];
            for blk in 0..n.div_ceil(NB) {
                let (col, width) = (blk * NB, NB.min(n - blk * NB));
                let mut r = 0;
                while r < m {
                    let rows = R.min(m - r);
                    if rows == R && width == NB {
                        // every group's f32 sums kept in registers and stored once (flushing
                        // each group through memory cost a load and a store per register and
                        // group)
                        let mut sums = [[_mm512_setzero_ps(); 2]; R];
                        for g in 0..groups {
                            vnni_group_rows::<R>(w, codes, r, R, blk, g, &mut acc);
                            add_group_registers::<Avx512Vnni, R, 2>(
                                &mut sums,
                                &acc,
                                q,
                                w,
                                (r, col, g),
                                UNSIGNED,
                            );
                        }
                        // finished as finish_columns does it, or added where asked
                        for (i, s) in sums.iter().enumerate() {
                            let at = (r + i) * n + col;
                            for v in 0..2 {
                                let scale = _mm512_loadu_ps(w.scales.as_ptr().add(col + 16 * v));
                                let x = _mm512_mul_ps(s[v], scale);
                                let o = match finish {
                                    Finish::Bias(_) => out.as_mut_ptr().add(at + 16 * v),
                                    Finish::AddTo(into) => into.add(at + 16 * v),
                                };
                                let b = match finish {
                                    Finish::Bias(bias) => bias.as_ptr().add(col + 16 * v),
                                    Finish::AddTo(_) => o,
                                };
                                _mm512_storeu_ps(o, _mm512_add_ps(x, _mm512_loadu_ps(b)));
                            }
                        }
                        r += R;
                        continue;
                    }
                    for g in 0..groups {
                        vnni_group_rows::<R>(w, codes, r, rows, blk, g, &mut acc);
                        for (i, a) in acc[..rows].iter().enumerate() {
                            if width == NB {
                                let at = (r + i, col, g);
                                flush::<Avx512Vnni, 1, 2>(
                                    &[*a],
                                    q,
                                    w,
                                    at,
                                    UNSIGNED,
                                    out.as_mut_ptr(),
                                );
                            } else {
                                _mm512_storeu_si512(buf.as_mut_ptr().cast(), a[0]);
                                _mm512_storeu_si512(buf.as_mut_ptr().add(16).cast(), a[1]);
                                let o = (r + i) * n + col;
                                add_group(
                                    &mut out[o..o + width],
                                    &buf[..width],
                                    &w.colsums[g * n + col..g * n + col + width],
                                    q.zero(r + i, g) + UNSIGNED,
                                    q.scales[(r + i) * groups + g],
                                    g == 0,
                                );
                            }
                        }
                    }
                    r += rows;
                }
            }
        }
        Finished {
            rows: m / R * R,
            columns: n / NB * NB,
        }
    }

    /// The group-wise int8 products on AMX tiles: blocks of 32 rows (16 at the end, then the
    /// last rows through a zero-padded copy) and 32 columns, each group one tile product per
    /// 16 x 16 outputs whose int32 sums go through memory into the block's f32 sums by the
    /// operations of [`add_group`] (in AVX-512 registers, as on VNNI), so that the outputs are
    /// those of every other level. The whole 16-column vectors are finished here (as VNNI
    /// finishes its blocks); the columns past them are left as group sums in `out` for the
    /// caller (what it returns says which).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn int8_products_amx(
        q: &Rows,
        m: usize,
        w: &PackedI8Linear,
        tiles: &PackedI8,
        finish: Finish,
        out: &mut [f32],
    ) -> Finished {
        const BLOCK: usize = 32;
        let (kp, n, groups) = (w.kp, w.n, w.groups());
        let col_blocks = n.div_ceil(16);
        let mut products = [[0i32; BLOCK]; BLOCK];
        let mut sums = [[0f32; BLOCK]; BLOCK];
        // SAFETY: (whole body) AVX-512 per the caller; every block of A read lies in q.codes
        // (blocks of 32 and 16 rows, then the last rows with tiles of that many rows); out is
        // [m, n], colsums [groups, n], scales [n], q.scales [m, groups], and only columns < n
        // are read from the products or written.
        unsafe {
            crate::amx::for_row_blocks(m, |tile, r, rows, two_rows| {
                let a = q.codes.as_ptr().add(r * kp);
                for cb in (0..col_blocks).step_by(2) {
                    let two_columns = cb + 1 < col_blocks;
                    let col = cb * 16;
                    let width = (n - col).min(BLOCK);
                    let vectors = width / 16;
                    for g in 0..groups {
                        tile.i8_slice_block(
                            two_rows,
                            two_columns,
                            a.add(g * GROUP),
                            kp,
                            tiles,
                            cb,
                            g,
                            &mut products,
                        );
                        let colsums = &w.colsums[g * n + col..g * n + col + width];
                        let c: [__m512; 2] = std::array::from_fn(|v| {
                            if v < vectors {
                                _mm512_loadu_ps(colsums.as_ptr().add(16 * v))
                            } else {
                                _mm512_setzero_ps()
                            }
                        });
                        for i in 0..rows {
                            let scale = q.scales[(r + i) * groups + g];
                            let zero = q.zero(r + i, g);
                            let (scale_v, zero_v) = (_mm512_set1_ps(scale), _mm512_set1_ps(-zero));
                            for v in 0..vectors {
                                let p = _mm512_loadu_si512(products[i].as_ptr().add(16 * v).cast());
                                let x = _mm512_fmadd_ps(zero_v, c[v], _mm512_cvtepi32_ps(p));
                                let x = _mm512_mul_ps(x, scale_v);
                                let s = sums[i].as_mut_ptr().add(16 * v);
                                let x = if g == 0 {
                                    x
                                } else {
                                    _mm512_add_ps(_mm512_loadu_ps(s), x)
                                };
                                _mm512_storeu_ps(s, x);
                            }
                            let rest = 16 * vectors..width;
                            add_group(
                                &mut sums[i][rest.clone()],
                                &products[i][rest.clone()],
                                &colsums[rest],
                                zero,
                                scale,
                                g == 0,
                            );
                        }
                    }
                    // the whole vectors finished as finish_columns does it (or added where
                    // asked), the rest left as sums
                    for (i, s) in sums[..rows].iter().enumerate() {
                        let at = (r + i) * n + col;
                        for v in 0..vectors {
                            let scale = _mm512_loadu_ps(w.scales.as_ptr().add(col + 16 * v));
                            let x = _mm512_mul_ps(_mm512_loadu_ps(s.as_ptr().add(16 * v)), scale);
                            let (o, b) = match finish {
                                Finish::Bias(bias) => (
                                    out.as_mut_ptr().add(at + 16 * v),
                                    bias.as_ptr().add(col + 16 * v),
                                ),
                                Finish::AddTo(into) => {
                                    let o = into.add(at + 16 * v);
                                    (o, o.cast_const())
                                }
                            };
                            _mm512_storeu_ps(o, _mm512_add_ps(x, _mm512_loadu_ps(b)));
                        }
                        out[at + 16 * vectors..at + width].copy_from_slice(&s[16 * vectors..width]);
                    }
                }
            });
        }
        Finished {
            rows: m,
            columns: n / 16 * 16,
        }
    }

    /// What VNNI's unsigned codes add to the signed ones (and so to their zero point).
    const UNSIGNED: f32 = 128.0;

    /// The group-wise int8 products on AVX-512, with VNNI where the CPU has it.
    pub unsafe fn int8_products_avx512(
        q: &Rows,
        m: usize,
        w: &PackedI8Linear,
        finish: Finish,
        out: &mut [f32],
    ) -> Finished {
        if has_avx512_vnni() {
            // SAFETY: VNNI was detected; AVX-512 per the caller.
            unsafe { int8_vnni(q, m, w, finish, out) }
        } else {
            // SAFETY: AVX-512 per the caller.
            unsafe { int8_avx512(q, m, w, out) };
            Finished::NONE
        }
    }

    /// The group-wise int8 products on AVX2.
    pub unsafe fn int8_products_avx2(
        q: &Rows,
        m: usize,
        w: &PackedI8Linear,
        out: &mut [f32],
    ) -> Finished {
        // SAFETY: AVX2 and FMA per the caller.
        unsafe { int8_avx2(q, m, w, out) };
        Finished::NONE
    }
}
