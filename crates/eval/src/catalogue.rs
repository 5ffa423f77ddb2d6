//! Crater lists.
//!
//! In image pixels, recognised by their header: pycda (`long,lat,diameter`, all in pixels:
//! x, y, diameter) and the LRO NAC lists (`ID,X,Y,W,H,C_X,CY`: box and centre; diameter is
//! the mean of W and H). On a body, in degrees and km: Robbins-style catalogues
//! (`CRATER_ID, LAT_CIRC_IMG, LON_CIRC_IMG, DIAM_CIRC_IMG`) or plain `id, lat, lon,
//! diameter_km`. Comma or tab separated; header names are case-insensitive.

use crate::error::{Error, Result};
use craterdex_errors::{ensure, IoContext, OrInvalid};
use craterdex_index::columns;
use std::path::Path;

#[derive(Clone, Debug, PartialEq)]
pub struct Crater {
    pub id: String,
    pub x: f64,
    pub y: f64,
    pub diameter: f64,
}

/// A crater on a body: planetocentric latitude and longitude in degrees, diameter in km.
#[derive(Clone, Debug, PartialEq)]
pub struct GeoCrater {
    pub id: String,
    pub lat: f64,
    pub lon: f64,
    pub diameter_km: f64,
}

type CsvFile = (csv::Reader<std::io::Cursor<Vec<u8>>>, Vec<String>);

/// A CSV reader (comma or tab, found from the header line) and its lower-case headers.
fn open_csv(path: &Path) -> Result<CsvFile> {
    let text = std::fs::read(path).io("read", path)?;
    let first = text.split(|&b| b == b'\n').next().unwrap_or_default();
    let delim = if first.contains(&b'\t') { b'\t' } else { b',' };
    let mut rdr = csv::ReaderBuilder::new()
        .delimiter(delim)
        .trim(csv::Trim::All)
        .from_reader(std::io::Cursor::new(text));
    let headers: Vec<String> = rdr
        .headers()
        .or_invalid_with(|| format!("{}: no header line", path.display()))?
        .iter()
        .map(|h| h.to_ascii_lowercase())
        .collect();
    Ok((rdr, headers))
}

fn number(path: &Path, rec: &csv::StringRecord, line: usize, col: usize) -> Result<f64> {
    let s = rec.get(col).unwrap_or_default();
    Ok(s.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .or_invalid_with(|| format!("{}: line {line}: {s:?} is not a number", path.display()))?)
}

pub fn read_geo_catalogue(path: &Path) -> Result<Vec<GeoCrater>> {
    let (mut rdr, headers) = open_csv(path)?;
    let find = |names: &[&str]| columns::find(headers.iter().map(String::as_str), names);
    let (Some(lat), Some(lon), Some(diam)) = (
        find(columns::LAT),
        find(columns::LON),
        find(columns::DIAMETER_KM),
    ) else {
        return Err(Error::Invalid(format!(
            "{}: a catalogue in degrees and km needs latitude, longitude and diameter columns \
             (LAT_CIRC_IMG, LON_CIRC_IMG, DIAM_CIRC_IMG, or lat, lon, diameter_km); found {headers:?}",
            path.display()
        )));
    };
    let id = find(columns::CRATER_ID).or_else(|| find(columns::ID));
    let mut out = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let line = i + 2;
        let rec = rec.or_invalid_with(|| format!("{}: line {line}", path.display()))?;
        let c = GeoCrater {
            id: id
                .and_then(|c| rec.get(c))
                .filter(|s| !s.is_empty())
                .map_or_else(|| format!("{i:06}"), str::to_string),
            lat: number(path, &rec, line, lat)?,
            lon: number(path, &rec, line, lon)?,
            diameter_km: number(path, &rec, line, diam)?,
        };
        ensure!(
            c.lat.abs() <= 90.0 && c.diameter_km > 0.0,
            Error::Invalid(format!(
                "{}: line {line}: latitude {} or diameter {} km out of range",
                path.display(),
                c.lat,
                c.diameter_km
            ))
        );
        out.push(c);
    }
    Ok(out)
}

pub fn read_pixel_catalogue(path: &Path) -> Result<Vec<Crater>> {
    let (mut rdr, headers) = open_csv(path)?;
    let col = |name: &str| headers.iter().position(|h| h == name);
    enum Layout {
        Pycda(usize, usize, usize),
        Nac(usize, usize, usize, usize, usize),
        Detections(Option<usize>, usize, usize, usize),
    }
    let layout = match (col("long"), col("lat"), col("diameter"), col("c_x"), col("cy").or(col("c_y")), col("w"), col("h"), col("id")) {
        (Some(x), Some(y), Some(d), ..) => Layout::Pycda(x, y, d),
        (_, _, _, Some(cx), Some(cy), Some(w), Some(h), Some(id)) => Layout::Nac(id, cx, cy, w, h),
        _ => match (col("x"), col("y"), col("diameter_px")) {
            (Some(x), Some(y), Some(d)) => Layout::Detections(col("id"), x, y, d),
            _ => return Err(Error::Invalid(format!(
                "{}: unknown crater list; expected columns long,lat,diameter (pycda, pixels), ID,X,Y,W,H,C_X,CY (NAC) or x,y,diameter_px (craterdex detect); found {headers:?}",
                path.display()
            ))),
        },
    };
    // craterdex detect's list of several images cannot be one tile's
    let mut images = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let rec = rec.or_invalid_with(|| format!("{}: line {}", path.display(), i + 2))?;
        let num = |c: usize| number(path, &rec, i + 2, c);
        out.push(match layout {
            Layout::Pycda(x, y, d) => Crater {
                id: format!("{i:05}"),
                x: num(x)?,
                y: num(y)?,
                diameter: num(d)?,
            },
            Layout::Nac(id, cx, cy, w, h) => Crater {
                id: rec.get(id).unwrap_or_default().to_string(),
                x: num(cx)?,
                y: num(cy)?,
                diameter: (num(w)? + num(h)?) / 2.0,
            },
            Layout::Detections(id, x, y, d) => {
                if let Some(image) = col("image").and_then(|c| rec.get(c)) {
                    images.insert(image.to_string());
                }
                Crater {
                    id: id
                        .and_then(|c| rec.get(c))
                        .map_or_else(|| format!("{i:05}"), String::from),
                    x: num(x)?,
                    y: num(y)?,
                    diameter: num(d)?,
                }
            }
        });
    }
    ensure!(
        images.len() <= 1,
        Error::Invalid(format!(
            "{}: the craters of {} images ({}); a tile's list holds one image's (run craterdex detect on that image alone)",
            path.display(),
            images.len(),
            images.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
        ))
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_formats_and_rejects_others() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.csv");
        std::fs::write(&p, "long,lat,diameter\n10.5,20,8\n").unwrap();
        assert_eq!(
            read_pixel_catalogue(&p).unwrap(),
            vec![Crater {
                id: "00000".into(),
                x: 10.5,
                y: 20.0,
                diameter: 8.0
            }]
        );
        std::fs::write(&p, "ID\tX\tY\tW\tH\tC_X\tCY\n7\t1\t2\t10\t12\t6\t8\n").unwrap();
        assert_eq!(
            read_pixel_catalogue(&p).unwrap(),
            vec![Crater {
                id: "7".into(),
                x: 6.0,
                y: 8.0,
                diameter: 11.0
            }]
        );
        std::fs::write(
            &p,
            "id,image,source,x,y,diameter_px,score,scale\nnew-00000,new.png,new,4.5,6,12,0.9,1\n",
        )
        .unwrap();
        assert_eq!(
            read_pixel_catalogue(&p).unwrap(),
            vec![Crater {
                id: "new-00000".into(),
                x: 4.5,
                y: 6.0,
                diameter: 12.0
            }]
        );
        std::fs::write(
            &p,
            "id,image,x,y,diameter_px\na-1,a.png,1,2,9\nb-1,b.png,1,2,9\n",
        )
        .unwrap();
        let err = format!("{:#}", read_pixel_catalogue(&p).unwrap_err());
        assert!(err.contains("2 images") && err.contains("a.png"), "{err}");
        std::fs::write(&p, "a,b\n1,2\n").unwrap();
        assert!(
            format!("{:#}", read_pixel_catalogue(&p).unwrap_err()).contains("unknown crater list")
        );
        std::fs::write(&p, "long,lat,diameter\n1,x,3\n").unwrap();
        assert!(format!("{:#}", read_pixel_catalogue(&p).unwrap_err()).contains("line 2"));
    }

    #[test]
    fn reads_robbins_and_plain_geo_catalogues() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("r.csv");
        std::fs::write(
            &p,
            "CRATER_ID,LAT_CIRC_IMG,LON_CIRC_IMG,DIAM_CIRC_IMG,DEPTH\n02-000001,-12.5,350.25,3.2,0.1\n",
        )
        .unwrap();
        let want = GeoCrater {
            id: "02-000001".into(),
            lat: -12.5,
            lon: 350.25,
            diameter_km: 3.2,
        };
        assert_eq!(read_geo_catalogue(&p).unwrap(), vec![want]);
        std::fs::write(&p, "lat\tlon\tdiameter_km\n1\t2\t3\n").unwrap();
        assert_eq!(read_geo_catalogue(&p).unwrap()[0].id, "000000");
        std::fs::write(&p, "lat,lon,diameter\n1,2,3\n").unwrap();
        let e = format!("{:#}", read_geo_catalogue(&p).unwrap_err());
        assert!(e.contains("diameter_km") && e.contains("r.csv"), "{e}");
        std::fs::write(&p, "lat,lon,diameter_km\n95,2,3\n").unwrap();
        assert!(format!("{:#}", read_geo_catalogue(&p).unwrap_err()).contains("line 2"));
    }
}
