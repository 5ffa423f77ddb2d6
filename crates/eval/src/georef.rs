//! Georeferenced mosaics through GDAL (feature `gdal`): GeoTIFF, ISIS3, PDS/PDS4 and the
//! other rasters GDAL reads, in any projection PROJ knows, on any body.
//!
//! A catalogue crater (latitude, longitude in degrees, diameter in km) is placed on the
//! mosaic by transforming its centre, and points half a diameter north and east of it, from
//! the mosaic's own geographic CRS into its projection, then into pixels through the
//! geotransform. The two offsets give the crater's local size in pixels along y and x, so a
//! crater stretched east-west by an equirectangular projection at high latitude gets a crop
//! window stretched the same way and resampled to a square. Crops are windowed reads,
//! resampled by GDAL to the output size: a mosaic is never loaded whole to cut crops. Crater
//! detection reads an image whole ([`Raster::levels`]) and places what it finds back on the
//! body ([`Raster::lon_lat`]).

use crate::benchbuild::Tile;
use crate::catalogue::{Crater, GeoCrater};
use crate::error::{Error, Result};
use craterdex_errors::{ensure, OrInvalid};
use gdal::raster::{GdalDataType, ResampleAlg};
use gdal::spatial_ref::{AxisMappingStrategy, CoordTransform};
use gdal::Dataset;
use std::path::{Path, PathBuf};

/// Largest side of a crop read from a mosaic; bigger craters are read downsampled.
const MAX_SIDE: f64 = 512.0;

/// Largest image read whole (for detection): as many pixels as an image file may hold.
const MAX_WHOLE_PIXELS: u64 = 1 << 32;
/// Pixels read at once when a whole image is read.
const WHOLE_READ_PIXELS: usize = 1 << 22;

/// The values of a whole band.
pub enum Levels {
    /// An 8-bit band's levels as stored, but that level 0 is no data alone (a band whose
    /// no-data value is another level has it read as 0 and its own 0 as 1).
    Eight(Vec<u8>),
    /// Any other band's values; no-data as NaN.
    Values(Vec<f32>),
}

/// An open mosaic.
pub struct Raster {
    path: PathBuf,
    ds: Dataset,
    size: (usize, usize),
    geotransform: [f64; 6],
    to_projected: CoordTransform,
    to_geographic: CoordTransform,
    eight_bit: bool,
    radius_m: f64,
    /// Values map to [0, 1] as `(v - offset) * scale`.
    offset: f64,
    scale: f64,
    nodata: Option<f64>,
}

/// A catalogue crater placed on the mosaic: pixel centre and N-S diameter, and how much
/// wider it is east-west in pixels.
pub struct Placed {
    pub crater: Crater,
    pub aspect: f64,
}

/// Width and height of the raster GDAL opens at `path`, from its header alone (no
/// georeferencing read, no statistics computed).
pub fn raster_size(path: &Path) -> Result<(usize, usize)> {
    let ds = Dataset::open(path)
        .or_invalid_with(|| format!("{}: GDAL cannot open it as a raster", path.display()))?;
    Ok(ds.raster_size())
}

impl Raster {
    pub fn open(path: &Path) -> Result<Self> {
        let ctx = || format!("{}", path.display());
        let ds = Dataset::open(path)
            .or_invalid_with(|| format!("{}: GDAL cannot open it as a raster", path.display()))?;
        let geotransform = ds.geo_transform().or_invalid_with(|| {
            format!(
                "{}: no geotransform (not a georeferenced mosaic)",
                path.display()
            )
        })?;
        let mut srs = ds.spatial_ref().or_invalid_with(|| {
            format!(
                "{}: no coordinate reference system (not a georeferenced mosaic)",
                path.display()
            )
        })?;
        srs.set_axis_mapping_strategy(AxisMappingStrategy::TraditionalGisOrder);
        let mut geographic = srs.geog_cs().or_invalid_with(ctx)?;
        geographic.set_axis_mapping_strategy(AxisMappingStrategy::TraditionalGisOrder);
        let to_projected = CoordTransform::new(&geographic, &srs).or_invalid_with(ctx)?;
        let to_geographic = CoordTransform::new(&srs, &geographic).or_invalid_with(ctx)?;
        let radius_m = srs.semi_major().or_invalid_with(ctx)?;
        ensure!(
            radius_m > 0.0,
            Error::Invalid(format!("{}: the body's radius is unknown", path.display()))
        );
        let size = ds.raster_size();
        let (nodata, offset, scale, eight_bit) = {
            let band = ds.rasterband(1).or_invalid_with(ctx)?;
            let eight_bit = band.band_type() == GdalDataType::UInt8;
            let (offset, scale) = match band.band_type() {
                GdalDataType::UInt8 => (0.0, 1.0 / 255.0),
                _ => {
                    let mm = band.compute_raster_min_max(true).or_invalid_with(|| {
                        format!("{}: cannot find the value range", path.display())
                    })?;
                    (mm.min, 1.0 / (mm.max - mm.min).max(f64::MIN_POSITIVE))
                }
            };
            (band.no_data_value(), offset, scale, eight_bit)
        };
        Ok(Self {
            path: path.to_path_buf(),
            ds,
            size,
            geotransform,
            to_projected,
            to_geographic,
            eight_bit,
            radius_m,
            offset,
            scale,
            nodata,
        })
    }

    /// Pixel coordinates (0 at the centre of the first pixel) of geographic points.
    fn pixels(&self, lon: &[f64], lat: &[f64]) -> Result<Vec<(f64, f64)>> {
        let (mut x, mut y) = (lon.to_vec(), lat.to_vec());
        self.to_projected
            .transform_coords(&mut x, &mut y, &mut [])
            .or_invalid_with(|| {
                format!("{}: cannot project crater positions", self.path.display())
            })?;
        let g = &self.geotransform;
        let det = g[1] * g[5] - g[2] * g[4];
        Ok(x.iter()
            .zip(&y)
            .map(|(&x, &y)| {
                let (dx, dy) = (x - g[0], y - g[3]);
                (
                    (g[5] * dx - g[2] * dy) / det - 0.5,
                    (-g[4] * dx + g[1] * dy) / det - 0.5,
                )
            })
            .collect())
    }

    /// Width and height in pixels.
    pub fn size(&self) -> (usize, usize) {
        self.size
    }

    /// The radius of the body the mosaic's coordinate system is on, in km.
    pub fn body_radius_km(&self) -> f64 {
        self.radius_m / 1000.0
    }

    /// The whole of band 1, a block of rows at a time: 8-bit levels as stored, or any other
    /// type's values as they are (no-data and non-finite values as NaN) for the caller to
    /// map onto grey levels.
    pub fn levels(&self) -> Result<Levels> {
        let (w, h) = self.size;
        ensure!(
            (w as u64) * (h as u64) <= MAX_WHOLE_PIXELS,
            Error::Invalid(format!(
                "{}: {w} x {h} pixels is more than a whole read takes ({MAX_WHOLE_PIXELS})",
                self.path.display()
            ))
        );
        let band = self
            .ds
            .rasterband(1)
            .or_invalid_with(|| self.path.display().to_string())?;
        let rows = (WHOLE_READ_PIXELS / w.max(1)).max(1);
        let read = |y0: usize, n: usize| -> Result<Vec<f64>> {
            let buf = band
                .read_as::<f64>((0, y0 as isize), (w, n), (w, n), None)
                .or_invalid_with(|| {
                    format!("{}: cannot read rows {y0}..{}", self.path.display(), y0 + n)
                })?;
            Ok(buf.into_shape_and_vec().1)
        };
        // only the band's own kind is filled: the other stays unallocated
        let (mut eight, mut values) = if self.eight_bit {
            (Vec::with_capacity(w * h), Vec::new())
        } else {
            (Vec::new(), Vec::with_capacity(w * h))
        };
        for y0 in (0..h).step_by(rows) {
            let block = read(y0, rows.min(h - y0))?;
            if self.eight_bit {
                eight.extend(block.iter().map(|&v| self.eight_bit_level(v)));
            } else {
                values.extend(block.iter().map(|&v| {
                    if self.nodata == Some(v) || !v.is_finite() {
                        f32::NAN
                    } else {
                        v as f32
                    }
                }));
            }
        }
        Ok(if self.eight_bit {
            Levels::Eight(eight)
        } else {
            Levels::Values(values)
        })
    }

    /// An 8-bit band's level with level 0 meaning no data alone, as the detector reads it: a
    /// band whose no-data value is another level has that level read as 0 and its data's 0
    /// as 1 (the next level up), so its margin is a margin and a black shadow is not.
    fn eight_bit_level(&self, v: f64) -> u8 {
        match self.nodata {
            Some(nd) if nd != 0.0 && v == nd => 0,
            Some(nd) if nd != 0.0 && (0.0..=255.0).contains(&nd) => (v as u8).max(1),
            _ => v as u8,
        }
    }

    /// Longitude and latitude in degrees (the mosaic's own geographic system and longitude
    /// convention) of pixel positions (0 at the centre of the first pixel).
    pub fn lon_lat(&self, pixels: &[(f64, f64)]) -> Result<Vec<(f64, f64)>> {
        let g = &self.geotransform;
        let (mut x, mut y): (Vec<f64>, Vec<f64>) = pixels
            .iter()
            .map(|&(px, py)| {
                let (u, v) = (px + 0.5, py + 0.5);
                (g[0] + u * g[1] + v * g[2], g[3] + u * g[4] + v * g[5])
            })
            .unzip();
        self.to_geographic
            .transform_coords(&mut x, &mut y, &mut [])
            .or_invalid_with(|| {
                format!(
                    "{}: cannot find the longitude and latitude of pixels",
                    self.path.display()
                )
            })?;
        Ok(x.into_iter().zip(y).collect())
    }

    fn inside(&self, (x, y): (f64, f64)) -> bool {
        x >= 0.0 && y >= 0.0 && x <= (self.size.0 - 1) as f64 && y <= (self.size.1 - 1) as f64
    }

    /// Places catalogue craters on the mosaic; longitudes are tried as given and shifted by
    /// 360 degrees (0-360 and -180-180 conventions). Craters off the mosaic are left out.
    pub fn place(&self, craters: &[GeoCrater]) -> Result<Vec<(GeoCrater, Placed)>> {
        let mut out = Vec::new();
        for c in craters {
            let half_deg = (c.diameter_km * 500.0 / self.radius_m).to_degrees();
            let cos_lat = c.lat.to_radians().cos().max(0.01);
            let mut placed = None;
            for wrap in [0.0, -360.0, 360.0] {
                let lon = c.lon + wrap;
                let p = self.pixels(
                    &[lon, lon, lon + half_deg / cos_lat],
                    &[c.lat, (c.lat + half_deg).min(90.0), c.lat],
                )?;
                if self.inside(p[0]) {
                    placed = Some(p);
                    break;
                }
            }
            let Some(p) = placed else { continue };
            let dist =
                |a: (f64, f64), b: (f64, f64)| ((a.0 - b.0).powi(2) + (a.1 - b.1).powi(2)).sqrt();
            let (ns, ew) = (2.0 * dist(p[0], p[1]), 2.0 * dist(p[0], p[2]));
            if !(ns > 0.0 && ew > 0.0) {
                continue;
            }
            out.push((
                c.clone(),
                Placed {
                    crater: Crater {
                        id: c.id.clone(),
                        x: p[0].0,
                        y: p[0].1,
                        diameter: ns,
                    },
                    aspect: ew / ns,
                },
            ));
        }
        Ok(out)
    }

    /// A `side x side` crop centred at (cx, cy) spanning `extent` pixels north-south and
    /// `extent * aspect` east-west, rotated by `angle`; None when it leaves the mosaic or
    /// touches no-data.
    pub fn crop(
        &self,
        cx: f64,
        cy: f64,
        extent: f64,
        aspect: f64,
        angle: f64,
    ) -> Option<(usize, Vec<f32>)> {
        let side = extent.round().clamp(8.0, MAX_SIDE);
        let reach = angle.cos().abs() + angle.sin().abs() + 4.0 / side;
        let (wx, wy) = (extent * aspect * reach, extent * reach);
        let (x0, y0) = ((cx + 0.5 - wx / 2.0).floor(), (cy + 0.5 - wy / 2.0).floor());
        let (x1, y1) = ((cx + 0.5 + wx / 2.0).ceil(), (cy + 0.5 + wy / 2.0).ceil());
        if x0 < 0.0 || y0 < 0.0 || x1 > self.size.0 as f64 || y1 > self.size.1 as f64 {
            return None;
        }
        let n = (side * reach).ceil() as usize;
        let band = self.ds.rasterband(1).ok()?;
        let buf = band
            .read_as::<f64>(
                (x0 as isize, y0 as isize),
                ((x1 - x0) as usize, (y1 - y0) as usize),
                (n, n),
                Some(ResampleAlg::Bilinear),
            )
            .ok()?;
        let (_, data) = buf.into_shape_and_vec();
        if let Some(nd) = self.nodata {
            if data.iter().any(|&v| v == nd || v.is_nan()) {
                return None;
            }
        }
        let tile = Tile {
            w: n,
            h: n,
            px: data
                .iter()
                .map(|&v| ((v - self.offset) * self.scale).clamp(0.0, 1.0) as f32)
                .collect(),
        };
        // The crater centre in buffer pixels (centre-of-pixel coordinates).
        let (sx, sy) = ((x1 - x0) / n as f64, (y1 - y0) / n as f64);
        let (bx, by) = ((cx + 0.5 - x0) / sx - 0.5, (cy + 0.5 - y0) / sy - 0.5);
        tile.crop_to(bx, by, extent / sy, angle, side as usize)
    }
}
