//! Token reduction: which tokens go on past the middle block, and what the others keep.

use craterdex_model::testing::import_tiny_model;
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
    let model = import_tiny_model(root.path(), "tiny", 16, 4, 6, 4);
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
fn a_truncated_backbone_is_the_first_blocks_of_the_whole() {
    let root = tempfile::tempdir().unwrap();
    let import =
        |depth: usize| import_tiny_model(root.path(), &format!("tiny{depth}"), 16, 4, 6, depth);
    let (deep, shallow) = (import(4), import(2));
    let load = |dir: &std::path::Path| craterdex_model::load(dir, Some(24)).unwrap();
    let ims = images(2, 24);
    let full = load(&deep).forward(&ims).unwrap();
    let all = load(&deep).with_blocks(Some(4)).unwrap();
    assert_eq!(all.forward(&ims).unwrap(), full, "every block");
    assert_eq!(
        all.features_fingerprint(),
        load(&deep).features_fingerprint()
    );

    // two of four blocks: exactly the two-block model's pass (its first two blocks)
    let two = load(&deep).with_blocks(Some(2)).unwrap();
    let got = two.forward(&ims).unwrap();
    assert_eq!(got, load(&shallow).forward(&ims).unwrap());
    for (g, f) in got.iter().zip(&full) {
        assert_ne!(
            (&g.cls, &g.patches, &g.attention),
            (&f.cls, &f.patches, &f.attention)
        );
    }
    assert!(two.features_fingerprint().ends_with("@b2"));
    assert!(two.flops_per_image() < all.flops_per_image());
    assert_eq!(two.flops_of_whole_model(), all.flops_per_image());
    assert_eq!(two.flops_of_every_token(), two.flops_per_image());
    assert!(two.flops_of_every_token() < all.flops_of_every_token());
    // the default runs two thirds of the blocks
    let default = load(&deep).with_blocks(None).unwrap();
    assert_eq!(default.blocks_run(), craterdex_model::retrieval_blocks(4));
    assert_eq!(craterdex_model::retrieval_blocks(12), 8);
    for bad in [0, 5] {
        assert!(load(&deep).with_blocks(Some(bad)).is_err(), "blocks {bad}");
    }
    // token reduction after the middle of the blocks run
    let both = load(&deep)
        .with_blocks(Some(2))
        .unwrap()
        .with_token_reduction(0.5)
        .unwrap();
    assert!(both.features_fingerprint().ends_with("~keep0.5@b2"));
    let b = both.forward(&ims).unwrap();
    let n = both.num_patches();
    assert_eq!(
        b[0].attention.iter().filter(|&&a| a == 0.0).count(),
        n - n / 2
    );
}
