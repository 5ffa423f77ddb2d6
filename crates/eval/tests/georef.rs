//! Georeferenced input on small GeoTIFFs written here with GDAL: Mars equirectangular mosaics
//! with dark craters drawn at known places, and km catalogues pointing at them.
#![cfg(feature = "gdal")]

use craterdex_eval::benchbuild::{build, BuildOptions, Input};
use craterdex_eval::catalogue::GeoCrater;
use craterdex_eval::georef::Raster;
use gdal::raster::Buffer;
use gdal::spatial_ref::SpatialRef;
use gdal::DriverManager;
use std::path::Path;

const MARS_RADIUS_M: f64 = 3_396_190.0;
const PIXEL_M: f64 = 100.0;

/// An 8-bit equirectangular GeoTIFF whose top-left corner is at (lon0, lat0) degrees, with
/// dark disks at the given pixel centres and diameters.
fn write_mosaic(path: &Path, lon0: f64, lat0: f64, size: usize, disks: &[(f64, f64, f64)]) {
    let driver = DriverManager::get_driver_by_name("GTiff").unwrap();
    let mut ds = driver
        .create_with_band_type::<u8, _>(path, size, size, 1)
        .unwrap();
    let x0 = MARS_RADIUS_M * lon0.to_radians();
    let y0 = MARS_RADIUS_M * lat0.to_radians();
    ds.set_geo_transform(&[x0, PIXEL_M, 0.0, y0, 0.0, -PIXEL_M])
        .unwrap();
    let srs = SpatialRef::from_proj4(&format!(
        "+proj=eqc +lat_ts=0 +lat_0=0 +lon_0=0 +x_0=0 +y_0=0 +a={MARS_RADIUS_M} +b={MARS_RADIUS_M} +units=m +no_defs"
    ))
    .unwrap();
    ds.set_spatial_ref(&srs).unwrap();
    let mut px = vec![0u8; size * size];
    for y in 0..size {
        for x in 0..size {
            let mut v = 150.0 + 40.0 * ((x as f64 * 0.21).sin() * (y as f64 * 0.13).cos());
            for &(cx, cy, d) in disks {
                let (dx, dy) = (x as f64 - cx, y as f64 - cy);
                if (dx * dx + dy * dy).sqrt() < d / 2.0 {
                    v -= 110.0;
                }
            }
            px[y * size + x] = v.clamp(0.0, 255.0) as u8;
        }
    }
    let mut buf = Buffer::new((size, size), px);
    ds.rasterband(1)
        .unwrap()
        .write((0, 0), (size, size), &mut buf)
        .unwrap();
}

/// Latitude and longitude of a pixel centre of a mosaic made by `write_mosaic`.
fn lat_lon(lon0: f64, lat0: f64, x: f64, y: f64) -> (f64, f64) {
    let deg = |m: f64| (m / MARS_RADIUS_M).to_degrees();
    (
        lat0 - deg((y + 0.5) * PIXEL_M),
        lon0 + deg((x + 0.5) * PIXEL_M),
    )
}

#[test]
fn a_km_catalogue_lands_on_its_craters() {
    let d = tempfile::tempdir().unwrap();
    let tif = d.path().join("mars.tif");
    let disks = [
        (120.0, 130.0, 40.0),
        (300.0, 220.0, 24.0),
        (200.0, 330.0, 30.0),
    ];
    write_mosaic(&tif, 10.0, 1.0, 420, &disks);
    let mut csv = String::from("CRATER_ID,LAT_CIRC_IMG,LON_CIRC_IMG,DIAM_CIRC_IMG\n");
    for (i, &(x, y, dpx)) in disks.iter().enumerate() {
        let (lat, lon) = lat_lon(10.0, 1.0, x, y);
        // The second crater is given in the 0-360 convention shifted by a turn.
        let lon = if i == 1 { lon + 360.0 } else { lon };
        csv.push_str(&format!("c{i},{lat},{lon},{}\n", dpx * PIXEL_M / 1000.0));
    }
    csv.push_str("far,45.0,120.0,3.0\n"); // not on this mosaic
    let cat = d.path().join("robbins.csv");
    std::fs::write(&cat, csv).unwrap();

    let raster = Raster::open(&tif).unwrap();
    let geo = craterdex_eval::catalogue::read_geo_catalogue(&cat).unwrap();
    let placed = raster.place(&geo).unwrap();
    assert_eq!(placed.len(), 3, "the far crater is left out");
    for ((g, p), &(x, y, dpx)) in placed.iter().zip(&disks) {
        assert!(
            (p.crater.x - x).abs() < 0.05 && (p.crater.y - y).abs() < 0.05,
            "{g:?} at {},{}",
            p.crater.x,
            p.crater.y
        );
        assert!(
            (p.crater.diameter - dpx).abs() < 0.01 * dpx,
            "{}",
            p.crater.diameter
        );
        assert!(
            (p.aspect - 1.0 / (g.lat.to_radians().cos())).abs() < 1e-3,
            "{}",
            p.aspect
        );
    }

    let out = d.path().join("bench");
    let o = BuildOptions {
        views: 2,
        ..Default::default()
    };
    let input = Input::Mosaic {
        raster: tif.clone(),
        catalogue: cat.clone(),
    };
    let r = build(&[input], &out, &o).unwrap();
    assert_eq!(r.craters, 3);
    assert_eq!(r.gallery_images, 6);
    assert_eq!(r.query_images, 6);
    let b = craterdex_eval::manifest::load(&out.join("splits/test.json"), None).unwrap();
    let g = &b.manifest.gallery_images[0];
    assert_eq!(g.crater(), "mars-c0");
    assert!((g.diameter_km.unwrap() - 4.0).abs() < 1e-9);
    assert!(g.lat.is_some() && g.lon.is_some());
    // The 2x crop is 80 px wide and its crater (dark) is in the middle, the ring around lighter.
    let img = image::open(out.join(&g.path)).unwrap().to_luma8();
    assert_eq!(img.width(), 80);
    let mean = |r0: f64, r1: f64| {
        let (mut s, mut n) = (0.0, 0);
        for (x, y, p) in img.enumerate_pixels() {
            let r = ((x as f64 - 39.5).powi(2) + (y as f64 - 39.5).powi(2)).sqrt();
            if r >= r0 && r < r1 {
                s += p[0] as f64;
                n += 1;
            }
        }
        s / n as f64
    };
    let (inside, outside) = (mean(0.0, 15.0), mean(25.0, 40.0));
    assert!(
        inside + 60.0 < outside,
        "crater not centred: {inside} vs {outside}"
    );
}

#[test]
fn high_latitude_craters_get_stretched_windows() {
    let d = tempfile::tempdir().unwrap();
    let tif = d.path().join("north.tif");
    write_mosaic(&tif, 0.0, 61.0, 300, &[]);
    let (lat, lon) = lat_lon(0.0, 61.0, 150.0, 150.0);
    let raster = Raster::open(&tif).unwrap();
    let c = GeoCrater {
        id: "n".into(),
        lat,
        lon,
        diameter_km: 2.0,
    };
    let placed = raster.place(&[c]).unwrap();
    let p = &placed[0].1;
    // Equirectangular with lat_ts = 0: east-west pixels shrink by cos(latitude).
    assert!(
        (p.aspect - 1.0 / lat.to_radians().cos()).abs() < 1e-3,
        "{}",
        p.aspect
    );
    assert!((p.aspect - 2.0).abs() < 0.1);
    assert!((p.crater.diameter - 20.0).abs() < 0.1);
    let (side, px) = raster
        .crop(p.crater.x, p.crater.y, 40.0, p.aspect, 0.3)
        .unwrap();
    assert_eq!(side, 40);
    assert_eq!(px.len(), 40 * 40);
    assert!(
        raster.crop(5.0, 5.0, 40.0, p.aspect, 0.0).is_none(),
        "off the mosaic"
    );
}

#[test]
fn unusable_inputs_fail_with_the_file_named() {
    let d = tempfile::tempdir().unwrap();
    let plain = d.path().join("plain.png");
    image::GrayImage::new(32, 32).save(&plain).unwrap();
    let e = format!("{:#}", Raster::open(&plain).err().unwrap());
    assert!(
        e.contains("plain.png") && e.contains("georeferenced"),
        "{e}"
    );
    let e = format!(
        "{:#}",
        Raster::open(&d.path().join("missing.tif")).err().unwrap()
    );
    assert!(e.contains("missing.tif"), "{e}");

    let tif = d.path().join("m.tif");
    write_mosaic(&tif, 0.0, 0.0, 64, &[]);
    let cat = d.path().join("far.csv");
    std::fs::write(&cat, "lat,lon,diameter_km\n40,100,2\n").unwrap();
    let input = Input::Mosaic {
        raster: tif,
        catalogue: cat,
    };
    let e = format!(
        "{:#}",
        build(&[input], &d.path().join("b"), &BuildOptions::default()).unwrap_err()
    );
    assert!(e.contains("far.csv") && e.contains("m.tif"), "{e}");
}

/// An 8-bit band whose no-data value is 255: its no-data pixels read as level 0 (the margin
/// the detector fills) and its data's black as level 1, so a shadow is not read as margin.
#[test]
fn an_eight_bit_band_reads_its_own_no_data_value_as_level_zero() {
    use craterdex_eval::georef::Levels;
    let d = tempfile::tempdir().unwrap();
    let tif = d.path().join("nodata255.tif");
    write_mosaic(&tif, 0.0, 0.0, 16, &[]);
    let levels = |x: usize, y: usize| -> u8 {
        match (x < 4, (x, y) == (9, 9), (x, y) == (12, 3)) {
            (true, _, _) => 255,
            (_, true, _) => 0,
            (_, _, true) => 77,
            _ => 120,
        }
    };
    {
        let ds = gdal::Dataset::open_ex(
            &tif,
            gdal::DatasetOptions {
                open_flags: gdal::GdalOpenFlags::GDAL_OF_UPDATE,
                ..Default::default()
            },
        )
        .unwrap();
        let mut band = ds.rasterband(1).unwrap();
        let px: Vec<u8> = (0..256).map(|i| levels(i % 16, i / 16)).collect();
        band.write((0, 0), (16, 16), &mut Buffer::new((16, 16), px))
            .unwrap();
        band.set_no_data_value(Some(255.0)).unwrap();
    }
    let Levels::Eight(read) = Raster::open(&tif).unwrap().levels().unwrap() else {
        panic!("an 8-bit band reads as 8-bit levels");
    };
    for (i, &v) in read.iter().enumerate() {
        let want = match levels(i % 16, i / 16) {
            255 => 0,
            0 => 1,
            other => other,
        };
        assert_eq!(v, want, "pixel ({}, {})", i % 16, i / 16);
    }
}
