//! `craterdex bench-build`: a CraterBench-R-style benchmark from tiles (pixel catalogues) or
//! georeferenced mosaics (km catalogues, feature `gdal`).

use anyhow::{bail, Result};
use clap::Args;
use craterdex_eval::benchbuild;
use std::path::PathBuf;

#[derive(Args)]
pub struct BenchBuildCmd {
    /// Image tile (repeat with --craters for several tiles).
    #[arg(long, required_unless_present = "mosaic")]
    tile: Vec<PathBuf>,
    /// Crater list in pixels for the tile at the same position (pycda CSV or NAC format).
    #[arg(long)]
    craters: Vec<PathBuf>,
    /// Georeferenced mosaic: GeoTIFF, ISIS3, PDS/PDS4, anything GDAL reads (repeat with
    /// --catalogue; needs a build with `--features gdal`).
    #[arg(long)]
    mosaic: Vec<PathBuf>,
    /// Catalogue in degrees and km for the mosaic at the same position (Robbins-style
    /// LAT_CIRC_IMG, LON_CIRC_IMG, DIAM_CIRC_IMG, or lat, lon, diameter_km).
    #[arg(long)]
    catalogue: Vec<PathBuf>,
    #[arg(long)]
    out: PathBuf,
    /// Query craters (default: all gallery craters).
    #[arg(long)]
    query_craters: Option<usize>,
    #[arg(long, default_value_t = 2)]
    views: usize,
    #[arg(long, default_value_t = 8.0)]
    min_diameter: f64,
    #[arg(long, default_value_t = 1.6)]
    context_min: f64,
    #[arg(long, default_value_t = 3.6)]
    context_max: f64,
    /// Largest centre shift, in crater diameters.
    #[arg(long, default_value_t = 0.15)]
    shift: f64,
    /// Turn every query view by a random angle.
    #[arg(long)]
    rotate: bool,
    /// Also write the query views turned by a seeded random angle and mirrored half of the
    /// time, as splits/test_rotated.json (same gallery; `craterdex eval --rotated` compares).
    #[arg(long)]
    rotated_split: bool,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Instead of a benchmark: cut the tiles into windows of this many pixels (for
    /// `craterdex discover`), written as OUT/windows/ and OUT/windows.csv with their centres.
    #[arg(long)]
    windows: Option<usize>,
    /// Pixels between windows (default: half a window).
    #[arg(long)]
    window_stride: Option<usize>,
}

pub fn run(c: BenchBuildCmd) -> Result<()> {
    if let Some(size) = c.windows {
        let stride = c.window_stride.unwrap_or(size / 2).max(1);
        let w = craterdex_eval::tiles::cut(&c.tile, &c.out, size, stride)?;
        println!(
            "{} windows of {size} px every {stride} px -> {}/windows and windows.csv",
            w.len(),
            c.out.display()
        );
        return Ok(());
    }
    if c.tile.len() != c.craters.len() {
        bail!(
            "give one --craters list per --tile ({} tiles, {} lists)",
            c.tile.len(),
            c.craters.len()
        );
    }
    let o = benchbuild::BuildOptions {
        query_craters: c.query_craters,
        views: c.views,
        min_diameter: c.min_diameter,
        context: (c.context_min, c.context_max),
        shift: c.shift,
        rotate: c.rotate,
        rotated_split: c.rotated_split,
        seed: c.seed,
        ..Default::default()
    };
    if c.mosaic.len() != c.catalogue.len() {
        bail!(
            "give one --catalogue per --mosaic ({} mosaics, {} catalogues)",
            c.mosaic.len(),
            c.catalogue.len()
        );
    }
    let inputs: Vec<benchbuild::Input> = c
        .tile
        .into_iter()
        .zip(c.craters)
        .map(|(image, craters)| benchbuild::Input::Tile { image, craters })
        .chain(
            c.mosaic
                .into_iter()
                .zip(c.catalogue)
                .map(|(raster, catalogue)| benchbuild::Input::Mosaic { raster, catalogue }),
        )
        .collect();
    let r = benchbuild::build(&inputs, &c.out, &o)?;
    println!(
        "{} craters: {} gallery and {} query images in {} ({} craters below {} px, {} crops left the image)",
        r.craters,
        r.gallery_images,
        r.query_images,
        c.out.join("splits/test.json").display(),
        r.skipped_small,
        o.min_diameter,
        r.skipped_outside
    );
    if o.rotated_split {
        println!(
            "{} turned query views in {} ({} turned crops left the image)",
            r.rotated_query_images,
            c.out.join("splits/test_rotated.json").display(),
            r.query_images - r.rotated_query_images
        );
    }
    Ok(())
}
