//! Image decoding and normalisation into the model's input tensor.
//!
//! JPEG, PNG, TIFF and PNM, 8- or 16-bit, grayscale or RGB (alpha is dropped). Values are
//! scaled to [0, 1] by the full range of the sample type (x / 255 or x / 65535); grayscale
//! is replicated to three channels. The image is resized to `size x size` with a bicubic
//! (Catmull-Rom) filter — squashed by default, or scaled on its short side and centre-cropped
//! — then normalised per channel with the model's mean and std (ImageNet unless the model
//! config says otherwise). The tensor is CHW, f32.

use crate::error::{Error, Result};
use craterdex_errors::{ensure, parse_named, Invalid, IoContext, ResultExt};
use image::{imageops::FilterType, DynamicImage, Rgb32FImage};
use std::path::Path;
use strum::IntoEnumIterator;

/// How an image is brought to the model's square input: `squash` or `center-crop`.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Default,
    strum::Display,
    strum::EnumIter,
    strum::VariantNames,
    strum::IntoStaticStr,
    serde_with::SerializeDisplay,
    serde_with::DeserializeFromStr,
)]
#[strum(serialize_all = "kebab-case")]
pub enum ResizeMode {
    /// Resize both sides to the input size, ignoring the aspect ratio.
    #[default]
    Squash,
    /// Resize the short side to the input size, then cut the central square.
    CenterCrop,
}

impl std::str::FromStr for ResizeMode {
    type Err = Invalid;
    fn from_str(s: &str) -> std::result::Result<Self, Invalid> {
        let aliases = [("centre-crop", Self::CenterCrop)];
        parse_named("resize mode", s, Self::iter(), &aliases)
    }
}

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Preprocess {
    pub size: usize,
    pub mean: [f32; 3],
    pub std: [f32; 3],
    pub resize: ResizeMode,
    #[serde(default)]
    pub orientation: Orientation,
    #[serde(default)]
    pub brightness: Brightness,
    /// Multi-scale: further input sizes each image is also seen at (the model must run at
    /// them: [`crate::Vit::with_extra_sizes`]).
    #[serde(default)]
    pub extra_sizes: Vec<usize>,
}

impl Preprocess {
    /// A stable description for cache keys (unchanged for [`Orientation::AsIs`] and
    /// [`Brightness::AsIs`], so caches written before either existed stay valid).
    pub fn key(&self) -> String {
        let mut key = format!(
            "{}-{:?}-{:?}-{:?}",
            self.size, self.mean, self.std, self.resize
        );
        if self.orientation != Orientation::AsIs {
            key = format!("{key}-{}", self.orientation.name());
        }
        if self.brightness != Brightness::AsIs {
            key = format!("{key}-{}", self.brightness.name());
        }
        if !self.extra_sizes.is_empty() {
            key = format!("{key}-also{:?}", self.extra_sizes);
        }
        key
    }

    /// This preparation at each of its input sizes, its own first, each without extra sizes.
    pub fn at_each_size(&self) -> Vec<Preprocess> {
        std::iter::once(self.size)
            .chain(self.extra_sizes.iter().copied())
            .map(|size| Preprocess {
                size,
                extra_sizes: Vec::new(),
                ..self.clone()
            })
            .collect()
    }
}

/// How a crop's brightness is set before the model sees it: `as-is` or `standardised`.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Default,
    strum::Display,
    strum::EnumIter,
    strum::VariantNames,
    strum::IntoStaticStr,
    serde_with::SerializeDisplay,
    serde_with::DeserializeFromStr,
)]
#[strum(serialize_all = "kebab-case")]
pub enum Brightness {
    /// As stored (what a [`Preprocess`] written before brightness options existed means).
    #[default]
    AsIs,
    /// Shifted and scaled so that the crop's mean is mid grey and its standard deviation
    /// [`STANDARD_SPREAD`] ([`standardise`]): the exposure of an observation, and to first
    /// order the elevation of its sun (under Lambertian light a slope's brightness departs
    /// from flat ground's in proportion to the cotangent of the sun's elevation), no longer
    /// change what the model sees.
    Standardised,
}

impl Brightness {
    pub fn name(self) -> &'static str {
        self.into()
    }
}

impl std::str::FromStr for Brightness {
    type Err = Invalid;
    fn from_str(s: &str) -> std::result::Result<Self, Invalid> {
        parse_named("brightness", s, Self::iter(), &[])
    }
}

/// The standard deviation of a [`Brightness::Standardised`] crop's brightness (0 to 1): the
/// spread chosen on the Mars and NAC benchmarks (docs/results.md, "Another sun, another
/// exposure").
pub const STANDARD_SPREAD: f32 = 32.0 / 255.0;

/// The most a crop's contrast is raised by [`standardise`]: a nearly flat crop keeps its
/// noise near its own level instead of being stretched to the full spread.
const MAX_GAIN: f32 = 8.0;

/// `img` with its brightness standardised ([`Brightness::Standardised`]): every channel
/// shifted by the mean brightness (the channels' mean over all pixels) to mid grey and
/// scaled by [`STANDARD_SPREAD`] over its standard deviation (at most `MAX_GAIN`, 8), then
/// clamped to 0..1. A flat image comes out mid grey.
pub fn standardise(img: &Rgb32FImage) -> Rgb32FImage {
    let values = img.as_raw();
    if values.is_empty() {
        return img.clone();
    }
    let n = values.len() as f64;
    let mean = values.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = values
        .iter()
        .map(|&v| (v as f64 - mean).powi(2))
        .sum::<f64>()
        / n;
    let gain = (STANDARD_SPREAD as f64 / var.sqrt().max(f64::MIN_POSITIVE)).min(MAX_GAIN as f64);
    let out: Vec<f32> = values
        .iter()
        .map(|&v| (0.5 + gain * (v as f64 - mean)).clamp(0.0, 1.0) as f32)
        .collect();
    Rgb32FImage::from_raw(img.width(), img.height(), out).expect("the same dimensions")
}

/// How a crop is turned before the model sees it: `as-is`, `shading` or `shading-spread`.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Default,
    strum::Display,
    strum::EnumIter,
    strum::VariantNames,
    strum::IntoStaticStr,
    serde_with::SerializeDisplay,
    serde_with::DeserializeFromStr,
)]
#[strum(serialize_all = "kebab-case")]
pub enum Orientation {
    /// As stored: one view.
    #[default]
    AsIs,
    /// Turned so that the crater's shading dipole ([`shading_angle`]) points along +x, then
    /// seen twice, as turned and mirrored top to bottom. A crater turned by any angle or
    /// mirrored gives the same pair of views (up to interpolation), so its tokens do not
    /// depend on the orbit's heading; the price is what a crater's own chirality told.
    Shading,
    /// [`Orientation::Shading`] at three angles: the dipole's and [`SHADING_SPREAD`] either
    /// side of it, each also mirrored (six views), for crops whose dipole disagrees with their
    /// gallery views' by up to about that much.
    ShadingSpread,
}

/// The angle either side of the dipole that [`Orientation::ShadingSpread`] also looks at.
pub const SHADING_SPREAD: f32 = 20.0 * std::f32::consts::PI / 180.0;

impl Orientation {
    pub fn name(self) -> &'static str {
        self.into()
    }
    /// The angles off the crater's shading dipole at which the crop is turned (each seen
    /// also mirrored); none for a crop seen as stored.
    fn turns(self) -> &'static [f32] {
        match self {
            Self::AsIs => &[],
            Self::Shading => &[0.0],
            Self::ShadingSpread => &[-SHADING_SPREAD, 0.0, SHADING_SPREAD],
        }
    }
    /// How many views of each image the model sees; their tokens are concatenated.
    pub fn views(self) -> usize {
        match self.turns().len() {
            0 => 1,
            turns => 2 * turns,
        }
    }
}

impl std::str::FromStr for Orientation {
    type Err = Invalid;
    fn from_str(s: &str) -> std::result::Result<Self, Invalid> {
        parse_named("orientation", s, Self::iter(), &[])
    }
}

/// Reads and decodes an image file, refusing truncated or corrupt data (see [`decode_image`]).
pub fn load_image(path: &Path) -> Result<DynamicImage> {
    let bytes = std::fs::read(path).io("read", path)?;
    decode_image(&bytes).with_context(|| format!("{} is not a usable image", path.display()))
}

/// Decodes an image, refusing data the decoders would only partly read: JPEGs are first
/// checked by zune-jpeg in strict mode (the image crate's own JPEG decoding fills a truncated
/// file's missing rows and says nothing); PNG (checksummed), TIFF and PNM report truncation
/// themselves. Raw TIFF or PNM pixels carry no checksum, so a flipped byte there goes unseen.
pub fn decode_image(bytes: &[u8]) -> Result<DynamicImage> {
    decode_image_with(bytes, false)
}

/// [`decode_image`], or with `allow_partial` whatever the decoders can make of the data.
/// Images over [`MAX_CROP_PIXELS`] are refused from their header, before any decoding.
pub fn decode_image_with(bytes: &[u8], allow_partial: bool) -> Result<DynamicImage> {
    let limits = DecodeLimits {
        allow_partial,
        ..DecodeLimits::crop()
    };
    Ok(decode(bytes, &limits)?.image)
}

/// What [`decode`] accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Most pixels (`None`: any number; still not empty and at most 64:1).
    pub max_pixels: Option<u64>,
    /// Longest side in pixels.
    pub max_side: Option<u32>,
    /// Use what can be decoded of truncated or corrupt data.
    pub allow_partial: bool,
}

impl DecodeLimits {
    /// A crater crop: at most [`MAX_CROP_PIXELS`].
    pub fn crop() -> Self {
        Self {
            max_pixels: Some(MAX_CROP_PIXELS),
            max_side: None,
            allow_partial: false,
        }
    }
}

/// A decoded image and the format it came in.
pub struct Decoded {
    pub image: DynamicImage,
    pub format: image::ImageFormat,
}

/// The one way craterdex decodes outside bytes (files, uploads): the format sniffed from
/// the data, the size read from the header and checked before any pixel is decoded (a few
/// bytes can claim an image of any size; found by the `image` fuzz target), data the
/// decoders would only partly read refused unless allowed ([`check_complete`]), and the
/// decoder itself held to the same limits.
pub fn decode(bytes: &[u8], limits: &DecodeLimits) -> Result<Decoded> {
    let reader = image::ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| Error::NotAnImage(format!("not a readable image: {e}")))?;
    let Some(format) = reader.format() else {
        return Err(Error::NotAnImage(
            "not an image: JPEG, PNG, TIFF or PNM expected".into(),
        ));
    };
    let unreadable =
        |e: image::ImageError| Error::Invalid(format!("cannot read the {format:?} image: {e}"));
    let (w, h) = reader.into_dimensions().map_err(unreadable)?;
    if let Some(max) = limits.max_side {
        ensure!(
            w <= max && h <= max,
            Error::TooLarge(format!(
                "the image is {w}x{h} pixels; at most {max} per side is accepted"
            ))
        );
    }
    match limits.max_pixels {
        Some(max) => check_crop_size(w, h, max)?,
        None => check_shape(w, h)?,
    }
    if !limits.allow_partial {
        check_complete(bytes)?;
    }
    let mut reader = image::ImageReader::with_format(std::io::Cursor::new(bytes), format);
    let mut decoder_limits = image::Limits::default();
    decoder_limits.max_image_width = limits.max_side;
    decoder_limits.max_image_height = limits.max_side;
    // a crop's pixels at the widest sample type the decoders produce (RGBA, 16 bits), and
    // not the decoder's default of 512 MiB
    if let Some(max) = limits.max_pixels {
        decoder_limits.max_alloc = Some(max.saturating_mul(MAX_BYTES_PER_PIXEL));
    }
    reader.limits(decoder_limits);
    let image = reader.decode().map_err(unreadable)?;
    // the decoder's own idea of the size must pass too
    check_shape(image.width(), image.height())?;
    Ok(Decoded { image, format })
}

/// `img` brought down to what a search of it reads: its shorter side at most `short_side`
/// (aspect kept, so that turning it and squashing it later see the same picture), and once
/// reduced, 8 bits per channel without alpha. An image within the limit is returned as it
/// is, so its features are those any other path computes.
pub fn reduced(img: DynamicImage, short_side: u32) -> DynamicImage {
    let (w, h) = (img.width(), img.height());
    let short = w.min(h);
    if short <= short_side || short == 0 {
        return img;
    }
    let scale = short_side as f64 / short as f64;
    let (nw, nh) = (
        ((w as f64 * scale).round() as u32).max(1),
        ((h as f64 * scale).round() as u32).max(1),
    );
    let small = img.resize_exact(nw, nh, image::imageops::FilterType::Triangle);
    if small.color().has_color() {
        DynamicImage::ImageRgb8(small.to_rgb8())
    } else {
        DynamicImage::ImageLuma8(small.to_luma8())
    }
}

/// Bytes a decoded pixel takes at most: four channels of 16 bits.
const MAX_BYTES_PER_PIXEL: u64 = 8;

/// The most pixels a crater crop may have (32 megapixels, e.g. 5,792 x 5,792): more is not
/// a crop but a tile, and a few header bytes claiming a 127-megapixel JPEG would otherwise
/// make the decoder fill that many pixels (found by the `image` fuzz target).
pub const MAX_CROP_PIXELS: u64 = 1 << 25;

/// A whole tile (bench-build), any size: refused only when truncated or corrupt.
pub fn load_tile(path: &Path) -> Result<DynamicImage> {
    let bytes = std::fs::read(path).io("read", path)?;
    let limits = DecodeLimits {
        max_pixels: None,
        ..DecodeLimits::crop()
    };
    Ok(decode(&bytes, &limits)
        .with_context(|| format!("{} is not a usable image", path.display()))?
        .image)
}

/// Fails unless a `w` x `h` image can be a crater crop: not empty, at most 64:1, at most
/// `max` pixels (for images handed over decoded, as from Python, as for files).
pub fn check_crop_size(w: u32, h: u32, max: u64) -> Result<()> {
    check_shape(w, h)?;
    ensure!(
        w as u64 * h as u64 <= max,
        Error::TooLarge(format!(
            "a {w}x{h} image is larger than a crater crop can be ({max} pixels); cut tiles \
             into crater crops first"
        ))
    );
    Ok(())
}

fn check_shape(w: u32, h: u32) -> Result<()> {
    ensure!(
        w > 0 && h > 0 && w.max(h) <= MAX_ASPECT * w.min(h),
        Error::Invalid(format!(
            "a {w}x{h} image: no crater crop is empty or more than {MAX_ASPECT} times as long as it is wide"
        ))
    );
    Ok(())
}

/// The most elongated image the loader accepts, and the most of one that preprocessing reads:
/// a centre crop never needs more, and a 1-pixel-high strip would otherwise be resized to
/// hundreds of times the model's input.
pub const MAX_ASPECT: u32 = 64;

/// Fails on a JPEG that strict decoding finds truncated or corrupt; other formats pass (their
/// decoders report such data themselves). Strict decoding alone takes any marker inside the
/// scan data (an end-of-image appended to half a file) for the end of the data and fills the
/// blocks it did not reach: so the image is decoded once more with filler bytes before the
/// marker that ends each scan's data. Data that holds every block never reads them, and
/// decodes to the same pixels; data that ends early decodes the filler instead.
pub fn check_complete(bytes: &[u8]) -> Result<()> {
    if image::guess_format(bytes).ok() != Some(image::ImageFormat::Jpeg) {
        return Ok(());
    }
    let truncated = |e: String| Error::Truncated(format!("truncated or corrupt JPEG ({e})"));
    let strict = |data: &[u8]| {
        let opts = zune_core::options::DecoderOptions::default().set_strict_mode(true);
        zune_jpeg::JpegDecoder::new_with_options(zune_core::bytestream::ZCursor::new(data), opts)
            .decode()
            .map_err(|e| truncated(format!("{e:?}")))
    };
    let pixels = strict(bytes)?;
    if let Some(filled) = with_filler_before_scan_ends(bytes) {
        ensure!(
            strict(&filled).is_ok_and(|p| p == pixels),
            truncated("its scan data ends before its last block".into())
        );
    }
    Ok(())
}

/// What [`with_filler_before_scan_ends`] puts before each scan's end: no 0xFF (which would
/// start a marker), and more than a decoder reads ahead.
const SCAN_FILLER: [u8; 64] = [0xA5; 64];

/// Whether `marker`, ending a scan of a progressive JPEG, can only end it early: the end of
/// the image, a comment, an application segment, or a restart where the image declared no
/// restart interval. Between a progressive image's scans come tables and the next scan's
/// header, before which zune-jpeg reads filler into the scan it ends (seen on Pillow's
/// progressive files), so filler is not put there; a scan cut short right before one of
/// those is not caught.
fn ends_progressive_scan_early(marker: u8, restart_interval: bool) -> bool {
    let restart = (0xD0..=0xD7).contains(&marker);
    marker == 0xD9
        || marker == 0xFE
        || (0xE0..=0xEF).contains(&marker)
        || (restart && !restart_interval)
}

/// `bytes` with [`SCAN_FILLER`] before every marker that ends the entropy-coded data of a
/// scan (restart markers included; in a progressive image, before those that
/// [`ends_progressive_scan_early`]), or `None` where the markers cannot be followed.
fn with_filler_before_scan_ends(bytes: &[u8]) -> Option<Vec<u8>> {
    const EOI: u8 = 0xD9;
    const SOS: u8 = 0xDA;
    const DRI: u8 = 0xDD;
    let is_restart = |m: u8| (0xD0..=0xD7).contains(&m);
    let mut out = Vec::with_capacity(bytes.len() + 4 * SCAN_FILLER.len());
    let mut copied = 0; // bytes[..copied] are in `out`
    let (mut progressive, mut restart_interval) = (false, false);
    let mut i = 2; // past the start-of-image marker
    loop {
        // a marker segment: 0xFF (and fill bytes), the marker, and unless it stands alone
        // its length
        (*bytes.get(i)? == 0xFF).then_some(())?;
        while *bytes.get(i)? == 0xFF {
            i += 1;
        }
        let marker = bytes[i];
        i += 1;
        if marker == EOI {
            out.extend_from_slice(&bytes[copied..]);
            return Some(out);
        }
        if is_restart(marker) || marker == 0x01 {
            continue;
        }
        progressive |= matches!(marker, 0xC2 | 0xC6 | 0xCA | 0xCE);
        let length = u16::from_be_bytes([*bytes.get(i)?, *bytes.get(i + 1)?]) as usize;
        if marker == DRI {
            restart_interval = u16::from_be_bytes([*bytes.get(i + 2)?, *bytes.get(i + 3)?]) > 0;
        }
        i = i.checked_add(length)?;
        if marker != SOS {
            continue;
        }
        // the scan's data runs to the next marker that is not a stuffed 0xFF
        loop {
            let at = i + bytes.get(i..)?.iter().position(|&b| b == 0xFF)?;
            let mut next = at + 1;
            while *bytes.get(next)? == 0xFF {
                next += 1;
            }
            if bytes[next] == 0x00 {
                i = next + 1;
                continue;
            }
            if !progressive || ends_progressive_scan_early(bytes[next], restart_interval) {
                out.extend_from_slice(&bytes[copied..at]);
                out.extend_from_slice(&SCAN_FILLER);
                copied = at;
            }
            i = at;
            if !is_restart(bytes[next]) {
                break;
            }
            i = next + 1;
        }
    }
}

/// The normalised `[3, size, size]` CHW tensor of an image, as stored (the orientation is
/// not applied: [`to_tensors`] gives every view the model sees).
/// An empty image gives the tensor of a black one.
pub fn to_tensor(img: &DynamicImage, p: &Preprocess) -> Vec<f32> {
    normalise(&resized(&readable_region(img, p), p), p)
}

/// The tensors of every view of an image that `p.orientation` asks for
/// ([`Orientation::views`] of them, in order).
pub fn to_tensors(img: &DynamicImage, p: &Preprocess) -> Vec<Vec<f32>> {
    views_of(&readable_region(img, p), p)
}

fn views_of(region: &Rgb32FImage, p: &Preprocess) -> Vec<Vec<f32>> {
    let square = resized(region, p);
    let turns = p.orientation.turns();
    if turns.is_empty() {
        return vec![normalise(&square, p)];
    }
    let angle = shading_angle(&square);
    turns
        .iter()
        .flat_map(|spread| {
            let turned = turn(&square, -(angle + spread));
            let mirrored = image::imageops::flip_vertical(&turned);
            [normalise(&turned, p), normalise(&mirrored, p)]
        })
        .collect()
}

/// The tensors of an image at each input size of `p` ([`Preprocess::at_each_size`]), each
/// size's views as [`to_tensors`] gives them.
pub fn to_tensors_at_each_size(img: &DynamicImage, p: &Preprocess) -> Vec<Vec<Vec<f32>>> {
    // One conversion for every size: on a large crop it costs as much as a resize.
    let region = readable_region(img, p);
    p.at_each_size()
        .iter()
        .map(|at| views_of(&region, at))
        .collect()
}

/// The image at the model's input size, squashed or centre-cropped, its brightness set as
/// `p.brightness` says.
fn resized(region: &Rgb32FImage, p: &Preprocess) -> Rgb32FImage {
    let square = resized_as_stored(region, p);
    match p.brightness {
        Brightness::AsIs => square,
        Brightness::Standardised => standardise(&square),
    }
}

/// The part of an image that preprocessing reads, in floating point: all of it, or for a
/// centre crop at most [`MAX_ASPECT`] squares of the long side around the middle (more only
/// costs memory). An empty image reads as black. Cut before the conversion, and converted
/// once per image, because on a crop of tens of megapixels each full-size copy costs as much
/// as the resize (found by the `image` fuzz target).
fn readable_region(img: &DynamicImage, p: &Preprocess) -> Rgb32FImage {
    let (w, h) = (img.width(), img.height());
    if w == 0 || h == 0 {
        return Rgb32FImage::new(p.size as u32, p.size as u32);
    }
    match p.resize {
        ResizeMode::Squash => img.to_rgb32f(),
        ResizeMode::CenterCrop => {
            let (cw, ch) = (w.min(MAX_ASPECT * h), h.min(MAX_ASPECT * w));
            if (cw, ch) == (w, h) {
                img.to_rgb32f()
            } else {
                img.crop_imm((w - cw) / 2, (h - ch) / 2, cw, ch).to_rgb32f()
            }
        }
    }
}

/// The image at the model's input size, squashed or centre-cropped.
fn resized_as_stored(region: &Rgb32FImage, p: &Preprocess) -> Rgb32FImage {
    let s = p.size as u32;
    match p.resize {
        ResizeMode::Squash => resize(region, s, s),
        ResizeMode::CenterCrop => {
            let (w, h) = region.dimensions();
            let scale = s as f32 / w.min(h) as f32;
            let (nw, nh) = (
                ((w as f32 * scale).round() as u32).max(s),
                ((h as f32 * scale).round() as u32).max(s),
            );
            let full = resize(region, nw, nh);
            image::imageops::crop_imm(&full, (nw - s) / 2, (nh - s) / 2, s, s).to_image()
        }
    }
}

fn normalise(img: &Rgb32FImage, p: &Preprocess) -> Vec<f32> {
    let n = (img.width() * img.height()) as usize;
    let mut out = vec![0f32; 3 * n];
    for (i, px) in img.pixels().enumerate() {
        for c in 0..3 {
            out[c * n + i] = (px[c] - p.mean[c]) / p.std[c];
        }
    }
    out
}

/// Width of the centre weighting of [`shading_angle`], in half-widths of the crop. A
/// catalogue crop holds its crater at the centre at 2-3x context (radius 0.33-0.5): this
/// weights the crater's own walls, whose lit and shadowed halves make the dipole, over the
/// terrain around it (on the Mars benchmark it agreed best between a query and its gallery
/// views of other context: within 10 degrees for 75% of the pairs, 20 degrees for 90%).
const SHADING_SIGMA: f32 = 0.16;

/// The direction (radians, image axes: x right, y down) of the brightness dipole at the
/// crop's centre: the Gaussian-weighted first moment of brightness about its weighted mean.
/// Sunlight makes it point from a crater's shadowed wall to its lit wall. Turning the image
/// turns it by the same angle and mirroring mirrors it, which is what makes
/// [`Orientation::Shading`] invariant.
pub fn shading_angle(img: &Rgb32FImage) -> f32 {
    let (w, h) = img.dimensions();
    let half = w.min(h) as f32 / 2.0;
    let (cx, cy) = ((w as f32 - 1.0) / 2.0, (h as f32 - 1.0) / 2.0);
    let weight = |x: u32, y: u32| {
        let (dx, dy) = ((x as f32 - cx) / half, (y as f32 - cy) / half);
        (
            dx,
            dy,
            (-(dx * dx + dy * dy) / (SHADING_SIGMA * SHADING_SIGMA)).exp(),
        )
    };
    let luma = |px: &image::Rgb<f32>| (px[0] + px[1] + px[2]) / 3.0;
    let (mut sum_w, mut sum_wv) = (0f64, 0f64);
    for (x, y, px) in img.enumerate_pixels() {
        let (_, _, wt) = weight(x, y);
        sum_w += wt as f64;
        sum_wv += (wt * luma(px)) as f64;
    }
    let mean = (sum_wv / sum_w.max(f64::MIN_POSITIVE)) as f32;
    let (mut mx, mut my) = (0f64, 0f64);
    for (x, y, px) in img.enumerate_pixels() {
        let (dx, dy, wt) = weight(x, y);
        let v = wt * (luma(px) - mean);
        mx += (v * dx) as f64;
        my += (v * dy) as f64;
    }
    my.atan2(mx) as f32
}

/// `img` turned by `angle` radians about its centre (bilinear; what falls outside is read
/// from the image mirrored at its edges, so no blank corner appears). Turning by the
/// negative of [`shading_angle`] leaves the dipole along +x.
pub fn turn(img: &Rgb32FImage, angle: f32) -> Rgb32FImage {
    let (w, h) = img.dimensions();
    let (cx, cy) = ((w as f32 - 1.0) / 2.0, (h as f32 - 1.0) / 2.0);
    let (sin, cos) = (-angle).sin_cos();
    let reflect = |v: f32, n: u32| -> f32 {
        let max = (n - 1) as f32;
        if max <= 0.0 {
            return 0.0;
        }
        let period = 2.0 * max;
        let m = v.rem_euclid(period);
        if m > max {
            period - m
        } else {
            m
        }
    };
    Rgb32FImage::from_fn(w, h, |x, y| {
        // the output pixel shows the input at the place the turn brings to it
        let (dx, dy) = (x as f32 - cx, y as f32 - cy);
        let sx = reflect(cx + cos * dx - sin * dy, w);
        let sy = reflect(cy + sin * dx + cos * dy, h);
        let (x0, y0) = (sx.floor() as u32, sy.floor() as u32);
        let (x1, y1) = ((x0 + 1).min(w - 1), (y0 + 1).min(h - 1));
        let (fx, fy) = (sx - x0 as f32, sy - y0 as f32);
        let mut px = [0f32; 3];
        for (c, v) in px.iter_mut().enumerate() {
            let top = img.get_pixel(x0, y0)[c] * (1.0 - fx) + img.get_pixel(x1, y0)[c] * fx;
            let bottom = img.get_pixel(x0, y1)[c] * (1.0 - fx) + img.get_pixel(x1, y1)[c] * fx;
            *v = top * (1.0 - fy) + bottom * fy;
        }
        image::Rgb(px)
    })
}

fn resize(img: &Rgb32FImage, w: u32, h: u32) -> Rgb32FImage {
    if img.dimensions() == (w, h) {
        return img.clone();
    }
    image::imageops::resize(img, w, h, FilterType::CatmullRom)
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{GrayImage, ImageBuffer, Luma, Rgb, Rgba};

    fn prep(size: usize, resize: ResizeMode) -> Preprocess {
        Preprocess {
            size,
            mean: [0.5, 0.5, 0.5],
            std: [0.5, 0.5, 0.5],
            resize,
            orientation: Orientation::AsIs,
            brightness: Brightness::AsIs,
            extra_sizes: Vec::new(),
        }
    }

    #[test]
    fn truncated_jpegs_are_refused_unless_partial_images_are_allowed() {
        let img = image::RgbImage::from_fn(120, 90, |x, y| Rgb([(x * 2) as u8, (y * 3) as u8, 7]));
        let mut buf = std::io::Cursor::new(Vec::new());
        DynamicImage::ImageRgb8(img)
            .write_to(&mut buf, image::ImageFormat::Jpeg)
            .unwrap();
        let jpeg = buf.into_inner();
        decode_image(&jpeg).unwrap();
        let cut = &jpeg[..jpeg.len() * 2 / 3];
        // the image crate alone decodes the cut file without a word
        assert!(image::load_from_memory(cut).is_ok());
        let e = format!("{:#}", decode_image(cut).unwrap_err());
        assert!(e.contains("truncated or corrupt JPEG"), "{e}");
        assert_eq!(decode_image_with(cut, true).unwrap().width(), 120);
    }

    /// Half a JPEG with markers after it (an end of image, a restart, a comment, another
    /// image) decodes without a word in strict mode too: its scan data still ends before its
    /// last block, and it is refused whatever follows. Complete files pass: baseline, with
    /// restart markers, progressive (fixtures written by Pillow 13).
    #[test]
    fn a_cut_jpeg_is_refused_whatever_markers_follow() {
        let img = image::RgbImage::from_fn(120, 90, |x, y| {
            Rgb([(x * 2) as u8, (y * 3) as u8, ((x * y) % 251) as u8])
        });
        let mut buf = std::io::Cursor::new(Vec::new());
        DynamicImage::ImageRgb8(img)
            .write_to(&mut buf, image::ImageFormat::Jpeg)
            .unwrap();
        let fixture = |name: &str| {
            std::fs::read(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/fixtures")
                    .join(name),
            )
            .unwrap()
        };
        let tails: [&[u8]; 5] = [
            &[0xFF, 0xD9],
            &[0xFF, 0xD9, 0xFF, 0xD9],
            &[0xFF, 0xD0, 0xFF, 0xD9],
            &[0xFF, 0xFE, 0, 2, 0xFF, 0xD9],
            &[0xFF, 0xD9, 0xFF, 0xD8, 0xFF, 0xD9],
        ];
        for (name, jpeg) in [
            ("baseline", buf.into_inner()),
            ("restart markers", fixture("restart_markers.jpg")),
            ("progressive", fixture("progressive_gray.jpg")),
        ] {
            decode_image(&jpeg).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            for keep in [jpeg.len() / 3, jpeg.len() / 2, jpeg.len() * 4 / 5] {
                for tail in tails {
                    let mut cut = jpeg[..keep].to_vec();
                    cut.extend_from_slice(tail);
                    // the image crate, and strict decoding alone, read these as whole images
                    assert!(image::load_from_memory(&cut).is_ok(), "{name}");
                    let e = format!("{:#}", decode_image(&cut).unwrap_err());
                    assert!(
                        e.contains("truncated or corrupt JPEG"),
                        "{name} {keep} {tail:?}: {e}"
                    );
                    assert!(
                        decode_image_with(&cut, true).is_ok(),
                        "{name}: allowed partial"
                    );
                }
            }
        }
    }

    /// Reduction keeps the aspect and the colour, drops to 8 bits, and leaves an image within
    /// the limit as it was.
    #[test]
    fn large_images_are_reduced_to_the_short_side_and_small_ones_kept() {
        let wide: ImageBuffer<Rgba<u16>, Vec<u16>> =
            ImageBuffer::from_fn(2000, 1000, |x, _| Rgba([(x * 30) as u16, 0, 9, 65_535]));
        let r = reduced(DynamicImage::ImageRgba16(wide), 448);
        assert_eq!((r.width(), r.height()), (896, 448));
        assert!(matches!(r, DynamicImage::ImageRgb8(_)));
        let grey = DynamicImage::ImageLuma16(ImageBuffer::from_pixel(600, 900, Luma([700u16])));
        let r = reduced(grey, 448);
        assert_eq!((r.width(), r.height()), (448, 672));
        assert!(matches!(r, DynamicImage::ImageLuma8(_)));
        let small = DynamicImage::ImageLuma16(ImageBuffer::from_pixel(300, 448, Luma([7u16])));
        assert_eq!(reduced(small.clone(), 448), small);
    }

    #[test]
    fn grayscale_is_replicated_and_normalised() {
        let img = DynamicImage::ImageLuma8(GrayImage::from_pixel(4, 4, Luma([255])));
        let t = to_tensor(&img, &prep(4, ResizeMode::Squash));
        assert_eq!(t.len(), 48);
        assert!(t.iter().all(|&v| (v - 1.0).abs() < 1e-6));
    }

    #[test]
    fn sixteen_bit_uses_full_range() {
        let img: ImageBuffer<Luma<u16>, Vec<u16>> = ImageBuffer::from_pixel(2, 2, Luma([32768]));
        let t = to_tensor(
            &DynamicImage::ImageLuma16(img),
            &prep(2, ResizeMode::Squash),
        );
        assert!(t
            .iter()
            .all(|&v| (v - (32768.0 / 65535.0 - 0.5) / 0.5).abs() < 1e-4));
    }

    #[test]
    fn center_crop_keeps_the_middle() {
        // 6x2 image: left and right thirds black, middle white; a centre crop to 2x2 is white.
        let img = ImageBuffer::from_fn(6, 2, |x, _| {
            if (2..4).contains(&x) {
                Rgb([255u8; 3])
            } else {
                Rgb([0u8; 3])
            }
        });
        let t = to_tensor(
            &DynamicImage::ImageRgb8(img),
            &prep(2, ResizeMode::CenterCrop),
        );
        assert!(t.iter().all(|&v| v > 0.9), "{t:?}");
    }

    #[test]
    fn bad_bytes_give_an_error() {
        assert!(decode_image(b"not an image").is_err());
    }

    /// Found by the `image` fuzz target: a PNM header declaring a 73x0 image decoded, and
    /// the centre crop then scaled it by infinity (a 1.4 TB allocation).
    #[test]
    fn degenerate_images_are_refused_and_never_blow_up_preprocessing() {
        let fuzzed = b"P373\n0\x0c7\n\x0b1\n\x0bP";
        for partial in [false, true] {
            let e = format!("{:#}", decode_image_with(fuzzed, partial).unwrap_err());
            assert!(e.contains("empty"), "{e}");
        }
        let strip = DynamicImage::ImageLuma8(GrayImage::new(6500, 1));
        let mut png = std::io::Cursor::new(Vec::new());
        strip.write_to(&mut png, image::ImageFormat::Png).unwrap();
        let e = format!("{:#}", decode_image(png.get_ref()).unwrap_err());
        assert!(e.contains("6500x1") && e.contains("64 times"), "{e}");
        // Found by the `image` fuzz target: a JPEG header declaring 3860x33023 pixels with
        // almost no data; decoding it (partially) filled 127 megapixels. Refused from the
        // header now, before any decoding, in both modes.
        let huge =
            include_bytes!("../../../fuzz/seeds/image/regression-jpeg-3860x33023-header-timeout");
        for partial in [false, true] {
            let e = format!("{:#}", decode_image_with(huge, partial).unwrap_err());
            assert!(
                e.contains("3860x33023") && e.contains("larger than a crater crop"),
                "{e}"
            );
        }
        // And one declaring 65506x242: within the pixel budget but 270 times as long as
        // wide, refused from the header too rather than after decoding 16 megapixels.
        let long =
            include_bytes!("../../../fuzz/seeds/image/regression-jpeg-65506x242-header-timeout");
        for partial in [false, true] {
            let e = format!("{:#}", decode_image_with(long, partial).unwrap_err());
            assert!(e.contains("65506x242") && e.contains("64 times"), "{e}");
        }
        // Built in code rather than decoded, such images still preprocess in bounded memory.
        for img in [strip, DynamicImage::ImageLuma8(GrayImage::new(0, 5))] {
            for mode in [ResizeMode::CenterCrop, ResizeMode::Squash] {
                assert_eq!(to_tensor(&img, &prep(14, mode)).len(), 3 * 14 * 14);
            }
        }
    }

    #[test]
    fn every_size_is_read_from_one_conversion_with_the_same_result() {
        // 795 bytes of complete JPEG declaring 3584x5120 pixels: within the crop budget, so
        // it decodes; its preprocessing ran past the fuzz target's 10 s limit under ASan
        // while every size converted, cut and copied the whole image again.
        let large = include_bytes!(
            "../../../fuzz/seeds/image/regression-jpeg-3584x5120-preprocessing-timeout"
        );
        let decoded = decode_image_with(large, false).unwrap();
        assert_eq!((decoded.width(), decoded.height()), (3584, 5120));
        let elongated = DynamicImage::ImageRgb8(image::RgbImage::from_fn(700, 9, |x, y| {
            Rgb([(x * 7 + y * 3) as u8, (x * y) as u8, (x ^ y) as u8])
        }));
        let turned = |resize| Preprocess {
            orientation: Orientation::Shading,
            brightness: Brightness::Standardised,
            extra_sizes: vec![21],
            ..prep(28, resize)
        };
        let cases = [
            (&decoded, turned(ResizeMode::CenterCrop)),
            (&elongated, turned(ResizeMode::CenterCrop)),
            (&elongated, turned(ResizeMode::Squash)),
        ];
        for (img, p) in cases {
            let each = to_tensors_at_each_size(img, &p);
            let one_by_one: Vec<_> = p
                .at_each_size()
                .iter()
                .map(|at| to_tensors(img, at))
                .collect();
            assert_eq!(each, one_by_one);
            assert_eq!(each.len(), 2);
            assert_eq!(each[1][0].len(), 3 * 21 * 21);
        }
        // The centre crop reads at most 64 squares of an elongated image: the same tensor
        // as the middle 576 x 9 cut out beforehand.
        let middle = elongated.crop_imm((700 - 576) / 2, 0, 576, 9);
        let p = prep(28, ResizeMode::CenterCrop);
        assert_eq!(to_tensor(&elongated, &p), to_tensor(&middle, &p));
        assert_ne!(
            to_tensor(&elongated, &prep(28, ResizeMode::Squash)),
            to_tensor(&middle, &prep(28, ResizeMode::Squash))
        );
    }

    /// A lit crater off a textured plain: the wall facing the sun (from `sun` radians)
    /// bright, the other dark, and an asymmetric rim notch so mirror images differ.
    fn crater(size: u32, sun: f32) -> DynamicImage {
        let c = (size as f32 - 1.0) / 2.0;
        let r = size as f32 * 0.22;
        DynamicImage::ImageLuma8(GrayImage::from_fn(size, size, |x, y| {
            let (dx, dy) = (x as f32 - c, y as f32 - c);
            let d = (dx * dx + dy * dy).sqrt();
            let mut v = 120.0 + 10.0 * ((x as f32 * 0.7).sin() + (y as f32 * 0.45).cos());
            if d < r {
                // inside the bowl: lit where the wall faces the sun
                v -= 70.0 * (dx * sun.cos() + dy * sun.sin()) / r;
            }
            if (d - r).abs() < 3.0 && dx > 0.0 && dy < -r * 0.5 {
                v += 60.0;
            }
            Luma([v.clamp(0.0, 255.0) as u8])
        }))
    }

    fn shaded(size: usize) -> Preprocess {
        Preprocess {
            orientation: Orientation::Shading,
            ..prep(size, ResizeMode::Squash)
        }
    }

    fn mean_abs_difference(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f32>() / a.len() as f32
    }

    #[test]
    fn the_shading_angle_points_away_from_the_sun_and_turns_with_the_image() {
        let angle_of = |img: &DynamicImage| shading_angle(&img.to_rgb32f());
        let wrap = |a: f32| {
            (a + std::f32::consts::PI).rem_euclid(2.0 * std::f32::consts::PI) - std::f32::consts::PI
        };
        for sun in [0.0f32, 1.0, 2.5, -2.0] {
            // the wall facing the sun is the far one: the dipole points away from the sun
            let a = angle_of(&crater(96, sun));
            assert!(
                wrap(a - (sun + std::f32::consts::PI)).abs() < 0.1,
                "sun {sun}: {a}"
            );
            for turn_by in [0.3f32, -1.2, 2.9] {
                let turned = turn(&crater(96, sun).to_rgb32f(), turn_by);
                let b = shading_angle(&turned);
                assert!(
                    wrap(b - a - turn_by).abs() < 0.05,
                    "sun {sun}, turn {turn_by}: {a} -> {b}"
                );
            }
        }
    }

    #[test]
    fn shading_views_do_not_depend_on_how_the_crop_was_turned_or_mirrored() {
        let p = shaded(64);
        let img = crater(64, 0.7);
        let views = to_tensors(&img, &p);
        assert_eq!(views.len(), 2);
        assert_eq!(p.orientation.views(), 2);
        // the same crater turned by a quarter, by half, and mirrored
        let quarter = to_tensors(&img.rotate90(), &p);
        let half = to_tensors(&img.rotate180(), &p);
        let mirrored = to_tensors(&img.fliph(), &p);
        for (other, same) in [(&quarter, [0, 1]), (&half, [0, 1]), (&mirrored, [1, 0])] {
            for (v, &w) in views.iter().zip(same.iter()) {
                let d = mean_abs_difference(v, &other[w]);
                assert!(d < 0.05, "{d}");
            }
        }
        // as stored, the turned crop is another picture altogether
        let as_is = to_tensor(&img, &p);
        let d = mean_abs_difference(&as_is, &to_tensor(&img.rotate90(), &p));
        assert!(d > 0.1, "{d}");
        // and the mirror view is no copy of the turned one
        assert!(mean_abs_difference(&views[0], &views[1]) > 0.05);
    }

    #[test]
    fn spread_views_do_not_depend_on_how_the_crop_was_turned_or_mirrored() {
        let p = Preprocess {
            orientation: Orientation::ShadingSpread,
            ..prep(64, ResizeMode::Squash)
        };
        let img = crater(64, 0.7);
        let views = to_tensors(&img, &p);
        assert_eq!(views.len(), p.orientation.views());
        // the middle pair is the plain shading pair
        let plain = to_tensors(&img, &shaded(64));
        assert!(mean_abs_difference(&views[2], &plain[0]) < 1e-6);
        assert!(mean_abs_difference(&views[3], &plain[1]) < 1e-6);
        // a mirrored crop gives the same six views: the mirror of the view at -spread is
        // the view at +spread
        let mirrored = to_tensors(&img.fliph(), &p);
        for (i, j) in [(0, 5), (1, 4), (2, 3), (3, 2), (4, 1), (5, 0)] {
            let d = mean_abs_difference(&views[i], &mirrored[j]);
            assert!(d < 0.05, "view {i} vs mirrored {j}: {d}");
        }
        let quarter = to_tensors(&img.rotate90(), &p);
        for (v, w) in views.iter().zip(&quarter) {
            assert!(mean_abs_difference(v, w) < 0.05);
        }
    }

    #[test]
    fn orientation_changes_the_cache_key_only_when_crops_are_turned() {
        let as_is = prep(14, ResizeMode::Squash);
        assert_eq!(as_is.key(), "14-[0.5, 0.5, 0.5]-[0.5, 0.5, 0.5]-Squash");
        assert_ne!(shaded(14).key(), as_is.key());
        let standardised = Preprocess {
            brightness: Brightness::Standardised,
            ..as_is.clone()
        };
        assert_eq!(
            standardised.key(),
            "14-[0.5, 0.5, 0.5]-[0.5, 0.5, 0.5]-Squash-standardised"
        );
    }

    #[test]
    fn extra_sizes_give_tensors_at_each_size_and_their_own_cache_key() {
        let p = Preprocess {
            extra_sizes: vec![28, 21],
            ..shaded(14)
        };
        assert_ne!(p.key(), shaded(14).key());
        let sizes: Vec<usize> = p.at_each_size().iter().map(|a| a.size).collect();
        assert_eq!(sizes, [14, 28, 21]);
        assert!(p.at_each_size().iter().all(|a| a.extra_sizes.is_empty()));
        let tensors = to_tensors_at_each_size(&crater(40, 0.5), &p);
        assert_eq!(tensors.len(), 3);
        for (views, size) in tensors.iter().zip(sizes) {
            assert_eq!(views.len(), 2, "every size sees both shading views");
            assert!(views.iter().all(|v| v.len() == 3 * size * size));
        }
    }

    fn stats(img: &Rgb32FImage) -> (f64, f64) {
        let v = img.as_raw();
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
        (mean, var.sqrt())
    }

    /// What standardising is for: a crop under another exposure (or, to first order, a sun
    /// at another elevation: the same shading, stronger or weaker) looks the same after it.
    #[test]
    fn standardised_crops_do_not_depend_on_exposure() {
        let crop = Rgb32FImage::from_fn(40, 30, |x, y| {
            let v = 0.4 + 0.1 * ((x as f32 * 0.7).sin() + (y as f32 * 0.3).cos());
            Rgb([v, v, v])
        });
        let (mean, std) = stats(&standardise(&crop));
        assert!((mean - 0.5).abs() < 1e-4, "{mean}");
        assert!((std - STANDARD_SPREAD as f64).abs() < 1e-4, "{std}");
        let exposed = Rgb32FImage::from_fn(40, 30, |x, y| {
            let v = crop.get_pixel(x, y)[0];
            let v = 0.15 + 0.6 * v;
            Rgb([v, v, v])
        });
        let (a, b) = (standardise(&crop), standardise(&exposed));
        let most = a
            .as_raw()
            .iter()
            .zip(b.as_raw())
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(most < 1e-5, "{most}");
        assert_ne!(crop, exposed);
        // a flat crop is mid grey; a nearly flat one is stretched by at most MAX_GAIN
        let flat = Rgb32FImage::from_pixel(8, 8, Rgb([0.9, 0.9, 0.9]));
        assert!(standardise(&flat).as_raw().iter().all(|&v| v == 0.5));
        let faint = Rgb32FImage::from_fn(8, 8, |x, _| {
            let v = 0.5 + 0.001 * (x % 2) as f32;
            Rgb([v, v, v])
        });
        let (_, std) = stats(&standardise(&faint));
        assert!((std - 0.0005 * MAX_GAIN as f64).abs() < 1e-5, "{std}");
        // the model sees it so when asked, and as stored otherwise
        let dynamic = DynamicImage::ImageRgb32F(exposed.clone());
        let p = prep(40, ResizeMode::Squash);
        assert_ne!(
            to_tensor(&dynamic, &p),
            to_tensor(&DynamicImage::ImageRgb32F(crop.clone()), &p)
        );
        let p = Preprocess {
            brightness: Brightness::Standardised,
            ..p
        };
        let (x, y) = (
            to_tensor(&dynamic, &p),
            to_tensor(&DynamicImage::ImageRgb32F(crop), &p),
        );
        assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() < 1e-4));
    }

    #[test]
    fn every_orientation_parses_back_from_its_name_and_a_wrong_name_lists_them() {
        for o in Orientation::iter() {
            assert_eq!(o.name().parse::<Orientation>().unwrap(), o);
        }
        let message = "sideways".parse::<Orientation>().unwrap_err().to_string();
        assert!(message.contains("\"sideways\""), "{message}");
        for o in Orientation::iter() {
            assert!(message.contains(o.name()), "{message}");
        }
    }
}
