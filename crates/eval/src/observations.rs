//! A second observation of every tile, simulated from the real image, with the true
//! correspondence: the benchmark for linking and deduplicating catalogues.
//!
//! First observation: a crop of 2x its diameter around every crater of at least
//! `min_diameter` pixels. Second observation, per tile: the image seen rotated by a random
//! angle and at another resolution (crops resampled by a random scale factor), with new
//! brightness, contrast and gamma and blur or noise per crop; each crater detected with a
//! jitter of its centre and diameter, some missed, and false detections added at random
//! places. Its catalogue is georeferenced with an error: one shift per tile (random
//! direction, a given multiple of the tile's median crater radius) for each error level,
//! and a small rotation and scale error of the whole tile. With `observation_frame` (the
//! default) the positions are in the second image's own pixel frame, turned and scaled as
//! its crops are, about the tile's centre (a detector run on an unprojected image reports
//! those); otherwise in the first observation's frame.
//! Sun azimuth is not changed: a 2-D image cannot relight a crater honestly.
//!
//! Positions are written in one pixel frame (`x`, `y`, `diameter_px`): a tile's pixels
//! shifted by a million pixels per tile, so craters of different tiles are never near.
//! Layout: `first/` and `first.csv`, `second/` and `second-e{error}.csv` per error level,
//! `metadata.json`.

use crate::benchbuild::{gauss, photometric, save, BuildOptions, Tile};
use crate::catalogue::read_pixel_catalogue;
use crate::error::{Error, Result};
use craterdex_errors::{ensure, IoContext};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Pixels between the frames of two tiles.
pub const FRAME_STRIDE: f64 = 1e6;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ObservationOptions {
    pub min_diameter: f64,
    /// Crop side over crater diameter.
    pub context: f64,
    /// The second observation is rotated by up to this many degrees either way.
    pub max_rotation_deg: f64,
    /// Resolution of the second observation relative to the first.
    pub scale: (f64, f64),
    /// Detection jitter of centre (per axis) and diameter, as a fraction of the diameter.
    pub jitter: f64,
    /// Georeferencing errors, in median crater radii of the tile.
    pub georef_errors: Vec<f64>,
    pub missed: f64,
    /// False detections, as a fraction of the tile's craters.
    pub false_detections: f64,
    /// Largest rotation (degrees) and relative scale error of the georeferencing
    /// transform itself, drawn once per tile.
    pub transform_error: (f64, f64),
    /// Positions in the second image's own frame (turned and scaled as its crops).
    pub observation_frame: bool,
    pub seed: u64,
}

impl Default for ObservationOptions {
    fn default() -> Self {
        ObservationOptions {
            min_diameter: 8.0,
            context: 2.0,
            max_rotation_deg: 180.0,
            scale: (0.7, 1.4),
            jitter: 0.05,
            georef_errors: vec![0.5, 4.0, 10.0],
            missed: 0.1,
            false_detections: 0.1,
            transform_error: (2.0, 0.02),
            observation_frame: true,
            seed: 0,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ObservationReport {
    pub craters: usize,
    pub first: usize,
    pub second: usize,
    pub missed: usize,
    pub false_detections: usize,
    pub skipped_outside: usize,
}

/// The CSV written for the second observation at one error level.
pub fn second_csv_name(error: f64) -> String {
    format!("second-e{error}.csv")
}

struct Row {
    id: String,
    crater_id: String,
    source: String,
    x: f64,
    y: f64,
    d: f64,
}

fn write_rows(path: &Path, rows: &[Row]) -> Result<()> {
    let mut w = csv::Writer::from_path(path)?;
    w.write_record(["id", "crater_id", "source", "x", "y", "diameter_px"])?;
    for r in rows {
        w.write_record([
            r.id.clone(),
            r.crater_id.clone(),
            r.source.clone(),
            format!("{:.3}", r.x),
            format!("{:.3}", r.y),
            format!("{:.3}", r.d),
        ])?;
    }
    w.flush().io("write", path)?;
    Ok(())
}

/// How a tile's second observation reports positions.
#[derive(Clone, Copy, Debug)]
struct SecondFrame {
    centre: (f64, f64),
    /// The image's turn (its crops are cut turned by it) and resolution.
    angle: f64,
    scale: f64,
    /// The georeferencing transform's own error.
    rotation_error: f64,
    scale_error: f64,
    direction: f64,
    median_radius: f64,
    offset: f64,
}

impl SecondFrame {
    /// The reported centre and diameter of a detection at (x, y, d) of the first frame, at
    /// a georeferencing error of `error` median radii: the crop at angle `a` samples the
    /// tile at `c + R(a) u`, so a point `p` lies at `R(-a)(p - c)` in the crop's axes.
    fn report(&self, x: f64, y: f64, d: f64, error: f64) -> (f64, f64, f64) {
        let s = self.scale * self.scale_error;
        let a = -(self.angle + self.rotation_error);
        let (u, v) = (x - self.centre.0, y - self.centre.1);
        let shift = error * self.median_radius * self.scale;
        (
            self.centre.0
                + s * (u * a.cos() - v * a.sin())
                + shift * self.direction.cos()
                + self.offset,
            self.centre.1 + s * (u * a.sin() + v * a.cos()) + shift * self.direction.sin(),
            d * s,
        )
    }
}

/// Simulates the two observations of `tiles` (image, pixel crater list) into `out`
/// (replaced atomically).
pub fn simulate(
    tiles: &[(PathBuf, PathBuf)],
    out: &Path,
    o: &ObservationOptions,
) -> Result<ObservationReport> {
    ensure!(!tiles.is_empty(), Error::Invalid("no tiles given".into()));
    ensure!(
        o.scale.0 > 0.0 && o.scale.0 <= o.scale.1 && o.context > 0.0,
        Error::Invalid(format!(
            "invalid scale range {:?} or context {}",
            o.scale, o.context
        ))
    );
    let tmp = craterdex_durable::tempdir_beside(out)?;
    craterdex_durable::create_dir_all(&tmp.join("first"))?;
    craterdex_durable::create_dir_all(&tmp.join("second"))?;
    let photo = BuildOptions::default();
    let mut report = ObservationReport::default();
    let mut first = Vec::new();
    // per second-observation entry: its detected position (first frame) and its tile's
    // frame, so each error level writes its own catalogue
    let mut second: Vec<(Row, SecondFrame)> = Vec::new();
    for (ti, (image, craters)) in tiles.iter().enumerate() {
        let tile = Tile::load(image)?;
        let stem = image
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_else(|| format!("tile{ti}"));
        let mut rng = ChaCha8Rng::seed_from_u64(o.seed.wrapping_add(ti as u64));
        let list: Vec<_> = read_pixel_catalogue(craters)?
            .into_iter()
            .filter(|c| c.diameter >= o.min_diameter)
            .collect();
        if list.is_empty() {
            continue;
        }
        let mut diameters: Vec<f64> = list.iter().map(|c| c.diameter).collect();
        diameters.sort_by(f64::total_cmp);
        let median_radius = diameters[diameters.len() / 2] / 2.0;
        let angle = rng
            .gen_range(-o.max_rotation_deg..=o.max_rotation_deg)
            .to_radians();
        let scale = rng.gen_range(o.scale.0..=o.scale.1);
        let direction = rng.gen_range(0.0..std::f64::consts::TAU);
        let (max_rot, max_scale) = o.transform_error;
        let rotation_error = rng.gen_range(-max_rot..=max_rot).to_radians();
        let scale_error = 1.0 + rng.gen_range(-max_scale..=max_scale);
        let frame = SecondFrame {
            centre: (tile.w as f64 / 2.0, tile.h as f64 / 2.0),
            angle: if o.observation_frame { angle } else { 0.0 },
            scale: if o.observation_frame { scale } else { 1.0 },
            rotation_error,
            scale_error,
            direction,
            median_radius,
            offset: ti as f64 * FRAME_STRIDE,
        };
        let off = ti as f64 * FRAME_STRIDE;
        let mut second_crop = |id: String,
                               crater_id: String,
                               x: f64,
                               y: f64,
                               d: f64,
                               rng: &mut ChaCha8Rng|
         -> Result<bool> {
            let extent = o.context * d;
            let side = (extent * scale).round().max(8.0) as usize;
            let Some((side, mut px)) = tile.crop_to(x, y, extent, angle, side) else {
                return Ok(false);
            };
            photometric(&mut px, side, &photo, rng);
            save(&tmp.join(format!("second/{id}.png")), side, &px)?;
            second.push((
                Row {
                    id,
                    crater_id,
                    source: format!("{stem}-obs2"),
                    x,
                    y,
                    d,
                },
                frame,
            ));
            Ok(true)
        };
        for c in &list {
            let crater_id = format!("{stem}-{}", c.id);
            let Some((side, px)) = tile.crop(c.x, c.y, o.context * c.diameter, 0.0) else {
                report.skipped_outside += 1;
                continue;
            };
            let id = format!("{crater_id}-o1");
            save(&tmp.join(format!("first/{id}.png")), side, &px)?;
            first.push(Row {
                id,
                crater_id: crater_id.clone(),
                source: format!("{stem}-obs1"),
                x: c.x + off,
                y: c.y,
                d: c.diameter,
            });
            report.craters += 1;
            if rng.gen_bool(o.missed.clamp(0.0, 1.0)) {
                report.missed += 1;
                continue;
            }
            let j = o.jitter * c.diameter;
            let (x, y) = (
                c.x + j * gauss(&mut rng) as f64,
                c.y + j * gauss(&mut rng) as f64,
            );
            let d = (c.diameter * (1.0 + o.jitter * gauss(&mut rng) as f64)).max(1.0);
            if !second_crop(format!("{crater_id}-o2"), crater_id, x, y, d, &mut rng)? {
                report.skipped_outside += 1;
            }
        }
        let n_false = (o.false_detections * list.len() as f64).round() as usize;
        let mut k = 0;
        for attempt in 0..n_false * 20 {
            if k == n_false {
                break;
            }
            let d = diameters[rng.gen_range(0..diameters.len())];
            let (x, y) = (
                rng.gen_range(0.0..tile.w as f64),
                rng.gen_range(0.0..tile.h as f64),
            );
            let id = format!("{stem}-false{attempt}");
            if second_crop(format!("{id}-o2"), id, x, y, d, &mut rng)? {
                k += 1;
            }
        }
        report.false_detections += k;
    }
    ensure!(
        !first.is_empty(),
        Error::Invalid(format!(
            "no crater of at least {} px produced a crop",
            o.min_diameter
        ))
    );
    report.first = first.len();
    report.second = second.len();
    write_rows(&tmp.join("first.csv"), &first)?;
    for &e in &o.georef_errors {
        let rows: Vec<Row> = second
            .iter()
            .map(|(r, f)| {
                let (x, y, d) = f.report(r.x, r.y, r.d, e);
                Row {
                    id: r.id.clone(),
                    crater_id: r.crater_id.clone(),
                    source: r.source.clone(),
                    x,
                    y,
                    d,
                }
            })
            .collect();
        write_rows(&tmp.join(second_csv_name(e)), &rows)?;
    }
    craterdex_durable::write_new(
        &tmp.join("metadata.json"),
        serde_json::to_vec_pretty(&serde_json::json!({"options": o, "report": report}))?,
    )?;
    craterdex_durable::replace_dir(&tmp, out)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{GrayImage, Luma};

    #[test]
    fn writes_both_observations_with_shifted_catalogues() {
        let d = tempfile::tempdir().unwrap();
        let tile = d.path().join("t.png");
        GrayImage::from_fn(300, 300, |x, y| Luma([((x * 7 + y * 3) % 255) as u8]))
            .save(&tile)
            .unwrap();
        let cat = d.path().join("t.csv");
        let mut csv = String::from("long,lat,diameter\n");
        for i in 0..20 {
            csv.push_str(&format!("{},{},12\n", 60 + (i % 5) * 40, 60 + (i / 5) * 40));
        }
        std::fs::write(&cat, csv).unwrap();
        let out = d.path().join("obs");
        let o = ObservationOptions {
            missed: 0.0,
            false_detections: 0.2,
            max_rotation_deg: 15.0,
            georef_errors: vec![0.5, 4.0],
            transform_error: (0.0, 0.0),
            observation_frame: false,
            ..Default::default()
        };
        let r = simulate(&[(tile, cat)], &out, &o).unwrap();
        assert_eq!((r.craters, r.first, r.missed), (20, 20, 0));
        assert_eq!(r.false_detections, 4);
        assert_eq!(r.second, 24);
        let read = |name: &str| -> Vec<Vec<String>> {
            std::fs::read_to_string(out.join(name))
                .unwrap()
                .lines()
                .skip(1)
                .map(|l| l.split(',').map(str::to_string).collect())
                .collect()
        };
        let (small, large) = (read("second-e0.5.csv"), read("second-e4.csv"));
        // the same detections; the larger error moves every centre 4 x 6 = 24 px, the
        // smaller 3 px, in one direction
        let shift = |a: &Vec<String>, b: &Vec<String>| {
            let f = |v: &str| v.parse::<f64>().unwrap();
            (f(&b[3]) - f(&a[3])).hypot(f(&b[4]) - f(&a[4]))
        };
        for (a, b) in small.iter().zip(&large) {
            assert_eq!(a[0], b[0]);
            assert!((shift(a, b) - 21.0).abs() < 1e-2, "{a:?} {b:?}");
        }
        assert_eq!(std::fs::read_dir(out.join("second")).unwrap().count(), 24);
        assert!(image::open(out.join("first/t-00000-o1.png")).is_ok());
    }
}
