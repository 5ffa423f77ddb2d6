//! 3x3 stride-1 valid convolutions in f32 by Winograd's minimal filtering, F(4x4, 3x3): each
//! 4 x 4 block of outputs from the 6 x 6 block of inputs under it, as 36 element-wise
//! products in a transformed space instead of 144 multiply-adds per channel pair, so the
//! products, where a detector spends most of its time, take a quarter of the multiply-adds
//! that a convolution tap by tap takes.
//!
//! Lavin and Gray's transforms ("Fast algorithms for convolutional neural networks", 2016):
//! the filter `g` becomes `G g G^T` once, when the weights are packed; each input block `d`
//! becomes `B^T d B`; the block's 36 transformed points each multiply a row of a tile of
//! blocks by the point's `[in, out]` matrix (a packed f32 product, [`matmul_f32`]); and
//! `A^T m A` takes the 36 products back to the 16 outputs. The transforms only add and
//! scale by small constants (the points 0, +-1, +-2); the f32 result carries more rounding
//! than a convolution tap by tap (within 1e-4 of the sums in the tests; pycda's U-Net reads
//! within 1e-5 of Keras' likelihoods).

use crate::gemm::{matmul_f32, PackedF32};
use crate::level::{active, detected, dispatch, Level};

/// Outputs per block side.
pub const OUT: usize = 4;
/// Inputs per block side.
const IN: usize = OUT + 2;
/// Transformed points of a block.
const POINTS: usize = IN * IN;
/// Blocks whose transformed points one product multiplies at once: a whole number of every
/// level's register blocks (3 rows on AVX2, 8 on AVX-512), and few enough that a tile's
/// transformed inputs and products stay in L2 (36 x 24 x 128 channels x 4 bytes = 442 KB
/// each at the U-Net's widest).
const TILE_BLOCKS: usize = 24;

/// `G`, the filter's transform (6 x 3).
const G: [[f64; 3]; IN] = [
    [1.0 / 4.0, 0.0, 0.0],
    [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
    [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
    [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
    [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
    [0.0, 0.0, 1.0],
];

/// A 3x3 convolution's weights as the 36 transformed points' `[in, out]` matrices.
#[derive(Clone, Debug)]
pub struct Winograd3x3 {
    level: Level,
    in_channels: usize,
    filters: usize,
    points: Vec<PackedF32>,
}

impl Winograd3x3 {
    /// From the kernel as Keras stores it: `w[((i * 3 + j) * in + c) * out + f]` for tap
    /// `(i, j)`, input channel `c` and filter `f`.
    pub fn new(w: &[f32], in_channels: usize, filters: usize) -> Self {
        Self::new_at(active(), w, in_channels, filters)
    }

    /// [`Winograd3x3::new`] for the kernels of `level` (capped at what the CPU has).
    pub fn new_at(level: Level, w: &[f32], in_channels: usize, filters: usize) -> Self {
        let level = level.min(detected());
        let (c, f) = (in_channels, filters);
        assert_eq!(w.len(), 9 * c * f, "a 3x3 kernel of {c} x {f}");
        let mut points = vec![vec![0f32; c * f]; POINTS];
        for ci in 0..c {
            for fi in 0..f {
                let g = |i: usize, j: usize| f64::from(w[((i * 3 + j) * c + ci) * f + fi]);
                // G g, then (G g) G^T, in f64 so that the packed points carry no error of
                // their own
                let mut gg = [[0f64; 3]; IN];
                for (r, row) in gg.iter_mut().enumerate() {
                    for (j, v) in row.iter_mut().enumerate() {
                        *v = (0..3).map(|i| G[r][i] * g(i, j)).sum();
                    }
                }
                for r in 0..IN {
                    for s in 0..IN {
                        let v: f64 = (0..3).map(|j| gg[r][j] * G[s][j]).sum();
                        points[r * IN + s][ci * f + fi] = v as f32;
                    }
                }
            }
        }
        Self {
            level,
            in_channels: c,
            filters: f,
            points: points
                .iter()
                .map(|p| PackedF32::from_kn_at(level, p, c, f))
                .collect(),
        }
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

/// Output rows `OUT * row ..` (at most [`OUT`], fewer at the bottom) of the valid 3x3
/// convolution of an `in_height x in_width` input (`parts`, whose channels add up to the
/// kernel's), plus `bias`, into `out`: those rows, each `in_width - 2` pixels of `filters`
/// values. Runs on the calling thread, in memory it keeps for its next call.
pub fn conv3x3_rows(
    w: &Winograd3x3,
    parts: &[InputPart],
    [in_height, in_width]: [usize; 2],
    row: usize,
    bias: &[f32],
    out: &mut [f32],
) {
    let (c, f) = (w.in_channels, w.filters);
    assert!(
        in_height >= 3 && in_width >= 3,
        "an input smaller than the kernel"
    );
    let (oh, ow) = (in_height - 2, in_width - 2);
    let rows = OUT.min(oh.saturating_sub(row * OUT));
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
        y0: row * OUT,
        rows,
        bias,
    };
    SCRATCH.with_borrow_mut(|scratch| {
        dispatch!(w.level,
            avx512 => x86::rows_avx512(&job, out, scratch),
            avx2 => x86::rows_avx2(&job, out, scratch),
            portable => rows_generic(&job, out, scratch))
    })
}

struct RowJob<'a> {
    w: &'a Winograd3x3,
    parts: &'a [InputPart<'a>],
    in_height: usize,
    in_width: usize,
    /// The first output row.
    y0: usize,
    rows: usize,
    bias: &'a [f32],
}

/// One row of blocks, a tile of [`TILE_BLOCKS`] blocks at a time: inputs transformed, the
/// 36 products, outputs transformed back. Inlined into each level's function, so that the
/// transforms' loops over channels are vectorised for it.
#[inline(always)]
fn rows_generic(job: &RowJob, out: &mut [f32], scratch: &mut Scratch) {
    let (c, f) = (job.w.in_channels, job.w.filters);
    let ow = job.in_width - 2;
    let blocks = ow.div_ceil(OUT);
    let widest = job.parts.iter().map(|p| p.channels).max().unwrap_or(0);
    scratch.transformed.resize(POINTS * TILE_BLOCKS * c, 0.0);
    scratch.products.resize(POINTS * TILE_BLOCKS * f, 0.0);
    scratch.block.resize(2 * POINTS * widest, 0.0);
    scratch.half.resize((IN + 1) * OUT * f, 0.0);
    for b0 in (0..blocks).step_by(TILE_BLOCKS) {
        let n = TILE_BLOCKS.min(blocks - b0);
        let transformed = &mut scratch.transformed[..POINTS * n * c];
        for b in 0..n {
            let mut at = 0;
            for p in job.parts {
                let to = Transformed {
                    points: &mut *transformed,
                    tile: (n, b),
                    channels: (c, at),
                };
                transform_input(job, p, (b0 + b) * OUT, &mut scratch.block, to);
                at += p.channels;
            }
        }
        let products = &mut scratch.products[..POINTS * n * f];
        for (point, w) in job.w.points.iter().enumerate() {
            let a = &transformed[point * n * c..(point + 1) * n * c];
            let o = &mut products[point * n * f..(point + 1) * n * f];
            matmul_f32(a, n, c, w, o, f, false);
        }
        for b in 0..n {
            transform_output(
                job,
                products,
                (n, b),
                (b0 + b) * OUT,
                &mut scratch.half,
                out,
            );
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

/// Six slices of `len` values `stride` apart, from `at` on. (Written out, with no closure:
/// built by `array::from_fn`, whose closures were not inlined into the level's function,
/// they cost 5% of a detection.)
#[inline(always)]
fn six(v: &[f32], at: usize, stride: usize, len: usize) -> [&[f32]; IN] {
    let (a, s) = (at, stride);
    [
        &v[a..a + len],
        &v[a + s..a + s + len],
        &v[a + 2 * s..a + 2 * s + len],
        &v[a + 3 * s..a + 3 * s + len],
        &v[a + 4 * s..a + 4 * s + len],
        &v[a + 5 * s..a + 5 * s + len],
    ]
}

/// The next `len` values of `rest`, and `rest` moved on by `stride`.
#[inline(always)]
fn next_row<'a>(rest: &mut &'a mut [f32], stride: usize, len: usize) -> &'a mut [f32] {
    let (row, tail) = std::mem::take(rest).split_at_mut(len);
    *rest = tail.get_mut(stride - len..).unwrap_or_default();
    row
}

/// Mutable slices of `len` values `stride` apart, from `at` on, one per name given.
macro_rules! rows_mut {
    ($v:expr, $at:expr, $stride:expr, $len:expr; $($row:ident)+) => {{
        let mut rest = &mut $v[$at..];
        $(let $row = next_row(&mut rest, $stride, $len);)+
        [$($row),+]
    }};
}

/// Mutable [`six`].
#[inline(always)]
fn six_mut(v: &mut [f32], at: usize, stride: usize, len: usize) -> [&mut [f32]; IN] {
    rows_mut!(v, at, stride, len; y0 y1 y2 y3 y4 y5)
}

/// Four mutable slices of `len` values `stride` apart, from `at` on.
#[inline(always)]
fn four_mut(v: &mut [f32], at: usize, stride: usize, len: usize) -> [&mut [f32]; OUT] {
    rows_mut!(v, at, stride, len; y0 y1 y2 y3)
}

/// `B^T d B` of `part`'s channels of the input block whose top-left pixel is `(job.y0, x0)`,
/// into `to`. A block inside the input is read in place; one reaching past its edge is
/// gathered first, the pixels past the edge as zeros (they only reach outputs past the
/// output's edge).
#[inline(always)]
fn transform_input(job: &RowJob, part: &InputPart, x0: usize, block: &mut [f32], to: Transformed) {
    let pc = part.channels;
    let (d, t) = block[..2 * POINTS * pc].split_at_mut(POINTS * pc);
    let inside = job.y0 + IN <= job.in_height && x0 + IN <= job.in_width;
    let pixel = |y: usize, x: usize| ((y + part.top) * part.width + x + part.left) * pc;
    if !inside {
        for r in 0..IN {
            for s in 0..IN {
                let (y, x) = (job.y0 + r, x0 + s);
                let dst = &mut d[(r * IN + s) * pc..(r * IN + s + 1) * pc];
                if y < job.in_height && x < job.in_width {
                    dst.copy_from_slice(&part.data[pixel(y, x)..pixel(y, x) + pc]);
                } else {
                    dst.fill(0.0);
                }
            }
        }
    }
    // along each row of the block (its six pixels side by side), then down each column
    for r in 0..IN {
        let x = if inside {
            six(part.data, pixel(job.y0 + r, x0), pc, pc)
        } else {
            six(d, r * IN * pc, pc, pc)
        };
        b_transposed(x, six_mut(t, r * IN * pc, pc, pc));
    }
    let ((n, b), (c, at)) = (to.tile, to.channels);
    for s in 0..IN {
        let y = six_mut(to.points, (s * n + b) * c + at, IN * n * c, pc);
        b_transposed(six(t, s * pc, IN * pc, pc), y);
    }
}

/// `y = B^T x` for six vectors of as many values, eight at a time: a block of eight of
/// each read into registers before any is written, which the compiler vectorises without
/// proving that twelve slices do not overlap (it gives up on a loop over them all).
#[inline(always)]
fn b_transposed(x: [&[f32]; IN], mut y: [&mut [f32]; IN]) {
    let len = y[0].len();
    let mut k = 0;
    while k + LANES <= len {
        b_block::<LANES>(&x, &mut y, k);
        k += LANES;
    }
    while k < len {
        b_block::<1>(&x, &mut y, k);
        k += 1;
    }
}

/// Values a block of the transforms holds per vector.
const LANES: usize = 8;

#[inline(always)]
fn b_block<const W: usize>(x: &[&[f32]; IN], y: &mut [&mut [f32]; IN], k: usize) {
    let mut d = [[0f32; W]; IN];
    for (d, x) in d.iter_mut().zip(x) {
        d.copy_from_slice(&x[k..k + W]);
    }
    let mut o = [[0f32; W]; IN];
    for l in 0..W {
        let [d0, d1, d2, d3, d4, d5] = [d[0][l], d[1][l], d[2][l], d[3][l], d[4][l], d[5][l]];
        o[0][l] = 4.0 * d0 - 5.0 * d2 + d4;
        o[1][l] = -4.0 * (d1 + d2) + d3 + d4;
        o[2][l] = 4.0 * (d1 - d2) - d3 + d4;
        o[3][l] = 2.0 * (d3 - d1) - d2 + d4;
        o[4][l] = 2.0 * (d1 - d3) - d2 + d4;
        o[5][l] = 4.0 * d1 - 5.0 * d3 + d5;
    }
    for (y, o) in y.iter_mut().zip(&o) {
        y[k..k + W].copy_from_slice(o);
    }
}

/// `A^T m A + bias` of block `b` of a tile of `n` blocks (its 36 products of `f` values
/// each, point `p` at `products[(p * n + b) * f..]`), written to the output block whose
/// top-left pixel is `(job.y0, x0)`, clipped to the output. `half` holds `7 x 4 x f` values.
#[inline(always)]
fn transform_output(
    job: &RowJob,
    products: &[f32],
    (n, b): (usize, usize),
    x0: usize,
    half: &mut [f32],
    out: &mut [f32],
) {
    let f = job.w.filters;
    let ow = job.in_width - 2;
    let cols = OUT.min(ow - x0);
    let zeros = [0f32; 0];
    let (half, column) = half.split_at_mut(IN * OUT * f);
    // `A^T` along each row of points, into `half[(r * OUT + col) * f..]`
    for r in 0..IN {
        let m = six(products, (r * IN * n + b) * f, n * f, f);
        a_transposed(m, four_mut(half, r * OUT * f, f, f), &zeros);
    }
    // then down each column of those, plus the bias, into the output's rows (through
    // `column` where the block row is cut short by the output's edge)
    for col in 0..cols {
        let m = six(half, col * f, OUT * f, f);
        if job.rows == OUT {
            a_transposed(m, four_mut(out, (x0 + col) * f, ow * f, f), job.bias);
        } else {
            a_transposed(m, four_mut(column, 0, f, f), job.bias);
            for row in 0..job.rows {
                let at = (row * ow + x0 + col) * f;
                out[at..at + f].copy_from_slice(&column[row * f..(row + 1) * f]);
            }
        }
    }
}

/// `y = A^T m (+ bias)`: six vectors of transformed points back to four of outputs, eight
/// values at a time as [`b_transposed`]; an empty `bias` adds nothing.
#[inline(always)]
fn a_transposed(m: [&[f32]; IN], mut y: [&mut [f32]; OUT], bias: &[f32]) {
    let len = y[0].len();
    let mut k = 0;
    while k + LANES <= len {
        a_block::<LANES>(&m, &mut y, bias, k);
        k += LANES;
    }
    while k < len {
        a_block::<1>(&m, &mut y, bias, k);
        k += 1;
    }
}

#[inline(always)]
fn a_block<const W: usize>(m: &[&[f32]; IN], y: &mut [&mut [f32]; OUT], bias: &[f32], k: usize) {
    let mut v = [[0f32; W]; IN];
    for (v, m) in v.iter_mut().zip(m) {
        v.copy_from_slice(&m[k..k + W]);
    }
    let mut b = [0f32; W];
    if !bias.is_empty() {
        b.copy_from_slice(&bias[k..k + W]);
    }
    let mut o = [[0f32; W]; OUT];
    for l in 0..W {
        let (p12, d12) = (v[1][l] + v[2][l], v[1][l] - v[2][l]);
        let (p34, d34) = (v[3][l] + v[4][l], v[3][l] - v[4][l]);
        o[0][l] = v[0][l] + p12 + p34 + b[l];
        o[1][l] = d12 + 2.0 * d34 + b[l];
        o[2][l] = p12 + 4.0 * p34 + b[l];
        o[3][l] = d12 + 8.0 * d34 + v[5][l] + b[l];
    }
    for (y, o) in y.iter_mut().zip(&o) {
        y[k..k + W].copy_from_slice(o);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{rows_generic, RowJob, Scratch};

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn rows_avx2(job: &RowJob, out: &mut [f32], scratch: &mut Scratch) {
        rows_generic(job, out, scratch)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn rows_avx512(job: &RowJob, out: &mut [f32], scratch: &mut Scratch) {
        rows_generic(job, out, scratch)
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

    /// The valid convolution of the concatenation of `parts` (each `h x w x c_p`), in f64.
    fn direct(parts: &[(Vec<f32>, usize)], h: usize, w: usize, k: &[f32], f: usize) -> Vec<f64> {
        let c: usize = parts.iter().map(|p| p.1).sum();
        let (oh, ow) = (h - 2, w - 2);
        let mut out = vec![0f64; oh * ow * f];
        for y in 0..oh {
            for x in 0..ow {
                for i in 0..3 {
                    for j in 0..3 {
                        let mut ci = 0;
                        for (data, pc) in parts {
                            let px = &data[((y + i) * w + x + j) * pc..][..*pc];
                            for (cp, &v) in px.iter().enumerate() {
                                for fi in 0..f {
                                    let kv = k[((i * 3 + j) * c + ci + cp) * f + fi];
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
    fn blocks_of_four_give_the_direct_convolution_at_every_level() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        // sizes not a multiple of the blocks, a tile of blocks and a part, channels split
        // into parts as a concatenation read in place gives them
        for (h, w, channels, f) in [
            (3, 3, vec![8], 5),
            (13, 11, vec![16], 40),
            (9, 110, vec![5, 27], 33),
        ] {
            let c: usize = channels.iter().sum();
            let parts: Vec<(Vec<f32>, usize)> = channels
                .iter()
                .map(|&pc| (values(h * w * pc, &mut rng), pc))
                .collect();
            let k = values(9 * c * f, &mut rng);
            let bias = values(f, &mut rng);
            let want = direct(&parts, h, w, &k, f);
            let (oh, ow) = (h - 2, w - 2);
            for level in Level::iter().filter(|&l| l <= detected()) {
                let wg = Winograd3x3::new_at(level, &k, c, f);
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
                for (row, out) in got.chunks_mut(OUT * ow * f).enumerate() {
                    conv3x3_rows(&wg, &inputs, [h, w], row, &bias, out);
                }
                for (i, (g, want)) in got.iter().zip(&want).enumerate() {
                    let want = want + f64::from(bias[i % f]);
                    assert!(
                        (f64::from(*g) - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{level}, {h} x {w} x {channels:?} -> {f}: output {i} is {g}, not {want}"
                    );
                }
            }
        }
    }
}
