//! The ViT forward pass (DINO v1 and DINOv2 share it; DINOv2 adds layer scale), written as
//! in candle's `dinov2.rs`: one plain struct per sublayer with its own `forward`; the matrix
//! products, norms and activations are craterdex-kernels'.
//!
//! Weights are held in the "craterdex" layout: matrices are `[in, out]` row-major so a linear
//! layer is `x W + b`, and q, k, v are fused into one `[D, 3D]` matrix.

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use craterdex_errors::ensure;
use craterdex_kernels::attention;
use craterdex_kernels::bf16::{self, PackedBf16};
use craterdex_kernels::gemm::{self, PackedF32};
use craterdex_kernels::linear_i8::{self, PackedI8Linear};
use craterdex_kernels::nn;
use rayon::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use strum::IntoEnumIterator;

/// The weights of one transformer block.
#[derive(Clone, Debug)]
pub struct BlockWeights {
    pub norm1_w: Vec<f32>,
    pub norm1_b: Vec<f32>,
    pub qkv_w: Vec<f32>,
    pub qkv_b: Vec<f32>,
    pub proj_w: Vec<f32>,
    pub proj_b: Vec<f32>,
    pub ls1: Option<Vec<f32>>,
    pub norm2_w: Vec<f32>,
    pub norm2_b: Vec<f32>,
    pub fc1_w: Vec<f32>,
    pub fc1_b: Vec<f32>,
    pub fc2_w: Vec<f32>,
    pub fc2_b: Vec<f32>,
    pub ls2: Option<Vec<f32>>,
}

/// All weights of a ViT backbone in the craterdex layout.
#[derive(Clone, Debug)]
pub struct VitWeights {
    pub cls_token: Vec<f32>,
    /// `[1 + G*G, D]`: the CLS position followed by a `G x G` grid, row-major.
    pub pos_embed: Vec<f32>,
    /// `[3*p*p, D]`, input order (channel, row, column) as in a conv kernel.
    pub patch_w: Vec<f32>,
    pub patch_b: Vec<f32>,
    pub blocks: Vec<BlockWeights>,
    pub norm_w: Vec<f32>,
    pub norm_b: Vec<f32>,
}

impl VitWeights {
    /// Checks every shape against the config, so a forward pass never indexes out of bounds.
    pub fn validate(&self, c: &ModelConfig) -> Result<()> {
        let d = c.hidden_size;
        let h = c.mlp_hidden;
        let p = c.patch_size;
        let check = |name: &str, v: &[f32], n: usize| -> Result<()> {
            ensure!(
                v.len() == n,
                Error::Invalid(format!(
                    "weight {name} has {} values, expected {n}",
                    v.len()
                ))
            );
            Ok(())
        };
        ensure!(
            c.num_heads > 0 && d.is_multiple_of(c.num_heads),
            Error::Invalid(format!(
                "hidden size {d} is not divisible by {} heads",
                c.num_heads
            ))
        );
        check("cls_token", &self.cls_token, d)?;
        check(
            "pos_embed",
            &self.pos_embed,
            (1 + c.pos_grid * c.pos_grid) * d,
        )?;
        check("patch_embed.weight", &self.patch_w, 3 * p * p * d)?;
        check("patch_embed.bias", &self.patch_b, d)?;
        check("norm.weight", &self.norm_w, d)?;
        check("norm.bias", &self.norm_b, d)?;
        ensure!(
            self.blocks.len() == c.depth,
            Error::Invalid(format!(
                "{} blocks, config says {}",
                self.blocks.len(),
                c.depth
            ))
        );
        for (i, b) in self.blocks.iter().enumerate() {
            let n = |s: &str| format!("blocks.{i}.{s}");
            check(&n("norm1.weight"), &b.norm1_w, d)?;
            check(&n("norm1.bias"), &b.norm1_b, d)?;
            check(&n("attn.qkv.weight"), &b.qkv_w, d * 3 * d)?;
            check(&n("attn.qkv.bias"), &b.qkv_b, 3 * d)?;
            check(&n("attn.proj.weight"), &b.proj_w, d * d)?;
            check(&n("attn.proj.bias"), &b.proj_b, d)?;
            check(&n("norm2.weight"), &b.norm2_w, d)?;
            check(&n("norm2.bias"), &b.norm2_b, d)?;
            check(&n("mlp.fc1.weight"), &b.fc1_w, d * h)?;
            check(&n("mlp.fc1.bias"), &b.fc1_b, h)?;
            check(&n("mlp.fc2.weight"), &b.fc2_w, h * d)?;
            check(&n("mlp.fc2.bias"), &b.fc2_b, d)?;
            for (s, ls) in [("ls1", &b.ls1), ("ls2", &b.ls2)] {
                match ls {
                    Some(v) => check(&n(s), v, d)?,
                    None if c.layer_scale => {
                        return Err(Error::Invalid(format!(
                            "{} missing although the model uses layer scale",
                            n(s)
                        )))
                    }
                    None => {}
                }
            }
        }
        Ok(())
    }
}

/// What the method needs from one image.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageFeatures {
    /// `[D]`: CLS token after the final norm.
    pub cls: Vec<f32>,
    /// `[T, D]`: patch tokens after the final norm, row-major.
    pub patches: Vec<f32>,
    /// `[T]`: last layer's CLS-to-patch attention, averaged over heads.
    pub attention: Vec<f32>,
}

impl ImageFeatures {
    /// One image's features from the features of its views: the mean CLS token, every
    /// view's patch tokens in order, and their attention scaled to keep its total.
    pub fn of_views(views: Vec<ImageFeatures>) -> ImageFeatures {
        let n = views.len().max(1) as f32;
        let mut it = views.into_iter();
        let mut out = it.next().unwrap_or(ImageFeatures {
            cls: Vec::new(),
            patches: Vec::new(),
            attention: Vec::new(),
        });
        for v in it {
            out.cls.iter_mut().zip(&v.cls).for_each(|(a, b)| *a += b);
            out.patches.extend_from_slice(&v.patches);
            out.attention.extend_from_slice(&v.attention);
        }
        if n > 1.0 {
            out.cls.iter_mut().for_each(|a| *a /= n);
            out.attention.iter_mut().for_each(|a| *a /= n);
        }
        out
    }

    /// The features of images whose views' features `forward` returned in order, `views`
    /// per image.
    pub fn group_views(forward: Vec<ImageFeatures>, views: usize) -> Vec<ImageFeatures> {
        if views <= 1 {
            return forward;
        }
        let mut out = Vec::with_capacity(forward.len() / views);
        let mut it = forward.into_iter();
        loop {
            let group: Vec<_> = it.by_ref().take(views).collect();
            if group.is_empty() {
                return out;
            }
            out.push(Self::of_views(group));
        }
    }
}

/// Arithmetic of the forward pass's linear layers (patch embedding, qkv, projection, MLP):
/// `f32`, `bf16` or `int8`.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Default,
    strum::Display,
    strum::EnumIter,
    strum::VariantNames,
    strum::IntoStaticStr,
    serde_with::SerializeDisplay,
    serde_with::DeserializeFromStr,
)]
#[strum(serialize_all = "lowercase")]
pub enum Precision {
    /// f32 throughout.
    #[default]
    F32,
    /// Linear layers take bf16 inputs and weights and accumulate in f32, on AMX tiles or
    /// AVX-512 BF16 dot products; the attention's products too where the CPU has AVX-512
    /// BF16 (the softmax in f32); norms and activations stay f32.
    Bf16,
    /// Linear layers in integers: the input quantised per row and group of 64 (8-bit codes,
    /// each group its own scale and zero point), weights to 8-bit codes per output column,
    /// exact integer products on every kernel level (the same outputs on each); the
    /// attention's products in bf16 with f32 sums where the CPU has AVX-512 BF16 (else f32),
    /// norms and activations f32.
    Int8,
}

impl Precision {
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The precision whose products run fastest on this CPU at the active kernel level: bf16
    /// on AMX tiles, int8 where int8 is multiplied in hardware (AVX-512 VNNI), f32 elsewhere.
    /// Callers make it their default where their own measurements show it keeps their
    /// results (the extraction's, the detector's).
    pub fn fastest_here() -> Precision {
        if craterdex_kernels::amx::available() {
            Precision::Bf16
        } else if craterdex_kernels::level::int8_in_hardware() {
            Precision::Int8
        } else {
            Precision::F32
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = craterdex_errors::Invalid;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        let aliases = [("fp32", Precision::F32), ("i8", Precision::Int8)];
        craterdex_errors::parse_named("precision", s, Self::iter(), &aliases)
    }
}

/// The packed weight a linear layer multiplies with.
enum LinearKernel {
    F32(PackedF32),
    Int8(PackedI8Linear),
    Bf16(PackedBf16),
}

/// `y = x W + b` with `W` `[in, out]`, held packed for its precision only.
pub struct Linear {
    bias: Vec<f32>,
    in_dim: usize,
    out_dim: usize,
    kernel: LinearKernel,
}

impl Linear {
    /// A layer of `weight` (`[in_dim, out_dim]` row-major) and `bias`, packed for f32.
    pub fn new(weight: Vec<f32>, bias: Vec<f32>, in_dim: usize, out_dim: usize) -> Self {
        let kernel = LinearKernel::F32(PackedF32::from_kn(&weight, in_dim, out_dim));
        Self {
            bias,
            in_dim,
            out_dim,
            kernel,
        }
    }

    /// Repacks an f32 layer for `p` (a quantised layer cannot go back to f32). A layer bf16
    /// cannot pack ([`Linear::takes`]) stays f32; callers check the hardware.
    pub fn set_precision(&mut self, p: Precision) {
        let LinearKernel::F32(packed) = &self.kernel else {
            return;
        };
        if !self.takes(p) {
            return;
        }
        let (k, n) = (self.in_dim, self.out_dim);
        let w = packed.unpack();
        self.kernel = match p {
            Precision::F32 => return,
            Precision::Int8 => LinearKernel::Int8(PackedI8Linear::new(&w, k, n)),
            Precision::Bf16 => LinearKernel::Bf16(PackedBf16::new(&w, k, n)),
        };
    }

    /// Whether this layer's shape can run in `p` (bf16 packs whole blocks of 16 outputs).
    pub fn takes(&self, p: Precision) -> bool {
        p != Precision::Bf16 || PackedBf16::fits(self.out_dim)
    }

    pub fn in_dim(&self) -> usize {
        self.in_dim
    }

    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// `residual[rows, out] += x[rows, in] W + b`: for f32 and bf16 in the products' stores
    /// (no buffer for the layer's output, no pass to add it); int8 writes `scratch`
    /// (grown to the rows here, the only place that knows it is needed) and add it, a pass
    /// the profile counts as element-wise work.
    fn forward_residual(
        &self,
        x: &[f32],
        rows: usize,
        residual: &mut [f32],
        scratch: &mut Vec<f32>,
        p: &mut PassProfile,
        clock: &mut Instant,
    ) {
        match &self.kernel {
            LinearKernel::F32(w) => gemm::linear_f32_residual(x, rows, w, &self.bias, residual),
            LinearKernel::Bf16(w) => bf16::linear_bf16(x, rows, w, &self.bias, residual, true),
            LinearKernel::Int8(_) => {
                scratch.resize(scratch.len().max(rows * self.out_dim), 0.0);
                self.forward(x, rows, scratch);
                PassProfile::lap(&mut p.linear, clock);
                nn::add_residual(residual, scratch, self.out_dim);
                PassProfile::lap(&mut p.elementwise, clock);
                return;
            }
        }
        PassProfile::lap(&mut p.linear, clock);
    }

    /// `out[rows, out] = x[rows, in] W + b`, multithreaded over rows.
    pub fn forward(&self, x: &[f32], rows: usize, out: &mut [f32]) {
        match &self.kernel {
            LinearKernel::F32(w) => gemm::linear_f32(x, rows, w, &self.bias, out),
            LinearKernel::Int8(w) => linear_i8::linear_i8(x, rows, w, &self.bias, out),
            LinearKernel::Bf16(w) => bf16::linear_bf16(x, rows, w, &self.bias, out, false),
        }
    }
}

pub struct LayerNorm {
    weight: Vec<f32>,
    bias: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        nn::layer_norm(
            x,
            out,
            self.weight.len(),
            &self.weight,
            &self.bias,
            self.eps,
        );
    }
}

/// A stride-`p` convolution done as one product: image patches (channel, row, column) times
/// `[3 p p, D]`.
pub struct PatchEmbed {
    proj: Linear,
    patch: usize,
}

impl PatchEmbed {
    /// `[B * G * G, D]` patch embeddings of `[3, S, S]` images, `G = S / patch`.
    pub fn forward(&self, images: &[Vec<f32>], s: usize) -> Vec<f32> {
        let (p, g) = (self.patch, s / self.patch);
        let n = g * g;
        let kdim = 3 * p * p;
        let mut cols = vec![0f32; images.len() * n * kdim];
        cols.par_chunks_mut(n * kdim)
            .zip(images.par_iter())
            .for_each(|(dst, im)| {
                for py in 0..g {
                    for px in 0..g {
                        let row = &mut dst[(py * g + px) * kdim..][..kdim];
                        for ch in 0..3 {
                            for ky in 0..p {
                                let src = &im[ch * s * s + (py * p + ky) * s + px * p..][..p];
                                row[ch * p * p + ky * p..][..p].copy_from_slice(src);
                            }
                        }
                    }
                }
            });
        let mut out = vec![0f32; images.len() * n * self.proj.out_dim];
        self.proj.forward(&cols, images.len() * n, &mut out);
        out
    }
}

/// Multi-head self-attention over fused q|k|v.
pub struct Attention {
    qkv: Linear,
    proj: Linear,
    heads: usize,
    /// The arithmetic of `Q K^T` and `P V`: bf16 in bf16 extraction where the CPU has
    /// AVX-512 BF16, else f32.
    products: attention::Products,
}

pub struct Mlp {
    fc1: Linear,
    fc2: Linear,
}

/// A pre-norm transformer block. DINOv2's layer scales are folded into the layers before
/// them (`proj` and `fc2`, [`fold_layer_scale`]).
pub struct Block {
    norm1: LayerNorm,
    attn: Attention,
    norm2: LayerNorm,
    mlp: Mlp,
}

/// `x + s (h W + b) = x + h (W s) + b s`: a layer scale `s` (one factor per output column)
/// folded into the linear layer before it, so that the layer's products go straight into the
/// residual stream.
fn fold_layer_scale(
    mut w: Vec<f32>,
    mut b: Vec<f32>,
    scale: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>) {
    if let Some(s) = scale {
        for row in w.chunks_exact_mut(s.len()) {
            row.iter_mut().zip(s).for_each(|(w, s)| *w *= s);
        }
        b.iter_mut().zip(s).for_each(|(b, s)| *b *= s);
    }
    (w, b)
}

/// Buffers one forward pass reuses from block to block.
struct Scratch {
    normed: Vec<f32>,
    qkv: Vec<f32>,
    mixed: Vec<f32>,
    hidden: Vec<f32>,
    delta: Vec<f32>,
}

impl Block {
    fn forward(
        &self,
        x: &mut [f32],
        b: usize,
        t: usize,
        s: &mut Scratch,
        cls_attn: Option<&mut [f32]>,
        p: &mut PassProfile,
    ) {
        let d = self.norm1.weight.len();
        let mut clock = Instant::now();
        self.norm1.forward(x, &mut s.normed);
        PassProfile::lap(&mut p.elementwise, &mut clock);
        let a = &self.attn;
        a.qkv.forward(&s.normed, b * t, &mut s.qkv);
        PassProfile::lap(&mut p.linear, &mut clock);
        attention::multi_head_with(a.products, &s.qkv, b, t, d, a.heads, &mut s.mixed, cls_attn);
        PassProfile::lap(&mut p.attention, &mut clock);
        a.proj
            .forward_residual(&s.mixed, b * t, x, &mut s.delta, p, &mut clock);
        self.norm2.forward(x, &mut s.normed);
        PassProfile::lap(&mut p.elementwise, &mut clock);
        let m = &self.mlp;
        m.fc1.forward(&s.normed, b * t, &mut s.hidden);
        PassProfile::lap(&mut p.linear, &mut clock);
        nn::gelu_in_place(&mut s.hidden[..b * t * m.fc1.out_dim]);
        PassProfile::lap(&mut p.elementwise, &mut clock);
        m.fc2
            .forward_residual(&s.hidden, b * t, x, &mut s.delta, p, &mut clock);
    }

    fn linears_mut(&mut self) -> [&mut Linear; 4] {
        [
            &mut self.attn.qkv,
            &mut self.attn.proj,
            &mut self.mlp.fc1,
            &mut self.mlp.fc2,
        ]
    }
}

/// Where one forward pass spent its time, by kind of work: what bounds a precision's speed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PassProfile {
    /// The matrix products of the linear layers (patch embedding, q|k|v, projection, MLP).
    pub linear: Duration,
    /// Attention: `Q K^T`, softmax and `A V` per image and head.
    pub attention: Duration,
    /// Layer norms, GELU, residuals and layer scale, tokens and positions.
    pub elementwise: Duration,
}

impl PassProfile {
    pub fn total(&self) -> Duration {
        self.linear + self.attention + self.elementwise
    }

    /// Adds the time since `*since` to `part` and restarts the clock.
    fn lap(part: &mut Duration, since: &mut Instant) {
        let now = Instant::now();
        *part += now - *since;
        *since = now;
    }
}

/// An input size a backbone runs at, with its position embeddings.
struct Scale {
    input_size: usize,
    grid: usize,
    /// Position embeddings resampled to `grid`, `[1 + grid*grid, D]`.
    pos_embed: Vec<f32>,
}

impl Scale {
    fn new(config: &ModelConfig, pos_embed: &[f32], input_size: usize) -> Result<Self> {
        let grid = input_size / config.patch_size;
        ensure!(
            grid >= 1,
            Error::Invalid(format!(
                "input size {input_size} is smaller than the patch size {}",
                config.patch_size
            ))
        );
        Ok(Self {
            input_size,
            grid,
            pos_embed: resample_pos_embed(pos_embed, config.hidden_size, config.pos_grid, grid),
        })
    }
    fn patches(&self) -> usize {
        self.grid * self.grid
    }
}

/// The largest input size a backbone accepts besides its own (a 1,024 px crop has 5,329
/// patches of 14 px; attention grows with their square).
pub const MAX_EXTRA_SIZE: usize = 1024;

/// A backbone ready to run at its input size, and at the extra sizes it was given
/// ([`Vit::with_extra_sizes`]).
pub struct Vit {
    config: ModelConfig,
    /// The model's input size first, then the extra ones.
    scales: Vec<Scale>,
    /// The checkpoint's position embeddings, resampled for each extra size.
    source_pos_embed: Vec<f32>,
    precision: Precision,
    /// Fraction of patch tokens kept through the second half of the blocks (1: all).
    keep_tokens: f32,
    embed: PatchEmbed,
    cls_token: Vec<f32>,
    blocks: Vec<Block>,
    norm: LayerNorm,
    /// Images run through the backbone since it was built, each input size counted apart
    /// ([`Vit::images_run`]).
    images_run: AtomicU64,
}

impl Vit {
    pub fn new(config: ModelConfig, weights: VitWeights, input_size: usize) -> Result<Self> {
        weights.validate(&config)?;
        let scale = Scale::new(&config, &weights.pos_embed, input_size)?;
        let (d, h, p) = (config.hidden_size, config.mlp_hidden, config.patch_size);
        let eps = config.layer_norm_eps;
        let norm = |w: Vec<f32>, b: Vec<f32>| LayerNorm {
            weight: w,
            bias: b,
            eps,
        };
        let blocks = weights
            .blocks
            .into_iter()
            .map(|bw| {
                let (proj_w, proj_b) = fold_layer_scale(bw.proj_w, bw.proj_b, bw.ls1.as_deref());
                let (fc2_w, fc2_b) = fold_layer_scale(bw.fc2_w, bw.fc2_b, bw.ls2.as_deref());
                Block {
                    norm1: norm(bw.norm1_w, bw.norm1_b),
                    attn: Attention {
                        qkv: Linear::new(bw.qkv_w, bw.qkv_b, d, 3 * d),
                        proj: Linear::new(proj_w, proj_b, d, d),
                        heads: config.num_heads,
                        products: attention::Products::F32,
                    },
                    norm2: norm(bw.norm2_w, bw.norm2_b),
                    mlp: Mlp {
                        fc1: Linear::new(bw.fc1_w, bw.fc1_b, d, h),
                        fc2: Linear::new(fc2_w, fc2_b, h, d),
                    },
                }
            })
            .collect();
        Ok(Self {
            embed: PatchEmbed {
                proj: Linear::new(weights.patch_w, weights.patch_b, 3 * p * p, d),
                patch: p,
            },
            cls_token: weights.cls_token,
            scales: vec![scale],
            source_pos_embed: weights.pos_embed,
            blocks,
            norm: norm(weights.norm_w, weights.norm_b),
            config,
            precision: Precision::F32,
            keep_tokens: 1.0,
            images_run: AtomicU64::new(0),
        })
    }

    /// How many images this backbone has run (an image seen at two input sizes counts
    /// twice): what a search costs in forward passes, counted where they happen.
    pub fn images_run(&self) -> u64 {
        self.images_run.load(Ordering::Relaxed)
    }

    /// Runs only the first `blocks` of the backbone's blocks (`None`: [`retrieval_blocks`] of
    /// its depth); CLS, patch tokens and attention all come from the last block run, through
    /// the final norm. The later blocks of a DINOv2 backbone make its patch tokens more
    /// semantic and less able to tell one crater from a look-alike: the first 8 of ViT-S/14's
    /// 12 retrieve best on both real benchmarks (docs/results.md), at two thirds of the cost.
    pub fn with_blocks(mut self, blocks: Option<usize>) -> Result<Self> {
        let depth = self.config.depth;
        let blocks = blocks.unwrap_or_else(|| retrieval_blocks(depth));
        ensure!(
            (1..=self.blocks.len()).contains(&blocks),
            Error::Invalid(format!(
                "blocks must be between 1 and the model's depth {depth}, not {blocks}"
            ))
        );
        self.blocks.truncate(blocks);
        Ok(self)
    }

    /// Blocks run per pass.
    pub fn blocks_run(&self) -> usize {
        self.blocks.len()
    }

    /// Multi-scale: makes the backbone run at these input sizes too (position embeddings
    /// resampled for each), so that a crop can be seen at several sizes and the tokens of
    /// every size pooled into one set ([`crate::extract::features_of_tensors`]). Sizes must
    /// differ from the model's and from each other, and lie between the patch size and
    /// [`MAX_EXTRA_SIZE`].
    pub fn with_extra_sizes(mut self, sizes: &[usize]) -> Result<Self> {
        let patch = self.config.patch_size;
        for (i, &size) in sizes.iter().enumerate() {
            ensure!(
                (patch..=MAX_EXTRA_SIZE).contains(&size),
                Error::Invalid(format!(
                    "an extra input size must be between the patch size {patch} and \
                     {MAX_EXTRA_SIZE}, not {size}"
                ))
            );
            ensure!(
                !self.input_sizes().contains(&size) && !sizes[..i].contains(&size),
                Error::Invalid(format!(
                    "input size {size} is given twice (the model's own is {})",
                    self.input_size()
                ))
            );
        }
        self.scales.truncate(1);
        for &size in sizes {
            let scale = Scale::new(&self.config, &self.source_pos_embed, size)?;
            self.scales.push(scale);
        }
        Ok(self)
    }

    /// The input sizes a crop is seen at: the model's, then the extra ones.
    pub fn input_sizes(&self) -> Vec<usize> {
        self.scales.iter().map(|s| s.input_size).collect()
    }

    /// Patch tokens of one view of an image: one grid per input size.
    pub fn patches_per_view(&self) -> usize {
        self.scales.iter().map(Scale::patches).sum()
    }

    /// Training-free token reduction: after the middle block, each image keeps the
    /// `fraction` of its patch tokens that the CLS token attends to most (averaged over the
    /// heads), and only those (with CLS) pass through the remaining blocks; the others keep
    /// their middle-block values and get zero attention in the output. 1 keeps every token.
    pub fn with_token_reduction(mut self, fraction: f32) -> Result<Self> {
        ensure!(
            fraction > 0.0 && fraction <= 1.0,
            Error::Invalid(format!(
                "the fraction of tokens kept must be in (0, 1], not {fraction}"
            ))
        );
        self.keep_tokens = fraction;
        Ok(self)
    }

    /// Of `n` patch tokens, those kept through the second half of the blocks.
    fn kept_patches(&self, n: usize) -> usize {
        ((self.keep_tokens as f64 * n as f64).ceil() as usize).clamp(1, n)
    }

    /// Whether every patch token runs every block (no token reduction).
    pub fn keeps_every_token(&self) -> bool {
        self.reduction_block().is_none()
    }

    /// The block after which tokens are dropped (`None`: every token runs every block),
    /// decided at the model's own input size.
    fn reduction_block(&self) -> Option<usize> {
        let depth = self.blocks.len();
        let n = self.num_patches();
        (depth >= 2 && self.kept_patches(n) < n).then(|| depth / 2 - 1)
    }

    /// Switches the linear layers' arithmetic from f32 (as loaded). bf16 needs bf16 hardware
    /// (AVX-512 BF16 or AMX tiles) at the active kernel level; int8
    /// runs on every CPU (fastest with AVX-512 VNNI or AMX; exact products everywhere).
    pub fn with_precision(mut self, precision: Precision) -> Result<Self> {
        if precision == self.precision {
            return Ok(self);
        }
        ensure!(
            self.precision == Precision::F32,
            Error::Invalid(format!(
                "a {} model cannot be switched to {}; load it again",
                self.precision.name(),
                precision.name()
            ))
        );
        if precision == Precision::Bf16 {
            ensure!(
                bf16::available(),
                Error::Unsupported(format!(
                    "bf16 precision needs bf16 hardware at the kernel level in use ({}): \
                     AVX-512 BF16 (AMD Zen 4 and later, Intel Cooper Lake and Xeon 4th \
                     generation) or AMX tiles; int8 and f32 run here",
                    craterdex_kernels::active()
                ))
            );
            let (d, h) = (self.config.hidden_size, self.config.mlp_hidden);
            ensure!(
                PackedBf16::fits(d) && PackedBf16::fits(h),
                Error::Unsupported(format!(
                    "bf16 needs layer widths that are multiples of 16 (this model: {d}, {h})"
                ))
            );
        }
        self.embed.proj.set_precision(precision);
        let (d, heads) = (self.config.hidden_size, self.config.num_heads);
        let bf16_attention =
            precision != Precision::F32 && attention::runs(attention::Products::Bf16, d, heads);
        for b in &mut self.blocks {
            for l in b.linears_mut() {
                l.set_precision(precision);
            }
            if bf16_attention {
                b.attn.products = attention::Products::Bf16;
            }
        }
        self.precision = precision;
        Ok(self)
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The arithmetic of the attention's products: bf16 where the precision is not f32 and
    /// the CPU has AVX-512 BF16 at the active level, else f32.
    pub fn attention_products(&self) -> attention::Products {
        self.blocks
            .first()
            .map_or(attention::Products::F32, |b| b.attn.products)
    }

    /// Identifies the features this backbone produces: the model's fingerprint, plus the
    /// precision when it is not f32 (feature caches key on it).
    pub fn features_fingerprint(&self) -> String {
        let base = match (self.precision, self.attention_products()) {
            (Precision::F32, _) => self.config.fingerprint(),
            (p, attention::Products::F32) => format!("{}-{}", self.config.fingerprint(), p.name()),
            (p, attention::Products::Bf16) => {
                format!("{}-{}-bf16attention", self.config.fingerprint(), p.name())
            }
        };
        match self.reduction_tag() {
            Some(tag) => format!("{base}{tag}"),
            None => base,
        }
    }

    /// `^S` when the input size is not the model's own (`--size S`), `~keepF` when token
    /// reduction is on (`F` the fraction kept), `@bN` when only the first `N` blocks run and
    /// `&S1,S2` for the extra input sizes, for fingerprints: such features are not comparable
    /// with a whole, unreduced pass's at the model's one size.
    pub fn reduction_tag(&self) -> Option<String> {
        let size = (self.input_size() != self.config.image_size)
            .then(|| format!("^{}", self.input_size()));
        let keep = self
            .reduction_block()
            .map(|_| format!("~keep{}", self.keep_tokens));
        let blocks =
            (self.blocks.len() < self.config.depth).then(|| format!("@b{}", self.blocks.len()));
        let extra = self.input_sizes()[1..]
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let sizes = (!extra.is_empty()).then(|| format!("&{extra}"));
        match (size, keep, blocks, sizes) {
            (None, None, None, None) => None,
            (z, k, b, s) => Some(format!(
                "{}{}{}{}",
                z.unwrap_or_default(),
                k.unwrap_or_default(),
                b.unwrap_or_default(),
                s.unwrap_or_default()
            )),
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
    /// The model's own input size (the first of [`Vit::input_sizes`]).
    pub fn input_size(&self) -> usize {
        self.scales[0].input_size
    }
    /// Patch tokens of an image at the model's own input size.
    pub fn num_patches(&self) -> usize {
        self.scales[0].patches()
    }
    pub fn dim(&self) -> usize {
        self.config.hidden_size
    }

    /// Runs a batch of preprocessed images, each `[3, S, S]` CHW with S one of the
    /// [`Vit::input_sizes`], the same for the whole batch.
    pub fn forward(&self, images: &[Vec<f32>]) -> Result<Vec<ImageFeatures>> {
        Ok(self.forward_profiled(images)?.0)
    }

    /// Multiply-adds, counted as two operations, of one image's forward passes (one per
    /// input size): the linear layers (patch embedding included) and attention's two
    /// products per head.
    pub fn flops_per_image(&self) -> f64 {
        let c = &self.config;
        let (d, h) = (c.hidden_size, c.mlp_hidden);
        let all = self.flops_of_every_token();
        match self.reduction_block() {
            // the blocks past the split run on fewer tokens
            Some(split) => {
                let later = (self.blocks.len() - 1 - split) as f64;
                let saved: f64 = self
                    .scales
                    .iter()
                    .map(|sc| {
                        let n = sc.patches();
                        block_flops(d, h, 1 + n) - block_flops(d, h, 1 + self.kept_patches(n))
                    })
                    .sum();
                all - later * saved
            }
            None => all,
        }
    }

    /// Operations of one image through the blocks this model runs with every token (what
    /// another runtime cut after as many blocks does).
    pub fn flops_of_every_token(&self) -> f64 {
        let c = &self.config;
        let skipped = (c.depth - self.blocks.len()) as f64;
        self.flops_of_whole_model()
            - self
                .scales
                .iter()
                .map(|sc| skipped * block_flops(c.hidden_size, c.mlp_hidden, 1 + sc.patches()))
                .sum::<f64>()
    }

    /// Operations of one image through every block with every token, at every input size.
    pub fn flops_of_whole_model(&self) -> f64 {
        let c = &self.config;
        self.scales
            .iter()
            .map(|sc| vit_flops(c.hidden_size, c.depth, c.mlp_hidden, c.patch_size, sc.grid))
            .sum()
    }

    /// [`Vit::forward`], and where its time went.
    pub fn forward_profiled(
        &self,
        images: &[Vec<f32>],
    ) -> Result<(Vec<ImageFeatures>, PassProfile)> {
        let mut profile = PassProfile::default();
        let Some(first) = images.first() else {
            return Ok((Vec::new(), profile));
        };
        let scale = self
            .scales
            .iter()
            .find(|sc| first.len() == 3 * sc.input_size * sc.input_size)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "image 0 of the batch has {} values, expected 3xSxS for S one of the input \
                     sizes {:?}",
                    first.len(),
                    self.input_sizes()
                ))
            })?;
        let s = scale.input_size;
        for (i, im) in images.iter().enumerate() {
            ensure!(
                im.len() == 3 * s * s,
                Error::Invalid(format!(
                    "image {i} of the batch has {} values, expected 3x{s}x{s}",
                    im.len()
                ))
            );
        }
        let d = self.config.hidden_size;
        let b = images.len();
        self.images_run.fetch_add(b as u64, Ordering::Relaxed);
        let n = scale.patches();
        let t = 1 + n;
        let rows = b * t;
        let mut x = self.tokens(images, scale, &mut profile);
        let mut scratch = Scratch {
            normed: vec![0f32; rows * d],
            qkv: vec![0f32; rows * 3 * d],
            mixed: vec![0f32; rows * d],
            hidden: vec![0f32; rows * self.config.mlp_hidden],
            delta: Vec::new(),
        };
        let mut last_attn = vec![0f32; b * (t - 1)];
        let last = self.blocks.len() - 1;
        let split = self.reduction_block().unwrap_or(last);
        for (bi, blk) in self.blocks[..=split].iter().enumerate() {
            let cls_attn = (bi == split).then_some(&mut last_attn[..]);
            blk.forward(&mut x, b, t, &mut scratch, cls_attn, &mut profile);
        }
        if split < last {
            let mut clock = Instant::now();
            let kept = kept_rows(&last_attn, b, n, self.kept_patches(n));
            let tk = 1 + self.kept_patches(n);
            let mut small = vec![0f32; b * tk * d];
            for (dst, &row) in small.chunks_exact_mut(d).zip(&kept) {
                dst.copy_from_slice(&x[row * d..(row + 1) * d]);
            }
            PassProfile::lap(&mut profile.elementwise, &mut clock);
            let mut small_attn = vec![0f32; b * (tk - 1)];
            for (bi, blk) in self.blocks.iter().enumerate().skip(split + 1) {
                let cls_attn = (bi == last).then_some(&mut small_attn[..]);
                blk.forward(&mut small, b, tk, &mut scratch, cls_attn, &mut profile);
            }
            let mut clock = Instant::now();
            last_attn.fill(0.0);
            for (i, (src, &row)) in small.chunks_exact(d).zip(&kept).enumerate() {
                x[row * d..(row + 1) * d].copy_from_slice(src);
                let (img, pos) = (i / tk, i % tk);
                if pos > 0 {
                    last_attn[row - (img + 1)] = small_attn[img * (tk - 1) + pos - 1];
                }
            }
            PassProfile::lap(&mut profile.elementwise, &mut clock);
        }
        let mut clock = Instant::now();
        let h = &mut scratch.normed;
        self.norm.forward(&x, h);
        let features = (0..b)
            .map(|i| {
                let img = &h[i * t * d..(i + 1) * t * d];
                ImageFeatures {
                    cls: img[..d].to_vec(),
                    patches: img[d..].to_vec(),
                    attention: last_attn[i * (t - 1)..(i + 1) * (t - 1)].to_vec(),
                }
            })
            .collect();
        PassProfile::lap(&mut profile.elementwise, &mut clock);
        Ok((features, profile))
    }

    /// `[B * T, D]`: the CLS token and the patch embeddings, plus positions.
    fn tokens(&self, images: &[Vec<f32>], scale: &Scale, p: &mut PassProfile) -> Vec<f32> {
        let d = self.config.hidden_size;
        let n = scale.patches();
        let t = 1 + n;
        let pos_embed = &scale.pos_embed;
        let mut clock = Instant::now();
        let patches = self.embed.forward(images, scale.input_size);
        PassProfile::lap(&mut p.linear, &mut clock);
        let mut x = vec![0f32; images.len() * t * d];
        x.par_chunks_mut(t * d).enumerate().for_each(|(i, img)| {
            for (j, v) in img[..d].iter_mut().enumerate() {
                *v = self.cls_token[j] + pos_embed[j];
            }
            let src = &patches[i * n * d..(i + 1) * n * d];
            for (k, v) in img[d..].iter_mut().enumerate() {
                *v = src[k] + pos_embed[d + k];
            }
        });
        PassProfile::lap(&mut p.elementwise, &mut clock);
        x
    }
}

/// Blocks run by default for retrieval: two thirds of the backbone's depth, rounded up (8 of
/// 12). Measured on DINOv2 ViT-S/14 only (docs/results.md, "How deep the backbone runs").
pub fn retrieval_blocks(depth: usize) -> usize {
    (2 * depth).div_ceil(3).max(1)
}

/// Rows of `[b * (1 + n), D]` tokens that go on past token reduction, image by image: CLS,
/// then the `keep` patches with the most CLS attention (`attn` `[b, n]`), in grid order.
fn kept_rows(attn: &[f32], b: usize, n: usize, keep: usize) -> Vec<usize> {
    let mut rows = Vec::with_capacity(b * (1 + keep));
    for img in 0..b {
        let a = &attn[img * n..(img + 1) * n];
        let mut order: Vec<usize> = (0..n).collect();
        // most attended first; ties by position, so the choice is deterministic
        order.sort_by(|&i, &j| a[j].total_cmp(&a[i]).then(i.cmp(&j)));
        let mut chosen = order[..keep].to_vec();
        chosen.sort_unstable();
        rows.push(img * (1 + n));
        rows.extend(chosen.iter().map(|p| img * (1 + n) + 1 + p));
    }
    rows
}

/// Operations (a multiply-add counts two) of one image through a ViT of width `d`, `depth`
/// blocks, MLP width `mlp`, `patch`-pixel patches on a `grid` x `grid` grid plus CLS.
pub fn vit_flops(d: usize, depth: usize, mlp: usize, patch: usize, grid: usize) -> f64 {
    let n = grid * grid;
    let patch_embed = 2.0 * n as f64 * (3 * patch * patch) as f64 * d as f64;
    patch_embed + depth as f64 * block_flops(d, mlp, 1 + n)
}

/// Operations of one transformer block over `t` tokens.
fn block_flops(d: usize, mlp: usize, t: usize) -> f64 {
    let (d, t) = (d as f64, t as f64);
    let linear = 2.0 * t * d * (3.0 * d + d + 2.0 * mlp as f64);
    let attention = 2.0 * 2.0 * t * t * d;
    linear + attention
}

/// Resamples the position-embedding grid with bicubic interpolation (a = -0.75, half-pixel
/// centres, edge clamping, no antialias): PyTorch's `interpolate(..., size=, mode="bicubic",
/// align_corners=False)` and the ONNX `Resize` the Hugging Face export contains.
pub fn resample_pos_embed(pos: &[f32], d: usize, from: usize, to: usize) -> Vec<f32> {
    if from == to {
        return pos.to_vec();
    }
    let grid = &pos[d..];
    // rows first: [from, from, d] -> [to, from, d], then columns -> [to, to, d]
    let mut tmp = vec![0f32; to * from * d];
    for oy in 0..to {
        let taps = cubic_taps(oy, from, to);
        for x in 0..from {
            let dst = &mut tmp[(oy * from + x) * d..][..d];
            for &(iy, wgt) in &taps {
                let src = &grid[(iy * from + x) * d..][..d];
                dst.iter_mut().zip(src).for_each(|(a, b)| *a += wgt * b);
            }
        }
    }
    let mut out = vec![0f32; (1 + to * to) * d];
    out[..d].copy_from_slice(&pos[..d]);
    for ox in 0..to {
        let taps = cubic_taps(ox, from, to);
        for y in 0..to {
            let dst = &mut out[d + (y * to + ox) * d..][..d];
            for &(ix, wgt) in &taps {
                let src = &tmp[(y * from + ix) * d..][..d];
                dst.iter_mut().zip(src).for_each(|(a, b)| *a += wgt * b);
            }
        }
    }
    out
}

fn cubic_taps(dst: usize, from: usize, to: usize) -> [(usize, f32); 4] {
    const A: f32 = -0.75;
    let src = (dst as f32 + 0.5) * (from as f32 / to as f32) - 0.5;
    let i0 = src.floor();
    let t = src - i0;
    let w = |x: f32| {
        let x = x.abs();
        if x <= 1.0 {
            ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
        } else if x < 2.0 {
            ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
        } else {
            0.0
        }
    };
    let clamp = |i: i64| i.clamp(0, from as i64 - 1) as usize;
    let i0 = i0 as i64;
    [
        (clamp(i0 - 1), w(t + 1.0)),
        (clamp(i0), w(t)),
        (clamp(i0 + 1), w(1.0 - t)),
        (clamp(i0 + 2), w(2.0 - t)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vit_s14_at_224_px_costs_12_2_gflop_per_image() {
        // counted another way: every product [m, k] x [k, n] of a block, attention per head
        let (d, heads, t, mlp) = (384usize, 6usize, 257usize, 1536usize);
        let dh = d / heads;
        let products = [(t, d, 3 * d), (t, d, d), (t, d, mlp), (t, mlp, d)]
            .into_iter()
            .chain((0..heads).flat_map(|_| [(t, dh, t), (t, t, dh)]));
        let block: usize = products.map(|(m, k, n)| 2 * m * k * n).sum();
        let embed = 2 * 256 * (3 * 14 * 14) * d;
        let want = (embed + 12 * block) as f64;
        assert_eq!(vit_flops(d, 12, mlp, 14, 16), want);
        assert!((want / 1e9 - 12.248).abs() < 0.001, "{want}");
    }

    #[test]
    fn bicubic_resample_keeps_constants_and_same_size() {
        let d = 3;
        let from = 5;
        let mut pos = vec![7.0; (1 + from * from) * d];
        pos[..d].copy_from_slice(&[1.0, 2.0, 3.0]);
        let same = resample_pos_embed(&pos, d, from, from);
        assert_eq!(same, pos);
        let up = resample_pos_embed(&pos, d, from, 8);
        assert_eq!(up.len(), (1 + 64) * d);
        assert_eq!(&up[..d], &[1.0, 2.0, 3.0]);
        assert!(
            up[d..].iter().all(|v| (v - 7.0).abs() < 1e-5),
            "cubic weights must sum to one"
        );
    }

    #[test]
    fn bicubic_matches_hand_computed_1d_case() {
        // 1 x 4 grid as a column of rows: values 0,1,2,3 along y, constant along x.
        let d = 1;
        let from = 4;
        let mut pos = vec![0.0; 1 + 16];
        for y in 0..4 {
            for x in 0..4 {
                pos[1 + y * 4 + x] = y as f32;
            }
        }
        let down = resample_pos_embed(&pos, d, from, 2);
        // half-pixel: dst 0 -> src 0.5, dst 1 -> src 2.5; a linear ramp is reproduced exactly
        // away from the clamped edges, and at src 0.5 the clamp pulls it to 0.5 - 0.0703125.
        let w = |x: f32| -> f32 {
            let a = -0.75f32;
            let x = x.abs();
            if x <= 1.0 {
                ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
            } else {
                ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
            }
        };
        let expect0 = w(1.5) * 0.0 + w(0.5) * 0.0 + w(0.5) * 1.0 + w(1.5) * 2.0;
        assert!(
            (down[1] - expect0).abs() < 1e-6,
            "{} vs {}",
            down[1],
            expect0
        );
        let expect1 = w(1.5) * 1.0 + w(0.5) * 2.0 + w(0.5) * 3.0 + w(1.5) * 3.0;
        assert!((down[1 + 2] - expect1).abs() < 1e-6);
    }
}
