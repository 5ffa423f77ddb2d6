//! The whole-image pipeline with a detector whose answer is known: one 3x3 convolution that
//! marks pixels brighter than mid-grey, so bright discs drawn in an image are the craters.

use craterdex_detect::detect::tiles_needed;
use craterdex_detect::testing::{brightness_detector, brightness_net, discs};
use craterdex_detect::{detect, DetectOptions};
use std::sync::atomic::{AtomicUsize, Ordering};

#[test]
fn discs_are_found_at_their_place_and_size_on_every_level_and_band() {
    let want = [
        (40.0, 50.0, 10.0),
        (150.0, 60.0, 18.0),
        (300.0, 150.0, 40.0),
        (120.0, 200.0, 70.0),
        (330.0, 35.0, 12.0),
    ];
    let image = discs(400, 260, &want);
    let (config, net) = brightness_net(24);
    let o = DetectOptions {
        level_max_diameter: 24.0,
        ..Default::default()
    };
    let tiles = AtomicUsize::new(0);
    let found = detect(&net, &config, &image, &o, &|n| {
        tiles.fetch_add(n, Ordering::Relaxed);
    })
    .unwrap();
    assert_eq!(
        tiles.load(Ordering::Relaxed),
        tiles_needed(&config, 400, 260, &o).unwrap()
    );
    assert_eq!(found.len(), want.len(), "{found:#?}");
    for &(x, y, d) in &want {
        let f = found
            .iter()
            .find(|f| (f.x - x).hypot(f.y - y) < 0.1 * d + 1.0)
            .unwrap_or_else(|| panic!("disc at ({x}, {y}) not found: {found:#?}"));
        assert!(
            (f.diameter / d - 1.0).abs() < 0.15,
            "disc of {d} px found as {}",
            f.diameter
        );
        // the large discs come from the pyramid's smaller levels
        assert_eq!(f.scale < 1.0, d >= 24.0, "{f:?}");
    }
    // bands of 32 rows (discs cut by band edges) find the same craters
    let banded = detect(
        &net,
        &config,
        &image,
        &DetectOptions {
            band_rows: 32,
            ..o.clone()
        },
        &|_| {},
    )
    .unwrap();
    assert_eq!(banded.len(), found.len(), "{banded:#?}");
    for (a, b) in banded.iter().zip(&found) {
        assert!(
            (a.x - b.x).abs() < 1e-9
                && (a.y - b.y).abs() < 1e-9
                && (a.diameter - b.diameter).abs() < 1e-9,
            "{a:?} vs {b:?}"
        );
    }
}

#[test]
fn images_too_small_and_bad_options_are_refused_with_reasons() {
    let (config, net) = brightness_net(24);
    let err = detect(
        &net,
        &config,
        &discs(10, 40, &[]),
        &DetectOptions::default(),
        &|_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("10x40") && err.contains("at least 16"),
        "{err}"
    );
    let bad = DetectOptions {
        threshold: 1.5,
        ..Default::default()
    };
    let err = detect(&net, &config, &discs(40, 40, &[]), &bad, &|_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("threshold"), "{err}");
    assert!(detect(
        &net,
        &config,
        &discs(40, 40, &[]),
        &DetectOptions::default(),
        &|_| {}
    )
    .unwrap()
    .is_empty());
}

#[test]
fn a_detector_directory_reads_back_and_refuses_damaged_weights() {
    let (_, net) = brightness_net(24);
    let (config, weights) = brightness_detector(24);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("brightness");
    // a region share outside (0, 1] would scale every diameter wrongly, and so would
    // diameter scales no fit keeps (a detector reading craters at under half or over twice
    // their size, or scaling each octave by more than 0.8-1.25): refused before anything
    // is written, naming the field
    type Field = fn(&mut craterdex_detect::DetectorConfig) -> &mut f64;
    let bad_values: [(&str, Field, &[f64]); 3] = [
        (
            "region_share",
            |c| &mut c.region_share,
            &[0.0, 1.5, f64::NAN],
        ),
        (
            "diameter_scale",
            |c| &mut c.diameter_scale,
            &[0.0, 0.4, 2.5, f64::NAN],
        ),
        (
            "diameter_scale_per_octave",
            |c| &mut c.diameter_scale_per_octave,
            &[0.7, 1.3],
        ),
    ];
    for (field, of, values) in bad_values {
        for &value in values {
            let mut bad = config.clone();
            *of(&mut bad) = value;
            let err = craterdex_detect::write_detector_dir(&d, bad, &weights)
                .err()
                .unwrap()
                .to_string();
            assert!(err.contains(&format!("{field} must lie")), "{err}");
            assert!(!d.exists());
        }
    }
    // a measured diameter scale is kept; 1 is not written (older readers see what they knew)
    let mut measured = config.clone();
    (measured.diameter_scale, measured.diameter_scale_per_octave) = (0.85, 0.92);
    let m = dir.path().join("measured");
    craterdex_detect::write_detector_dir(&m, measured, &weights).unwrap();
    let read_scales = craterdex_detect::read_detector_dir(&m)
        .unwrap()
        .0
        .diameter_scales();
    assert_eq!(
        (read_scales.full_size, read_scales.per_octave),
        (0.85, 0.92)
    );
    let written = craterdex_detect::write_detector_dir(&d, config, &weights).unwrap();
    let (read, read_net) = craterdex_detect::read_detector_dir(&d).unwrap();
    assert_eq!(read, written);
    assert!(!std::fs::read_to_string(d.join("detector.json"))
        .unwrap()
        .contains("diameter_scale"));
    let image = discs(100, 80, &[(50.0, 40.0, 14.0)]);
    let o = DetectOptions::default();
    assert_eq!(
        detect(&read_net, &read, &image, &o, &|_| {}).unwrap(),
        detect(&net, &read, &image, &o, &|_| {}).unwrap()
    );
    let w = d.join(craterdex_detect::store::WEIGHTS_FILE);
    let mut bytes = std::fs::read(&w).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&w, bytes).unwrap();
    let err = craterdex_detect::read_detector_dir(&d)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("sha256") && err.contains("weights.safetensors"),
        "{err}"
    );
}

#[test]
fn a_detector_that_marks_central_discs_reports_whole_diameters() {
    // a head fitted on half diameters marks a disc of half the crater's: what the
    // brightness detector marks of a 12 px disc is read as a 24 px crater
    let (mut config, net) = brightness_net(24);
    config.region_share = 0.5;
    let image = discs(120, 100, &[(50.0, 40.0, 12.0)]);
    let found = detect(&net, &config, &image, &DetectOptions::default(), &|_| {}).unwrap();
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!((found[0].diameter / 24.0 - 1.0).abs() < 0.15, "{found:?}");
    // a detector whose fit measured that it reads craters 1.25 times too wide reports
    // them x 0.8, at the same place
    config.diameter_scale = 0.8;
    let scaled = detect(&net, &config, &image, &DetectOptions::default(), &|_| {}).unwrap();
    assert_eq!(scaled.len(), 1, "{scaled:#?}");
    assert_eq!((scaled[0].x, scaled[0].y), (found[0].x, found[0].y));
    assert!((scaled[0].diameter - 0.8 * found[0].diameter).abs() < 1e-9);
}

/// A canvas with a no-data margin (black joined to its edge, as a turned or map-projected
/// image has): the discs in the data are found as without it, and nothing is reported in the
/// margin, though the margin is filled from the bright strip along the data's edge.
#[test]
fn nothing_is_reported_in_a_no_data_margin() {
    let want = [
        (90.0, 50.0, 12.0),
        (150.0, 110.0, 20.0),
        (60.0, 120.0, 16.0),
    ];
    let mut image = discs(200, 160, &want);
    // a turned canvas' black corner, the data's edge along its diagonal bright
    for y in 0..160 {
        for x in 0..200 {
            match x + y {
                0..50 => image.pixels[y * 200 + x] = 0,
                50..54 => image.pixels[y * 200 + x] = 230,
                _ => {}
            }
        }
    }
    let (config, net) = brightness_net(24);
    let o = DetectOptions {
        level_max_diameter: 24.0,
        ..Default::default()
    };
    let found = detect(&net, &config, &image, &o, &|_| {}).unwrap();
    assert!(found.iter().all(|f| f.x + f.y >= 49.0), "{found:#?}");
    for &(x, y, d) in &want {
        assert!(
            found
                .iter()
                .any(|f| (f.x - x).hypot(f.y - y) < 0.1 * d + 1.0
                    && (f.diameter / d - 1.0).abs() < 0.15),
            "disc at ({x}, {y}) not found: {found:#?}"
        );
    }
}
