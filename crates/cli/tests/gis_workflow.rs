//! docs/guide/workflows.md, "A Robbins catalogue and a GeoTIFF mosaic, into QGIS": its
//! commands run as written on two generated Mars mosaics of the same ground (GeoTIFFs made
//! with GDAL's `gdal_translate`), a Robbins-format catalogue in 0-360 longitudes with one
//! crater listed twice, and a second observation's detections in -180..180. The layers are
//! checked with `ogrinfo`, and in QGIS where its Python bindings are installed.
#![cfg(feature = "gdal")]

use std::path::{Path, PathBuf};
use std::process::Command;

const MARS_RADIUS_M: f64 = 3_396_190.0;
const PIXEL_M: f64 = 100.0;
const SIZE: u32 = 640;
/// The mosaics' top-left corner: they straddle the 0/360 seam.
const LON0: f64 = -0.5;
const LAT0: f64 = 1.0;

/// The craters of the ground: pixel centre and diameter.
const CRATERS: [(f64, f64, f64); 12] = [
    (80.0, 90.0, 34.0),
    (250.0, 70.0, 22.0),
    (430.0, 110.0, 40.0),
    (560.0, 80.0, 18.0),
    (110.0, 260.0, 26.0),
    (300.0, 240.0, 46.0),
    (520.0, 280.0, 30.0),
    (70.0, 450.0, 20.0),
    (240.0, 430.0, 36.0),
    (420.0, 470.0, 24.0),
    (560.0, 520.0, 42.0),
    (300.0, 580.0, 28.0),
];

/// Craters only the second observation shows (young ones).
const YOUNG: [(f64, f64, f64); 2] = [(180.0, 160.0, 26.0), (380.0, 340.0, 30.0)];

fn lat_lon(x: f64, y: f64) -> (f64, f64) {
    let deg = |m: f64| (m / MARS_RADIUS_M).to_degrees();
    (
        LAT0 - deg((y + 0.5) * PIXEL_M),
        LON0 + deg((x + 0.5) * PIXEL_M),
    )
}

fn km(d_px: f64) -> f64 {
    d_px * PIXEL_M / 1000.0
}

/// A mosaic lit from the west: each crater a bowl (its west wall in shadow, its east wall
/// lit) with a raised rim, on rolling terrain; `seed` varies the terrain's grain and the
/// exposure as a second observation's would.
fn write_mosaic(dir: &Path, name: &str, craters: &[(f64, f64, f64)], seed: u32) -> PathBuf {
    let (gain, offset) = if seed == 0 { (1.0, 0.0) } else { (0.85, 12.0) };
    let img = image::GrayImage::from_fn(SIZE, SIZE, |x, y| {
        let (fx, fy) = (x as f64, y as f64);
        let grain = ((fx * 0.37 + seed as f64).sin() * (fy * 0.29).cos()) * 6.0;
        let mut v = 128.0 + 18.0 * ((fx * 0.031).sin() + (fy * 0.023).cos()) + grain;
        for &(cx, cy, d) in craters {
            let r = d / 2.0;
            let (dx, dy) = (fx - cx, fy - cy);
            let rho = (dx * dx + dy * dy).sqrt() / r;
            if rho < 1.0 {
                v += 70.0 * (dx / r) - 15.0 * (1.0 - rho * rho);
            } else if rho < 1.3 {
                v += 35.0 * (1.0 - (rho - 1.15).abs() / 0.15) * (dx / (rho * r)).max(-0.3);
            }
        }
        image::Luma([(v * gain + offset).clamp(0.0, 255.0) as u8])
    });
    let png = dir.join(format!("{name}.png"));
    img.save(&png).unwrap();
    let tif = dir.join(format!("{name}.tif"));
    georeference(&png, &tif);
    std::fs::remove_file(png).unwrap();
    tif
}

/// `tif`: the image `png` as a GeoTIFF of the test's ground (GDAL's `gdal_translate`).
fn georeference(png: &Path, tif: &Path) {
    georeference_at(png, tif, 0, SIZE);
}

/// `tif`: the image `png`, `size` pixels a side, as a GeoTIFF of the part of the test's
/// ground whose top-left pixel is the ground's (`offset`, `offset`).
fn georeference_at(png: &Path, tif: &Path, offset: u32, size: u32) {
    let (ulx, uly) = (
        MARS_RADIUS_M * LON0.to_radians() + offset as f64 * PIXEL_M,
        MARS_RADIUS_M * LAT0.to_radians() - offset as f64 * PIXEL_M,
    );
    let (lrx, lry) = (ulx + size as f64 * PIXEL_M, uly - size as f64 * PIXEL_M);
    let srs = format!(
        "+proj=eqc +lat_ts=0 +lat_0=0 +lon_0=0 +x_0=0 +y_0=0 +R={MARS_RADIUS_M} +units=m +no_defs"
    );
    let out = Command::new("gdal_translate")
        .args(["-q", "-of", "GTiff", "-a_srs", &srs, "-a_ullr"])
        .args([ulx, uly, lrx, lry].map(|v| v.to_string()))
        .arg(png)
        .arg(tif)
        .output()
        .expect("gdal_translate (Debian's gdal-bin) is needed to write the test's GeoTIFFs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Checks the place columns of the crater table at `csv` (x, y, diameter_px; lat, lon,
/// diameter_km): rows of the `plain` image have none, every other row the place of its
/// pixels on the test's ground; returns how many rows are placed.
fn assert_placed(csv: &Path, plain: &str) -> usize {
    let column = |name: &str| csv_column(csv, name);
    let (images, xs, ys, ds) = (
        column("image"),
        column("x"),
        column("y"),
        column("diameter_px"),
    );
    let (lats, lons, kms) = (column("lat"), column("lon"), column("diameter_km"));
    let f = |v: &str| v.parse::<f64>().unwrap();
    let mut placed = 0;
    for i in 0..images.len() {
        if images[i] == plain {
            assert!(lats[i].is_empty() && lons[i].is_empty() && kms[i].is_empty());
            continue;
        }
        placed += 1;
        // the crater's own pixel position, through the mosaic's projection (the CSV's
        // x and y are rounded to 0.01 px, 1 m here: 1.5e-5 degrees)
        let (lat, lon) = lat_lon(f(&xs[i]), f(&ys[i]));
        assert!(
            (f(&lats[i]) - lat).abs() < 1.5e-5,
            "row {i}: {} against {lat}",
            lats[i]
        );
        assert!(
            (f(&lons[i]) - lon).abs() < 1.5e-5,
            "row {i}: {} against {lon}",
            lons[i]
        );
        // within a degree of the equator a pixel is 100 m either way (east-west 0.015% less)
        let ratio = f(&kms[i]) / km(f(&ds[i]));
        assert!(
            (ratio - 1.0).abs() < 1e-3,
            "row {i}: {} km, ratio {ratio}",
            kms[i]
        );
    }
    placed
}

#[test]
fn detect_places_each_crater_of_a_geotiff_on_the_body() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (config, weights) = craterdex_detect::testing::brightness_detector(24);
    craterdex_detect::write_detector_dir(&dir.join("bright"), config, &weights).unwrap();
    let discs = [
        (150.0, 140.0, 20.0),
        (420.0, 200.0, 36.0),
        (260.0, 470.0, 56.0),
    ];
    let g = craterdex_detect::testing::discs(SIZE as usize, SIZE as usize, &discs);
    let png = dir.join("plain.png");
    image::GrayImage::from_raw(SIZE, SIZE, g.pixels)
        .unwrap()
        .save(&png)
        .unwrap();
    georeference(&png, &dir.join("mosaic.tif"));
    // the same ground in 16 bits (read as values and stretched, not as 8-bit levels)
    let out = Command::new("gdal_translate")
        .args(["-q", "-ot", "UInt16", "-scale", "0", "255", "0", "65535"])
        .args(["mosaic.tif", "mosaic16.tif"])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(env!("CARGO_BIN_EXE_craterdex"))
        .args([
            "detect",
            "mosaic.tif",
            "mosaic16.tif",
            "plain.png",
            "--out",
            "found",
        ])
        .args(["--detector", "bright"])
        .env("CRATERDEX_HOME", dir.join("home"))
        .env("CRATERDEX_PYTHON", "/nonexistent/python")
        .current_dir(dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        !err.contains("ERROR"),
        "GDAL's own messages reached stderr:\n{err}"
    );
    let csv = dir.join("found/detections.csv");
    let column = |name: &str| csv_column(&csv, name);
    let (images, xs, ys, ds) = (
        column("image"),
        column("x"),
        column("y"),
        column("diameter_px"),
    );
    let f = |v: &str| v.parse::<f64>().unwrap();
    let on_mosaic = assert_placed(&csv, "plain.png");
    assert_eq!(
        on_mosaic,
        2 * discs.len(),
        "{}",
        std::fs::read_to_string(&csv).unwrap()
    );
    // GDAL's read of the GeoTIFF gives the detector the PNG's pixels: the same craters
    let rows_of = |image: &str| -> Vec<(String, String, String)> {
        (0..images.len())
            .filter(|&i| images[i] == image)
            .map(|i| (xs[i].clone(), ys[i].clone(), ds[i].clone()))
            .collect()
    };
    assert_eq!(rows_of("mosaic.tif"), rows_of("plain.png"));
    for (x, y, d) in discs {
        for image in ["mosaic.tif", "mosaic16.tif"] {
            let found = (0..images.len()).any(|i| {
                images[i] == image
                    && (f(&xs[i]) - x).hypot(f(&ys[i]) - y) < 0.1 * d + 1.0
                    && (f(&ds[i]) / d - 1.0).abs() < 0.15
            });
            assert!(found, "disc ({x}, {y}, {d}) not found on {image}");
        }
    }
    // the mosaic's rims in longitude and latitude, on Mars, in a layer GDAL reads
    let layer = dir.join("found/detections_lonlat.geojson");
    let info = ogrinfo(&layer, "detections_lonlat");
    assert_eq!(feature_count(&info), 2 * discs.len(), "{info}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&layer).unwrap()).unwrap();
    let code = craterdex_workflows::geometry::iau_crs(MARS_RADIUS_M / 1000.0).unwrap();
    assert_eq!(doc["crs"]["properties"]["name"], code);
    for feature in doc["features"].as_array().unwrap() {
        let ring = feature["geometry"]["coordinates"][0].as_array().unwrap();
        let p = &feature["properties"];
        let (lon, lat) = (p["lon"].as_f64().unwrap(), p["lat"].as_f64().unwrap());
        let n = (ring.len() - 1) as f64;
        let mean = |k: usize| {
            ring[1..]
                .iter()
                .map(|v| v[k].as_f64().unwrap())
                .sum::<f64>()
                / n
        };
        assert!(
            (mean(0) - lon).abs() < 1e-4 && (mean(1) - lat).abs() < 1e-4,
            "{p}"
        );
    }
    // and in one GeoPackage with its QGIS style as the layer's default
    let gpkg = dir.join("found/detections.gpkg");
    let info = ogrinfo(&gpkg, "detections_lonlat");
    assert_eq!(feature_count(&info), 2 * discs.len(), "{info}");
    let styles = ogrinfo_features(&gpkg, "layer_styles");
    assert!(
        styles.contains("f_table_name (String) = detections_lonlat")
            && styles.contains("singleSymbol"),
        "{styles}"
    );
    opens_in_qgis(
        "detect_places_each_crater_of_a_geotiff_on_the_body",
        &[dir.join("found")],
    );
}

/// A bright-disc detector (`bright`) and a tiny model (`home/models/tiny`) in `dir`: what
/// the link and dedup tests run, their appearance scores meaning nothing.
fn with_tiny_model_and_detector(dir: &Path) {
    let (config, weights) = craterdex_detect::testing::brightness_detector(24);
    craterdex_detect::write_detector_dir(&dir.join("bright"), config, &weights).unwrap();
    let ckpt = craterdex_model::testing::write_tiny_checkpoint(&dir.join("ckpt"), 32, 4, 4);
    let from = ckpt.to_str().unwrap();
    run_ok(dir, &["model", "fetch", "--from", from, "--name", "tiny"]);
}

/// craterdex `args` in `dir` (its home there): it succeeds, and no GDAL message reaches
/// stderr; its stdout.
fn run_ok(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_craterdex"))
        .args(args)
        .env("CRATERDEX_HOME", dir.join("home"))
        .env("CRATERDEX_PYTHON", "/nonexistent/python")
        .current_dir(dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{args:?}: {err}");
    assert!(
        !err.contains("ERROR"),
        "GDAL's messages reached stderr:\n{err}"
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `dedup --image` of two overlapping GeoTIFFs (the second's corner 160 px down and right
/// of the first's) and `detect --crops` of them: the crops carry each crater's place on the
/// body, so the craters are compared there (too few to register the images by pattern,
/// they are placed as georeferenced); each crater both images show whole is one group of
/// its two views, at its place on the body in merged.csv.
#[test]
fn dedup_image_groups_the_craters_of_overlapping_geotiffs_on_the_body() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    with_tiny_model_and_detector(dir);
    let run = |args: &[&str]| run_ok(dir, args);
    let g = craterdex_detect::testing::discs(SIZE as usize, SIZE as usize, &CRATERS);
    let ground = image::GrayImage::from_raw(SIZE, SIZE, g.pixels).unwrap();
    let (part, shift) = (480u32, 160u32);
    for (name, at) in [("a", 0), ("b", shift)] {
        let png = dir.join(format!("{name}.png"));
        image::imageops::crop_imm(&ground, at, at, part, part)
            .to_image()
            .save(&png)
            .unwrap();
        georeference_at(&png, &dir.join(format!("{name}.tif")), at, part);
    }
    std::fs::write(
        dir.join("rule.json"),
        r#"{"match_confidence":0.5,"new_confidence":0.4,"max_offset_radii":0.5,
            "max_diameter_ratio":1.5,"body_radius_km":3396.19,
            "appearance_weights":[0.0,0.0],"geometry_weights":[10.0,0.0,-20.0,-20.0],
            "registered":{"max_offset_radii":0.5,"max_diameter_ratio":1.5,
                          "weights":[10.0,0.0,-20.0,-20.0]},
            "source":"test"}"#,
    )
    .unwrap();
    let said = run(&[
        "dedup",
        "--image",
        "a.tif",
        "b.tif",
        "--out",
        "dd",
        "--detector",
        "bright",
        "--rule",
        "rule.json",
        "--model",
        "home/models/tiny",
        "--size",
        "16",
    ]);
    // each crop's place on the body is its crater's centre on the ground
    let crops = dir.join("dd/crops.csv");
    let (ids, sources) = (csv_column(&crops, "id"), csv_column(&crops, "source"));
    let (lats, lons) = (csv_column(&crops, "lat"), csv_column(&crops, "lon"));
    let f = |v: &str| v.parse::<f64>().unwrap();
    let mut crater_of = std::collections::HashMap::new();
    for i in 0..ids.len() {
        let k = CRATERS
            .iter()
            .position(|&(x, y, d)| {
                let (lat, lon) = lat_lon(x, y);
                let px_deg = (PIXEL_M / MARS_RADIUS_M).to_degrees();
                (f(&lats[i]) - lat).hypot(f(&lons[i]) - lon) < (0.25 * d + 2.0) * px_deg
            })
            .unwrap_or_else(|| {
                panic!(
                    "crop {} is on no crater: {}",
                    ids[i],
                    std::fs::read_to_string(&crops).unwrap()
                )
            });
        crater_of.insert(ids[i].clone(), (sources[i].clone(), k));
    }
    let whole_in = |(x, y, d): (f64, f64, f64), at: f64| {
        let (lo, hi) = (at + d, at + part as f64 - d - 1.0);
        x >= lo && x <= hi && y >= lo && y <= hi
    };
    let shared: Vec<usize> = (0..CRATERS.len())
        .filter(|&k| whole_in(CRATERS[k], 0.0) && whole_in(CRATERS[k], shift as f64))
        .collect();
    assert!(shared.len() >= 2, "{shared:?}");
    let groups = dir.join("dd/groups.csv");
    let (group, member) = (csv_column(&groups, "group"), csv_column(&groups, "id"));
    for k in &shared {
        let of_k: Vec<usize> = (0..member.len())
            .filter(|&i| crater_of[&member[i]].1 == *k)
            .collect();
        let mut seen: Vec<&str> = of_k
            .iter()
            .map(|&i| crater_of[&member[i]].0.as_str())
            .collect();
        seen.sort();
        assert_eq!(seen, ["a", "b"], "crater {k}:\n{said}");
        assert_eq!(group[of_k[0]], group[of_k[1]], "crater {k}:\n{said}");
    }
    assert_eq!(member.len(), 2 * shared.len(), "{said}");
    let merged = dir.join("dd/merged.csv");
    assert!(csv_column(&merged, "lat").iter().all(|v| !v.is_empty()));
}

/// `link --image` of a GeoTIFF and a plain PNG of the same ground against a catalogue of
/// crops: each crater of the GeoTIFF, detected or looked for in place, gets its latitude,
/// longitude and km from the GeoTIFF's projection in links.csv and the `links` map layer
/// (centres and rims on Mars's IAU system, and their GeoPackage); the PNG's craters get none.
/// The rule decides by geometry (the tiny model's appearance means nothing): what is tested
/// is where the craters are put, not the decisions.
#[test]
fn link_image_places_the_craters_of_a_geotiff_on_the_body() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    with_tiny_model_and_detector(dir);
    let run = |args: &[&str]| run_ok(dir, args);
    let size = ["--model", "home/models/tiny", "--size", "16"];
    let g = craterdex_detect::testing::discs(SIZE as usize, SIZE as usize, &CRATERS);
    let ground = image::GrayImage::from_raw(SIZE, SIZE, g.pixels).unwrap();
    ground.save(dir.join("plain.png")).unwrap();
    georeference(&dir.join("plain.png"), &dir.join("mosaic.tif"));
    // the catalogue: crops of all but the first two craters
    std::fs::create_dir_all(dir.join("cat")).unwrap();
    let mut csv = String::from("id,crater_id,source,x,y,diameter_px\n");
    for (i, &(x, y, d)) in CRATERS.iter().enumerate().skip(2) {
        let (x0, y0) = ((x - d) as u32, (y - d) as u32);
        image::imageops::crop_imm(&ground, x0, y0, 2 * d as u32, 2 * d as u32)
            .to_image()
            .save(dir.join(format!("cat/c{i}.png")))
            .unwrap();
        csv += &format!("c{i},c{i},catalogue,{x},{y},{d}\n");
    }
    std::fs::write(dir.join("cat.csv"), csv).unwrap();
    run(&[
        &["index", "build", "--dir", "cat", "--out", "idx"][..],
        &size,
    ]
    .concat());
    std::fs::write(
        dir.join("rule.json"),
        craterdex_testkit::REGISTERED_GEOMETRY_RULE,
    )
    .unwrap();
    let link = [
        "link",
        "--index",
        "idx",
        "--image",
        "mosaic.tif",
        "plain.png",
    ];
    let to = [
        "--out",
        "links",
        "--detector",
        "bright",
        "--rule",
        "rule.json",
    ];
    run(&[&link[..], &to, &size].concat());
    let csv = dir.join("links/links.csv");
    let column = |name: &str| csv_column(&csv, name);
    let (images, xs, decisions) = (column("image"), column("x"), column("decision"));
    let on_mosaic = assert_placed(&csv, "plain");
    assert!(images.iter().all(|i| i == "plain" || i == "mosaic"));
    // every crater of the ground is looked at once in each image
    assert_eq!(
        on_mosaic,
        CRATERS.len(),
        "{}",
        std::fs::read_to_string(&csv).unwrap()
    );
    assert_eq!(images.len(), 2 * CRATERS.len());
    // the map layer: the mosaic's craters alone, on Mars, by decision
    let layer = dir.join("links/links.geojson");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&layer).unwrap()).unwrap();
    let code = craterdex_workflows::geometry::iau_crs(MARS_RADIUS_M / 1000.0).unwrap();
    assert_eq!(doc["crs"]["properties"]["name"], code);
    let features = doc["features"].as_array().unwrap();
    assert_eq!(features.len(), on_mosaic);
    for feature in features {
        let p = &feature["properties"];
        let at = feature["geometry"]["coordinates"].as_array().unwrap();
        assert_eq!(at[0].as_f64(), p["lon"].as_f64(), "{feature}");
        assert_eq!(at[1].as_f64(), p["lat"].as_f64(), "{feature}");
        let row = (0..images.len())
            .find(|&i| images[i] == "mosaic" && xs[i] == format!("{:.2}", p["x"].as_f64().unwrap()))
            .unwrap();
        assert_eq!(p["decision"].as_str(), Some(decisions[row].as_str()));
    }
    for (name, count) in [("links", on_mosaic), ("links_rims", on_mosaic)] {
        let info = ogrinfo(&dir.join("links/links.gpkg"), name);
        assert_eq!(feature_count(&info), count, "{info}");
    }
    assert!(dir.join("links/links.qml").exists() && dir.join("links/links_rims.qml").exists());
    opens_in_qgis(
        "link_image_places_the_craters_of_a_geotiff_on_the_body",
        &[dir.join("links")],
    );
}

/// The `sh` block under the section's heading in docs/guide/workflows.md.
fn documented_commands() -> Vec<String> {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/guide/workflows.md"),
    )
    .unwrap();
    let section = doc
        .split("## A Robbins catalogue and a GeoTIFF mosaic, into QGIS")
        .nth(1)
        .expect("the section is in docs/guide/workflows.md");
    let block = section.split("```sh\n").nth(1).unwrap();
    block
        .split("```")
        .next()
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(str::to_string)
        .collect()
}

fn model_is_fetched() -> bool {
    let home = std::env::var_os("CRATERDEX_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/craterdex")
        });
    home.join("models/dinov2-vits14-imgfocus/config.json")
        .exists()
}

/// `ogrinfo`'s summary of `layer` (its feature count, fields, coordinate system).
fn ogrinfo(path: &Path, layer: &str) -> String {
    ogrinfo_with(&["-so", "-ro"], path, layer)
}

/// `ogrinfo`'s listing of every feature of `layer` (attributes included).
fn ogrinfo_features(path: &Path, layer: &str) -> String {
    ogrinfo_with(&["-ro", "-q"], path, layer)
}

fn ogrinfo_with(options: &[&str], path: &Path, layer: &str) -> String {
    let out = Command::new("ogrinfo")
        .args(options)
        .arg(path)
        .arg(layer)
        .output()
        .expect("ogrinfo (gdal-bin)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn feature_count(info: &str) -> usize {
    info.lines()
        .find_map(|l| l.strip_prefix("Feature Count: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn csv_column(path: &Path, column: &str) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let at = header.iter().position(|h| *h == column).unwrap();
    lines
        .map(|l| l.split(',').nth(at).unwrap_or("").to_string())
        .collect()
}

#[test]
fn the_documented_robbins_and_geotiff_workflow_reaches_qgis() {
    if !model_is_fetched() {
        craterdex_testkit::skip(
            "the_documented_robbins_and_geotiff_workflow_reaches_qgis",
            "the documented commands use the default model: run `craterdex model fetch` first",
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_mosaic(dir, "first", &CRATERS, 0);
    let second: Vec<_> = CRATERS[..10].iter().chain(&YOUNG).copied().collect();
    write_mosaic(dir, "second", &second, 1);

    // the catalogue as published: Robbins columns, 0-360 longitudes, crater 5 listed twice
    let mut robbins = String::from("CRATER_ID,LAT_CIRC_IMG,LON_CIRC_IMG,DIAM_CIRC_IMG\n");
    for (i, &(x, y, d)) in CRATERS.iter().enumerate() {
        let (lat, lon) = lat_lon(x, y);
        robbins.push_str(&format!(
            "02-0-{i:06},{lat:.6},{:.6},{:.3}\n",
            lon.rem_euclid(360.0),
            km(d)
        ));
    }
    let (x5, y5, d5) = CRATERS[5];
    let (lat, lon) = lat_lon(x5 + 2.0, y5 - 1.0);
    robbins.push_str(&format!(
        "02-0-000099,{lat:.6},{:.6},{:.3}\n",
        lon.rem_euclid(360.0),
        km(d5 * 1.03)
    ));
    std::fs::write(dir.join("robbins.csv"), robbins).unwrap();
    // a detector's list on the second observation: -180..180, common column names
    let mut detections = String::from("id,lat,lon,diameter_km\n");
    for (i, &(x, y, d)) in second.iter().enumerate() {
        let (lat, lon) = lat_lon(x + 1.0, y);
        detections.push_str(&format!("det{i},{lat:.6},{lon:.6},{:.3}\n", km(d * 0.97)));
    }
    std::fs::write(dir.join("second.csv"), detections).unwrap();

    let bin = PathBuf::from(env!("CARGO_BIN_EXE_craterdex"));
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let commands = documented_commands();
    assert_eq!(commands.len(), 5, "{commands:?}");
    for command in &commands {
        let out = Command::new("sh")
            .args(["-c", command])
            .current_dir(dir)
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{command}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // each detection's two crops (2x and 3x its diameter) decided: the craters both
    // observations show matched to their catalogue entry across the 0/360 seam; the young
    // ones new, added, and their second crop then matched to the first
    let links = dir.join("links/links.csv");
    let (crater, decision, best, inserted) = (
        csv_column(&links, "query_crater_id"),
        csv_column(&links, "decision"),
        csv_column(&links, "best_crater_id"),
        csv_column(&links, "inserted"),
    );
    assert_eq!(decision.len(), 2 * second.len());
    for i in 0..crater.len() {
        let det: usize = crater[i].trim_start_matches("second-det").parse().unwrap();
        let row = (decision[i].as_str(), best[i].as_str());
        if det < 10 {
            assert_eq!(
                row,
                ("match", format!("first-02-0-{det:06}").as_str()),
                "row {i}"
            );
        } else if inserted[i] == "true" {
            assert_eq!(row.0, "new", "row {i}");
        } else {
            assert_eq!(row, ("match", crater[i].as_str()), "row {i}");
        }
    }
    assert_eq!(inserted.iter().filter(|v| *v == "true").count(), 2);
    // the crater the catalogue lists twice is one group of the merged catalogue
    let (group, member) = (
        csv_column(&dir.join("dedup/groups.csv"), "group"),
        csv_column(&dir.join("dedup/groups.csv"), "crater_id"),
    );
    let group_of = |c: &str| group[member.iter().position(|m| m == c).unwrap()].clone();
    assert_eq!(group_of("first-02-0-000005"), group_of("first-02-0-000099"));

    // the layers, as GDAL (and so QGIS) reads them: Mars's IAU 2015 code, every feature
    for (package, layers) in [
        ("links/links.gpkg", ["links", "links_rims"]),
        ("dedup/merged.gpkg", ["merged", "merged_rims"]),
    ] {
        for layer in layers {
            let info = ogrinfo(&dir.join(package), layer);
            assert!(info.contains("Mars"), "{info}");
            assert!(info.contains("49900"), "{info}");
            let geojson = dir.join(package).with_file_name(format!("{layer}.geojson"));
            let doc: serde_json::Value =
                serde_json::from_slice(&std::fs::read(geojson).unwrap()).unwrap();
            assert_eq!(
                feature_count(&info),
                doc["features"].as_array().unwrap().len()
            );
            assert!(feature_count(&info) > 0);
        }
    }

    opens_in_qgis(
        "the_documented_robbins_and_geotiff_workflow_reaches_qgis",
        &[dir.join("links"), dir.join("dedup")],
    );
}

/// The map layers in `dirs` open in QGIS on Mars with their features and styles
/// (scripts/qgis_check.py), where QGIS's Python bindings are installed; `test` is skipped
/// in part otherwise.
fn opens_in_qgis(test: &str, dirs: &[PathBuf]) {
    let qgis = Command::new("/usr/bin/python3")
        .args(["-c", "import qgis.core"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !qgis {
        craterdex_testkit::skip(
            &format!("{test} (QGIS part)"),
            "QGIS's Python bindings (python3-qgis) are not installed",
        );
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/qgis_check.py");
    let out = Command::new("/usr/bin/python3")
        .arg(script)
        .args(["--body", "Mars", "--radius-m", "3396190"])
        .args(dirs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
