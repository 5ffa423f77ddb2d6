//! Entry metadata from a CSV beside a directory of crops: an `id` column (the image's id)
//! and any of `crater_id`, `source`, `view`, `lat`, `lon`, `diameter_km` (a position on the
//! body) or `x`, `y`, `diameter_px` (a position in one image frame shared by the entries),
//! under any of the names of [`craterdex_index::columns`]: a Robbins-format catalogue
//! (`CRATER_ID`, `LAT_CIRC_IMG`, `LON_CIRC_IMG`, `DIAM_CIRC_IMG`) is read as it is, its
//! crater ids naming the images where no `id` column does.

use crate::error::Result;
use craterdex_errors::{IoError, OrInvalid};
use craterdex_index::{columns, ImageMeta};
use std::collections::HashMap;
use std::path::Path;

/// Metadata by id. Unknown columns are ignored; a missing `id` column, a repeated id or a
/// value that is not a finite number is refused with the file and line.
pub fn read_meta_csv(path: &Path) -> Result<HashMap<String, ImageMeta>> {
    let mut r = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_path(path)
        .map_err(|e| IoError::new("read", path, std::io::Error::other(e)))?;
    let header = r
        .headers()
        .or_invalid_with(|| format!("{}: no header line", path.display()))?
        .clone();
    let col = |names: &[&str]| columns::find(header.iter(), names);
    let Some(id_col) = col(columns::ID).or_else(|| col(columns::CRATER_ID)) else {
        return Err(crate::Error::Invalid(format!(
            "{}: no `id` column, nor a crater id to name the images by (columns: {:?})",
            path.display(),
            header
        )));
    };
    let text = [columns::CRATER_ID, columns::SOURCE, columns::VIEW].map(col);
    let nums = [
        columns::LAT,
        columns::LON,
        columns::DIAMETER_KM,
        columns::X,
        columns::Y,
        columns::DIAMETER_PX,
    ]
    .map(col);
    let mut out = HashMap::new();
    for (line, rec) in r.records().enumerate() {
        let at = || format!("{} line {}", path.display(), line + 2);
        let rec = rec.or_invalid_with(at)?;
        let get = |c: Option<usize>| c.and_then(|c| rec.get(c)).filter(|v| !v.is_empty());
        let id = get(Some(id_col)).or_invalid_with(|| format!("{}: empty id", at()))?;
        let mut n = [None; 6];
        for (slot, c) in n.iter_mut().zip(nums) {
            if let Some(v) = get(c) {
                let x: f64 = v
                    .parse()
                    .ok()
                    .filter(|x: &f64| x.is_finite())
                    .or_invalid_with(|| format!("{}: {v:?} is not a number", at()))?;
                *slot = Some(x);
            }
        }
        let [crater_id, source, view] = text.map(|c| get(c).map(str::to_string));
        let meta = ImageMeta {
            id: id.to_string(),
            crater_id,
            source,
            view,
            lat: n[0],
            lon: n[1],
            diameter_km: n[2],
            x: n[3],
            y: n[4],
            diameter_px: n[5],
            path: None,
        };
        if let Some(problem) = meta.position_problem() {
            return Err(crate::Error::Invalid(format!("{}: {problem}", at())));
        }
        if out.insert(id.to_string(), meta).is_some() {
            return Err(crate::Error::Invalid(format!(
                "{}: id {id:?} appears twice",
                at()
            )));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Robbins-format table is read as it is: crater ids name the images, the circle
    /// fit's centre and diameter are the position; 0-360 longitudes are kept as given.
    #[test]
    fn reads_a_robbins_catalogue_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("robbins.csv");
        std::fs::write(
            &p,
            "CRATER_ID,LAT_CIRC_IMG,LON_CIRC_IMG,DIAM_CIRC_IMG,DEPTH_RIMFLOOR_TOPOG\n\
             02-000001,-12.5,350.25,3.2,0.1\n02-000002,40.0,-10.5,1.1,0.05\n",
        )
        .unwrap();
        let m = read_meta_csv(&p).unwrap();
        let a = &m["02-000001"];
        assert_eq!(a.crater_id.as_deref(), Some("02-000001"));
        assert_eq!(
            (a.lat, a.lon, a.diameter_km),
            (Some(-12.5), Some(350.25), Some(3.2))
        );
        assert_eq!(m["02-000002"].lon, Some(-10.5));
        // the common spellings too
        std::fs::write(&p, "image_id,Latitude,Longitude,diam_km\nx1,1,2,3\n").unwrap();
        let m = read_meta_csv(&p).unwrap();
        assert_eq!(
            (m["x1"].lat, m["x1"].lon, m["x1"].diameter_km),
            (Some(1.0), Some(2.0), Some(3.0))
        );
    }

    #[test]
    fn reads_positions_and_names_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.csv");
        std::fs::write(
            &p,
            "id,lat,lon,diameter_km,crater_id,extra\na, 1.5 ,2,0.3,c1,x\nb,,,,,\n",
        )
        .unwrap();
        let m = read_meta_csv(&p).unwrap();
        assert_eq!(m["a"].lat, Some(1.5));
        assert_eq!(m["a"].crater_id.as_deref(), Some("c1"));
        assert_eq!(m["b"].lat, None);
        std::fs::write(&p, "id,lat\na,north\n").unwrap();
        let e = format!("{:#}", read_meta_csv(&p).unwrap_err());
        assert!(e.contains("line 2") && e.contains("north"), "{e}");
        std::fs::write(&p, "name,lat\na,1\n").unwrap();
        assert!(format!("{:#}", read_meta_csv(&p).unwrap_err()).contains("no `id` column"));
        std::fs::write(&p, "id\na\na\n").unwrap();
        assert!(format!("{:#}", read_meta_csv(&p).unwrap_err()).contains("twice"));
    }
}
