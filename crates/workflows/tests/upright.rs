//! Dedup compares the crops of a source registered turned at the reference's orientation:
//! with a (tiny, generated) model, the turned source's rows are re-encoded turned.

use craterdex_engine::{Engine, Extractor, ModelOptions, Silent};
use craterdex_index::codec::{Codec, TokenCodec};
use craterdex_index::{ImageMeta, Index};
use craterdex_tokens::aggregate::{Aggregation, SeedStrategy};
use craterdex_tokens::{Descriptors, Encoder, FeatureRef, Recipe};
use craterdex_workflows::dedup::{frames_of_index, upright_engine};
use craterdex_workflows::{DedupOptions, LinkRule};
use image::{GrayImage, Luma};
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::sync::Arc;

/// An asymmetric crater-like crop: a dark bowl off centre and a bright rim on one side.
fn write_crop(path: &Path, seed: u64) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let (cx, cy, r) = (
        rng.gen_range(14.0..34.0),
        rng.gen_range(14.0..34.0),
        rng.gen_range(6.0..12.0),
    );
    let img = GrayImage::from_fn(48, 48, |x, y| {
        let (x, y) = (x as f64, y as f64);
        let d = (x - cx).hypot(y - cy);
        let v = if d < r {
            60.0
        } else if d < r + 3.0 && x > cx {
            220.0
        } else {
            110.0 + 2.0 * x - y
        };
        Luma([v.clamp(0.0, 255.0) as u8])
    });
    img.save(path).unwrap();
}

fn close(a: &Descriptors, b: &Descriptors) -> bool {
    let diff = |x: &[f32], y: &[f32]| {
        x.iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0.0, f32::max)
    };
    diff(&a.tokens, &b.tokens) < 0.02 && diff(&a.single, &b.single) < 0.02
}

#[test]
fn a_source_registered_turned_is_compared_at_the_reference_orientation() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let model_dir = craterdex_model::testing::import_tiny_model(root, "tiny", 32, 4, 4, 1);
    let vit = craterdex_model::load(&model_dir, Some(16)).unwrap();
    let extractor = Arc::new(Extractor::new(
        vit,
        &ModelOptions {
            cache: false,
            ..Default::default()
        },
    ));
    let fingerprint = extractor.fingerprint();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let field: Vec<(f64, f64, f64)> = (0..30)
        .map(|_| {
            (
                rng.gen_range(0.0..2000.0),
                rng.gen_range(0.0..2000.0),
                12.0 * (1.0 - rng.gen_range(0.0..0.9f64)).powf(-0.6),
            )
        })
        .collect();
    std::fs::create_dir_all(root.join("crops")).unwrap();
    let mut metas = Vec::new();
    for (i, &(x, y, d)) in field.iter().enumerate() {
        // obs1 sees every crater as the catalogue does; obs2 all but two, turned by 90
        // degrees in its own frame
        let views = [("obs1", (x, y)), ("obs2", (-y + 2500.0, x - 100.0))];
        for (s, (vx, vy)) in views {
            if s == "obs2" && i >= 28 {
                continue;
            }
            let path = root.join(format!("crops/{s}-{i}.png"));
            write_crop(&path, i as u64 + if s == "obs2" { 1000 } else { 0 });
            metas.push(ImageMeta {
                id: format!("{s}-{i}"),
                crater_id: Some(format!("c{i}")),
                source: Some(s.into()),
                x: Some(vx),
                y: Some(vy),
                diameter_px: Some(d),
                path: Some(path.display().to_string()),
                ..Default::default()
            });
        }
    }
    let encoder = Encoder::plain(Recipe {
        aggregation: Aggregation::Instance {
            seeds: SeedStrategy::Fps,
            k: 4,
            soft_m: 1,
        },
        whiten: false,
        ..Default::default()
    });
    let items: Vec<(String, std::path::PathBuf)> = metas
        .iter()
        .map(|m| (m.id.clone(), m.path.clone().unwrap().into()))
        .collect();
    let features = extractor.extract(&items, "crops", &Silent).unwrap();
    let entries: Vec<(ImageMeta, Descriptors)> = metas
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let (t, dim) = (features.tokens, features.dim);
            let desc = encoder.encode(FeatureRef {
                cls: &features.cls[i * dim..(i + 1) * dim],
                patches: &features.patches[i * t * dim..(i + 1) * t * dim],
                attention: &features.attention[i * t..(i + 1) * t],
            });
            (m.clone(), desc)
        })
        .collect();
    let codec = TokenCodec::train(Codec::F16, 32, &[], 0).unwrap();
    Index::create(
        &root.join("idx"),
        &encoder,
        &codec,
        Some(fingerprint),
        &entries,
        None,
    )
    .unwrap();
    let engine = Engine::new(Index::open(&root.join("idx")).unwrap(), Some(extractor)).unwrap();

    let rule = LinkRule::default();
    let frames = frames_of_index(engine.index(), &rule, &DedupOptions::default());
    let regs = frames.registrations();
    assert_eq!(regs.len(), 1, "obs1 (30 entries) is the reference");
    let deg = regs[0].rotation_deg.expect("obs2 registered");
    assert!((deg.abs() - 90.0).abs() < 0.5, "{:?}", regs[0]);

    let up = upright_engine(&engine, &frames, &Silent)
        .unwrap()
        .expect("crops turned");
    let (stored, turned) = (engine.index(), up.index());
    assert_eq!(turned.live(), stored.live());
    let row = |idx: &Index, id: &str| idx.row_of(id).unwrap();
    for i in [0, 7, 27] {
        let id = format!("obs2-{i}");
        let path = root.join(format!("crops/{id}.png"));
        let want = engine
            .encode_turned(&[(id.clone(), path)], deg.to_radians() as f32)
            .unwrap()
            .pop()
            .unwrap();
        let got = turned.descriptors_of(row(turned, &id));
        assert!(
            close(&got, &want),
            "{id}: not the turned crop's descriptors"
        );
        assert!(!close(&got, &stored.descriptors_of(row(stored, &id))));
        let id = format!("obs1-{i}");
        assert!(close(
            &turned.descriptors_of(row(turned, &id)),
            &stored.descriptors_of(row(stored, &id))
        ));
    }
    // without a model, or without a turned source, nothing is re-encoded
    let bare = Engine::new(Index::open(&root.join("idx")).unwrap(), None).unwrap();
    assert!(upright_engine(&bare, &frames, &Silent).unwrap().is_none());
    let none = craterdex_workflows::Frames::none();
    assert!(upright_engine(&engine, &none, &Silent).unwrap().is_none());
}
