//! Matrix products with the right-hand side packed once: f32 products of strided operands
//! (attention, whitening), and linear layers `x W + b` in f32 or int8 for the ViT.
//!
//! `B` (`[k, n]`) is packed in blocks of [`NB`] columns, each `[k, NB]`; rows of `A` are read
//! in place (any row stride) and broadcast against a block, so one block serves many rows
//! from cache. The same register-blocked kernels as MaxSim do the work.
//!
//! The int8 linear layer quantises `x` dynamically per row and per group of [`GROUP`]
//! inputs (asymmetric, 255 levels: GELU outputs are lopsided) and `W` per column
//! (symmetric, 8 bits). Both are stored as signed bytes, whose products every kernel computes
//! exactly (the sign trick on AVX2, `vpdpbusd` on AVX-512 VNNI, AMX tiles), group by group;
//! each group's integers are then scaled into f32 sums by one function for all levels, so
//! int8 outputs are bit-identical across levels. Token cosine to f32 on real crater crops:
//! see the model crate's parity test.

use crate::amx::{self, PackedI8};
use crate::int8::round_small;
use crate::level::{active, detected, Level};
use rayon::prelude::*;

/// Columns per packed block.
pub const NB: usize = 32;

/// Inputs per quantisation group of the int8 linear layer: each row of `x` and each column
/// of `W` has its own scale per group (and `x` its own zero point), which keeps outlier
/// channels from costing the rest their precision.
pub const GROUP: usize = 64;

/// The right-hand side `B` (`[k, n]`) of f32 products, packed for one level.
#[derive(Clone, Debug)]
pub struct PackedF32 {
    k: usize,
    n: usize,
    level: Level,
    /// `[blocks][k][NB]`, columns past `n` zero.
    data: Vec<f32>,
}

impl PackedF32 {
    /// Packs `B` given row-major (`b[i * n + j] = B[i, j]`).
    pub fn from_kn(b: &[f32], k: usize, n: usize) -> Self {
        Self::pack(k, n, active(), |i, j| b[i * n + j])
    }

    /// Packs `B` given row-major with its own row stride (`b[i * stride + j] = B[i, j]`; e.g.
    /// the values of an attention head inside fused q|k|v rows).
    pub fn from_rows(b: &[f32], k: usize, n: usize, stride: usize) -> Self {
        Self::pack(k, n, active(), |i, j| b[i * stride + j])
    }

    /// Packs `B` given by its columns: column `j` is `bt[j * stride..j * stride + k]` (e.g. the
    /// keys of an attention head, whose products with the queries are `Q K^T`).
    pub fn from_columns(bt: &[f32], n: usize, k: usize, stride: usize) -> Self {
        Self::pack(k, n, active(), |i, j| bt[j * stride + i])
    }

    /// [`PackedF32::from_kn`] for the kernels of `level` (capped at what the CPU has).
    pub fn from_kn_at(level: Level, b: &[f32], k: usize, n: usize) -> Self {
        Self::pack(k, n, level.min(detected()), |i, j| b[i * n + j])
    }

    fn pack(k: usize, n: usize, level: Level, at: impl Fn(usize, usize) -> f32) -> Self {
        let blocks = n.div_ceil(NB);
        let mut data = vec![0f32; blocks * k * NB];
        for b in 0..blocks {
            for i in 0..k {
                for c in 0..NB.min(n - b * NB) {
                    data[(b * k + i) * NB + c] = at(i, b * NB + c);
                }
            }
        }
        Self { k, n, level, data }
    }

    pub fn k(&self) -> usize {
        self.k
    }
    pub fn n(&self) -> usize {
        self.n
    }

    /// `B` back as row-major `[k, n]` (the packing keeps every value).
    pub fn unpack(&self) -> Vec<f32> {
        let (k, n) = (self.k, self.n);
        let mut b = vec![0f32; k * n];
        for j in 0..n {
            let (blk, c) = (j / NB, j % NB);
            for i in 0..k {
                b[i * n + j] = self.data[(blk * k + i) * NB + c];
            }
        }
        b
    }
}

/// `out[r * ldo + j] (+)= sum_i a[r * lda + i] * B[i, j]` for `r < m`, `j < n`, on this thread.
/// With `accumulate` the products are added to what `out` holds.
pub fn matmul_f32(
    a: &[f32],
    m: usize,
    lda: usize,
    b: &PackedF32,
    out: &mut [f32],
    ldo: usize,
    accumulate: bool,
) {
    let (k, n) = (b.k, b.n);
    if m == 0 || n == 0 {
        return;
    }
    assert!(lda >= k && ldo >= n, "row strides shorter than the rows");
    assert!(a.len() >= (m - 1) * lda + k, "a is shorter than m rows");
    assert!(out.len() >= (m - 1) * ldo + n, "out is shorter than m rows");
    #[cfg(target_arch = "x86_64")]
    if b.level > Level::Portable {
        // SAFETY: the level is only used on CPUs with its features; the shapes were checked.
        unsafe { x86::matmul_f32(a, m, lda, b, out, ldo, accumulate) };
        return;
    }
    let mut acc = [0f32; NB];
    for (blk, panel) in b.data.chunks_exact(k * NB).enumerate() {
        let width = NB.min(n - blk * NB);
        for r in 0..m {
            acc.fill(0.0);
            let row = &a[r * lda..r * lda + k];
            for (&x, w) in row.iter().zip(panel.chunks_exact(NB)) {
                for c in 0..NB {
                    acc[c] += x * w[c];
                }
            }
            let o = &mut out[r * ldo + blk * NB..r * ldo + blk * NB + width];
            if accumulate {
                o.iter_mut().zip(&acc).for_each(|(o, a)| *o += a);
            } else {
                o.copy_from_slice(&acc[..width]);
            }
        }
    }
}

/// Rows per task of a linear layer: a chunk of `x` and one packed block stay in L2.
fn rows_per_task(k: usize) -> usize {
    ((96 * 1024) / (4 * k.max(1))).clamp(6, 512) / 6 * 6
}

/// `out[m, n] = x[m, k] W + bias`, all row-major, in parallel over chunks of rows.
pub fn linear_f32(x: &[f32], m: usize, w: &PackedF32, bias: &[f32], out: &mut [f32]) {
    let (k, n) = (w.k, w.n);
    assert!(x.len() >= m * k && out.len() >= m * n && bias.len() == n);
    let rows = rows_per_task(k);
    out[..m * n]
        .par_chunks_mut(rows * n)
        .zip(x[..m * k].par_chunks(rows * k))
        .for_each(|(o, x)| {
            let mr = x.len() / k;
            for row in o.chunks_exact_mut(n) {
                row.copy_from_slice(bias);
            }
            matmul_f32(x, mr, k, w, o, n, true);
        });
}

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
    /// `[groups][n]`: each group's column sums of codes (exact small integers, kept as f32 for
    /// the activations' zero points).
    colsums: Vec<f32>,
    /// AMX: each group's codes as the columns of signed tile products.
    tiles: Vec<PackedI8>,
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
        let tiles = if level == Level::Amx && PackedI8::fits(GROUP) {
            (0..groups)
                .map(|g| {
                    let slice: Vec<i8> = columns
                        .chunks_exact(kp)
                        .flat_map(|c| c[g * GROUP..(g + 1) * GROUP].iter().copied())
                        .collect();
                    PackedI8::new(&slice, n, GROUP)
                })
                .collect()
        } else {
            Vec::new()
        };
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
}

/// Rows of `x` quantised per group of [`GROUP`] inputs: `x ~ scale * (code - zero)` with
/// codes in 0..=254 (the range widened to hold 0), stored minus 127 as signed bytes so that
/// every kernel multiplies signed by signed: the zero point then becomes `zero - 127`.
struct QuantisedRows {
    /// Row length of `codes`: `k` rounded up to whole groups.
    kp: usize,
    /// `[m, kp]`: `code - 127`, padding zero.
    codes: Vec<i8>,
    /// `[m, groups]`
    scales: Vec<f32>,
    /// `[m, groups]`: `zero - 127`.
    zeros: Vec<i32>,
}

fn quantise_rows(x: &[f32], m: usize, k: usize, kp: usize, level: Level) -> QuantisedRows {
    let groups = kp / GROUP;
    let mut q = QuantisedRows {
        kp,
        codes: vec![0i8; m * kp],
        scales: vec![1f32; m * groups],
        zeros: vec![0i32; m * groups],
    };
    #[cfg(target_arch = "x86_64")]
    match level {
        // SAFETY: the level is only used on CPUs with its features.
        Level::Avx512 | Level::Amx => unsafe { x86::quantise_avx512(x, k, &mut q) },
        // SAFETY: as above.
        Level::Avx2 => unsafe { x86::quantise_avx2(x, k, &mut q) },
        Level::Portable => quantise_into(x, k, &mut q),
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = level;
        quantise_into(x, k, &mut q);
    }
    q
}

/// The quantiser: the same operations on every level (compiled wider where the CPU allows).
#[inline(always)]
fn quantise_into(x: &[f32], k: usize, q: &mut QuantisedRows) {
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
            let scale = if hi > lo { (hi - lo) / 254.0 } else { 1.0 };
            let inv = 1.0 / scale;
            let zero = round_small(-lo * inv).clamp(0.0, 254.0);
            for (d, &v) in dst.iter_mut().zip(part) {
                *d = ((round_small(v * inv) + zero).clamp(0.0, 254.0) - 127.0) as i8;
            }
            // padding inside a group multiplies zero weights; keep it at the zero point
            for d in dst[part.len()..].iter_mut() {
                *d = (zero - 127.0) as i8;
            }
            q.scales[r * groups + g] = scale;
            q.zeros[r * groups + g] = zero as i32 - 127;
        }
    }
}

/// `out[m, n] = x[m, k] W + bias` with int8 products; in parallel over chunks of rows.
pub fn linear_i8(x: &[f32], m: usize, w: &PackedI8Linear, bias: &[f32], out: &mut [f32]) {
    let (k, n) = (w.k, w.n);
    assert!(x.len() >= m * k && out.len() >= m * n && bias.len() == n);
    let rows = rows_per_task(k);
    out[..m * n]
        .par_chunks_mut(rows * n)
        .zip(x[..m * k].par_chunks(rows * k))
        .for_each(|(o, x)| {
            let mr = x.len() / k;
            let q = quantise_rows(x, mr, k, w.kp, w.level);
            int8_products(&q, mr, w, o);
            let mut shift = vec![0f32; n];
            for (r, o) in o.chunks_exact_mut(n).enumerate() {
                finish_row(o, &mut shift, &q, r, w, bias);
            }
        });
}

/// Turns one row's group sums into outputs: `out = (sums - shift) * w_scale + bias`, where
/// `shift[j] = sum_g (scale_g * zero_g) * colsum_g[j]` removes the zero points. The same
/// operations on every level (compiled wider where the CPU allows).
fn finish_row(
    out: &mut [f32],
    shift: &mut [f32],
    q: &QuantisedRows,
    r: usize,
    w: &PackedI8Linear,
    bias: &[f32],
) {
    #[cfg(target_arch = "x86_64")]
    match w.level {
        Level::Avx512 | Level::Amx => {
            // SAFETY: the level is only used on CPUs with its features.
            return unsafe { x86::finish_avx512(out, shift, q, r, w, bias) };
        }
        // SAFETY: as above.
        Level::Avx2 => return unsafe { x86::finish_avx2(out, shift, q, r, w, bias) },
        Level::Portable => {}
    }
    finish_row_plain(out, shift, q, r, w, bias)
}

#[inline(always)]
fn finish_row_plain(
    out: &mut [f32],
    shift: &mut [f32],
    q: &QuantisedRows,
    r: usize,
    w: &PackedI8Linear,
    bias: &[f32],
) {
    let (n, groups) = (w.n, w.groups());
    shift.fill(0.0);
    for g in 0..groups {
        let c = q.scales[r * groups + g] * q.zeros[r * groups + g] as f32;
        for (s, &sum) in shift.iter_mut().zip(&w.colsums[g * n..(g + 1) * n]) {
            *s += c * sum;
        }
    }
    for j in 0..n {
        out[j] = (out[j] - shift[j]) * w.scales[j] + bias[j];
    }
}

/// One group's integer products into the running sums of one row: `sums[j] += p[j] as f32 *
/// scale` (the first group sets them), the same f32 operations on every level.
#[inline(always)]
fn add_group(sums: &mut [f32], p: &[i32], scale: f32, first: bool) {
    for j in 0..sums.len() {
        let v = p[j] as f32 * scale;
        sums[j] = if first { v } else { sums[j] + v };
    }
}

/// `out[r * n + j] = sum_g scale[r, g] * sum_{i in g} code[r, i] * W8[i, j]`, group by
/// group.
fn int8_products(q: &QuantisedRows, m: usize, w: &PackedI8Linear, out: &mut [f32]) {
    let (kp, n, groups) = (w.kp, w.n, w.groups());
    if !w.tiles.is_empty() {
        let cols = w.tiles[0].columns();
        let mut p = vec![0i32; m * cols];
        for (g, tiles) in w.tiles.iter().enumerate() {
            let a: Vec<i8> = q
                .codes
                .chunks_exact(kp)
                .flat_map(|r| r[g * GROUP..(g + 1) * GROUP].iter().copied())
                .collect();
            amx::i8_products(&a, m, tiles, &mut p);
            for r in 0..m {
                add_group(
                    &mut out[r * n..(r + 1) * n],
                    &p[r * cols..r * cols + n],
                    q.scales[r * groups + g],
                    g == 0,
                );
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if w.level > Level::Portable {
        // SAFETY: the level is only used on CPUs with its features; q.codes is [m, kp],
        // out [m, n], the packed codes [blocks][kp / 4][NB][4].
        unsafe { x86::int8_products(q, m, w, out) };
        return;
    }
    let mut p = [0i32; NB];
    for (blk, panel) in w.codes.chunks_exact(kp * NB).enumerate() {
        let width = NB.min(n - blk * NB);
        let col = blk * NB;
        for r in 0..m {
            let row = &q.codes[r * kp..(r + 1) * kp];
            for g in 0..groups {
                p.fill(0);
                let quads = row[g * GROUP..(g + 1) * GROUP].chunks_exact(4);
                let wq = panel[g * GROUP * NB..(g + 1) * GROUP * NB].chunks_exact(4 * NB);
                for (quad, wq) in quads.zip(wq) {
                    for c in 0..NB {
                        for t in 0..4 {
                            p[c] += quad[t] as i32 * wq[c * 4 + t] as i32;
                        }
                    }
                }
                add_group(
                    &mut out[r * n + col..r * n + col + width],
                    &p[..width],
                    q.scales[r * groups + g],
                    g == 0,
                );
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{
        add_group, finish_row_plain, quantise_into, PackedF32, PackedI8Linear, QuantisedRows,
        GROUP, NB,
    };
    use crate::f32::x86::rows_block;
    use crate::level::{has_avx512_vnni, Level};
    use crate::simd::{Avx2, Avx512, Avx512Vnni, Vector};

    /// Stores `R` rows of accumulators into `out` at column `col`; a block's last, narrower
    /// columns go through a buffer.
    #[inline(always)]
    unsafe fn store_f32<V: Vector, const R: usize, const NV: usize>(
        acc: &[[V::F; NV]; R],
        out: *mut f32,
        ldo: usize,
        width: usize,
        accumulate: bool,
    ) {
        // SAFETY: (whole body) features of V per the caller; out holds R rows of width
        // floats, ldo apart.
        unsafe {
            let mut buf = [0f32; NB];
            for (r, a) in acc.iter().enumerate() {
                let o = out.add(r * ldo);
                for (v, a) in a.iter().enumerate() {
                    V::store_f(buf.as_mut_ptr().add(v * V::LANES), *a);
                }
                for c in 0..width {
                    *o.add(c) = if accumulate {
                        *o.add(c) + buf[c]
                    } else {
                        buf[c]
                    };
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn matmul_generic<V: Vector, const R: usize, const NV: usize>(
        a: &[f32],
        m: usize,
        lda: usize,
        b: &PackedF32,
        out: &mut [f32],
        ldo: usize,
        accumulate: bool,
    ) {
        let (k, n) = (b.k, b.n);
        // SAFETY: (whole body) features of V per the caller; the caller checked that a holds
        // m rows of k floats lda apart and out m rows of n floats ldo apart.
        unsafe {
            for (blk, panel) in b.data.chunks_exact(k * NB).enumerate() {
                let width = NB.min(n - blk * NB);
                let o = out.as_mut_ptr().add(blk * NB);
                let mut r = 0;
                while r + R <= m {
                    let acc =
                        rows_block::<V, R, NV>(panel.as_ptr(), a.as_ptr().add(r * lda), lda, k);
                    store_f32::<V, R, NV>(&acc, o.add(r * ldo), ldo, width, accumulate);
                    r += R;
                }
                while r < m {
                    let acc =
                        rows_block::<V, 1, NV>(panel.as_ptr(), a.as_ptr().add(r * lda), lda, k);
                    store_f32::<V, 1, NV>(&acc, o.add(r * ldo), ldo, width, accumulate);
                    r += 1;
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn matmul_avx2(
        a: &[f32],
        m: usize,
        lda: usize,
        b: &PackedF32,
        out: &mut [f32],
        ldo: usize,
        acc: bool,
    ) {
        // SAFETY: the features are enabled on this function.
        unsafe { matmul_generic::<Avx2, 3, 4>(a, m, lda, b, out, ldo, acc) }
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn matmul_avx512(
        a: &[f32],
        m: usize,
        lda: usize,
        b: &PackedF32,
        out: &mut [f32],
        ldo: usize,
        acc: bool,
    ) {
        // SAFETY: the features are enabled on this function.
        unsafe { matmul_generic::<Avx512, 8, 2>(a, m, lda, b, out, ldo, acc) }
    }

    /// The f32 product at the packed operand's level (a vector level).
    pub unsafe fn matmul_f32(
        a: &[f32],
        m: usize,
        lda: usize,
        b: &PackedF32,
        out: &mut [f32],
        ldo: usize,
        acc: bool,
    ) {
        match b.level {
            // SAFETY: the level is only used on CPUs with its features.
            Level::Avx512 | Level::Amx => unsafe { matmul_avx512(a, m, lda, b, out, ldo, acc) },
            // SAFETY: as above.
            _ => unsafe { matmul_avx2(a, m, lda, b, out, ldo, acc) },
        }
    }

    /// Integer products of `R` rows of signed codes (row stride `kp`) with one packed block,
    /// over one group (`GROUP / 4` steps of four bytes from `a` and `w`).
    #[inline(always)]
    unsafe fn group_block<V: Vector, const R: usize, const NV: usize>(
        w: *const i8,
        a: *const i8,
        kp: usize,
    ) -> [[V::I; NV]; R] {
        // SAFETY: (whole body) features of V per the caller; w holds GROUP / 4 steps of NB * 4
        // bytes, a R rows of GROUP bytes, kp apart.
        unsafe {
            let mut acc = [[V::zero_i(); NV]; R];
            for kk in 0..GROUP / 4 {
                let mut x = [V::zero_i(); R];
                let mut abs = [V::zero_i(); R];
                for r in 0..R {
                    x[r] = V::splat4_i8(a.add(r * kp + 4 * kk));
                    abs[r] = V::abs_i8(x[r]);
                }
                for v in 0..NV {
                    let wv = V::load_i(w.add((kk * NB + v * V::LANES) * 4));
                    for r in 0..R {
                        acc[r][v] = V::dot4_acc(acc[r][v], x[r], abs[r], wv);
                    }
                }
            }
            acc
        }
    }

    /// One group's products of `R` rows into their f32 sums at `out` (row stride `n`):
    /// `sum += p as f32 * scale` (the first group sets them), the operations of [`add_group`]
    /// (no fused multiply-add), so that every level rounds alike.
    #[inline(always)]
    unsafe fn flush<V: Vector, const R: usize, const NV: usize>(
        acc: &[[V::I; NV]; R],
        scales: [f32; R],
        out: *mut f32,
        n: usize,
        first: bool,
    ) {
        // SAFETY: (whole body) features of V per the caller; out holds R rows of NV * LANES
        // floats, n apart.
        unsafe {
            for (r, a) in acc.iter().enumerate() {
                let s = V::splat_f(scales[r]);
                for (v, a) in a.iter().enumerate() {
                    let o = out.add(r * n + v * V::LANES);
                    let p = V::mul_f(V::to_f(*a), s);
                    V::store_f(o, if first { p } else { V::add_f(V::load_f(o), p) });
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn int8_generic<V: Vector, const R: usize, const NV: usize>(
        q: &QuantisedRows,
        m: usize,
        w: &PackedI8Linear,
        out: &mut [f32],
    ) {
        let (kp, n, groups) = (w.kp, w.n, w.groups());
        let full = n / NB;
        // SAFETY: (whole body) features of V per the caller; q.codes is [m, kp], out [m, n],
        // each packed block kp / 4 * NB * 4 bytes, w.scales [groups, n].
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
                        let scales = std::array::from_fn(|i| q.scales[(r + i) * groups + g]);
                        flush::<V, R, NV>(
                            &acc,
                            scales,
                            out.as_mut_ptr().add(r * n + col),
                            n,
                            g == 0,
                        );
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
                        let scale = q.scales[r * groups + g];
                        flush::<V, 1, NV>(
                            &acc,
                            [scale],
                            out.as_mut_ptr().add(r * n + col),
                            n,
                            g == 0,
                        );
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
                            q.scales[r * groups + g],
                            g == 0,
                        );
                    }
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn finish_avx2(
        out: &mut [f32],
        shift: &mut [f32],
        q: &QuantisedRows,
        r: usize,
        w: &PackedI8Linear,
        bias: &[f32],
    ) {
        finish_row_plain(out, shift, q, r, w, bias)
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn finish_avx512(
        out: &mut [f32],
        shift: &mut [f32],
        q: &QuantisedRows,
        r: usize,
        w: &PackedI8Linear,
        bias: &[f32],
    ) {
        finish_row_plain(out, shift, q, r, w, bias)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn quantise_avx2(x: &[f32], k: usize, q: &mut QuantisedRows) {
        quantise_into(x, k, q)
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn quantise_avx512(x: &[f32], k: usize, q: &mut QuantisedRows) {
        quantise_into(x, k, q)
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn int8_avx2(q: &QuantisedRows, m: usize, w: &PackedI8Linear, out: &mut [f32]) {
        // SAFETY: the features are enabled on this function.
        unsafe { int8_generic::<Avx2, 2, 4>(q, m, w, out) }
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn int8_avx512(q: &QuantisedRows, m: usize, w: &PackedI8Linear, out: &mut [f32]) {
        // SAFETY: the features are enabled on this function.
        unsafe { int8_generic::<Avx512, 6, 2>(q, m, w, out) }
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn int8_vnni(q: &QuantisedRows, m: usize, w: &PackedI8Linear, out: &mut [f32]) {
        // SAFETY: the features are enabled on this function.
        unsafe { int8_generic::<Avx512Vnni, 6, 2>(q, m, w, out) }
    }

    /// The group-wise int8 products at the packed weight's level (a vector level).
    pub unsafe fn int8_products(q: &QuantisedRows, m: usize, w: &PackedI8Linear, out: &mut [f32]) {
        match w.level {
            // SAFETY: VNNI was detected; the level's other features are present.
            Level::Avx512 | Level::Amx if has_avx512_vnni() => unsafe { int8_vnni(q, m, w, out) },
            // SAFETY: the level is only used on CPUs with its features.
            Level::Avx512 | Level::Amx => unsafe { int8_avx512(q, m, w, out) },
            // SAFETY: as above.
            _ => unsafe { int8_avx2(q, m, w, out) },
        }
    }
}
