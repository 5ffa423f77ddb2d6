//! f32 matrix products with the right-hand side packed once: products of strided operands
//! (attention, whitening) and the ViT's f32 linear layers `x W + b` (the int8 ones are
//! `linear_i8`'s).
//!
//! `B` (`[k, n]`) is packed in blocks of [`NB`] columns, each `[k, NB]`; rows of `A` are read
//! in place (any row stride) and broadcast against a block, so one block serves many rows
//! from cache. The same register-blocked kernels as MaxSim do the work.

use crate::level::{active, detected, dispatch, Level};
use rayon::prelude::*;

/// Columns per packed block.
pub const NB: usize = 32;

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
        let mut p = Self::zeroed(0, 0, active());
        p.refill_from_rows(b, k, n, stride);
        p
    }

    /// [`PackedF32::from_rows`] into this packing's memory (one attention head after another
    /// allocates nothing).
    pub fn refill_from_rows(&mut self, b: &[f32], k: usize, n: usize, stride: usize) {
        assert!(
            k == 0 || b.len() >= (k - 1) * stride + n,
            "b is shorter than k rows"
        );
        self.reshape(k, n);
        if self.data.is_empty() {
            return;
        }
        // each row's columns of a block are contiguous on both sides
        for (blk, panel) in self.data.chunks_exact_mut(k * NB).enumerate() {
            let (col, width) = (blk * NB, NB.min(n - blk * NB));
            for (i, dst) in panel.chunks_exact_mut(NB).enumerate() {
                dst[..width].copy_from_slice(&b[i * stride + col..i * stride + col + width]);
                dst[width..].fill(0.0);
            }
        }
    }

    /// Packs `B` given by its columns: column `j` is `bt[j * stride..j * stride + k]` (e.g. the
    /// keys of an attention head, whose products with the queries are `Q K^T`).
    pub fn from_columns(bt: &[f32], n: usize, k: usize, stride: usize) -> Self {
        let mut p = Self::zeroed(0, 0, active());
        p.refill_from_columns(bt, n, k, stride);
        p
    }

    /// [`PackedF32::from_columns`] into this packing's memory.
    pub fn refill_from_columns(&mut self, bt: &[f32], n: usize, k: usize, stride: usize) {
        assert!(
            n == 0 || bt.len() >= (n - 1) * stride + k,
            "bt is shorter than n columns"
        );
        self.reshape(k, n);
        if self.data.is_empty() {
            return;
        }
        let level = self.level;
        for (blk, panel) in self.data.chunks_exact_mut(k * NB).enumerate() {
            let width = NB.min(n - blk * NB);
            let columns = &bt[blk * NB * stride..];
            // eight columns at a time transposed in registers where the level has them: one
            // element at a time, each store waiting on its load, took 12% of the attention's
            // time (Zen 4, one thread), 6% this way
            let done = dispatch!(level,
                avx512 => x86::transpose_eights_avx2(columns, width, k, stride, panel),
                avx2 => x86::transpose_eights_avx2(columns, width, k, stride, panel),
                portable => 0);
            transpose_columns(columns, done..width, k, stride, panel);
            if width < NB {
                panel
                    .chunks_exact_mut(NB)
                    .for_each(|row| row[width..].fill(0.0));
            }
        }
    }

    /// Sizes the packing for a `[k, n]` right-hand side, keeping its memory.
    fn reshape(&mut self, k: usize, n: usize) {
        self.k = k;
        self.n = n;
        self.data.resize(n.div_ceil(NB) * k * NB, 0.0);
    }

    /// [`PackedF32::from_kn`] for the kernels of `level` (capped at what the CPU has).
    pub fn from_kn_at(level: Level, b: &[f32], k: usize, n: usize) -> Self {
        Self::pack(k, n, level.min(detected()), |i, j| b[i * n + j])
    }

    fn pack(k: usize, n: usize, level: Level, at: impl Fn(usize, usize) -> f32) -> Self {
        let mut p = Self::zeroed(k, n, level);
        for b in 0..n.div_ceil(NB) {
            for i in 0..k {
                for c in 0..NB.min(n - b * NB) {
                    p.data[(b * k + i) * NB + c] = at(i, b * NB + c);
                }
            }
        }
        p
    }

    /// A `[k, n]` right-hand side of zeros in whole blocks, for the packers to fill.
    fn zeroed(k: usize, n: usize, level: Level) -> Self {
        let data = vec![0f32; n.div_ceil(NB) * k * NB];
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

/// Columns `cols` of one block (column `c` is `columns[c * stride..c * stride + k]`) into the
/// block's `[k, NB]` panel, one element at a time.
fn transpose_columns(
    columns: &[f32],
    cols: std::ops::Range<usize>,
    k: usize,
    stride: usize,
    panel: &mut [f32],
) {
    for c in cols {
        let column = &columns[c * stride..c * stride + k];
        for (dst, &v) in panel[c..].iter_mut().step_by(NB).zip(column) {
            *dst = v;
        }
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
    // the shapes were checked above
    dispatch!(b.level,
        avx512 => x86::matmul_avx512(a, m, lda, b, out, ldo, accumulate),
        avx2 => x86::matmul_avx2(a, m, lda, b, out, ldo, accumulate),
        portable => matmul_plain(a, m, lda, b, out, ldo, accumulate))
}

fn matmul_plain(
    a: &[f32],
    m: usize,
    lda: usize,
    b: &PackedF32,
    out: &mut [f32],
    ldo: usize,
    accumulate: bool,
) {
    let (k, n) = (b.k, b.n);
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

/// Rows per task of a linear layer: the task's rows times one depth slice stay in L2 (rows of
/// every depth are multiplied a slice at a time, as f32 does; int8 a group at a time), and
/// the rows are a whole number of every level's register blocks (3 on AVX2, 8 on AVX-512, 6
/// and 12 for int8): a leftover row runs one at a time at a fraction of the speed.
pub(crate) fn task_rows(k: usize, m: usize) -> usize {
    let most = ((96 * 1024) / (4 * k.clamp(1, KC))).clamp(24, 512) / 24 * 24;
    // as many tasks as that needs, rounded up to a multiple of the threads and the rows
    // spread evenly over them: 257 rows (one image) as 96 + 96 + 65 kept one of two threads
    // waiting a third of the time
    let threads = rayon::current_num_threads().max(1);
    let tasks = m.div_ceil(most).div_ceil(threads) * threads;
    (m.div_ceil(tasks.max(1)).div_ceil(24) * 24).clamp(24, most)
}

/// Deepest slice of a packed block multiplied at once. A panel deeper than the L1 cache
/// streams from L2 at the two registers per step the kernel needs, while every slice past
/// the first reloads and stores each output tile again: on Zen 4 (32 KiB L1), slices of 384
/// (the ViT-S width whole, its MLP's 1,536 in four) ran the ViT's linear layers 2-3% faster
/// than slices of 192 or 256 that fit L1 (`cargo run --release -p craterdex-kernels --example
/// vit_shapes`).
const KC: usize = 384;

/// `(start, len)` of equal slices of the depth `k`, none deeper than [`KC`].
fn depth_slices(k: usize) -> impl Iterator<Item = (usize, usize)> {
    let slices = k.div_ceil(KC).max(1);
    let len = k.div_ceil(slices);
    (0..k)
        .step_by(len.max(1))
        .map(move |k0| (k0, len.min(k - k0)))
}

/// `out[m, n] = x[m, k] W + bias`, all row-major, in parallel over chunks of rows.
pub fn linear_f32(x: &[f32], m: usize, w: &PackedF32, bias: &[f32], out: &mut [f32]) {
    linear_rows(x, m, w, bias, out, false)
}

/// `out[m, n] += x[m, k] W + bias`: a linear layer added to a residual stream by its own
/// products' stores, without a buffer for the layer's output or a pass to add it.
pub fn linear_f32_residual(x: &[f32], m: usize, w: &PackedF32, bias: &[f32], out: &mut [f32]) {
    linear_rows(x, m, w, bias, out, true)
}

fn linear_rows(x: &[f32], m: usize, w: &PackedF32, bias: &[f32], out: &mut [f32], residual: bool) {
    let (k, n) = (w.k, w.n);
    assert!(x.len() >= m * k && out.len() >= m * n && bias.len() == n);
    let rows = task_rows(k, m);
    out[..m * n]
        .par_chunks_mut(rows * n)
        .zip(x[..m * k].par_chunks(rows * k))
        .for_each(|(o, x)| {
            start_with_bias(o, bias, residual);
            matmul_f32(x, x.len() / k, k, w, o, n, true);
        });
}

/// Rows of a linear layer's output before its products are added: the bias, or the bias
/// added to the residual already there. The bias goes in first, a pass that also brings the
/// task's output rows into cache: adding it in the products' stores instead, those stores
/// missed the cache and the layers ran 3-4% slower.
pub(crate) fn start_with_bias(rows: &mut [f32], bias: &[f32], residual: bool) {
    for row in rows.chunks_exact_mut(bias.len()) {
        if residual {
            row.iter_mut().zip(bias).for_each(|(o, b)| *o += b);
        } else {
            row.copy_from_slice(bias);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{depth_slices, PackedF32, NB};
    use crate::f32::x86::rows_block;
    use crate::simd::{Avx2, Avx512, Vector};

    /// Stores `R` rows of accumulators into `out` at column `col`: whole registers where the
    /// block is full, a block's last, narrower columns through a buffer.
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
            if width == NV * V::LANES {
                for (r, a) in acc.iter().enumerate() {
                    for (v, a) in a.iter().enumerate() {
                        let o = out.add(r * ldo + v * V::LANES);
                        let a = if accumulate {
                            V::add_f(V::load_f(o), *a)
                        } else {
                            *a
                        };
                        V::store_f(o, a);
                    }
                }
                return;
            }
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
            // Depth in slices of at most KC, so the slice of a packed block being multiplied
            // stays in L1 while rows stream past it; later slices add to the first's sums.
            for (k0, kc) in depth_slices(k) {
                let accumulate = accumulate || k0 > 0;
                let a = a.as_ptr().add(k0);
                for (blk, panel) in b.data.chunks_exact(k * NB).enumerate() {
                    let width = NB.min(n - blk * NB);
                    let panel = panel.as_ptr().add(k0 * NB);
                    let o = out.as_mut_ptr().add(blk * NB);
                    if width <= V::LANES {
                        // a last block no wider than a register (the 257th key of a ViT's
                        // Q K^T) multiplied with its first register only: half the work
                        panel_rows::<V, R, 1>(a, m, lda, panel, kc, o, ldo, width, accumulate);
                    } else {
                        panel_rows::<V, R, NV>(a, m, lda, panel, kc, o, ldo, width, accumulate);
                    }
                }
            }
        }
    }

    /// Every row of `a` against the first `NV` registers of one packed block's depth slice.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn panel_rows<V: Vector, const R: usize, const NV: usize>(
        a: *const f32,
        m: usize,
        lda: usize,
        panel: *const f32,
        kc: usize,
        o: *mut f32,
        ldo: usize,
        width: usize,
        accumulate: bool,
    ) {
        // SAFETY: (whole body) features of V per the caller; a holds m rows of kc floats lda
        // apart, panel kc rows of NB floats, o m rows of width floats ldo apart.
        unsafe {
            let mut r = 0;
            while r + R <= m {
                let acc = rows_block::<V, R, NV>(panel, NB, a.add(r * lda), lda, kc);
                store_f32::<V, R, NV>(&acc, o.add(r * ldo), ldo, width, accumulate);
                r += R;
            }
            while r < m {
                let acc = rows_block::<V, 1, NV>(panel, NB, a.add(r * lda), lda, kc);
                store_f32::<V, 1, NV>(&acc, o.add(r * ldo), ldo, width, accumulate);
                r += 1;
            }
        }
    }

    /// The first `width / 8 * 8` columns of one block (column `c` is `columns[c * stride..]`,
    /// `k` long) into its `[k, NB]` panel, eight columns by eight rows at a time through an
    /// 8 x 8 transpose in registers; the depth's last `k % 8` rows of those columns one
    /// element at a time. Returns how many columns it filled.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn transpose_eights_avx2(
        columns: &[f32],
        width: usize,
        k: usize,
        stride: usize,
        panel: &mut [f32],
    ) -> usize {
        use std::arch::x86_64::*;
        let eights = width / 8 * 8;
        assert!(width <= NB && panel.len() >= k * NB);
        assert!(eights == 0 || columns.len() >= (eights - 1) * stride + k);
        let deep = k / 8 * 8;
        let (src, dst) = (columns.as_ptr(), panel.as_mut_ptr());
        for c0 in (0..eights).step_by(8) {
            for i0 in (0..deep).step_by(8) {
                // SAFETY: AVX2 per the caller; rows c0..c0 + 8 of columns hold k >= i0 + 8
                // floats each and the panel k rows of NB >= c0 + 8 (asserted above).
                unsafe {
                    let mut r = [_mm256_setzero_ps(); 8];
                    for (j, r) in r.iter_mut().enumerate() {
                        *r = _mm256_loadu_ps(src.add((c0 + j) * stride + i0));
                    }
                    let t = [
                        _mm256_unpacklo_ps(r[0], r[1]),
                        _mm256_unpackhi_ps(r[0], r[1]),
                        _mm256_unpacklo_ps(r[2], r[3]),
                        _mm256_unpackhi_ps(r[2], r[3]),
                        _mm256_unpacklo_ps(r[4], r[5]),
                        _mm256_unpackhi_ps(r[4], r[5]),
                        _mm256_unpacklo_ps(r[6], r[7]),
                        _mm256_unpackhi_ps(r[6], r[7]),
                    ];
                    // u[i]: depth i (low 128 bits) and i + 4 (high) of columns 0..4; w[i]: the
                    // same of columns 4..8
                    let u = [
                        _mm256_shuffle_ps::<0x44>(t[0], t[2]),
                        _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
                        _mm256_shuffle_ps::<0x44>(t[1], t[3]),
                        _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
                    ];
                    let w = [
                        _mm256_shuffle_ps::<0x44>(t[4], t[6]),
                        _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
                        _mm256_shuffle_ps::<0x44>(t[5], t[7]),
                        _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
                    ];
                    for i in 0..4 {
                        let low = _mm256_permute2f128_ps::<0x20>(u[i], w[i]);
                        let high = _mm256_permute2f128_ps::<0x31>(u[i], w[i]);
                        _mm256_storeu_ps(dst.add((i0 + i) * NB + c0), low);
                        _mm256_storeu_ps(dst.add((i0 + i + 4) * NB + c0), high);
                    }
                }
            }
            for c in c0..c0 + 8 {
                for i in deep..k {
                    panel[i * NB + c] = columns[c * stride + i];
                }
            }
        }
        eights
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn matmul_avx2(
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
    pub unsafe fn matmul_avx512(
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
}
