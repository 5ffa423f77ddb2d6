//! Builds a CraterBench-R-style benchmark from image tiles and pixel crater lists, or from
//! georeferenced mosaics and catalogues in degrees and km (feature `gdal`, see `georef`).
//!
//! Gallery: for every crater of at least `min_diameter` pixels, axis-aligned crops of
//! `scale x diameter` (default 2x and 3x) around its centre. Queries: for a seeded subset of
//! those craters, `views` crops with a random context (`context` range times the diameter),
//! a centre shift (up to `shift` diameters), optional rotation, and photometric change
//! (brightness, contrast, gamma, then blur or noise). Crops are sampled bilinearly from the
//! tile at native resolution; a crop that leaves the tile is skipped and counted.
//! Relevance is cluster-tolerant: a query's relevant ids are its crater and any gallery
//! crater of similar size (ratio within 1.5) whose centre lies within half a diameter —
//! duplicate detections of the same crater.

use crate::catalogue::{read_pixel_catalogue, Crater, GeoCrater};
use crate::error::{Error, Result};
use crate::manifest::{Entry, Manifest};
use craterdex_errors::{ensure, IoError};
use image::{GrayImage, Luma};
use rand::{seq::index::sample, Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A turned query view's image id is its upright view's id with this suffix.
pub const TURNED_SUFFIX: &str = "r";

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BuildOptions {
    pub gallery_scales: Vec<f64>,
    /// Query craters (None: every gallery crater).
    pub query_craters: Option<usize>,
    pub views: usize,
    pub context: (f64, f64),
    pub shift: f64,
    pub rotate: bool,
    /// Also write every query view turned by a seeded random angle and mirrored half of
    /// the time (`splits/test_rotated.json`, same gallery): the same crater from another
    /// orbit and under another sun azimuth, as far as a 2-D image allows (shading turns
    /// and flips with the crater; nothing is relit).
    #[serde(default)]
    pub rotated_split: bool,
    pub brightness: f64,
    pub contrast: (f64, f64),
    pub gamma: (f64, f64),
    pub blur_sigma: f64,
    pub noise_sigma: f64,
    pub min_diameter: f64,
    pub seed: u64,
}

impl Default for BuildOptions {
    fn default() -> Self {
        Self {
            gallery_scales: vec![2.0, 3.0],
            query_craters: None,
            views: 2,
            context: (1.6, 3.6),
            shift: 0.15,
            rotate: false,
            rotated_split: false,
            brightness: 0.08,
            contrast: (0.8, 1.25),
            gamma: (0.8, 1.25),
            blur_sigma: 1.0,
            noise_sigma: 0.02,
            min_diameter: 8.0,
            seed: 0,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BuildReport {
    pub craters: usize,
    pub gallery_images: usize,
    pub query_images: usize,
    /// Views in `splits/test_rotated.json` (a view whose turned crop leaves the tile is
    /// missing there).
    #[serde(default)]
    pub rotated_query_images: usize,
    pub skipped_small: usize,
    pub skipped_outside: usize,
}

/// A tile as f32 gray values in [0, 1].
pub(crate) struct Tile {
    pub(crate) w: usize,
    pub(crate) h: usize,
    pub(crate) px: Vec<f32>,
}

impl Tile {
    pub(crate) fn load(path: &Path) -> Result<Self> {
        let img = craterdex_model::preprocess::load_tile(path)?.to_luma32f();
        Ok(Self {
            w: img.width() as usize,
            h: img.height() as usize,
            px: img.into_raw(),
        })
    }

    fn bilinear(&self, x: f64, y: f64) -> f32 {
        let (x0, y0) = (x.floor().max(0.0) as usize, y.floor().max(0.0) as usize);
        let (x1, y1) = ((x0 + 1).min(self.w - 1), (y0 + 1).min(self.h - 1));
        let (fx, fy) = ((x - x0 as f64) as f32, (y - y0 as f64) as f32);
        let p = |xx: usize, yy: usize| self.px[yy * self.w + xx];
        (p(x0, y0) * (1.0 - fx) + p(x1, y0) * fx) * (1.0 - fy)
            + (p(x0, y1) * (1.0 - fx) + p(x1, y1) * fx) * fy
    }

    /// A `side x side` crop centred at (cx, cy) covering `extent` tile pixels, rotated by
    /// `angle`; None when any part falls outside the tile.
    pub(crate) fn crop(
        &self,
        cx: f64,
        cy: f64,
        extent: f64,
        angle: f64,
    ) -> Option<(usize, Vec<f32>)> {
        self.crop_to(cx, cy, extent, angle, extent.round().max(8.0) as usize)
    }

    /// As `crop`, resampled to `side x side` pixels.
    pub(crate) fn crop_to(
        &self,
        cx: f64,
        cy: f64,
        extent: f64,
        angle: f64,
        side: usize,
    ) -> Option<(usize, Vec<f32>)> {
        let half = extent / 2.0;
        let (c, s) = (angle.cos(), angle.sin());
        let reach = half * (c.abs() + s.abs());
        if cx - reach < 0.0
            || cy - reach < 0.0
            || cx + reach > (self.w - 1) as f64
            || cy + reach > (self.h - 1) as f64
        {
            return None;
        }
        let step = extent / side as f64;
        let mut out = Vec::with_capacity(side * side);
        for j in 0..side {
            for i in 0..side {
                let (u, v) = (
                    (i as f64 + 0.5) * step - half,
                    (j as f64 + 0.5) * step - half,
                );
                out.push(self.bilinear(cx + u * c - v * s, cy + u * s + v * c));
            }
        }
        Some((side, out))
    }
}

pub(crate) fn save(path: &Path, side: usize, px: &[f32]) -> Result<()> {
    let img = GrayImage::from_fn(side as u32, side as u32, |x, y| {
        Luma([(px[y as usize * side + x as usize].clamp(0.0, 1.0) * 255.0).round() as u8])
    });
    img.save(path)
        .map_err(|e| IoError::new("write", path, std::io::Error::other(e)))?;
    Ok(())
}

fn gaussian_blur(px: &[f32], side: usize, sigma: f64) -> Vec<f32> {
    if sigma < 0.3 {
        return px.to_vec();
    }
    let r = (3.0 * sigma).ceil() as isize;
    let k: Vec<f32> = (-r..=r)
        .map(|i| (-(i * i) as f64 / (2.0 * sigma * sigma)).exp() as f32)
        .collect();
    let norm: f32 = k.iter().sum();
    let pass = |src: &[f32], horizontal: bool| -> Vec<f32> {
        let mut dst = vec![0f32; src.len()];
        for y in 0..side {
            for x in 0..side {
                let mut acc = 0f32;
                for (t, w) in k.iter().enumerate() {
                    let o = t as isize - r;
                    let (xx, yy) = if horizontal {
                        (x as isize + o, y as isize)
                    } else {
                        (x as isize, y as isize + o)
                    };
                    let (xx, yy) = (
                        xx.clamp(0, side as isize - 1) as usize,
                        yy.clamp(0, side as isize - 1) as usize,
                    );
                    acc += w * src[yy * side + xx];
                }
                dst[y * side + x] = acc / norm;
            }
        }
        dst
    };
    pass(&pass(px, true), false)
}

pub(crate) fn gauss(rng: &mut ChaCha8Rng) -> f32 {
    // Box-Muller
    let (u1, u2): (f64, f64) = (rng.gen_range(1e-12..1.0), rng.gen());
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

pub(crate) fn photometric(px: &mut Vec<f32>, side: usize, o: &BuildOptions, rng: &mut ChaCha8Rng) {
    let b = rng.gen_range(-o.brightness..=o.brightness) as f32;
    let c = rng.gen_range(o.contrast.0..=o.contrast.1) as f32;
    let g = rng.gen_range(o.gamma.0..=o.gamma.1) as f32;
    for v in px.iter_mut() {
        *v = (((*v - 0.5) * c + 0.5 + b).clamp(0.0, 1.0)).powf(g);
    }
    if rng.gen_bool(0.5) {
        *px = gaussian_blur(px, side, rng.gen_range(0.0..=o.blur_sigma));
    } else {
        let s = rng.gen_range(0.0..=o.noise_sigma) as f32;
        px.iter_mut()
            .for_each(|v| *v = (*v + s * gauss(rng)).clamp(0.0, 1.0));
    }
}

struct Candidate {
    id: String,
    tile: usize,
    crater: Crater,
    /// East-west over north-south size in pixels (1 for pixel catalogues).
    aspect: f64,
    geo: Option<GeoCrater>,
}

/// One source of craters.
#[derive(Clone, Debug)]
pub enum Input {
    /// An image tile and a crater list in its pixels.
    Tile { image: PathBuf, craters: PathBuf },
    /// A georeferenced mosaic and a catalogue in degrees and km (needs the `gdal` feature).
    Mosaic { raster: PathBuf, catalogue: PathBuf },
}

impl Input {
    fn describe(&self) -> (String, String) {
        match self {
            Input::Tile { image, craters } => {
                (image.display().to_string(), craters.display().to_string())
            }
            Input::Mosaic { raster, catalogue } => (
                raster.display().to_string(),
                catalogue.display().to_string(),
            ),
        }
    }
}

/// Where crops come from: a tile in memory, or a mosaic read window by window.
enum Source {
    Tile(Tile),
    // boxed: an open raster (its dataset and two coordinate transforms) is the larger
    #[cfg(feature = "gdal")]
    Raster(Box<crate::georef::Raster>),
}

impl Source {
    fn crop(
        &self,
        c: &Candidate,
        dx: f64,
        dy: f64,
        extent: f64,
        angle: f64,
    ) -> Option<(usize, Vec<f32>)> {
        let (x, y) = (c.crater.x + dx * c.aspect, c.crater.y + dy);
        match self {
            Source::Tile(t) => t.crop(x, y, extent, angle),
            #[cfg(feature = "gdal")]
            Source::Raster(r) => r.crop(x, y, extent, c.aspect, angle),
        }
    }
}

/// A crater of an input in its source's pixels.
struct SourceCrater {
    crater: Crater,
    aspect: f64,
    geo: Option<GeoCrater>,
}

/// Opens one input: its crop source, its name and its craters.
fn open_input(input: &Input) -> Result<(Source, String, Vec<SourceCrater>)> {
    let stem = |p: &Path| {
        p.file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_default()
    };
    match input {
        Input::Tile { image, craters } => {
            let list = read_pixel_catalogue(craters)?
                .into_iter()
                .map(|crater| SourceCrater {
                    crater,
                    aspect: 1.0,
                    geo: None,
                })
                .collect();
            Ok((Source::Tile(Tile::load(image)?), stem(image), list))
        }
        #[cfg(feature = "gdal")]
        Input::Mosaic { raster, catalogue } => {
            let r = crate::georef::Raster::open(raster)?;
            let geo = crate::catalogue::read_geo_catalogue(catalogue)?;
            let placed = r.place(&geo)?;
            ensure!(
                !placed.is_empty(),
                Error::Invalid(format!(
                    "none of the {} craters of {} lies on {}",
                    geo.len(),
                    catalogue.display(),
                    raster.display()
                ))
            );
            let list = placed
                .into_iter()
                .map(|(g, p)| SourceCrater {
                    crater: p.crater,
                    aspect: p.aspect,
                    geo: Some(g),
                })
                .collect();
            Ok((Source::Raster(Box::new(r)), stem(raster), list))
        }
        #[cfg(not(feature = "gdal"))]
        Input::Mosaic { raster, .. } => Err(Error::Unsupported(format!(
            "{}: georeferenced mosaics need GDAL; this craterdex was built without it \
                 (install libgdal-dev and build with `cargo build --release --features gdal`)",
            raster.display()
        ))),
    }
}

/// Builds a benchmark into `out` (replaced atomically): `images/gallery`, `images/query`,
/// `splits/test.json`, `metadata/build.json`.
pub fn build(inputs: &[Input], out: &Path, o: &BuildOptions) -> Result<BuildReport> {
    ensure!(!inputs.is_empty(), Error::Invalid("no tiles given".into()));
    ensure!(
        o.views > 0 && !o.gallery_scales.is_empty(),
        Error::Invalid("need at least one query view and one gallery scale".to_string())
    );
    ensure!(
        o.context.0 > 0.0 && o.context.0 <= o.context.1,
        Error::Invalid(format!(
            "context range {:?} is not a valid range",
            o.context
        ))
    );
    let tmp = craterdex_durable::tempdir_beside(out)?;
    for d in ["images/gallery", "images/query", "splits", "metadata"] {
        craterdex_durable::create_dir_all(&tmp.join(d))?;
    }
    if o.rotated_split {
        craterdex_durable::create_dir_all(&tmp.join("images/query_rotated"))?;
    }
    let mut report = BuildReport::default();
    let mut tiles = Vec::new();
    let mut candidates = Vec::new();
    for (ti, input) in inputs.iter().enumerate() {
        let (source, stem, craters) = open_input(input)?;
        for c in craters {
            if c.crater.diameter < o.min_diameter {
                report.skipped_small += 1;
                continue;
            }
            candidates.push(Candidate {
                id: format!("{stem}-{}", c.crater.id),
                tile: ti,
                crater: c.crater,
                aspect: c.aspect,
                geo: c.geo,
            });
        }
        tiles.push(source);
    }
    let mut gallery = Vec::new();
    let mut in_gallery = Vec::new();
    for cand in &candidates {
        let t = &tiles[cand.tile];
        let mut any = false;
        for &scale in &o.gallery_scales {
            let view = format!("{}x", scale);
            match t.crop(cand, 0.0, 0.0, scale * cand.crater.diameter, 0.0) {
                Some((side, px)) => {
                    let name = format!("{}_{view}", cand.id);
                    let rel = format!("images/gallery/{name}.png");
                    save(&tmp.join(&rel), side, &px)?;
                    gallery.push(Entry {
                        image_id: name,
                        path: rel,
                        crater_id: Some(cand.id.clone()),
                        view_type: Some(view),
                        relevant_crater_ids: None,
                        lat: cand.geo.as_ref().map(|g| g.lat),
                        lon: cand.geo.as_ref().map(|g| g.lon),
                        diameter_km: cand.geo.as_ref().map(|g| g.diameter_km),
                    });
                    any = true;
                }
                None => report.skipped_outside += 1,
            }
        }
        in_gallery.push(any);
    }
    let eligible: Vec<usize> = (0..candidates.len()).filter(|&i| in_gallery[i]).collect();
    report.craters = eligible.len();
    let mut rng = ChaCha8Rng::seed_from_u64(o.seed);
    let mut chosen: Vec<usize> = match o.query_craters {
        Some(n) if n < eligible.len() => sample(&mut rng, eligible.len(), n)
            .iter()
            .map(|i| eligible[i])
            .collect(),
        _ => eligible.clone(),
    };
    chosen.sort_unstable();
    let mut queries = Vec::new();
    // its own stream, so that the unrotated split is the same with or without this one
    let mut turn_rng = ChaCha8Rng::seed_from_u64(o.seed ^ 0x7075_726e);
    let mut rotated = Vec::new();
    for &ci in &chosen {
        let cand = &candidates[ci];
        let t = &tiles[cand.tile];
        let relevant: Vec<String> = eligible
            .iter()
            .map(|&j| &candidates[j])
            .filter(|o2| {
                o2.tile == cand.tile && {
                    let (a, b) = (&cand.crater, &o2.crater);
                    let dist = ((a.x - b.x).powi(2) + (a.y - b.y).powi(2)).sqrt();
                    dist <= 0.5 * a.diameter
                        && (a.diameter / b.diameter).max(b.diameter / a.diameter) <= 1.5
                }
            })
            .map(|o2| o2.id.clone())
            .collect();
        for v in 0..o.views {
            let ctx = rng.gen_range(o.context.0..=o.context.1);
            let d = cand.crater.diameter;
            let (dx, dy) = (
                rng.gen_range(-o.shift..=o.shift) * d,
                rng.gen_range(-o.shift..=o.shift) * d,
            );
            let angle = if o.rotate {
                rng.gen_range(0.0..std::f64::consts::TAU)
            } else {
                0.0
            };
            let (turn, mirror) = (
                turn_rng.gen_range(0.0..std::f64::consts::TAU),
                turn_rng.gen_bool(0.5),
            );
            let entry = |name: String, rel: String, view: String| Entry {
                image_id: name,
                path: rel,
                crater_id: Some(cand.id.clone()),
                view_type: Some(view),
                relevant_crater_ids: Some(relevant.clone()),
                lat: cand.geo.as_ref().map(|g| g.lat),
                lon: cand.geo.as_ref().map(|g| g.lon),
                diameter_km: cand.geo.as_ref().map(|g| g.diameter_km),
            };
            match t.crop(cand, dx, dy, ctx * d, angle) {
                Some((side, mut px)) => {
                    // the turned view gets the same photometric change
                    let mut same_draws = rng.clone();
                    photometric(&mut px, side, o, &mut rng);
                    let name = format!("{}_q{v}", cand.id);
                    let rel = format!("images/query/{name}.png");
                    save(&tmp.join(&rel), side, &px)?;
                    queries.push(entry(name.clone(), rel, format!("q{ctx:.2}x")));
                    if o.rotated_split {
                        if let Some((side, mut px)) = t.crop(cand, dx, dy, ctx * d, angle + turn) {
                            if mirror {
                                px.chunks_mut(side).for_each(<[f32]>::reverse);
                            }
                            photometric(&mut px, side, o, &mut same_draws);
                            let name = format!("{name}{TURNED_SUFFIX}");
                            let rel = format!("images/query_rotated/{name}.png");
                            save(&tmp.join(&rel), side, &px)?;
                            let how = if mirror { "m" } else { "" };
                            let deg = turn.to_degrees();
                            rotated.push(entry(name, rel, format!("q{ctx:.2}x-r{deg:.0}{how}")));
                        }
                    }
                }
                None => report.skipped_outside += 1,
            }
        }
    }
    report.gallery_images = gallery.len();
    report.query_images = queries.len();
    report.rotated_query_images = rotated.len();
    ensure!(
        !gallery.is_empty(),
        Error::Invalid(format!(
            "no crater produced a gallery crop (all smaller than {} px or too close to the edge)",
            o.min_diameter
        ))
    );
    if o.rotated_split {
        let manifest = Manifest {
            split_name: "test_rotated".into(),
            version: "craterdex-built-1".into(),
            gallery_images: gallery.clone(),
            query_images: rotated,
        };
        craterdex_durable::write_new(
            &tmp.join("splits/test_rotated.json"),
            serde_json::to_vec_pretty(&manifest)?,
        )?;
    }
    let manifest = Manifest {
        split_name: "test".into(),
        version: "craterdex-built-1".into(),
        gallery_images: gallery,
        query_images: queries,
    };
    craterdex_durable::write_new(
        &tmp.join("splits/test.json"),
        serde_json::to_vec_pretty(&manifest)?,
    )?;
    let sources: Vec<(String, String)> = inputs.iter().map(Input::describe).collect();
    craterdex_durable::write_new(
        &tmp.join("metadata/build.json"),
        serde_json::to_vec_pretty(
            &serde_json::json!({"options": o, "report": report, "sources": sources}),
        )?,
    )?;
    craterdex_durable::replace_dir(&tmp, out)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_a_loadable_benchmark_and_skips_edge_craters() {
        let d = tempfile::tempdir().unwrap();
        let tile = d.path().join("t.png");
        GrayImage::from_fn(200, 200, |x, y| Luma([((x * 7 + y * 3) % 255) as u8]))
            .save(&tile)
            .unwrap();
        let cat = d.path().join("t.csv");
        std::fs::write(
            &cat,
            "long,lat,diameter\n100,100,20\n101,101,19\n5,5,20\n50,60,4\n",
        )
        .unwrap();
        let out = d.path().join("bench");
        let o = BuildOptions {
            views: 3,
            ..Default::default()
        };
        let input = Input::Tile {
            image: tile.clone(),
            craters: cat.clone(),
        };
        let r = build(std::slice::from_ref(&input), &out, &o).unwrap();
        assert_eq!(r.skipped_small, 1);
        assert_eq!(r.craters, 2); // the crater at (5,5) fits no crop
        assert_eq!(r.gallery_images, 4);
        assert_eq!(r.skipped_outside, 2);
        assert_eq!(r.query_images, 6);
        let b = crate::manifest::load(&out.join("splits/test.json"), None).unwrap();
        // the two overlapping detections are relevant to each other
        assert_eq!(b.relevance[0].len(), 2);
        let first = image::open(out.join(&b.manifest.gallery_images[0].path)).unwrap();
        assert_eq!(first.width(), 40);
        // seeded: the same options give the same images
        let out2 = d.path().join("bench2");
        build(std::slice::from_ref(&input), &out2, &o).unwrap();
        let q = &b.manifest.query_images[2].path;
        assert_eq!(
            std::fs::read(out.join(q)).unwrap(),
            std::fs::read(out2.join(q)).unwrap()
        );
        assert!(!out.join("splits/test_rotated.json").exists());

        // a turned split leaves the upright one as it was, and turns every view it can
        let out3 = d.path().join("bench3");
        let turned = BuildOptions {
            rotated_split: true,
            ..o.clone()
        };
        let r3 = build(&[input], &out3, &turned).unwrap();
        assert_eq!(
            std::fs::read(out3.join("splits/test.json")).unwrap(),
            std::fs::read(out.join("splits/test.json")).unwrap()
        );
        for e in &b.manifest.query_images {
            assert_eq!(
                std::fs::read(out3.join(&e.path)).unwrap(),
                std::fs::read(out.join(&e.path)).unwrap()
            );
        }
        let t = crate::manifest::load(&out3.join("splits/test_rotated.json"), None).unwrap();
        assert_eq!(r3.rotated_query_images, t.manifest.query_images.len());
        assert!(r3.rotated_query_images >= 4, "{r3:?}");
        assert_eq!(t.manifest.gallery_images, b.manifest.gallery_images);
        for e in &t.manifest.query_images {
            let upright = b
                .manifest
                .query_images
                .iter()
                .find(|u| format!("{}r", u.image_id) == e.image_id)
                .expect("each turned view has its upright view");
            assert_eq!(upright.crater_id, e.crater_id);
            assert_eq!(upright.relevant_crater_ids, e.relevant_crater_ids);
            assert!(e.view_type.as_deref().unwrap().contains("-r"));
            let (a, b) = (
                image::open(out3.join(&upright.path)).unwrap().to_luma8(),
                image::open(out3.join(&e.path)).unwrap().to_luma8(),
            );
            assert_eq!(a.dimensions(), b.dimensions());
            assert_ne!(a.as_raw(), b.as_raw());
        }
    }
}
