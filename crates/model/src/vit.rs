//! The ViT forward pass (DINO v1 and DINOv2 share it; DINOv2 adds layer scale).
//!
//! Weights are held in the "craterdex" layout: matrices are `[in, out]` row-major so a linear
//! layer is `x W + b`, and q, k, v are fused into one `[D, 3D]` matrix.

use crate::config::ModelConfig;
use anyhow::{bail, ensure, Result};
use craterdex_kernels::amx::PackedBf16;
use gemm::Parallelism;
use rayon::prelude::*;

/// One transformer block.
#[derive(Clone, Debug)]
pub struct Block {
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
    pub blocks: Vec<Block>,
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
                "weight {name} has {} values, expected {n}",
                v.len()
            );
            Ok(())
        };
        ensure!(
            c.num_heads > 0 && d.is_multiple_of(c.num_heads),
            "hidden size {d} is not divisible by {} heads",
            c.num_heads
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
            "{} blocks, config says {}",
            self.blocks.len(),
            c.depth
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
                        bail!("{} missing although the model uses layer scale", n(s))
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

/// A backbone ready to run at one input size.
pub struct Vit {
    config: ModelConfig,
    weights: VitWeights,
    input_size: usize,
    grid: usize,
    /// Position embeddings resampled to `grid`, `[1 + grid*grid, D]`.
    pos_embed: Vec<f32>,
    /// The linear layers' weights in bf16 tile layout, for [`Precision::Bf16`].
    bf16: Option<Bf16Weights>,
}

/// Arithmetic of the forward pass's linear layers (patch embedding, qkv, projection, MLP).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// f32 throughout.
    #[default]
    F32,
    /// Linear layers take bf16 inputs and weights and accumulate in f32, on AMX tiles;
    /// attention, norms and activations stay f32.
    Bf16,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" | "fp32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            _ => anyhow::bail!("unknown precision {s:?}: use f32 or bf16"),
        }
    }
}

struct Bf16Block {
    qkv: PackedBf16,
    proj: PackedBf16,
    fc1: PackedBf16,
    fc2: PackedBf16,
}

struct Bf16Weights {
    patch: PackedBf16,
    blocks: Vec<Bf16Block>,
}

impl Vit {
    pub fn new(config: ModelConfig, weights: VitWeights, input_size: usize) -> Result<Self> {
        weights.validate(&config)?;
        let grid = input_size / config.patch_size;
        ensure!(
            grid >= 1,
            "input size {input_size} is smaller than the patch size {}",
            config.patch_size
        );
        let pos_embed = resample_pos_embed(
            &weights.pos_embed,
            config.hidden_size,
            config.pos_grid,
            grid,
        );
        Ok(Self {
            config,
            weights,
            input_size,
            grid,
            pos_embed,
            bf16: None,
        })
    }

    /// Switches the linear layers' arithmetic. bf16 needs a CPU with AMX tiles.
    pub fn with_precision(mut self, precision: Precision) -> Result<Self> {
        self.bf16 = match precision {
            Precision::F32 => None,
            Precision::Bf16 => {
                ensure!(
                    craterdex_kernels::amx::available(),
                    "--precision bf16 needs a CPU with AMX (Intel Xeon 4th generation or later) \
                     and Linux 5.16+; use --precision f32 here"
                );
                let (c, w) = (&self.config, &self.weights);
                let d = c.hidden_size;
                ensure!(
                    PackedBf16::fits(d) && PackedBf16::fits(c.mlp_hidden),
                    "bf16 needs layer widths that are multiples of 16 (this model: {d}, {})",
                    c.mlp_hidden
                );
                let p = c.patch_size;
                Some(Bf16Weights {
                    patch: PackedBf16::new(&w.patch_w, 3 * p * p, d),
                    blocks: w
                        .blocks
                        .iter()
                        .map(|b| Bf16Block {
                            qkv: PackedBf16::new(&b.qkv_w, d, 3 * d),
                            proj: PackedBf16::new(&b.proj_w, d, d),
                            fc1: PackedBf16::new(&b.fc1_w, d, c.mlp_hidden),
                            fc2: PackedBf16::new(&b.fc2_w, c.mlp_hidden, d),
                        })
                        .collect(),
                })
            }
        };
        Ok(self)
    }

    pub fn precision(&self) -> Precision {
        if self.bf16.is_some() {
            Precision::Bf16
        } else {
            Precision::F32
        }
    }

    /// Identifies the features this backbone produces: the model's fingerprint, plus the
    /// precision when it is not f32 (feature caches key on it).
    pub fn features_fingerprint(&self) -> String {
        match self.precision() {
            Precision::F32 => self.config.fingerprint(),
            p => format!("{}-{}", self.config.fingerprint(), p.name()),
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
    pub fn input_size(&self) -> usize {
        self.input_size
    }
    pub fn num_patches(&self) -> usize {
        self.grid * self.grid
    }
    pub fn dim(&self) -> usize {
        self.config.hidden_size
    }

    /// Runs a batch of preprocessed images, each `[3, S, S]` CHW with S the input size.
    pub fn forward(&self, images: &[Vec<f32>]) -> Result<Vec<ImageFeatures>> {
        let s = self.input_size;
        for (i, im) in images.iter().enumerate() {
            ensure!(
                im.len() == 3 * s * s,
                "image {i} of the batch has {} values, expected 3x{s}x{s}",
                im.len()
            );
        }
        if images.is_empty() {
            return Ok(Vec::new());
        }
        let c = &self.config;
        let (d, heads) = (c.hidden_size, c.num_heads);
        let b = images.len();
        let t = 1 + self.num_patches();
        let rows = b * t;
        let mut x = self.embed(images);
        let mut h = vec![0f32; rows * d];
        let mut qkv = vec![0f32; rows * 3 * d];
        let mut attn_out = vec![0f32; rows * d];
        let mut mlp = vec![0f32; rows * c.mlp_hidden];
        let mut last_attn = vec![0f32; b * (t - 1)];
        let last = self.weights.blocks.len() - 1;
        for (bi, blk) in self.weights.blocks.iter().enumerate() {
            let packed = self.bf16.as_ref().map(|p| &p.blocks[bi]);
            layer_norm(&x, &mut h, d, &blk.norm1_w, &blk.norm1_b, c.layer_norm_eps);
            let qkv_w = Weight::new(&blk.qkv_w, packed.map(|p| &p.qkv));
            linear(&h, rows, d, qkv_w, 3 * d, &blk.qkv_b, &mut qkv);
            let cls_attn = if bi == last {
                Some(&mut last_attn[..])
            } else {
                None
            };
            attention(&qkv, b, t, d, heads, &mut attn_out, cls_attn);
            let proj_w = Weight::new(&blk.proj_w, packed.map(|p| &p.proj));
            linear(&attn_out, rows, d, proj_w, d, &blk.proj_b, &mut h);
            add_residual(&mut x, &h, blk.ls1.as_deref(), d);
            layer_norm(&x, &mut h, d, &blk.norm2_w, &blk.norm2_b, c.layer_norm_eps);
            let fc1_w = Weight::new(&blk.fc1_w, packed.map(|p| &p.fc1));
            linear(&h, rows, d, fc1_w, c.mlp_hidden, &blk.fc1_b, &mut mlp);
            mlp.par_chunks_mut(4096).for_each(gelu_in_place);
            let fc2_w = Weight::new(&blk.fc2_w, packed.map(|p| &p.fc2));
            linear(&mlp, rows, c.mlp_hidden, fc2_w, d, &blk.fc2_b, &mut h);
            add_residual(&mut x, &h, blk.ls2.as_deref(), d);
        }
        layer_norm(
            &x,
            &mut h,
            d,
            &self.weights.norm_w,
            &self.weights.norm_b,
            c.layer_norm_eps,
        );
        Ok((0..b)
            .map(|i| {
                let img = &h[i * t * d..(i + 1) * t * d];
                ImageFeatures {
                    cls: img[..d].to_vec(),
                    patches: img[d..].to_vec(),
                    attention: last_attn[i * (t - 1)..(i + 1) * (t - 1)].to_vec(),
                }
            })
            .collect())
    }

    /// Patch embedding (a stride-p convolution done as one matmul), CLS token, positions.
    fn embed(&self, images: &[Vec<f32>]) -> Vec<f32> {
        let (p, g, s, d) = (
            self.config.patch_size,
            self.grid,
            self.input_size,
            self.config.hidden_size,
        );
        let n = g * g;
        let t = 1 + n;
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
        let mut patches = vec![0f32; images.len() * n * d];
        linear(
            &cols,
            images.len() * n,
            kdim,
            Weight::new(&self.weights.patch_w, self.bf16.as_ref().map(|p| &p.patch)),
            d,
            &self.weights.patch_b,
            &mut patches,
        );
        let mut x = vec![0f32; images.len() * t * d];
        x.par_chunks_mut(t * d).enumerate().for_each(|(i, img)| {
            for (j, v) in img[..d].iter_mut().enumerate() {
                *v = self.weights.cls_token[j] + self.pos_embed[j];
            }
            let src = &patches[i * n * d..(i + 1) * n * d];
            for (k, v) in img[d..].iter_mut().enumerate() {
                *v = src[k] + self.pos_embed[d + k];
            }
        });
        x
    }
}

/// A linear layer's weight `[k, n]`, with its bf16 tile packing when the model runs in bf16.
#[derive(Clone, Copy)]
struct Weight<'a> {
    f32: &'a [f32],
    bf16: Option<&'a PackedBf16>,
}

impl<'a> Weight<'a> {
    fn new(f32: &'a [f32], bf16: Option<&'a PackedBf16>) -> Self {
        Self { f32, bf16 }
    }
}

/// Rows per task of a bf16 product: enough to keep the tiles busy, small enough to share
/// a batch between threads.
const BF16_ROWS_PER_TASK: usize = 128;

/// `out[m, n] = a[m, k] W[k, n] + bias[n]`, all row-major, multithreaded over the rayon pool.
fn linear(a: &[f32], m: usize, k: usize, w: Weight, n: usize, bias: &[f32], out: &mut [f32]) {
    debug_assert!(
        a.len() >= m * k && w.f32.len() == k * n && bias.len() == n && out.len() >= m * n
    );
    out[..m * n]
        .par_chunks_mut(n)
        .for_each(|row| row.copy_from_slice(bias));
    if let Some(packed) = w.bf16 {
        out[..m * n]
            .par_chunks_mut(BF16_ROWS_PER_TASK * n)
            .zip(a[..m * k].par_chunks(BF16_ROWS_PER_TASK * k))
            .for_each(|(o, a)| craterdex_kernels::amx::bf16_matmul_acc(a, a.len() / k, packed, o));
        return;
    }
    let w = w.f32;
    let threads = rayon::current_num_threads();
    let par = if threads > 1 && m * n * k > 1 << 18 {
        Parallelism::Rayon(threads)
    } else {
        Parallelism::None
    };
    // SAFETY: the slices cover the strided extents given (checked above in debug builds and by
    // construction in the callers), and dst does not alias lhs or rhs.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            true,
            a.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            1,
            n as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

struct SendPtr(*mut f32);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn at(&self, offset: usize) -> *mut f32 {
        // SAFETY: callers stay inside the buffer the pointer was taken from.
        unsafe { self.0.add(offset) }
    }
}

/// Multi-head self-attention over a fused `[B*T, 3D]` q|k|v buffer into `[B*T, D]`.
/// When `cls_attn` is given, it receives the CLS row's attention to the patches, head-averaged.
fn attention(
    qkv: &[f32],
    b: usize,
    t: usize,
    d: usize,
    heads: usize,
    out: &mut [f32],
    cls_attn: Option<&mut [f32]>,
) {
    let dh = d / heads;
    let scale = 1.0 / (dh as f32).sqrt();
    let out_ptr = SendPtr(out.as_mut_ptr());
    let cls_rows: Vec<Vec<f32>> = (0..b * heads)
        .into_par_iter()
        .map_init(
            || vec![0f32; t * t],
            |scores, job| {
                let (img, head) = (job / heads, job % heads);
                let base = img * t * 3 * d;
                let q = &qkv[base + head * dh..];
                let k = &qkv[base + d + head * dh..];
                let v = &qkv[base + 2 * d + head * dh..];
                let rs = (3 * d) as isize;
                // SAFETY: q, k, v are strided views inside qkv; each job writes a disjoint
                // column block (its head) of its own image's rows in `out`.
                unsafe {
                    gemm::gemm(
                        t,
                        t,
                        dh,
                        scores.as_mut_ptr(),
                        1,
                        t as isize,
                        false,
                        q.as_ptr(),
                        1,
                        rs,
                        k.as_ptr(),
                        rs,
                        1,
                        0.0,
                        scale,
                        false,
                        false,
                        false,
                        Parallelism::None,
                    );
                }
                scores.chunks_mut(t).for_each(softmax_in_place);
                let dst = out_ptr.at(img * t * d + head * dh);
                unsafe {
                    gemm::gemm(
                        t,
                        dh,
                        t,
                        dst,
                        1,
                        d as isize,
                        false,
                        scores.as_ptr(),
                        1,
                        t as isize,
                        v.as_ptr(),
                        1,
                        rs,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        Parallelism::None,
                    );
                }
                scores[1..t].to_vec()
            },
        )
        .collect();
    if let Some(cls) = cls_attn {
        let n = t - 1;
        cls.iter_mut().for_each(|v| *v = 0.0);
        for (job, row) in cls_rows.iter().enumerate() {
            let dst = &mut cls[(job / heads) * n..][..n];
            dst.iter_mut()
                .zip(row)
                .for_each(|(a, r)| *a += r / heads as f32);
        }
    }
}

fn softmax_in_place(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    map_in_place(row, |v| exp_nonpositive(v - max));
    let sum: f32 = row.iter().sum();
    let inv = 1.0 / sum;
    row.iter_mut().for_each(|v| *v *= inv);
}

/// `e^x` for `x <= 0` (softmax after subtracting the row maximum): `2^n e^r` with
/// `|r| <= ln2/2` and a degree-6 Taylor polynomial, branch-free so that it vectorises; within
/// 3 ulp of libm's expf (tested). Below -87 (e^x < 2^-125) the result is zero.
#[inline(always)]
fn exp_nonpositive(input: f32) -> f32 {
    let x = input.max(-87.0);
    // Round to nearest by adding and removing 1.5 * 2^23 (f32::round is not one instruction).
    const ROUNDER: f32 = 12_582_912.0;
    let n = (x * std::f32::consts::LOG2_E + ROUNDER) - ROUNDER;
    // ln 2 split in two so that n * ln2 is exact in its high part.
    let r = (x - n * 0.693_145_75) - n * 1.428_606_8e-6;
    let mut p = 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    if input < -87.0 {
        0.0
    } else {
        p * scale
    }
}

fn layer_norm(x: &[f32], out: &mut [f32], d: usize, w: &[f32], b: &[f32], eps: f32) {
    out.par_chunks_mut(d)
        .zip(x.par_chunks(d))
        .for_each(|(o, r)| {
            let mean = r.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
            let var = r.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
            let inv = 1.0 / (var + eps as f64).sqrt();
            for j in 0..d {
                o[j] = ((r[j] as f64 - mean) * inv) as f32 * w[j] + b[j];
            }
        });
}

fn add_residual(x: &mut [f32], y: &[f32], scale: Option<&[f32]>, d: usize) {
    x.par_chunks_mut(d)
        .zip(y.par_chunks(d))
        .for_each(|(xr, yr)| match scale {
            Some(s) => xr
                .iter_mut()
                .zip(yr)
                .zip(s)
                .for_each(|((a, b), g)| *a += b * g),
            None => xr.iter_mut().zip(yr).for_each(|(a, b)| *a += b),
        });
}

/// `erf(x)` as a rational function of `x` on [-4, 4] (|erf| rounds to 1 beyond), the form
/// XLA and Eigen use for f32: within 5e-7 (4 ulp near 1) of libm's erff (tested), branch-free so that loops
/// over it vectorise. libm's scalar erff took a third of the forward pass.
#[inline(always)]
fn erf_rational(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10_f32;
    p = p * x2 + 2.770_681_4e-8;
    p = p * x2 - 2.101_024e-6;
    p = p * x2 - 5.692_506_4e-5;
    p = p * x2 - 7.349_906_3e-4;
    p = p * x2 - 2.954_6e-3;
    p = p * x2 - 1.609_603_3e-2;
    let mut q = -1.456_607_2e-5_f32;
    q = q * x2 - 2.133_740_6e-4;
    q = q * x2 - 1.682_827e-3;
    q = q * x2 - 7.373_329e-3;
    q = q * x2 - 1.426_474e-2;
    x * p / q
}

/// Exact (erf) GELU, as in the reference DINO and DINOv2 code.
#[inline(always)]
fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf_rational(x * std::f32::consts::FRAC_1_SQRT_2))
}

fn gelu_in_place(v: &mut [f32]) {
    map_in_place(v, gelu);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn map_avx512(v: &mut [f32], f: impl Fn(f32) -> f32) {
    v.iter_mut().for_each(|x| *x = f(*x));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn map_avx2(v: &mut [f32], f: impl Fn(f32) -> f32) {
    v.iter_mut().for_each(|x| *x = f(*x));
}

/// Applies an element-wise function compiled for the widest vectors the CPU has (the build
/// targets baseline x86-64, whose 4-lane SSE would leave most of the machine idle).
fn map_in_place(v: &mut [f32], f: impl Fn(f32) -> f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F (checked above).
            return unsafe { map_avx512(v, f) };
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2 and FMA (checked above).
            return unsafe { map_avx2(v, f) };
        }
    }
    v.iter_mut().for_each(|x| *x = f(*x));
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

    #[test]
    fn rational_erf_matches_libm_everywhere() {
        let mut worst = 0f32;
        for i in -2_000_000..=2_000_000 {
            let x = i as f32 * 3e-6; // [-6, 6]
            worst = worst.max((erf_rational(x) - libm::erff(x)).abs());
        }
        assert!(worst < 5e-7, "worst |erf error| {worst}");
        let mut v: Vec<f32> = (-500..500).map(|i| i as f32 * 0.013).collect();
        let want: Vec<f32> = v
            .iter()
            .map(|&x| 0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2)))
            .collect();
        gelu_in_place(&mut v);
        for (a, b) in v.iter().zip(&want) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }

    #[test]
    fn vectorised_exp_matches_libm() {
        let mut worst_ulp = 0i64;
        for i in 0..=1_000_000 {
            let x = -(i as f32) * 8.0e-5; // [-80, 0]
            let (got, want) = (exp_nonpositive(x), x.exp());
            worst_ulp = worst_ulp.max((got.to_bits() as i64 - want.to_bits() as i64).abs());
        }
        assert!(worst_ulp <= 3, "worst error {worst_ulp} ulp");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-90.0), 0.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn softmax_rows_sum_to_one() {
        let mut r = vec![1.0, 2.0, 3.0, -1000.0];
        softmax_in_place(&mut r);
        assert!((r.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(r[3], 0.0);
    }
}
