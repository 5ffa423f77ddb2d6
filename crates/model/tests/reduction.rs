//! Token reduction: which tokens go on past the middle block, and what the others keep.

use craterdex_model::testing::write_tiny_checkpoint_of_depth;
use craterdex_model::Precision;

fn images(n: usize, size: usize) -> Vec<Vec<f32>> {
    (0..n)
        .map(|i| {
            (0..3 * size * size)
                .map(|j| (((i * 31 + j * 7) % 97) as f32 / 97.0 - 0.5) * 2.0)
                .collect()
        })
        .collect()
}

#[test]
fn reduced_passes_drop_the_least_attended_tokens_after_the_middle_block() {
    let root = tempfile::tempdir().unwrap();
    // 4 blocks, a 6 x 6 grid of 4-px patches
    let ckpt = write_tiny_checkpoint_of_depth(&root.path().join("ckpt"), 16, 4, 6, 4);
    let (model, _) =
        craterdex_model::import::import_file(&ckpt, "tiny", &root.path().join("models")).unwrap();
    let dir = model.as_path();
    let full = craterdex_model::load(dir, Some(24)).unwrap();
    let n = full.num_patches();
    let ims = images(3, 24);
    let all = full.forward(&ims).unwrap();
    let same = craterdex_model::load(dir, Some(24))
        .unwrap()
        .with_token_reduction(1.0)
        .unwrap();
    assert_eq!(
        same.forward(&ims).unwrap(),
        all,
        "keeping every token changes nothing"
    );
    assert_eq!(same.features_fingerprint(), full.features_fingerprint());

    let half = craterdex_model::load(dir, Some(24))
        .unwrap()
        .with_token_reduction(0.5)
        .unwrap();
    assert_ne!(half.features_fingerprint(), full.features_fingerprint());
    assert!(half.flops_per_image() < full.flops_per_image());
    let reduced = half.forward(&ims).unwrap();
    // the same batch one image at a time: images do not see each other's choices
    for (i, r) in reduced.iter().enumerate() {
        assert_eq!(&half.forward(&ims[i..=i]).unwrap()[0], r);
        let zero = r.attention.iter().filter(|&&a| a == 0.0).count();
        assert_eq!(zero, n - n / 2, "dropped patches get no attention");
        let sum: f32 = r.attention.iter().sum();
        assert!(
            sum > 0.0 && sum <= 1.0 + 1e-5,
            "CLS attention to the kept patches: {sum}"
        );
        assert_eq!(r.patches.len(), all[i].patches.len());
        assert_ne!(
            r.cls, all[i].cls,
            "CLS saw fewer tokens in the later blocks"
        );
    }
    assert!(craterdex_model::load(dir, Some(24))
        .unwrap()
        .with_token_reduction(0.0)
        .is_err());

    // int8 reduces the same way
    let int8 = craterdex_model::load(dir, Some(24))
        .unwrap()
        .with_precision(Precision::Int8)
        .unwrap()
        .with_token_reduction(0.5)
        .unwrap();
    let r8 = int8.forward(&ims).unwrap();
    assert_eq!(
        r8[0].attention.iter().filter(|&&a| a == 0.0).count(),
        n - n / 2
    );
}

#[test]
fn patch_tokens_from_an_earlier_block_keep_the_whole_pass_cls() {
    let root = tempfile::tempdir().unwrap();
    let ckpt = write_tiny_checkpoint_of_depth(&root.path().join("ckpt"), 16, 4, 6, 4);
    let (dir, _) =
        craterdex_model::import::import_file(&ckpt, "tiny", &root.path().join("models")).unwrap();
    let load = || craterdex_model::load(&dir, Some(24)).unwrap();
    let ims = images(2, 24);
    let full = load().forward(&ims).unwrap();
    let last = load().with_patch_block(Some(4)).unwrap();
    assert_eq!(
        last.forward(&ims).unwrap(),
        full,
        "the last block is the default"
    );
    assert_eq!(last.features_fingerprint(), load().features_fingerprint());

    let second = load().with_patch_block(Some(2)).unwrap();
    assert!(second.features_fingerprint().ends_with("@b2"));
    let got = second.forward(&ims).unwrap();
    // CLS and attention come from the whole pass, the patches do not
    for (g, f) in got.iter().zip(&full) {
        assert_eq!((&g.cls, &g.attention), (&f.cls, &f.attention));
        assert_ne!(g.patches, f.patches);
        assert_eq!(g.patches.len(), f.patches.len());
    }
    // deterministic, image by image
    assert_eq!(second.forward(&ims[1..]).unwrap()[0], got[1]);
    for bad in [0, 5] {
        assert!(load().with_patch_block(Some(bad)).is_err(), "block {bad}");
    }
    // token reduction after block 2 of 4: patches from blocks 1-2 only
    let reduced = load().with_token_reduction(0.5).unwrap();
    assert!(reduced.with_patch_block(Some(3)).is_err());
    let both = load()
        .with_token_reduction(0.5)
        .unwrap()
        .with_patch_block(Some(2))
        .unwrap();
    assert!(both.features_fingerprint().ends_with("~keep0.5@b2"));
    let b = both.forward(&ims).unwrap();
    for (b, g) in b.iter().zip(&got) {
        assert_eq!(
            b.patches, g.patches,
            "patches are taken before tokens are dropped"
        );
        assert_ne!(b.cls, g.cls);
    }
}
