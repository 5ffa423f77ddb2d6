//! Multi-scale extraction: a crop seen at the model's input size and at extra sizes, the
//! features of every size pooled into one set.

use craterdex_model::extract::{features_of_tensors, ImageTensors};
use craterdex_model::preprocess::{to_tensors_at_each_size, ResizeMode};
use craterdex_model::testing::import_tiny_model;
use image::{DynamicImage, Rgb, RgbImage};

fn crop(seed: u32) -> DynamicImage {
    DynamicImage::ImageRgb8(RgbImage::from_fn(40, 36, |x, y| {
        let v = ((x * 7 + y * 13 + seed * 29) % 251) as u8;
        Rgb([v, v / 2 + 40, 255 - v])
    }))
}

#[test]
fn extra_sizes_pool_each_size_forward_pass_into_one_feature_set() {
    let root = tempfile::tempdir().unwrap();
    // 2 blocks, 4-px patches, position embeddings on a 6 x 6 grid
    let model = import_tiny_model(root.path(), "tiny", 16, 4, 6, 2);
    let dir = model.as_path();
    let one = craterdex_model::load(dir, Some(24)).unwrap();
    let other = craterdex_model::load(dir, Some(32)).unwrap();
    let both = craterdex_model::load(dir, Some(24))
        .unwrap()
        .with_extra_sizes(&[32])
        .unwrap();
    assert_eq!(both.input_sizes(), [24, 32]);
    assert_eq!(both.patches_per_view(), 36 + 64);
    assert_eq!(both.num_patches(), 36, "the model's own size comes first");
    assert_ne!(both.features_fingerprint(), one.features_fingerprint());
    assert!(both.features_fingerprint().ends_with("&32"));
    let flops = one.flops_per_image() + other.flops_per_image();
    assert!((both.flops_per_image() - flops).abs() < 1e-6 * flops);

    let prep = both.preprocess(ResizeMode::Squash);
    assert_eq!(prep.extra_sizes, [32]);
    let crops: Vec<DynamicImage> = (0..3).map(crop).collect();
    let tensors: Vec<ImageTensors> = crops
        .iter()
        .map(|c| to_tensors_at_each_size(c, &prep))
        .collect();
    let pooled = features_of_tensors(&both, tensors.clone(), 1).unwrap();
    assert_eq!(pooled.len(), 3);
    let small = one
        .forward(&tensors.iter().map(|t| t[0][0].clone()).collect::<Vec<_>>())
        .unwrap();
    let large = other
        .forward(&tensors.iter().map(|t| t[1][0].clone()).collect::<Vec<_>>())
        .unwrap();
    for ((p, s), l) in pooled.iter().zip(&small).zip(&large) {
        assert_eq!(p.patches.len(), (36 + 64) * 16);
        assert_eq!(
            &p.patches[..36 * 16],
            &s.patches[..],
            "the model's size first"
        );
        assert_eq!(&p.patches[36 * 16..], &l.patches[..], "then the extra size");
        for ((c, a), b) in p.cls.iter().zip(&s.cls).zip(&l.cls) {
            assert!((c - (a + b) / 2.0).abs() < 1e-6, "CLS is the sizes' mean");
        }
        let total: f32 = p.attention.iter().sum();
        assert!(
            total > 0.0 && total <= 1.0 + 1e-5,
            "attention keeps its total"
        );
    }

    // one size only: exactly the plain forward pass
    let plain = features_of_tensors(
        &one,
        tensors.iter().map(|t| vec![t[0].clone()]).collect(),
        1,
    )
    .unwrap();
    assert_eq!(plain, small);
}

#[test]
fn extra_sizes_are_checked() {
    let root = tempfile::tempdir().unwrap();
    let model = import_tiny_model(root.path(), "tiny", 16, 4, 6, 2);
    let load = || craterdex_model::load(model.as_path(), Some(24)).unwrap();
    for bad in [vec![24], vec![32, 32], vec![2], vec![5000]] {
        let err = load().with_extra_sizes(&bad).err();
        assert!(err.is_some(), "{bad:?} accepted");
    }
    // a batch at a size the model was not given is refused, not misread
    let at_40 = vec![vec![0f32; 3 * 40 * 40]];
    let msg = load().forward(&at_40).unwrap_err().to_string();
    assert!(msg.contains("input sizes"), "{msg}");
    assert!(load()
        .with_extra_sizes(&[40])
        .unwrap()
        .forward(&at_40)
        .is_ok());
}
