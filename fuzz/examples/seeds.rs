//! Writes the committed seed corpus, `fuzz/seeds/<target>/`, from real craterdex outputs
//! and small examples of every accepted layout: `cargo run --release --example seeds` in
//! `fuzz/`. Seeds are named by content, so rerunning adds nothing that is already there.

use craterdex_fuzz::{index_templates, unit, D};
use craterdex_tokens::{Encoder, FeatureRef, Recipe};
use image::{DynamicImage, ImageFormat};
use std::path::Path;

fn seed(target: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("seeds")
        .join(target);
    std::fs::create_dir_all(&dir).unwrap();
    let name = craterdex_model::store::sha256_hex(bytes);
    std::fs::write(dir.join(&name[..16]), bytes).unwrap();
}

fn joined(a: &[u8], b: &[u8]) -> Vec<u8> {
    [a, &[0], b].concat()
}

fn safetensors(tensors: &[(&str, Vec<usize>, &[f32])]) -> Vec<u8> {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, values)| values.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), b)
                    .unwrap();
            (name.to_string(), view)
        })
        .collect();
    safetensors::serialize(views, &None).unwrap()
}

fn index_files() {
    for (t, files) in index_templates().iter().enumerate() {
        for (i, (_, bytes)) in files.iter().enumerate() {
            let pick = ((i << 1) | t) as u8;
            seed("index_files", &[&[pick], bytes.as_slice()].concat());
        }
    }
}

fn encoders() {
    for files in index_templates() {
        for (path, bytes) in files {
            if path.ends_with("encoder.json") {
                seed("encoder", bytes);
            }
        }
    }
    let t = 24;
    let feats: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = (0..40)
        .map(|i| {
            (
                unit(i, 1),
                unit(500 + i, t),
                (0..t).map(|j| j as f32 / t as f32).collect(),
            )
        })
        .collect();
    let refs: Vec<FeatureRef> = feats
        .iter()
        .map(|(cls, patches, attention)| FeatureRef {
            cls,
            patches,
            attention,
        })
        .collect();
    let recipe = Recipe {
        whiten_dim: Some(D / 2),
        ..Recipe::default()
    };
    let learned = Encoder::learn(recipe, &refs, 1).unwrap();
    seed("encoder", &serde_json::to_vec(&learned).unwrap());
}

fn bench_manifests() {
    let entry = |id: &str, crater: &str, view: &str| {
        serde_json::json!({"image_id": id, "path": format!("images/gallery/{id}.jpg"),
                           "crater_id": crater, "view_type": view})
    };
    let manifest = serde_json::json!({
        "split_name": "test", "version": "release_v1",
        "gallery_images": [entry("01-1-000001_2x", "01-1-000001", "2x"),
                           entry("01-1-000001_3x", "01-1-000001", "3x"),
                           entry("01-1-000002_2x", "01-1-000002", "2x")],
        "query_images": [{"image_id": "q1", "path": "images/query/q1.jpg",
                          "crater_id": "01-1-000001", "relevant_crater_ids": ["01-1-000001"],
                          "lat": -12.5, "lon": 140.25, "diameter_km": 3.5}]
    });
    let m = serde_json::to_vec_pretty(&manifest).unwrap();
    seed("bench_manifest", &m);
    for relevance in [
        serde_json::json!({"filtered": {"01-1-000001": ["01-1-000001", "01-1-000002"]}}),
        serde_json::json!([{"query_crater_id": "01-1-000001", "relevant_crater_ids": ["01-1-000002"]}]),
    ] {
        seed(
            "bench_manifest",
            &joined(&m, &serde_json::to_vec(&relevance).unwrap()),
        );
    }
}

fn catalogues() {
    for text in [
        "long,lat,diameter\n12.5,40.25,9.0\n100,3,15.5\n",
        "ID,X,Y,W,H,C_X,CY\n395,350.0,738.0,7.0,7.0,354.0,742.0\n396,694.0,164.0,7.0,7.0,698.0,168.0\n",
        "ID\tX\tY\tW\tH\tC_X\tCY\n1\t10\t20\t8\t8\t14\t24\n",
        "CRATER_ID,LAT_CIRC_IMG,LON_CIRC_IMG,DIAM_CIRC_IMG\n01-1-000001,-12.5,140.25,3.5\n",
        "id,lat,lon,diameter_km\nc1,10.0,-170.5,1.25\nc2,-89.9,359.9,250\n",
    ] {
        seed("catalogue", text.as_bytes());
    }
}

fn feature_bodies() {
    let (t, d) = (3usize, 4usize);
    let cls: Vec<f32> = (0..d).map(|i| i as f32 * 0.5).collect();
    let patches: Vec<f32> = (0..t * d).map(|i| (i as f32).sin()).collect();
    let attention: Vec<f32> = vec![0.2, 0.3, 0.5];
    let rows: Vec<Vec<f32>> = patches.chunks(d).map(<[f32]>::to_vec).collect();
    for p in [serde_json::json!(patches), serde_json::json!(rows)] {
        let body = serde_json::json!({"cls": cls, "patches": p, "attention": attention});
        seed("feature_body", &serde_json::to_vec(&body).unwrap());
    }
    seed(
        "feature_body",
        &safetensors(&[
            ("cls", vec![1, d], &cls),
            ("patch_tokens", vec![1, t, d], &patches),
            ("attention", vec![1, t], &attention),
        ]),
    );
}

fn images() {
    let rgb = image::RgbImage::from_fn(20, 14, |x, y| {
        image::Rgb([(x * 12) as u8, (y * 18) as u8, 90])
    });
    let gray16 = image::ImageBuffer::<image::Luma<u16>, _>::from_fn(9, 9, |x, y| {
        image::Luma([(x * y * 800) as u16])
    });
    for (img, format) in [
        (DynamicImage::ImageRgb8(rgb.clone()), ImageFormat::Png),
        (DynamicImage::ImageRgb8(rgb.clone()), ImageFormat::Jpeg),
        (DynamicImage::ImageRgb8(rgb.clone()), ImageFormat::Tiff),
        (DynamicImage::ImageRgb8(rgb), ImageFormat::Pnm),
        (DynamicImage::ImageLuma16(gray16.clone()), ImageFormat::Png),
        (DynamicImage::ImageLuma16(gray16), ImageFormat::Tiff),
    ] {
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, format).unwrap();
        seed("image", out.get_ref());
    }
    seed("image", b"P2\n3 2\n255\n0 128 255\n255 128 0\n");
}

fn checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let weights = craterdex_model::testing::write_tiny_checkpoint(tmp.path(), 8, 4, 2);
    let weights = std::fs::read(weights).unwrap();
    let config = br#"{"model_type": "dinov2", "hidden_size": 8, "num_attention_heads": 2, "patch_size": 4, "image_size": 8, "layer_norm_eps": 1e-6}"#;
    seed("checkpoint", &joined(config, &weights));
    seed("checkpoint", &joined(b"", &weights));
}

fn main() {
    index_files();
    encoders();
    bench_manifests();
    catalogues();
    feature_bodies();
    images();
    checkpoints();
    println!("seeds written under {}/seeds", env!("CARGO_MANIFEST_DIR"));
}
