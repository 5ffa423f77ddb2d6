//! Stride-1 valid convolutions in f32 by Winograd's minimal filtering: 3x3 kernels by
//! F(4x4, 3x3), each 4 x 4 block of outputs from the 6 x 6 block of inputs under it (36
//! element-wise products in a transformed space instead of 144 multiply-adds per channel
//! pair: a quarter), and 2x2 kernels by F(3x3, 2x2), each 3 x 3 block of outputs from the
//! 4 x 4 inputs under it (16 instead of 36: 2.25 times fewer). The products are where a
//! detector spends most of its time.
//!
//! Lavin and Gray's construction ("Fast algorithms for convolutional neural networks",
//! 2016): the filter `g` becomes `G g G^T` once, when the weights are packed; each input
//! block `d` becomes `B^T d B`; each transformed point multiplies a row of a tile of blocks by
//! the point's `[in, out]` matrix (a packed f32 product, [`matmul_f32`]); and `A^T m A`
//! takes the products back to the outputs. F(4x4, 3x3) interpolates at 0, +-1, +-2 and
//! infinity, F(3x3, 2x2) at 0, +-1 and infinity. The transforms only add and scale by small
//! constants; the f32 result carries more rounding than a convolution tap by tap (within 1e-4
//! of the sums in the tests; pycda's U-Net reads within 1e-5 of Keras' likelihoods).

use crate::gemm::{matmul_f32, PackedF32};
use crate::level::{active, detected, dispatch, Level};

/// Blocks whose transformed points one product multiplies at once: a whole number of every
/// level's register blocks (3 rows on AVX2, 8 on AVX-512), and few enough that a tile's
/// transformed inputs and products stay in L2 (36 x 24 x 128 channels x 4 bytes = 442 KB
/// each at the U-Net's widest).
const TILE_BLOCKS: usize = 24;

/// Which of Winograd's algorithms a kernel runs by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tiling {
    /// F(4x4, 3x3), for 3x3 kernels.
    Of3x3,
    /// F(3x3, 2x2), for 2x2 kernels.
    Of2x2,
}

impl Tiling {
    /// The tiling of a `kernel` (rows, columns), if it has one.
    pub fn for_kernel(kernel: [usize; 2]) -> Option<Self> {
        match kernel {
            [3, 3] => Some(Self::Of3x3),
            [2, 2] => Some(Self::Of2x2),
            _ => None,
        }
    }

    /// Outputs per block side: the output rows one call of [`conv_rows`] writes.
    pub fn block(self) -> usize {
        match self {
            Self::Of3x3 => 4,
            Self::Of2x2 => 3,
        }
    }

    /// The kernel's side.
    pub fn taps(self) -> usize {
        match self {
            Self::Of3x3 => 3,
            Self::Of2x2 => 2,
        }
    }

    /// Inputs per block side.
    fn inputs(self) -> usize {
        self.block() + self.taps() - 1
    }

    /// Row `p` of `G`, the filter's transform (`inputs x taps`).
    fn g(self, p: usize) -> &'static [f64] {
        const OF_3X3: [[f64; 3]; 6] = [
            [1.0 / 4.0, 0.0, 0.0],
            [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
            [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
            [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
            [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
            [0.0, 0.0, 1.0],
        ];
        const OF_2X2: [[f64; 2]; 4] = [[1.0, 0.0], [0.5, 0.5], [0.5, -0.5], [0.0, 1.0]];
        match self {
            Self::Of3x3 => &OF_3X3[p],
            Self::Of2x2 => &OF_2X2[p],
        }
    }
}

/// A convolution's weights as its transformed points' `[in, out]` matrices.
#[derive(Clone, Debug)]
pub struct Winograd {
    level: Level,
    tiling: Tiling,
    in_channels: usize,
    filters: usize,
    points: Vec<PackedF32>,
}

impl Winograd {
    /// From the kernel as Keras stores it (`w[((i * kw + j) * in + c) * out + f]` for tap
    /// `(i, j)`, input channel `c` and filter `f`); `None` for a kernel without a tiling.
    pub fn new(kernel: [usize; 2], w: &[f32], in_channels: usize, filters: usize) -> Option<Self> {
        Self::new_at(active(), kernel, w, in_channels, filters)
    }

    /// [`Winograd::new`] for the kernels of `level` (capped at what the CPU has).
    pub fn new_at(
        level: Level,
        kernel: [usize; 2],
        w: &[f32],
        in_channels: usize,
        filters: usize,
    ) -> Option<Self> {
        let tiling = Tiling::for_kernel(kernel)?;
        let level = level.min(detected());
        let (c, f, r, n) = (in_channels, filters, tiling.taps(), tiling.inputs());
        assert_eq!(w.len(), r * r * c * f, "a {r}x{r} kernel of {c} x {f}");
        let mut points = vec![vec![0f32; c * f]; n * n];
        let mut gg = vec![0f64; n * r];
        for ci in 0..c {
            for fi in 0..f {
                let g = |i: usize, j: usize| f64::from(w[((i * r + j) * c + ci) * f + fi]);
                // G g, then (G g) G^T, in f64 so that the packed points carry no error of
                // their own
                for p in 0..n {
                    for j in 0..r {
                        gg[p * r + j] = (0..r).map(|i| tiling.g(p)[i] * g(i, j)).sum();
                    }
                }
                for p in 0..n {
                    for q in 0..n {
                        let v: f64 = (0..r).map(|j| gg[p * r + j] * tiling.g(q)[j]).sum();
                        points[p * n + q][ci * f + fi] = v as f32;
                    }
                }
            }
        }
        Some(Self {
            level,
            tiling,
            in_channels: c,
            filters: f,
            points: points
                .iter()
                .map(|p| PackedF32::from_kn_at(level, p, c, f))
                .collect(),
        })
    }

    pub fn tiling(&self) -> Tiling {
        self.tiling
    }

    pub fn in_channels(&self) -> usize {
        self.in_channels
    }

    pub fn filters(&self) -> usize {
        self.filters
    }
}

/// A part of the convolution's input read in place: input pixel `(y, x)`'s channels of this
/// part are pixel `(y + top, x + left)` of `data` (row-major, `width` pixels a row,
/// `channels` values a pixel). A map is one part at `(0, 0)`; the parts of a concatenation
/// give their channels in order.
#[derive(Clone, Copy, Debug)]
pub struct InputPart<'a> {
    pub data: &'a [f32],
    pub width: usize,
    pub channels: usize,
    pub top: usize,
    pub left: usize,
}

/// Memory one thread reuses from row to row of blocks (about 1 MB at the U-Net's widest).
#[derive(Default)]
struct Scratch {
    transformed: Vec<f32>,
    products: Vec<f32>,
    block: Vec<f32>,
    half: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// Output rows `block * row ..` (at most the tiling's [`Tiling::block`], fewer at the
/// bottom) of the valid convolution of an `in_height x in_width` input (`parts`, whose
/// channels add up to the kernel's), plus `bias`, into `out`: those rows, each `in_width -
/// taps + 1` pixels of `filters` values. Runs on the calling thread, in memory it keeps for
/// its next call.
pub fn conv_rows(
    w: &Winograd,
    parts: &[InputPart],
    [in_height, in_width]: [usize; 2],
    row: usize,
    bias: &[f32],
    out: &mut [f32],
) {
    let (c, f, r, m) = (w.in_channels, w.filters, w.tiling.taps(), w.tiling.block());
    assert!(
        in_height >= r && in_width >= r,
        "an input smaller than the kernel"
    );
    let (oh, ow) = (in_height + 1 - r, in_width + 1 - r);
    let rows = m.min(oh.saturating_sub(row * m));
    assert!(rows > 0, "block row {row} lies past the output's {oh} rows");
    assert_eq!(
        out.len(),
        rows * ow * f,
        "out holds the block row's outputs"
    );
    assert_eq!(bias.len(), f);
    assert_eq!(
        parts.iter().map(|p| p.channels).sum::<usize>(),
        c,
        "the parts' channels are the kernel's"
    );
    for p in parts {
        assert!(
            p.data.len() >= ((p.top + in_height - 1) * p.width + p.left + in_width) * p.channels,
            "a part shorter than the input"
        );
    }
    let job = RowJob {
        w,
        parts,
        in_height,
        in_width,
        y0: row * m,
        rows,
        bias,
    };
    SCRATCH.with_borrow_mut(|scratch| {
        dispatch!(w.level,
            avx512 => x86::rows_avx512(&job, out, scratch),
            avx2 => x86::rows_avx2(&job, out, scratch),
            portable => rows_tiled(&job, out, scratch))
    })
}

struct RowJob<'a> {
    w: &'a Winograd,
    parts: &'a [InputPart<'a>],
    in_height: usize,
    in_width: usize,
    /// The first output row.
    y0: usize,
    rows: usize,
    bias: &'a [f32],
}

/// [`rows_generic`] of the job's tiling.
#[inline(always)]
fn rows_tiled(job: &RowJob, out: &mut [f32], scratch: &mut Scratch) {
    match job.w.tiling {
        Tiling::Of3x3 => rows_generic::<6, 4>(job, out, scratch),
        Tiling::Of2x2 => rows_generic::<4, 3>(job, out, scratch),
    }
}

/// One row of blocks of `M x M` outputs from `N x N` inputs, a tile of [`TILE_BLOCKS`] blocks
/// at a time: inputs transformed, the `N * N` products, outputs transformed back. Inlined
/// into each level's function, so that the transforms' loops over channels are vectorised
/// for it.
#[inline(always)]
fn rows_generic<const N: usize, const M: usize>(
    job: &RowJob,
    out: &mut [f32],
    scratch: &mut Scratch,
) {
    let (c, f) = (job.w.in_channels, job.w.filters);
    let ow = job.in_width + M - N;
    let blocks = ow.div_ceil(M);
    let widest = job.parts.iter().map(|p| p.channels).max().unwrap_or(0);
    scratch.transformed.resize(N * N * TILE_BLOCKS * c, 0.0);
    scratch.products.resize(N * N * TILE_BLOCKS * f, 0.0);
    scratch.block.resize(2 * N * N * widest, 0.0);
    scratch.half.resize((N + 1) * M * f, 0.0);
    for b0 in (0..blocks).step_by(TILE_BLOCKS) {
        let n = TILE_BLOCKS.min(blocks - b0);
        let transformed = &mut scratch.transformed[..N * N * n * c];
        for b in 0..n {
            let mut at = 0;
            for p in job.parts {
                let to = Transformed {
                    points: &mut *transformed,
                    tile: (n, b),
                    channels: (c, at),
                };
                transform_input::<N>(job, p, (b0 + b) * M, &mut scratch.block, to);
                at += p.channels;
            }
        }
        let products = &mut scratch.products[..N * N * n * f];
        for (point, w) in job.w.points.iter().enumerate() {
            let a = &transformed[point * n * c..(point + 1) * n * c];
            let o = &mut products[point * n * f..(point + 1) * n * f];
            matmul_f32(a, n, c, w, o, f, false);
        }
        for b in 0..n {
            let x0 = (b0 + b) * M;
            transform_output::<N, M>(job, products, (n, b), x0, &mut scratch.half, out);
        }
    }
}

/// Where a block's transformed points go: point `p` of block `b` of a tile of `n` blocks,
/// channels `at..` of `c`, at `points[((p * n) + b) * c + at..]`.
struct Transformed<'a> {
    points: &'a mut [f32],
    tile: (usize, usize),
    channels: (usize, usize),
}

/// `N` runs of values in a slice: run `i` starts at `at + i * stride`.
#[derive(Clone, Copy)]
struct Runs {
    at: usize,
    stride: usize,
}

fn runs(at: usize, stride: usize) -> Runs {
    Runs { at, stride }
}

/// `B^T d B` of `part`'s channels of the input block whose top-left pixel is `(job.y0, x0)`,
/// into `to`. A block inside the input is read in place; one reaching past its edge is
/// gathered first, the pixels past the edge as zeros (they only reach outputs past the
/// output's edge).
#[inline(always)]
fn transform_input<const N: usize>(
    job: &RowJob,
    part: &InputPart,
    x0: usize,
    block: &mut [f32],
    to: Transformed,
) {
    let pc = part.channels;
    let (d, t) = block[..2 * N * N * pc].split_at_mut(N * N * pc);
    let inside = job.y0 + N <= job.in_height && x0 + N <= job.in_width;
    let pixel = |y: usize, x: usize| ((y + part.top) * part.width + x + part.left) * pc;
    if !inside {
        for r in 0..N {
            for s in 0..N {
                let (y, x) = (job.y0 + r, x0 + s);
                let dst = &mut d[(r * N + s) * pc..(r * N + s + 1) * pc];
                if y < job.in_height && x < job.in_width {
                    dst.copy_from_slice(&part.data[pixel(y, x)..pixel(y, x) + pc]);
                } else {
                    dst.fill(0.0);
                }
            }
        }
    }
    // along each row of the block (its pixels side by side), then down each column
    for r in 0..N {
        let into = runs(r * N * pc, pc);
        if inside {
            b_transposed::<N>(part.data, runs(pixel(job.y0 + r, x0), pc), t, into, pc);
        } else {
            b_transposed::<N>(d, runs(r * N * pc, pc), t, into, pc);
        }
    }
    let ((n, b), (c, at)) = (to.tile, to.channels);
    for s in 0..N {
        let into = runs((s * n + b) * c + at, N * n * c);
        b_transposed::<N>(t, runs(s * pc, N * pc), to.points, into, pc);
    }
}

/// Values a block of the transforms holds per vector.
const LANES: usize = 8;

/// `y = B^T x` for `N` runs of `len` values, eight at a time: a block of eight of each read
/// into registers before any is written, which the compiler vectorises without proving that
/// the runs do not overlap (over a dozen slices it gives up on the plain loop).
#[inline(always)]
fn b_transposed<const N: usize>(x: &[f32], xr: Runs, y: &mut [f32], yr: Runs, len: usize) {
    let mut k = 0;
    while k + LANES <= len {
        b_block::<N, LANES>(x, xr, y, yr, k);
        k += LANES;
    }
    while k < len {
        b_block::<N, 1>(x, xr, y, yr, k);
        k += 1;
    }
}

#[inline(always)]
fn b_block<const N: usize, const W: usize>(x: &[f32], xr: Runs, y: &mut [f32], yr: Runs, k: usize) {
    let mut d = [[0f32; W]; N];
    for (i, d) in d.iter_mut().enumerate() {
        let at = xr.at + i * xr.stride + k;
        d.copy_from_slice(&x[at..at + W]);
    }
    let mut o = [[0f32; W]; N];
    for l in 0..W {
        let mut v = [0f32; N];
        for i in 0..N {
            v[i] = d[i][l];
        }
        let v = b_point::<N>(v);
        for i in 0..N {
            o[i][l] = v[i];
        }
    }
    for (i, o) in o.iter().enumerate() {
        let at = yr.at + i * yr.stride + k;
        y[at..at + W].copy_from_slice(o);
    }
}

/// `B^T d` of one value of each of `N` inputs.
#[inline(always)]
fn b_point<const N: usize>(d: [f32; N]) -> [f32; N] {
    let mut o = [0f32; N];
    match N {
        6 => {
            let [d0, d1, d2, d3, d4, d5]: [f32; 6] = d[..].try_into().unwrap();
            o.copy_from_slice(&[
                4.0 * d0 - 5.0 * d2 + d4,
                -4.0 * (d1 + d2) + d3 + d4,
                4.0 * (d1 - d2) - d3 + d4,
                2.0 * (d3 - d1) - d2 + d4,
                2.0 * (d1 - d3) - d2 + d4,
                4.0 * d1 - 5.0 * d3 + d5,
            ]);
        }
        4 => {
            let [d0, d1, d2, d3]: [f32; 4] = d[..].try_into().unwrap();
            o.copy_from_slice(&[d0 - d2, d1 + d2, d2 - d1, d3 - d1]);
        }
        _ => unreachable!("the tilings read 6 or 4 inputs a side"),
    }
    o
}

/// `A^T m A + bias` of block `b` of a tile of `n` blocks (its `N * N` products of `f` values
/// each, point `p` at `products[(p * n + b) * f..]`), written to the output block whose
/// top-left pixel is `(job.y0, x0)`, clipped to the output. `half` holds `(N + 1) x M x f`
/// values.
#[inline(always)]
fn transform_output<const N: usize, const M: usize>(
    job: &RowJob,
    products: &[f32],
    (n, b): (usize, usize),
    x0: usize,
    half: &mut [f32],
    out: &mut [f32],
) {
    let f = job.w.filters;
    let ow = job.in_width + M - N;
    let cols = M.min(ow - x0);
    let (half, column) = half.split_at_mut(N * M * f);
    // `A^T` along each row of points, into `half[(r * M + col) * f..]`
    for r in 0..N {
        let from = runs((r * N * n + b) * f, n * f);
        a_transposed::<N, M>(products, from, half, runs(r * M * f, f), &[], f);
    }
    // then down each column of those, plus the bias, into the output's rows (through
    // `column` where the block row is cut short by the output's edge)
    for col in 0..cols {
        let from = runs(col * f, M * f);
        if job.rows == M {
            let into = runs((x0 + col) * f, ow * f);
            a_transposed::<N, M>(half, from, out, into, job.bias, f);
        } else {
            a_transposed::<N, M>(half, from, column, runs(0, f), job.bias, f);
            for row in 0..job.rows {
                let at = (row * ow + x0 + col) * f;
                out[at..at + f].copy_from_slice(&column[row * f..(row + 1) * f]);
            }
        }
    }
}

/// `y = A^T m (+ bias)`: `N` runs of `len` transformed points back to `M` of outputs, eight
/// values at a time as [`b_transposed`]; an empty `bias` adds nothing.
#[inline(always)]
fn a_transposed<const N: usize, const M: usize>(
    m: &[f32],
    mr: Runs,
    y: &mut [f32],
    yr: Runs,
    bias: &[f32],
    len: usize,
) {
    let mut k = 0;
    while k + LANES <= len {
        a_block::<N, M, LANES>(m, mr, y, yr, bias, k);
        k += LANES;
    }
    while k < len {
        a_block::<N, M, 1>(m, mr, y, yr, bias, k);
        k += 1;
    }
}

#[inline(always)]
fn a_block<const N: usize, const M: usize, const W: usize>(
    m: &[f32],
    mr: Runs,
    y: &mut [f32],
    yr: Runs,
    bias: &[f32],
    k: usize,
) {
    let mut v = [[0f32; W]; N];
    for (i, v) in v.iter_mut().enumerate() {
        let at = mr.at + i * mr.stride + k;
        v.copy_from_slice(&m[at..at + W]);
    }
    let mut add = [0f32; W];
    if !bias.is_empty() {
        add.copy_from_slice(&bias[k..k + W]);
    }
    let mut o = [[0f32; W]; M];
    for l in 0..W {
        let mut p = [0f32; N];
        for i in 0..N {
            p[i] = v[i][l];
        }
        let p = a_point::<N, M>(p);
        for i in 0..M {
            o[i][l] = p[i] + add[l];
        }
    }
    for (i, o) in o.iter().enumerate() {
        let at = yr.at + i * yr.stride + k;
        y[at..at + W].copy_from_slice(o);
    }
}

/// `A^T m` of one value of each of `N` points.
#[inline(always)]
fn a_point<const N: usize, const M: usize>(m: [f32; N]) -> [f32; M] {
    let mut o = [0f32; M];
    match (N, M) {
        (6, 4) => {
            let [m0, m1, m2, m3, m4, m5]: [f32; 6] = m[..].try_into().unwrap();
            let (p12, d12) = (m1 + m2, m1 - m2);
            let (p34, d34) = (m3 + m4, m3 - m4);
            o.copy_from_slice(&[
                m0 + p12 + p34,
                d12 + 2.0 * d34,
                p12 + 4.0 * p34,
                d12 + 8.0 * d34 + m5,
            ]);
        }
        (4, 3) => {
            let [m0, m1, m2, m3]: [f32; 4] = m[..].try_into().unwrap();
            let p12 = m1 + m2;
            o.copy_from_slice(&[m0 + p12, m1 - m2, p12 + m3]);
        }
        _ => unreachable!("the tilings are F(4x4, 3x3) and F(3x3, 2x2)"),
    }
    o
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{rows_tiled, RowJob, Scratch};

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn rows_avx2(job: &RowJob, out: &mut [f32], scratch: &mut Scratch) {
        rows_tiled(job, out, scratch)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn rows_avx512(job: &RowJob, out: &mut [f32], scratch: &mut Scratch) {
        rows_tiled(job, out, scratch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use strum::IntoEnumIterator;

    fn values(n: usize, rng: &mut rand_chacha::ChaCha8Rng) -> Vec<f32> {
        (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect()
    }

    /// The valid `r x r` convolution of the concatenation of `parts` (each `h x w x c_p`),
    /// in f64.
    fn direct(
        parts: &[(Vec<f32>, usize)],
        [h, w]: [usize; 2],
        r: usize,
        k: &[f32],
        f: usize,
    ) -> Vec<f64> {
        let c: usize = parts.iter().map(|p| p.1).sum();
        let (oh, ow) = (h + 1 - r, w + 1 - r);
        let mut out = vec![0f64; oh * ow * f];
        for y in 0..oh {
            for x in 0..ow {
                for i in 0..r {
                    for j in 0..r {
                        let mut ci = 0;
                        for (data, pc) in parts {
                            let px = &data[((y + i) * w + x + j) * pc..][..*pc];
                            for (cp, &v) in px.iter().enumerate() {
                                for fi in 0..f {
                                    let kv = k[((i * r + j) * c + ci + cp) * f + fi];
                                    out[(y * ow + x) * f + fi] += f64::from(v) * f64::from(kv);
                                }
                            }
                            ci += pc;
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn blocks_give_the_direct_convolution_at_every_level() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        // sizes not a multiple of the blocks, a tile of blocks and a part, channels split
        // into parts as a concatenation read in place gives them
        for r in [3, 2] {
            for (h, w, channels, f) in [
                (r, r, vec![8], 5),
                (13, 11, vec![16], 40),
                (9, 110, vec![5, 27], 33),
            ] {
                let c: usize = channels.iter().sum();
                let parts: Vec<(Vec<f32>, usize)> = channels
                    .iter()
                    .map(|&pc| (values(h * w * pc, &mut rng), pc))
                    .collect();
                let k = values(r * r * c * f, &mut rng);
                let bias = values(f, &mut rng);
                let want = direct(&parts, [h, w], r, &k, f);
                let (oh, ow) = (h + 1 - r, w + 1 - r);
                for level in Level::iter().filter(|&l| l <= detected()) {
                    let wg = Winograd::new_at(level, [r, r], &k, c, f).unwrap();
                    let inputs: Vec<InputPart> = parts
                        .iter()
                        .map(|(data, pc)| InputPart {
                            data,
                            width: w,
                            channels: *pc,
                            top: 0,
                            left: 0,
                        })
                        .collect();
                    let mut got = vec![f32::NAN; oh * ow * f];
                    let block = wg.tiling().block();
                    for (row, out) in got.chunks_mut(block * ow * f).enumerate() {
                        conv_rows(&wg, &inputs, [h, w], row, &bias, out);
                    }
                    for (i, (g, want)) in got.iter().zip(&want).enumerate() {
                        let want = want + f64::from(bias[i % f]);
                        assert!(
                            (f64::from(*g) - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{level}, {r}x{r}, {h} x {w} x {channels:?} -> {f}: output {i} is {g}, not {want}"
                        );
                    }
                }
            }
        }
        assert!(Winograd::new([1, 1], &[0.0; 4], 2, 2).is_none());
    }
}
