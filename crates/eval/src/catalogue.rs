//! Crater lists in image pixels.
//!
//! Formats, recognised by their header: pycda (`long,lat,diameter`, all in pixels: x, y,
//! diameter) and the LRO NAC lists (`ID,X,Y,W,H,C_X,CY`: box and centre; diameter is the
//! mean of W and H). Comma or tab separated.

use anyhow::{bail, Context, Result};
use std::path::Path;

#[derive(Clone, Debug, PartialEq)]
pub struct Crater {
    pub id: String,
    pub x: f64,
    pub y: f64,
    pub diameter: f64,
}

pub fn read_pixel_catalogue(path: &Path) -> Result<Vec<Crater>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let first = text.lines().next().unwrap_or_default();
    let delim = if first.contains('\t') { b'\t' } else { b',' };
    let mut rdr = csv::ReaderBuilder::new()
        .delimiter(delim)
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let headers: Vec<String> = rdr
        .headers()
        .with_context(|| format!("{}: no header line", path.display()))?
        .iter()
        .map(|h| h.to_ascii_lowercase())
        .collect();
    let col = |name: &str| headers.iter().position(|h| h == name);
    enum Layout {
        Pycda(usize, usize, usize),
        Nac(usize, usize, usize, usize, usize),
    }
    let layout = match (col("long"), col("lat"), col("diameter"), col("c_x"), col("cy").or(col("c_y")), col("w"), col("h"), col("id")) {
        (Some(x), Some(y), Some(d), ..) => Layout::Pycda(x, y, d),
        (_, _, _, Some(cx), Some(cy), Some(w), Some(h), Some(id)) => Layout::Nac(id, cx, cy, w, h),
        _ => bail!("{}: unknown crater list; expected columns long,lat,diameter (pycda, pixels) or ID,X,Y,W,H,C_X,CY (NAC); found {headers:?}", path.display()),
    };
    let mut out = Vec::new();
    for (i, rec) in rdr.records().enumerate() {
        let rec = rec.with_context(|| format!("{}: line {}", path.display(), i + 2))?;
        let num = |c: usize| -> Result<f64> {
            let s = rec.get(c).unwrap_or_default();
            s.parse::<f64>().with_context(|| {
                format!("{}: line {}: {s:?} is not a number", path.display(), i + 2)
            })
        };
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
        });
    }
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
        std::fs::write(&p, "a,b\n1,2\n").unwrap();
        assert!(
            format!("{:#}", read_pixel_catalogue(&p).unwrap_err()).contains("unknown crater list")
        );
        std::fs::write(&p, "long,lat,diameter\n1,x,3\n").unwrap();
        assert!(format!("{:#}", read_pixel_catalogue(&p).unwrap_err()).contains("line 2"));
    }
}
