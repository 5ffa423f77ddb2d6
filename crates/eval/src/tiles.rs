//! Cuts images (a mosaic, tiles) into overlapping square windows, each carrying its centre:
//! the gallery `craterdex discover` ranks. Positions are pixels of one frame, images shifted
//! by [`crate::observations::FRAME_STRIDE`] each, as the link benchmark writes them.
//! Layout: `windows/` and `windows.csv` (id, source, x, y, diameter_px = the window side).

use crate::benchbuild::{save, Tile};
use crate::error::{Error, Result};
use crate::observations::FRAME_STRIDE;
use craterdex_errors::{ensure, IoContext};
use std::path::{Path, PathBuf};

/// One window: its id and centre in the common frame.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    pub id: String,
    pub x: f64,
    pub y: f64,
}

/// Cuts every image into `size` x `size` windows every `stride` pixels into `out`
/// (replaced atomically) and returns them.
pub fn cut(images: &[PathBuf], out: &Path, size: usize, stride: usize) -> Result<Vec<Window>> {
    ensure!(
        size >= 8 && stride >= 1,
        Error::Invalid(format!(
            "windows of {size} px every {stride} px: the side must be at least 8 px"
        ))
    );
    let tmp = craterdex_durable::tempdir_beside(out)?;
    craterdex_durable::create_dir_all(&tmp.join("windows"))?;
    let mut windows = Vec::new();
    let mut csv = csv::Writer::from_path(tmp.join("windows.csv"))?;
    csv.write_record(["id", "source", "x", "y", "diameter_px"])?;
    for (i, image) in images.iter().enumerate() {
        let tile = Tile::load(image)?;
        let stem = image
            .file_stem()
            .map(|s| s.to_string_lossy().to_string())
            .unwrap_or_else(|| format!("image{i}"));
        ensure!(
            tile.w >= size && tile.h >= size,
            Error::Invalid(format!(
                "{} is {}x{}, smaller than one {size}-px window",
                image.display(),
                tile.w,
                tile.h
            ))
        );
        let half = size as f64 / 2.0;
        for top in (0..=tile.h - size).step_by(stride) {
            for left in (0..=tile.w - size).step_by(stride) {
                // the window's own pixels, copied: its centre lies between its middle pixels
                let (cx, cy) = (left as f64 + half - 0.5, top as f64 + half - 0.5);
                let px: Vec<f32> = (top..top + size)
                    .flat_map(|y| {
                        tile.px[y * tile.w + left..y * tile.w + left + size]
                            .iter()
                            .copied()
                    })
                    .collect();
                let id = format!("{stem}-{left}-{top}");
                save(&tmp.join(format!("windows/{id}.png")), size, &px)?;
                let w = Window {
                    id,
                    x: cx + i as f64 * FRAME_STRIDE,
                    y: cy,
                };
                csv.write_record([
                    w.id.clone(),
                    stem.clone(),
                    format!("{:.1}", w.x),
                    format!("{:.1}", w.y),
                    size.to_string(),
                ])?;
                windows.push(w);
            }
        }
    }
    csv.flush().io("write", &tmp.join("windows.csv"))?;
    drop(csv);
    ensure!(
        !windows.is_empty(),
        Error::Invalid("no window fits the images".into())
    );
    craterdex_durable::replace_dir(&tmp, out)?;
    Ok(windows)
}

/// Crops of craters at `context` times their diameter, written as `dir/<id>.png`; returns
/// the paths of those that fit their image (`craters`: image index, id, x, y, diameter).
pub fn crater_crops(
    images: &[PathBuf],
    craters: &[(usize, String, f64, f64, f64)],
    context: f64,
    dir: &Path,
) -> Result<Vec<(String, PathBuf)>> {
    std::fs::create_dir_all(dir).io("create", dir)?;
    let mut loaded: Vec<Option<Tile>> = images.iter().map(|_| None).collect();
    let mut out = Vec::new();
    for (i, id, x, y, d) in craters {
        if loaded[*i].is_none() {
            loaded[*i] = Some(Tile::load(&images[*i])?);
        }
        let tile = loaded[*i].as_ref().expect("loaded above");
        if let Some((side, px)) = tile.crop(*x, *y, context * d, 0.0) {
            let p = dir.join(format!("{id}.png"));
            save(&p, side, &px)?;
            out.push((id.clone(), p));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{GrayImage, Luma};

    #[test]
    fn windows_cover_the_image_with_their_centres() {
        let d = tempfile::tempdir().unwrap();
        let img = d.path().join("m.png");
        GrayImage::from_fn(100, 60, |x, y| Luma([(x + y) as u8]))
            .save(&img)
            .unwrap();
        let out = d.path().join("cut");
        let w = cut(&[img], &out, 40, 20).unwrap();
        // left 0, 20, 40, 60 x top 0, 20
        assert_eq!(w.len(), 8);
        assert_eq!((w[0].x, w[0].y), (19.5, 19.5));
        assert_eq!(w[0].id, "m-0-0");
        let png = image::open(out.join("windows/m-60-20.png"))
            .unwrap()
            .to_luma8();
        assert_eq!(png.dimensions(), (40, 40));
        // the window's first pixel is the image's pixel (60, 20)
        assert_eq!(png.get_pixel(0, 0).0[0], 80);
        let csv = std::fs::read_to_string(out.join("windows.csv")).unwrap();
        assert_eq!(csv.lines().count(), 9);
    }
}
