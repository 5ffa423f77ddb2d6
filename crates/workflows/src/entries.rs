//! Entry metadata from a CSV beside a directory of crops: an `id` column (the image's id)
//! and any of `crater_id`, `source`, `view`, `lat`, `lon`, `diameter_km` (a position on the
//! body) or `x`, `y`, `diameter_px` (a position in one image frame shared by the entries).

use crate::error::Result;
use craterdex_errors::{IoError, OrInvalid};
use craterdex_index::ImageMeta;
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
    let col = |name: &str| header.iter().position(|h| h.eq_ignore_ascii_case(name));
    let Some(id_col) = col("id") else {
        return Err(crate::Error::Invalid(format!(
            "{}: no `id` column (columns: {:?})",
            path.display(),
            header
        )));
    };
    let text = ["crater_id", "source", "view"].map(col);
    let nums = ["lat", "lon", "diameter_km", "x", "y", "diameter_px"].map(col);
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
