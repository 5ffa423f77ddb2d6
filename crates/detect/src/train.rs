//! Fitting every layer of a detector to labelled images (`detect fit --whole`): the graph's
//! forward pass with each layer's output kept, its gradients by hand for the graph's few
//! operations, and Adam. Where the head fit (`fit`) reads a frozen detector's maps, this
//! changes the detector itself: each step is a batch of tiles cut at random from the
//! labelled images' pyramid levels (turned by quarter turns, or any angle and worn as a second
//! observation is, and mirrored), each pixel taught
//! what `detect` reads there (`fit::taught_levels`). Products are f32 GEMMs (matrixmultiply), or
//! bf16 products with f32 sums on craterdex's kernels where asked ([`WholeFitOptions::precision`]);
//! the weights, their gradients' sums and Adam stay f32. The tiles of a batch run in parallel,
//! each in memory kept from step to step ([`Scratch`]: a tile's passes are the same shapes
//! every step, so none is mapped or zeroed afresh).

use crate::detect::DetectOptions;
use crate::error::{Error, Result};
use crate::fit::{draw, taught_levels, Labelled, TaughtLevel, CRATER, IGNORED};
use crate::graph::{Activation, Graph, Op};
use crate::net::{pad_before, FeatureMap, Tensor};
use crate::store::DetectorConfig;
use craterdex_errors::ensure;
use craterdex_kernels::bf16::{self, PackedBf16};
use craterdex_kernels::Level;
use craterdex_model::Precision;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// How a whole detector is fitted. The defaults live here.
#[derive(Clone, Debug, PartialEq)]
pub struct WholeFitOptions {
    /// Adam steps.
    pub steps: usize,
    /// Tiles per step.
    pub batch: usize,
    pub learning_rate: f64,
    /// The share of each crater's diameter taught as crater (as the head fit's).
    pub region_share: f64,
    /// How each tile is worn before the detector sees it; `None`: turned by quarter turns
    /// and mirrored only.
    pub wear: Option<Wear>,
    /// The products' precision: f32, or bf16 inputs with f32 sums (needs bf16 hardware at
    /// the active kernel level). Int8 does not fit.
    pub precision: Precision,
}

/// How each tile of a fit is worn, as a second observation differs from the tiles the
/// detector is fitted on: turned by any angle (and with it the sun's heading in the image,
/// which quarter turns show only four ways), mirrored, under another gamma and contrast, then
/// blurred or noised.
#[derive(Clone, Debug, PartialEq)]
pub struct Wear {
    pub gamma: (f64, f64),
    pub contrast: (f64, f64),
    /// Gaussian blur of this sigma (pixels) for half the tiles; noise of this standard
    /// deviation (8-bit levels) for the other half.
    pub blur_sigma: (f64, f64),
    pub noise_sigma: (f64, f64),
}

impl Default for Wear {
    /// The ranges of `craterdex eval-link --image`'s second observations (issue 54's
    /// setting), taken as they are, before any fit with them.
    fn default() -> Self {
        Self {
            gamma: (0.7, 1.4),
            contrast: (0.8, 1.2),
            blur_sigma: (0.5, 1.2),
            noise_sigma: (2.0, 6.0),
        }
    }
}

impl Default for WholeFitOptions {
    fn default() -> Self {
        // 400 steps of 8 tiles at 1e-4: set before any run on the tiles that report it
        // (docs/results.md, "The whole detector fitted")
        Self {
            steps: 400,
            batch: 8,
            learning_rate: 1e-4,
            region_share: crate::fit::FitOptions::default().region_share,
            wear: None,
            precision: Precision::F32,
        }
    }
}

/// How a fit's products are computed: f32, or bf16 at a kernel level that runs it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Products {
    F32,
    Bf16(Level),
}

impl Products {
    fn of(precision: Precision) -> Result<Self> {
        match precision {
            Precision::F32 => Ok(Self::F32),
            Precision::Bf16 => {
                crate::net::ensure_bf16("a bf16 fit")?;
                Ok(Self::Bf16(craterdex_kernels::active()))
            }
            Precision::Int8 => Err(Error::Unsupported(
                "a detector is fitted in f32 or bf16, not int8".into(),
            )),
        }
    }
}

/// A fit's products ([`Products`]) and the memory their bf16 operands are packed and copied
/// into, kept from call to call: a step's products would otherwise map and zero it afresh
/// for every layer of every tile.
struct Gemm {
    products: Products,
    packed: PackedBf16,
    copied: Vec<f32>,
    transposed: Vec<f32>,
    /// Never written: the bias of a product that has none.
    zeros: Vec<f32>,
}

impl Gemm {
    fn new(products: Products) -> Self {
        Self {
            products,
            packed: PackedBf16::empty(),
            copied: Vec::new(),
            transposed: Vec::new(),
            zeros: Vec::new(),
        }
    }

    /// `c[m x n] = beta c + a[m x k] b[k x n]` (`beta` 0 or 1; at 0, `c` is not read), `a`
    /// and `b` read with any row and column strides (a transposed operand is the same slice
    /// with its strides swapped), `c` row-major. In bf16 where `n` fills whole blocks of 16
    /// columns (every layer of pycda's U-Net but its one-channel head), else f32.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        shape: (usize, usize, usize),
        a: &[f32],
        a_strides: (usize, usize),
        b: &[f32],
        b_strides: (usize, usize),
        c: &mut [f32],
        beta: f32,
    ) {
        let (m, k, n) = shape;
        match self.products {
            Products::Bf16(level) if PackedBf16::fits(n) && m > 0 && k > 0 => {
                self.bf16(level, shape, a, a_strides, b, b_strides, c, beta)
            }
            _ => gemm_f32(shape, a, a_strides, b, b_strides, c, beta),
        }
    }

    /// [`Gemm::run`] with `a` and `b` rounded to bf16 and `b` packed as the kernels take it.
    /// An `a` read transposed is copied row-major first, unless `b` is smaller and `m` fills
    /// whole blocks: then `c` is computed transposed, `cᵀ = bᵀ aᵀ`, where `aᵀ` is row-major
    /// as it lies and `bᵀ` is what is copied (a weight's gradient, `patchesᵀ dy`, copies `dy`
    /// instead of patches up to nine times its size).
    #[allow(clippy::too_many_arguments)]
    fn bf16(
        &mut self,
        level: Level,
        (m, k, n): (usize, usize, usize),
        a: &[f32],
        (rsa, csa): (usize, usize),
        b: &[f32],
        (rsb, csb): (usize, usize),
        c: &mut [f32],
        beta: f32,
    ) {
        assert!(
            beta == 0.0 || beta == 1.0,
            "gemm: beta {beta} is neither 0 nor 1"
        );
        assert!(c.len() >= m * n, "gemm: c holds {} of {m} x {n}", c.len());
        let Self {
            packed,
            copied,
            transposed,
            zeros,
            ..
        } = self;
        if zeros.len() < m.max(n) {
            zeros.resize(m.max(n), 0.0);
        }
        if rsa == 1 && csa != 1 && csb == 1 && PackedBf16::fits(m) && n < m {
            // cᵀ [n, m] = bᵀ [n, k] · aᵀ [k, m], aᵀ's rows `csa` apart
            packed.refill_rows(a, k, m, csa);
            row_major_into(b, (n, k), (csb, rsb), copied);
            transposed.resize(n * m, 0.0);
            bf16::linear_bf16_at(level, copied, n, packed, &zeros[..m], transposed, false);
            for (i, row) in c[..m * n].chunks_exact_mut(n).enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    let t = transposed[j * m + i];
                    *v = if beta == 0.0 { t } else { *v + t };
                }
            }
            return;
        }
        if csb == 1 {
            packed.refill_rows(b, k, n, rsb);
        } else {
            assert_eq!(rsb, 1, "gemm: b is read with neither unit stride");
            packed.refill_transposed(b, k, n, csb);
        }
        let rows = if csa == 1 && rsa == k {
            &a[..m * k]
        } else {
            row_major_into(a, (m, k), (rsa, csa), copied);
            &copied[..]
        };
        let out = &mut c[..m * n];
        bf16::linear_bf16_at(level, rows, m, packed, &zeros[..n], out, beta == 1.0);
    }
}

/// `a[r * rs + c * cs]` for `r < m`, `c < k` into `out` as an `[m, k]` row-major matrix
/// (its memory reused): the source read in order, written in columns of 16 rows at once.
fn row_major_into(a: &[f32], (m, k): (usize, usize), (rs, cs): (usize, usize), out: &mut Vec<f32>) {
    assert!(a.len() > (m - 1) * rs + (k - 1) * cs, "gemm: a too short");
    // every element is written below
    out.resize(m * k, 0.0);
    if cs == 1 {
        for (r, row) in out.chunks_exact_mut(k).enumerate() {
            row.copy_from_slice(&a[r * rs..r * rs + k]);
        }
        return;
    }
    // a transposed read: source row c (stride cs) gives column c of out
    const BLOCK: usize = 16;
    for r0 in (0..m).step_by(BLOCK) {
        let r1 = (r0 + BLOCK).min(m);
        for c in 0..k {
            let src = &a[c * cs + r0 * rs..];
            for r in r0..r1 {
                out[r * k + c] = src[(r - r0) * rs];
            }
        }
    }
}

/// [`Gemm::run`] in f32 (matrixmultiply; at `beta` 0, `c` is not read).
#[allow(clippy::too_many_arguments)]
fn gemm_f32(
    (m, k, n): (usize, usize, usize),
    a: &[f32],
    (rsa, csa): (usize, usize),
    b: &[f32],
    (rsb, csb): (usize, usize),
    c: &mut [f32],
    beta: f32,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(c.len() >= m * n, "gemm: c holds {} of {m} x {n}", c.len());
    if k == 0 {
        if beta == 0.0 {
            c[..m * n].fill(0.0);
        }
        return;
    }
    assert!(a.len() > (m - 1) * rsa + (k - 1) * csa, "gemm: a too short");
    assert!(b.len() > (k - 1) * rsb + (n - 1) * csb, "gemm: b too short");
    // SAFETY: every element read or written lies inside its slice (asserted above) and `c`
    // does not alias `a` or `b` (a `&mut` beside two `&`).
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            rsa as isize,
            csa as isize,
            b.as_ptr(),
            rsb as isize,
            csb as isize,
            beta,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// `map` given the shape `[height, width, channels]`, its memory reused: the values are stale
/// (whatever its last use left), for a pass that writes every one of them.
fn shaped(map: &mut FeatureMap, [height, width, channels]: [usize; 3]) {
    map.height = height;
    map.width = width;
    map.channels = channels;
    map.data.resize(height * width * channels, 0.0);
}

/// A convolution's input patches into `cols`, one row per output pixel: `[oh * ow, kh * kw *
/// c]` in the kernel's `(row, column, channel)` order, zeros past the edges (every value
/// written: `cols` may hold another pass's).
fn patches_into(
    x: &FeatureMap,
    [kh, kw]: [usize; 2],
    [sh, sw]: [usize; 2],
    [pt, pl]: [usize; 2],
    [oh, ow]: [usize; 2],
    cols: &mut Vec<f32>,
) {
    let c = x.channels;
    let k = kh * kw * c;
    cols.resize(oh * ow * k, 0.0);
    cols.par_chunks_mut(ow * k)
        .enumerate()
        .for_each(|(oy, row)| {
            for ox in 0..ow {
                let patch = &mut row[ox * k..(ox + 1) * k];
                for a in 0..kh {
                    let iy = (oy * sh + a).checked_sub(pt).filter(|&y| y < x.height);
                    for b in 0..kw {
                        let tap = &mut patch[(a * kw + b) * c..][..c];
                        let ix = (ox * sw + b).checked_sub(pl).filter(|&v| v < x.width);
                        match iy.zip(ix) {
                            Some((iy, ix)) => {
                                let at = (iy * x.width + ix) * c;
                                tap.copy_from_slice(&x.data[at..at + c]);
                            }
                            None => tap.fill(0.0),
                        }
                    }
                }
            }
        });
}

/// The gradients of patches added back onto the input's pixels they were read from (rows of
/// the input in parallel: each gathers what the output rows that read it give back).
fn add_patches(
    dx: &mut FeatureMap,
    cols: &[f32],
    [kh, kw]: [usize; 2],
    [sh, sw]: [usize; 2],
    [pt, pl]: [usize; 2],
    [oh, ow]: [usize; 2],
) {
    let (c, width) = (dx.channels, dx.width);
    let k = kh * kw * c;
    dx.data
        .par_chunks_mut(width * c)
        .enumerate()
        .for_each(|(iy, row)| {
            for a in 0..kh {
                let Some(t) = (iy + pt).checked_sub(a) else {
                    continue;
                };
                if t % sh != 0 || t / sh >= oh {
                    continue;
                }
                let oy = t / sh;
                for ox in 0..ow {
                    let patch = &cols[(oy * ow + ox) * k..][..k];
                    for b in 0..kw {
                        let Some(ix) = (ox * sw + b).checked_sub(pl).filter(|&v| v < width) else {
                            continue;
                        };
                        row[ix * c..(ix + 1) * c]
                            .iter_mut()
                            .zip(&patch[(a * kw + b) * c..][..c])
                            .for_each(|(d, g)| *d += g);
                    }
                }
            }
        });
}

/// The gradient through an activation, from its output `y`.
fn through_activation(activation: Activation, y: &[f32], dy: &mut [f32]) {
    match activation {
        Activation::Linear => {}
        Activation::Relu => dy
            .iter_mut()
            .zip(y)
            .for_each(|(d, &y)| *d = if y > 0.0 { *d } else { 0.0 }),
        Activation::Sigmoid => dy.iter_mut().zip(y).for_each(|(d, &y)| *d *= y * (1.0 - y)),
    }
}

fn tensor<'a>(weights: &'a BTreeMap<String, Tensor>, name: &str) -> Result<&'a [f32]> {
    weights
        .get(name)
        .map(|t| t.1.as_slice())
        .ok_or_else(|| Error::Invalid(format!("the detector has no tensor {name}")))
}

/// Every layer's output for `input`, each convolution's input patches (the backward pass
/// reads them again), and where each max pool took its values from.
#[derive(Default)]
struct Pass {
    outputs: Vec<FeatureMap>,
    patches: Vec<Vec<f32>>,
    argmax: Vec<Vec<u32>>,
}

/// One example's memory, kept from step to step (the passes of one tile are the same shapes
/// every step): its forward [`Pass`], the gradient of each layer's output, the buffers in
/// between and its products' own. Each pass writes every value it reads afterwards, so
/// nothing is zeroed but the gradients that several layers add into.
struct Scratch {
    pass: Pass,
    grads: Vec<FeatureMap>,
    /// Whether this pass has written `grads[i]` yet.
    written: Vec<bool>,
    dcols: Vec<f32>,
    tap: Vec<f32>,
    gemm: Gemm,
}

impl Scratch {
    fn new(products: Products) -> Self {
        Self {
            pass: Pass::default(),
            grads: Vec::new(),
            written: Vec::new(),
            dcols: Vec::new(),
            tap: Vec::new(),
            gemm: Gemm::new(products),
        }
    }
}

/// Every layer's output for `input` into `scratch.pass`, each of the shape the graph gives it
/// (which also checks that the input is large enough for every layer).
fn forward(
    scratch: &mut Scratch,
    graph: &Graph,
    weights: &BTreeMap<String, Tensor>,
    input: &FeatureMap,
) -> Result<()> {
    let shapes = graph.layer_shapes(input.height, input.width)?;
    let n = graph.layers.len();
    let Scratch {
        pass: Pass {
            outputs,
            patches,
            argmax,
        },
        tap,
        gemm,
        ..
    } = scratch;
    outputs.resize_with(n, || FeatureMap::zeros(0, 0, 0));
    patches.resize_with(n, Vec::new);
    argmax.resize_with(n, Vec::new);
    for (i, layer) in graph.layers.iter().enumerate() {
        let (done, rest) = outputs.split_at_mut(i);
        let y = &mut rest[0];
        let x = |j: usize| &done[layer.inputs[j]];
        let [oh, ow, _] = shapes[i];
        match &layer.op {
            Op::Input { .. } => {
                shaped(y, [input.height, input.width, input.channels]);
                y.data.copy_from_slice(&input.data);
            }
            Op::Conv {
                filters,
                kernel,
                stride,
                padding,
                activation,
            } => {
                let x = x(0);
                let pt = pad_before(x.height, kernel[0], stride[0], *padding);
                let pl = pad_before(x.width, kernel[1], stride[1], *padding);
                let cols = &mut patches[i];
                patches_into(x, *kernel, *stride, [pt, pl], [oh, ow], cols);
                let k = kernel[0] * kernel[1] * x.channels;
                let w = tensor(weights, &format!("{}/kernel", layer.name))?;
                let b = tensor(weights, &format!("{}/bias", layer.name))?;
                shaped(y, shapes[i]);
                for row in y.data.chunks_exact_mut(*filters) {
                    row.copy_from_slice(b);
                }
                gemm.run(
                    (oh * ow, k, *filters),
                    cols,
                    (k, 1),
                    w,
                    (*filters, 1),
                    &mut y.data,
                    1.0,
                );
                activation.apply(&mut y.data);
            }
            Op::ConvTranspose {
                filters,
                kernel,
                stride,
                activation,
            } => {
                let x = x(0);
                let (cin, f) = (x.channels, *filters);
                let w = tensor(weights, &format!("{}/kernel", layer.name))?;
                let b = tensor(weights, &format!("{}/bias", layer.name))?;
                shaped(y, shapes[i]);
                for row in y.data.chunks_exact_mut(f) {
                    row.copy_from_slice(b);
                }
                let p = x.height * x.width;
                tap.resize(p * f, 0.0);
                for a in 0..kernel[0] {
                    for bb in 0..kernel[1] {
                        // the tap's weights [f, cin], read transposed
                        let wt = &w[(a * kernel[1] + bb) * f * cin..][..f * cin];
                        gemm.run((p, cin, f), &x.data, (cin, 1), wt, (1, cin), tap, 0.0);
                        for iy in 0..x.height {
                            for ix in 0..x.width {
                                let at = ((iy * stride[0] + a) * ow + ix * stride[1] + bb) * f;
                                y.data[at..at + f]
                                    .iter_mut()
                                    .zip(&tap[(iy * x.width + ix) * f..][..f])
                                    .for_each(|(y, t)| *y += t);
                            }
                        }
                    }
                }
                activation.apply(&mut y.data);
            }
            Op::MaxPool { size, stride } => {
                let x = x(0);
                let c = x.channels;
                shaped(y, shapes[i]);
                let from = &mut argmax[i];
                from.resize(oh * ow * c, 0);
                for oy in 0..oh {
                    for ox in 0..ow {
                        for ch in 0..c {
                            let mut best = (f32::NEG_INFINITY, 0usize);
                            for a in 0..size[0] {
                                for b in 0..size[1] {
                                    let at = ((oy * stride[0] + a) * x.width + ox * stride[1] + b)
                                        * c
                                        + ch;
                                    if x.data[at] > best.0 {
                                        best = (x.data[at], at);
                                    }
                                }
                            }
                            let o = (oy * ow + ox) * c + ch;
                            y.data[o] = best.0;
                            from[o] = best.1 as u32;
                        }
                    }
                }
            }
            Op::Crop { edges } => {
                let x = x(0);
                let c = x.channels;
                shaped(y, shapes[i]);
                for r in 0..oh {
                    let at = ((r + edges[0]) * x.width + edges[2]) * c;
                    y.data[r * ow * c..(r + 1) * ow * c].copy_from_slice(&x.data[at..at + ow * c]);
                }
            }
            Op::Concat => {
                shaped(y, shapes[i]);
                let c = y.channels;
                for (px, out) in y.data.chunks_exact_mut(c).enumerate() {
                    let mut at = 0;
                    for &j in &layer.inputs {
                        let p = &done[j];
                        out[at..at + p.channels]
                            .copy_from_slice(&p.data[px * p.channels..(px + 1) * p.channels]);
                        at += p.channels;
                    }
                }
            }
        }
    }
    Ok(())
}

/// The gradient of layer output `j` (of `like`'s shape) to add into: zeros the first time a
/// pass asks for it.
fn gradient_of<'a>(
    grads: &'a mut [FeatureMap],
    written: &mut [bool],
    j: usize,
    like: &FeatureMap,
) -> &'a mut FeatureMap {
    let g = &mut grads[j];
    if !written[j] {
        shaped(g, [like.height, like.width, like.channels]);
        g.data.fill(0.0);
        written[j] = true;
    }
    g
}

/// Adds a layer's bias gradient: its output's gradient summed over the pixels (`f` per pixel).
fn add_bias_grad(into: &mut BTreeMap<String, Vec<f32>>, layer: &str, dy: &[f32], f: usize) {
    let gb = into
        .get_mut(&format!("{layer}/bias"))
        .expect("a gradient per tensor");
    for row in dy.chunks_exact(f) {
        gb.iter_mut().zip(row).for_each(|(g, d)| *g += d);
    }
}

/// The gradients of the weights added into `into`, from the forward pass in `scratch` and the
/// gradient of the loss with respect to the last layer's input to its activation, in
/// `scratch.grads`' last (`d_logits`: the sigmoid folded into the cross-entropy).
fn backward(
    scratch: &mut Scratch,
    graph: &Graph,
    weights: &BTreeMap<String, Tensor>,
    into: &mut BTreeMap<String, Vec<f32>>,
) -> Result<()> {
    let n = graph.layers.len();
    let Scratch {
        pass,
        grads,
        written,
        dcols,
        tap,
        gemm,
    } = scratch;
    for i in (0..n).rev() {
        if !written[i] {
            continue;
        }
        let (before, rest) = grads.split_at_mut(i);
        let dy = &mut rest[0];
        let layer = &graph.layers[i];
        let y = &pass.outputs[i];
        let input_needs = |j: usize| !matches!(graph.layers[j].op, Op::Input { .. });
        // the last layer's gradient is given before its sigmoid
        if let (true, Op::Conv { activation, .. } | Op::ConvTranspose { activation, .. }) =
            (i + 1 < n, &layer.op)
        {
            through_activation(*activation, &y.data, &mut dy.data);
        }
        match &layer.op {
            Op::Input { .. } => {}
            Op::Conv {
                filters,
                kernel,
                stride,
                padding,
                ..
            } => {
                let j = layer.inputs[0];
                let x = &pass.outputs[j];
                let (oh, ow) = (y.height, y.width);
                let pt = pad_before(x.height, kernel[0], stride[0], *padding);
                let pl = pad_before(x.width, kernel[1], stride[1], *padding);
                let cols = &pass.patches[i];
                let (k, f, p) = (kernel[0] * kernel[1] * x.channels, *filters, oh * ow);
                let gw = into
                    .get_mut(&format!("{}/kernel", layer.name))
                    .expect("a gradient per tensor");
                gemm.run((k, p, f), cols, (1, k), &dy.data, (f, 1), gw, 1.0);
                add_bias_grad(into, &layer.name, &dy.data, f);
                if input_needs(j) {
                    let w = tensor(weights, &format!("{}/kernel", layer.name))?;
                    dcols.resize(p * k, 0.0);
                    gemm.run((p, f, k), &dy.data, (f, 1), w, (1, f), dcols, 0.0);
                    let dx = gradient_of(before, written, j, x);
                    add_patches(dx, dcols, *kernel, *stride, [pt, pl], [oh, ow]);
                }
            }
            Op::ConvTranspose {
                filters,
                kernel,
                stride,
                ..
            } => {
                let j = layer.inputs[0];
                let x = &pass.outputs[j];
                let (cin, f, p) = (x.channels, *filters, x.height * x.width);
                let ow = y.width;
                add_bias_grad(into, &layer.name, &dy.data, f);
                let w = tensor(weights, &format!("{}/kernel", layer.name))?;
                tap.resize(p * f, 0.0);
                for a in 0..kernel[0] {
                    for bb in 0..kernel[1] {
                        for iy in 0..x.height {
                            for ix in 0..x.width {
                                let at = ((iy * stride[0] + a) * ow + ix * stride[1] + bb) * f;
                                tap[(iy * x.width + ix) * f..][..f]
                                    .copy_from_slice(&dy.data[at..at + f]);
                            }
                        }
                        let offset = (a * kernel[1] + bb) * f * cin;
                        let gw = into
                            .get_mut(&format!("{}/kernel", layer.name))
                            .expect("a gradient per tensor");
                        let gw = &mut gw[offset..offset + f * cin];
                        gemm.run((f, p, cin), tap, (1, f), &x.data, (cin, 1), gw, 1.0);
                        if input_needs(j) {
                            let wt = &w[offset..offset + f * cin];
                            let dx = gradient_of(before, written, j, x);
                            gemm.run((p, f, cin), tap, (f, 1), wt, (cin, 1), &mut dx.data, 1.0);
                        }
                    }
                }
            }
            Op::MaxPool { .. } => {
                let j = layer.inputs[0];
                let dx = gradient_of(before, written, j, &pass.outputs[j]);
                for (&from, &d) in pass.argmax[i].iter().zip(&dy.data) {
                    dx.data[from as usize] += d;
                }
            }
            Op::Crop { edges } => {
                let j = layer.inputs[0];
                let x = &pass.outputs[j];
                let c = x.channels;
                let dx = gradient_of(before, written, j, x);
                for r in 0..y.height {
                    let at = ((r + edges[0]) * x.width + edges[2]) * c;
                    dx.data[at..at + y.width * c]
                        .iter_mut()
                        .zip(&dy.data[r * y.width * c..(r + 1) * y.width * c])
                        .for_each(|(d, g)| *d += g);
                }
            }
            Op::Concat => {
                let mut at = 0;
                for &j in &layer.inputs {
                    let x = &pass.outputs[j];
                    let c = x.channels;
                    let dx = gradient_of(before, written, j, x);
                    for (d, g) in dx
                        .data
                        .chunks_exact_mut(c)
                        .zip(dy.data.chunks_exact(y.channels))
                    {
                        d.iter_mut().zip(&g[at..at + c]).for_each(|(d, g)| *d += g);
                    }
                    at += c;
                }
            }
        }
    }
    Ok(())
}

/// One tile of a batch: the detector's input, and per output pixel its target and weight.
struct Example {
    input: FeatureMap,
    targets: Vec<f32>,
    weights: Vec<f32>,
}

/// Where a tile is cut from its level and how it is turned: the output window's corner
/// `(y0, x0)` in the level (it may lie partly outside: those pixels are ignored), the turn as
/// its cosine and sine (exact for quarter turns, so that their pixels are the level's own),
/// and a mirror image.
#[derive(Clone, Copy, Debug)]
struct Cut {
    corner: (isize, isize),
    cos: f32,
    sin: f32,
    mirror: bool,
}

impl Cut {
    /// The level's position shown at `(r, c)` of an `n x n` square centred on the output
    /// window's centre.
    fn source(&self, r: usize, c: usize, n: usize, out: usize) -> (f32, f32) {
        let half = (n as f32 - 1.0) / 2.0;
        let (u, v) = (c as f32 - half, r as f32 - half);
        let u = if self.mirror { -u } else { u };
        let centre = (out as f32 - 1.0) / 2.0;
        (
            self.corner.1 as f32 + centre + self.cos * u - self.sin * v,
            self.corner.0 as f32 + centre + self.sin * u + self.cos * v,
        )
    }
}

/// A standard normal draw per pixel index.
type PixelNoise = Box<dyn Fn(usize) -> f32>;

/// One tile's draw of a [`Wear`]: gamma, contrast, and blur (sigma) or noise (standard
/// deviation, and its draws).
struct Worn {
    gamma: f32,
    contrast: f32,
    blur: Option<f32>,
    noise: Option<(f32, PixelNoise)>,
}

/// `levels` (8-bit levels, `side x side`) worn as `worn` says, in place.
fn wear_tile(levels: &mut [f32], side: usize, worn: &Worn) {
    for v in levels.iter_mut() {
        let x = (*v / 255.0).clamp(0.0, 1.0).powf(worn.gamma);
        *v = (((x - 0.5) * worn.contrast + 0.5) * 255.0).clamp(0.0, 255.0);
    }
    if let Some(sigma) = worn.blur {
        let buf = image::ImageBuffer::<image::Luma<f32>, _>::from_raw(
            side as u32,
            side as u32,
            levels.to_vec(),
        )
        .expect("one value per pixel");
        levels.copy_from_slice(&image::imageops::blur(&buf, sigma).into_raw());
    }
    if let Some((sd, gauss)) = &worn.noise {
        for (i, v) in levels.iter_mut().enumerate() {
            *v = (*v + sd * gauss(i)).clamp(0.0, 255.0);
        }
    }
}

/// The tile of `level` that `cut` says, worn as `worn` says, and what each of its output
/// pixels is taught (the nearest level pixel's class; ignored outside the level).
fn example(
    level: &TaughtLevel,
    cut: Cut,
    (tile, out): (usize, usize),
    input_scale: f32,
    worn: Option<&Worn>,
) -> Example {
    let mut values = vec![0f32; tile * tile];
    for r in 0..tile {
        for c in 0..tile {
            let (x, y) = cut.source(r, c, tile, out);
            values[r * tile + c] = level.image.bilinear(x, y);
        }
    }
    if let Some(worn) = worn {
        wear_tile(&mut values, tile, worn);
    }
    let mut input = FeatureMap::zeros(tile, tile, 1);
    for (i, v) in values.into_iter().enumerate() {
        input.data[i] = v * input_scale;
    }
    let (w, h) = (level.image.width as isize, level.image.height as isize);
    let mut targets = vec![0f32; out * out];
    let mut weights = vec![0f32; out * out];
    for r in 0..out {
        for c in 0..out {
            let (x, y) = cut.source(r, c, out, out);
            let (x, y) = (x.round() as isize, y.round() as isize);
            let class = if y < 0 || x < 0 || y >= h || x >= w {
                IGNORED
            } else {
                level.class[(y * w + x) as usize]
            };
            if class != IGNORED {
                targets[r * out + c] = f32::from(class == CRATER);
                weights[r * out + c] = 1.0;
            }
        }
    }
    Example {
        input,
        targets,
        weights,
    }
}

/// The names of the tensors a fit changes: every convolution's kernel and bias.
fn trained_tensors(graph: &Graph) -> Vec<String> {
    graph
        .layers
        .iter()
        .filter(|l| matches!(l.op, Op::Conv { .. } | Op::ConvTranspose { .. }))
        .flat_map(|l| [format!("{}/kernel", l.name), format!("{}/bias", l.name)])
        .collect()
}

/// The loss of one example and the gradient of the weights it gives (the cross-entropy of
/// each weighted pixel, divided by `total` weight), in `scratch`'s memory.
fn example_gradient(
    scratch: &mut Scratch,
    graph: &Graph,
    weights: &BTreeMap<String, Tensor>,
    e: &Example,
    total: f32,
    names: &[String],
) -> Result<(f64, BTreeMap<String, Vec<f32>>)> {
    forward(scratch, graph, weights, &e.input)?;
    let n = graph.layers.len();
    let p = &scratch.pass.outputs[n - 1];
    ensure!(
        p.data.len() == e.targets.len(),
        Error::Invalid(format!(
            "the detector's output has {} pixels for a tile, not the {} its shape says",
            p.data.len(),
            e.targets.len()
        ))
    );
    scratch.grads.resize_with(n, || FeatureMap::zeros(0, 0, 0));
    scratch.written.clear();
    scratch.written.resize(n, false);
    let d = &mut scratch.grads[n - 1];
    shaped(d, [p.height, p.width, p.channels]);
    let mut loss = 0f64;
    for (d, ((&p, &t), &w)) in d
        .data
        .iter_mut()
        .zip(p.data.iter().zip(&e.targets).zip(&e.weights))
    {
        let q = p.clamp(1e-7, 1.0 - 1e-7) as f64;
        loss += w as f64 * -(t as f64 * q.ln() + (1.0 - t as f64) * (1.0 - q).ln());
        *d = w * (p - t) / total;
    }
    scratch.written[n - 1] = true;
    let mut grads: BTreeMap<String, Vec<f32>> = names
        .iter()
        .map(|n| Ok((n.clone(), vec![0f32; tensor(weights, n)?.len()])))
        .collect::<Result<_>>()?;
    backward(scratch, graph, weights, &mut grads)?;
    Ok((loss / total as f64, grads))
}

/// The detector `config` with `weights` fitted whole on `images` (pyramid as `detect` makes
/// it with `o`); `progress` is told of each step with the batch's mean loss.
pub fn fit_whole(
    config: &DetectorConfig,
    weights: &BTreeMap<String, Tensor>,
    images: &[Labelled],
    o: &DetectOptions,
    fit: &WholeFitOptions,
    progress: &(dyn Fn(f64) + Sync),
) -> Result<BTreeMap<String, Tensor>> {
    o.check()?;
    ensure!(
        fit.steps > 0 && fit.batch > 0 && fit.learning_rate > 0.0,
        Error::Invalid("a whole fit needs steps, a batch and a learning rate above 0".into())
    );
    let products = Products::of(fit.precision)?;
    let graph = &config.graph;
    let last = graph.layers.last().map(|l| &l.op);
    ensure!(
        matches!(
            last,
            Some(Op::Conv {
                filters: 1,
                activation: Activation::Sigmoid,
                ..
            })
        ),
        Error::Unsupported(
            "only a detector whose last layer is a convolution to one sigmoid channel can be \
             fitted whole"
                .into()
        )
    );
    let (out, _) = config.output()?;
    let tile = config.tile;
    let levels = taught_levels(images, o, fit.region_share)?;
    // levels drawn by their area, each at least a twentieth of the draws' share: the
    // smallest levels hold the largest craters, few in pixels
    let areas: Vec<f64> = levels
        .iter()
        .map(|l| (l.image.width * l.image.height) as f64)
        .collect();
    let sum: f64 = areas.iter().sum();
    let shares: Vec<f64> = areas.iter().map(|a| (a / sum).max(0.05)).collect();
    let norm: f64 = shares.iter().sum();
    let cumulative: Vec<f64> = shares
        .iter()
        .scan(0.0, |s, a| {
            *s += a / norm;
            Some(*s)
        })
        .collect();
    let names = trained_tensors(graph);
    let mut w = weights.clone();
    let mut moments: BTreeMap<String, (Vec<f32>, Vec<f32>)> = names
        .iter()
        .map(|n| {
            let len = tensor(weights, n)?.len();
            Ok((n.clone(), (vec![0f32; len], vec![0f32; len])))
        })
        .collect::<Result<_>>()?;
    // one example's memory per tile in flight, kept from step to step
    let kept: Mutex<Vec<Scratch>> = Mutex::new(Vec::new());
    let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-7f32);
    let lr = fit.learning_rate as f32;
    for step in 0..fit.steps {
        let batch: Vec<Example> = (0..fit.batch)
            .map(|i| {
                let r = |k: usize| draw(step, 17 + k, i);
                let at = r(0);
                let li = cumulative
                    .iter()
                    .position(|&c| at < c)
                    .unwrap_or(levels.len() - 1);
                let level = &levels[li];
                let place = |size: usize, u: f64| -> isize {
                    // an output window inside the level where it fits, else covering it
                    let span = size as isize - out as isize;
                    let (lo, hi) = if span >= 0 { (0, span) } else { (span, 0) };
                    lo + ((hi - lo + 1) as f64 * u) as isize
                };
                let (y0, x0) = (
                    place(level.image.height, r(1)),
                    place(level.image.width, r(2)),
                );
                let (cos, sin) = match fit.wear {
                    // any angle
                    Some(_) => {
                        let (sin, cos) = (r(3) as f32 * std::f32::consts::TAU).sin_cos();
                        (cos, sin)
                    }
                    None => [(1.0, 0.0), (0.0, 1.0), (-1.0, 0.0), (0.0, -1.0)]
                        [((r(3) * 4.0) as usize).min(3)],
                };
                let cut = Cut {
                    corner: (y0, x0),
                    cos,
                    sin,
                    mirror: r(4) < 0.5,
                };
                let worn = fit.wear.as_ref().map(|wear| {
                    let within = |(lo, hi): (f64, f64), u: f64| (lo + (hi - lo) * u) as f32;
                    let sigma = |range| within(range, r(8));
                    let blurred = r(7) < 0.5;
                    Worn {
                        gamma: within(wear.gamma, r(5)),
                        contrast: within(wear.contrast, r(6)),
                        blur: blurred.then(|| sigma(wear.blur_sigma)),
                        noise: (!blurred).then(|| {
                            let gauss: PixelNoise = Box::new(move |p: usize| {
                                // Box-Muller on two draws of this pixel
                                let u = 1.0 - draw(step, 1024 + 2 * p, i);
                                let v = draw(step, 1025 + 2 * p, i);
                                ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
                            });
                            (sigma(wear.noise_sigma), gauss)
                        }),
                    }
                });
                example(level, cut, (tile, out), config.input_scale, worn.as_ref())
            })
            .collect();
        let total: f32 = batch
            .iter()
            .map(|e| e.weights.iter().sum::<f32>())
            .sum::<f32>()
            .max(1.0);
        let (loss, grads) = batch
            .par_iter()
            .map(|e| {
                let mut scratch = kept
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .pop()
                    .unwrap_or_else(|| Scratch::new(products));
                let got = example_gradient(&mut scratch, graph, &w, e, total, &names);
                kept.lock().unwrap_or_else(|e| e.into_inner()).push(scratch);
                got
            })
            .try_reduce(
                || (0.0, BTreeMap::new()),
                |(la, mut a), (lb, b)| {
                    for (k, g) in b {
                        match a.get_mut(&k) {
                            Some(v) => v.iter_mut().zip(g).for_each(|(v, g)| *v += g),
                            None => {
                                a.insert(k, g);
                            }
                        }
                    }
                    Ok((la + lb, a))
                },
            )?;
        let t = step as i32 + 1;
        let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        for (name, g) in &grads {
            let (m1, m2) = moments.get_mut(name).expect("moments per tensor");
            let p = &mut w.get_mut(name).expect("a tensor per gradient").1;
            for k in 0..p.len() {
                m1[k] = b1 * m1[k] + (1.0 - b1) * g[k];
                m2[k] = b2 * m2[k] + (1.0 - b2) * g[k] * g[k];
                p[k] -= lr * (m1[k] / c1) / ((m2[k] / c2).sqrt() + eps);
            }
        }
        tracing::debug!(step, loss, "whole fit");
        progress(loss);
    }
    Ok(w)
}

/// `weights` with the last layer's bias moved by `shift` (in logits): what moves the fitted
/// likelihood's best threshold onto the default one.
pub fn shifted(
    graph: &Graph,
    weights: &BTreeMap<String, Tensor>,
    shift: f32,
) -> Result<BTreeMap<String, Tensor>> {
    let last = graph
        .layers
        .last()
        .ok_or_else(|| Error::Invalid("the detector has no layers".into()))?;
    let mut out = weights.clone();
    let bias = out
        .get_mut(&format!("{}/bias", last.name))
        .ok_or_else(|| Error::Invalid(format!("the detector has no bias for {}", last.name)))?;
    bias.1.iter_mut().for_each(|b| *b += shift);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Layer, Padding};

    fn conv(
        name: &str,
        filters: usize,
        k: usize,
        padding: Padding,
        act: Activation,
        from: usize,
    ) -> Layer {
        Layer {
            name: name.into(),
            op: Op::Conv {
                filters,
                kernel: [k, k],
                stride: [1, 1],
                padding,
                activation: act,
            },
            inputs: vec![from],
        }
    }

    /// A small graph with every operation: two paths joined (crop, pool, transposed
    /// convolution, concatenation), a same-padded and valid convolutions, a sigmoid head.
    fn small_graph() -> Graph {
        Graph {
            layers: vec![
                Layer {
                    name: "in".into(),
                    op: Op::Input { channels: 1 },
                    inputs: vec![],
                },
                conv("c1", 3, 3, Padding::Valid, Activation::Relu, 0),
                Layer {
                    name: "pool".into(),
                    op: Op::MaxPool {
                        size: [2, 2],
                        stride: [2, 2],
                    },
                    inputs: vec![1],
                },
                conv("c2", 4, 3, Padding::Same, Activation::Linear, 2),
                Layer {
                    name: "up".into(),
                    op: Op::ConvTranspose {
                        filters: 2,
                        kernel: [2, 2],
                        stride: [2, 2],
                        activation: Activation::Relu,
                    },
                    inputs: vec![3],
                },
                Layer {
                    name: "crop".into(),
                    op: Op::Crop {
                        edges: [0, 0, 0, 0],
                    },
                    inputs: vec![1],
                },
                Layer {
                    name: "cat".into(),
                    op: Op::Concat,
                    inputs: vec![5, 4],
                },
                conv("c3", 3, 3, Padding::Valid, Activation::Relu, 6),
                conv("head", 1, 1, Padding::Valid, Activation::Sigmoid, 7),
            ],
        }
    }

    fn values(n: usize, seed: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|i| (draw(seed, 3, i) as f32 - 0.5) * 2.0 * scale)
            .collect()
    }

    fn small_weights(graph: &Graph) -> BTreeMap<String, Tensor> {
        let shapes = graph.layer_shapes(10, 10).unwrap();
        let mut w = BTreeMap::new();
        for (i, l) in graph.layers.iter().enumerate() {
            let cin = l.inputs.first().map_or(0, |&j| shapes[j][2]);
            let (kernel, f) = match l.op {
                Op::Conv {
                    filters, kernel, ..
                } => (vec![kernel[0], kernel[1], cin, filters], filters),
                Op::ConvTranspose {
                    filters, kernel, ..
                } => (vec![kernel[0], kernel[1], filters, cin], filters),
                _ => continue,
            };
            let n: usize = kernel.iter().product();
            w.insert(format!("{}/kernel", l.name), (kernel, values(n, i, 0.6)));
            w.insert(
                format!("{}/bias", l.name),
                (vec![f], values(f, 100 + i, 0.1)),
            );
        }
        w
    }

    #[test]
    fn the_forward_pass_is_the_detectors() {
        let graph = small_graph();
        let weights = small_weights(&graph);
        let input = FeatureMap {
            height: 10,
            width: 10,
            channels: 1,
            data: values(100, 7, 1.0),
        };
        let net = crate::Net::new(graph.clone(), |n| weights.get(n).cloned()).unwrap();
        let want = net.forward(input.clone()).unwrap();
        let mut scratch = Scratch::new(Products::F32);
        forward(&mut scratch, &graph, &weights, &input).unwrap();
        let got = scratch.pass.outputs.last().unwrap();
        assert_eq!((got.height, got.width), (want.height, want.width));
        for (g, w) in got.data.iter().zip(&want.data) {
            assert!((g - w).abs() < 1e-5, "{g} vs {w}");
        }
    }

    /// A 10 x 10 tile for the small graph, every third output pixel a crater, weighted as given.
    fn small_example(weights: Vec<f32>) -> Example {
        Example {
            input: FeatureMap {
                height: 10,
                width: 10,
                channels: 1,
                data: values(100, 8, 1.0),
            },
            targets: (0..36).map(|i| f32::from(i % 3 == 0)).collect(),
            weights,
        }
    }

    #[test]
    fn gradients_agree_with_finite_differences() {
        let graph = small_graph();
        let weights = small_weights(&graph);
        let e = small_example(
            (0..36)
                .map(|i| if i % 5 == 4 { 0.0 } else { 1.0 })
                .collect(),
        );
        let names = trained_tensors(&graph);
        let total = e.weights.iter().sum::<f32>();
        let mut scratch = Scratch::new(Products::F32);
        let (_, grads) =
            example_gradient(&mut scratch, &graph, &weights, &e, total, &names).unwrap();
        let mut loss = |w: &BTreeMap<String, Tensor>| {
            // in f64 from the f32 pass: the loss summed as example_gradient sums it
            example_gradient(&mut scratch, &graph, w, &e, total, &names)
                .unwrap()
                .0
        };
        let mut checked = 0;
        for name in &names {
            let n = weights[name].1.len();
            for k in (0..n).step_by((n / 5).max(1)) {
                let h = 1e-2f32;
                let mut plus = weights.clone();
                plus.get_mut(name).unwrap().1[k] += h;
                let mut minus = weights.clone();
                minus.get_mut(name).unwrap().1[k] -= h;
                let numeric = (loss(&plus) - loss(&minus)) / (2.0 * h as f64);
                let analytic = grads[name][k] as f64;
                assert!(
                    (numeric - analytic).abs() <= 2e-3 + 0.05 * analytic.abs(),
                    "{name}[{k}]: finite differences {numeric}, backward {analytic}"
                );
                checked += 1;
            }
        }
        assert!(checked >= 35, "{checked}");
    }

    /// The small graph's shapes with 16 filters, so that its products run in bf16, and its
    /// weights scaled by fan-in, so that 16 channels do not saturate the sigmoid.
    fn wide_graph() -> (Graph, BTreeMap<String, Tensor>) {
        let mut graph = small_graph();
        for l in &mut graph.layers {
            if let Op::Conv { filters, .. } | Op::ConvTranspose { filters, .. } = &mut l.op {
                if *filters > 1 {
                    *filters = 16;
                }
            }
        }
        let weights = small_weights(&graph)
            .into_iter()
            .map(|(name, (shape, v))| {
                let fan_in: usize = shape.iter().rev().skip(1).product::<usize>().max(1);
                let s = (3.0 / fan_in as f32).sqrt();
                (name, (shape, v.into_iter().map(|x| x * s).collect()))
            })
            .collect();
        (graph, weights)
    }

    /// Every f32 buffer of `scratch` overwritten with NaN, as if another tile had left
    /// garbage there.
    fn spoil(scratch: &mut Scratch) {
        let Scratch {
            pass,
            grads,
            dcols,
            tap,
            gemm,
            ..
        } = scratch;
        let maps = pass.outputs.iter_mut().chain(grads.iter_mut());
        let buffers =
            pass.patches
                .iter_mut()
                .chain([dcols, tap, &mut gemm.copied, &mut gemm.transposed]);
        maps.map(|m| &mut m.data)
            .chain(buffers)
            .for_each(|b| b.fill(f32::NAN));
    }

    #[test]
    fn memory_kept_from_another_tile_gives_the_same_gradients() {
        let e = small_example(vec![1.0; 36]);
        let mut other = small_example(vec![0.5; 36]);
        other.input.data = values(100, 9, 1.0);
        let small = (small_graph(), small_weights(&small_graph()));
        let runs = [
            Some((Products::F32, small)),
            Some((Products::F32, wide_graph())),
            Products::of(Precision::Bf16)
                .ok()
                .map(|p| (p, wide_graph())),
        ];
        for (products, (graph, weights)) in runs.into_iter().flatten() {
            let names = trained_tensors(&graph);
            let mut fresh = Scratch::new(products);
            let want = example_gradient(&mut fresh, &graph, &weights, &e, 36.0, &names).unwrap();
            let mut kept = Scratch::new(products);
            example_gradient(&mut kept, &graph, &weights, &other, 18.0, &names).unwrap();
            spoil(&mut kept);
            let got = example_gradient(&mut kept, &graph, &weights, &e, 36.0, &names).unwrap();
            assert_eq!(want.0.to_bits(), got.0.to_bits(), "{products:?}: loss");
            for name in &names {
                let same = want.1[name]
                    .iter()
                    .zip(&got.1[name])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{products:?}: {name} differs");
            }
        }
    }

    #[test]
    fn bf16_products_are_the_f32_products_of_rounded_operands() {
        let Ok(bf16) = Products::of(Precision::Bf16) else {
            return; // no bf16 hardware at this level
        };
        let round = |v: &[f32]| -> Vec<f32> {
            v.iter()
                .map(|&x| f32::from_bits(u32::from(bf16::bf16_bits(x)) << 16))
                .collect()
        };
        // rows that fill no block; and whole blocks of rows over fewer columns, where a
        // transposed `a` has `c` computed transposed
        let mut products = Gemm::new(bf16);
        for (m, k, n) in [(37, 45, 32), (32, 45, 16)] {
            let a = values(m * k, 1, 1.0);
            let b = values(k * n, 2, 1.0);
            // each operand as stored and transposed, with c started from something
            for (a_strides, b_strides) in [
                ((k, 1), (n, 1)),
                ((1, m), (n, 1)),
                ((k, 1), (1, k)),
                ((1, m), (1, k)),
            ] {
                for beta in [0.0, 1.0] {
                    // at beta 0, c is not read: it starts as NaN
                    let start = match beta {
                        0.0 => vec![f32::NAN; m * n],
                        _ => values(m * n, 3, 1.0),
                    };
                    let mut want = start.clone();
                    gemm_f32(
                        (m, k, n),
                        &round(&a),
                        a_strides,
                        &round(&b),
                        b_strides,
                        &mut want,
                        beta,
                    );
                    let mut got = start.clone();
                    products.run((m, k, n), &a, a_strides, &b, b_strides, &mut got, beta);
                    for (g, w) in got.iter().zip(&want) {
                        assert!(
                            (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                            "{a_strides:?} {b_strides:?} {beta}: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_bf16_fit_follows_the_f32_gradients() {
        let Ok(bf16) = Products::of(Precision::Bf16) else {
            return; // no bf16 hardware at this level
        };
        let (graph, weights) = wide_graph();
        let e = small_example(vec![1.0; 36]);
        let names = trained_tensors(&graph);
        let (loss32, want) = example_gradient(
            &mut Scratch::new(Products::F32),
            &graph,
            &weights,
            &e,
            36.0,
            &names,
        )
        .unwrap();
        let (loss16, got) =
            example_gradient(&mut Scratch::new(bf16), &graph, &weights, &e, 36.0, &names).unwrap();
        assert!(
            (loss32 - loss16).abs() < 0.01 * loss32,
            "loss {loss32} vs {loss16}"
        );
        // bf16 keeps 8 bits of each operand, and each layer passes its rounding back to the
        // ones before it: on this net the tensors differ by 0.2-10% of their norm (the first
        // layer's the most), the whole gradient by 1.9%
        let (mut all_off, mut all_norm) = (0f32, 0f32);
        for name in &names {
            let (w, g) = (&want[name], &got[name]);
            let norm = w.iter().map(|v| v * v).sum::<f32>();
            let off = w.iter().zip(g).map(|(w, g)| (w - g).powi(2)).sum::<f32>();
            assert!(norm > 0.0, "{name}: no gradient");
            assert!(
                off <= 0.2f32.powi(2) * norm,
                "{name}: bf16 off by {} of {}",
                off.sqrt(),
                norm.sqrt()
            );
            all_off += off;
            all_norm += norm;
        }
        assert!(
            all_off <= 0.06f32.powi(2) * all_norm,
            "bf16 off by {} of {}",
            all_off.sqrt(),
            all_norm.sqrt()
        );
    }

    fn level(width: usize, height: usize) -> TaughtLevel {
        let pixels: Vec<u8> = (0..width * height).map(|i| (i * 7 % 251) as u8).collect();
        TaughtLevel {
            image_index: 0,
            level_index: 0,
            image: crate::detect::GrayImage {
                width,
                height,
                pixels,
            },
            class: (0..width * height)
                .map(|i| if i % 3 == 0 { CRATER } else { 0 })
                .collect(),
        }
    }

    /// A quarter turn or a mirror image moves the level's own pixels (none interpolated) and
    /// the taught classes with them; a turn by any angle keeps the centre's pixel where it is.
    #[test]
    fn a_cut_turns_the_tile_and_its_classes_together() {
        let l = level(40, 30);
        let (tile, out) = (12, 8);
        let upright = Cut {
            corner: (10, 14),
            cos: 1.0,
            sin: 0.0,
            mirror: false,
        };
        let e = example(&l, upright, (tile, out), 1.0, None);
        // upright, the tile's pixel (r, c) is the level's (y0 - 2 + r, x0 - 2 + c)
        assert_eq!(e.input.data[0], l.image.mirrored(12, 8) as f32);
        assert_eq!(e.targets[0], f32::from(l.class[10 * 40 + 14] == CRATER));
        for mirror in [false, true] {
            let quarter = Cut {
                corner: (10, 14),
                cos: 0.0,
                sin: 1.0,
                mirror,
            };
            let q = example(&l, quarter, (tile, out), 1.0, None);
            let mut a: Vec<f32> = q.input.data.clone();
            let mut b: Vec<f32> = e.input.data.clone();
            a.sort_by(f32::total_cmp);
            b.sort_by(f32::total_cmp);
            assert_eq!(a, b, "the same pixels, moved");
            assert_ne!(q.input.data, e.input.data);
            // classes follow their pixels: the pixel taught crater shows the same value
            for r in 0..out {
                for c in 0..out {
                    let (x, y) = quarter.source(r, c, out, out);
                    let (x, y) = (x.round() as usize, y.round() as usize);
                    let crater = l.class[y * 40 + x] == CRATER;
                    assert_eq!(q.targets[r * out + c], f32::from(crater));
                    let shown = q.input.data[(r + 2) * tile + c + 2];
                    assert_eq!(shown, l.image.mirrored(x as isize, y as isize) as f32);
                }
            }
        }
        let (sin, cos) = 0.7f32.sin_cos();
        let (x, y) = Cut {
            cos,
            sin,
            ..upright
        }
        .source(5, 5, 11, 11);
        assert!(
            (x - 19.0).abs() < 1e-4 && (y - 15.0).abs() < 1e-4,
            "{x} {y}"
        );
    }

    /// Gamma, contrast and noise change the levels within 0-255; blur smooths them.
    #[test]
    fn wear_changes_levels_within_range() {
        let side = 16;
        let base: Vec<f32> = (0..side * side).map(|i| ((i * 37) % 256) as f32).collect();
        let spread = |v: &[f32]| {
            let n = v.len() as f32;
            let m = v.iter().sum::<f32>() / n;
            (v.iter().map(|x| (x - m).powi(2)).sum::<f32>() / n).sqrt()
        };
        let identity = || Worn {
            gamma: 1.0,
            contrast: 1.0,
            blur: None,
            noise: None,
        };
        let mut plain = base.clone();
        wear_tile(&mut plain, side, &identity());
        assert!(plain.iter().zip(&base).all(|(a, b)| (a - b).abs() < 1e-3));
        let mut dark = base.clone();
        wear_tile(
            &mut dark,
            side,
            &Worn {
                gamma: 1.4,
                ..identity()
            },
        );
        assert!(dark.iter().zip(&base).all(|(a, b)| a <= b));
        assert!(dark.iter().zip(&base).any(|(a, b)| a < &(b - 1.0)));
        let mut blurred = base.clone();
        wear_tile(
            &mut blurred,
            side,
            &Worn {
                blur: Some(1.0),
                ..identity()
            },
        );
        assert!(spread(&blurred) < 0.8 * spread(&base));
        let mut noisy = vec![128f32; side * side];
        wear_tile(
            &mut noisy,
            side,
            &Worn {
                noise: Some((4.0, Box::new(|p| draw(0, 1024 + p, 0) as f32 * 2.0 - 1.0))),
                ..identity()
            },
        );
        let sd = spread(&noisy);
        assert!(sd > 1.0 && sd < 4.0 && noisy.iter().all(|v| (0.0..=255.0).contains(v)));
    }
}
