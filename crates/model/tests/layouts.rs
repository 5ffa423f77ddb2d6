//! Every supported checkpoint layout, written as a small generated checkpoint, imports to a
//! model whose forward pass matches a naive reference written with PyTorch semantics
//! (`Linear` weights `[out, in]`, `y = x W^T + b`).

use craterdex_model::{import, layouts::transpose};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::Path;

const D: usize = 32;
const HEADS: usize = 2;
const DEPTH: usize = 2;
const P: usize = 4;
const MLP: usize = 64;
const G: usize = 3;
const S: usize = P * G;

type Named = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// Random weights in the Meta/timm layout.
fn meta_checkpoint(layer_scale: bool, seed: u64) -> Named {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut m = Named::new();
    let mut put = |name: String, shape: Vec<usize>, scale: f32| {
        let n: usize = shape.iter().product();
        let data = (0..n).map(|_| rng.gen_range(-1.0..1.0) * scale).collect();
        m.insert(name, (shape, data));
    };
    put("cls_token".into(), vec![1, 1, D], 1.0);
    put("pos_embed".into(), vec![1, 1 + G * G, D], 0.5);
    put("patch_embed.proj.weight".into(), vec![D, 3, P, P], 0.2);
    put("patch_embed.proj.bias".into(), vec![D], 0.1);
    for i in 0..DEPTH {
        let b = format!("blocks.{i}.");
        put(format!("{b}norm1.weight"), vec![D], 1.0);
        put(format!("{b}norm1.bias"), vec![D], 0.1);
        put(format!("{b}attn.qkv.weight"), vec![3 * D, D], 0.3);
        put(format!("{b}attn.qkv.bias"), vec![3 * D], 0.1);
        put(format!("{b}attn.proj.weight"), vec![D, D], 0.2);
        put(format!("{b}attn.proj.bias"), vec![D], 0.1);
        put(format!("{b}norm2.weight"), vec![D], 1.0);
        put(format!("{b}norm2.bias"), vec![D], 0.1);
        put(format!("{b}mlp.fc1.weight"), vec![MLP, D], 0.2);
        put(format!("{b}mlp.fc1.bias"), vec![MLP], 0.1);
        put(format!("{b}mlp.fc2.weight"), vec![D, MLP], 0.2);
        put(format!("{b}mlp.fc2.bias"), vec![D], 0.1);
        if layer_scale {
            put(format!("{b}ls1.gamma"), vec![D], 0.5);
            put(format!("{b}ls2.gamma"), vec![D], 0.5);
        }
    }
    put("norm.weight".into(), vec![D], 1.0);
    put("norm.bias".into(), vec![D], 0.1);
    m
}

/// The same weights under Hugging Face names (`Dinov2Model` or `ViTModel`).
fn to_hf(meta: &Named, dinov2: bool) -> Named {
    let mut m = Named::new();
    let g = |k: &str| meta[k].clone();
    m.insert("embeddings.cls_token".into(), g("cls_token"));
    m.insert("embeddings.position_embeddings".into(), g("pos_embed"));
    m.insert(
        "embeddings.patch_embeddings.projection.weight".into(),
        g("patch_embed.proj.weight"),
    );
    m.insert(
        "embeddings.patch_embeddings.projection.bias".into(),
        g("patch_embed.proj.bias"),
    );
    if dinov2 {
        m.insert("embeddings.mask_token".into(), (vec![1, D], vec![0.0; D]));
    }
    for i in 0..DEPTH {
        let (b, h) = (format!("blocks.{i}."), format!("encoder.layer.{i}."));
        let (qkv_w, qkv_b) = (
            &meta[&format!("{b}attn.qkv.weight")].1,
            &meta[&format!("{b}attn.qkv.bias")].1,
        );
        for (j, n) in ["query", "key", "value"].iter().enumerate() {
            m.insert(
                format!("{h}attention.attention.{n}.weight"),
                (vec![D, D], qkv_w[j * D * D..(j + 1) * D * D].to_vec()),
            );
            m.insert(
                format!("{h}attention.attention.{n}.bias"),
                (vec![D], qkv_b[j * D..(j + 1) * D].to_vec()),
            );
        }
        m.insert(
            format!("{h}attention.output.dense.weight"),
            g(&format!("{b}attn.proj.weight")),
        );
        m.insert(
            format!("{h}attention.output.dense.bias"),
            g(&format!("{b}attn.proj.bias")),
        );
        let (n1, n2, f1, f2) = if dinov2 {
            ("norm1", "norm2", "mlp.fc1", "mlp.fc2")
        } else {
            (
                "layernorm_before",
                "layernorm_after",
                "intermediate.dense",
                "output.dense",
            )
        };
        for (src, dst) in [
            ("norm1", n1),
            ("norm2", n2),
            ("mlp.fc1", f1),
            ("mlp.fc2", f2),
        ] {
            m.insert(format!("{h}{dst}.weight"), g(&format!("{b}{src}.weight")));
            m.insert(format!("{h}{dst}.bias"), g(&format!("{b}{src}.bias")));
        }
        if dinov2 {
            m.insert(
                format!("{h}layer_scale1.lambda1"),
                g(&format!("{b}ls1.gamma")),
            );
            m.insert(
                format!("{h}layer_scale2.lambda1"),
                g(&format!("{b}ls2.gamma")),
            );
        }
    }
    m.insert("layernorm.weight".into(), g("norm.weight"));
    m.insert("layernorm.bias".into(), g("norm.bias"));
    m
}

fn write_safetensors(path: &Path, m: &Named, prefix: &str, half: bool) {
    let bufs: Vec<(String, Vec<usize>, Vec<u8>)> = m
        .iter()
        .map(|(k, (s, d))| {
            let bytes = if half {
                d.iter()
                    .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                    .collect()
            } else {
                d.iter().flat_map(|v| v.to_le_bytes()).collect()
            };
            (format!("{prefix}{k}"), s.clone(), bytes)
        })
        .collect();
    let dtype = if half {
        safetensors::Dtype::BF16
    } else {
        safetensors::Dtype::F32
    };
    let views: Vec<(String, safetensors::tensor::TensorView)> = bufs
        .iter()
        .map(|(k, s, b)| {
            (
                k.clone(),
                safetensors::tensor::TensorView::new(dtype, s.clone(), b).unwrap(),
            )
        })
        .collect();
    std::fs::write(path, safetensors::serialize(views, &None).unwrap()).unwrap();
}

/// Naive ViT forward with PyTorch semantics over Meta-layout weights: (cls, patches, attention).
fn reference_forward(m: &Named, image: &[f32], eps: f32) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let w = |k: &str| &m[k].1;
    let lin = |x: &[f32], wt: &[f32], b: &[f32], out_dim: usize| -> Vec<f32> {
        let in_dim = wt.len() / out_dim;
        x.chunks(in_dim)
            .flat_map(|row| {
                (0..out_dim).map(move |o| {
                    b[o] + (0..in_dim)
                        .map(|i| row[i] * wt[o * in_dim + i])
                        .sum::<f32>()
                })
            })
            .collect()
    };
    let ln = |x: &[f32], g: &[f32], b: &[f32]| -> Vec<f32> {
        x.chunks(D)
            .flat_map(|r| {
                let mean = r.iter().sum::<f32>() / D as f32;
                let var = r.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / D as f32;
                (0..D).map(move |j| (r[j] - mean) / (var + eps).sqrt() * g[j] + b[j])
            })
            .collect()
    };
    let t = 1 + G * G;
    let mut x = vec![0f32; t * D];
    let (pw, pb, pos, cls) = (
        w("patch_embed.proj.weight"),
        w("patch_embed.proj.bias"),
        w("pos_embed"),
        w("cls_token"),
    );
    for j in 0..D {
        x[j] = cls[j] + pos[j];
    }
    for py in 0..G {
        for px in 0..G {
            for o in 0..D {
                let mut s = pb[o];
                for c in 0..3 {
                    for ky in 0..P {
                        for kx in 0..P {
                            s += pw[((o * 3 + c) * P + ky) * P + kx]
                                * image[c * S * S + (py * P + ky) * S + px * P + kx];
                        }
                    }
                }
                let tok = 1 + py * G + px;
                x[tok * D + o] = s + pos[tok * D + o];
            }
        }
    }
    let dh = D / HEADS;
    let mut cls_attn = vec![0f32; G * G];
    for i in 0..DEPTH {
        let b = format!("blocks.{i}.");
        let h = ln(
            &x,
            w(&format!("{b}norm1.weight")),
            w(&format!("{b}norm1.bias")),
        );
        let qkv = lin(
            &h,
            w(&format!("{b}attn.qkv.weight")),
            w(&format!("{b}attn.qkv.bias")),
            3 * D,
        );
        let mut o = vec![0f32; t * D];
        cls_attn.iter_mut().for_each(|v| *v = 0.0);
        for hd in 0..HEADS {
            for a in 0..t {
                let q = &qkv[a * 3 * D + hd * dh..][..dh];
                let mut s: Vec<f32> = (0..t)
                    .map(|c| {
                        q.iter()
                            .zip(&qkv[c * 3 * D + D + hd * dh..][..dh])
                            .map(|(x, y)| x * y)
                            .sum::<f32>()
                            / (dh as f32).sqrt()
                    })
                    .collect();
                let mx = s.iter().cloned().fold(f32::MIN, f32::max);
                s.iter_mut().for_each(|v| *v = (*v - mx).exp());
                let z: f32 = s.iter().sum();
                s.iter_mut().for_each(|v| *v /= z);
                if a == 0 {
                    for c in 1..t {
                        cls_attn[c - 1] += s[c] / HEADS as f32;
                    }
                }
                for e in 0..dh {
                    o[a * D + hd * dh + e] = (0..t)
                        .map(|c| s[c] * qkv[c * 3 * D + 2 * D + hd * dh + e])
                        .sum();
                }
            }
        }
        let y = lin(
            &o,
            w(&format!("{b}attn.proj.weight")),
            w(&format!("{b}attn.proj.bias")),
            D,
        );
        let ls1 = m
            .get(&format!("{b}ls1.gamma"))
            .map(|v| v.1.clone())
            .unwrap_or(vec![1.0; D]);
        x.iter_mut()
            .enumerate()
            .for_each(|(k, v)| *v += y[k] * ls1[k % D]);
        let h = ln(
            &x,
            w(&format!("{b}norm2.weight")),
            w(&format!("{b}norm2.bias")),
        );
        let mut f = lin(
            &h,
            w(&format!("{b}mlp.fc1.weight")),
            w(&format!("{b}mlp.fc1.bias")),
            MLP,
        );
        f.iter_mut()
            .for_each(|v| *v = 0.5 * *v * (1.0 + libm::erff(*v / 2f32.sqrt())));
        let y = lin(
            &f,
            w(&format!("{b}mlp.fc2.weight")),
            w(&format!("{b}mlp.fc2.bias")),
            D,
        );
        let ls2 = m
            .get(&format!("{b}ls2.gamma"))
            .map(|v| v.1.clone())
            .unwrap_or(vec![1.0; D]);
        x.iter_mut()
            .enumerate()
            .for_each(|(k, v)| *v += y[k] * ls2[k % D]);
    }
    let out = ln(&x, w("norm.weight"), w("norm.bias"));
    (out[..D].to_vec(), out[D..].to_vec(), cls_attn)
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn check(
    file: &str,
    named: &Named,
    meta: &Named,
    prefix: &str,
    eps: f32,
    hf_config: Option<&str>,
    layer_scale: bool,
) {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join(file);
    write_safetensors(&path, named, prefix, false);
    if let Some(cfg) = hf_config {
        std::fs::write(tmp.path().join("config.json"), cfg).unwrap();
    }
    let (dir, cfg) = import::import_file(&path, "tiny", &tmp.path().join("models")).unwrap();
    assert_eq!(
        (
            cfg.hidden_size,
            cfg.depth,
            cfg.num_heads,
            cfg.patch_size,
            cfg.pos_grid
        ),
        (D, DEPTH, HEADS, P, G)
    );
    assert_eq!(cfg.layer_scale, layer_scale);
    let vit = craterdex_model::load(&dir, Some(S)).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let image: Vec<f32> = (0..3 * S * S).map(|_| rng.gen_range(-2.0..2.0)).collect();
    let got = vit.forward(&[image.clone(), image.clone()]).unwrap();
    let (cls, patches, attn) = reference_forward(meta, &image, eps);
    for f in &got {
        assert!(
            max_abs(&f.cls, &cls) < 1e-4,
            "{file}: cls differs by {}",
            max_abs(&f.cls, &cls)
        );
        assert!(
            max_abs(&f.patches, &patches) < 1e-4,
            "{file}: patches differ by {}",
            max_abs(&f.patches, &patches)
        );
        assert!(
            max_abs(&f.attention, &attn) < 1e-5,
            "{file}: attention differs"
        );
    }
}

#[test]
fn meta_timm_layout_dinov2() {
    let meta = meta_checkpoint(true, 1);
    check(
        "dinov2_vits14_meta.safetensors",
        &meta,
        &meta,
        "",
        1e-6,
        Some(r#"{"num_heads": 2}"#),
        true,
    );
}

#[test]
fn meta_timm_layout_dino_v1_with_module_prefix() {
    let meta = meta_checkpoint(false, 2);
    check(
        "dino_meta.safetensors",
        &meta,
        &meta,
        "module.",
        1e-6,
        Some(r#"{"num_heads": 2}"#),
        false,
    );
}

#[test]
fn hf_dinov2_layout() {
    let meta = meta_checkpoint(true, 3);
    let cfg = r#"{"model_type": "dinov2", "num_attention_heads": 2, "layer_norm_eps": 1e-6}"#;
    check(
        "model.safetensors",
        &to_hf(&meta, true),
        &meta,
        "",
        1e-6,
        Some(cfg),
        true,
    );
}

#[test]
fn hf_vit_layout_dino_v1() {
    let meta = meta_checkpoint(false, 4);
    let cfg = r#"{"model_type": "vit", "num_attention_heads": 2, "layer_norm_eps": 1e-12}"#;
    check(
        "model.safetensors",
        &to_hf(&meta, false),
        &meta,
        "vit.",
        1e-12,
        Some(cfg),
        false,
    );
}

#[test]
fn bf16_checkpoints_are_read() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("m.safetensors");
    let meta = meta_checkpoint(true, 5);
    write_safetensors(&path, &meta, "", true);
    let (_, cfg) = import::import_file(&path, "tiny-bf16", tmp.path()).unwrap();
    assert_eq!(cfg.hidden_size, D);
}

#[test]
fn unknown_layout_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("x.safetensors");
    let mut m = Named::new();
    m.insert("foo.weight".into(), (vec![2], vec![1.0, 2.0]));
    write_safetensors(&path, &m, "", false);
    let err = format!(
        "{:#}",
        import::import_file(&path, "x", tmp.path()).unwrap_err()
    );
    assert!(
        err.contains("x.safetensors") && err.contains("unrecognised checkpoint layout"),
        "{err}"
    );
}

#[test]
fn transpose_is_its_own_inverse() {
    let a: Vec<f32> = (0..6).map(|v| v as f32).collect();
    assert_eq!(transpose(&transpose(&a, 2, 3), 3, 2), a);
    assert_eq!(transpose(&a, 2, 3), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
}
