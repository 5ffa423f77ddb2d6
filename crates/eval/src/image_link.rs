//! Detect, then link, measured on real tiles seen a second time with no crater list (issue
//! 54 item 4; `craterdex eval-link --image`): what `link --image` finds of a catalogue made
//! from the tile's labels, and what it reports new of the craters left out of it.
//!
//! Per tile, the catalogue is a crop of every labelled crater of at least
//! [`CATALOGUE_MIN_DIAMETER`] pixels whose crop fits in the tile, except a seeded share of
//! those of at least [`SCORED_DIAMETER`] pixels (the craters missing from the catalogue).
//! The second observation is the whole tile turned (up to 180 degrees either way), scaled,
//! with another gamma and contrast, then blurred or noised, on a canvas holding all of it
//! (black outside the tile). It re-samples the catalogue's own pixels: no other sun, no
//! other sensor. Each row `link --image` gives is mapped back to the tile and compared with
//! the labels by [`crate::detection::finds`].

use crate::catalogue::Crater;
use crate::detection::{finds, Circle};
use crate::error::{Error, Result};
use craterdex_engine::{Engine, Extractor, ImageMeta, IndexRecipe, LearnFrom, Progress};
use craterdex_errors::ensure;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

/// Smallest labelled crater given a catalogue crop.
pub const CATALOGUE_MIN_DIAMETER: f64 = 16.0;
/// Craters scored, and the ones some are held out of the catalogue from.
pub const SCORED_DIAMETER: f64 = 20.0;

/// How the second observation differs from the tile; `Default` is the setting.
#[derive(Clone, Debug, Serialize)]
pub struct SecondViewOptions {
    /// Turned by up to this many degrees either way.
    pub max_rotation_deg: f64,
    /// Scaled by a factor in this range.
    pub scale: (f64, f64),
    pub gamma: (f64, f64),
    pub contrast: (f64, f64),
    /// Gaussian blur of this sigma range (pixels), or, the other half of the time, noise of
    /// this standard deviation range (8-bit levels).
    pub blur_sigma: (f64, f64),
    pub noise_sigma: (f64, f64),
    /// Share of the scored craters left out of the catalogue.
    pub held_out: f64,
}

impl Default for SecondViewOptions {
    fn default() -> Self {
        SecondViewOptions {
            max_rotation_deg: 180.0,
            scale: (0.75, 1.3),
            gamma: (0.7, 1.4),
            contrast: (0.8, 1.2),
            blur_sigma: (0.5, 1.2),
            noise_sigma: (2.0, 6.0),
            held_out: 0.2,
        }
    }
}

/// The turn and scale of a second observation: tile point `p` lies at `s R (p - c0) + c1`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ViewTransform {
    pub rotation_deg: f64,
    pub scale: f64,
    /// The tile's centre and the canvas's.
    pub tile_centre: (f64, f64),
    pub view_centre: (f64, f64),
}

impl ViewTransform {
    /// A point of the second observation in the tile's pixels.
    pub fn to_tile(&self, x: f64, y: f64) -> (f64, f64) {
        let (sin, cos) = self.rotation_deg.to_radians().sin_cos();
        let (dx, dy) = (
            (x - self.view_centre.0) / self.scale,
            (y - self.view_centre.1) / self.scale,
        );
        (
            self.tile_centre.0 + cos * dx + sin * dy,
            self.tile_centre.1 - sin * dx + cos * dy,
        )
    }

    /// [`ViewTransform::to_tile`] of pixel positions as detections and labels give them
    /// (pixel `i` centred at `i`, not `i + 0.5`).
    pub fn pixel_in_tile(&self, x: f64, y: f64) -> (f64, f64) {
        let (x, y) = self.to_tile(x + 0.5, y + 0.5);
        (x - 0.5, y - 0.5)
    }

    /// A point of the tile in the second observation's pixels.
    pub fn to_view(&self, x: f64, y: f64) -> (f64, f64) {
        let (sin, cos) = self.rotation_deg.to_radians().sin_cos();
        let (u, v) = (x - self.tile_centre.0, y - self.tile_centre.1);
        (
            self.view_centre.0 + self.scale * (cos * u - sin * v),
            self.view_centre.1 + self.scale * (sin * u + cos * v),
        )
    }
}

/// A second observation of a tile and how it was made.
pub struct SecondView {
    pub image: image::GrayImage,
    pub transform: ViewTransform,
    pub gamma: f64,
    pub contrast: f64,
    /// `blur` or `noise`.
    pub wear: &'static str,
}

/// The tile turned, scaled (bilinear), relit and worn, on a canvas holding all of it.
pub fn second_view(
    tile: &image::GrayImage,
    o: &SecondViewOptions,
    rng: &mut ChaCha8Rng,
) -> SecondView {
    let (w, h) = (tile.width() as f64, tile.height() as f64);
    let rotation_deg = rng.gen_range(-o.max_rotation_deg..=o.max_rotation_deg);
    let scale = rng.gen_range(o.scale.0..=o.scale.1);
    let (sin, cos) = rotation_deg.to_radians().sin_cos();
    let corners = [
        (-w / 2.0, -h / 2.0),
        (w / 2.0, -h / 2.0),
        (-w / 2.0, h / 2.0),
        (w / 2.0, h / 2.0),
    ];
    let span = |f: &dyn Fn(f64, f64) -> f64| {
        let v: Vec<f64> = corners.iter().map(|&(x, y)| scale * f(x, y)).collect();
        v.iter().cloned().fold(f64::MIN, f64::max) - v.iter().cloned().fold(f64::MAX, f64::min)
    };
    let (vw, vh) = (
        span(&|x, y| cos * x - sin * y).ceil() as u32,
        span(&|x, y| sin * x + cos * y).ceil() as u32,
    );
    let transform = ViewTransform {
        rotation_deg,
        scale,
        tile_centre: (w / 2.0, h / 2.0),
        view_centre: (vw as f64 / 2.0, vh as f64 / 2.0),
    };
    let gamma = rng.gen_range(o.gamma.0..=o.gamma.1);
    let contrast = rng.gen_range(o.contrast.0..=o.contrast.1);
    let mut inside = vec![false; (vw * vh) as usize];
    let mut image = image::GrayImage::new(vw, vh);
    for y in 0..vh {
        for x in 0..vw {
            // pixel centres: pixel (i, j) covers [i, i + 1)
            let (tx, ty) = transform.to_tile(x as f64 + 0.5, y as f64 + 0.5);
            let Some(v) = bilinear(tile, tx - 0.5, ty - 0.5) else {
                continue;
            };
            inside[(y * vw + x) as usize] = true;
            let v = ((v / 255.0).powf(gamma) - 0.5) * contrast + 0.5;
            image.put_pixel(
                x,
                y,
                image::Luma([(v.clamp(0.0, 1.0) * 255.0).round() as u8]),
            );
        }
    }
    let wear = if rng.gen_bool(0.5) {
        let sigma = rng.gen_range(o.blur_sigma.0..=o.blur_sigma.1);
        image = image::imageops::blur(&image, sigma as f32);
        "blur"
    } else {
        let sd = rng.gen_range(o.noise_sigma.0..=o.noise_sigma.1);
        for p in image.pixels_mut() {
            let v = p.0[0] as f64 + sd * crate::benchbuild::gauss(rng) as f64;
            p.0[0] = v.clamp(0.0, 255.0).round() as u8;
        }
        "noise"
    };
    for (p, &inside) in image.pixels_mut().zip(&inside) {
        if !inside {
            p.0[0] = 0;
        }
    }
    SecondView {
        image,
        transform,
        gamma,
        contrast,
        wear,
    }
}

/// The tile's value at `(x, y)` (pixel centres at whole numbers), `None` outside it.
fn bilinear(tile: &image::GrayImage, x: f64, y: f64) -> Option<f64> {
    let (w, h) = (tile.width() as f64, tile.height() as f64);
    if x < -0.5 || y < -0.5 || x > w - 0.5 || y > h - 0.5 {
        return None;
    }
    let (x, y) = (x.clamp(0.0, w - 1.0), y.clamp(0.0, h - 1.0));
    let (x0, y0) = (x.floor() as u32, y.floor() as u32);
    let (x1, y1) = (
        (x0 + 1).min(tile.width() - 1),
        (y0 + 1).min(tile.height() - 1),
    );
    let (fx, fy) = (x - x0 as f64, y - y0 as f64);
    let at = |x: u32, y: u32| tile.get_pixel(x, y).0[0] as f64;
    Some(
        (at(x0, y0) * (1.0 - fx) + at(x1, y0) * fx) * (1.0 - fy)
            + (at(x0, y1) * (1.0 - fx) + at(x1, y1) * fx) * fy,
    )
}

/// The labelled craters a tile's catalogue holds, the scored ones held out of it, and the
/// catalogue's errors ([`Phantom`]s).
pub struct CatalogueSplit {
    pub catalogue: Vec<Crater>,
    pub held_out: Vec<Crater>,
    pub phantoms: Vec<Phantom>,
}

/// A catalogue error to look for: an entry whose crop is a crater of another image, listed
/// at a place of the tile where no labelled crater of its size lies. A crater looked for in
/// place there must not be confirmed: the negative control of the in-place decision, which
/// the tile's own craters (all present in the second observation) cannot give.
pub struct Phantom {
    /// Its id, listed position and diameter.
    pub listed: Crater,
    /// Its crop, `context` diameters a side, from the other image.
    pub crop: image::GrayImage,
}

/// Prefix of phantoms' ids.
pub const PHANTOM_PREFIX: &str = "phantom-";

/// `n` phantoms for a `width x height` tile labelled `labels`: crops of craters of at least
/// [`SCORED_DIAMETER`] px of `other` (labelled `other_labels`), each listed at a random place
/// of the tile whose crop fits and where no labelled crater within a diameter has a diameter
/// within 1.5x of its own (so that no crater there could count as it). Fewer where the tile
/// has no room.
pub fn phantoms(
    other: &image::GrayImage,
    other_labels: &[Crater],
    labels: &[Crater],
    (width, height): (u32, u32),
    context: f64,
    n: usize,
    rng: &mut ChaCha8Rng,
) -> Vec<Phantom> {
    let (ow, oh) = other.dimensions();
    let fits = |x: f64, y: f64, d: f64, w: u32, h: u32| {
        let r = d * context / 2.0;
        x - r >= 0.0 && y - r >= 0.0 && x + r <= w as f64 - 1.0 && y + r <= h as f64 - 1.0
    };
    let sources: Vec<&Crater> = other_labels
        .iter()
        .filter(|c| c.diameter >= SCORED_DIAMETER && fits(c.x, c.y, c.diameter, ow, oh))
        .collect();
    let mut out = Vec::new();
    if sources.is_empty() {
        return out;
    }
    for k in 0..n {
        let c = sources[rng.gen_range(0..sources.len())];
        let d = c.diameter;
        let place = (0..200)
            .map(|_| {
                (
                    rng.gen_range(0.0..width as f64),
                    rng.gen_range(0.0..height as f64),
                )
            })
            .find(|&(x, y)| {
                fits(x, y, d, width, height)
                    && labels.iter().all(|l| {
                        (l.x - x).hypot(l.y - y) > d.max(l.diameter)
                            || l.diameter.max(d) / l.diameter.min(d) > 1.5
                    })
            });
        let Some((x, y)) = place else {
            continue;
        };
        let r = d * context / 2.0;
        let (x0, y0) = ((c.x - r).round() as u32, (c.y - r).round() as u32);
        let side = ((c.x + r).round() as u32).saturating_sub(x0).max(1);
        out.push(Phantom {
            listed: Crater {
                id: format!("{PHANTOM_PREFIX}{k}"),
                x,
                y,
                diameter: d,
            },
            crop: image::imageops::crop_imm(other, x0, y0, side, side).to_image(),
        });
    }
    out
}

/// Splits `labels` of a `width x height` tile: craters of at least
/// [`CATALOGUE_MIN_DIAMETER`] whose crop of `context` diameters fits are the catalogue,
/// except a seeded `held_out` share of those of at least [`SCORED_DIAMETER`].
pub fn split_catalogue(
    labels: &[Crater],
    (width, height): (u32, u32),
    context: f64,
    held_out: f64,
    rng: &mut ChaCha8Rng,
) -> CatalogueSplit {
    let fits = |c: &Crater| {
        let r = c.diameter * context / 2.0;
        c.diameter >= CATALOGUE_MIN_DIAMETER
            && c.x - r >= 0.0
            && c.y - r >= 0.0
            && c.x + r <= width as f64 - 1.0
            && c.y + r <= height as f64 - 1.0
    };
    let fitting: Vec<&Crater> = labels.iter().filter(|c| fits(c)).collect();
    let mut scored: Vec<&str> = fitting
        .iter()
        .filter(|c| c.diameter >= SCORED_DIAMETER)
        .map(|c| c.id.as_str())
        .collect();
    scored.sort_unstable();
    let n = (held_out * scored.len() as f64).round() as usize;
    let held: HashSet<&str> = rand::seq::index::sample(rng, scored.len(), n)
        .into_iter()
        .map(|i| scored[i])
        .collect();
    let (held_out, catalogue) = fitting
        .into_iter()
        .cloned()
        .partition(|c| held.contains(c.id.as_str()));
    CatalogueSplit {
        catalogue,
        held_out,
        phantoms: Vec::new(),
    }
}

/// A tile's grey levels.
pub fn read_tile(path: &Path) -> Result<image::GrayImage> {
    Ok(image::open(path)
        .map_err(|e| Error::Invalid(format!("{}: not an image: {e}", path.display())))?
        .to_luma8())
}

/// The index at `dir` of a crop (`context` diameters a side) of each catalogue crater of
/// `tile`, with its position, as `index build --dir` indexes crops with a crops.csv.
pub fn catalogue_index(
    dir: &Path,
    tile: &image::GrayImage,
    split: &CatalogueSplit,
    context: f64,
    extractor: &Arc<Extractor>,
    progress: &dyn Progress,
) -> Result<Engine> {
    ensure!(
        !split.catalogue.is_empty(),
        Error::Invalid("no labelled crater of the tile fits a catalogue crop".into())
    );
    let mut ids = Vec::new();
    let mut crops = Vec::new();
    let mut metas = Vec::new();
    for k in &split.catalogue {
        let r = k.diameter * context / 2.0;
        let (x0, y0) = ((k.x - r).round() as u32, (k.y - r).round() as u32);
        let side = ((k.x + r).round() as u32).saturating_sub(x0).max(1);
        crops.push(image::DynamicImage::ImageLuma8(
            image::imageops::crop_imm(tile, x0, y0, side, side).to_image(),
        ));
        ids.push(k.id.clone());
        metas.push(listed(k));
    }
    // the catalogue's errors, listed as any entry is
    for p in &split.phantoms {
        crops.push(image::DynamicImage::ImageLuma8(p.crop.clone()));
        ids.push(p.listed.id.clone());
        metas.push(listed(&p.listed));
    }
    let features = extractor.features_of_images(&ids, &crops, progress)?;
    Ok(Engine::build_from_features(
        dir,
        &features,
        metas,
        &LearnFrom::Sample,
        &IndexRecipe::default(),
        Some(extractor.clone()),
        progress,
    )?)
}

/// A catalogue entry's record: the crater's id and its position in the tile.
fn listed(k: &Crater) -> ImageMeta {
    ImageMeta {
        id: k.id.clone(),
        crater_id: Some(k.id.clone()),
        source: Some("catalogue".into()),
        x: Some(k.x),
        y: Some(k.y),
        diameter_px: Some(k.diameter),
        ..Default::default()
    }
}

/// One crater `link --image` reported in the second observation.
pub struct LinkedCrater<'a> {
    pub x: f64,
    pub y: f64,
    pub diameter_px: f64,
    /// `match`, `new`, `ambiguous` or `unconfirmed`.
    pub decision: &'a str,
    /// The catalogue crater of its best candidate.
    pub catalogue_crater: Option<&'a str>,
    pub by_detector: bool,
}

/// What one tile scored.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TileScore {
    /// Catalogue craters of at least [`SCORED_DIAMETER`] pixels.
    pub catalogue_scored: usize,
    /// `match` rows naming a scored catalogue crater: right (the crater at their place) and
    /// wrong.
    pub right_rows: usize,
    pub wrong_rows: usize,
    /// Scored catalogue craters with a right `match` row, and those of them a detection found.
    pub linked_right: usize,
    pub linked_right_by_detection: usize,
    pub held_out: usize,
    /// Held-out craters a detection found, and those reported `new`.
    pub held_out_detected: usize,
    pub reported_new: usize,
    /// `new` rows lying on a catalogue crater.
    pub new_on_catalogue: usize,
    /// `new` rows scored for precision (at least [`SCORED_DIAMETER`] pixels in the tile, or
    /// on a held-out crater), and those of them on a labelled crater the catalogue lacks
    /// (held out, or never catalogued: its crop did not fit). A row on no labelled crater
    /// counts as wrong, though it may be a crater the labels miss.
    pub new_rows: usize,
    pub new_rows_right: usize,
    /// Catalogue errors listed ([`Phantom`]s), and those some `match` row confirmed.
    pub phantoms: usize,
    pub phantoms_confirmed: usize,
}

/// Scores the rows of one second observation against the tile's labels.
pub fn score_tile(
    rows: &[LinkedCrater],
    transform: &ViewTransform,
    labels: &[Crater],
    split: &CatalogueSplit,
) -> TileScore {
    let truth: Vec<Circle> = labels
        .iter()
        .map(|c| Circle {
            x: c.x,
            y: c.y,
            diameter: c.diameter,
        })
        .collect();
    // the labelled crater closest to a row mapped back to the tile, among those it finds
    let crater_at = |r: &LinkedCrater| -> Option<&str> {
        let (x, y) = transform.pixel_in_tile(r.x, r.y);
        let found = Circle {
            x,
            y,
            diameter: r.diameter_px / transform.scale,
        };
        truth
            .iter()
            .zip(labels)
            .filter(|(t, _)| finds(&found, t))
            .min_by(|(a, _), (b, _)| {
                (a.x - x)
                    .hypot(a.y - y)
                    .total_cmp(&(b.x - x).hypot(b.y - y))
            })
            .map(|(_, c)| c.id.as_str())
    };
    let scored: HashSet<&str> = split
        .catalogue
        .iter()
        .filter(|c| c.diameter >= SCORED_DIAMETER)
        .map(|c| c.id.as_str())
        .collect();
    let in_catalogue: HashSet<&str> = split.catalogue.iter().map(|c| c.id.as_str()).collect();
    let held: HashSet<&str> = split.held_out.iter().map(|c| c.id.as_str()).collect();
    let phantoms: HashSet<&str> = split
        .phantoms
        .iter()
        .map(|p| p.listed.id.as_str())
        .collect();
    let mut s = TileScore {
        catalogue_scored: scored.len(),
        held_out: held.len(),
        phantoms: phantoms.len(),
        ..Default::default()
    };
    let mut confirmed = HashSet::new();
    let (mut right, mut by_detection) = (HashSet::new(), HashSet::new());
    let (mut detected, mut new) = (HashSet::new(), HashSet::new());
    for r in rows {
        let at = crater_at(r);
        match (r.decision, r.catalogue_crater) {
            ("match", Some(c)) if phantoms.contains(c) => {
                confirmed.insert(c);
            }
            ("match", Some(c)) if scored.contains(c) => {
                if at == Some(c) {
                    s.right_rows += 1;
                    right.insert(c);
                    if r.by_detector {
                        by_detection.insert(c);
                    }
                } else {
                    s.wrong_rows += 1;
                }
            }
            ("new", _) => {
                let missing = at.filter(|c| !in_catalogue.contains(c));
                if missing.is_some_and(|c| held.contains(c))
                    || r.diameter_px / transform.scale >= SCORED_DIAMETER
                {
                    s.new_rows += 1;
                    s.new_rows_right += usize::from(missing.is_some());
                }
                match at {
                    Some(c) if held.contains(c) => {
                        new.insert(c);
                    }
                    Some(c) if in_catalogue.contains(c) => s.new_on_catalogue += 1,
                    _ => {}
                }
            }
            _ => {}
        }
        if let Some(c) = at.filter(|c| r.by_detector && held.contains(c)) {
            detected.insert(c);
        }
    }
    s.linked_right = right.len();
    s.linked_right_by_detection = by_detection.len();
    s.held_out_detected = detected.len();
    s.reported_new = new.len();
    s.phantoms_confirmed = confirmed.len();
    s
}

/// The measures over all tiles: precision and recall of right links of scored catalogue
/// craters, their F1, the recall of held-out craters reported new and the precision of
/// `new` rows ([`TileScore::new_rows`]), and the share of catalogue errors confirmed (NaN
/// without any).
#[derive(Clone, Debug, Default, Serialize)]
pub struct LinkTotals {
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    pub new_recall: f64,
    pub new_precision: f64,
    pub phantoms_confirmed: f64,
}

pub fn totals(tiles: &[TileScore]) -> LinkTotals {
    let sum = |f: &dyn Fn(&TileScore) -> usize| tiles.iter().map(f).sum::<usize>() as f64;
    let (right, wrong) = (sum(&|t| t.right_rows), sum(&|t| t.wrong_rows));
    let precision = right / (right + wrong).max(1.0);
    let recall = sum(&|t| t.linked_right) / sum(&|t| t.catalogue_scored).max(1.0);
    LinkTotals {
        precision,
        recall,
        f1: if precision + recall > 0.0 {
            2.0 * precision * recall / (precision + recall)
        } else {
            0.0
        },
        new_recall: sum(&|t| t.reported_new) / sum(&|t| t.held_out).max(1.0),
        new_precision: sum(&|t| t.new_rows_right) / sum(&|t| t.new_rows).max(1.0),
        phantoms_confirmed: sum(&|t| t.phantoms_confirmed) / sum(&|t| t.phantoms),
    }
}

/// A seeded generator per tile, the same whichever tiles run beside it.
pub fn tile_rng(seed: u64, tile: usize) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed.wrapping_mul(1000).wrapping_add(tile as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crater(id: &str, x: f64, y: f64, diameter: f64) -> Crater {
        Crater {
            id: id.into(),
            x,
            y,
            diameter,
        }
    }

    /// A bright disc of the tile lies where the transform sends its centre, in every turn
    /// and scale, and the transform's two directions undo each other.
    #[test]
    fn the_second_view_shows_the_tile_where_its_transform_says() {
        let (w, h, centre, r) = (160u32, 120u32, (50.0, 70.0), 9.0);
        let tile = image::GrayImage::from_fn(w, h, |x, y| {
            let d = (x as f64 + 0.5 - centre.0).hypot(y as f64 + 0.5 - centre.1);
            image::Luma([if d <= r { 250 } else { 40 }])
        });
        for seed in 0..6 {
            let mut rng = tile_rng(seed, 0);
            let view = second_view(&tile, &SecondViewOptions::default(), &mut rng);
            let t = view.transform;
            let (bx, by) = t.to_tile(t.to_view(12.0, 99.0).0, t.to_view(12.0, 99.0).1);
            assert!((bx - 12.0).abs() < 1e-9 && (by - 99.0).abs() < 1e-9);
            // the bright pixels' centroid
            let (mut sx, mut sy, mut n) = (0.0, 0.0, 0.0);
            for (x, y, p) in view.image.enumerate_pixels() {
                if p.0[0] > 160 {
                    (sx, sy, n) = (sx + x as f64 + 0.5, sy + y as f64 + 0.5, n + 1.0);
                }
            }
            let want = t.to_view(centre.0, centre.1);
            let area = std::f64::consts::PI * (r * t.scale).powi(2);
            assert!(
                (sx / n - want.0).hypot(sy / n - want.1) < 1.0 && (n / area - 1.0).abs() < 0.25,
                "seed {seed}: centroid ({:.1}, {:.1}) of {n} px, want ({:.1}, {:.1}) of {area:.0}",
                sx / n,
                sy / n,
                want.0,
                want.1
            );
            // the whole tile is on the canvas, nothing but black outside it
            for (x, y) in [
                (0.0, 0.0),
                (w as f64, 0.0),
                (0.0, h as f64),
                (w as f64, h as f64),
            ] {
                let (vx, vy) = t.to_view(x, y);
                assert!(vx >= -1e-6 && vy >= -1e-6, "seed {seed}");
                assert!(
                    vx <= view.image.width() as f64 + 1e-6
                        && vy <= view.image.height() as f64 + 1e-6
                );
            }
            assert_eq!(
                view.image.get_pixel(0, 0).0[0],
                0,
                "seed {seed}: a corner of the canvas"
            );
        }
    }

    #[test]
    fn the_catalogue_holds_fitting_craters_but_a_share_of_the_scored_ones() {
        let mut labels = vec![
            crater("edge", 5.0, 50.0, 30.0),
            crater("small", 50.0, 50.0, 12.0),
        ];
        labels.extend((0..40).map(|i| crater(&format!("s{i}"), 100.0 + i as f64, 100.0, 24.0)));
        labels.extend((0..10).map(|i| crater(&format!("m{i}"), 100.0, 100.0 + i as f64, 17.0)));
        let split = split_catalogue(&labels, (400, 400), 2.0, 0.2, &mut tile_rng(1, 0));
        assert_eq!(split.held_out.len(), 8);
        assert!(split.held_out.iter().all(|c| c.diameter >= SCORED_DIAMETER));
        assert_eq!(split.catalogue.len(), 32 + 10);
        let ids: HashSet<&str> = split.catalogue.iter().map(|c| c.id.as_str()).collect();
        assert!(!ids.contains("edge") && !ids.contains("small"));
        assert!(split.held_out.iter().all(|c| !ids.contains(c.id.as_str())));
    }

    #[test]
    fn phantoms_are_other_craters_listed_where_no_crater_of_their_size_lies() {
        let other = image::GrayImage::from_fn(300, 300, |x, y| image::Luma([(x ^ y) as u8]));
        let sources = vec![
            crater("o1", 100.0, 100.0, 40.0),
            crater("o2", 200.0, 200.0, 25.0),
            crater("tiny", 50.0, 50.0, 10.0), // below the scored size: never a source
            crater("edge", 290.0, 150.0, 40.0), // its crop does not fit
        ];
        let labels: Vec<Crater> = (0..16)
            .flat_map(|i| (0..16).map(move |j| (i, j)))
            .map(|(i, j)| {
                let (x, y) = (25.0 + 50.0 * i as f64, 25.0 + 50.0 * j as f64);
                crater(
                    &format!("t{i}-{j}"),
                    x,
                    y,
                    if (i + j) % 2 == 0 { 30.0 } else { 8.0 },
                )
            })
            .collect();
        let found = phantoms(
            &other,
            &sources,
            &labels,
            (800, 800),
            2.0,
            12,
            &mut tile_rng(3, 0),
        );
        assert!(found.len() >= 10, "{}", found.len());
        for (k, p) in found.iter().enumerate() {
            let l = &p.listed;
            assert!(l.id.starts_with(PHANTOM_PREFIX));
            assert!(l.diameter == 40.0 || l.diameter == 25.0, "{}", l.diameter);
            assert_eq!(p.crop.width(), p.crop.height());
            assert!((p.crop.width() as f64 - 2.0 * l.diameter).abs() <= 1.0);
            assert!(l.x >= l.diameter && l.x <= 799.0 - l.diameter, "{k}");
            for t in &labels {
                let near = (t.x - l.x).hypot(t.y - l.y) <= l.diameter.max(t.diameter);
                let alike = t.diameter.max(l.diameter) / t.diameter.min(l.diameter) <= 1.5;
                assert!(!(near && alike), "{k} lies on {}", t.id);
            }
        }
        // no room: a tile covered by craters of every size gets none
        let full: Vec<Crater> = (0..40)
            .flat_map(|i| (0..40).map(move |j| (i, j)))
            .flat_map(|(i, j)| {
                [25.0, 35.0].map(|d| crater("f", 10.0 * i as f64, 10.0 * j as f64, d))
            })
            .collect();
        let none = phantoms(
            &other,
            &sources,
            &full,
            (400, 400),
            2.0,
            5,
            &mut tile_rng(3, 1),
        );
        assert!(none.is_empty());
    }

    #[test]
    fn rows_score_by_the_crater_at_their_place_in_the_tile() {
        let labels = vec![
            crater("a", 100.0, 100.0, 30.0),
            crater("b", 200.0, 100.0, 30.0),
            crater("held", 100.0, 200.0, 30.0),
            crater("c", 300.0, 300.0, 18.0),
        ];
        let split = CatalogueSplit {
            catalogue: vec![labels[0].clone(), labels[1].clone(), labels[3].clone()],
            held_out: vec![labels[2].clone()],
            phantoms: vec![
                Phantom {
                    listed: crater("phantom-0", 300.0, 100.0, 30.0),
                    crop: image::GrayImage::new(60, 60),
                },
                Phantom {
                    listed: crater("phantom-1", 50.0, 350.0, 30.0),
                    crop: image::GrayImage::new(60, 60),
                },
            ],
        };
        let t = ViewTransform {
            rotation_deg: 90.0,
            scale: 0.5,
            tile_centre: (200.0, 200.0),
            view_centre: (100.0, 100.0),
        };
        let at = |x: f64, y: f64| t.to_view(x, y);
        let row = |(x, y): (f64, f64), decision, crater, by_detector| LinkedCrater {
            x,
            y,
            diameter_px: 15.0,
            decision,
            catalogue_crater: crater,
            by_detector,
        };
        let rows = [
            row(at(100.0, 100.0), "match", Some("a"), true), // right, by a detection
            row(at(101.0, 99.0), "match", Some("a"), false), // right again: one crater
            row(at(100.0, 100.0), "match", Some("b"), false), // wrong place for b
            row(at(200.0, 100.0), "new", None, true),        // new on a catalogue crater
            row(at(100.0, 200.0), "new", None, true),        // the held-out crater, new
            row(at(300.0, 300.0), "match", Some("c"), false), // not scored: below 20 px
            row(at(300.0, 100.0), "match", Some("phantom-0"), false), // an error confirmed
            row(at(50.0, 350.0), "new", Some("phantom-1"), false), // an error not confirmed
        ];
        let s = score_tile(&rows, &t, &labels, &split);
        assert_eq!((s.catalogue_scored, s.held_out), (2, 1));
        assert_eq!((s.right_rows, s.wrong_rows), (2, 1));
        assert_eq!((s.linked_right, s.linked_right_by_detection), (1, 1));
        assert_eq!(
            (s.held_out_detected, s.reported_new, s.new_on_catalogue),
            (1, 1, 1)
        );
        assert_eq!((s.phantoms, s.phantoms_confirmed), (2, 1));
        // the new rows are 30 px in the tile: the held-out crater's is right, the one on a
        // catalogue crater and the one on no labelled crater wrong
        assert_eq!((s.new_rows, s.new_rows_right), (3, 1));
        let total = totals(&[s]);
        assert!((total.precision - 2.0 / 3.0).abs() < 1e-12);
        assert!((total.phantoms_confirmed - 0.5).abs() < 1e-12);
        assert!((total.recall - 0.5).abs() < 1e-12 && (total.new_recall - 1.0).abs() < 1e-12);
        assert!((total.new_precision - 1.0 / 3.0).abs() < 1e-12);
    }
}
