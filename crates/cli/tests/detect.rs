//! `craterdex detect` and `eval-detect` end to end with a generated detector whose craters
//! are bright discs: the crater list and map layer written, the scores, and the errors.

use std::path::Path;
use std::process::{Command, Output};

fn run(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_craterdex"))
        .args(args)
        .env("CRATERDEX_HOME", root.join("home"))
        .env("CRATERDEX_PYTHON", "/nonexistent/python")
        .current_dir(root)
        .output()
        .unwrap()
}

const DISCS: [(f64, f64, f64); 4] = [
    (40.0, 50.0, 10.0),
    (150.0, 60.0, 18.0),
    (300.0, 150.0, 40.0),
    (120.0, 200.0, 70.0),
];

fn setup(root: &Path) {
    let (config, weights) = craterdex_detect::testing::brightness_detector(24);
    craterdex_detect::write_detector_dir(&root.join("bright"), config, &weights).unwrap();
    let g = craterdex_detect::testing::discs(400, 260, &DISCS);
    image::GrayImage::from_raw(400, 260, g.pixels)
        .unwrap()
        .save(root.join("new.png"))
        .unwrap();
    let mut labels = String::from("long,lat,diameter\n");
    for (x, y, d) in DISCS.iter().take(3) {
        labels += &format!("{x},{y},{d}\n");
    }
    std::fs::write(root.join("labels.csv"), labels).unwrap();
}

#[test]
fn detect_writes_the_crater_list_and_rims_of_each_image() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    setup(root);
    let o = run(
        root,
        &[
            "detect",
            "new.png",
            "--out",
            "found",
            "--detector",
            "bright",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let csv = std::fs::read_to_string(root.join("found/detections.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next().unwrap(),
        "id,image,source,x,y,diameter_px,score,scale"
    );
    let rows: Vec<Vec<String>> = lines
        .map(|l| l.split(',').map(String::from).collect())
        .collect();
    assert_eq!(rows.len(), DISCS.len(), "{csv}");
    for (x, y, d) in DISCS {
        let hit = rows.iter().any(|r| {
            let v = |i: usize| r[i].parse::<f64>().unwrap();
            (v(3) - x).hypot(v(4) - y) < 0.1 * d + 1.0 && (v(5) / d - 1.0).abs() < 0.15
        });
        assert!(hit, "disc ({x}, {y}, {d}) not in\n{csv}");
    }
    assert!(
        rows.iter()
            .all(|r| r[0].starts_with("new-") && r[2] == "new"),
        "{csv}"
    );
    let geo: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("found/detections.geojson")).unwrap())
            .unwrap();
    let features = geo["features"].as_array().unwrap();
    assert_eq!(features.len(), DISCS.len());
    // rims in the frame QGIS gives an image without georeferencing: y is minus the row
    let ring = features[0]["geometry"]["coordinates"][0]
        .as_array()
        .unwrap();
    assert!(ring.iter().all(|p| p[1].as_f64().unwrap() < 0.0));

    // eval-detect: three of the four discs are labelled, so the fourth is a false detection
    let o = run(
        root,
        &[
            "eval-detect",
            "--tile",
            "new.png",
            "--craters",
            "labels.csv",
            "--detector",
            "bright",
            "--out",
            "scores",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("scores/results.json")).unwrap()).unwrap();
    let big = r["bins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["bin"] == ">=20")
        .unwrap();
    assert_eq!(
        (
            big["craters"].as_u64(),
            big["craters_found"].as_u64(),
            big["detections"].as_u64()
        ),
        (Some(1), Some(1), Some(2))
    );
    assert_eq!(big["precision"].as_f64(), Some(0.5));
}

#[test]
fn images_that_cannot_be_searched_are_named_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    setup(root);
    std::fs::write(root.join("notes.png"), b"not an image").unwrap();
    image::GrayImage::new(10, 10)
        .save(root.join("tiny.png"))
        .unwrap();
    image::GrayImage::new(40, 40)
        .save(root.join("dark.png"))
        .unwrap();
    let o = run(
        root,
        &[
            "detect",
            "new.png",
            "notes.png",
            "tiny.png",
            "dark.png",
            "--out",
            "found",
            "--detector",
            "bright",
        ],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("notes.png") && err.contains("not a usable image"),
        "{err}"
    );
    assert!(
        err.contains("tiny.png") && err.contains("at least 16"),
        "{err}"
    );
    assert!(
        err.contains("2 of 4 images") && err.contains("dark.png: no craters found"),
        "{err}"
    );
    // the image that could be searched still has its craters written, and each image its
    // status
    let csv = std::fs::read_to_string(root.join("found/detections.csv")).unwrap();
    assert_eq!(csv.lines().count(), DISCS.len() + 1);
    let images = std::fs::read_to_string(root.join("found/images.csv")).unwrap();
    let lines: Vec<&str> = images.lines().collect();
    assert_eq!(lines[0], "image,source,status,craters,reason");
    assert!(lines[1].starts_with("new.png,new,found,4,"), "{images}");
    assert!(
        lines[2].starts_with("notes.png,notes,failed,0,")
            && lines[2].contains("not a usable image"),
        "{images}"
    );
    assert!(
        lines[3].starts_with("tiny.png,tiny,failed,0,") && lines[3].contains("at least 16"),
        "{images}"
    );
    assert_eq!(lines[4], "dark.png,dark,none,0,");
    let o = run(
        root,
        &[
            "detect",
            "new.png",
            "--out",
            "found",
            "--detector",
            "nowhere",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("no detector nowhere"),
        "{err}"
    );
}

#[test]
fn an_onnx_detector_file_is_imported_once_and_used() {
    use craterdex_model::onnx::build::{model, node};
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    setup(root);
    // the brightness detector as ONNX: its 3x3 kernel marks the centre pixel
    let mut w = vec![0f32; 9];
    w[4] = 40.0;
    let bytes = model(
        vec![
            node(
                "Conv",
                "mark",
                &["image", "w", "b"],
                &["m"],
                &[("kernel_shape", &[3, 3])],
            ),
            node("Sigmoid", "s", &["m"], &["likelihood"], &[]),
        ],
        &[("w", vec![1, 1, 3, 3], w), ("b", vec![1], vec![-20.0])],
        &[],
        ("image", &[0, 1, 24, 24]),
        ("likelihood", &[0, 1, 22, 22]),
    );
    std::fs::write(root.join("bright.onnx"), bytes).unwrap();
    for _ in 0..2 {
        let o = run(
            root,
            &[
                "detect",
                "new.png",
                "--out",
                "found",
                "--detector",
                "bright.onnx",
            ],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        let csv = std::fs::read_to_string(root.join("found/detections.csv")).unwrap();
        assert_eq!(csv.lines().count(), DISCS.len() + 1, "{csv}");
    }
    let imported: Vec<_> = std::fs::read_dir(root.join("home/detectors"))
        .unwrap()
        .collect();
    assert_eq!(imported.len(), 1, "imported once: {imported:?}");
}

#[test]
fn crops_of_the_craters_found_are_the_entries_link_takes() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    setup(root);
    for _ in 0..2 {
        let o = run(
            root,
            &[
                "detect",
                "new.png",
                "--out",
                "found",
                "--detector",
                "bright",
                "--crops",
                "--context",
                "2",
            ],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let csv = std::fs::read_to_string(root.join("found/crops.csv")).unwrap();
    let rows: Vec<&str> = csv.lines().skip(1).collect();
    // the 70 px disc at (120, 200) needs 140 px around it and reaches past the 260 px image
    assert_eq!(rows.len(), DISCS.len() - 1, "{csv}");
    assert!(
        csv.starts_with("id,source,x,y,diameter_px,score\n"),
        "{csv}"
    );
    let crops: Vec<_> = std::fs::read_dir(root.join("found/crops"))
        .unwrap()
        .collect();
    assert_eq!(
        crops.len(),
        rows.len(),
        "a second run replaces the crops whole"
    );
    let first = rows[0].split(',').next().unwrap();
    let crop = image::open(root.join(format!("found/crops/{first}.png"))).unwrap();
    let d: f64 = rows[0].split(',').nth(4).unwrap().parse().unwrap();
    assert!(
        (crop.width() as f64 - 2.0 * d).abs() <= 1.0,
        "{} px crop of a {d} px crater",
        crop.width()
    );
}
