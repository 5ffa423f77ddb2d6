//! `detect fit`'s head on a detector of meaningless features: fitted on one image of bright
//! discs, the detector finds the discs of another.

use craterdex_detect::fit::{features_graph, fit_head, with_head, FitOptions, Labelled};
use craterdex_detect::testing::{disc_grid, discs, small_unet_detector};
use craterdex_detect::{detect, read_detector_dir, write_detector_dir, DetectOptions};

#[test]
fn a_fitted_head_finds_the_discs_of_an_image_it_was_not_fitted_on() {
    let (config, weights) = small_unet_detector();
    let o = DetectOptions::default();
    let fitting = disc_grid(0);
    let images = [Labelled {
        image: discs(160, 160, &fitting),
        craters: fitting.iter().map(|&(x, y, d)| [x, y, d]).collect(),
    }];
    let fit = FitOptions {
        background_share: 1.0,
        // whole discs: the random U-Net sees too little around a pixel to tell a disc's
        // centre from its edge (the shrunk disc is the pipeline test's)
        region_share: 1.0,
        ..Default::default()
    };
    let head = fit_head(&config, &weights, &images, &o, &fit, &|_| {}).unwrap();
    assert!(
        head.crater_pixels > 0 && head.samples > head.crater_pixels,
        "{head:?}"
    );
    let (graph, fitted) = with_head(&config.graph, config.tile, &weights, &head, 0.0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fitted");
    let stored = craterdex_detect::DetectorConfig {
        graph,
        region_share: fit.region_share,
        ..config.clone()
    };
    write_detector_dir(&path, stored, &fitted).unwrap();
    let (read, net) = read_detector_dir(&path).unwrap();
    assert_eq!(read.region_share, fit.region_share);

    let want = disc_grid(3);
    let found = detect(&net, &read, &discs(160, 160, &want), &o, &|_| {}).unwrap();
    let right = want
        .iter()
        .filter(|&&(x, y, d)| {
            found.iter().any(|f| {
                (f.x - x).hypot(f.y - y) <= 0.25 * d + 2.0
                    && f.diameter / d < 1.5
                    && d / f.diameter < 1.5
            })
        })
        .count();
    assert!(right >= 12, "{right} of 16 discs found: {found:#?}");
    assert!(
        found.len() <= right + 1,
        "{} detections: {found:#?}",
        found.len()
    );

    // the unfitted detector's random head does not find them
    let base =
        craterdex_detect::Net::new(config.graph.clone(), |n| weights.get(n).cloned()).unwrap();
    let unfitted = detect(&base, &config, &discs(160, 160, &want), &o, &|_| {}).unwrap();
    let right_before = want
        .iter()
        .filter(|&&(x, y, d)| {
            unfitted
                .iter()
                .any(|f| (f.x - x).hypot(f.y - y) <= 0.25 * d + 2.0)
        })
        .count();
    assert!(right_before < 4, "{right_before}: {unfitted:#?}");

    // a fitted detector fits again from its original layers, not from its own head
    let again = features_graph(&read.graph, read.tile).unwrap();
    assert_eq!(again, features_graph(&config.graph, config.tile).unwrap());
}
