//! `link_images` registers a new image whose detections' crater pattern alone is not
//! significant (a few true detections among many false ones) once the catalogue's craters,
//! cut where a proposed transform places them, look like themselves: transforms the pattern
//! proposed, or else transforms proposed by the detections' own appearance. With a (tiny,
//! generated) model whose crops of one crater are alike.

use craterdex_detect::{Detection, GrayImage};
use craterdex_engine::{Engine, Extractor, ModelOptions, Silent};
use craterdex_index::codec::{Codec, TokenCodec};
use craterdex_index::{ImageMeta, Index};
use craterdex_tokens::aggregate::{Aggregation, SeedStrategy};
use craterdex_tokens::{Descriptors, Encoder, FeatureRef, Recipe};
use craterdex_workflows::{
    link_images, ImageLinkOptions, ImageLinks, LinkOptions, LinkRule, ObservedImage,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::Path;
use std::sync::Arc;

const SIDE: usize = 640;

/// Craters (x, y, diameter) apart from each other and with room for a crop of twice their
/// diameter, each with its own look: a rim lit from its own side, a bowl of its own depth.
fn scene(rng: &mut impl Rng, n: usize) -> Vec<(f64, f64, f64, f64, f64)> {
    let mut out: Vec<(f64, f64, f64, f64, f64)> = Vec::new();
    while out.len() < n {
        let d: f64 = rng.gen_range(18.0..40.0);
        let (x, y) = (
            rng.gen_range(d..SIDE as f64 - d).round(),
            rng.gen_range(d..SIDE as f64 - d).round(),
        );
        if out
            .iter()
            .all(|c| (c.0 - x).hypot(c.1 - y) > (c.2 + d) / 2.0 + 12.0)
        {
            let lit = rng.gen_range(0.0..std::f64::consts::TAU);
            out.push((x, y, d.round(), lit, rng.gen_range(20.0..90.0)));
        }
    }
    out
}

fn render(craters: &[(f64, f64, f64, f64, f64)]) -> Vec<u8> {
    let mut pixels = vec![0u8; SIDE * SIDE];
    for (i, p) in pixels.iter_mut().enumerate() {
        let (x, y) = ((i % SIDE) as f64, (i / SIDE) as f64);
        let mut v = 120.0 + 20.0 * (x / 37.0).sin() * (y / 53.0).cos();
        for &(cx, cy, d, lit, bowl) in craters {
            let (dx, dy) = (x - cx, y - cy);
            let r = dx.hypot(dy) / (d / 2.0);
            if r < 0.8 {
                v = bowl + 30.0 * (dx * lit.cos() + dy * lit.sin()) / d;
            } else if r < 1.0 {
                let facing = (dx * lit.cos() + dy * lit.sin()) / dx.hypot(dy).max(1e-9);
                v = 150.0 + 100.0 * facing;
            }
        }
        *p = v.clamp(0.0, 255.0) as u8;
    }
    pixels
}

type Scene = Vec<(f64, f64, f64, f64, f64)>;

/// The catalogue of a generated scene (a crop of two diameters of each of its 36 craters)
/// indexed with a tiny model under `root`, the engine over it, the scene, the scene turned a
/// quarter as a second observation, and the random source the scene was drawn from.
fn catalogue_and_second_view(root: &Path) -> (Engine, Scene, GrayImage, ChaCha8Rng) {
    let model_dir = craterdex_model::testing::import_tiny_model(root, "tiny", 32, 4, 4, 1);
    let vit = craterdex_model::load(&model_dir, Some(16)).unwrap();
    let extractor = Arc::new(Extractor::new(
        vit,
        &ModelOptions {
            cache: false,
            ..Default::default()
        },
    ));
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let craters = scene(&mut rng, 36);
    let first = image::GrayImage::from_raw(SIDE as u32, SIDE as u32, render(&craters)).unwrap();

    // the catalogue: a crop of two diameters of every crater, with its place
    std::fs::create_dir_all(root.join("crops")).unwrap();
    let mut metas = Vec::new();
    for (i, &(x, y, d, _, _)) in craters.iter().enumerate() {
        let path = root.join(format!("crops/c{i}.png"));
        let (x0, y0, side) = ((x - d) as u32, (y - d) as u32, 2 * d as u32);
        image::imageops::crop_imm(&first, x0, y0, side, side)
            .to_image()
            .save(&path)
            .unwrap();
        metas.push(ImageMeta {
            id: format!("c{i}"),
            crater_id: Some(format!("c{i}")),
            source: Some("catalogue".into()),
            x: Some(x),
            y: Some(y),
            diameter_px: Some(d),
            path: Some(path.display().to_string()),
            ..Default::default()
        });
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
    let (t, dim) = (features.tokens, features.dim);
    let entries: Vec<(ImageMeta, Descriptors)> = metas
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let desc = encoder.encode(FeatureRef {
                cls: &features.cls[i * dim..(i + 1) * dim],
                patches: &features.patches[i * t * dim..(i + 1) * t * dim],
                attention: &features.attention[i * t..(i + 1) * t],
            });
            (m.clone(), desc)
        })
        .collect();
    let codec = TokenCodec::train(Codec::F16, 32, &[], 0).unwrap();
    let fingerprint = extractor.fingerprint();
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

    // the second observation: the scene turned a quarter, (x, y) -> (y, SIDE - 1 - x)
    let pixels = first.as_raw();
    let second = GrayImage {
        width: SIDE,
        height: SIDE,
        pixels: (0..SIDE * SIDE)
            .map(|i| {
                let (tx, ty) = (i % SIDE, i / SIDE);
                pixels[tx * SIDE + (SIDE - 1 - ty)]
            })
            .collect(),
    };
    (engine, craters, second, rng)
}

/// Where the second observation shows the scene's point (x, y).
fn turn(x: f64, y: f64) -> (f64, f64) {
    (y, SIDE as f64 - 1.0 - x)
}

/// Detections of the second observation: the craters `found` (in its pixels) and `false_ones`
/// more where no crater is.
fn detections(
    craters: &Scene,
    found: &[usize],
    false_ones: usize,
    rng: &mut ChaCha8Rng,
) -> Vec<Detection> {
    let mut out: Vec<Detection> = found
        .iter()
        .map(|&i| {
            let (x, y) = turn(craters[i].0, craters[i].1);
            Detection {
                x,
                y,
                diameter: craters[i].2,
                score: 0.9,
                scale: 1.0,
            }
        })
        .collect();
    while out.len() < found.len() + false_ones {
        let (x, y) = (
            rng.gen_range(20.0..SIDE as f64 - 20.0),
            rng.gen_range(20.0..SIDE as f64 - 20.0),
        );
        let clear = craters.iter().all(|c| {
            let (u, v) = turn(c.0, c.1);
            (u - x).hypot(v - y) > c.2
        });
        if clear {
            out.push(Detection {
                x,
                y,
                diameter: rng.gen_range(18.0f64..40.0).round(),
                score: 0.5,
                scale: 1.0,
            });
        }
    }
    out
}

fn link(
    engine: &Engine,
    second: &GrayImage,
    detections: Vec<Detection>,
    o: &ImageLinkOptions,
) -> ImageLinks {
    let observed = [ObservedImage {
        source: "second".into(),
        image: second,
        detections,
    }];
    link_images(
        engine,
        &observed,
        &LinkRule::default(),
        &LinkOptions::default(),
        o,
        &Silent,
    )
    .unwrap()
}

/// The second observation's registration: registered a quarter turn, confirmed by appearance
/// (proposed by `proposed_by`) within the registration's false-alarm bound; and then every
/// catalogue crater the detector missed looked for where it lies, most linked there (the
/// tiny model tells fewer apart than a real one).
fn assert_confirmed(linked: &ImageLinks, found: usize, proposed_by: &str) {
    let reg = linked.images[0].registration.clone().unwrap();
    assert!(reg.registered, "{reg:?}");
    assert!(
        (reg.rotation_deg.unwrap().abs() - 90.0).abs() < 1.0,
        "{reg:?}"
    );
    let why = reg.reason.clone().unwrap_or_default();
    assert!(why.starts_with("confirmed by appearance"), "{why}");
    assert!(why.contains(&format!("proposed by {proposed_by}")), "{why}");
    assert!(reg.false_alarm.unwrap() <= 1e-6, "{reg:?}");
    assert_eq!(
        linked.images[0].looked_for,
        36 - found,
        "{:?}",
        linked.images[0]
    );
    let matched = linked
        .craters
        .iter()
        .filter(|c| c.decision.name() == "match")
        .count();
    assert!(matched >= 24, "{matched} of 36 matched");
}

#[test]
fn an_image_whose_pattern_alone_is_not_enough_registers_by_its_craters_appearance() {
    let tmp = tempfile::tempdir().unwrap();
    let (engine, craters, second, mut rng) = catalogue_and_second_view(tmp.path());
    // the detector found the seven craters nearest one place, and 45 false ones
    let mut by_distance: Vec<usize> = (0..craters.len()).collect();
    by_distance.sort_by(|&a, &b| {
        let dist = |i: usize| (craters[i].0 - 200.0).hypot(craters[i].1 - 200.0);
        dist(a).total_cmp(&dist(b))
    });
    let found = detections(&craters, &by_distance[..7], 45, &mut rng);
    // the crater pattern alone proposes a transform and rejects it
    let alone = ImageLinkOptions {
        look_in_place: false,
        ..Default::default()
    };
    let unconfirmed = link(&engine, &second, found.clone(), &alone);
    let reg = unconfirmed.images[0].registration.clone().unwrap();
    assert!(!reg.registered, "{reg:?}");
    assert_eq!(unconfirmed.images[0].looked_for, 0);
    // the catalogue's craters where that transform puts them confirm it
    let linked = link(&engine, &second, found, &ImageLinkOptions::default());
    assert_confirmed(&linked, 7, "the crater pattern");
}

#[test]
fn an_image_whose_pattern_proposes_nothing_right_registers_by_its_detections_appearance() {
    let tmp = tempfile::tempdir().unwrap();
    let (engine, craters, second, mut rng) = catalogue_and_second_view(tmp.path());
    // seven craters far from each other (no two neighbours: no pattern key in common with
    // the catalogue), among 45 false detections
    let mut apart: Vec<usize> = vec![0];
    while apart.len() < 7 {
        let far = (0..craters.len())
            .max_by(|&a, &b| {
                let nearest = |i: usize| {
                    apart
                        .iter()
                        .map(|&j| (craters[i].0 - craters[j].0).hypot(craters[i].1 - craters[j].1))
                        .fold(f64::INFINITY, f64::min)
                };
                nearest(a).total_cmp(&nearest(b))
            })
            .unwrap();
        apart.push(far);
    }
    let found = detections(&craters, &apart, 45, &mut rng);
    let linked = link(&engine, &second, found, &ImageLinkOptions::default());
    assert_confirmed(&linked, 7, "the detections' appearance");
}
