//! A detector graph with its weights, run on craterdex's kernels: convolutions as products
//! of the image's patches (im2col) or tap by tap with the packed kernel, in f32, bf16 or
//! int8 (the layers of many channels) like the ViT's linear layers.

use crate::error::{Error, Result};
use crate::graph::{Activation, Graph, Op, Padding};
use craterdex_errors::ensure;
use craterdex_kernels::bf16::{self, PackedConvBf16};
use craterdex_kernels::gemm::{matmul_f32, PackedF32};
use craterdex_kernels::linear_i8::{self, PackedI8Linear};
use craterdex_kernels::winograd::{self, InputPart, Winograd};
use craterdex_model::vit::Linear;
use craterdex_model::Precision;
use rayon::prelude::*;
use std::sync::Mutex;

/// A map of `height x width` pixels of `channels` values each, channels last.
#[derive(Clone, Debug, PartialEq)]
pub struct FeatureMap {
    pub height: usize,
    pub width: usize,
    pub channels: usize,
    pub data: Vec<f32>,
}

impl FeatureMap {
    pub fn zeros(height: usize, width: usize, channels: usize) -> Self {
        Self {
            height,
            width,
            channels,
            data: vec![0.0; height * width * channels],
        }
    }
}

/// A weight tensor: its shape and values, row-major.
pub type Tensor = (Vec<usize>, Vec<f32>);

enum Kernel {
    /// Layers without weights.
    None,
    /// A convolution of many input channels: one product per kernel tap, read in place.
    Taps(Taps),
    /// Any other convolution: products of the gathered patches (im2col).
    Conv { linear: Linear, in_channels: usize },
    /// Where the taps do not overlap (kernel and stride alike: the U-Net's 2x2), one layer
    /// per kernel row (`[in, kw * out]`, with the bias), whose outputs for an input row are the
    /// output row of that kernel row as it lies in the map. Else one layer of every tap at
    /// once (`[in, kh * kw * out]`, no bias), scattered to the outputs, and the bias after.
    ConvTranspose {
        linears: Vec<Linear>,
        by_row: bool,
        in_channels: usize,
        bias: Vec<f32>,
    },
}

/// A convolution's weights by tap, packed for its precision.
enum TapWeights {
    /// A 3x3 or 2x2 kernel in f32 by Winograd's blocks ([`winograd`]): a quarter (3x3) or
    /// 1 / 2.25 (2x2) of the multiply-adds of tap by tap. `kernel` is the weights as Keras
    /// stores them, what another precision or a fold is made from.
    Winograd { blocks: Winograd, kernel: Vec<f32> },
    /// Each tap's `[in, out]` weight, and where the convolution reads a concatenation's
    /// parts in place, each tap's rows for each part's channels (else empty).
    F32 {
        taps: Vec<PackedF32>,
        by_part: Vec<Vec<PackedF32>>,
    },
    /// The whole kernel, each kernel row one product ([`PackedConvBf16`]).
    Bf16(PackedConvBf16),
    /// Each tap's `[in, out]` weight.
    Int8(Vec<PackedI8Linear>),
}

/// Input channels from which a layer runs in int8 when the detector's precision is int8:
/// int8 products take whole groups of [`linear_i8::GROUP`] inputs, so narrower layers would
/// multiply mostly padding (the U-Net's 16- and 32-channel layers stay in bf16 or f32).
const INT8_FROM_CHANNELS: usize = linear_i8::GROUP;

/// What a convolution by taps reads: a map, or the parts of a concatenation read in place
/// (`(map, top, left)`: each part's map from that pixel on, a crop of it), joined as they
/// are rounded to bf16.
enum TapInput<'a> {
    Map(&'a FeatureMap),
    Parts {
        parts: Vec<(&'a FeatureMap, usize, usize)>,
        height: usize,
        width: usize,
        channels: usize,
    },
}

impl TapInput<'_> {
    fn height(&self) -> usize {
        match self {
            TapInput::Map(x) => x.height,
            TapInput::Parts { height, .. } => *height,
        }
    }

    fn width(&self) -> usize {
        match self {
            TapInput::Map(x) => x.width,
            TapInput::Parts { width, .. } => *width,
        }
    }

    fn channels(&self) -> usize {
        match self {
            TapInput::Map(x) => x.channels,
            TapInput::Parts { channels, .. } => *channels,
        }
    }

    /// Writes pixels `first..` (row-major, a whole number of `channels` values) into
    /// `values`: what the concatenation holds there.
    fn gather(&self, first: usize, values: &mut [f32]) {
        match self {
            TapInput::Map(x) => {
                let c = x.channels;
                values.copy_from_slice(&x.data[first * c..first * c + values.len()]);
            }
            TapInput::Parts {
                parts,
                width,
                channels,
                ..
            } => {
                for (i, px) in values.chunks_exact_mut(*channels).enumerate() {
                    let (y, x) = ((first + i) / width, (first + i) % width);
                    let mut at = 0;
                    for (src, top, left) in parts {
                        let c = src.channels;
                        let from = ((y + top) * src.width + left + x) * c;
                        px[at..at + c].copy_from_slice(&src.data[from..from + c]);
                        at += c;
                    }
                }
            }
        }
    }

    /// The values rounded to bf16 into `map16` ([`bf16::round_map`]'s layout), the parts of a
    /// concatenation each into its channels, in parallel over rows; returns where they start.
    fn round(&self, map16: &mut Vec<u16>) -> usize {
        let len = self.height() * self.width() * self.channels();
        match self {
            TapInput::Map(x) => bf16::round_map(&x.data, len, map16),
            TapInput::Parts {
                parts,
                width,
                channels,
                ..
            } => {
                let start = bf16::map_start(map16, len);
                map16[start..start + len]
                    .par_chunks_mut(width * channels)
                    .enumerate()
                    .for_each(|(y, row)| {
                        let mut at = 0;
                        for (src, top, left) in parts {
                            let c = src.channels;
                            let from = ((y + top) * src.width + left) * c;
                            let values = &src.data[from..from + width * c];
                            bf16::round_into(values, *width, c, &mut row[at..], *channels);
                            at += c;
                        }
                    });
                start
            }
        }
    }
}

/// A stride-1 convolution as `kh * kw` products, each of the input map read in place at the
/// tap's offset: output pixel `(y, x)` is input pixel `(y + i, x + j)` at tap `(i, j)`, so a
/// run of one output row reads each tap's input rows contiguously (from `(y + i) * W + x + j`,
/// `W` the input's width). Nothing is copied before the products (an im2col of the U-Net's
/// widest layer is 9 times its input), each block of outputs stays in cache through all the
/// taps, and the outputs are written where the next layer reads them. In bf16 a kernel row's
/// `kw` taps are one product, their pixels' values side by side in the map
/// ([`PackedConvBf16`]).
struct Taps {
    weights: TapWeights,
    bias: Vec<f32>,
    kernel: [usize; 2],
    in_channels: usize,
    filters: usize,
}

/// Input channels from which a convolution runs tap by tap: fewer leave each product too
/// shallow to be worth it (the first layer, 1 channel, gathers its 9 values instead).
const TAPS_FROM_CHANNELS: usize = 8;

/// Output positions per task of a tap convolution: one block's outputs stay in L2 across the
/// taps.
const TAP_ROWS: usize = 192;

impl Taps {
    fn new(
        w: &[f32],
        bias: Vec<f32>,
        kernel: [usize; 2],
        in_channels: usize,
        filters: usize,
    ) -> Self {
        let weights = match Winograd::new(kernel, w, in_channels, filters) {
            Some(blocks) => TapWeights::Winograd {
                blocks,
                kernel: w.to_vec(),
            },
            None => TapWeights::F32 {
                taps: w
                    .chunks_exact(in_channels * filters)
                    .map(|t| PackedF32::from_kn(t, in_channels, filters))
                    .collect(),
                by_part: Vec::new(),
            },
        };
        Self {
            weights,
            bias,
            kernel,
            in_channels,
            filters,
        }
    }

    /// Each tap's `[in, out]` weight in f32, from an f32 layer (by taps or by blocks).
    fn f32_taps(&self) -> Vec<Vec<f32>> {
        match &self.weights {
            TapWeights::Winograd { kernel, .. } => kernel
                .chunks_exact(self.in_channels * self.filters)
                .map(<[f32]>::to_vec)
                .collect(),
            TapWeights::F32 { taps, .. } => taps.iter().map(PackedF32::unpack).collect(),
            TapWeights::Bf16(_) | TapWeights::Int8(_) => {
                unreachable!("f32 weights are read before the precision is set")
            }
        }
    }

    /// Splits each f32 tap's weight by the channels of the concatenation's parts it reads
    /// in place (`channels`, in order); Winograd's blocks and the other precisions read
    /// parts their own way.
    fn split_by_parts(&mut self, channels: &[usize]) {
        let (n, k) = (self.filters, self.in_channels);
        let TapWeights::F32 { taps, by_part } = &mut self.weights else {
            return;
        };
        if channels.iter().sum::<usize>() != k {
            // a graph whose concatenation does not fit the kernel: refused when it runs
            return;
        }
        *by_part = taps
            .iter()
            .map(|t| {
                let w = t.unpack();
                let mut from = 0;
                channels
                    .iter()
                    .map(|&c| {
                        let rows = &w[from * n..(from + c) * n];
                        from += c;
                        PackedF32::from_kn(rows, c, n)
                    })
                    .collect()
            })
            .collect();
    }

    fn set_precision(&mut self, p: Precision) {
        let p = layer_precision(p, self.in_channels);
        let (k, n) = (self.in_channels, self.filters);
        self.weights = match p {
            Precision::F32 => return,
            Precision::Bf16 if !PackedConvBf16::fits(n) => return,
            Precision::Bf16 => {
                let w: Vec<f32> = self.f32_taps().concat();
                TapWeights::Bf16(PackedConvBf16::new(&w, self.kernel, k, n))
            }
            Precision::Int8 => TapWeights::Int8(
                self.f32_taps()
                    .iter()
                    .map(|t| PackedI8Linear::new(t, k, n))
                    .collect(),
            ),
        };
    }

    fn forward(
        &self,
        input: &TapInput,
        activation: Activation,
        [oh, ow, f]: [usize; 3],
        pools: &Pools,
    ) -> FeatureMap {
        if let TapWeights::Winograd { blocks, .. } = &self.weights {
            return self.forward_winograd(blocks, input, activation, [oh, ow, f], &pools.f32);
        }
        let pool = &pools.f32;
        let width = input.width();
        let kw = self.kernel[1];
        let c = self.in_channels;
        let rounded = match &self.weights {
            TapWeights::Bf16(_) => {
                let len = input.height() * width * c;
                let mut map16 = pools.bf16.dirty(bf16::rounded_map_len(len));
                let start = input.round(&mut map16);
                Some((map16, start))
            }
            _ => None,
        };
        let x = match (input, &self.weights) {
            (TapInput::Map(x), _) => Some(*x),
            (TapInput::Parts { .. }, _) => None,
        };
        let quantised = match &self.weights {
            TapWeights::Int8(taps) => Some(pools.quantised(input, &taps[0])),
            _ => None,
        };
        let mut out = pool.dirty_map(oh, ow, f);
        out.data
            .par_chunks_mut(TAP_ROWS * f)
            .enumerate()
            .for_each_init(Vec::new, |scratch, (chunk, o)| {
                // bf16 products start from the bias themselves
                if rounded.is_none() {
                    for px in o.chunks_exact_mut(f) {
                        px.copy_from_slice(&self.bias);
                    }
                }
                let (q0, n) = (chunk * TAP_ROWS, o.len() / f);
                // the block's outputs row by row: a run of one output row reads each tap's
                // input contiguously, and never past the input's row
                let mut q = q0;
                while q < q0 + n {
                    let (y, x0) = (q / ow, q % ow);
                    let m = (ow - x0).min(q0 + n - q);
                    let run = &mut o[(q - q0) * f..(q - q0 + m) * f];
                    let first = y * width + x0;
                    match (&self.weights, &rounded, &quantised) {
                        (TapWeights::Bf16(w), Some((map16, start)), _) => {
                            let map16 = &map16[*start..];
                            bf16::conv_rows_bf16(map16, width, first, m, w, &self.bias, run)
                        }
                        (TapWeights::F32 { taps, by_part }, _, _) => match (x, input) {
                            (Some(x), _) => {
                                for (t, w) in taps.iter().enumerate() {
                                    let start = first + (t / kw) * width + t % kw;
                                    let a = &x.data[start * c..(start + m) * c];
                                    matmul_f32(a, m, c, w, run, f, true);
                                }
                            }
                            // each part's channels times their rows of the tap's weight
                            (None, TapInput::Parts { parts, .. }) => {
                                for (t, ws) in by_part.iter().enumerate() {
                                    let (i, j) = (t / kw, t % kw);
                                    for ((src, top, left), w) in parts.iter().zip(ws) {
                                        let pc = src.channels;
                                        let start = (y + i + top) * src.width + left + x0 + j;
                                        let a = &src.data[start * pc..(start + m) * pc];
                                        matmul_f32(a, m, pc, w, run, f, true);
                                    }
                                }
                            }
                            (None, TapInput::Map(_)) => unreachable!("a map is read as it is"),
                        },
                        (TapWeights::Int8(taps), _, Some(rows)) => {
                            for (t, w) in taps.iter().enumerate() {
                                let start = first + (t / kw) * width + t % kw;
                                linear_i8::products_acc_i8(rows, start, m, w, run, scratch);
                            }
                        }
                        _ => {
                            unreachable!("bf16 and int8 taps have their input rounded or quantised")
                        }
                    }
                    q += m;
                }
                activation.apply(o);
            });
        if let Some((map16, _)) = rounded {
            pools.bf16.give(map16);
        }
        if let Some(rows) = quantised {
            pools.give_quantised(rows);
        }
        out
    }

    /// [`Taps::forward`] in f32 by Winograd's blocks of outputs, a row of blocks per task.
    fn forward_winograd(
        &self,
        w: &Winograd,
        input: &TapInput,
        activation: Activation,
        [oh, ow, f]: [usize; 3],
        pool: &Pool<f32>,
    ) -> FeatureMap {
        fn part(m: &FeatureMap, top: usize, left: usize) -> InputPart<'_> {
            InputPart {
                data: &m.data,
                width: m.width,
                channels: m.channels,
                top,
                left,
            }
        }
        let parts: Vec<InputPart> = match input {
            TapInput::Map(x) => vec![part(x, 0, 0)],
            TapInput::Parts { parts, .. } => parts
                .iter()
                .map(|&(m, top, left)| part(m, top, left))
                .collect(),
        };
        let size = [input.height(), input.width()];
        let border = w.tiling().taps() - 1;
        debug_assert_eq!([oh + border, ow + border], size, "a valid convolution");
        let mut out = pool.dirty_map(oh, ow, f);
        out.data
            .par_chunks_mut(w.tiling().block() * ow * f)
            .enumerate()
            .for_each(|(row, o)| {
                winograd::conv_rows(w, &parts, size, row, &self.bias, o);
                activation.apply(o);
            });
        out
    }
}

/// A detector ready to run: its graph and packed weights.
pub struct Net {
    graph: Graph,
    kernels: Vec<Kernel>,
    /// Per convolution, the transposed convolution folded into it ([`Fold`]).
    folds: Vec<Option<Fold>>,
    precision: Precision,
    pools: Pools,
    plan: Plan,
}

/// A transposed convolution of kernel and stride 2 without activation (the U-Net's step up)
/// folded into the one convolution that reads it, through their concatenation. Both are
/// linear, so the convolution's taps over the upsampled map are, for each of the four
/// output phases (row and column parity), taps over the transposed convolution's input:
/// a `kh x kw` kernel over the upsampled map reads `kh / 2 + 1` rows of it per phase. The
/// four phases are one convolution of four times the filters ([`Fold::phases`]), whose
/// outputs are spread to their pixels (depth to space). The upsampled map (four times its
/// input's pixels) is never made, and its products cost a third to a half of the taps over
/// it (U-Net: 4 taps of the input's channels against 9 of the transposed convolution's).
struct Fold {
    /// The transposed convolution's layer, never run.
    transposed: usize,
    /// Its input's layer, read by the phases.
    source: usize,
    /// `kh / 2 + 1` by `kw / 2 + 1` taps over `source`: output `z[i, j, (p * 2 + q) * filters
    /// + o]` is what output pixel `(2i + p, 2j + q)` takes from the upsampled map.
    phases: Taps,
}

/// Which layers run, which maps each layer's end frees, and which bf16 or int8 convolutions
/// read a concatenation's parts (and their crops) in place.
struct Plan {
    /// A concatenation or crop whose only reader is a bf16 or int8 convolution that reads
    /// its sources itself: not run.
    skipped: Vec<bool>,
    /// Per bf16 or int8 convolution reading a concatenation: its parts, as it rounds or
    /// quantises them.
    parts: Vec<Option<Vec<Part>>>,
    /// Per layer, the maps no layer after it reads.
    frees: Vec<Vec<usize>>,
}

/// A part of a concatenation read in place: layer `source`'s map from its pixel
/// `(top, left)` on (a crop's edges, or none).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Part {
    source: usize,
    top: usize,
    left: usize,
}

impl Plan {
    /// A bf16 (int8) convolution by taps whose input is a concatenation read by nothing else
    /// rounds (quantises) the concatenation's parts straight into its map (its codes), each
    /// part's crop read in place where the crop too is read by nothing else: the
    /// concatenation and crop are never written, and each part is read once.
    fn new(graph: &Graph, kernels: &[Kernel], folds: &[Option<Fold>]) -> Self {
        Self::with_parts_read(graph, kernels, folds, true)
    }

    /// The plan with concatenations read in place (`read_parts`) or written as they are
    /// (but those of a [`Fold`], whose folded part is never made).
    fn with_parts_read(
        graph: &Graph,
        kernels: &[Kernel],
        folds: &[Option<Fold>],
        read_parts: bool,
    ) -> Self {
        let n = graph.layers.len();
        let readers = graph.readers();
        let mut skipped = vec![false; n];
        let mut parts = vec![None; n];
        let mut last = graph.last_uses();
        for (i, layer) in graph.layers.iter().enumerate() {
            let Kernel::Taps(_) = &kernels[i] else {
                continue;
            };
            let fold = folds.get(i).and_then(Option::as_ref);
            let c = layer.inputs[0];
            let joined = matches!(graph.layers[c].op, Op::Concat) && readers[c] == 1;
            if !(read_parts || fold.is_some()) || !joined {
                continue;
            }
            skipped[c] = true;
            if let Some(f) = fold {
                skipped[f.transposed] = true;
                last[f.source] = last[f.source].max(i);
            }
            let mut of = |p: usize| match graph.layers[p].op {
                Op::Crop {
                    edges: [top, _, left, _],
                } if readers[p] == 1 => {
                    skipped[p] = true;
                    Part {
                        source: graph.layers[p].inputs[0],
                        top,
                        left,
                    }
                }
                _ => Part {
                    source: p,
                    top: 0,
                    left: 0,
                },
            };
            let these: Vec<Part> = graph.layers[c]
                .inputs
                .iter()
                .filter(|&&p| fold.is_none_or(|f| f.transposed != p))
                .map(|&p| of(p))
                .collect();
            for p in &these {
                last[p.source] = last[p.source].max(i);
            }
            parts[i] = Some(these);
        }
        let mut frees = vec![Vec::new(); n];
        for (j, &l) in last.iter().enumerate() {
            if l < n && l != j {
                frees[l].push(j);
            }
        }
        Self {
            skipped,
            parts,
            frees,
        }
    }
}

/// The plan for `kernels`, each f32 convolution that reads a concatenation's parts in place
/// given its weights split by them.
fn plan_for(graph: &Graph, kernels: &mut [Kernel], folds: &[Option<Fold>]) -> Plan {
    let plan = Plan::new(graph, kernels, folds);
    let channels = graph.layer_channels();
    for (parts, kernel) in plan.parts.iter().zip(kernels) {
        if let (Some(parts), Kernel::Taps(t)) = (parts, kernel) {
            let split: Vec<usize> = parts.iter().map(|p| channels[p.source]).collect();
            t.split_by_parts(&split);
        }
    }
    plan
}

/// The transposed convolutions folded into the convolutions that read them ([`Fold`]):
/// each of kernel and stride 2 without activation, read only by a concatenation of it and
/// at least one other map, read only by a convolution by taps of odd kernel sides. That
/// convolution's kernel keeps the other parts' channels and its bias takes the transposed
/// convolution's bias through its taps; the transposed convolution's kernel is dropped.
fn fold_transposed(
    graph: &Graph,
    kernels: &mut [Kernel],
    get: &impl Fn(String, usize) -> Result<Tensor>,
) -> Result<Vec<Option<Fold>>> {
    let readers = graph.readers();
    let channels = graph.layer_channels();
    let mut folds: Vec<Option<Fold>> = (0..graph.layers.len()).map(|_| None).collect();
    for (i, layer) in graph.layers.iter().enumerate() {
        let (
            Op::Conv {
                kernel: [kh, kw],
                filters: f,
                ..
            },
            Kernel::Taps(t),
        ) = (&layer.op, &kernels[i])
        else {
            continue;
        };
        let ([kh, kw], f, c) = ([*kh, *kw], *f, layer.inputs[0]);
        let joined = &graph.layers[c];
        if kh % 2 == 0 || kw % 2 == 0 || joined.op != Op::Concat || readers[c] != 1 {
            continue;
        }
        let upsampling = |p: usize| {
            readers[p] == 1
                && matches!(
                    graph.layers[p].op,
                    Op::ConvTranspose {
                        kernel: [2, 2],
                        stride: [2, 2],
                        activation: Activation::Linear,
                        ..
                    }
                )
        };
        let Some(k) = joined.inputs.iter().position(|&p| upsampling(p)) else {
            continue;
        };
        let tr = joined.inputs[k];
        let (up, source) = (channels[tr], graph.layers[tr].inputs[0]);
        let (cin, all) = (channels[source], t.in_channels);
        let at: usize = joined.inputs[..k].iter().map(|&p| channels[p]).sum();
        if joined.inputs.len() < 2 || at + up > all {
            continue;
        }
        let name = &graph.layers[tr].name;
        let (shape, wt) = get(format!("{name}/kernel"), 4)?;
        let (_, bt) = get(format!("{name}/bias"), 1)?;
        ensure!(
            shape == [2, 2, up, cin] && bt.len() == up,
            Error::Corrupt(format!(
                "layer {name}: kernel {shape:?} is not [2, 2, {up}, {cin}]"
            ))
        );
        // each tap's [in, f] weight (folds are made before the precision is set)
        let wc = t.f32_taps();
        let mut own = Vec::with_capacity(kh * kw * (all - up) * f);
        let mut bias = t.bias.clone();
        for w in &wc {
            own.extend_from_slice(&w[..at * f]);
            own.extend_from_slice(&w[(at + up) * f..]);
            for (r, b) in bt.iter().enumerate() {
                let row = &w[(at + r) * f..(at + r + 1) * f];
                bias.iter_mut().zip(row).for_each(|(o, v)| *o += b * v);
            }
        }
        // output phase (p, q), tap (dy, dx): upsampled pixel (2i + p + dy, 2j + q + dx) is
        // input pixel (i + u, j + v) times the transposed kernel's tap (a, b)
        let ([lh, lw], n) = ([kh / 2 + 1, kw / 2 + 1], 4 * f);
        let mut phased = vec![0f32; lh * lw * cin * n];
        for (p, q, dy, dx) in
            (0..4).flat_map(|pq| (0..kh * kw).map(move |t| (pq / 2, pq % 2, t / kw, t % kw)))
        {
            let (u, v, a, b) = ((p + dy) / 2, (q + dx) / 2, (p + dy) % 2, (q + dx) % 2);
            let w = &wc[dy * kw + dx];
            for ci in 0..cin {
                let at_out = ((u * lw + v) * cin + ci) * n + (p * 2 + q) * f;
                let dst = &mut phased[at_out..at_out + f];
                for r in 0..up {
                    let x = wt[((a * 2 + b) * up + r) * cin + ci];
                    let row = &w[(at + r) * f..(at + r + 1) * f];
                    dst.iter_mut().zip(row).for_each(|(o, v)| *o += x * v);
                }
            }
        }
        kernels[i] = Kernel::Taps(Taps::new(&own, bias, [kh, kw], all - up, f));
        kernels[tr] = Kernel::None;
        folds[i] = Some(Fold {
            transposed: tr,
            source,
            phases: Taps::new(&phased, vec![0.0; n], [lh, lw], cin, n),
        });
    }
    Ok(folds)
}

impl Fold {
    /// Adds the folded part to `out`, the convolution's output over its other parts (before
    /// its activation), and applies `activation` to each row as it is done: the phases over
    /// `source`, each pixel taking its phase's outputs.
    fn add_phases(
        &self,
        source: &FeatureMap,
        out: &mut FeatureMap,
        activation: Activation,
        pools: &Pools,
    ) -> Result<()> {
        let ([lh, lw], f) = (self.phases.kernel, out.channels);
        let (zh, zw) = (
            (source.height + 1).saturating_sub(lh),
            (source.width + 1).saturating_sub(lw),
        );
        ensure!(
            2 * zh >= out.height && 2 * zw >= out.width && self.phases.filters == 4 * f,
            Error::Corrupt(format!(
                "a folded convolution's {}x{} outputs do not fit its input's {}x{}",
                out.height, out.width, source.height, source.width
            ))
        );
        let z = self.phases.forward(
            &TapInput::Map(source),
            Activation::Linear,
            [zh, zw, 4 * f],
            pools,
        );
        let width = out.width;
        out.data
            .par_chunks_mut(width * f)
            .enumerate()
            .for_each(|(y, row)| {
                let phases = &z.data[(y / 2) * zw * 4 * f..(y / 2 + 1) * zw * 4 * f];
                for (x, px) in row.chunks_exact_mut(f).enumerate() {
                    let from = ((x / 2) * 4 + (y % 2) * 2 + x % 2) * f;
                    px.iter_mut()
                        .zip(&phases[from..from + f])
                        .for_each(|(o, v)| *o += v);
                }
                activation.apply(row);
            });
        pools.f32.give(z.data);
        Ok(())
    }
}

/// Output pixels of one convolution whose patches are gathered at once: bounds the patch
/// buffer (about 8 MB of f32) whatever the image size.
const PATCH_FLOATS: usize = 2 << 20;

/// An error unless bf16 products run at the active kernel level; `what` (a precision, a fit)
/// names what needs them.
pub(crate) fn ensure_bf16(what: &str) -> Result<()> {
    ensure!(
        bf16::available(),
        Error::Unsupported(format!(
            "{what} needs bf16 hardware at the kernel level in use ({}); f32 runs here",
            craterdex_kernels::active()
        ))
    );
    Ok(())
}

impl Net {
    /// Packs the weights of `graph`; `weight(name)` gives a layer's tensor by name
    /// (`{layer}/kernel`, `{layer}/bias`).
    pub fn new(graph: Graph, weight: impl Fn(&str) -> Option<Tensor>) -> Result<Self> {
        Self::build(graph, weight, true)
    }

    /// [`Net::new`], with each transposed convolution that can be folded into its reader
    /// folded ([`Fold`]) or run as it is.
    fn build(graph: Graph, weight: impl Fn(&str) -> Option<Tensor>, fold: bool) -> Result<Self> {
        let get = |name: String, rank: usize| -> Result<Tensor> {
            let (shape, data) = weight(&name)
                .ok_or_else(|| Error::Corrupt(format!("the detector has no weight {name}")))?;
            ensure!(
                shape.len() == rank && shape.iter().product::<usize>() == data.len(),
                Error::Corrupt(format!("weight {name}: shape {shape:?} does not fit"))
            );
            Ok((shape, data))
        };
        let mut kernels = Vec::with_capacity(graph.layers.len());
        for layer in &graph.layers {
            let kernel = match &layer.op {
                Op::Conv {
                    filters,
                    kernel,
                    stride,
                    padding,
                    ..
                } => {
                    let (shape, w) = get(format!("{}/kernel", layer.name), 4)?;
                    let (_, bias) = get(format!("{}/bias", layer.name), 1)?;
                    ensure!(
                        shape[..2] == kernel[..] && shape[3] == *filters && bias.len() == *filters,
                        Error::Corrupt(format!(
                            "layer {}: kernel {shape:?} is not {kernel:?} x {filters}",
                            layer.name
                        ))
                    );
                    let k = shape[0] * shape[1] * shape[2];
                    let by_taps = *stride == [1, 1]
                        && *padding == Padding::Valid
                        && *kernel != [1, 1]
                        && shape[2] >= TAPS_FROM_CHANNELS;
                    if by_taps {
                        Kernel::Taps(Taps::new(&w, bias, *kernel, shape[2], *filters))
                    } else {
                        Kernel::Conv {
                            linear: Linear::new(w, bias, k, *filters),
                            in_channels: shape[2],
                        }
                    }
                }
                Op::ConvTranspose {
                    filters,
                    kernel,
                    stride,
                    ..
                } => {
                    let (shape, w) = get(format!("{}/kernel", layer.name), 4)?;
                    let (_, bias) = get(format!("{}/bias", layer.name), 1)?;
                    ensure!(
                        shape[..2] == kernel[..] && shape[2] == *filters && bias.len() == *filters,
                        Error::Corrupt(format!(
                            "layer {}: kernel {shape:?} is not {kernel:?} x {filters}",
                            layer.name
                        ))
                    );
                    let (taps, cin) = (shape[0] * shape[1] * shape[2], shape[3]);
                    // [taps, in] as Keras stores it, to [in, taps]
                    let mut wt = vec![0f32; taps * cin];
                    for t in 0..taps {
                        for c in 0..cin {
                            wt[c * taps + t] = w[t * cin + c];
                        }
                    }
                    let by_row = kernel == stride;
                    let linears = if by_row {
                        // kernel row i's taps are columns i * kw * out.. of [in, taps]
                        let row = taps / kernel[0];
                        (0..kernel[0])
                            .map(|i| {
                                let w: Vec<f32> = wt
                                    .chunks_exact(taps)
                                    .flat_map(|c| c[i * row..(i + 1) * row].iter().copied())
                                    .collect();
                                Linear::new(w, bias.repeat(kernel[1]), cin, row)
                            })
                            .collect()
                    } else {
                        vec![Linear::new(wt, vec![0.0; taps], cin, taps)]
                    };
                    Kernel::ConvTranspose {
                        linears,
                        by_row,
                        in_channels: cin,
                        bias,
                    }
                }
                _ => Kernel::None,
            };
            kernels.push(kernel);
        }
        let folds = if fold {
            fold_transposed(&graph, &mut kernels, &get)?
        } else {
            Vec::new()
        };
        let plan = plan_for(&graph, &mut kernels, &folds);
        Ok(Self {
            graph,
            kernels,
            folds,
            precision: Precision::F32,
            pools: Pools::default(),
            plan,
        })
    }

    /// Switches the products to `precision`. bf16 needs bf16 hardware at the active kernel
    /// level; layers of widths bf16 cannot pack stay f32. int8 runs the layers of at least
    /// [`INT8_FROM_CHANNELS`] input channels in int8 (each pixel quantised per group of
    /// channels, each filter per output) and the narrower ones as [`layer_precision`] says:
    /// the first layers' few channels would be mostly padding, and quantise poorly.
    pub fn with_precision(mut self, precision: Precision) -> Result<Self> {
        ensure!(
            self.precision == Precision::F32,
            Error::Invalid("a detector's precision is set once, after loading".into())
        );
        match precision {
            Precision::F32 => return Ok(self),
            Precision::Int8 => {}
            Precision::Bf16 => ensure_bf16("bf16 precision")?,
        }
        for k in &mut self.kernels {
            match k {
                Kernel::Conv {
                    linear,
                    in_channels,
                } => linear.set_precision(layer_precision(precision, *in_channels)),
                Kernel::ConvTranspose {
                    linears,
                    in_channels,
                    ..
                } => {
                    for l in linears {
                        l.set_precision(layer_precision(precision, *in_channels));
                    }
                }
                Kernel::Taps(t) => t.set_precision(precision),
                Kernel::None => {}
            }
        }
        for f in self.folds.iter_mut().flatten() {
            f.phases.set_precision(precision);
        }
        self.precision = precision;
        self.plan = plan_for(&self.graph, &mut self.kernels, &self.folds);
        Ok(self)
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// A map for the next input, every value of which the caller sets, in memory an earlier
    /// pass gave back.
    pub fn input_map(&self, height: usize, width: usize) -> FeatureMap {
        self.pools
            .f32
            .dirty_map(height, width, self.graph.channels())
    }

    /// Gives an output's memory back for the next passes.
    pub fn recycle(&self, map: FeatureMap) {
        self.pools.f32.give(map.data);
    }

    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The last layer's output for `input` (a map of the graph's input channels): a
    /// detector's one channel of likelihood, smaller than the input by its border where its
    /// convolutions are valid (or, for a graph cut before its head, the head's input).
    pub fn forward(&self, input: FeatureMap) -> Result<FeatureMap> {
        let shapes = self.graph.layer_shapes(input.height, input.width)?;
        ensure!(
            input.channels == self.graph.channels(),
            Error::Invalid(format!(
                "the detector takes {} channels, the image has {}",
                self.graph.channels(),
                input.channels
            ))
        );
        let mut maps: Vec<Option<FeatureMap>> = vec![None; self.graph.layers.len()];
        let mut input = Some(input);
        for (i, layer) in self.graph.layers.iter().enumerate() {
            if self.plan.skipped[i] {
                continue;
            }
            let arg = |k: usize| -> &FeatureMap {
                maps[layer.inputs[k]]
                    .as_ref()
                    .expect("inputs are kept until their last use")
            };
            let out = match (&layer.op, &self.kernels[i]) {
                (Op::Input { .. }, _) => input.take().expect("one input layer"),
                (
                    Op::Conv {
                        stride,
                        padding,
                        activation,
                        kernel,
                        ..
                    },
                    Kernel::Conv {
                        linear,
                        in_channels,
                    },
                ) => {
                    check_channels(&layer.name, arg(0), *in_channels)?;
                    conv(
                        arg(0),
                        linear,
                        *kernel,
                        *stride,
                        *padding,
                        *activation,
                        shapes[i],
                        &self.pools.f32,
                    )
                }
                (Op::Conv { activation, .. }, Kernel::Taps(t)) => {
                    let input = match &self.plan.parts[i] {
                        Some(parts) => {
                            let [height, width, _] = shapes[layer.inputs[0]];
                            let parts: Vec<(&FeatureMap, usize, usize)> = parts
                                .iter()
                                .map(|p| {
                                    let map = maps[p.source]
                                        .as_ref()
                                        .expect("a part's source is kept until its reader");
                                    (map, p.top, p.left)
                                })
                                .collect();
                            // a fold's part is not among them
                            let channels = parts.iter().map(|(m, _, _)| m.channels).sum();
                            TapInput::Parts {
                                parts,
                                height,
                                width,
                                channels,
                            }
                        }
                        None => TapInput::Map(arg(0)),
                    };
                    ensure!(
                        input.channels() == t.in_channels,
                        Error::Corrupt(format!(
                            "layer {}: its kernel takes {} channels, its input has {}",
                            layer.name,
                            t.in_channels,
                            input.channels()
                        ))
                    );
                    match self.folds.get(i).and_then(Option::as_ref) {
                        None => t.forward(&input, *activation, shapes[i], &self.pools),
                        Some(f) => {
                            let source = maps[f.source]
                                .as_ref()
                                .expect("a fold's source is kept until its reader");
                            let mut out =
                                t.forward(&input, Activation::Linear, shapes[i], &self.pools);
                            f.add_phases(source, &mut out, *activation, &self.pools)?;
                            out
                        }
                    }
                }
                (
                    Op::ConvTranspose {
                        kernel,
                        stride,
                        activation,
                        ..
                    },
                    Kernel::ConvTranspose {
                        linears,
                        by_row,
                        in_channels,
                        bias,
                    },
                ) => {
                    check_channels(&layer.name, arg(0), *in_channels)?;
                    conv_transpose(
                        arg(0),
                        (linears, *by_row),
                        bias,
                        *kernel,
                        *stride,
                        *activation,
                        shapes[i],
                        &self.pools.f32,
                    )
                }
                (Op::MaxPool { size, stride }, _) => {
                    max_pool(arg(0), *size, *stride, shapes[i], &self.pools.f32)
                }
                (Op::Crop { edges }, _) => crop(arg(0), *edges, &self.pools.f32),
                (Op::Concat, _) => {
                    let parts: Vec<&FeatureMap> = (0..layer.inputs.len()).map(arg).collect();
                    concat(&parts, &self.pools.f32)
                }
                _ => unreachable!("kernels are made from the same layers"),
            };
            maps[i] = Some(out);
            for &j in &self.plan.frees[i] {
                if let Some(done) = maps[j].take() {
                    self.pools.f32.give(done.data);
                }
            }
        }
        Ok(maps
            .pop()
            .flatten()
            .expect("the last layer's output is kept"))
    }
}

/// The precision a layer of `in_channels` inputs runs in when the detector's is `p`: int8
/// from [`INT8_FROM_CHANNELS`] on; below that bf16 where this CPU's kernel level has it,
/// else f32.
fn layer_precision(p: Precision, in_channels: usize) -> Precision {
    match p {
        Precision::Int8 if in_channels >= INT8_FROM_CHANNELS => Precision::Int8,
        Precision::Int8 if craterdex_kernels::bf16::available() => Precision::Bf16,
        Precision::Int8 => Precision::F32,
        p => p,
    }
}

fn check_channels(layer: &str, map: &FeatureMap, expected: usize) -> Result<()> {
    ensure!(
        map.channels == expected,
        Error::Corrupt(format!(
            "layer {layer}: its kernel takes {expected} channels, its input has {}",
            map.channels
        ))
    );
    Ok(())
}

/// Zeros a convolution reads before the input's first row (column): none for `Valid`; for
/// `Same`, TensorFlow's way (the odd one goes after).
pub(crate) fn pad_before(size: usize, kernel: usize, stride: usize, padding: Padding) -> usize {
    match padding {
        Padding::Valid => 0,
        Padding::Same => {
            let out = size.div_ceil(stride);
            ((out - 1) * stride + kernel).saturating_sub(size) / 2
        }
    }
}

/// Buffers of finished layers, handed to the next ones: a fresh allocation of a large map is
/// fresh pages from the kernel, and faulting them in cost a third of a pass.
struct Pool<T>(Mutex<Vec<Vec<T>>>);

impl<T> Default for Pool<T> {
    fn default() -> Self {
        Self(Mutex::new(Vec::new()))
    }
}

/// The pools of one detector: its maps, and its layers' inputs rounded to bf16 or
/// quantised to int8.
#[derive(Default)]
struct Pools {
    f32: Pool<f32>,
    bf16: Pool<u16>,
    int8: Mutex<Vec<linear_i8::I8Rows>>,
}

impl Pools {
    /// A layer's input quantised for `w`'s products, in pooled memory: a map as it lies, a
    /// concatenation's parts gathered a few pixels at a time.
    fn quantised(&self, input: &TapInput, w: &PackedI8Linear) -> linear_i8::I8Rows {
        let mut pool = self.int8.lock().unwrap_or_else(|e| e.into_inner());
        let mut rows = pool.pop().unwrap_or_default();
        drop(pool);
        let m = input.height() * input.width();
        match input {
            TapInput::Map(x) => linear_i8::requantise(&x.data, m, w, &mut rows),
            TapInput::Parts { .. } => {
                linear_i8::requantise_gathered(m, w, &mut rows, |first, values| {
                    input.gather(first, values)
                })
            }
        }
        rows
    }

    fn give_quantised(&self, rows: linear_i8::I8Rows) {
        let mut pool = self.int8.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < POOLED {
            pool.push(rows);
        }
    }
}

/// Buffers the pool keeps at most.
const POOLED: usize = 24;

impl<T: Copy + Default + Send> Pool<T> {
    /// `n` values of no meaning, for a caller that writes every one: the smallest pooled
    /// buffer that holds them, or a new one (growing a smaller one would copy what it holds).
    fn dirty(&self, n: usize) -> Vec<T> {
        let mut pool = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let fits = (0..pool.len())
            .filter(|&i| pool[i].capacity() >= n)
            .min_by_key(|&i| pool[i].capacity());
        let Some(i) = fits else {
            return vec![T::default(); n];
        };
        let mut v = pool.swap_remove(i);
        drop(pool);
        if v.len() >= n {
            v.truncate(n);
        } else {
            v.resize(n, T::default());
        }
        v
    }

    /// `n` zeros, written in parallel.
    fn zeros(&self, n: usize) -> Vec<T> {
        let mut v = self.dirty(n);
        v.par_chunks_mut(1 << 15).for_each(|c| c.fill(T::default()));
        v
    }

    /// Keeps `v` for a later caller. A full pool keeps its largest buffers: a large map
    /// given up is the one whose pages cost most to fault in again.
    fn give(&self, v: Vec<T>) {
        if v.capacity() == 0 {
            return;
        }
        let mut pool = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < POOLED {
            pool.push(v);
            return;
        }
        let smallest = (0..pool.len()).min_by_key(|&i| pool[i].capacity());
        if let Some(i) = smallest.filter(|&i| pool[i].capacity() < v.capacity()) {
            pool[i] = v;
        }
    }
}

impl Pool<f32> {
    /// A map whose every value the caller writes.
    fn dirty_map(&self, height: usize, width: usize, channels: usize) -> FeatureMap {
        FeatureMap {
            height,
            width,
            channels,
            data: self.dirty(height * width * channels),
        }
    }

    fn map(&self, height: usize, width: usize, channels: usize) -> FeatureMap {
        FeatureMap {
            height,
            width,
            channels,
            data: self.zeros(height * width * channels),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn conv(
    x: &FeatureMap,
    linear: &Linear,
    [kh, kw]: [usize; 2],
    [sh, sw]: [usize; 2],
    padding: Padding,
    activation: Activation,
    [oh, ow, filters]: [usize; 3],
    pool: &Pool<f32>,
) -> FeatureMap {
    let mut out = pool.dirty_map(oh, ow, filters);
    let (c, k) = (x.channels, kh * kw * x.channels);
    if (kh, kw, sh, sw) == (1, 1, 1, 1) {
        linear.forward(&x.data, oh * ow, &mut out.data);
        activation.apply(&mut out.data);
        return out;
    }
    let (pt, pl) = (
        pad_before(x.height, kh, sh, padding),
        pad_before(x.width, kw, sw, padding),
    );
    let rows_per_chunk = (PATCH_FLOATS / (ow * k)).max(1);
    let mut patches = pool.dirty(rows_per_chunk * ow * k);
    for (chunk, out_rows) in out
        .data
        .chunks_mut(rows_per_chunk * ow * filters)
        .enumerate()
    {
        let rows = out_rows.len() / (ow * filters);
        let oy0 = chunk * rows_per_chunk;
        let patches = &mut patches[..rows * ow * k];
        patches
            .par_chunks_mut(ow * k)
            .enumerate()
            .for_each(|(r, row)| {
                let oy = oy0 + r;
                for ox in 0..ow {
                    let patch = &mut row[ox * k..(ox + 1) * k];
                    for i in 0..kh {
                        let iy = (oy * sh + i) as isize - pt as isize;
                        let dst = &mut patch[i * kw * c..(i + 1) * kw * c];
                        if iy < 0 || iy >= x.height as isize {
                            dst.fill(0.0);
                            continue;
                        }
                        let ix0 = (ox * sw) as isize - pl as isize;
                        if ix0 >= 0 && ix0 as usize + kw <= x.width {
                            let at = (iy as usize * x.width + ix0 as usize) * c;
                            dst.copy_from_slice(&x.data[at..at + kw * c]);
                            continue;
                        }
                        for j in 0..kw {
                            let ix = ix0 + j as isize;
                            let d = &mut dst[j * c..(j + 1) * c];
                            if ix < 0 || ix >= x.width as isize {
                                d.fill(0.0);
                            } else {
                                let at = (iy as usize * x.width + ix as usize) * c;
                                d.copy_from_slice(&x.data[at..at + c]);
                            }
                        }
                    }
                }
            });
        linear.forward(patches, rows * ow, out_rows);
        activation.apply(out_rows);
    }
    pool.give(patches);
    out
}

#[allow(clippy::too_many_arguments)]
fn conv_transpose(
    x: &FeatureMap,
    (linears, by_row): (&[Linear], bool),
    bias: &[f32],
    [kh, kw]: [usize; 2],
    [sh, sw]: [usize; 2],
    activation: Activation,
    [oh, ow, filters]: [usize; 3],
    pool: &Pool<f32>,
) -> FeatureMap {
    if by_row {
        // the U-Net's case: each kernel row's products of an input row, bias with them, are
        // that kernel row's output row, written in place
        let mut out = pool.dirty_map(oh, ow, filters);
        let row = ow * filters;
        out.data
            .par_chunks_mut(sh * row)
            .enumerate()
            .for_each(|(y, rows)| {
                let input = &x.data[y * x.width * x.channels..(y + 1) * x.width * x.channels];
                for (linear, dst) in linears.iter().zip(rows.chunks_exact_mut(row)) {
                    linear.forward(input, x.width, dst);
                }
                activation.apply(rows);
            });
        return out;
    }
    let taps = kh * kw * filters;
    let mut products = pool.dirty(x.height * x.width * taps);
    linears[0].forward(&x.data, x.height * x.width, &mut products);
    let mut out = pool.map(oh, ow, filters);
    let scatter_row = |y: usize, rows: &mut [f32], first_row: usize| {
        for xx in 0..x.width {
            let p = &products[(y * x.width + xx) * taps..(y * x.width + xx + 1) * taps];
            for i in 0..kh {
                for j in 0..kw {
                    let at = ((y * sh + i - first_row) * ow + xx * sw + j) * filters;
                    let src = &p[(i * kw + j) * filters..(i * kw + j + 1) * filters];
                    rows[at..at + filters]
                        .iter_mut()
                        .zip(src)
                        .for_each(|(o, v)| *o += v);
                }
            }
        }
    };
    if kh == sh {
        // each input row writes its own output rows
        out.data
            .par_chunks_mut(sh * ow * filters)
            .enumerate()
            .for_each(|(y, rows)| scatter_row(y, rows, y * sh));
    } else {
        for y in 0..x.height {
            scatter_row(y, &mut out.data, 0);
        }
    }
    pool.give(products);
    out.data.par_chunks_mut(ow * filters).for_each(|row| {
        for px in row.chunks_exact_mut(filters) {
            px.iter_mut().zip(bias).for_each(|(o, b)| *o += b);
        }
        activation.apply(row);
    });
    out
}

fn max_pool(
    x: &FeatureMap,
    [ph, pw]: [usize; 2],
    [sh, sw]: [usize; 2],
    [oh, ow, c]: [usize; 3],
    pool: &Pool<f32>,
) -> FeatureMap {
    let mut out = pool.dirty_map(oh, ow, c);
    out.data
        .par_chunks_mut(ow * c)
        .enumerate()
        .for_each(|(oy, row)| {
            row.fill(f32::NEG_INFINITY);
            for ox in 0..ow {
                let o = &mut row[ox * c..(ox + 1) * c];
                for i in 0..ph {
                    for j in 0..pw {
                        let at = ((oy * sh + i) * x.width + ox * sw + j) * c;
                        o.iter_mut()
                            .zip(&x.data[at..at + c])
                            .for_each(|(o, v)| *o = o.max(*v));
                    }
                }
            }
        });
    out
}

fn crop(x: &FeatureMap, [t, b, l, r]: [usize; 4], pool: &Pool<f32>) -> FeatureMap {
    let (h, w, c) = (x.height - t - b, x.width - l - r, x.channels);
    let mut out = pool.dirty_map(h, w, c);
    out.data
        .par_chunks_mut(w * c)
        .enumerate()
        .for_each(|(y, row)| {
            let at = ((y + t) * x.width + l) * c;
            row.copy_from_slice(&x.data[at..at + w * c]);
        });
    out
}

fn concat(parts: &[&FeatureMap], pool: &Pool<f32>) -> FeatureMap {
    let (h, w) = (parts[0].height, parts[0].width);
    let c: usize = parts.iter().map(|p| p.channels).sum();
    let mut out = pool.dirty_map(h, w, c);
    out.data
        .par_chunks_mut(w * c)
        .enumerate()
        .for_each(|(y, row)| {
            for (x, px) in row.chunks_exact_mut(c).enumerate() {
                let mut at = 0;
                for p in parts {
                    let n = p.channels;
                    let src = (y * w + x) * n;
                    px[at..at + n].copy_from_slice(&p.data[src..src + n]);
                    at += n;
                }
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Layer;

    /// A direct (seven nested loops) convolution to check the products against.
    fn conv_direct(
        x: &FeatureMap,
        w: &[f32],
        b: &[f32],
        k: usize,
        f: usize,
        same: bool,
    ) -> FeatureMap {
        let pad = if same { (k - 1) / 2 } else { 0 };
        let (oh, ow) = if same {
            (x.height, x.width)
        } else {
            (x.height - k + 1, x.width - k + 1)
        };
        let mut out = FeatureMap::zeros(oh, ow, f);
        for oy in 0..oh {
            for ox in 0..ow {
                for o in 0..f {
                    let mut s = b[o];
                    for i in 0..k {
                        for j in 0..k {
                            let (iy, ix) = (
                                oy as isize + i as isize - pad as isize,
                                ox as isize + j as isize - pad as isize,
                            );
                            if iy < 0 || ix < 0 || iy >= x.height as isize || ix >= x.width as isize
                            {
                                continue;
                            }
                            for c in 0..x.channels {
                                s += x.data[(iy as usize * x.width + ix as usize) * x.channels + c]
                                    * w[((i * k + j) * x.channels + c) * f + o];
                            }
                        }
                    }
                    out.data[(oy * ow + ox) * f + o] = s;
                }
            }
        }
        out
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 1000) as f32
                    / 500.0
                    - 1.0
            })
            .collect()
    }

    fn one_conv_net(k: usize, cin: usize, f: usize, padding: Padding, w: &[f32], b: &[f32]) -> Net {
        let graph = Graph {
            layers: vec![
                Layer {
                    name: "in".into(),
                    op: Op::Input { channels: cin },
                    inputs: vec![],
                },
                Layer {
                    name: "c".into(),
                    op: Op::Conv {
                        filters: f,
                        kernel: [k, k],
                        stride: [1, 1],
                        padding,
                        activation: Activation::Linear,
                    },
                    inputs: vec![0],
                },
                Layer {
                    name: "out".into(),
                    op: Op::Conv {
                        filters: 1,
                        kernel: [1, 1],
                        stride: [1, 1],
                        padding: Padding::Valid,
                        activation: Activation::Linear,
                    },
                    inputs: vec![1],
                },
            ],
        };
        let (w, b) = (w.to_vec(), b.to_vec());
        Net::new(graph, |name| match name {
            "c/kernel" => Some((vec![k, k, cin, f], w.clone())),
            "c/bias" => Some((vec![f], b.clone())),
            "out/kernel" => Some((
                vec![1, 1, f, 1],
                (0..f).map(|o| if o == 0 { 1.0 } else { 0.0 }).collect(),
            )),
            "out/bias" => Some((vec![1], vec![0.0])),
            _ => None,
        })
        .unwrap()
    }

    /// A U-Net's step up: a crop of an early map and a transposed convolution's output
    /// joined, then convolved by taps in bf16.
    /// A small U-Net's join: a convolution (16 outputs) of a crop of one map of `width`
    /// channels and a transposed convolution of another, concatenated.
    fn joined_net(width: usize) -> Net {
        joined_net_folded(width, false)
    }

    /// [`joined_net`] with its transposed convolution folded into `c4` or run as it is.
    fn joined_net_folded(width: usize, fold: bool) -> Net {
        use crate::testing::{layer, relu_conv3 as conv};
        let graph = Graph {
            layers: vec![
                layer("in", Op::Input { channels: 1 }, &[]),
                layer("c1", conv(width), &[0]),
                layer("c2", conv(width), &[1]),
                layer(
                    "p",
                    Op::MaxPool {
                        size: [2, 2],
                        stride: [2, 2],
                    },
                    &[2],
                ),
                layer("c3", conv(width), &[3]),
                layer(
                    "up",
                    Op::ConvTranspose {
                        filters: width,
                        kernel: [2, 2],
                        stride: [2, 2],
                        activation: Activation::Linear,
                    },
                    &[4],
                ),
                layer(
                    "crop",
                    Op::Crop {
                        edges: [2, 2, 2, 2],
                    },
                    &[2],
                ),
                layer("cat", Op::Concat, &[6, 5]),
                layer("c4", conv(16), &[7]),
            ],
        };
        let w = width;
        let shapes = [
            ("c1", vec![3, 3, 1, w]),
            ("c2", vec![3, 3, w, w]),
            ("c3", vec![3, 3, w, w]),
            ("up", vec![2, 2, w, w]),
            ("c4", vec![3, 3, 2 * w, 16]),
        ];
        Net::build(
            graph,
            |name| {
                let (layer, part) = name.split_once('/')?;
                let (k, (_, shape)) = shapes.iter().enumerate().find(|(_, (l, _))| *l == layer)?;
                let shape = if part == "bias" {
                    vec![shape[if layer == "up" { 2 } else { 3 }]]
                } else {
                    shape.clone()
                };
                let n = shape.iter().product();
                Some((shape, values(n, 10 + k as u32 + u32::from(part == "bias"))))
            },
            fold,
        )
        .unwrap()
    }

    /// `cases` (precision, channels) and a bf16 case of 16 channels where this kernel level
    /// has bf16 products; else the bf16 case skipped as `test`.
    fn with_bf16(mut cases: Vec<(Precision, usize)>, test: &str) -> Vec<(Precision, usize)> {
        if craterdex_kernels::bf16::available() {
            cases.push((Precision::Bf16, 16));
        } else {
            craterdex_testkit::skip(test, "no bf16 at this kernel level");
        }
        cases
    }

    /// A convolution that reads the parts of its concatenation (and the crop) in place gives
    /// what it gives reading the concatenation written out: bit for bit in bf16 and int8
    /// (with the parts' channels in whole groups of 64 and with a group across both, 96), to
    /// the rounding of sums taken part by part in f32.
    #[test]
    fn a_concatenation_read_in_place_is_the_concatenation_written_out() {
        let cases = with_bf16(
            vec![
                (Precision::F32, 16),
                (Precision::F32, 48),
                (Precision::Int8, 48),
                (Precision::Int8, 64),
            ],
            "detect::net::a_concatenation_read_in_place (bf16)",
        );
        for (precision, width) in cases {
            let net = joined_net(width).with_precision(precision).unwrap();
            assert_eq!(
                net.plan.parts[8],
                Some(vec![
                    Part {
                        source: 2,
                        top: 2,
                        left: 2
                    },
                    Part {
                        source: 5,
                        top: 0,
                        left: 0
                    }
                ]),
                "{precision} {width}"
            );
            assert!(net.plan.skipped[6] && net.plan.skipped[7]);
            let x = FeatureMap {
                height: 20,
                width: 24,
                channels: 1,
                data: values(20 * 24, 4),
            };
            let read = net.forward(x.clone()).unwrap();
            let mut written = joined_net(width).with_precision(precision).unwrap();
            written.plan =
                Plan::with_parts_read(&written.graph, &written.kernels, &written.folds, false);
            assert!(written.plan.parts.iter().all(Option::is_none));
            let want = written.forward(x).unwrap();
            assert_eq!((read.height, read.width, read.channels), (10, 14, 16));
            if precision == Precision::F32 {
                let worst = read
                    .data
                    .iter()
                    .zip(&want.data)
                    .fold(0f32, |d, (a, b)| d.max((a - b).abs() / (1.0 + b.abs())));
                assert!(worst < 1e-4, "{width}: {worst}");
                assert_ne!(read.data.iter().sum::<f32>(), 0.0);
            } else {
                assert_eq!(read, want, "{precision} {width}");
            }
        }
    }

    /// A transposed convolution folded into the convolution that reads it gives what the
    /// two give run one after the other: to the rounding of f32 sums taken in another
    /// order, and in int8 and bf16 within what their rounding of other inputs allows; the
    /// upsampled map is never made.
    #[test]
    fn a_folded_transposed_convolution_gives_what_it_gives_run() {
        let cases = with_bf16(
            vec![
                (Precision::F32, 16),
                (Precision::F32, 48),
                (Precision::Int8, 64),
            ],
            "detect::net::a_folded_transposed_convolution (bf16)",
        );
        for (precision, width) in cases {
            let folded = joined_net_folded(width, true)
                .with_precision(precision)
                .unwrap();
            let fold = folded.folds[8].as_ref().expect("c4 takes the fold");
            assert_eq!((fold.transposed, fold.source), (5, 4));
            assert_eq!(fold.phases.kernel, [2, 2]);
            assert!(folded.plan.skipped[5] && folded.plan.skipped[6] && folded.plan.skipped[7]);
            assert_eq!(
                folded.plan.parts[8],
                Some(vec![Part {
                    source: 2,
                    top: 2,
                    left: 2
                }])
            );
            let run = joined_net_folded(width, false)
                .with_precision(precision)
                .unwrap();
            assert!(run.folds.iter().all(Option::is_none));
            for (h, w) in [(20, 24), (28, 20)] {
                let x = FeatureMap {
                    height: h,
                    width: w,
                    channels: 1,
                    data: values(h * w, 4),
                };
                let got = folded.forward(x.clone()).unwrap();
                let want = run.forward(x).unwrap();
                assert_eq!(
                    (got.height, got.width, got.channels),
                    (want.height, want.width, 16)
                );
                let scale = want.data.iter().fold(0f32, |m, v| m.max(v.abs()));
                let worst = got
                    .data
                    .iter()
                    .zip(&want.data)
                    .fold(0f32, |d, (a, b)| d.max((a - b).abs()));
                let allowed = if precision == Precision::F32 {
                    1e-5
                } else {
                    0.03
                };
                assert!(
                    scale > 0.1 && worst <= allowed * scale,
                    "{precision} {width} {h}x{w}: {worst} of {scale}"
                );
            }
        }
    }

    #[test]
    fn convolutions_as_products_match_direct_convolutions() {
        let (k, cin, f) = (3, 5, 7);
        let x = FeatureMap {
            height: 11,
            width: 9,
            channels: cin,
            data: values(11 * 9 * cin, 1),
        };
        let (w, b) = (values(k * k * cin * f, 2), values(f, 3));
        for padding in [Padding::Valid, Padding::Same] {
            let net = one_conv_net(k, cin, f, padding, &w, &b);
            let got = net.forward(x.clone()).unwrap();
            let want = conv_direct(&x, &w, &b, k, f, padding == Padding::Same);
            assert_eq!((got.height, got.width), (want.height, want.width));
            for (px, g) in got.data.iter().enumerate() {
                let e = want.data[px * f];
                assert!((g - e).abs() < 1e-4, "{padding:?} pixel {px}: {g} vs {e}");
            }
        }
    }

    /// A transposed convolution, each input pixel times every tap added where the tap
    /// lands: with kernel and stride alike (kernel rows written in place) and with taps that
    /// overlap (scattered), against the definition.
    #[test]
    fn a_transposed_convolution_spreads_each_pixel_over_its_taps() {
        let (cin, f) = (2, 3);
        let x = FeatureMap {
            height: 2,
            width: 3,
            channels: cin,
            data: values(2 * 3 * cin, 4),
        };
        for ([kh, kw], [sh, sw]) in [([2, 2], [2, 2]), ([3, 2], [2, 2]), ([3, 3], [2, 1])] {
            let w = values(kh * kw * f * cin, 5); // Keras: [kh, kw, out, in]
            let b = values(f, 6);
            let graph = Graph {
                layers: vec![
                    Layer {
                        name: "in".into(),
                        op: Op::Input { channels: cin },
                        inputs: vec![],
                    },
                    Layer {
                        name: "up".into(),
                        op: Op::ConvTranspose {
                            filters: f,
                            kernel: [kh, kw],
                            stride: [sh, sw],
                            activation: Activation::Linear,
                        },
                        inputs: vec![0],
                    },
                ],
            };
            let net = Net::new(graph, |name| match name {
                "up/kernel" => Some((vec![kh, kw, f, cin], w.clone())),
                "up/bias" => Some((vec![f], b.clone())),
                _ => None,
            })
            .unwrap();
            let out = net.forward(x.clone()).unwrap();
            let (oh, ow) = ((x.height - 1) * sh + kh, (x.width - 1) * sw + kw);
            assert_eq!((out.height, out.width, out.channels), (oh, ow, f));
            let mut want: Vec<f32> = (0..oh * ow).flat_map(|_| b.iter().copied()).collect();
            for iy in 0..x.height {
                for ix in 0..x.width {
                    for i in 0..kh {
                        for j in 0..kw {
                            for o in 0..f {
                                let (y, xx) = (iy * sh + i, ix * sw + j);
                                for c in 0..cin {
                                    want[(y * ow + xx) * f + o] += x.data
                                        [(iy * x.width + ix) * cin + c]
                                        * w[((i * kw + j) * f + o) * cin + c];
                                }
                            }
                        }
                    }
                }
            }
            for (k, (g, e)) in out.data.iter().zip(&want).enumerate() {
                assert!(
                    (g - e).abs() < 1e-5,
                    "{kh}x{kw} /{sh}x{sw} [{k}]: {g} vs {e}"
                );
            }
        }
    }

    #[test]
    fn pooling_cropping_and_concatenation_move_the_right_values() {
        let x = FeatureMap {
            height: 4,
            width: 4,
            channels: 1,
            data: (0..16).map(|v| v as f32).collect(),
        };
        let pool = Pool::<f32>::default();
        let p = max_pool(&x, [2, 2], [2, 2], [2, 2, 1], &pool);
        assert_eq!(p.data, vec![5.0, 7.0, 13.0, 15.0]);
        let c = crop(&x, [1, 2, 0, 1], &pool);
        assert_eq!((c.height, c.width), (1, 3));
        assert_eq!(c.data, vec![4.0, 5.0, 6.0]);
        let cat = concat(&[&p, &p], &pool);
        assert_eq!(cat.channels, 2);
        assert_eq!(cat.data[..4], [5.0, 5.0, 7.0, 7.0]);
    }

    #[test]
    fn a_wrong_weight_shape_is_refused_by_name() {
        let net = Net::new(
            Graph {
                layers: vec![
                    Layer {
                        name: "in".into(),
                        op: Op::Input { channels: 1 },
                        inputs: vec![],
                    },
                    Layer {
                        name: "c".into(),
                        op: Op::Conv {
                            filters: 2,
                            kernel: [3, 3],
                            stride: [1, 1],
                            padding: Padding::Valid,
                            activation: Activation::Relu,
                        },
                        inputs: vec![0],
                    },
                ],
            },
            |name| {
                (name == "c/kernel")
                    .then(|| (vec![3, 3, 1, 4], vec![0.0; 36]))
                    .or(Some((vec![2], vec![0.0; 2])))
            },
        );
        let err = net.err().unwrap().to_string();
        assert!(err.contains("layer c"), "{err}");
    }
}
