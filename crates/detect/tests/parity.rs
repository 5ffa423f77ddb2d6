//! pycda's U-Net run natively against the Keras model's own outputs on real crater images
//! (a lunar NAC crop and a crop of pycda's Mars tile; fixtures made by
//! scripts/make_detect_fixtures.py with tf-keras).

use craterdex_detect::{read_detector_dir, FeatureMap};
use craterdex_model::Precision;
use std::path::PathBuf;

fn detector() -> Option<PathBuf> {
    match craterdex_fetch::fetch_pycda_unet(false) {
        Ok(dir) => Some(dir),
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("pycda's detector unavailable under CI: {e:#}")
        }
        Err(e) => {
            craterdex_testkit::skip(
                "detect::parity",
                &format!("pycda's detector unavailable ({e:#})"),
            );
            None
        }
    }
}

/// Worst absolute difference, and the share of pixels on the same side of 0.5, over both
/// crops.
fn compare(precision: Precision) -> Option<(f32, f64)> {
    let dir = detector()?;
    let (config, net) = read_detector_dir(&dir).unwrap();
    let net = net.with_precision(precision).unwrap();
    let fixtures =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/unet_reference.safetensors");
    let bytes = std::fs::read(&fixtures).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (input, output) = (st.tensor("input").unwrap(), st.tensor("output").unwrap());
    let (n, side, out) = (input.shape()[0], input.shape()[1], output.shape()[1]);
    assert_eq!(
        (side, config.tile, config.output().unwrap().0),
        (256, 256, out)
    );
    let want: Vec<f32> = output
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let (mut worst, mut same, mut total) = (0f32, 0usize, 0usize);
    for i in 0..n {
        let pixels = &input.data()[i * side * side..(i + 1) * side * side];
        let map = FeatureMap {
            height: side,
            width: side,
            channels: 1,
            data: pixels
                .iter()
                .map(|&p| p as f32 * config.input_scale)
                .collect(),
        };
        let got = net.forward(map).unwrap();
        assert_eq!((got.height, got.width, got.channels), (out, out, 1));
        for (g, w) in got
            .data
            .iter()
            .zip(&want[i * out * out..(i + 1) * out * out])
        {
            worst = worst.max((g - w).abs());
            same += usize::from((*g > 0.5) == (*w > 0.5));
            total += 1;
        }
    }
    Some((worst, same as f64 / total as f64))
}

#[test]
fn f32_likelihoods_match_keras_on_real_crater_images() {
    let Some((worst, agree)) = compare(Precision::F32) else {
        return;
    };
    eprintln!(
        "f32 at {}: worst difference {worst:.2e}, same side of 0.5 {agree:.6}",
        craterdex_kernels::active()
    );
    assert!(worst <= 1e-4, "worst likelihood difference {worst}");
    assert!(agree >= 0.9999, "pixels on the same side of 0.5: {agree}");
}

#[test]
fn bf16_likelihoods_stay_close_to_keras() {
    if !craterdex_kernels::bf16::available() {
        craterdex_testkit::skip(
            "detect::parity::bf16",
            &format!("no bf16 at the {} level", craterdex_kernels::active()),
        );
        return;
    }
    stays_close(Precision::Bf16);
}

/// int8 (the layers of 64 input channels or more; the narrower in bf16 or f32) on every
/// kernel level: each pixel quantised per group of 64 channels, each filter per output.
#[test]
fn int8_likelihoods_stay_close_to_keras() {
    stays_close(Precision::Int8);
}

/// A reduced precision's likelihoods within 0.1 of Keras', and 99.5% of the pixels on the
/// same side of 0.5.
fn stays_close(precision: Precision) {
    let Some((worst, agree)) = compare(precision) else {
        return;
    };
    eprintln!(
        "{precision} at {}: worst difference {worst:.2e}, same side of 0.5 {agree:.6}",
        craterdex_kernels::active()
    );
    assert!(worst <= 0.1, "worst likelihood difference {worst}");
    assert!(agree >= 0.995, "pixels on the same side of 0.5: {agree}");
}

/// A pyramid level smaller than the U-Net's own output runs in the smallest tile that covers
/// it (`tile_for`), and that changes nothing it reports: a tile smaller by whole steps keeps
/// its outputs on the same grid of the poolings, so the top-left part of a real crater
/// crop's likelihood is the likelihood of the crop's top-left part. Not bit for bit: where a
/// 3x3 convolution's block of 4 x 4 outputs (Winograd's, in f32) reaches past the smaller
/// map's edge, the sums of the outputs inside it are rounded otherwise.
#[test]
fn a_smaller_tile_gives_the_same_likelihood_where_it_reaches() {
    let Some(dir) = detector() else {
        return;
    };
    let (config, net) = read_detector_dir(&dir).unwrap();
    let (own, _) = config.output().unwrap();
    assert_eq!(config.tile_for(141, 1024).unwrap(), (232, 148));
    assert_eq!(config.tile_for(35, 1024).unwrap(), (120, 36));
    assert_eq!(config.tile_for(own, 1024).unwrap(), (config.tile, own));
    assert_eq!(config.tile_for(800, 1024).unwrap(), (888, 804));
    let fixtures =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/unet_reference.safetensors");
    let bytes = std::fs::read(&fixtures).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let input = st.tensor("input").unwrap();
    let side = input.shape()[1];
    let pixels: Vec<f32> = input.data()[..side * side]
        .iter()
        .map(|&p| p as f32 * config.input_scale)
        .collect();
    let whole = net
        .forward(FeatureMap {
            height: side,
            width: side,
            channels: 1,
            data: pixels.clone(),
        })
        .unwrap();
    let (tile, out) = config.tile_for(100, 1024).unwrap();
    assert!(tile < side && out >= 100);
    let part: Vec<f32> = (0..tile)
        .flat_map(|y| pixels[y * side..y * side + tile].iter().copied())
        .collect();
    let small = net
        .forward(FeatureMap {
            height: tile,
            width: tile,
            channels: 1,
            data: part,
        })
        .unwrap();
    assert_eq!((small.height, small.width), (out, out));
    let mut worst = 0f32;
    for y in 0..out {
        for (s, w) in small.data[y * out..(y + 1) * out]
            .iter()
            .zip(&whole.data[y * own..y * own + out])
        {
            worst = worst.max((s - w).abs());
        }
    }
    eprintln!("a smaller tile's likelihood: worst difference {worst:.2e}");
    assert!(worst <= 2e-5, "worst difference {worst}");
}
