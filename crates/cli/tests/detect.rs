//! `craterdex detect` and `eval-detect` end to end with a generated detector whose craters
//! are bright discs: the crater list and map layer written, the scores, and the errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn run(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_craterdex"))
        .args(args)
        .env("CRATERDEX_HOME", root.join("home"))
        .env("CRATERDEX_PYTHON", "/nonexistent/python")
        .env("CRATERDEX_PYCDA_PYTHON", "/nonexistent/pycda-python")
        .current_dir(root)
        .output()
        .unwrap()
}

/// The labelled image and the generated detector, as `eval-detect` and `bench detect` take them.
const LABELLED: [&str; 6] = [
    "--tile",
    "new.png",
    "--craters",
    "labels.csv",
    "--detector",
    "bright",
];

/// `bench detect` of them, one pass at the portable level, then `more`.
fn bench<'a>(more: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["bench", "detect"];
    args.extend(LABELLED);
    args.extend(["--levels", "portable", "--repeats", "1"]);
    args.extend(more);
    args
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
        "id,image,source,x,y,diameter_px,score,scale,lat,lon,diameter_km"
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
    // a plain image has no place on a body: its columns are empty, and no lon/lat layer
    assert!(csv.lines().skip(1).all(|l| l.ends_with(",,,")), "{csv}");
    assert!(!root.join("found/detections_lonlat.geojson").exists());

    // eval-detect: three of the four discs are labelled, so the fourth is a false detection
    let o = run(
        root,
        &[&["eval-detect"], &LABELLED[..], &["--out", "scores"]].concat(),
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
    // the crater found is read near its size: the brightness detector marks the disc itself
    let ratio = big["diameter_ratio"].as_f64().unwrap();
    assert!((0.8..1.25).contains(&ratio), "{big}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("D ratio"));
}

/// `bench detect --detector-precision P` times f32 and P (it used to fail: the detector was
/// loaded at P, then set to each precision again).
#[test]
fn bench_detect_times_f32_and_the_precision_named() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    setup(root);
    let o = run(
        root,
        &bench(&["--no-reference", "--detector-precision", "int8"]),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let precisions: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("craterdex brightness"))
        .map(|l| l.split_whitespace().nth(3).unwrap())
        .collect();
    assert_eq!(precisions, ["f32", "int8"], "{out}");
}

/// Where pycda's pipeline fails (here its Python is missing), `bench detect` still prints
/// craterdex's rows, then fails saying why the table has no `x pycda`.
#[test]
fn bench_detect_prints_its_rows_when_the_reference_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    setup(root);
    let o = run(root, &bench(&[]));
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(!o.status.success(), "{out}");
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("craterdex brightness"))
        .collect();
    // f32 and the CPU's default precision
    assert!(!rows.is_empty(), "{out}");
    assert!(
        rows.iter().all(|r| r.contains("NaN")),
        "no reference, no ratio: {out}"
    );
    assert!(!out.contains("pycda 0.1.16"), "{out}");
    assert!(err.contains("pycda's pipeline gave no row"), "{err}");
}

#[test]
fn images_that_cannot_be_searched_are_named_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    setup(root);
    std::fs::write(root.join("notes.png"), b"not an image").unwrap();
    std::fs::write(root.join("scene.cub"), b"not an ISIS cube").unwrap();
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
            "scene.cub",
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
        err.contains("3 of 5 images") && err.contains("dark.png: no craters found"),
        "{err}"
    );
    // a file neither image nor georeferenced raster: both readers' reasons
    assert!(
        err.contains("scene.cub: neither an image this build decodes")
            && err.contains("nor a georeferenced raster"),
        "{err}"
    );
    #[cfg(not(feature = "gdal"))]
    assert!(err.contains("built with the `gdal` feature"), "{err}");
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
    assert!(
        lines[5].starts_with("scene.cub,scene,failed,0,"),
        "{images}"
    );
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
    // detector directories (lock files are hidden)
    let imported: Vec<_> = std::fs::read_dir(root.join("home/detectors"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| !n.to_string_lossy().starts_with('.'))
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
        csv.starts_with("id,source,x,y,diameter_px,score,lat,lon,diameter_km\n"),
        "{csv}"
    );
    // a plain image has no place on a body
    assert!(rows.iter().all(|r| r.ends_with(",,,")), "{csv}");
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

/// The brightness detector as `root/bright`, a tiny model fetched as `tiny` and the
/// geometry-only link rule as `root/rule.json`: what the detect-then-link tests run with (the
/// tiny model's appearance scores mean nothing). Returns the model's directory.
fn bright_detector_tiny_model_and_geometry_rule(root: &Path) -> PathBuf {
    let (config, weights) = craterdex_detect::testing::brightness_detector(24);
    craterdex_detect::write_detector_dir(&root.join("bright"), config, &weights).unwrap();
    let ckpt = craterdex_model::testing::write_tiny_checkpoint(&root.join("ckpt"), 32, 4, 4);
    let o = run(
        root,
        &[
            "model",
            "fetch",
            "--from",
            ckpt.to_str().unwrap(),
            "--name",
            "tiny",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::write(
        root.join("rule.json"),
        craterdex_testkit::REGISTERED_GEOMETRY_RULE,
    )
    .unwrap();
    root.join("home/models/tiny")
}

/// Discs of 12-36 px at places no grid repeats (a pattern to register), none touching and
/// each with room for a crop of twice its diameter inside a `side` x `side` image.
fn scene(side: f64, n: usize) -> Vec<(f64, f64, f64)> {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut out: Vec<(f64, f64, f64)> = Vec::new();
    while out.len() < n {
        let d = 12.0 + 24.0 * next();
        let (x, y) = (d + (side - 2.0 * d) * next(), d + (side - 2.0 * d) * next());
        let apart = out
            .iter()
            .all(|&(u, v, e)| (u - x).hypot(v - y) > (d + e) / 2.0 + 10.0);
        if apart {
            out.push((x.round(), y.round(), d.round()));
        }
    }
    out
}

/// `link --image`: a second observation of a scene turned a quarter, with no crater list.
/// Its detections register to the catalogue (rotation 90 degrees), the catalogue's discs
/// are linked to their own entries, the two discs the catalogue lacks are reported `new`,
/// a disc too faint for the detector is still found where the registration places it, and
/// the disc in a black no-data notch of the image (outside what was observed) is not looked for.
/// The tiny model's appearance scores mean nothing, so the rule here decides by geometry
/// (and confirms a crater looked for in place at any appearance): what is tested is the
/// detection, registration, projection and outputs, not the model.
#[test]
fn link_image_registers_detections_links_them_and_looks_for_what_the_detector_missed() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let model = bright_detector_tiny_model_and_geometry_rule(root);
    let model = model.to_str().unwrap();
    let ok = |args: &[&str]| {
        let o = run(root, args);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let side = 420usize;
    let discs = scene(side as f64, 26);
    // the catalogue: crops of every disc but the first two, from the first observation
    let first = craterdex_detect::testing::discs(side, side, &discs);
    let first = image::GrayImage::from_raw(side as u32, side as u32, first.pixels).unwrap();
    std::fs::create_dir_all(root.join("cat")).unwrap();
    let mut csv = String::from("id,crater_id,source,x,y,diameter_px\n");
    for (i, &(x, y, d)) in discs.iter().enumerate().skip(2) {
        let (x0, y0) = ((x - d) as u32, (y - d) as u32);
        let crop = image::imageops::crop_imm(&first, x0, y0, 2 * d as u32, 2 * d as u32);
        crop.to_image()
            .save(root.join(format!("cat/d{i}.png")))
            .unwrap();
        csv += &format!("d{i},d{i},catalogue,{x},{y},{d}\n");
    }
    std::fs::write(root.join("cat.csv"), csv).unwrap();
    let size = ["--model", model, "--size", "16"];
    ok(&[
        &["index", "build", "--dir", "cat", "--out", "idx"][..],
        &size,
    ]
    .concat());
    // the second observation: turned a quarter (x, y) -> (y, side - 1 - x), disc 5 faint
    let turn = |(x, y, d): (f64, f64, f64)| (y, side as f64 - 1.0 - x, d);
    let turned: Vec<(f64, f64, f64)> = discs.iter().map(|&c| turn(c)).collect();
    let mut second = craterdex_detect::testing::discs(side, side, &turned);
    let (fx, fy, fd) = turned[5];
    // no data: a notch from the image's edge over the catalogue disc nearest an edge
    // (x0, x1, y0, y1), touching no other disc
    let s = side as f64;
    let notch = |(x, y, d): (f64, f64, f64)| -> (f64, f64, f64, f64) {
        let r = d / 2.0 + 3.0;
        let nearest = [x, s - x, y, s - y];
        let edge = (0..4)
            .min_by(|&a, &b| nearest[a].total_cmp(&nearest[b]))
            .unwrap();
        match edge {
            0 => (0.0, x + r, y - r, y + r),
            1 => (x - r, s, y - r, y + r),
            2 => (x - r, x + r, 0.0, y + r),
            _ => (x - r, x + r, y - r, s),
        }
    };
    let touches = |(x0, x1, y0, y1): (f64, f64, f64, f64), (x, y, d): (f64, f64, f64)| {
        let (dx, dy) = ((x0 - x).max(x - x1).max(0.0), (y0 - y).max(y - y1).max(0.0));
        dx.hypot(dy) <= d / 2.0 + 2.0
    };
    let unseen = (2..turned.len())
        .filter(|&i| i != 5)
        .find(|&i| {
            let n = notch(turned[i]);
            (0..turned.len()).all(|j| j == i || !touches(n, turned[j]))
        })
        .expect("a disc to hide");
    let (x0, x1, y0, y1) = notch(turned[unseen]);
    for (i, p) in second.pixels.iter_mut().enumerate() {
        let (x, y) = ((i % side) as f64, (i / side) as f64);
        if (x - fx).hypot(y - fy) <= fd / 2.0 {
            *p = 60;
        }
        if (x0..x1).contains(&x) && (y0..y1).contains(&y) {
            *p = 0;
        }
    }
    image::GrayImage::from_raw(side as u32, side as u32, second.pixels)
        .unwrap()
        .save(root.join("second.png"))
        .unwrap();
    let link = [
        &[
            "link",
            "--index",
            "idx",
            "--image",
            "second.png",
            "--out",
            "links",
            "--detector",
            "bright",
            "--rule",
            "rule.json",
        ][..],
        &size,
    ]
    .concat();
    let said = ok(&link);
    assert!(said.contains("image second: "), "{said}");
    let table = std::fs::read_to_string(root.join("links/links.csv")).unwrap();
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let rows: Vec<Vec<String>> = lines
        .map(|l| l.split(',').map(String::from).collect())
        .collect();
    let at = |r: &Vec<String>| -> (f64, f64) {
        (r[col("x")].parse().unwrap(), r[col("y")].parse().unwrap())
    };
    let rows_at = |(x, y, d): (f64, f64, f64)| -> Vec<&Vec<String>> {
        rows.iter()
            .filter(|r| {
                let (u, v) = at(r);
                (u - x).hypot(v - y) <= 0.25 * d + 2.0
            })
            .collect()
    };
    for (i, &c) in turned.iter().enumerate() {
        let here = rows_at(c);
        if i == unseen {
            assert!(here.is_empty(), "disc {i} at {c:?} in no data:\n{table}");
            continue;
        }
        assert_eq!(here.len(), 1, "disc {i} at {c:?}:\n{table}");
        let r = here[0];
        let (decision, crater) = (&r[col("decision")], &r[col("catalogue_crater_id")]);
        if i < 2 {
            assert_eq!(decision, "new", "disc {i}: {r:?}");
            assert_eq!(r[col("found_by")], "detector");
        } else if i == 5 || r[col("found_by")] == "catalogue" {
            // looked for in place (the faint disc, and any the detector merged or missed),
            // and confirmed by appearance alone: the tiny model's scores cannot, so only
            // that it is never reported new
            assert_eq!(crater, &format!("d{i}"), "{r:?}");
            assert_eq!(r[col("found_by")], "catalogue", "{r:?}");
            assert!(
                ["match", "unconfirmed"].contains(&decision.as_str()),
                "{r:?}"
            );
        } else {
            assert_eq!(
                (decision.as_str(), crater.as_str()),
                ("match", format!("d{i}").as_str()),
                "{r:?}"
            );
        }
    }
    let images = std::fs::read_to_string(root.join("links/images.csv")).unwrap();
    let summary: Vec<&str> = images.lines().nth(1).unwrap().split(',').collect();
    assert_eq!(&summary[..3], ["second", "420", "420"], "{images}");
    let count = |i: usize| summary[i].parse::<usize>().unwrap();
    // every disc is looked at once (above): detected, or looked for where it should be
    assert!((25..=27).contains(&(count(3) + count(4))), "{images}");
    assert!(count(4) >= 1 && count(4) <= 3, "{images}");
    assert_eq!(&summary[6..8], ["2", "true"], "{images}");
    let rotation: f64 = summary[8].parse().unwrap();
    assert!((rotation.abs() - 90.0).abs() < 1.0, "{images}");
    let review = std::fs::read_to_string(root.join("links/review.html")).unwrap();
    let page = craterdex_testkit::parsed_page(&review);
    assert!(review.contains("data:image/png;base64,"));
    // one circle per crater looked at (the registration's residual plot draws its own)
    let dashes = page.attributes("svg circle", "stroke-dasharray");
    let drawn = |style: &str| dashes.iter().filter(|d| *d == style).count();
    assert_eq!(drawn("none"), count(3));
    assert_eq!(drawn("4 3"), count(4));
    // --insert-new is for crater lists: said, and nothing written
    let refused = run(root, &[&link[..], &["--insert-new"]].concat());
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("cannot be used with"));
}

/// `dedup --image`: two overlapping observations of one scene, each in its own pixels (the
/// second's frame shifted by (80, 80)), with no crater list. Their craters are detected, cut,
/// indexed, the images registered to each other by their crater patterns, and every disc
/// both images show whole is one group of the two views; no group joins two discs. The
/// tiny model's scores mean nothing, so the rule decides by registered geometry.
#[test]
fn dedup_image_groups_the_craters_two_overlapping_images_share() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let model = bright_detector_tiny_model_and_geometry_rule(root);
    let ok = |args: &[&str]| {
        let o = run(root, args);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{args:?}: {err}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let (side, part, shift) = (600usize, 480u32, 120.0);
    let discs = scene(side as f64, 60);
    let ground = craterdex_detect::testing::discs(side, side, &discs);
    let ground = image::GrayImage::from_raw(side as u32, side as u32, ground.pixels).unwrap();
    for (name, at) in [("a.png", 0u32), ("b.png", shift as u32)] {
        image::imageops::crop_imm(&ground, at, at, part, part)
            .to_image()
            .save(root.join(name))
            .unwrap();
    }
    let said = ok(&[
        "dedup",
        "--image",
        "a.png",
        "b.png",
        "--out",
        "dd",
        "--detector",
        "bright",
        "--rule",
        "rule.json",
        "--model",
        model.to_str().unwrap(),
        "--size",
        "16",
    ]);
    // where each crop's crater is on the ground
    let crops = std::fs::read_to_string(root.join("dd/crops.csv")).unwrap();
    let mut on_ground = std::collections::HashMap::new();
    for line in crops.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let offset = if f[1] == "b" { shift } else { 0.0 };
        let (x, y): (f64, f64) = (f[2].parse().unwrap(), f[3].parse().unwrap());
        let disc = discs
            .iter()
            .position(|&(u, v, d)| (u - x - offset).hypot(v - y - offset) <= 0.25 * d + 2.0)
            .unwrap_or_else(|| panic!("crop {line} is on no disc"));
        on_ground.insert(f[0].to_string(), (f[1].to_string(), disc));
    }
    // a disc cut whole in both images (the crop of side 2d inside each)
    let cut_in = |(x, y, d): (f64, f64, f64), at: f64| {
        let (lo, hi) = (at + d, at + part as f64 - d);
        x >= lo && x <= hi - 1.0 && y >= lo && y <= hi - 1.0
    };
    let shared: Vec<usize> = (0..discs.len())
        .filter(|&i| cut_in(discs[i], 0.0) && cut_in(discs[i], shift))
        .filter(|&i| on_ground.values().filter(|(_, d)| *d == i).count() == 2)
        .collect();
    assert!(shared.len() >= 8, "{shared:?}\n{crops}");
    let groups = std::fs::read_to_string(root.join("dd/groups.csv")).unwrap();
    let mut members: std::collections::BTreeMap<String, Vec<(String, usize)>> = Default::default();
    for line in groups.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        members
            .entry(f[0].to_string())
            .or_default()
            .push(on_ground[f[1]].clone());
    }
    for (g, m) in &members {
        assert!(
            m.iter().all(|(_, d)| *d == m[0].1),
            "group {g} joins discs: {m:?}"
        );
    }
    for i in &shared {
        let grouped = members.values().any(|m| {
            let mut sources: Vec<&str> = m
                .iter()
                .filter(|(_, d)| d == i)
                .map(|(s, _)| s.as_str())
                .collect();
            sources.sort();
            sources == ["a", "b"]
        });
        assert!(
            grouped,
            "disc {i} not grouped across the images:\n{said}\n{groups}"
        );
    }
    // the index stays for later links, and detections.csv is detect's
    assert!(root.join("dd/index/index.json").exists());
    let detections = std::fs::read_to_string(root.join("dd/detections.csv")).unwrap();
    assert!(detections.starts_with("id,image,source,x,y,diameter_px"));
}

/// `eval-link --image` on a generated tile with its crater list: the second observation is
/// the tile turned and scaled, detected, registered back (at the opposite turn), and its
/// rows scored against the labels. The rule decides by registered geometry (the tiny
/// model's appearance means nothing): what is tested is the observation, the catalogue,
/// the mapping of rows back to the tile and the scores.
#[test]
fn eval_link_image_scores_a_turned_second_view_of_a_labelled_tile() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let model = bright_detector_tiny_model_and_geometry_rule(root);
    let side = 560usize;
    let discs = scene(side as f64, 40);
    let tile = craterdex_detect::testing::discs(side, side, &discs);
    image::GrayImage::from_raw(side as u32, side as u32, tile.pixels)
        .unwrap()
        .save(root.join("tile.png"))
        .unwrap();
    let mut labels = String::from("long,lat,diameter\n");
    for (x, y, d) in &discs {
        labels += &format!("{x},{y},{d}\n");
    }
    std::fs::write(root.join("tile.csv"), labels).unwrap();
    let eval_link = |out: &str, extra: &[&str]| {
        let mut args = vec![
            "eval-link",
            "--image",
            "--tile",
            "tile.png",
            "--craters",
            "tile.csv",
            "--out",
            out,
            "--detector",
            "bright",
            "--model",
            model.to_str().unwrap(),
        ];
        args.extend(extra);
        run(root, &args)
    };
    let o = eval_link(
        "ev",
        &[
            "--seed",
            "3",
            "--scale",
            "0.9,1.1",
            "--rule",
            "rule.json",
            "--size",
            "16",
        ],
    );
    let said = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let results: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("ev/results.json")).unwrap()).unwrap();
    let tile = &results["tiles"][0];
    let turned = tile["transform"]["rotation_deg"].as_f64().unwrap();
    let registered = tile["registered_rotation_deg"]
        .as_f64()
        .unwrap_or_else(|| panic!("not registered: {said}"));
    let off = (registered + turned).rem_euclid(360.0);
    assert!(
        off.min(360.0 - off) < 2.0,
        "turned {turned}, registered {registered}"
    );
    let score = &tile["score"];
    let n = |k: &str| score[k].as_u64().unwrap();
    // discs of 20 px or more: about a fifth held out of the catalogue, the rest linked
    assert!(n("catalogue_scored") >= 10 && n("held_out") >= 2, "{score}");
    assert_eq!(n("wrong_rows"), 0, "{score}");
    assert!(
        n("linked_right") * 10 >= n("catalogue_scored") * 9,
        "{score}"
    );
    // the detector finds every disc: each held-out one is reported new
    assert_eq!(n("held_out_detected"), n("held_out"), "{score}");
    assert_eq!(n("reported_new"), n("held_out"), "{score}");
    assert!(
        n("new_rows_right") >= n("held_out") && n("new_rows") >= n("new_rows_right"),
        "{score}"
    );
    assert!(said.contains("1 tiles, 1 registered"), "{said}");
    assert!(root.join("ev/00-tile/new.png").exists());
    // catalogue errors are craters of another tile: one tile has none to give
    let o = eval_link("ev2", &["--phantoms", "0.2"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("needs two tiles"),
        "{err}"
    );
}

/// [`craterdex_detect::testing::disc_grid`] of `seed` written as `name.png` with its labels
/// `name.csv`.
fn small_discs(root: &Path, name: &str, seed: usize) -> Vec<(f64, f64, f64)> {
    let discs = craterdex_detect::testing::disc_grid(seed);
    let g = craterdex_detect::testing::discs(160, 160, &discs);
    image::GrayImage::from_raw(160, 160, g.pixels)
        .unwrap()
        .save(root.join(format!("{name}.png")))
        .unwrap();
    let mut labels = String::from("long,lat,diameter\n");
    for (x, y, d) in &discs {
        labels += &format!("{x},{y},{d}\n");
    }
    std::fs::write(root.join(format!("{name}.csv")), labels).unwrap();
    discs
}

/// Of the discs `want`, how many a row of `detect`'s CSV finds (centre within 0.25 D + 2 px,
/// diameter within 1.5x), and how many rows there are.
fn found_right(csv: &str, want: &[(f64, f64, f64)]) -> (usize, usize) {
    let rows: Vec<[f64; 3]> = csv
        .lines()
        .skip(1)
        .map(|l| {
            let v: Vec<f64> = l
                .split(',')
                .skip(3)
                .take(3)
                .map(|v| v.parse().unwrap())
                .collect();
            [v[0], v[1], v[2]]
        })
        .collect();
    let right = want
        .iter()
        .filter(|&&(x, y, d)| {
            rows.iter().any(|r| {
                (r[0] - x).hypot(r[1] - y) <= 0.25 * d + 2.0 && r[2] / d < 1.5 && d / r[2] < 1.5
            })
        })
        .count();
    (right, rows.len())
}

#[test]
fn detect_fit_writes_a_detector_that_detect_then_uses() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let (config, weights) = craterdex_detect::testing::small_unet_detector();
    craterdex_detect::write_detector_dir(&root.join("random"), config, &weights).unwrap();
    small_discs(root, "fit", 0);
    let want = small_discs(root, "other", 3);
    // whole discs: the random U-Net sees too little to tell a disc's centre from its edge
    let fit = [
        "detect",
        "fit",
        "--tile",
        "fit.png",
        "--craters",
        "fit.csv",
        "--detector",
        "random",
        "--out",
        "mine",
        "--background-share",
        "1",
        "--region-share",
        "1",
        "--try-thresholds",
        "0.3,0.5",
        "--try-diameter-scales",
        "0.9,1",
    ];
    let o = run(root, &fit);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("threshold 0.3")
            && stdout.contains("threshold 0.5")
            && stdout.contains("kept")
            && stdout.contains("mean F1 by diameter scale: x 0.9 "),
        "{stdout}"
    );
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("mine/detector.json")).unwrap()).unwrap();
    assert!(
        config["source"].as_str().unwrap().contains("detect fit"),
        "{config}"
    );
    // the scale kept is one of those tried (1 is not written)
    let kept_scale = config["diameter_scale"].as_f64().unwrap_or(1.0);
    let kept_per_octave = config["diameter_scale_per_octave"].as_f64().unwrap_or(1.0);
    assert!([0.9, 1.0].contains(&kept_scale), "{config}");
    assert!(
        [1.0, 0.96, 0.92, 0.88].contains(&kept_per_octave),
        "{config}"
    );
    // the fit measures the scale: one given is refused
    let mut given = fit.to_vec();
    given.extend(["--diameter-scale", "0.9"]);
    let o = run(root, &given);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--try-diameter-scales"),
        "{err}"
    );

    let detect_other = |out: &str, more: &[&str]| {
        let args = [
            &["detect", "other.png", "--detector", "mine", "--out", out],
            more,
        ]
        .concat();
        let o = run(root, &args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read_to_string(root.join(out).join("detections.csv")).unwrap()
    };
    let csv = detect_other("found", &[]);
    let (right, rows) = found_right(&csv, &want);
    assert!(
        right >= 12 && rows <= right + 1,
        "{right} of 16 discs in\n{csv}"
    );
    // --diameter-scale in place of the detector's own: the same craters, diameters scaled
    let wider = detect_other("found-wider", &["--diameter-scale", "1.2"]);
    // place, diameter and the pyramid scale it was read at
    let diameters = |csv: &str| -> Vec<(String, f64, f64)> {
        csv.lines()
            .skip(1)
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                (
                    format!("{},{}", f[3], f[4]),
                    f[5].parse().unwrap(),
                    f[7].parse().unwrap(),
                )
            })
            .collect()
    };
    let (own, scaled) = (diameters(&csv), diameters(&wider));
    assert_eq!(own.len(), scaled.len(), "{csv}\n{wider}");
    for ((at, d, level), (at_scaled, d_scaled, _)) in own.iter().zip(&scaled) {
        assert_eq!(at, at_scaled);
        let own_factor = kept_scale * kept_per_octave.powf(-f64::log2(*level));
        assert!(
            (d_scaled / d - 1.2 / own_factor).abs() < 0.01,
            "{csv}\n{wider}"
        );
    }

    // every layer fitted (--whole) on the same discs finds them as well
    let whole = [
        &fit[..9],
        &[
            "whole",
            "--whole",
            "--region-share",
            "1",
            "--steps",
            "300",
            "--learning-rate",
            "0.01",
            "--try-thresholds",
            "0.3,0.5",
        ],
    ]
    .concat();
    let o = run(root, &whole);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    // no terminal, no bar: a line every 5% of the steps, with the loss and the time to go
    assert_eq!(err.matches("fit step ").count(), 20, "{err}");
    assert!(err.contains("fit step 300/300: loss "), "{err}");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("whole/detector.json")).unwrap()).unwrap();
    assert!(
        config["source"]
            .as_str()
            .unwrap()
            .ends_with("; then every layer (300 steps of 8 tiles) fitted by craterdex detect fit on 1 labelled images"),
        "{config}"
    );
    assert_eq!(
        config["graph"]["layers"].as_array().unwrap().len(),
        craterdex_detect::testing::small_unet().layers.len()
    );
    // and fitted on tiles worn as a second observation is (any turn, gamma, blur or noise)
    let mut worn = whole.clone();
    worn[9] = "worn";
    worn.push("--wear");
    let o = run(root, &worn);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("worn/detector.json")).unwrap()).unwrap();
    assert!(
        config["source"]
            .as_str()
            .unwrap()
            .contains("(300 steps of 8 tiles, worn)"),
        "{config}"
    );
    // products in bf16 where this CPU has it at the level in use; refused by name elsewhere
    let mut bf16 = whole.clone();
    bf16[9] = "whole-bf16";
    bf16.extend(["--fit-precision", "bf16"]);
    let o = run(root, &bf16);
    let mut fitted = vec![("whole", "found-whole"), ("worn", "found-worn")];
    if craterdex_kernels::bf16::available() {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(root.join("whole-bf16/detector.json")).unwrap())
                .unwrap();
        assert!(
            config["source"]
                .as_str()
                .unwrap()
                .contains("(300 steps of 8 tiles, products in bf16)"),
            "{config}"
        );
        fitted.push(("whole-bf16", "found-whole-bf16"));
    } else {
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("a bf16 fit needs bf16 hardware"), "{err}");
        assert!(!root.join("whole-bf16").exists());
    }
    for (detector, out) in fitted {
        let o = run(
            root,
            &["detect", "other.png", "--detector", detector, "--out", out],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let csv = std::fs::read_to_string(root.join(out).join("detections.csv")).unwrap();
        let (right, rows) = found_right(&csv, &want);
        assert!(
            right >= 12 && rows <= right + 1,
            "{detector}: {right} of 16 discs in\n{csv}"
        );
    }
    // wear and the step options belong to fitting every layer: refused with the head's fit
    // (whose own options are given here), never silently ignored
    for whole_only in [
        &["--wear"][..],
        &["--steps", "3"],
        &["--learning-rate", "0.1"],
    ] {
        let mut head = fit.to_vec();
        head.extend_from_slice(whole_only);
        let o = run(root, &head);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success()
                && err.contains(whole_only[0])
                && err.contains("cannot be used with"),
            "{err}"
        );
    }

    // a detector whose last layer is no 1x1 head cannot be fitted, and says which layer
    setup(root);
    let mut fit = fit.to_vec();
    fit[7] = "bright";
    fit[9] = "mine2";
    let o = run(root, &fit);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("mark"), "{err}");
    assert!(!root.join("mine2").exists());
}
