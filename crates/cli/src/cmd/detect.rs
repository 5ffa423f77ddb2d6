//! `craterdex detect`: craters found in whole images, written as the crater lists and map
//! layers the other commands take; `craterdex eval-detect`: how well, against labelled
//! tiles.

use crate::output::bar;
use anyhow::{Context, Result};
use clap::Args;
use craterdex_detect::fit::{fit_head, with_head, FitOptions, Labelled};
use craterdex_detect::train::{fit_whole, shifted as shifted_bias, Wear, WholeFitOptions};
use craterdex_detect::{
    detect, read_pyramid, DetectOptions, Detection, DetectorConfig, DiameterScales, GrayImage, Net,
    Readings,
};
use craterdex_eval::detection::{score, BinCounts, Circle};
#[cfg(feature = "gdal")]
use craterdex_eval::georef::Raster;
use craterdex_model::Precision;
use craterdex_workflows::output::{BodyPlace, ImageDetections};
use rayon::prelude::*;
use std::path::{Path, PathBuf};

/// Which detector and how it looks.
#[derive(Args, Clone)]
pub struct DetectorOpts {
    /// A detector directory, the name of one under $CRATERDEX_HOME/detectors (pycda-unet,
    /// pycda's U-Net, is fetched from PyPI on first use), or a Keras .h5 or ONNX file of a
    /// fully convolutional detector (imported there once).
    #[arg(long, default_value = craterdex_fetch::PYCDA_UNET)]
    detector: String,
    /// For a detector file: what pixel values (8-bit levels) are multiplied by before its
    /// first layer.
    #[arg(long, default_value_t = 1.0 / 255.0)]
    input_scale: f32,
    /// Arithmetic of the detector's products: f32; bf16 where the CPU has it; int8 (layers of
    /// 64 input channels or more in int8, the narrower ones in bf16 where the CPU has it).
    /// Default: the fastest here, bf16 on AMX tiles, int8 with VNNI, else f32 (`craterdex
    /// cpu` says which and why).
    #[arg(long, default_value_t = craterdex_detect::default_precision())]
    detector_precision: Precision,
    /// Multiply every diameter read, at every pyramid level, by this instead of by the
    /// detector's own scales (those `detect fit` measured on its labelled images; 1 for
    /// pycda's U-Net and imported files): 1 reads each region of likelihood as it is.
    #[arg(long)]
    diameter_scale: Option<f64>,
    /// Pixels of likelihood above this make up craters.
    #[arg(long, default_value_t = DetectOptions::default().threshold)]
    threshold: f32,
    /// Smallest diameter reported, in pixels.
    #[arg(long, default_value_t = DetectOptions::default().min_diameter)]
    min_diameter: f64,
    /// Largest diameter each pyramid level reports, in its own pixels; larger craters are
    /// found on the levels below (half the size each).
    #[arg(long, default_value_t = DetectOptions::default().level_max_diameter)]
    level_max_diameter: f64,
    /// Largest tile side run at once: larger tiles waste less on their borders and hold
    /// more memory (about 1 GB at 1024 for pycda's U-Net).
    #[arg(long, default_value_t = DetectOptions::default().max_tile)]
    max_tile: usize,
    /// Also run each tile mirrored (left to right, top to bottom, both) and average the
    /// likelihoods: four times the time.
    #[arg(long)]
    flips: bool,
    /// Pyramid levels per halving of the image: 2 reads each crater at two sizes, half an
    /// octave apart (about 1.5 times the time of 1).
    #[arg(long, default_value_t = DetectOptions::default().levels_per_octave as u8, value_parser = clap::value_parser!(u8).range(1..=4))]
    levels_per_octave: u8,
}

impl DetectorOpts {
    pub fn load(&self) -> Result<(DetectorConfig, Net)> {
        let (config, net) = self.load_f32()?;
        Ok((config, net.with_precision(self.detector_precision)?))
    }

    /// The detector at f32, whatever --detector-precision says: for callers that set the
    /// precision themselves.
    pub fn load_f32(&self) -> Result<(DetectorConfig, Net)> {
        let dir = craterdex_fetch::detector_dir(&self.detector, self.input_scale)?;
        let (mut config, net) = craterdex_detect::read_detector_dir(&dir)?;
        if let Some(scale) = self.diameter_scale {
            check_scale(scale, craterdex_detect::DIAMETER_SCALES, "--diameter-scale")?;
            config.diameter_scale = scale;
            config.diameter_scale_per_octave = 1.0;
        }
        Ok((config, net))
    }

    pub fn precision(&self) -> Precision {
        self.detector_precision
    }

    /// The smallest diameter reported, in pixels.
    pub fn min_diameter(&self) -> f64 {
        self.min_diameter
    }

    pub fn options(&self) -> DetectOptions {
        DetectOptions {
            threshold: self.threshold,
            min_diameter: self.min_diameter,
            level_max_diameter: self.level_max_diameter,
            max_tile: self.max_tile,
            flips: self.flips,
            levels_per_octave: self.levels_per_octave.into(),
            ..Default::default()
        }
    }
}

/// `scale`, given as `what`, within the `range` a detector config may hold.
fn check_scale(scale: f64, range: std::ops::RangeInclusive<f64>, what: &str) -> Result<()> {
    anyhow::ensure!(
        range.contains(&scale),
        "{what} must lie in [{}, {}], not {scale}",
        range.start(),
        range.end()
    );
    Ok(())
}

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct DetectCmd {
    #[command(subcommand)]
    action: Option<DetectAction>,
    /// Images (PNG, TIFF, JPEG, PNM) of any size; built with GDAL, also georeferenced
    /// rasters (GeoTIFF, map-projected ISIS cubes, PDS), whose craters get latitude,
    /// longitude and diameter in km.
    #[arg(required = true)]
    images: Vec<PathBuf>,
    /// Where detections.csv, detections.geojson and images.csv go (with georeferenced
    /// images, detections_lonlat.geojson too).
    #[arg(long, required = true)]
    out: Option<PathBuf>,
    /// Also cut a crop of each crater (OUT/crops/<id>.png, with OUT/crops.csv beside it:
    /// id, source, x, y, diameter_px, score, and for a georeferenced image lat, lon,
    /// diameter_km), the entries `craterdex link --entries OUT/crops` takes (compared on
    /// the body where they have a place there); craters whose crop would leave the image
    /// are left out.
    #[arg(long)]
    crops: bool,
    /// Crop side over crater diameter.
    #[arg(long, default_value_t = 2.0, requires = "crops")]
    context: f64,
    #[command(flatten)]
    detector: DetectorOpts,
}

/// Crops of the craters found and the metadata link reads beside them; how many.
pub fn write_crops(out: &Path, per_image: &[ImageDetections], context: f64) -> Result<usize> {
    let images: Vec<PathBuf> = per_image.iter().map(|d| d.image.clone()).collect();
    let sources = craterdex_workflows::output::source_names(&images);
    let mut craters = Vec::new();
    let mut rows = std::collections::HashMap::new();
    for (i, (image, source)) in per_image.iter().zip(&sources).enumerate() {
        for (n, d) in image.found.iter().flatten().enumerate() {
            let id = craterdex_workflows::output::detection_id(source, n);
            let place = match image.on_body.as_ref().and_then(|(p, _)| p.get(n)) {
                Some(p) => format!("{:.6},{:.6},{:.4}", p.lat, p.lon, p.diameter_km),
                None => ",,".into(),
            };
            rows.insert(
                id.clone(),
                format!(
                    "{id},{source},{:.2},{:.2},{:.2},{:.4},{place}",
                    d.x, d.y, d.diameter, d.score
                ),
            );
            craters.push((i, id, d.x, d.y, d.diameter));
        }
    }
    // a new set of crops replaces the last one whole
    let dir = out.join("crops");
    let tmp = craterdex_durable::tempdir_beside(&dir)?;
    let cut = craterdex_eval::tiles::crater_crops(&images, &craters, context, &tmp)?;
    craterdex_durable::replace_dir(&tmp, &dir)?;
    let mut csv = String::from("id,source,x,y,diameter_px,score,lat,lon,diameter_km\n");
    for (id, _) in &cut {
        csv += &rows[id];
        csv.push('\n');
    }
    craterdex_durable::write_atomic(&out.join("crops.csv"), csv.as_bytes())?;
    Ok(cut.len())
}

/// The craters found in one image and, for a georeferenced image (GDAL builds), where each
/// lies on the body and the body's radius in km; `image` is what the caller kept of its grey
/// levels (the levels themselves, or nothing: `()`).
pub struct Found<I = ()> {
    pub detections: Vec<Detection>,
    pub on_body: Option<(Vec<BodyPlace>, f64)>,
    pub image: I,
}

/// Extensions the image crate decodes; any other file is one only GDAL may read.
const IMAGE_EXTENSIONS: [&str; 9] = [
    "png", "tif", "tiff", "jpg", "jpeg", "pgm", "ppm", "pnm", "pbm",
];

fn plain_image(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
}

/// The georeferenced raster at `path` (GDAL builds), or why there is none.
#[cfg(feature = "gdal")]
fn georeferenced(path: &Path) -> std::result::Result<Raster, String> {
    Raster::open(path).map_err(|e| e.to_string())
}

#[cfg(not(feature = "gdal"))]
fn georeferenced(_: &Path) -> std::result::Result<Raster, String> {
    Err(
        "PDS, ISIS cubes and the other formats GDAL reads need craterdex built with the \
         `gdal` feature"
            .into(),
    )
}

/// Stands in for GDAL's raster in builds without it: never made.
#[cfg(not(feature = "gdal"))]
pub enum Raster {}

/// Width and height from the file's header (GDAL's where GDAL is built in and reads it).
fn dimensions(path: &Path) -> Option<(usize, usize)> {
    #[cfg(feature = "gdal")]
    if let Ok(size) = craterdex_eval::georef::raster_size(path) {
        return Some(size);
    }
    GrayImage::dimensions(path).ok()
}

/// The image's grey levels, and its raster when it is georeferenced (a GeoTIFF, a map-projected
/// ISIS cube or PDS image in GDAL builds); any other file is read as a plain image.
pub fn read_image(path: &Path) -> Result<(GrayImage, Option<Raster>)> {
    let raster = match georeferenced(path) {
        Ok(r) => r,
        Err(why) => {
            return match GrayImage::open(path) {
                Ok(g) => Ok((g, None)),
                // both readers' messages name the file
                Err(e) if !plain_image(path) => Err(anyhow::Error::new(e).context(format!(
                    "neither an image this build decodes (PNG, TIFF, JPEG, PNM) nor a \
                     georeferenced raster ({why})"
                ))),
                Err(e) => Err(e.into()),
            };
        }
    };
    #[cfg(feature = "gdal")]
    {
        use craterdex_eval::georef::Levels;
        let (width, height) = raster.size();
        let grey = match raster.levels()? {
            Levels::Eight(pixels) => GrayImage {
                width,
                height,
                pixels,
            },
            Levels::Values(values) => GrayImage::from_values(width, height, &values)?,
        };
        Ok((grey, Some(raster)))
    }
    #[cfg(not(feature = "gdal"))]
    match raster {}
}

/// Where each crater (centre and diameter in the raster's pixels) lies on the body: its
/// centre, and the mean of its east-west and north-south spans measured on the body's sphere
/// between points a radius either side.
#[cfg(feature = "gdal")]
fn places(raster: &Raster, craters: &[(f64, f64, f64)]) -> Result<Vec<BodyPlace>> {
    let mut pixels = Vec::with_capacity(craters.len() * 5);
    for &(x, y, diameter) in craters {
        let r = diameter / 2.0;
        pixels.extend([(x, y), (x - r, y), (x + r, y), (x, y - r), (x, y + r)]);
    }
    let radius = raster.body_radius_km();
    let lat_lon: Vec<(f64, f64)> = raster
        .lon_lat(&pixels)?
        .into_iter()
        .map(|(lon, lat)| (lat, lon))
        .collect();
    Ok(lat_lon
        .chunks_exact(5)
        .map(|p| {
            let span = |a, b| craterdex_workflows::geometry::distance_km(a, b, radius);
            BodyPlace {
                lat: p[0].0,
                lon: p[0].1,
                diameter_km: (span(p[1], p[2]) + span(p[3], p[4])) / 2.0,
            }
        })
        .collect())
}

/// Where each crater of the georeferenced image at `path` lies on its body, and the body's
/// radius in km; `craters` are centres and diameters in its pixels.
#[cfg(feature = "gdal")]
pub fn places_in(path: &Path, craters: &[(f64, f64, f64)]) -> Result<(Vec<BodyPlace>, f64)> {
    let raster = Raster::open(path)?;
    Ok((places(&raster, craters)?, raster.body_radius_km()))
}

/// Builds without GDAL have no georeferenced image to place craters in.
#[cfg(not(feature = "gdal"))]
pub fn places_in(path: &Path, _: &[(f64, f64, f64)]) -> Result<(Vec<BodyPlace>, f64)> {
    anyhow::bail!(
        "{}: {}",
        path.display(),
        georeferenced(path).err().unwrap_or_default()
    )
}

/// For [`detect_images`]: keeps nothing of an image once its craters are found.
pub fn drop_image(_: GrayImage) {}

/// Runs the detector over `images` with one bar for all their tiles; each image's
/// detections with what `keep` keeps of its grey levels (`drop_image`: nothing), or why it
/// has none.
pub fn detect_images<I: Send>(
    images: &[PathBuf],
    config: &DetectorConfig,
    net: &Net,
    o: &DetectOptions,
    label: &str,
    keep: impl Fn(GrayImage) -> I + Sync,
) -> Vec<Result<Found<I>>> {
    // the bar's length from the files' headers; each image decoded when its turn comes
    let total: usize = images
        .iter()
        .filter_map(|p| dimensions(p.as_path()))
        .map(|(w, h)| craterdex_detect::detect::tiles_needed(config, w, h, o).unwrap_or(0))
        .sum();
    let pb = bar(total, label);
    let one = |p: &PathBuf| -> Result<Found<I>> {
        let (g, raster) = read_image(p)?;
        let detections = detect(net, config, &g, o, &|n| pb.inc(n as u64))
            .with_context(|| format!("detecting craters in {}", p.display()))?;
        #[cfg(feature = "gdal")]
        let on_body = raster
            .map(|r| {
                let craters: Vec<_> = detections.iter().map(|d| (d.x, d.y, d.diameter)).collect();
                Ok::<_, anyhow::Error>((places(&r, &craters)?, r.body_radius_km()))
            })
            .transpose()?;
        #[cfg(not(feature = "gdal"))]
        let on_body = raster.map(|never| match never {});
        Ok(Found {
            detections,
            on_body,
            image: keep(g),
        })
    };
    // as many images at once as threads: each pass has serial stretches (decoding, the
    // pyramid, circles) that the other image's products fill; no more, for memory
    let at_once = rayon::current_num_threads().max(1);
    let out = images
        .chunks(at_once)
        .flat_map(|chunk| chunk.par_iter().map(one).collect::<Vec<_>>())
        .collect();
    pb.finish();
    out
}

/// What [`detect_images`] found in each of `images`, as the crater lists record it (the
/// reason where an image failed); each image without craters, or that failed, is named on
/// stderr with why.
pub fn per_image_detections<I>(
    images: &[PathBuf],
    results: Vec<Result<Found<I>>>,
) -> Vec<ImageDetections> {
    let mut per_image = Vec::new();
    for (path, r) in images.iter().zip(results) {
        let (found, on_body) = match r {
            Ok(f) => (Ok(f.detections), f.on_body),
            Err(e) => (Err(format!("{e:#}")), None),
        };
        match &found {
            Ok(d) if d.is_empty() => eprintln!("{}: no craters found", path.display()),
            Ok(_) => {}
            Err(e) => eprintln!("{}: {e}", path.display()),
        }
        per_image.push(ImageDetections {
            image: path.clone(),
            found,
            on_body,
        });
    }
    per_image
}

#[derive(clap::Subcommand)]
enum DetectAction {
    /// Fit a detector to your own imagery: a new head on the detector's frozen layers,
    /// fitted on labelled images and written as a detector directory that --detector takes.
    #[command(
        after_help = "Example:\n  craterdex detect fit --tile a.png --craters a.csv --tile b.png --craters b.csv --out my-detector\n  craterdex detect new.png --detector my-detector --out found/"
    )]
    Fit(DetectFitCmd),
}

/// The head fit's own options. Options of the whole fit conflict with them as well as
/// requiring --whole: clap does not hold `requires` where an argument that conflicts with
/// the required one is given.
const HEAD_ONLY: [&str; 2] = ["background_share", "hidden"];

#[derive(Args)]
pub struct DetectFitCmd {
    #[command(flatten)]
    tiles: crate::args::TileArgs,
    /// Where the fitted detector directory goes (replaced whole once it is written).
    #[arg(long)]
    out: PathBuf,
    /// Thresholds of the fitted likelihood tried on the labelled images; the one with the
    /// best mean F1 of the 8-20 px and >= 20 px bins (at its best diameter scale) becomes
    /// the detector's (the likelihood is shifted so that --threshold picks it).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.1,0.15,0.2,0.25,0.3,0.4,0.5,0.6"
    )]
    try_thresholds: Vec<f32>,
    /// Scales of the diameters read tried with each threshold on the labelled images (a
    /// fitted detector's regions spread past the rims it was taught); the best, with one of
    /// --try-diameter-scales-per-octave, by the same mean F1, is kept in the detector and
    /// applied whenever it detects. A tie keeps the scales nearest 1.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.75,0.8,0.85,0.9,0.95,1,1.05,1.1"
    )]
    try_diameter_scales: Vec<f64>,
    /// Scales tried for each halving down the pyramid, on top of --try-diameter-scales: the
    /// regions spread wider, relative to the rim, on the smaller levels.
    #[arg(long, value_delimiter = ',', default_value = "1,0.96,0.92,0.88")]
    try_diameter_scales_per_octave: Vec<f64>,
    /// Share of the pixels outside every crater the fit samples (the head's fit).
    #[arg(long, default_value_t = FitOptions::default().background_share, conflicts_with = "whole")]
    background_share: f64,
    /// The share of each labelled crater's diameter taught as crater, around its centre:
    /// less than 1 keeps dense craters' regions apart.
    #[arg(long, default_value_t = FitOptions::default().region_share)]
    region_share: f64,
    /// Hidden units of the head.
    #[arg(long, default_value_t = FitOptions::default().hidden, conflicts_with = "whole")]
    hidden: usize,
    /// Fit every layer of the detector rather than a new head on its frozen maps: slower
    /// (about 2.4 s a step of 8 tiles with pycda's U-Net on two cores: 16 minutes for 400;
    /// 1.6 s with --fit-precision bf16 on AMX),
    /// and on lunar tiles it finds more craters (docs/results.md, "The whole detector
    /// fitted").
    #[arg(long)]
    whole: bool,
    /// With --whole: Adam steps.
    #[arg(long, default_value_t = WholeFitOptions::default().steps, requires = "whole", conflicts_with_all = HEAD_ONLY)]
    steps: usize,
    /// With --whole: tiles per step.
    #[arg(long, default_value_t = WholeFitOptions::default().batch, requires = "whole", conflicts_with_all = HEAD_ONLY)]
    batch: usize,
    /// With --whole: Adam's learning rate.
    #[arg(long, default_value_t = WholeFitOptions::default().learning_rate, requires = "whole", conflicts_with_all = HEAD_ONLY)]
    learning_rate: f64,
    /// With --whole: wear each tile as a second observation is worn (turned by any angle,
    /// another gamma and contrast, blurred or noised: the ranges of `eval-link --image`'s
    /// second observations), not only turned by quarter turns and mirrored.
    #[arg(long, requires = "whole", conflicts_with_all = HEAD_ONLY)]
    wear: bool,
    /// With --whole: the fit's products in f32, or in bf16 with f32 sums where the CPU has
    /// bf16 (AMX tiles or AVX-512 BF16): faster, the weights and Adam still f32
    /// (docs/performance.md, "Fitting a detector in bf16").
    #[arg(long, default_value_t = WholeFitOptions::default().precision, requires = "whole", conflicts_with_all = HEAD_ONLY)]
    fit_precision: Precision,
    /// The detector refitted, and how detections are read from it.
    #[command(flatten)]
    detector: DetectorOpts,
}

/// Asks glibc's allocator to keep what a whole fit frees for its next step: each step
/// allocates and frees the same buffers (a layer's patches of a tile reach 105 MB), which
/// glibc otherwise maps and unmaps each time, faulting every page in again. Those over 32 MiB,
/// glibc's largest threshold, still are (12 steps of 8 tiles on two cores: 44-45 s -> 36-40 s,
/// docs/performance.md, "Fitting a detector in bf16").
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes two of the allocator's thresholds, under its own lock;
    // no memory is touched.
    unsafe {
        // the largest mmap threshold glibc takes (32 MiB on 64-bit); nothing trimmed
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// Mean F1 of the 8-20 px and >= 20 px bins: what a detector's constants are chosen by.
fn small_and_large_f1(bins: &[BinCounts]) -> f64 {
    let f1 = |bin: &str| bins.iter().find(|b| b.bin == bin).map_or(0.0, |b| b.f1);
    (f1("8-20") + f1(">=20")) / 2.0
}

/// Each image's craters at `scales`, scored against its labelled craters.
fn score_readings(
    readings: &[Readings],
    truth: &[Vec<Circle>],
    scales: DiameterScales,
) -> Vec<BinCounts> {
    let scored: Vec<_> = readings
        .iter()
        .zip(truth)
        .map(|(r, t)| (found_circles(&r.craters(scales)), t.clone()))
        .collect();
    score(&scored)
}

/// Every pair of a scale at full size and one an octave.
fn scale_pairs(full_size: &[f64], per_octave: &[f64]) -> Vec<DiameterScales> {
    per_octave
        .iter()
        .flat_map(|&per_octave| {
            full_size.iter().map(move |&full_size| DiameterScales {
                full_size,
                per_octave,
            })
        })
        .collect()
}

/// The scales of `tried` whose craters score the best mean F1 of the 8-20 px and >= 20 px
/// bins, and its bins; of those that tie, the nearest 1 an octave, then at full size (no
/// correction is the one that needs no evidence).
fn best_diameter_scales(
    readings: &[Readings],
    truth: &[Vec<Circle>],
    tried: &[DiameterScales],
) -> (DiameterScales, Vec<BinCounts>) {
    let mut by_nearness = tried.to_vec();
    let nearness = |s: &DiameterScales| (s.per_octave.ln().abs(), s.full_size.ln().abs());
    by_nearness.sort_by(|a, b| {
        let (a, b) = (nearness(a), nearness(b));
        a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1))
    });
    let mut best: Option<(DiameterScales, Vec<BinCounts>)> = None;
    for scales in by_nearness {
        let bins = score_readings(readings, truth, scales);
        if best
            .as_ref()
            .is_none_or(|(_, b)| small_and_large_f1(&bins) > small_and_large_f1(b))
        {
            best = Some((scales, bins));
        }
    }
    best.expect("one pair of scales at least")
}

fn run_fit(c: DetectFitCmd) -> Result<()> {
    let pairs = c.tiles.pairs()?;
    anyhow::ensure!(
        !c.try_thresholds.is_empty() && c.try_thresholds.iter().all(|t| *t > 0.0 && *t < 1.0),
        "--try-thresholds must lie between 0 and 1"
    );
    for (scales, range, what) in [
        (
            &c.try_diameter_scales,
            craterdex_detect::DIAMETER_SCALES,
            "--try-diameter-scales",
        ),
        (
            &c.try_diameter_scales_per_octave,
            craterdex_detect::DIAMETER_SCALES_PER_OCTAVE,
            "--try-diameter-scales-per-octave",
        ),
    ] {
        anyhow::ensure!(!scales.is_empty(), "{what} needs one scale at least");
        for &scale in scales {
            check_scale(scale, range.clone(), &format!("each of {what}"))?;
        }
    }
    let tried_scales = scale_pairs(&c.try_diameter_scales, &c.try_diameter_scales_per_octave);
    anyhow::ensure!(
        c.detector.diameter_scale.is_none(),
        "detect fit measures the diameter scale itself: give --try-diameter-scales, not \
         --diameter-scale"
    );
    let base = craterdex_fetch::detector_dir(&c.detector.detector, c.detector.input_scale)?;
    let (config, weights) = craterdex_detect::read_detector_weights(&base)?;
    let o = c.detector.options();
    let mut images = Vec::with_capacity(pairs.len());
    let mut truth = Vec::with_capacity(pairs.len());
    for (tile, labels) in &pairs {
        let circles = labelled(labels).with_context(|| format!("labels of {}", tile.display()))?;
        images.push(Labelled {
            image: read_image(tile)?.0,
            craters: circles.iter().map(|c| [c.x, c.y, c.diameter]).collect(),
        });
        truth.push(circles);
    }
    let tiles: usize = images
        .iter()
        .map(|l| craterdex_detect::detect::tiles_needed(&config, l.image.width, l.image.height, &o))
        .sum::<craterdex_detect::Result<usize>>()?;
    let t = std::time::Instant::now();
    // the fitted detector, its likelihood shifted by a number of logits
    let shifted: Box<dyn Fn(f32) -> craterdex_detect::Result<_>> = if c.whole {
        let fit = WholeFitOptions {
            steps: c.steps,
            batch: c.batch,
            learning_rate: c.learning_rate,
            region_share: c.region_share,
            wear: c.wear.then(Wear::default),
            precision: c.fit_precision,
        };
        keep_freed_memory();
        let pb = bar(fit.steps, "fit steps");
        // a fit runs for an hour or more, often with stderr to a file where no bar is drawn:
        // there, a line every 5% of the steps
        let every = fit.steps.div_ceil(20);
        let fitted = fit_whole(&config, &weights, &images, &o, &fit, &|loss| {
            pb.set_message(format!("loss {loss:.4}"));
            pb.inc(1);
            let done = pb.position() as usize;
            if pb.is_hidden() && (done.is_multiple_of(every) || done == fit.steps) {
                let elapsed = t.elapsed().as_secs_f64();
                eprintln!(
                    "fit step {done}/{}: loss {loss:.4}, {elapsed:.0}s, about {:.0}s to go",
                    fit.steps,
                    elapsed / done as f64 * (fit.steps - done) as f64
                );
            }
        })?;
        pb.finish();
        eprintln!(
            "every layer fitted in {:.1}s ({} steps of {} tiles)",
            t.elapsed().as_secs_f64(),
            fit.steps,
            fit.batch
        );
        let graph = config.graph.clone();
        Box::new(move |shift| Ok((graph.clone(), shifted_bias(&graph, &fitted, shift)?)))
    } else {
        let fit = FitOptions {
            background_share: c.background_share,
            region_share: c.region_share,
            hidden: c.hidden,
            ..Default::default()
        };
        let pb = bar(tiles, "features");
        let head = fit_head(&config, &weights, &images, &o, &fit, &|n| pb.inc(n as u64))?;
        pb.finish();
        eprintln!(
            "head fitted on {} pixels ({} inside craters) in {:.1}s",
            head.samples,
            head.crater_pixels,
            t.elapsed().as_secs_f64()
        );
        let (graph, tile, weights) = (config.graph.clone(), config.tile, weights.clone());
        Box::new(move |shift| with_head(&graph, tile, &weights, &head, shift))
    };
    let (graph, fitted) = shifted(0.0)?;
    let net = Net::new(graph.clone(), |n| fitted.get(n).cloned())?
        .with_precision(c.detector.detector_precision)?;
    let fitted_config = craterdex_detect::DetectorConfig {
        graph,
        region_share: c.region_share,
        ..config.clone()
    };
    let pb = bar(tiles * c.try_thresholds.len(), "thresholds");
    // each threshold's readings, read once and scored at every diameter scale
    let mut tried = Vec::new();
    for &threshold in &c.try_thresholds {
        let o = DetectOptions {
            threshold,
            ..o.clone()
        };
        let readings = images
            .iter()
            .map(|l| read_pyramid(&net, &fitted_config, &l.image, &o, &|n| pb.inc(n as u64)))
            .collect::<craterdex_detect::Result<Vec<_>>>()?;
        let (scale, bins) = best_diameter_scales(&readings, &truth, &tried_scales);
        tried.push((threshold, scale, bins, readings));
    }
    pb.finish();
    let (best, scale, bins, readings) = tried
        .iter()
        .max_by(|a, b| small_and_large_f1(&a.2).total_cmp(&small_and_large_f1(&b.2)))
        .expect("thresholds were tried");
    for (threshold, scale, bins, readings) in &tried {
        print_bins(
            &format!(
                "fitted at threshold {threshold}, diameters x {}, x {} an octave down (mean F1 \
                 {:.3}; as read: {:.3}){}",
                scale.full_size,
                scale.per_octave,
                small_and_large_f1(bins),
                small_and_large_f1(&score_readings(readings, &truth, DiameterScales::AS_READ)),
                if threshold == best { ", kept" } else { "" }
            ),
            bins,
        );
    }
    for &per_octave in &c.try_diameter_scales_per_octave {
        println!(
            "at threshold {best}, x {per_octave} an octave down, mean F1 by diameter scale: {}",
            c.try_diameter_scales
                .iter()
                .map(|&full_size| format!(
                    "x {full_size} {:.3}",
                    small_and_large_f1(&score_readings(
                        readings,
                        &truth,
                        DiameterScales {
                            full_size,
                            per_octave
                        }
                    ))
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let logit = |p: f32| (p / (1.0 - p)).ln();
    let shift = logit(o.threshold) - logit(*best);
    let name = c
        .out
        .file_name()
        .map_or_else(|| "fitted".into(), |n| n.to_string_lossy().into_owned());
    let (graph, weights) = shifted(shift)?;
    let out_config = craterdex_detect::DetectorConfig {
        name,
        // each fit appends itself: a detector fitted again names every fit, in order
        source: format!(
            "{}; then {} fitted by craterdex detect fit on {} labelled images",
            config.source,
            if c.whole {
                format!(
                    "every layer ({} steps of {} tiles{}{})",
                    c.steps,
                    c.batch,
                    if c.wear { ", worn" } else { "" },
                    if c.fit_precision == Precision::F32 {
                        String::new()
                    } else {
                        format!(", products in {}", c.fit_precision)
                    }
                )
            } else {
                "a head".into()
            },
            pairs.len()
        ),
        graph,
        region_share: c.region_share,
        diameter_scale: scale.full_size,
        diameter_scale_per_octave: scale.per_octave,
        ..config.clone()
    };
    craterdex_detect::write_detector_dir(&c.out, out_config, &weights)?;
    eprintln!(
        "wrote {} (threshold {best} on the fitted likelihood is --threshold {} on it; \
         diameters read x {}, x {} an octave down; on these images, mean F1 of 8-20 px and \
         >= 20 px {:.3}); detect with --detector {}",
        c.out.display(),
        o.threshold,
        scale.full_size,
        scale.per_octave,
        small_and_large_f1(bins),
        c.out.display()
    );
    Ok(())
}

pub fn run(c: DetectCmd) -> Result<()> {
    if let Some(DetectAction::Fit(f)) = c.action {
        return run_fit(f);
    }
    let out = c.out.context("--out is needed")?;
    let (config, net) = c.detector.load()?;
    let o = c.detector.options();
    let t = std::time::Instant::now();
    let results = detect_images(&c.images, &config, &net, &o, "detect", drop_image);
    let per_image = per_image_detections(&c.images, results);
    let failed = per_image.iter().filter(|d| d.found.is_err()).count();
    let found = per_image.iter().filter_map(|d| d.found.as_ref().ok());
    let (with_craters, n) = found.fold((0, 0), |(images, craters), d| {
        (images + usize::from(!d.is_empty()), craters + d.len())
    });
    let mut files = craterdex_workflows::output::write_detections(&out, &per_image)?;
    if c.crops {
        let cut = write_crops(&out, &per_image, c.context)?;
        eprintln!("{cut} of {n} craters cut as crops (the others reach past their image)");
        files.extend([out.join("crops"), out.join("crops.csv")]);
    }
    eprintln!(
        "{n} craters in {with_craters} of {} images in {:.1}s ({}, {} at {}); wrote {}",
        c.images.len(),
        t.elapsed().as_secs_f64(),
        config.name,
        net.precision(),
        craterdex_kernels::active(),
        files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    anyhow::ensure!(
        failed == 0,
        "{failed} of {} images could not be read or searched",
        c.images.len()
    );
    Ok(())
}

#[derive(Args)]
pub struct EvalDetectCmd {
    #[command(flatten)]
    tiles: crate::args::TileArgs,
    /// Where results.json goes.
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    detector: DetectorOpts,
}

/// Labelled craters of a tile as circles.
pub fn labelled(path: &Path) -> Result<Vec<Circle>> {
    Ok(craterdex_eval::catalogue::read_pixel_catalogue(path)?
        .into_iter()
        .map(|c| Circle {
            x: c.x,
            y: c.y,
            diameter: c.diameter,
        })
        .collect())
}

/// Detections as the circles scoring compares.
pub fn found_circles(found: &[Detection]) -> Vec<Circle> {
    found
        .iter()
        .map(|d| Circle {
            x: d.x,
            y: d.y,
            diameter: d.diameter,
        })
        .collect()
}

/// Each bin's counts, precision, recall and F1, and `D ratio`: the median of the diameters
/// read over the labelled ones, for the craters found (1 reads them at their size).
pub fn print_bins(title: &str, bins: &[BinCounts]) {
    println!("{title}");
    println!(
        "  {:>8} {:>8} {:>8} {:>10} {:>7} {:>7} {:>7} {:>10}",
        "bin px", "craters", "found", "detections", "P", "R", "F1", "D ratio"
    );
    for b in bins {
        println!(
            "  {:>8} {:>8} {:>8} {:>10} {:>7.3} {:>7.3} {:>7.3} {:>10.3}",
            b.bin,
            b.craters,
            b.craters_found,
            b.detections,
            b.precision,
            b.recall,
            b.f1,
            b.diameter_ratio
        );
    }
}

pub fn run_eval(c: EvalDetectCmd) -> Result<()> {
    let pairs = c.tiles.pairs()?;
    let (config, net) = c.detector.load()?;
    let o = c.detector.options();
    let images: Vec<PathBuf> = pairs.iter().map(|(t, _)| t.clone()).collect();
    let t = std::time::Instant::now();
    let found = detect_images(&images, &config, &net, &o, "detect", drop_image);
    let seconds = t.elapsed().as_secs_f64();
    let mut scored = Vec::new();
    for ((tile, labels), f) in pairs.iter().zip(found) {
        let circles = found_circles(&f?.detections);
        scored.push((
            circles,
            labelled(labels).with_context(|| format!("labels of {}", tile.display()))?,
        ));
    }
    let bins = score(&scored);
    print_bins(
        &format!(
            "{} tiles, {} ({} at {}), {:.1}s",
            pairs.len(),
            config.name,
            net.precision(),
            craterdex_kernels::active(),
            seconds
        ),
        &bins,
    );
    if let Some(out) = &c.out {
        std::fs::create_dir_all(out)?;
        let json = serde_json::json!({
            "detector": config.name,
            "precision": net.precision().to_string(),
            "kernel_level": craterdex_kernels::active().to_string(),
            "tiles": pairs.iter().map(|(t, _)| t.display().to_string()).collect::<Vec<_>>(),
            "seconds": seconds,
            "bins": bins,
        });
        craterdex_durable::write_atomic(
            &out.join("results.json"),
            &serde_json::to_vec_pretty(&json)?,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Readings of `truth` as a detector that reads every crater `wide` times too wide, at
    /// its centre.
    fn read_wide(truth: &[Circle], wide: f64) -> Readings {
        Readings {
            found: truth
                .iter()
                .map(|c| Detection {
                    x: c.x,
                    y: c.y,
                    diameter: c.diameter * wide,
                    score: 0.5,
                    scale: 1.0,
                })
                .collect(),
            sizes: (8.0, 500.0),
        }
    }

    #[test]
    fn the_diameter_scales_kept_are_those_that_read_the_labels_and_1_on_a_tie() {
        let truth: Vec<Circle> = (0..12)
            .map(|i| Circle {
                x: 40.0 + 60.0 * i as f64,
                y: 100.0,
                diameter: 10.0 + 4.0 * i as f64,
            })
            .collect();
        let truth = vec![truth];
        let full = |full_size| DiameterScales {
            full_size,
            per_octave: 1.0,
        };
        // read 1.6 times too wide, nothing is found as read (over 1.5 times the label)
        let wide = [read_wide(&truth[0], 1.6)];
        let (scales, bins) =
            best_diameter_scales(&wide, &truth, &scale_pairs(&[0.75, 1.0, 1.1], &[1.0]));
        assert_eq!(scales, full(0.75));
        assert_eq!(small_and_large_f1(&bins), 1.0);
        assert_eq!(
            small_and_large_f1(&score_readings(&wide, &truth, DiameterScales::AS_READ)),
            0.0
        );
        // read right, x 0.75 still matches every crater (within 1.5 times): 1 is kept, and
        // of scales an octave that tie (every reading here is of the full-size level), 1
        let right = [read_wide(&truth[0], 1.0)];
        let tried = scale_pairs(&[0.75, 0.9, 1.0, 1.1], &[0.9, 1.0, 1.1]);
        assert_eq!(tried.len(), 12);
        let (scales, _) = best_diameter_scales(&right, &truth, &tried);
        assert_eq!(scales, DiameterScales::AS_READ);
        // read two octaves down, 1.6 times too wide: x 0.8 an octave takes it back to 1.02
        let mut coarse = read_wide(&truth[0], 1.6);
        coarse.found.iter_mut().for_each(|d| d.scale = 0.25);
        let (scales, bins) =
            best_diameter_scales(&[coarse], &truth, &scale_pairs(&[1.0], &[0.8, 1.0]));
        assert_eq!(scales.per_octave, 0.8);
        assert_eq!(small_and_large_f1(&bins), 1.0);
    }
}
