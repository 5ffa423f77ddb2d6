//! Craters in a whole image: an image pyramid, each level cut into the detector's tiles in
//! bands of rows (so memory follows the band, not the image), the per-pixel likelihood
//! turned into circles, and the circles of all levels merged.
//!
//! The detector's convolutions are valid, so each output tile sees its full context in the
//! image around it: tiles are laid edge to edge and the stitched likelihood is the one a
//! detector as large as the image would give (mirrored pixels only past the image's edges).
//! A no-data margin (black joined to the image's edge) is filled from the data before the
//! pyramid is made, and nothing centred in it is reported.

use crate::error::{Error, Result};
use crate::net::Net;
use crate::store::DetectorConfig;
use craterdex_errors::{ensure, IoContext, ResultExt};
use craterdex_model::Precision;
use image::{DynamicImage, ImageBuffer, Luma};
use rayon::prelude::*;
use std::borrow::Cow;
use std::path::Path;

/// A grey image as 8-bit levels (what pycda's detector was trained on).
#[derive(Clone, Debug, PartialEq)]
pub struct GrayImage {
    pub width: usize,
    pub height: usize,
    pub pixels: Vec<u8>,
}

/// Whole images can be large: a mosaic of up to 4 gigapixels is read.
const MAX_IMAGE_PIXELS: u64 = 1 << 32;

impl GrayImage {
    /// Reads PNG, TIFF, JPEG or PNM; colour is averaged to grey, and deeper than 8 bits
    /// (16-bit or float TIFF) stretched between its 0.1 and 99.9 percentiles onto levels 1-255
    /// (0 is no data: non-finite values).
    pub fn open(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).io("read", path)?;
        let limits = craterdex_model::preprocess::DecodeLimits {
            max_pixels: Some(MAX_IMAGE_PIXELS),
            max_side: None,
            allow_partial: false,
        };
        let decoded = craterdex_model::preprocess::decode(&bytes, &limits)
            .with_context(|| format!("{} is not a usable image", path.display()))?;
        Ok(Self::from_dynamic(&decoded.image))
    }

    /// Width and height from the file's header, without decoding its pixels.
    pub fn dimensions(path: &Path) -> Result<(usize, usize)> {
        let (w, h) = image::ImageReader::open(path)
            .and_then(|r| r.with_guessed_format())
            .io("read", path)?
            .into_dimensions()
            .map_err(|e| {
                Error::Invalid(format!("{} is not a usable image: {e}", path.display()))
            })?;
        Ok((w as usize, h as usize))
    }

    /// Grey levels from values of any range (a 16-bit or float band read by GDAL): stretched
    /// between their 0.1 and 99.9 percentiles onto levels 1-255 as deep TIFFs are; non-finite
    /// values (the band's no-data) level 0.
    pub fn from_values(width: usize, height: usize, values: &[f32]) -> Result<Self> {
        ensure!(
            values.len() == width * height,
            Error::Invalid(format!(
                "{} values for a {width} x {height} image",
                values.len()
            ))
        );
        Ok(Self {
            width,
            height,
            pixels: stretch(values),
        })
    }

    pub fn from_dynamic(image: &DynamicImage) -> Self {
        let (width, height) = (image.width() as usize, image.height() as usize);
        let pixels = match image {
            DynamicImage::ImageLuma8(_)
            | DynamicImage::ImageRgb8(_)
            | DynamicImage::ImageRgba8(_)
            | DynamicImage::ImageLumaA8(_) => image.to_luma8().into_raw(),
            _ => stretch(&image.to_luma32f().into_raw()),
        };
        Self {
            width,
            height,
            pixels,
        }
    }

    /// This image resized by `scale` (area-weighted when shrinking).
    pub(crate) fn scaled(&self, scale: f64) -> Self {
        if scale == 1.0 {
            return self.clone();
        }
        let (w, h) = (
            ((self.width as f64 * scale).round() as u32).max(1),
            ((self.height as f64 * scale).round() as u32).max(1),
        );
        let buf: ImageBuffer<Luma<u8>, Vec<u8>> =
            ImageBuffer::from_raw(self.width as u32, self.height as u32, self.pixels.clone())
                .expect("the buffer holds width x height pixels");
        let out = image::imageops::resize(&buf, w, h, image::imageops::FilterType::Triangle);
        Self {
            width: w as usize,
            height: h as usize,
            pixels: out.into_raw(),
        }
    }

    /// The image's no-data margin: black (level 0) pixels joined to its edge through black
    /// pixels, as map-projected products and turned or mosaicked canvases carry outside their
    /// data; `None` where there is none. Shadows are black too, but lit ground encloses
    /// them (on the Mars sample tile, 98 black regions, none at the edge).
    pub fn margin(&self) -> Option<Vec<bool>> {
        let (w, h) = (self.width, self.height);
        if w == 0 || h == 0 {
            return None;
        }
        let edge = (0..w)
            .flat_map(|x| [x, (h - 1) * w + x])
            .chain((0..h).flat_map(|y| [y * w, y * w + w - 1]));
        let mut stack: Vec<usize> = edge.filter(|&i| self.pixels[i] == 0).collect();
        if stack.is_empty() {
            return None;
        }
        let mut margin = vec![false; w * h];
        while let Some(i) = stack.pop() {
            if margin[i] || self.pixels[i] != 0 {
                continue;
            }
            margin[i] = true;
            let (x, y) = (i % w, i / w);
            if x > 0 {
                stack.push(i - 1);
            }
            if x + 1 < w {
                stack.push(i + 1);
            }
            if y > 0 {
                stack.push(i - w);
            }
            if y + 1 < h {
                stack.push(i + w);
            }
        }
        Some(margin)
    }

    /// This image with its no-data margin ([`GrayImage::margin`]) filled
    /// ([`GrayImage::with_margin_filled`]), as it is where it has none, and the margin: what
    /// `detect` searches and what a fit is taught on.
    pub fn margin_filled(&self) -> (Cow<'_, Self>, Option<Vec<bool>>) {
        match self.margin() {
            Some(m) => (Cow::Owned(self.with_margin_filled(&m)), Some(m)),
            None => (Cow::Borrowed(self), None),
        }
    }

    /// This image with its `margin` filled from the data inward out: ring by ring, each pixel
    /// the mean of its eight neighbours filled before it (or data). The detector then sees the
    /// ground go on past the data's edge, as mirroring shows it past the image's edges,
    /// rather than an edge of black it was never taught; an image all margin stays as it is.
    pub fn with_margin_filled(&self, margin: &[bool]) -> Self {
        // each pixel's state: a margin pixel not yet reached, one in the ring being filled,
        // or known (data, or filled): one byte a pixel beside the copy
        const UNREACHED: u8 = 0;
        const IN_RING: u8 = 1;
        const KNOWN: u8 = 2;
        let (w, h) = (self.width, self.height);
        let mut out = self.clone();
        let mut state: Vec<u8> = margin
            .iter()
            .map(|&m| if m { UNREACHED } else { KNOWN })
            .collect();
        let neighbours = |i: usize| {
            let (x, y) = ((i % w) as isize, (i / w) as isize);
            (-1..=1)
                .flat_map(move |dy| (-1..=1).map(move |dx| (x + dx, y + dy)))
                .filter(move |&(nx, ny)| {
                    (nx, ny) != (x, y) && nx >= 0 && ny >= 0 && nx < w as isize && ny < h as isize
                })
                .map(move |(nx, ny)| ny as usize * w + nx as usize)
        };
        let mut ring: Vec<usize> = (0..w * h)
            .filter(|&i| margin[i] && neighbours(i).any(|n| state[n] == KNOWN))
            .collect();
        ring.iter().for_each(|&i| state[i] = IN_RING);
        while !ring.is_empty() {
            let values: Vec<u8> = ring
                .iter()
                .map(|&i| {
                    let (sum, n) = neighbours(i)
                        .filter(|&n| state[n] == KNOWN)
                        .fold((0u32, 0u32), |(s, c), n| {
                            (s + u32::from(out.pixels[n]), c + 1)
                        });
                    ((sum + n / 2) / n.max(1)) as u8
                })
                .collect();
            for (&i, v) in ring.iter().zip(values) {
                out.pixels[i] = v;
                state[i] = KNOWN;
            }
            let mut next = Vec::new();
            for &i in &ring {
                for n in neighbours(i) {
                    if state[n] == UNREACHED {
                        state[n] = IN_RING;
                        next.push(n);
                    }
                }
            }
            ring = next;
        }
        out
    }

    /// Pixel at `(x, y)`, mirrored back inside past the edges.
    pub(crate) fn mirrored(&self, x: isize, y: isize) -> u8 {
        self.pixels[mirror(y, self.height) * self.width + mirror(x, self.width)]
    }

    /// The value at `(x, y)` between pixels (bilinear), [`GrayImage::mirrored`] past the edges.
    pub(crate) fn bilinear(&self, x: f32, y: f32) -> f32 {
        let (fx, fy) = (x.floor(), y.floor());
        let (ax, ay) = (x - fx, y - fy);
        let (ix, iy) = (fx as isize, fy as isize);
        let at = |dx: isize, dy: isize| self.mirrored(ix + dx, iy + dy) as f32;
        let top = at(0, 0) + ax * (at(1, 0) - at(0, 0));
        let bottom = at(0, 1) + ax * (at(1, 1) - at(0, 1));
        top + ay * (bottom - top)
    }
}

/// `i` reflected into `0..n` (…, 2, 1, 0, 1, 2, …, n-1, n-2, …), for any distance out.
fn mirror(i: isize, n: usize) -> usize {
    if n == 1 {
        return 0;
    }
    let period = 2 * (n as isize - 1);
    let m = i.rem_euclid(period);
    (if m < n as isize { m } else { period - m }) as usize
}

/// Values between their 0.1 and 99.9 percentiles onto 0..255.
fn stretch(values: &[f32]) -> Vec<u8> {
    let mut finite: Vec<f32> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() {
        return vec![0; values.len()];
    }
    let mut at = |q: f64| {
        let k = ((finite.len() - 1) as f64 * q) as usize;
        *finite.select_nth_unstable_by(k, f32::total_cmp).1
    };
    let (lo, hi) = (at(0.001), at(0.999));
    let span = (hi - lo).max(f32::MIN_POSITIVE);
    values
        .iter()
        .map(|v| {
            // data onto 1..=255: level 0 is no data alone (GrayImage::margin)
            if v.is_finite() {
                (1.0 + (v - lo) / span * 254.0).clamp(1.0, 255.0).round() as u8
            } else {
                0
            }
        })
        .collect()
}

/// One crater found: centre and diameter in the image's pixels (x right, y down, the centre
/// of the top-left pixel at 0, 0), the mean likelihood over its pixels, and the pyramid
/// scale it was found at.
#[derive(Clone, Debug, PartialEq)]
pub struct Detection {
    pub x: f64,
    pub y: f64,
    pub diameter: f64,
    pub score: f32,
    pub scale: f64,
}

/// How craters are found. The defaults live here.
#[derive(Clone, Debug, PartialEq)]
pub struct DetectOptions {
    /// Pixels of likelihood above this make up craters.
    pub threshold: f32,
    /// The smallest diameter reported, in the image's pixels.
    pub min_diameter: f64,
    /// The largest, as a share of the image's shorter side.
    pub max_diameter_share: f64,
    /// Each pyramid level reports craters up to this diameter in its own pixels; the next
    /// level (half the size) takes the larger ones.
    pub level_max_diameter: f64,
    /// Output rows of likelihood held at once per level.
    pub band_rows: usize,
    /// Largest tile side run at once (detectors that take larger tiles than their own):
    /// larger tiles waste less on their borders and hold more memory (about 1 GB at 1024
    /// for pycda's U-Net).
    pub max_tile: usize,
    /// Each tile is also run mirrored left to right, top to bottom and both, and the
    /// likelihoods averaged: four times the time.
    pub flips: bool,
    /// Pyramid levels per halving of the image: at 2 each crater is read at two levels
    /// (half an octave apart), for about 1.5 times the time of 1.
    pub levels_per_octave: usize,
}

impl Default for DetectOptions {
    fn default() -> Self {
        // threshold, level_max_diameter and levels_per_octave chosen on four of the twelve
        // NAC tiles (the first four by name), by the mean F1 of the 8-20 px and >= 20 px
        // bins; reported on the other eight and on the Mars tile (docs/results.md, "Finding
        // craters")
        Self {
            threshold: 0.4,
            min_diameter: 8.0,
            max_diameter_share: 0.5,
            level_max_diameter: 14.0,
            band_rows: 1024,
            max_tile: 1024,
            flips: false,
            levels_per_octave: 2,
        }
    }
}

impl DetectOptions {
    pub(crate) fn check(&self) -> Result<()> {
        ensure!(
            self.threshold > 0.0 && self.threshold < 1.0,
            Error::Invalid(format!(
                "the threshold must lie between 0 and 1, not {}",
                self.threshold
            ))
        );
        ensure!(
            self.min_diameter >= 1.0 && self.level_max_diameter > 2.0 * 4.0 && self.band_rows > 0,
            Error::Invalid(format!(
                "diameters must be at least 1 px (smallest) and 8 px (per level), not {} and {}",
                self.min_diameter, self.level_max_diameter
            ))
        );
        ensure!(
            (1..=4).contains(&self.levels_per_octave),
            Error::Invalid(format!(
                "levels per octave must be 1 to 4, not {}",
                self.levels_per_octave
            ))
        );
        ensure!(
            self.max_diameter_share > 0.0 && self.max_diameter_share <= 1.0,
            Error::Invalid(format!(
                "the largest diameter share must lie in (0, 1], not {}",
                self.max_diameter_share
            ))
        );
        Ok(())
    }

    /// Diameters level `k` of `levels` reports, in its own pixels: from the smallest (the
    /// first level) or half the per-level largest (the others) to the per-level largest
    /// (unbounded on the last level). With more than one level per octave the ranges of
    /// neighbouring levels overlap: a crater is read at two levels or more, and the best
    /// reading kept.
    pub fn level_range(&self, k: usize, levels: usize) -> (f64, f64) {
        let lo = if k == 0 {
            self.min_diameter
        } else {
            self.level_max_diameter / 2.0
        };
        let hi = if k + 1 == levels {
            f64::INFINITY
        } else {
            self.level_max_diameter
        };
        (lo, hi)
    }

    /// The pyramid's scales for an image whose shorter side is `side`: shrinking by
    /// `levels_per_octave` steps an octave until a level would only hold craters larger than
    /// the largest reported.
    pub fn scales(&self, side: usize) -> Vec<f64> {
        let largest = self.max_diameter_share * side as f64;
        let mut scales: Vec<f64> = vec![1.0];
        loop {
            let next = 0.5f64.powf(scales.len() as f64 / self.levels_per_octave as f64);
            // the next level reports from half the per-level largest in its own pixels, and
            // its largest must still fit twice across it
            let smallest_reported = self.level_max_diameter / 2.0 / next;
            if smallest_reported > largest || side as f64 * next < 2.0 * self.level_max_diameter {
                return scales;
            }
            scales.push(next);
        }
    }
}

/// The precision a detector runs at unless told: the fastest here (bf16 on AMX tiles, int8
/// with AVX-512 VNNI, f32 elsewhere), each of which finds the craters f32 finds
/// ([`DEFAULT_PRECISION_WHY`]).
pub fn default_precision() -> Precision {
    Precision::fastest_here()
}

/// Why [`default_precision`] is what it is, from docs/performance.md and docs/results.md.
pub const DEFAULT_PRECISION_WHY: &str = "int8 and bf16 detection keep F1 at >= 20 px within \
     0.003 of f32 for pycda's U-Net on the eight held-out NAC tiles (0.407 and 0.405 against \
     0.406) and within 0.008 on pycda's Mars tile (0.467 and 0.456 against 0.464: one crater of \
     117); a detector fitted on four NAC tiles reads 0.783 in int8 against 0.789 in f32 on the \
     eight (604 of 807 craters found against 610); int8 runs 1.95x f32 with VNNI (Zen 4, \
     avx512) and bf16 3.4x on AMX tiles (Sapphire Rapids), so each is the default on its \
     hardware; without either, f32";

/// The tiles `detect` runs for an image of `width x height`: what a progress bar counts.
pub fn tiles_needed(
    config: &DetectorConfig,
    width: usize,
    height: usize,
    o: &DetectOptions,
) -> Result<usize> {
    let period = config.tile_step().max(1);
    o.scales(width.min(height))
        .iter()
        .map(|s| {
            let (w, h) = (
                ((width as f64 * s).round() as usize).max(1),
                ((height as f64 * s).round() as usize).max(1),
            );
            let bands = h.div_ceil(o.band_rows);
            let halo = halo(o);
            (0..bands)
                .map(|b| {
                    let (r0, r1) = band_rows(b, o.band_rows, h, halo, period);
                    let rows = config.tile_for(r1 - r0, o.max_tile)?.1;
                    let columns = config.tile_for(w, o.max_tile)?.1;
                    Ok(tile_starts(r0, r1 - r0, rows, period).len()
                        * tile_starts(0, w, columns, period).len())
                })
                .sum::<Result<usize>>()
        })
        .sum::<Result<usize>>()
}

/// Where the output tiles of `out` pixels start (in the level's pixels) to cover `len`
/// pixels from `first`: each at a multiple of `period`, the detector's poolings' step, so
/// that every tile computes the same function of the level, which its pooling would
/// otherwise shift with the tile's place (pycda's U-Net: 8 px); neighbouring tiles then
/// overlap by what `out` exceeds a multiple of `period`, and the first and last reach past
/// `first` and the end. A map so tiled is what one tile of the whole level gives.
pub(crate) fn tile_starts(first: usize, len: usize, out: usize, period: usize) -> Vec<usize> {
    let aligned = out - out % period.max(1);
    if aligned == 0 {
        // tiles narrower than the step: edge to edge, the last pulled back to the end
        let mut starts: Vec<usize> = (0..len.div_ceil(out.max(1)))
            .map(|i| first + i * out)
            .collect();
        if let Some(last) = starts.last_mut() {
            *last = (*last).min(first + len.saturating_sub(out));
        }
        return starts;
    }
    let mut starts = vec![first - first % period];
    while let Some(&last) = starts.last().filter(|&&s| s + out < first + len) {
        starts.push(last + aligned);
    }
    starts
}

/// Rows of likelihood computed beyond a band on each side, so that a crater a level
/// reports, straddling the band's edge, is whole in the band that holds its centre.
pub(crate) fn halo(o: &DetectOptions) -> usize {
    o.level_max_diameter.ceil() as usize + 4
}

/// Rows (with halo) of band `b`, starting at a multiple of `period` ([`tile_starts`]).
pub(crate) fn band_rows(
    b: usize,
    band: usize,
    height: usize,
    halo: usize,
    period: usize,
) -> (usize, usize) {
    let core = (b * band, ((b + 1) * band).min(height));
    let first = core.0.saturating_sub(halo);
    (first - first % period.max(1), (core.1 + halo).min(height))
}

/// Finds the craters in `image` with `net` (described by `config`); `progress` is told of
/// each tile done.
pub fn detect(
    net: &Net,
    config: &DetectorConfig,
    image: &GrayImage,
    o: &DetectOptions,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<Vec<Detection>> {
    Ok(read_pyramid(net, config, image, o, progress)?.craters(config.diameter_scales()))
}

/// What each diameter read is multiplied by: `full_size` on the image's own level, and
/// `per_octave` once more for each halving down the pyramid (a detector's regions spread
/// wider, relative to the rim, on its smaller levels).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DiameterScales {
    pub full_size: f64,
    pub per_octave: f64,
}

impl DiameterScales {
    /// The diameters as read.
    pub const AS_READ: Self = Self {
        full_size: 1.0,
        per_octave: 1.0,
    };

    /// The factor for a reading of the pyramid level at `level_scale` (1, 0.707, 0.5, ...).
    pub fn at(&self, level_scale: f64) -> f64 {
        self.full_size * self.per_octave.powf(-level_scale.log2())
    }
}

/// Every pyramid level's circles in one image, before their diameters are scaled and the
/// levels' readings of one crater merged: what [`detect`] reads once and a fit scores at
/// several diameter scales.
#[derive(Clone, Debug)]
pub struct Readings {
    /// Diameters as read (the region's, over the detector's region share), in the image's
    /// pixels; outside the image's no-data margin.
    pub found: Vec<Detection>,
    /// The smallest and largest diameters reported.
    pub sizes: (f64, f64),
}

impl Readings {
    /// One detection per crater, each diameter multiplied by its level's factor of
    /// `scales`, those outside the sizes reported left out.
    pub fn craters(&self, scales: DiameterScales) -> Vec<Detection> {
        let (smallest, largest) = self.sizes;
        merge(
            self.found
                .iter()
                .map(|d| Detection {
                    diameter: d.diameter * scales.at(d.scale),
                    ..d.clone()
                })
                .filter(|d| d.diameter >= smallest && d.diameter <= largest)
                .collect(),
        )
    }
}

/// The circles each pyramid level of `image` reads within its range of sizes
/// ([`DetectOptions::level_range`]).
pub fn read_pyramid(
    net: &Net,
    config: &DetectorConfig,
    image: &GrayImage,
    o: &DetectOptions,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<Readings> {
    o.check()?;
    config.output()?;
    ensure!(
        image.width >= 16 && image.height >= 16,
        Error::Invalid(format!(
            "the image is {}x{} pixels; the detector needs at least 16 per side",
            image.width, image.height
        ))
    );
    let (filled, margin) = image.margin_filled();
    let image = filled.as_ref();
    let side = image.width.min(image.height);
    let largest = o.max_diameter_share * side as f64;
    let mut found = Vec::new();
    let scales = o.scales(side);
    let period = config.tile_step();
    for (k, &scale) in scales.iter().enumerate() {
        let level = image.scaled(scale);
        let (lo, hi) = o.level_range(k, scales.len());
        let halo = halo(o);
        for b in 0..level.height.div_ceil(o.band_rows) {
            let (r0, r1) = band_rows(b, o.band_rows, level.height, halo, period);
            let core = (b * o.band_rows, ((b + 1) * o.band_rows).min(level.height));
            let map = net_map(
                net, config, &level, r0, r1, o.max_tile, 1, o.flips, progress,
            )?;
            for mut c in circles(&map, level.width, r1 - r0, o.threshold) {
                c.diameter /= config.region_share;
                let (cy, touches_cut) = (
                    c.y + r0 as f64,
                    (c.top == 0 && r0 > 0) || (c.bottom + 1 == r1 - r0 && r1 < level.height),
                );
                if touches_cut
                    || cy < core.0 as f64 - 0.5
                    || cy >= core.1 as f64 - 0.5
                    || c.diameter < lo
                    || c.diameter >= hi
                {
                    continue;
                }
                let d = c.diameter / scale;
                let (x, y) = ((c.x + 0.5) / scale - 0.5, (cy + 0.5) / scale - 0.5);
                if in_margin(margin.as_deref(), image, x, y) {
                    continue;
                }
                found.push(Detection {
                    x,
                    y,
                    diameter: d,
                    score: c.score,
                    scale,
                });
            }
        }
    }
    Ok(Readings {
        found,
        sizes: (o.min_diameter, largest),
    })
}

/// Whether `(x, y)` (pixel centres at whole numbers) lies in the image's no-data `margin`.
pub fn in_margin(margin: Option<&[bool]>, image: &GrayImage, x: f64, y: f64) -> bool {
    margin.is_some_and(|m| {
        let (px, py) = (x.round().max(0.0) as usize, y.round().max(0.0) as usize);
        m[py.min(image.height - 1) * image.width + px.min(image.width - 1)]
    })
}

/// The net's output over rows `r0..r1` of `level`, every column, `channels` values per
/// pixel (a detector's likelihood: one): output tiles edge to edge (the last of a row or
/// column pulled back to end at the edge), each computed from its input tile around it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn net_map(
    net: &Net,
    config: &DetectorConfig,
    level: &GrayImage,
    r0: usize,
    r1: usize,
    max_tile: usize,
    channels: usize,
    flips: bool,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<Vec<f32>> {
    let (w, h) = (level.width, r1 - r0);
    let (tile_h, out_h) = config.tile_for(h, max_tile)?;
    let (tile_w, out_w) = config.tile_for(w, max_tile)?;
    let border = (tile_h - out_h) / 2;
    let period = config.tile_step();
    // each flip of the tile is run and its output flipped back: the border is the same on
    // both sides of each axis, so output pixel i of a flipped tile is pixel out - 1 - i
    let views: &[(bool, bool)] = if flips {
        &[(false, false), (false, true), (true, false), (true, true)]
    } else {
        &[(false, false)]
    };
    let share = 1.0 / views.len() as f32;
    let mut map = vec![0f32; w * h * channels];
    // tiles at their places in the level (rows from r0 on kept); each output pixel is
    // written once, by the first tile that holds it
    let (mut rows_done, row_starts) = (r0, tile_starts(r0, h, out_h, period));
    for ty in row_starts {
        let rows = rows_done.max(ty)..(ty + out_h).min(r1);
        let mut columns_done = 0;
        for tx in tile_starts(0, w, out_w, period) {
            let columns = columns_done.max(tx)..(tx + out_w).min(w);
            for &(flip_y, flip_x) in views {
                let mut input = net.input_map(tile_h, tile_w);
                input
                    .data
                    .par_chunks_mut(tile_w)
                    .enumerate()
                    .for_each(|(i, row)| {
                        let i = if flip_y { tile_h - 1 - i } else { i };
                        let y = ty as isize + i as isize - border as isize;
                        for (j, v) in row.iter_mut().enumerate() {
                            let j = if flip_x { tile_w - 1 - j } else { j };
                            let x = tx as isize + j as isize - border as isize;
                            *v = level.mirrored(x, y) as f32 * config.input_scale;
                        }
                    });
                let got = net.forward(input)?;
                ensure!(
                    got.channels == channels && got.height == out_h && got.width == out_w,
                    Error::Invalid(format!(
                        "detector {}: its output is {}x{}x{}, not {out_h}x{out_w}x{channels}",
                        config.name, got.height, got.width, got.channels
                    ))
                );
                for y in rows.clone() {
                    let i = y - ty;
                    let from_row = if flip_y { out_h - 1 - i } else { i };
                    let at = (y - r0) * w * channels;
                    for x in columns.clone() {
                        let j = x - tx;
                        let from =
                            (from_row * out_w + if flip_x { out_w - 1 - j } else { j }) * channels;
                        for c in 0..channels {
                            map[at + x * channels + c] += share * got.data[from + c];
                        }
                    }
                }
                net.recycle(got);
            }
            columns_done = columns.end;
            progress(1);
        }
        rows_done = rows.end;
    }
    Ok(map)
}

/// A connected region of likelihood over the threshold, as a circle of the same area.
#[derive(Clone, Debug, PartialEq)]
struct Circle {
    x: f64,
    y: f64,
    diameter: f64,
    score: f32,
    top: usize,
    bottom: usize,
}

/// 4-connected regions of `map` (`width x height`) above `threshold` as circles: centre at
/// their mean pixel, diameter of the disc of their area (pycda's FastCircles).
fn circles(map: &[f32], width: usize, height: usize, threshold: f32) -> Vec<Circle> {
    let mut seen = vec![false; map.len()];
    let mut stack = Vec::new();
    let mut out = Vec::new();
    for start in 0..map.len() {
        if seen[start] || map[start] <= threshold {
            continue;
        }
        seen[start] = true;
        stack.push(start);
        let (mut n, mut sx, mut sy, mut sl) = (0usize, 0f64, 0f64, 0f64);
        let (mut top, mut bottom) = (usize::MAX, 0);
        while let Some(p) = stack.pop() {
            let (x, y) = (p % width, p / width);
            n += 1;
            sx += x as f64;
            sy += y as f64;
            sl += map[p] as f64;
            top = top.min(y);
            bottom = bottom.max(y);
            let mut visit = |q: usize| {
                if !seen[q] && map[q] > threshold {
                    seen[q] = true;
                    stack.push(q);
                }
            };
            if x > 0 {
                visit(p - 1);
            }
            if x + 1 < width {
                visit(p + 1);
            }
            if y > 0 {
                visit(p - width);
            }
            if y + 1 < height {
                visit(p + width);
            }
        }
        out.push(Circle {
            x: sx / n as f64,
            y: sy / n as f64,
            diameter: 2.0 * (n as f64 / std::f64::consts::PI).sqrt(),
            score: (sl / n as f64) as f32,
            top,
            bottom,
        });
    }
    out
}

/// How much larger than another a circle may be and still be read as the same crater by
/// [`merge`] where it is concentric with it: 3 (within a factor of two, any circle whose
/// centre lies within half the larger diameter is). A level that reads a crater well often
/// reads, a level or two on, the crater with its rim or halo as a concentric circle two to
/// three times as wide and of lower likelihood; within a factor of two only, that circle stood
/// as a false crater (on the four tuning NAC tiles, a third of the false detections of 20 px
/// or more of a detector fitted there). Chosen on those tiles, with [`CONCENTRIC_SHARE`],
/// from 2, 2.5, 3 and 4 by the mean F1 of the 8-20 px and >= 20 px bins for two fitted
/// detectors; docs/results.md, "Concentric circles merged".
pub const MERGE_SIZE_RATIO: f64 = 3.0;

/// The distance, as a share of the larger diameter, within which two circles more than a
/// factor of two apart in size are concentric ([`MERGE_SIZE_RATIO`]): 0.35, chosen with it
/// from 0.25, 0.35 and 0.5 (0.5, as for circles of like size, merged more real craters
/// nested inside larger ones).
pub const CONCENTRIC_SHARE: f64 = 0.35;

/// Whether circles `a` and `b` are read as one crater: within a factor of two in size and
/// within half the larger diameter of each other, or within [`MERGE_SIZE_RATIO`] and
/// concentric.
fn same_crater(a: &Detection, b: &Detection) -> bool {
    let larger = a.diameter.max(b.diameter);
    let (ratio, apart) = (
        larger / a.diameter.min(b.diameter),
        (a.x - b.x).hypot(a.y - b.y),
    );
    (ratio < 2.0 && apart < 0.5 * larger)
        || (ratio < MERGE_SIZE_RATIO && apart < CONCENTRIC_SHARE * larger)
}

/// One detection per crater: where two levels (or two neighbouring regions) give circles of
/// one crater ([`same_crater`]), the higher score stays.
fn merge(mut found: Vec<Detection>) -> Vec<Detection> {
    found.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then(a.x.total_cmp(&b.x))
            .then(a.y.total_cmp(&b.y))
    });
    let cell = 32.0;
    let key = |x: f64, y: f64| ((x / cell).floor() as i64, (y / cell).floor() as i64);
    let mut grid: std::collections::HashMap<(i64, i64), Vec<usize>> = Default::default();
    let mut kept: Vec<Detection> = Vec::new();
    for d in found {
        // a kept circle that suppresses d is at most MERGE_SIZE_RATIO d across and within
        // half that of its centre
        let reach = (0.5 * MERGE_SIZE_RATIO * d.diameter / cell).ceil() as i64;
        let (cx, cy) = key(d.x, d.y);
        let duplicate = (cx - reach..=cx + reach).any(|gx| {
            (cy - reach..=cy + reach).any(|gy| {
                grid.get(&(gx, gy))
                    .is_some_and(|ids| ids.iter().any(|&i| same_crater(&kept[i], &d)))
            })
        });
        if !duplicate {
            grid.entry(key(d.x, d.y)).or_default().push(kept.len());
            kept.push(d);
        }
    }
    kept.sort_by(|a, b| a.y.total_cmp(&b.y).then(a.x.total_cmp(&b.x)));
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrored_indices_stay_inside_at_any_distance() {
        assert_eq!(
            (-3..8).map(|i| mirror(i, 4)).collect::<Vec<_>>(),
            vec![3, 2, 1, 0, 1, 2, 3, 2, 1, 0, 1]
        );
        assert_eq!(mirror(-100, 1), 0);
    }

    /// A 12 x 10 image: data of level 100 plus x, a black frame two pixels wide on the left
    /// and top (the margin) and a black pit of 2 x 2 inside.
    fn framed() -> GrayImage {
        let (width, height) = (12, 10);
        let pixels = (0..width * height)
            .map(|i| {
                let (x, y) = (i % width, i / width);
                match (x < 2 || y < 2, (6..8).contains(&x) && (5..7).contains(&y)) {
                    (true, _) | (_, true) => 0,
                    _ => 100 + x as u8,
                }
            })
            .collect();
        GrayImage {
            width,
            height,
            pixels,
        }
    }

    #[test]
    fn the_margin_is_black_joined_to_the_edge_and_shadows_inside_are_not() {
        let image = framed();
        let margin = image.margin().unwrap();
        for (i, &m) in margin.iter().enumerate() {
            let (x, y) = (i % image.width, i / image.width);
            assert_eq!(m, x < 2 || y < 2, "({x}, {y})");
        }
        let mut inside = image.clone();
        for (i, p) in inside.pixels.iter_mut().enumerate() {
            *p = (*p).max(u8::from(i % 12 < 2 || i / 12 < 2));
        }
        assert_eq!(inside.margin(), None, "only the pit is black");
    }

    #[test]
    fn the_margin_is_filled_from_the_data_nearest_it_and_the_data_kept() {
        let image = framed();
        let margin = image.margin().unwrap();
        let filled = image.with_margin_filled(&margin);
        for (i, (&before, &after)) in image.pixels.iter().zip(&filled.pixels).enumerate() {
            let (x, y) = (i % image.width, i / image.width);
            if margin[i] {
                // the data's columns run 102 + (x - 2): a margin pixel takes about the
                // column's value it faces, never black
                let near = 100 + x.max(2) as i32;
                assert!((after as i32 - near).abs() <= 2, "({x}, {y}): {after}");
            } else {
                assert_eq!(after, before, "({x}, {y})");
            }
        }
        // an image all margin has nothing to fill from
        let black = GrayImage {
            width: 5,
            height: 4,
            pixels: vec![0; 20],
        };
        assert_eq!(black.with_margin_filled(&black.margin().unwrap()), black);
        let empty = GrayImage {
            width: 0,
            height: 0,
            pixels: vec![],
        };
        assert_eq!(empty.margin(), None);
    }

    /// A 28 x 28 image of no symmetry and its mirror image left to right.
    fn asymmetric_and_mirrored() -> (GrayImage, GrayImage) {
        let n = 28;
        let level = |x: usize, y: usize| ((x * 37 + y * y * 11 + x * y * 5) % 251) as u8;
        let image = |mirror: bool| GrayImage {
            width: n,
            height: n,
            pixels: (0..n * n)
                .map(|i| {
                    let (x, y) = (i % n, i / n);
                    level(if mirror { n - 1 - x } else { x }, y)
                })
                .collect(),
        };
        (image(false), image(true))
    }

    /// Tiles at multiples of the detector's pooling step compute the same function of the
    /// level wherever they lie: the map is what one tile of the whole level gives, whatever
    /// the tile size and the band (a last tile pulled back to end at the edge, at an odd
    /// place, used to shift the pooling under it).
    #[test]
    fn the_likelihood_is_the_same_whatever_the_tiles() {
        let (config, weights) = crate::testing::small_unet_detector();
        let net = Net::new(config.graph.clone(), |n| weights.get(n).cloned()).unwrap();
        assert_eq!(config.tile_step(), 2);
        let (w, h) = (37, 31);
        let level = GrayImage {
            width: w,
            height: h,
            pixels: (0..w * h)
                .map(|i| ((i * 37 + (i / w) * (i / w) * 11) % 251) as u8)
                .collect(),
        };
        let map = |r0, r1, max_tile| {
            net_map(&net, &config, &level, r0, r1, max_tile, 1, false, &|_| {}).unwrap()
        };
        let whole = map(0, h, 64);
        assert_eq!(tile_starts(0, w, config.tile_for(w, 64).unwrap().1, 2), [0]);
        assert_eq!(tile_starts(0, w, 14, 2), [0, 14, 28]);
        for (r0, r1, max_tile) in [(0, h, 20), (0, h, 30), (10, 25, 20), (4, 31, 64)] {
            let part = map(r0, r1, max_tile);
            let want = &whole[r0 * w..r1 * w];
            let worst = part
                .iter()
                .zip(want)
                .fold(0f32, |d, (a, b)| d.max((a - b).abs()));
            assert!(
                worst < 1e-5,
                "rows {r0}..{r1}, tiles of {max_tile}: {worst}"
            );
        }
        // a tile step of 4 px and outputs of 6: neighbours overlap by 2, from a multiple of 4
        assert_eq!(tile_starts(6, 13, 6, 4), [4, 8, 12, 16]);
        assert_eq!(tile_starts(0, 5, 3, 4), [0, 2]);
    }

    #[test]
    fn flipped_views_make_the_likelihood_mirror_symmetric() {
        let (config, weights) = crate::testing::small_unet_detector();
        let net = Net::new(config.graph.clone(), |n| weights.get(n).cloned()).unwrap();
        let (image, mirrored) = asymmetric_and_mirrored();
        let n = image.width;
        let map = |im: &GrayImage, flips| {
            net_map(&net, &config, im, 0, n, 64, 1, flips, &|_| {}).unwrap()
        };
        // the worst difference between a map of the mirrored image and the mirrored map
        let asymmetry = |flips| {
            let (a, b) = (map(&image, flips), map(&mirrored, flips));
            (0..n * n)
                .map(|i| (a[i] - b[(i / n) * n + n - 1 - i % n]).abs())
                .fold(0f32, f32::max)
        };
        // the random net alone is not symmetric, so the test can tell
        assert!(asymmetry(false) > 1e-3, "{}", asymmetry(false));
        assert!(asymmetry(true) < 1e-5, "{}", asymmetry(true));
    }

    #[test]
    fn regions_become_circles_of_their_area() {
        let (w, h) = (40, 30);
        let mut map = vec![0f32; w * h];
        for y in 0..h {
            for x in 0..w {
                if ((x as f64 - 10.0).powi(2) + (y as f64 - 12.0).powi(2)).sqrt() <= 6.0 {
                    map[y * w + x] = 0.9;
                }
                if (30..34).contains(&x) && (2..6).contains(&y) {
                    map[y * w + x] = 0.7;
                }
            }
        }
        let mut c = circles(&map, w, h, 0.5);
        assert_eq!(c.len(), 2);
        c.sort_by(|a, b| a.x.total_cmp(&b.x));
        assert!(
            (c[0].x - 10.0).abs() < 1e-9 && (c[0].y - 12.0).abs() < 1e-9,
            "{c:?}"
        );
        assert!((c[0].diameter - 12.0).abs() < 0.6, "{c:?}");
        assert!((c[1].diameter - 2.0 * (16f64 / std::f64::consts::PI).sqrt()).abs() < 1e-9);
        assert!((c[1].score - 0.7).abs() < 1e-6 && (c[1].top, c[1].bottom) == (2, 5));
    }

    #[test]
    fn merging_keeps_the_best_of_each_crater_and_separate_craters_apart() {
        let d = |x, y, diameter, score| Detection {
            x,
            y,
            diameter,
            score,
            scale: 1.0,
        };
        let kept = merge(vec![
            d(100.0, 100.0, 20.0, 0.6),
            d(103.0, 98.0, 26.0, 0.8),
            // the crater with its halo, a level or two on: 2.3 times as wide, concentric
            d(100.0, 100.0, 60.0, 0.7),
            // a crater that large around it is another crater
            d(101.0, 100.0, 90.0, 0.65),
            d(140.0, 100.0, 20.0, 0.9),
        ]);
        assert_eq!(kept.len(), 3, "{kept:?}");
        assert!(
            kept.iter().any(|k| k.diameter == 26.0)
                && kept.iter().any(|k| k.diameter == 90.0)
                && !kept.iter().any(|k| k.diameter == 60.0)
                && !kept.iter().any(|k| k.diameter == 20.0 && k.x == 100.0)
        );
        // a crater 2.5 times as wide but off the centre of another is another crater
        let kept = merge(vec![d(100.0, 100.0, 20.0, 0.8), d(120.0, 100.0, 50.0, 0.7)]);
        assert_eq!(kept.len(), 2, "{kept:?}");
        // the wider circle of higher likelihood stands, the narrower merged into it
        let kept = merge(vec![d(100.0, 100.0, 20.0, 0.5), d(100.0, 100.0, 50.0, 0.8)]);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].diameter, 50.0);
    }

    #[test]
    fn readings_are_scaled_before_the_sizes_reported_are_kept_and_merged() {
        let d = |x, diameter, score| Detection {
            x,
            y: 50.0,
            diameter,
            score,
            scale: 1.0,
        };
        let readings = Readings {
            found: vec![
                d(20.0, 9.0, 0.5),
                d(60.0, 30.0, 0.7),
                // 20 px from the 30 px reading: apart at its own size (over half of 30 px),
                // merged into it once both are read 1.6 times as wide
                d(80.0, 30.0, 0.6),
                d(150.0, 95.0, 0.8),
            ],
            sizes: (8.0, 100.0),
        };
        let at = |full_size| DiameterScales {
            full_size,
            per_octave: 1.0,
        };
        let as_read = readings.craters(DiameterScales::AS_READ);
        assert_eq!(
            as_read.iter().map(|c| c.diameter).collect::<Vec<_>>(),
            vec![9.0, 30.0, 30.0, 95.0]
        );
        // x 0.85: the 9 px reading falls under the smallest reported
        let shrunk = readings.craters(at(0.85));
        assert_eq!(
            shrunk.iter().map(|c| c.diameter).collect::<Vec<_>>(),
            vec![30.0 * 0.85, 30.0 * 0.85, 95.0 * 0.85]
        );
        // x 1.6: the 95 px reading grows past the largest, and the two 30 px ones are one
        let grown = readings.craters(at(1.6));
        assert_eq!(grown.len(), 2, "{grown:?}");
        assert_eq!((grown[0].x, grown[0].diameter), (20.0, 9.0 * 1.6));
        assert_eq!((grown[1].x, grown[1].diameter), (60.0, 48.0));
        // x 0.9 an octave down: a reading of the level at 0.25 (two octaves) x 0.81, two
        // levels half an octave apart 0.9^0.5 apart
        let down = DiameterScales {
            full_size: 1.0,
            per_octave: 0.9,
        };
        assert!((down.at(0.25) - 0.81).abs() < 1e-12 && down.at(1.0) == 1.0);
        assert!((down.at(0.5f64.sqrt()) - 0.9f64.sqrt()).abs() < 1e-12);
        let coarse = Readings {
            found: vec![Detection {
                scale: 0.25,
                ..readings.found[3].clone()
            }],
            sizes: (8.0, 100.0),
        };
        assert!((coarse.craters(down)[0].diameter - 95.0 * 0.81).abs() < 1e-9);
    }

    #[test]
    fn the_pyramid_halves_until_craters_would_be_too_large() {
        let o = DetectOptions {
            levels_per_octave: 1,
            ..Default::default()
        };
        // levels report 7-14 px of their own: a 100 px image has room for one halving
        assert_eq!(o.scales(40), vec![1.0]);
        assert_eq!(o.scales(100), vec![1.0, 0.5]);
        assert_eq!(o.scales(800), vec![1.0, 0.5, 0.25, 0.125, 0.0625]);
        // two levels an octave: the same halvings and a level between each two
        let half = DetectOptions::default().scales(800);
        assert_eq!(half.len(), 10, "{half:?}");
        for (k, s) in half.iter().enumerate() {
            assert_eq!(*s, 0.5f64.powf(k as f64 / 2.0), "{half:?}");
        }
        assert_eq!(DetectOptions::default().scales(36), vec![1.0]);
        // 16-bit data is stretched onto 8 bits, level 0 kept for no data (non-finite)
        let mut v: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        v[500] = f32::NAN;
        let s = stretch(&v);
        assert_eq!((s[0], s[1], s[500], s[999]), (1, 1, 0, 255));
    }
}
