//! Detect, then link: whole new images, with the craters a detector found in them, against
//! the catalogue.
//!
//! Each image is its own source. Its detections are registered to the catalogue by crater
//! pattern ([`crate::register`]) in the image's own pixel frame, turned and scaled any way;
//! where the pattern alone is not significant, a transform it or the detections' appearance
//! proposed is accepted when the catalogue's craters look like themselves where it places them
//! (`confirm_by_appearance`). Where an image registers, every catalogue crater the transform
//! places inside it is also looked for where it should be: a crop at its projected position and
//! size, so that what the detector missed is still found (recall is not bounded by the
//! detector), unless its rim reaches the image's no-data margin (black joined to the image's
//! edge: outside what was observed). Every crop, of a detection or of a projected crater, is
//! cut from the image with that margin filled as the detector fills it, turned to the
//! catalogue's orientation and linked by [`link_partition`] with the registration as geometric
//! evidence. New craters come only from detections that match nothing in an image that
//! registered; a projected crater that does not look like its catalogue entry is reported
//! `unconfirmed`, never `new`.
//! In an image that does not register, craters are compared by appearance alone, which does
//! not tell a catalogue crater seen again from a new one (`craterdex eval-link --image` on
//! held-out NAC tiles: 147 catalogue craters reported `new` in 7 unregistered observations,
//! 12 in 17 registered ones), so what matches nothing there is `ambiguous`.

use crate::error::{Error, Result};
use crate::link::{crop_turn_deg, link_partition, Decision, LinkOptions, LinkRow};
use crate::register::{
    ln_poisson_tail, refine_similarity, register_seeded, Crater, FrameKind, Frames,
    RegisterOptions, SourceRegistration, Transform,
};
use crate::rule::LinkRule;
use craterdex_detect::detect::in_margin;
use craterdex_detect::{Detection, GrayImage};
use craterdex_engine::{Engine, Progress};
use craterdex_errors::ensure;
use craterdex_index::ImageMeta;
use serde::Serialize;
use std::collections::HashSet;
use std::sync::Arc;

/// One new image and the craters a detector found in it.
pub struct ObservedImage<'a> {
    /// The image's name among the sources (unique among the images linked together).
    pub source: String,
    pub image: &'a GrayImage,
    pub detections: Vec<Detection>,
}

/// How whole images are linked; `Default` is what the command line uses.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ImageLinkOptions {
    /// Crop side over crater diameter (the catalogue's crops: 2).
    pub context: f64,
    /// Look for every catalogue crater the registration places inside a registered image.
    pub look_in_place: bool,
    /// Projected craters smaller than this (pixels of the image) are not looked for.
    pub min_diameter: f64,
    /// A detection within this many radii of a projected crater (and of a diameter the rule
    /// allows) is that crater already: it is not looked for a second time.
    pub covered_radii: f64,
    /// Largest crop side cut, in pixels (larger craters are sampled more coarsely).
    pub max_crop_side: u32,
}

impl Default for ImageLinkOptions {
    fn default() -> Self {
        ImageLinkOptions {
            context: 2.0,
            look_in_place: true,
            min_diameter: 8.0,
            covered_radii: 0.5,
            max_crop_side: 512,
        }
    }
}

/// How a crater of a new image came to be looked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum FoundBy {
    /// The detector found it.
    Detector,
    /// The registration placed a catalogue crater here.
    Catalogue,
}

impl FoundBy {
    pub fn name(self) -> &'static str {
        match self {
            FoundBy::Detector => "detector",
            FoundBy::Catalogue => "catalogue",
        }
    }
}

/// What was decided for one crater of a new image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ImageDecision {
    /// The catalogue crater it is.
    Match,
    /// A detected crater the catalogue lacks (only in an image that registered).
    New,
    /// Possibly a catalogue crater; for a person to decide.
    Ambiguous,
    /// A catalogue crater placed here by the registration that does not look like its entry
    /// (hidden, under other light, or the registration is off here).
    Unconfirmed,
}

impl ImageDecision {
    pub fn name(self) -> &'static str {
        match self {
            ImageDecision::Match => "match",
            ImageDecision::New => "new",
            ImageDecision::Ambiguous => "ambiguous",
            ImageDecision::Unconfirmed => "unconfirmed",
        }
    }

    /// A crater's decision in an image that registered or did not: appearance alone does
    /// not tell a catalogue crater seen again from a crater the catalogue lacks, so a
    /// detection of an image that did not register that matches nothing is `ambiguous`,
    /// not `new`.
    fn of(found_by: FoundBy, decision: Decision, registered: bool) -> Self {
        match (found_by, decision) {
            (_, Decision::Match) => ImageDecision::Match,
            (FoundBy::Detector, Decision::New) if registered => ImageDecision::New,
            (FoundBy::Detector, Decision::New | Decision::Ambiguous) => ImageDecision::Ambiguous,
            (FoundBy::Catalogue, _) => ImageDecision::Unconfirmed,
        }
    }
}

/// What an image that did not register gets, as its summary says it.
const UNREGISTERED: &str =
    "compared by appearance alone, and what matches nothing is ambiguous, not new";

/// One crater of a new image: where it is in that image and what it was linked to.
#[derive(Clone, Debug)]
pub struct ImageCrater {
    pub image: String,
    /// Centre and diameter in the image's own pixels.
    pub x: f64,
    pub y: f64,
    pub diameter_px: f64,
    /// The detector's likelihood (craters found by the detector).
    pub detector_score: Option<f32>,
    pub found_by: FoundBy,
    pub decision: ImageDecision,
    /// The link decision, its evidence and candidates (its query's position is in the
    /// image's frame where the image did not register, else as given: the image's).
    pub link: LinkRow,
}

/// What happened to one new image.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ImageSummary {
    pub image: String,
    pub width: usize,
    pub height: usize,
    pub detections: usize,
    /// Catalogue craters looked for at their projected positions.
    pub looked_for: usize,
    pub matched: usize,
    pub new: usize,
    pub registration: Option<SourceRegistration>,
    /// Why the image's results are weaker than they could be (no craters found, not
    /// registered: compared by appearance alone).
    pub note: Option<String>,
}

/// Every image's craters and summary, in the images' order.
pub struct ImageLinks {
    pub craters: Vec<ImageCrater>,
    pub images: Vec<ImageSummary>,
}

/// The crop of side `side` (image pixels) centred on `(x, y)`, turned by `angle` radians as
/// [`craterdex_model::preprocess::turn`] turns a crop about its centre (image axes, x right
/// and y down), sampled bilinearly from the whole image (reflected at its borders) at no more
/// than `max_side` pixels a side.
pub fn cut_turned(
    image: &GrayImage,
    (x, y): (f64, f64),
    side: f64,
    angle: f64,
    max_side: u32,
) -> image::GrayImage {
    let n = (side.round() as u32).clamp(8, max_side.max(8));
    let step = side / n as f64;
    let (sin, cos) = (-angle).sin_cos();
    let (w, h) = (image.width, image.height);
    let reflect = |v: f64, len: usize| -> f64 {
        let max = len.saturating_sub(1) as f64;
        if max <= 0.0 {
            return 0.0;
        }
        let m = v.rem_euclid(2.0 * max);
        if m > max {
            2.0 * max - m
        } else {
            m
        }
    };
    let at = |px: usize, py: usize| image.pixels[py * w + px] as f64;
    image::GrayImage::from_fn(n, n, |i, j| {
        // pixel centres symmetric about the crater's centre
        let dx = (i as f64 + 0.5) * step - side / 2.0;
        let dy = (j as f64 + 0.5) * step - side / 2.0;
        let sx = reflect(x + cos * dx - sin * dy, w);
        let sy = reflect(y + sin * dx + cos * dy, h);
        let (x0, y0) = (sx.floor() as usize, sy.floor() as usize);
        let (x1, y1) = ((x0 + 1).min(w - 1), (y0 + 1).min(h - 1));
        let (fx, fy) = (sx - x0 as f64, sy - y0 as f64);
        let top = at(x0, y0) * (1.0 - fx) + at(x1, y0) * fx;
        let bottom = at(x0, y1) * (1.0 - fx) + at(x1, y1) * fx;
        image::Luma([(top * (1.0 - fy) + bottom * fy).round().clamp(0.0, 255.0) as u8])
    })
}

/// A crater to look at in one image, before it is linked.
struct Probe {
    image: usize,
    /// Centre and diameter in the image.
    at: (f64, f64, f64),
    meta: ImageMeta,
    detector_score: Option<f32>,
    found_by: FoundBy,
    /// The catalogue's row a projected crater is of.
    catalogue_row: Option<usize>,
}

fn detection_meta(source: &str, n: usize, d: &Detection) -> ImageMeta {
    ImageMeta {
        id: crate::output::detection_id(source, n),
        source: Some(source.to_string()),
        x: Some(d.x),
        y: Some(d.y),
        diameter_px: Some(d.diameter),
        ..Default::default()
    }
}

/// The catalogue's live rows with a position, ordered by x in the catalogue's frame: read
/// once per call, so that each registered image looks only at the rows in its footprint
/// instead of the whole catalogue.
struct CatalogueCentres {
    /// (x, y, row), ascending x.
    by_x: Vec<(f64, f64, usize)>,
}

impl CatalogueCentres {
    fn of(engine: &Engine) -> Self {
        let index = engine.index();
        let mut by_x: Vec<(f64, f64, usize)> = index
            .live_rows()
            .filter_map(|row| {
                let m = index.meta(row);
                match (m.x, m.y, m.diameter_px) {
                    (Some(x), Some(y), Some(_)) if x.is_finite() && y.is_finite() => {
                        Some((x, y, row))
                    }
                    _ => None,
                }
            })
            .collect();
        by_x.sort_by(|a, b| a.0.total_cmp(&b.0));
        CatalogueCentres { by_x }
    }

    /// The rows whose centre lies in `[x0, x1] x [y0, y1]`, ascending.
    fn rows_within(&self, (x0, x1): (f64, f64), (y0, y1): (f64, f64)) -> Vec<usize> {
        let start = self.by_x.partition_point(|c| c.0 < x0);
        let mut rows: Vec<usize> = self.by_x[start..]
            .iter()
            .take_while(|c| c.0 <= x1)
            .filter(|c| (y0..=y1).contains(&c.1))
            .map(|c| c.2)
            .collect();
        rows.sort_unstable();
        rows
    }
}

/// The catalogue craters `reg` places inside an image of `width` x `height` (their whole
/// rim inside) and at least `o.min_diameter` across there, one per catalogue crater: as
/// (catalogue row, its entry, x, y, diameter in the image, whether one of `detections` is
/// that crater already). Of a crater's several rows, the first in the index.
fn projected(
    engine: &Engine,
    centres: &CatalogueCentres,
    im: &ObservedImage,
    margin: Option<&[bool]>,
    t: &Transform,
    rule: &LinkRule,
    o: &ImageLinkOptions,
) -> Vec<(usize, ImageMeta, f64, f64, f64, bool)> {
    let (source, detections) = (im.source.as_str(), &im.detections);
    let (width, height) = (im.image.width, im.image.height);
    let (back, scale) = (t.inverse(), t.scale());
    // the image's footprint in the catalogue's frame: a crater centred outside it cannot
    // lie inside the image
    let (w, h) = (
        width.saturating_sub(1) as f64,
        height.saturating_sub(1) as f64,
    );
    let corners = [(0.0, 0.0), (w, 0.0), (0.0, h), (w, h)].map(|(x, y)| t.apply(x, y));
    let span = |c: fn(&(f64, f64)) -> f64| {
        let v = corners.iter().map(c);
        (
            v.clone().fold(f64::INFINITY, f64::min),
            v.fold(f64::NEG_INFINITY, f64::max),
        )
    };
    let index = engine.index();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for row in centres.rows_within(span(|c| c.0), span(|c| c.1)) {
        let m = index.meta(row);
        if m.source.as_deref() == Some(source) {
            continue;
        }
        let (Some(cx), Some(cy), Some(cd)) = (m.x, m.y, m.diameter_px) else {
            continue;
        };
        let (x, y) = back.apply(cx, cy);
        let d = cd / scale;
        let r = d / 2.0;
        let inside = x - r >= 0.0 && y - r >= 0.0 && x + r <= w && y + r <= h;
        if !inside || !d.is_finite() || d < o.min_diameter || !disc_in_data(im, margin, x, y, r) {
            continue;
        }
        let covered = detections.iter().any(|e| {
            let larger = e.diameter.max(d);
            (e.x - x).hypot(e.y - y) <= o.covered_radii * larger / 2.0
                && larger / e.diameter.min(d) <= rule.max_diameter_ratio
        });
        let crater = m.crater_id.clone().unwrap_or_else(|| m.id.clone());
        if seen.insert(crater) {
            out.push((row, m.clone(), x, y, d, covered));
        }
    }
    out
}

/// Whether the disc of radius `r` about `(x, y)` lies in `im`'s data: its centre and eight
/// points of its rim outside the no-data `margin` (a map-projected or turned image's black
/// surround, where a catalogue crater the transform places there was not observed).
fn disc_in_data(im: &ObservedImage, margin: Option<&[bool]>, x: f64, y: f64, r: f64) -> bool {
    let rim = (0..8).map(|k| (k as f64 * std::f64::consts::FRAC_PI_4).sin_cos());
    std::iter::once((0.0, 0.0))
        .chain(rim)
        .all(|(s, c)| !in_margin(margin, im.image, x + r * c, y + r * s))
}

/// Of a catalogue's craters in pixels, the diameter this share are smaller than: below it the
/// catalogue holds few craters, and detections smaller than it (scaled) only dilute the
/// pattern registration compares.
const CATALOGUE_FLOOR_SHARE: f64 = 0.05;

/// Detections as small as this many times the catalogue's floor diameter are registered;
/// tried in order (the image's scale against the catalogue is not known yet), with all
/// detections last.
const REGISTER_FLOORS: [f64; 4] = [1.0, 0.7, 1.5, 0.0];

/// Inlier tolerances (radii) tried at each floor: a detector places centres well, and the
/// tighter tolerance expects four times fewer chance inliers where the catalogue is dense.
const REGISTER_TOLERANCES: [f64; 2] = [1.0, 0.5];

/// Pattern keys of detections match the catalogue's within this (the default is 0.2): a
/// detector's diameters are read from the area of a region of likelihood, looser than a
/// catalogue's, and each key holds a diameter twice. Chosen on the four NAC tuning tiles
/// (docs/results.md, "Detect, then link"), where one observation of twelve registered
/// only with it; its false alarms are bounded as before (every hypothesis counts).
const DETECTION_KEY_TOLERANCE: f64 = 0.35;

/// The diameter [`CATALOGUE_FLOOR_SHARE`] of the catalogue's craters (those of no source among
/// `images`) are smaller than, in pixels.
fn catalogue_floor(engine: &Engine, images: &[ObservedImage]) -> f64 {
    let index = engine.index();
    let sources: HashSet<&str> = images.iter().map(|im| im.source.as_str()).collect();
    let mut sizes: Vec<f64> = index
        .live_rows()
        .map(|r| index.meta(r))
        .filter(|m| !m.source.as_deref().is_some_and(|s| sources.contains(s)))
        .filter_map(|m| m.diameter_px.filter(|d| d.is_finite() && *d > 0.0))
        .collect();
    sizes.sort_by(f64::total_cmp);
    sizes
        .get((sizes.len() as f64 * CATALOGUE_FLOOR_SHARE) as usize)
        .copied()
        .unwrap_or(0.0)
}

/// Each image registered to the catalogue by the pattern of its detections. A detector finds
/// many more small craters than a catalogue lists (a catalogue stops at some diameter), and
/// those crowd the pattern with neighbours the catalogue does not have; so the detections
/// registered are those at least about as large as the catalogue's smallest, at a few floors
/// and tolerances. Of the registrations accepted, the one least likely to arise by chance is
/// kept (each is accepted at a false-alarm bound of 1e-6; the eight tries together at 8e-6).
/// `floor` is the catalogue's ([`catalogue_floor`]). Also returned, per image, each attempt's
/// best transform where none was accepted, for [`confirm_by_appearance`].
fn register_images(
    engine: &Engine,
    images: &[ObservedImage],
    floor: f64,
    rule: &LinkRule,
) -> (Frames, Vec<Vec<Arc<SourceRegistration>>>) {
    let index = engine.index();
    let mut frames = Frames::none();
    let mut proposals = Vec::new();
    for im in images {
        let mut proposed = Vec::new();
        let metas: Vec<ImageMeta> = im
            .detections
            .iter()
            .enumerate()
            .map(|(n, d)| detection_meta(&im.source, n, d))
            .collect();
        // the registered attempt least likely by chance; else the last (its reason)
        let mut best: Option<(f64, Frames)> = None;
        let mut tried = HashSet::new();
        for k in REGISTER_FLOORS {
            let subset: Vec<ImageMeta> = metas
                .iter()
                .filter(|m| m.diameter_px.unwrap_or(0.0) >= k * floor)
                .cloned()
                .collect();
            if subset.is_empty() || !tried.insert(subset.len()) {
                continue;
            }
            for tolerance in REGISTER_TOLERANCES {
                let o = RegisterOptions {
                    tolerance_radii: tolerance,
                    key_tolerance: DETECTION_KEY_TOLERANCE,
                    ..Default::default()
                };
                let attempt = Frames::of_entries(index, &subset, &o, rule.body_radius_km);
                proposed.extend(
                    attempt
                        .registrations()
                        .into_iter()
                        .filter(|r| r.proposed.is_some() && r.inliers >= o.min_inliers),
                );
                let chance = attempt
                    .registrations()
                    .first()
                    .filter(|r| r.registered)
                    .map_or(f64::INFINITY, |r| r.false_alarm.unwrap_or(1.0));
                if best
                    .as_ref()
                    .is_none_or(|(c, _)| chance < *c || c.is_infinite())
                {
                    best = Some((chance, attempt));
                }
            }
        }
        if let Some((_, f)) = best {
            frames.extend(f);
        }
        proposals.push(proposed);
    }
    (frames, proposals)
}

/// Fewest catalogue craters a proposed transform must place inside an image for their
/// appearance to confirm it: fewer could never reach the false-alarm bound (Poisson(1) gives
/// 9 or more with probability 1.1e-6, 10 or more 1.1e-7).
const APPEARANCE_MIN_PLACED: usize = 10;

/// Most catalogue craters cut for one proposed transform's check, the largest placed:
/// enough that a right transform's count lies far beyond chance, and a bound on the forward
/// passes an image that does not register costs.
const APPEARANCE_MAX_PLACED: usize = 64;

/// Least share of the craters looked for that must be their own crop's best for a proposed
/// transform to be confirmed. Wrong transforms place some catalogue craters on craters the
/// detector missed, whose crops then look like their entries more often than one time in
/// `n`, so the chance count runs above Poisson(1); and a transform only slightly off (a
/// few degrees) is right near its centre alone. Chosen on the four NAC tuning tiles, seeds
/// 10-15 (docs/results.md, "Registration confirmed by appearance"): of 74 proposals checked,
/// the right ones had a share of 0.37-1.00, the wrong ones at most 0.16 (a transform 3.4
/// degrees off; the others at most 0.05).
const APPEARANCE_MIN_SHARE: f64 = 0.25;

/// An image that its crater pattern did not register, registered by the first of the
/// transforms proposed for it (`proposals`, by its pattern, rejected as no more than chance
/// could give, or by its detections' appearance) under which the catalogue's craters look
/// like themselves where it places them.
///
/// The test: the catalogue craters the transform places inside the image (the
/// [`APPEARANCE_MAX_PLACED`] largest) are cut there, at the catalogue's orientation, and
/// each crater's entry is compared with every one of those `n` crops. Counted are the
/// craters no detection lies on: under a wrong transform their own crops show unrelated
/// ground, no likelier than any other crop to be their entry's best (one chance in `n`), so
/// the count is at most about Poisson(1); under the right one, most are. (A crater a
/// detection lies on may be one of the pattern's chance inliers, whose crop shows some
/// crater like its entry.) Comparing each entry with crops of the same image cancels what
/// the observation changes in all of them (resampling, light, blur), which raw scores do
/// not. A transform is accepted when that count could arise by chance with probability at
/// most the registration's false-alarm bound, over every proposal tried (`tried_before`
/// earlier ones too), and is at least [`APPEARANCE_MIN_SHARE`] of the craters looked for;
/// it is then fitted again on all the image's detections. Returns it and the proposals
/// tried in all.
fn confirm_by_appearance(
    engine: &Engine,
    centres: &CatalogueCentres,
    (im, margin): (&ObservedImage, Option<&[bool]>),
    (proposals, proposed_by): (&[Arc<SourceRegistration>], &str),
    tried_before: usize,
    rule: &LinkRule,
    o: &ImageLinkOptions,
    progress: &dyn Progress,
) -> Result<(Option<SourceRegistration>, usize)> {
    let bound = RegisterOptions::default().false_alarm;
    let distinct = distinct_proposals(proposals, (im.image.width, im.image.height));
    let tried = tried_before + distinct.len();
    let ln_tries = (tried.max(1) as f64).ln();
    let index = engine.index();
    for p in distinct {
        let Some(t) = p.proposed else { continue };
        let mut placed = projected(engine, centres, im, margin, &t, rule, o);
        if placed.len() < APPEARANCE_MIN_PLACED {
            continue;
        }
        placed.sort_by(|a, b| b.4.total_cmp(&a.4));
        placed.truncate(APPEARANCE_MAX_PLACED);
        let mut reg = SourceRegistration {
            registered: true,
            transform: Some(t),
            rotation_deg: Some(t.rotation_deg()),
            scale: Some(t.scale()),
            proposed: None,
            reason: None,
            ..(**p).clone()
        };
        let angle = crop_turn_deg(&reg).unwrap_or(0.0).to_radians();
        let crops: Vec<image::DynamicImage> = placed
            .iter()
            .map(|&(_, _, x, y, d, _)| {
                let cut = cut_turned(im.image, (x, y), o.context * d, angle, o.max_crop_side);
                image::DynamicImage::ImageLuma8(cut)
            })
            .collect();
        let ids: Vec<String> = placed
            .iter()
            .map(|p| format!("{}@{}", im.source, p.1.id))
            .collect();
        let descs = engine.encode_decoded(&ids, &crops, progress)?;
        let rows: Vec<usize> = placed.iter().map(|p| p.0).collect();
        // scores[crop][entry]
        let scores: Vec<Vec<f32>> = descs
            .iter()
            .map(|d| index.late_interaction(&d.tokens, &rows))
            .collect();
        // a crater a detection already sits on may be a chance inlier of the pattern (its
        // crop then shows a crater like its entry whether or not the transform is right):
        // only the others count
        let looked_for: Vec<bool> = placed.iter().map(|p| !p.5).collect();
        let looked = looked_for.iter().filter(|l| **l).count();
        let (n, own_best) = (rows.len(), own_crop_best(&scores, &looked_for));
        let ln_fa = ln_tries + ln_poisson_tail(1.0, own_best);
        tracing::debug!(
            image = %im.source,
            rotation = t.rotation_deg(),
            scale = t.scale(),
            inliers = p.inliers,
            placed = n,
            looked_for = looked,
            own_best,
            false_alarm = ln_fa.exp(),
            "appearance check of a proposed registration"
        );
        let share = own_best as f64 / looked.max(1) as f64;
        if ln_fa <= bound.ln() && share >= APPEARANCE_MIN_SHARE {
            // appearance tells the right transform from wrong ones, not from one a little
            // off (a crop a few pixels aside still shows its crater): the transform is
            // fitted again on all the image's detections at the tighter inlier tolerance
            let (cat, _) = catalogue_craters(engine, &im.source);
            let tight = RegisterOptions {
                tolerance_radii: REGISTER_TOLERANCES[1],
                ..RegisterOptions::default()
            };
            let (fitted, inliers, residual) =
                refine_similarity(&detected_craters(im, 0.0), &cat, t, &tight);
            if inliers.len() >= tight.min_inliers {
                reg.transform = Some(fitted);
                reg.rotation_deg = Some(fitted.rotation_deg());
                reg.scale = Some(fitted.scale());
                reg.inliers = inliers.len();
                reg.residual_radii = Some(residual);
            }
            reg.false_alarm = Some(ln_fa.exp());
            reg.reason = Some(format!(
                "confirmed by appearance: of the {n} catalogue craters it places in the image, \
                 {own_best} of the {} no detection lies on look most like their own crop there \
                 (false-alarm bound {:.1e}); proposed by {proposed_by}, whose pattern alone \
                 gave {} inliers",
                looked,
                ln_fa.exp(),
                p.inliers
            ));
            return Ok((Some(reg), tried));
        }
    }
    Ok((None, tried))
}

/// The catalogue's craters with a pixel position (those of `source` left out), and their
/// rows.
fn catalogue_craters(engine: &Engine, source: &str) -> (Vec<Crater>, Vec<usize>) {
    let index = engine.index();
    index
        .live_rows()
        .filter_map(|row| {
            let m = index.meta(row);
            let c = Crater {
                x: m.x?,
                y: m.y?,
                d: m.diameter_px?,
            };
            (m.source.as_deref() != Some(source) && c.is_usable()).then_some((c, row))
        })
        .unzip()
}

/// An image's detections of at least `floor` px, as craters to register.
fn detected_craters(im: &ObservedImage, floor: f64) -> Vec<Crater> {
    im.detections
        .iter()
        .map(|d| Crater {
            x: d.x,
            y: d.y,
            d: d.diameter,
        })
        .filter(|c| c.is_usable() && c.d >= floor)
        .collect()
}

/// Where [`confirm_by_appearance`]'s proposals came from, as its reason says it.
const PATTERN: &str = "the crater pattern";
const SEEDED: &str = "the detections' appearance";

/// Turns (degrees) at which the largest detections of an image that did not register are
/// cut to find their catalogue craters by appearance: one of them lies within 45 degrees of
/// any rotation.
const SEED_TURNS: [f64; 4] = [0.0, 90.0, 180.0, 270.0];

/// Detections (the largest) cut at each of [`SEED_TURNS`].
const SEED_DETECTIONS: usize = 48;

/// Transforms proposed for an image whose crater pattern proposed no right one, from its
/// detections' appearance: its [`SEED_DETECTIONS`] largest detections (of at least
/// `floor` px), cut at each of [`SEED_TURNS`], are searched in the catalogue, and each one's
/// best hit seeds a registration ([`register_seeded`]: every two seeds propose the
/// transform mapping one onto the other, scored by the pattern with the rest). One proposal
/// per turn, the best its seeds and the pattern give, for [`confirm_by_appearance`] to
/// check.
fn appearance_proposals(
    engine: &Engine,
    im: &ObservedImage,
    floor: f64,
    opts: &LinkOptions,
    o: &ImageLinkOptions,
    progress: &dyn Progress,
) -> Result<Vec<Arc<SourceRegistration>>> {
    let (cat, cat_rows) = catalogue_craters(engine, &im.source);
    let src = detected_craters(im, floor);
    let register = RegisterOptions {
        key_tolerance: DETECTION_KEY_TOLERANCE,
        ..RegisterOptions::default()
    };
    if src.len() < register.min_inliers || cat.len() < register.min_inliers {
        return Ok(Vec::new());
    }
    let mut largest: Vec<usize> = (0..src.len()).collect();
    largest.sort_by(|&a, &b| src[b].d.total_cmp(&src[a].d).then(a.cmp(&b)));
    largest.truncate(SEED_DETECTIONS);
    let at_row: std::collections::HashMap<usize, usize> =
        cat_rows.iter().enumerate().map(|(j, &r)| (r, j)).collect();
    let params = craterdex_index::SearchParams {
        top_k: 1,
        ..crate::link::params(opts)
    };
    let mut proposals = Vec::new();
    for turn in SEED_TURNS {
        let crops: Vec<image::DynamicImage> = largest
            .iter()
            .map(|&i| {
                let (c, angle) = (src[i], turn.to_radians());
                let side = o.context * c.d;
                let cut = cut_turned(im.image, (c.x, c.y), side, angle, o.max_crop_side);
                image::DynamicImage::ImageLuma8(cut)
            })
            .collect();
        let ids: Vec<String> = largest
            .iter()
            .map(|i| format!("{}#{turn}-{i}", im.source))
            .collect();
        let descs = engine.encode_decoded(&ids, &crops, progress)?;
        let seeds: Vec<(usize, usize)> = largest
            .iter()
            .zip(engine.search_descriptors(&descs, &params))
            .filter_map(|(&i, hits)| Some((i, *at_row.get(&hits.first()?.row)?)))
            .collect();
        let fit = match register_seeded(&src, &cat, &seeds, &register) {
            Ok(f) => f,
            Err(e) => match e.best {
                Some(f) => *f,
                None => continue,
            },
        };
        tracing::debug!(
            image = %im.source,
            turn,
            seeds = seeds.len(),
            rotation = fit.transform.rotation_deg(),
            scale = fit.transform.scale(),
            inliers = fit.inliers.len(),
            "proposed by the detections' appearance"
        );
        proposals.push(Arc::new(SourceRegistration {
            source: Some(im.source.clone()),
            frame: FrameKind::Pixels,
            origin: None,
            entries: src.len(),
            catalogue: cat.len(),
            registered: false,
            transform: None,
            rotation_deg: None,
            scale: None,
            inliers: fit.inliers.len(),
            residual_radii: Some(fit.residual_radii),
            chance_inliers: Some(fit.chance_inliers),
            false_alarm: Some(fit.false_alarm),
            reason: None,
            residuals: Vec::new(),
            proposed: Some(fit.transform),
        }));
    }
    Ok(proposals)
}

/// Of a square matrix of scores (`scores[crop][entry]`, crop `i` cut where entry `i` is
/// placed), the number of entries `counted` whose own crop scores above every other crop.
fn own_crop_best(scores: &[Vec<f32>], counted: &[bool]) -> usize {
    let n = scores.len();
    (0..n)
        .filter(|&e| counted[e])
        .filter(|&e| (0..n).all(|c| c == e || scores[c][e] < scores[e][e]))
        .count()
}

/// `proposals` with one of each transform (those placing the image's centre within a
/// twentieth of its size of another's, at a turn within 2 degrees, are one), most inliers
/// first.
fn distinct_proposals(
    proposals: &[Arc<SourceRegistration>],
    (width, height): (usize, usize),
) -> Vec<&Arc<SourceRegistration>> {
    let mut sorted: Vec<&Arc<SourceRegistration>> = proposals.iter().collect();
    sorted.sort_by_key(|p| std::cmp::Reverse(p.inliers));
    let centre = (width as f64 / 2.0, height as f64 / 2.0);
    let reach = width.max(height) as f64 / 20.0;
    let mut kept: Vec<&Arc<SourceRegistration>> = Vec::new();
    for p in sorted {
        let Some(t) = p.proposed else { continue };
        let (x, y) = t.apply(centre.0, centre.1);
        let same = |q: &&Arc<SourceRegistration>| {
            q.proposed.is_some_and(|u| {
                let (u_x, u_y) = u.apply(centre.0, centre.1);
                let turn = (u.rotation_deg() - t.rotation_deg() + 540.0).rem_euclid(360.0) - 180.0;
                (u_x - x).hypot(u_y - y) <= reach * t.scale() && turn.abs() <= 2.0
            })
        };
        if !kept.iter().any(same) {
            kept.push(p);
        }
    }
    kept
}

/// Hits looked at besides the catalogue craters placed inside the image, when deciding
/// whether a crater looked for in place is there.
const IN_PLACE_RIVALS: usize = 20;

/// A catalogue crater's hubness in one image: the mean of its this many best scores against
/// the image's craters looked for in place (the k of cross-domain similarity local scaling,
/// Conneau et al. 2018, at its published default).
const HUB_NEIGHBOURS: usize = 10;

/// The decisions for the catalogue craters looked for in place in one image (`probes`, with
/// their descriptors), each where the registration places it. Its position is the
/// registration's, so geometry is no evidence of it; and raw appearance scores are on no
/// fixed scale between observations (another resampling, light and blur lower every score
/// alike). So a crop must look more like its own catalogue entry than like all but
/// [`IN_PLACE_OUTRANKED`] of the other craters that could be there (the catalogue craters
/// placed inside the image, `inside`) and of its [`IN_PLACE_RIVALS`] best hits in the whole
/// catalogue: `match`, else `new` (reported `unconfirmed`). Scores are compared after cross-domain similarity local scaling (CSLS:
/// `2 s(q, c) - r(c)`, `r(c)` the mean of catalogue crater `c`'s [`HUB_NEIGHBOURS`] best
/// scores against this image's crops): a featureless catalogue crop that every blurred crop
/// resembles (a hub) would otherwise outscore each crater's own entry. The confidence
/// reported is the rule's appearance confidence of the own entry's raw score.
fn in_place_rows(
    engine: &Engine,
    rule: &LinkRule,
    opts: &LinkOptions,
    frames: &Frames,
    probes: &[(&Probe, usize, &craterdex_tokens::Descriptors)],
    inside: &[usize],
) -> Vec<LinkRow> {
    if probes.is_empty() {
        return Vec::new();
    }
    let index = engine.index();
    let params = craterdex_index::SearchParams {
        top_k: IN_PLACE_RIVALS,
        ..crate::link::params(opts)
    };
    let descs: Vec<craterdex_tokens::Descriptors> = probes.iter().map(|p| (*p.2).clone()).collect();
    let far = engine.search_descriptors(&descs, &params);
    let mut rivals: Vec<usize> = inside.to_vec();
    rivals.extend(probes.iter().map(|p| p.1));
    rivals.extend(far.iter().flatten().map(|h| h.row));
    rivals.sort_unstable();
    rivals.dedup();
    let scores: Vec<Vec<f32>> = descs
        .iter()
        .map(|d| index.late_interaction(&d.tokens, &rivals))
        .collect();
    let hubness = hubness(&scores, HUB_NEIGHBOURS);
    let crater = |m: &ImageMeta| m.crater_id.clone().unwrap_or_else(|| m.id.clone());
    let candidate = |row: usize, score: f32, placed: bool| {
        let hit = craterdex_index::Hit {
            row,
            score,
            stage1: None,
            stage2: Some(score),
        };
        let h = engine.describe(&[hit]).remove(0);
        crate::link::Candidate {
            id: h.id,
            crater_id: h.crater_id,
            score,
            offset_radii: placed.then_some(0.0),
            diameter_ratio: placed.then_some(1.0),
            registered: placed,
            confidence: rule.confidence(score, None),
            meta: h.meta,
        }
    };
    probes
        .iter()
        .zip(&scores)
        .zip(&far)
        .map(|(((probe, own_row, _), s), far)| {
            let own = crater(index.meta(*own_row));
            let considered: HashSet<usize> = inside
                .iter()
                .copied()
                .chain(far.iter().map(|h| h.row))
                .collect();
            let scaled = |c: usize| csls(s[c], hubness[c]);
            let at = |row: usize| rivals.binary_search(&row).unwrap_or_default();
            let mine = at(*own_row);
            let others: Vec<usize> = (0..rivals.len())
                .filter(|&c| considered.contains(&rivals[c]))
                .filter(|&c| crater(index.meta(rivals[c])) != own)
                .collect();
            let rival = others
                .iter()
                .copied()
                .max_by(|&a, &b| scaled(a).total_cmp(&scaled(b)));
            let best = candidate(*own_row, s[mine], true);
            let decision = if there_in_place(scaled(mine), others.iter().map(|&c| scaled(c))) {
                Decision::Match
            } else {
                Decision::New
            };
            let second = rival.map(|r| candidate(rivals[r], s[r], false));
            LinkRow {
                query: probe.meta.clone(),
                decision,
                confidence: best.confidence,
                best: Some(best.clone()),
                second: second.clone(),
                inserted: false,
                candidates: [Some(best), second].into_iter().flatten().collect(),
                registration: frames.place(&probe.meta).registration.cloned(),
            }
        })
        .collect()
}

/// Rivals that may score at least as high as a crater's own entry, looked for in place, and
/// it still be confirmed there ([`there_in_place`]). Chosen on the tuning tiles (seeds 10-12
/// of `eval-link --image --phantoms 0.2`) from 0, 1 and 2, and against confirming an entry
/// whose own crop is its best among the image's crops: recall of catalogue craters 0.897,
/// 0.909, 0.919 and 0.926, catalogue errors confirmed 3, 4, 5 and 8 of 171.
const IN_PLACE_OUTRANKED: usize = 2;

/// Whether a crater looked for where the registration places it is there: its crop scores
/// its own entry `own` (scaled) above all but [`IN_PLACE_OUTRANKED`] of the `rivals` (ties
/// count against it). A blurred or shrunk observation lowers the own entry's lead: in a
/// registered image the place is already evidence, so a near tie with a look-alike is not
/// taken as absence.
fn there_in_place(own: f32, rivals: impl Iterator<Item = f32>) -> bool {
    rivals.filter(|&r| r >= own).count() <= IN_PLACE_OUTRANKED
}

/// Each column's hubness in a matrix of scores (rows: crops of one image; columns: catalogue
/// craters): the mean of its `k` best scores (all of them when fewer).
fn hubness(scores: &[Vec<f32>], k: usize) -> Vec<f32> {
    let columns = scores.first().map_or(0, Vec::len);
    let k = k.min(scores.len()).max(1);
    (0..columns)
        .map(|c| {
            let mut column: Vec<f32> = scores.iter().map(|s| s[c]).collect();
            column.sort_by(|a, b| b.total_cmp(a));
            column.iter().take(k).sum::<f32>() / k as f32
        })
        .collect()
}

/// A score scaled by cross-domain similarity local scaling: `2 s - r`, `r` the candidate's
/// hubness (the crop's own term is the same for all its candidates, so it is left out).
fn csls(score: f32, hubness: f32) -> f32 {
    2.0 * score - hubness
}

/// Links the craters of whole new images to `engine`'s catalogue (see the module's comment).
/// Nothing is inserted: `opts.insert_new` is refused. Images that do not register are
/// linked by appearance alone (their pixel positions say nothing of the catalogue's frame),
/// and say so in their summary.
pub fn link_images(
    engine: &Engine,
    images: &[ObservedImage],
    rule: &LinkRule,
    opts: &LinkOptions,
    o: &ImageLinkOptions,
    progress: &dyn Progress,
) -> Result<ImageLinks> {
    ensure!(
        !opts.insert_new,
        Error::Invalid(
            "craters of whole images are linked without inserting: insert what they find \
             as new from links.csv's crops with `link --entries --insert-new`"
                .to_string()
        )
    );
    ensure!(
        o.context.is_finite() && o.context > 0.0,
        Error::Invalid(format!("crop context {} is not positive", o.context))
    );
    let mut names = HashSet::new();
    for im in images {
        ensure!(
            names.insert(im.source.as_str()),
            Error::Invalid(format!("two images are named {}", im.source))
        );
    }
    // each image with its no-data margin filled as the detector saw it: a crop cut near the
    // data's edge shows the ground going on (as the catalogue's crops, reflected at their
    // tiles' edges, do), not black; and no catalogue crater is looked for in the margin
    let data: Vec<_> = images.iter().map(|im| im.image.margin_filled()).collect();
    let margins: Vec<Option<&[bool]>> = data.iter().map(|d| d.1.as_deref()).collect();
    let filled: Vec<ObservedImage> = images
        .iter()
        .zip(&data)
        .map(|(im, d)| ObservedImage {
            source: im.source.clone(),
            image: d.0.as_ref(),
            detections: im.detections.clone(),
        })
        .collect();
    let images = &filled[..];
    let floor = catalogue_floor(engine, images);
    let (mut frames, proposals) = if opts.register {
        register_images(engine, images, floor, rule)
    } else {
        (Frames::none(), vec![Vec::new(); images.len()])
    };
    let mut probes = Vec::new();
    let mut turns = Vec::new();
    // per image, the catalogue rows placed inside it: what a crater looked for in place
    // must look more like than like its own entry
    let mut inside: Vec<Vec<usize>> = Vec::new();
    let centres = match o.look_in_place {
        true => CatalogueCentres::of(engine),
        false => CatalogueCentres { by_x: Vec::new() },
    };
    for ((im, proposed), &margin) in images.iter().zip(&proposals).zip(&margins) {
        let registered = frames
            .registration_of(&im.source)
            .is_some_and(|r| r.registered);
        if registered || im.detections.is_empty() || !o.look_in_place {
            continue;
        }
        let (mut found, tried) = confirm_by_appearance(
            engine,
            &centres,
            (im, margin),
            (proposed, PATTERN),
            0,
            rule,
            o,
            progress,
        )?;
        if found.is_none() {
            let seeded = appearance_proposals(engine, im, floor, opts, o, progress)?;
            let seeded = (&seeded[..], SEEDED);
            (found, _) = confirm_by_appearance(
                engine,
                &centres,
                (im, margin),
                seeded,
                tried,
                rule,
                o,
                progress,
            )?;
        }
        if let Some(reg) = found {
            frames.extend(Frames::of_registrations([reg], rule.body_radius_km));
        }
    }
    let registered: Vec<bool> = images
        .iter()
        .map(|im| {
            frames
                .registration_of(&im.source)
                .is_some_and(|r| r.registered)
        })
        .collect();
    for (i, im) in images.iter().enumerate() {
        let reg = frames.registration_of(&im.source);
        for (n, d) in im.detections.iter().enumerate() {
            let mut meta = detection_meta(&im.source, n, d);
            if !registered[i] {
                // an image's own pixel frame says nothing of where it lies in the catalogue's
                (meta.x, meta.y, meta.diameter_px) = (None, None, None);
            }
            probes.push(Probe {
                image: i,
                at: (d.x, d.y, d.diameter),
                meta,
                detector_score: Some(d.score),
                found_by: FoundBy::Detector,
                catalogue_row: None,
            });
        }
        let placing = reg.as_ref().filter(|r| r.registered && o.look_in_place);
        if let Some(t) = placing.and_then(|r| r.transform) {
            let placed = projected(engine, &centres, im, margins[i], &t, rule, o);
            inside.push(placed.iter().map(|p| p.0).collect());
            for (row, m, x, y, d, _) in placed.into_iter().filter(|p| !p.5) {
                probes.push(Probe {
                    image: i,
                    at: (x, y, d),
                    meta: ImageMeta {
                        id: format!("{}@{}", im.source, m.id),
                        source: Some(im.source.clone()),
                        x: Some(x),
                        y: Some(y),
                        diameter_px: Some(d),
                        ..Default::default()
                    },
                    detector_score: None,
                    found_by: FoundBy::Catalogue,
                    catalogue_row: Some(row),
                });
            }
        }
        if inside.len() == i {
            inside.push(Vec::new());
        }
        turns.push(reg.as_deref().and_then(crop_turn_deg).unwrap_or(0.0));
    }
    let crops: Vec<image::DynamicImage> = probes
        .iter()
        .map(|p| {
            let (x, y, d) = p.at;
            let im = images[p.image].image;
            let angle = turns[p.image].to_radians();
            let side = o.context * d;
            image::DynamicImage::ImageLuma8(cut_turned(im, (x, y), side, angle, o.max_crop_side))
        })
        .collect();
    let ids: Vec<String> = probes.iter().map(|p| p.meta.id.clone()).collect();
    let descs = engine.encode_decoded(&ids, &crops, progress)?;
    drop(crops);
    let mut detected = Vec::new();
    let mut looked: Vec<Vec<(&Probe, usize, &craterdex_tokens::Descriptors)>> =
        vec![Vec::new(); images.len()];
    for (p, desc) in probes.iter().zip(&descs) {
        match p.catalogue_row {
            Some(row) => looked[p.image].push((p, row, desc)),
            None => detected.push((p.meta.clone(), desc.clone())),
        }
    }
    let mut in_place: std::collections::HashMap<String, LinkRow> = looked
        .iter()
        .zip(&inside)
        .flat_map(|(probes, inside)| in_place_rows(engine, rule, opts, &frames, probes, inside))
        .map(|r| (r.query.id.clone(), r))
        .collect();
    let mut linked = link_partition(engine, &detected, rule, opts, &frames, progress)?.into_iter();
    let rows: Vec<LinkRow> = probes
        .iter()
        .map(|p| match p.catalogue_row {
            Some(_) => in_place.remove(&p.meta.id),
            None => linked.next(),
        })
        .collect::<Option<_>>()
        .ok_or_else(|| Error::Invalid("a crater looked at was not linked".into()))?;
    let mut summaries: Vec<ImageSummary> = images
        .iter()
        .map(|im| {
            let reg = frames.registration_of(&im.source);
            let note = if im.detections.is_empty() {
                Some("no craters found".to_string())
            } else {
                match &reg {
                    Some(r) if r.registered => None,
                    Some(r) => Some(format!(
                        "not registered ({}): {UNREGISTERED}",
                        r.reason.as_deref().unwrap_or("no reason given")
                    )),
                    None if !opts.register => {
                        Some(format!("not registered (asked not to): {UNREGISTERED}"))
                    }
                    None => Some(format!("not registered: {UNREGISTERED}")),
                }
            };
            ImageSummary {
                image: im.source.clone(),
                width: im.image.width,
                height: im.image.height,
                detections: im.detections.len(),
                looked_for: 0,
                matched: 0,
                new: 0,
                registration: reg.map(|r| (*r).clone()),
                note,
            }
        })
        .collect();
    let craters: Vec<ImageCrater> = probes
        .into_iter()
        .zip(rows)
        .map(|(p, link)| {
            let (x, y, d) = p.at;
            let decision = ImageDecision::of(p.found_by, link.decision, registered[p.image]);
            let s = &mut summaries[p.image];
            s.looked_for += usize::from(p.found_by == FoundBy::Catalogue);
            s.matched += usize::from(decision == ImageDecision::Match);
            s.new += usize::from(decision == ImageDecision::New);
            ImageCrater {
                image: images[p.image].source.clone(),
                x,
                y,
                diameter_px: d,
                detector_score: p.detector_score,
                found_by: p.found_by,
                decision,
                link,
            }
        })
        .collect();
    Ok(ImageLinks {
        craters,
        images: summaries,
    })
}

/// The registrations of `links`' images, for [`crate::output::write_registrations`].
pub fn image_registrations(links: &ImageLinks) -> Vec<Arc<SourceRegistration>> {
    links
        .images
        .iter()
        .filter_map(|s| s.registration.clone().map(Arc::new))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(w: usize, h: usize) -> GrayImage {
        GrayImage {
            width: w,
            height: h,
            pixels: (0..w * h).map(|i| ((i % w) * 2 + (i / w)) as u8).collect(),
        }
    }

    #[test]
    fn the_rows_in_a_footprint_are_those_centred_in_it_in_index_order() {
        let mut by_x: Vec<(f64, f64, usize)> = vec![
            (5.0, 5.0, 3),
            (1.0, 9.0, 0),
            (5.0, 1.0, 7),
            (10.0, 5.0, 1),
            (10.5, 5.0, 2),
            (-1.0, 5.0, 4),
        ];
        by_x.sort_by(|a, b| a.0.total_cmp(&b.0));
        let centres = CatalogueCentres { by_x };
        assert_eq!(centres.rows_within((1.0, 10.0), (2.0, 9.0)), vec![0, 1, 3]);
        assert_eq!(
            centres.rows_within((0.0, 11.0), (0.0, 5.0)),
            vec![1, 2, 3, 7]
        );
        assert!(centres.rows_within((11.0, 20.0), (0.0, 20.0)).is_empty());
    }

    #[test]
    fn what_matches_nothing_is_new_only_in_an_image_that_registered() {
        use ImageDecision as D;
        assert_eq!(D::of(FoundBy::Detector, Decision::New, true), D::New);
        assert_eq!(D::of(FoundBy::Detector, Decision::New, false), D::Ambiguous);
        assert_eq!(
            D::of(FoundBy::Detector, Decision::Ambiguous, true),
            D::Ambiguous
        );
        assert_eq!(D::of(FoundBy::Detector, Decision::Match, false), D::Match);
        assert_eq!(
            D::of(FoundBy::Catalogue, Decision::New, true),
            D::Unconfirmed
        );
    }

    #[test]
    fn own_crops_best_of_unrelated_crops_are_about_one_in_any_number() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        // exchangeable crops (a wrong transform): each entry's own crop is its best one
        // time in n, so about one entry a matrix, whatever n, and the Poisson(1) tail the
        // appearance check uses bounds how often many are
        let (trials, mut total, mut four_or_more) = (2000, 0usize, 0usize);
        for t in 0..trials {
            let n = 8 + t % 120;
            let scores: Vec<Vec<f32>> = (0..n)
                .map(|_| (0..n).map(|_| rng.gen_range(0.0..1.0)).collect())
                .collect();
            let k = own_crop_best(&scores, &vec![true; n]);
            total += k;
            four_or_more += usize::from(k >= 4);
        }
        let mean = total as f64 / trials as f64;
        assert!((0.9..1.1).contains(&mean), "{mean}");
        let bound = crate::register::ln_poisson_tail(1.0, 4).exp();
        let seen = four_or_more as f64 / trials as f64;
        assert!(seen <= 1.5 * bound, "{seen} against {bound}");
        // crops cut where their entries are: each own crop is its entry's best
        let right: Vec<Vec<f32>> = (0..10)
            .map(|c| (0..10).map(|e| if c == e { 0.9 } else { 0.5 }).collect())
            .collect();
        assert_eq!(own_crop_best(&right, &[true; 10]), 10);
        let odd: Vec<bool> = (0..10).map(|i| i % 2 == 1).collect();
        assert_eq!(own_crop_best(&right, &odd), 5);
        // ties do not count: a featureless crop that every entry scores alike is no evidence
        assert_eq!(own_crop_best(&vec![vec![0.7; 10]; 10], &[true; 10]), 0);
    }

    #[test]
    fn fewer_craters_than_the_least_placed_could_never_confirm_a_transform() {
        let bound = RegisterOptions::default().false_alarm.ln();
        let all_best = |n: usize| crate::register::ln_poisson_tail(1.0, n);
        assert!(all_best(APPEARANCE_MIN_PLACED - 1) > bound);
        assert!(all_best(APPEARANCE_MIN_PLACED) <= bound);
    }

    #[test]
    fn an_unturned_cut_is_the_image_itself() {
        let im = ramp(64, 64);
        let c = cut_turned(&im, (32.0, 32.0), 20.0, 0.0, 512);
        assert_eq!(c.dimensions(), (20, 20));
        // pixel (i, j) of the cut is centred at image (22.5 + i, 22.5 + j), symmetric about
        // the centre: on a linear ramp, the mean of the four image pixels around it
        for (i, j) in [(0, 0), (5, 17), (19, 19)] {
            let want = 2.0 * (22.5 + i as f64) + 22.5 + j as f64;
            assert_eq!(c.get_pixel(i, j)[0], want.round() as u8, "{i},{j}");
        }
    }

    #[test]
    fn a_cut_turns_as_a_crop_turns() {
        // a bright blob right of the centre; turned by a quarter, it is seen below or above
        let mut im = GrayImage {
            width: 80,
            height: 80,
            pixels: vec![0; 6400],
        };
        for y in 36..44 {
            for x in 54..62 {
                im.pixels[y * 80 + x] = 255;
            }
        }
        let c = cut_turned(&im, (39.5, 39.5), 48.0, std::f64::consts::FRAC_PI_2, 512);
        let crop = image::DynamicImage::ImageLuma8(
            image::imageops::crop_imm(
                &image::GrayImage::from_raw(80, 80, im.pixels.clone()).unwrap(),
                16,
                16,
                48,
                48,
            )
            .to_image(),
        );
        let turned =
            craterdex_model::preprocess::turn(&crop.to_rgb32f(), std::f32::consts::FRAC_PI_2);
        let mut agree = 0;
        for j in 0..48 {
            for i in 0..48 {
                let a = c.get_pixel(i, j)[0] > 127;
                let b = turned.get_pixel(i, j)[0] > 0.5;
                agree += usize::from(a == b);
            }
        }
        assert!(agree >= 48 * 48 - 48, "{agree} of {} pixels agree", 48 * 48);
        // and the blob did move off the row it was on
        assert!(c.get_pixel(43, 24)[0] < 50);
    }

    /// A featureless catalogue crop that every blurred crop resembles (a hub) outscores each
    /// crater's own entry on raw scores, and not once its hubness is taken off.
    #[test]
    fn a_crater_is_there_in_place_unless_more_rivals_than_allowed_score_as_high() {
        let below = [0.1f32, 0.2, 0.3];
        assert!(there_in_place(0.5, below.into_iter()));
        assert!(there_in_place(0.5, std::iter::empty()));
        let above = |n: usize| (0..n).map(|i| 0.6 + i as f32 * 0.01).chain(below);
        assert!(there_in_place(0.5, above(IN_PLACE_OUTRANKED)));
        assert!(!there_in_place(0.5, above(IN_PLACE_OUTRANKED + 1)));
        // a tie counts against the crater
        let ties = std::iter::repeat_n(0.5f32, IN_PLACE_OUTRANKED + 1);
        assert!(!there_in_place(0.5, ties));
    }

    #[test]
    fn a_hub_loses_to_each_crater_s_own_entry_after_local_scaling() {
        // three crops (rows) against their own craters (columns 0-2) and a hub (column 3)
        let scores = vec![
            vec![0.30, 0.10, 0.12, 0.34],
            vec![0.11, 0.28, 0.09, 0.33],
            vec![0.08, 0.12, 0.31, 0.35],
        ];
        let r = hubness(&scores, 10);
        assert!((r[3] - (0.34 + 0.33 + 0.35) / 3.0).abs() < 1e-6);
        for (i, row) in scores.iter().enumerate() {
            assert!(row[3] > row[i], "the hub wins raw on crop {i}");
            assert!(csls(row[i], r[i]) > csls(row[3], r[3]), "crop {i}");
        }
        // k caps at the crops there are, and an empty matrix has no columns
        assert_eq!(hubness(&scores, 1)[0], 0.30);
        assert!(hubness(&[], 10).is_empty());
    }

    #[test]
    fn a_large_crater_is_cut_coarser() {
        let im = ramp(64, 64);
        let c = cut_turned(&im, (32.0, 32.0), 2000.0, 0.3, 256);
        assert_eq!(c.dimensions(), (256, 256));
    }
}
