//! The tables scientists open: CSV for spreadsheets and pandas; map layers for QGIS:
//! GeoJSON points (and rim polygons on request) on the body's IAU coordinate system, each
//! with its QGIS style beside it, and with GDAL (feature `gdal`) one GeoPackage of them all.

use crate::dedup::DedupGroup;
use crate::error::Result;
use crate::link::LinkRow;
use crate::register::SourceRegistration;
use crate::{geometry, style};
use craterdex_errors::{IoContext, OrInvalid};
use craterdex_index::ImageMeta;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|x| x.to_string()).unwrap_or_default()
}

fn write_csv(path: &Path, header: &[&str], rows: Vec<Vec<String>>) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(header)?;
    for r in rows {
        w.write_record(r)?;
    }
    let bytes = w.into_inner().or_invalid("csv buffer")?;
    Ok(craterdex_durable::write_atomic(path, &bytes)?)
}

/// A GeoJSON point feature (null geometry where the entry has no position).
fn feature(meta: &ImageMeta, properties: Value) -> Value {
    let geometry = match (meta.lon, meta.lat) {
        (Some(lon), Some(lat)) => json!({"type": "Point", "coordinates": [lon, lat]}),
        _ => Value::Null,
    };
    json!({"type": "Feature", "geometry": geometry, "properties": properties})
}

/// How a workflow's map layers are written.
#[derive(Clone, Copy, Debug)]
pub struct MapLayers {
    /// The sphere positions are on (the link rule's `body_radius_km`).
    pub body_radius_km: f64,
    /// Also each crater's rim as a polygon (`*_rims.geojson`), where it has a size in km.
    pub rims: bool,
}

/// Vertices of a rim polygon: a 1 km crater and a 100 km one both look round.
const RIM_VERTICES: usize = 64;

/// One map layer: its features as points, and the rims of those with a size in km.
struct Layer {
    name: &'static str,
    attribute: &'static str,
    categories: &'static [style::Category],
    points: Vec<Value>,
    rims: Vec<Value>,
}

impl Layer {
    fn new(
        name: &'static str,
        attribute: &'static str,
        categories: &'static [style::Category],
    ) -> Self {
        Layer {
            name,
            attribute,
            categories,
            points: Vec::new(),
            rims: Vec::new(),
        }
    }

    fn push(&mut self, meta: &ImageMeta, properties: Value, map: &MapLayers) {
        if map.rims {
            let ring = match (meta.lat, meta.lon, meta.diameter_km) {
                (Some(lat), Some(lon), Some(d)) => {
                    geometry::rim_ring(lat, lon, d, map.body_radius_km, RIM_VERTICES)
                }
                _ => None,
            };
            if let Some(ring) = ring {
                self.rims.push(json!({
                    "type": "Feature",
                    "geometry": {"type": "Polygon", "coordinates": [ring]},
                    "properties": properties.clone(),
                }));
            }
        }
        self.points.push(feature(meta, properties));
    }

    /// `NAME.geojson` and `NAME.qml` (and `NAME_rims.*`) in `dir`, then with GDAL
    /// `NAME.gpkg` holding them as layers with their styles; returns the files written.
    fn write(self, dir: &Path, map: &MapLayers) -> Result<Vec<PathBuf>> {
        let mut layers = Vec::new();
        let mut files = Vec::new();
        let mut layer = |name: String, features: Vec<Value>, shape: style::Shape| -> Result<()> {
            let qml = style::categorized(self.attribute, self.categories, shape);
            let (path, qml_path) = (
                dir.join(format!("{name}.geojson")),
                dir.join(format!("{name}.qml")),
            );
            write_geojson(&path, features, Some(map.body_radius_km))?;
            craterdex_durable::write_atomic(&qml_path, qml.as_bytes())?;
            files.extend([path.clone(), qml_path]);
            layers.push((name, path, qml));
            Ok(())
        };
        layer(self.name.to_string(), self.points, style::Shape::Points)?;
        if map.rims {
            layer(format!("{}_rims", self.name), self.rims, style::Shape::Rims)?;
        }
        #[cfg(feature = "gdal")]
        {
            let gpkg = dir.join(format!("{}.gpkg", self.name));
            crate::gpkg::write(&gpkg, &layers)?;
            files.push(gpkg);
        }
        #[cfg(not(feature = "gdal"))]
        let _ = layers;
        Ok(files)
    }
}

/// A GeoJSON feature collection at `path`. Positions on a body of `body_radius_km` declare
/// its coordinate system (the IAU 2015 code, where PROJ knows the body) in the `crs` member
/// GDAL and QGIS read, and the sphere radius craterdex measured distances on.
fn write_geojson(path: &Path, features: Vec<Value>, body_radius_km: Option<f64>) -> Result<()> {
    let mut doc = json!({"type": "FeatureCollection", "features": features});
    if let Some(r) = body_radius_km {
        if let Some(code) = crate::geometry::iau_crs(r) {
            doc["crs"] = json!({"type": "name", "properties": {"name": code}});
        }
        doc["craterdex"] = json!({"sphere_radius_km": r});
    }
    Ok(craterdex_durable::write_atomic(
        path,
        &serde_json::to_vec_pretty(&doc)?,
    )?)
}

const LINK_HEADER: [&str; 21] = [
    "query",
    "query_crater_id",
    "decision",
    "confidence",
    "best_id",
    "best_crater_id",
    "score",
    "offset_radii",
    "diameter_ratio",
    "second_id",
    "second_score",
    "inserted",
    "lat",
    "lon",
    "diameter_km",
    "x",
    "y",
    "diameter_px",
    "path",
    "source",
    "registered",
];

/// `links.csv` and the `links` map layer (points coloured by decision; rims on request) in
/// `dir`; returns the files written.
pub fn write_links(dir: &Path, rows: &[LinkRow], map: &MapLayers) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).io("create", dir)?;
    let table = rows
        .iter()
        .map(|r| {
            let b = r.best.as_ref();
            vec![
                r.query.id.clone(),
                opt(r.query.crater_id.as_ref()),
                r.decision.name().into(),
                format!("{:.4}", r.confidence),
                opt(b.map(|b| &b.id)),
                opt(b.and_then(|b| b.crater_id.as_ref())),
                opt(b.map(|b| format!("{:.5}", b.score))),
                opt(b.and_then(|b| b.offset_radii).map(|v| format!("{v:.3}"))),
                opt(b.and_then(|b| b.diameter_ratio).map(|v| format!("{v:.3}"))),
                opt(r.second.as_ref().map(|s| &s.id)),
                opt(r.second.as_ref().map(|s| format!("{:.5}", s.score))),
                r.inserted.to_string(),
                opt(r.query.lat),
                opt(r.query.lon),
                opt(r.query.diameter_km),
                opt(r.query.x),
                opt(r.query.y),
                opt(r.query.diameter_px),
                opt(r.query.path.as_ref()),
                opt(r.query.source.as_ref()),
                r.registration
                    .as_ref()
                    .is_some_and(|g| g.registered)
                    .to_string(),
            ]
        })
        .collect();
    let csv = dir.join("links.csv");
    write_csv(&csv, &LINK_HEADER, table)?;
    let mut layer = Layer::new("links", "decision", &style::DECISIONS);
    for r in rows {
        layer.push(
            &r.query,
            json!({
                "query": r.query.id,
                "decision": r.decision.name(),
                "confidence": r.confidence,
                "best_id": r.best.as_ref().map(|b| &b.id),
                "best_crater_id": r.best.as_ref().and_then(|b| b.crater_id.as_ref()),
                "score": r.best.as_ref().map(|b| b.score),
                "offset_radii": r.best.as_ref().and_then(|b| b.offset_radii),
                "diameter_km": r.query.diameter_km,
                "inserted": r.inserted,
            }),
            map,
        );
    }
    Ok([vec![csv], layer.write(dir, map)?].concat())
}

const REGISTRATION_HEADER: [&str; 17] = [
    "source",
    "frame",
    "registered",
    "kind",
    "rotation_deg",
    "scale",
    "shift_x",
    "shift_y",
    "inliers",
    "residual_radii",
    "chance_inliers",
    "false_alarm",
    "entries",
    "catalogue",
    "origin_lat",
    "origin_lon",
    "reason",
];

/// `registrations.csv` and `registrations.json` in `dir`: each source's transform to the
/// catalogue's frame (shift in the frame's unit: pixels, or km on the tangent plane at the
/// origin), its inliers and residual, or why it was not registered.
pub fn write_registrations(dir: &Path, regs: &[Arc<SourceRegistration>]) -> Result<()> {
    std::fs::create_dir_all(dir).io("create", dir)?;
    let table = regs
        .iter()
        .map(|r| {
            let t = r.transform.as_ref();
            vec![
                opt(r.source.as_ref()),
                format!("{:?}", r.frame).to_lowercase(),
                r.registered.to_string(),
                opt(t.map(|t| format!("{:?}", t.kind).to_lowercase())),
                opt(r.rotation_deg.map(|v| format!("{v:.3}"))),
                opt(r.scale.map(|v| format!("{v:.5}"))),
                opt(t.map(|t| format!("{:.4}", t.matrix[2]))),
                opt(t.map(|t| format!("{:.4}", t.matrix[5]))),
                r.inliers.to_string(),
                opt(r.residual_radii.map(|v| format!("{v:.4}"))),
                opt(r.chance_inliers.map(|v| format!("{v:.4}"))),
                opt(r.false_alarm.map(|v| format!("{v:.3e}"))),
                r.entries.to_string(),
                r.catalogue.to_string(),
                opt(r.origin.map(|o| o.0)),
                opt(r.origin.map(|o| o.1)),
                opt(r.reason.as_ref()),
            ]
        })
        .collect();
    write_csv(&dir.join("registrations.csv"), &REGISTRATION_HEADER, table)?;
    let all: Vec<&SourceRegistration> = regs.iter().map(|r| &**r).collect();
    Ok(craterdex_durable::write_atomic(
        &dir.join("registrations.json"),
        &serde_json::to_vec_pretty(&all)?,
    )?)
}

/// Inlier residuals beyond this many radii are drawn at the plot's edge.
const RESIDUAL_PLOT_RADII: f64 = 1.0;

/// An SVG scatter of one registration's inlier residuals (dx, dy in radii of the catalogue
/// crater), with the inlier tolerance (one radius) and the median residual as circles.
fn residual_plot(r: &SourceRegistration) -> String {
    let (size, half) = (160.0, 70.0);
    let k = half / RESIDUAL_PLOT_RADII;
    let c = size / 2.0;
    let mut svg = format!(
        "<svg width=\"{size}\" height=\"{size}\" viewBox=\"0 0 {size} {size}\">\
         <rect width=\"{size}\" height=\"{size}\" fill=\"#fafafa\" stroke=\"#ccc\"/>\
         <line x1=\"{c}\" y1=\"0\" x2=\"{c}\" y2=\"{size}\" stroke=\"#ddd\"/>\
         <line x1=\"0\" y1=\"{c}\" x2=\"{size}\" y2=\"{c}\" stroke=\"#ddd\"/>\
         <circle cx=\"{c}\" cy=\"{c}\" r=\"{half}\" fill=\"none\" stroke=\"#999\" stroke-dasharray=\"3 3\"/>"
    );
    if let Some(m) = r.residual_radii {
        svg.push_str(&format!(
            "<circle cx=\"{c}\" cy=\"{c}\" r=\"{:.1}\" fill=\"none\" stroke=\"#070\"/>",
            (m * k).min(half)
        ));
    }
    for &(dx, dy) in &r.residuals {
        let clamp = |v: f64| v.clamp(-RESIDUAL_PLOT_RADII, RESIDUAL_PLOT_RADII) * k;
        svg.push_str(&format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"1.6\" fill=\"#00a\" fill-opacity=\"0.5\"/>",
            c + clamp(dx),
            c + clamp(dy)
        ));
    }
    svg.push_str("</svg>");
    svg
}

/// The review page's registration section: one line per source and, for each registered
/// one, its residual plot.
fn registration_section(regs: &[Arc<SourceRegistration>]) -> String {
    if regs.is_empty() {
        return String::new();
    }
    let registered = regs.iter().filter(|r| r.registered).count();
    let mut html = format!(
        "<h2>Registration to the catalogue</h2><p>{registered} of {} sources registered by their \
         crater pattern; the others keep their positions as given. Plots: each inlier's offset \
         after the transform, in radii of its catalogue crater (dashed: the one-radius \
         tolerance; green: the median).</p><div>",
        regs.len()
    );
    for r in regs {
        let name = escape(r.source.as_deref().unwrap_or("(no source)"));
        let picture = if r.registered {
            residual_plot(r)
        } else {
            "<div class=\"none\" style=\"width:160px;height:160px;line-height:160px\">not registered</div>".into()
        };
        let body = format!("{picture}<br>{}", escape(&r.summary()));
        html.push_str(&format!(
            "<figure style=\"display:inline-block;width:220px;vertical-align:top;margin:0 12px 12px 0\">\
             <figcaption><b>{name}</b></figcaption>{body}</figure>"
        ));
    }
    html.push_str("</div>");
    html
}

/// `groups.csv` (one row per member of a group), `merged.csv` and `merged.geojson` (the
/// merged catalogue: every surviving entry of a group, listing the ids it absorbs, and
/// every entry of `live` in no group) in `dir`, and the `merged` map layer (coloured by
/// `kind`: group or single); returns the files written.
pub fn write_dedup(
    dir: &Path,
    groups: &[DedupGroup],
    live: &[ImageMeta],
    map: &MapLayers,
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).io("create", dir)?;
    let mut members = Vec::new();
    let mut merged = Vec::new();
    let mut layer = Layer::new("merged", "kind", &style::GROUPS);
    for (g, group) in groups.iter().enumerate() {
        let keep = &group.members[group.survivor];
        let absorbed: Vec<&str> = group
            .members
            .iter()
            .filter(|m| m.id != keep.id)
            .map(|m| m.id.as_str())
            .collect();
        for (i, m) in group.members.iter().enumerate() {
            members.push(vec![
                g.to_string(),
                m.id.clone(),
                opt(m.crater_id.as_ref()),
                opt(m.source.as_ref()),
                (i == group.survivor).to_string(),
                opt(m.lat),
                opt(m.lon),
                opt(m.diameter_km),
            ]);
        }
        merged.push(vec![
            g.to_string(),
            keep.id.clone(),
            opt(keep.crater_id.as_ref()),
            group.members.len().to_string(),
            absorbed.join(" "),
            opt(keep.lat),
            opt(keep.lon),
            opt(keep.diameter_km),
        ]);
        layer.push(
            keep,
            json!({"kind": "group", "group": g, "id": keep.id, "crater_id": keep.crater_id,
                   "members": group.members.len(), "absorbs": absorbed.join(" "),
                   "diameter_km": keep.diameter_km}),
            map,
        );
    }
    let grouped: std::collections::HashSet<&str> = groups
        .iter()
        .flat_map(|g| g.members.iter().map(|m| m.id.as_str()))
        .collect();
    for m in live.iter().filter(|m| !grouped.contains(m.id.as_str())) {
        merged.push(vec![
            String::new(),
            m.id.clone(),
            opt(m.crater_id.as_ref()),
            "1".into(),
            String::new(),
            opt(m.lat),
            opt(m.lon),
            opt(m.diameter_km),
        ]);
        layer.push(
            m,
            json!({"kind": "single", "id": m.id, "crater_id": m.crater_id, "members": 1,
                   "diameter_km": m.diameter_km}),
            map,
        );
    }
    write_csv(
        &dir.join("groups.csv"),
        &[
            "group",
            "id",
            "crater_id",
            "source",
            "survivor",
            "lat",
            "lon",
            "diameter_km",
        ],
        members,
    )?;
    write_csv(
        &dir.join("merged.csv"),
        &[
            "group",
            "id",
            "crater_id",
            "members",
            "absorbs",
            "lat",
            "lon",
            "diameter_km",
        ],
        merged,
    )?;
    let tables = vec![dir.join("groups.csv"), dir.join("merged.csv")];
    Ok([tables, layer.write(dir, map)?].concat())
}

/// An image file as a data URI, its bytes as they are (browsers decode PNG, JPEG, GIF and
/// WebP themselves); None when it cannot be read or is not one of those.
fn data_uri(path: Option<&str>) -> Option<String> {
    use base64::Engine as _;
    let path = path?;
    let ext = Path::new(path).extension()?.to_str()?.to_ascii_lowercase();
    let mime = match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        _ => return None,
    };
    let bytes = std::fs::read(path).ok()?;
    // a review page of crops, not of whole tiles
    if bytes.len() > 2 << 20 {
        return None;
    }
    Some(format!(
        "data:{mime};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    ))
}

/// Text for HTML content and double-quoted attribute values alike.
fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn picture(meta: Option<&ImageMeta>) -> String {
    match meta.and_then(|m| data_uri(m.path.as_deref())) {
        Some(uri) => format!("<img src=\"{uri}\" width=\"128\" height=\"128\">"),
        None => "<div class=\"none\">no image</div>".into(),
    }
}

/// `review.html` in `dir`: the decisions a person should look at, side by side (query,
/// best candidate, best candidate of another crater), ambiguous ones first, then the
/// matches and new craters nearest their thresholds; at most `limit` rows, self-contained.
pub fn write_review(dir: &Path, rows: &[LinkRow], limit: usize) -> Result<()> {
    use crate::link::Decision;
    std::fs::create_dir_all(dir).io("create", dir)?;
    let mut order: Vec<&LinkRow> = rows.iter().collect();
    // ambiguous first; within a kind, the least certain (confidence nearest 0.5) first
    let kind = |r: &LinkRow| match r.decision {
        Decision::Ambiguous => 0,
        Decision::Match => 1,
        Decision::New => 2,
    };
    order.sort_by(|a, b| {
        kind(a).cmp(&kind(b)).then(
            (a.confidence - 0.5)
                .abs()
                .total_cmp(&(b.confidence - 0.5).abs()),
        )
    });
    let mut html = String::from(
        "<!doctype html><meta charset=\"utf-8\"><title>craterdex link review</title>\
         <style>body{font:14px sans-serif;margin:2em}table{border-collapse:collapse}\
         td{border-top:1px solid #ccc;padding:6px;vertical-align:top}\
         .none{width:128px;height:128px;background:#eee;color:#888;text-align:center;line-height:128px}\
         .ambiguous{color:#b60}.match{color:#070}.new{color:#00a}</style>\
         <h1>Link decisions to review</h1>",
    );
    html.push_str(&registration_section(&crate::link::registrations(rows)));
    let counts = crate::calibrate::decision_counts(rows);
    html.push_str(&format!(
        "<p>{} entries: {}. Shown: {} rows, ambiguous first, then the least certain.</p>\
         <table><tr><th>entry</th><th>best candidate</th><th>other crater</th><th>evidence</th></tr>",
        rows.len(),
        counts
            .iter()
            .map(|(d, n)| format!("{n} {}", d.name()))
            .collect::<Vec<_>>()
            .join(", "),
        order.len().min(limit)
    ));
    for r in order.into_iter().take(limit) {
        let b = r.best.as_ref();
        let s = r.second.as_ref();
        let label = |c: Option<&crate::link::Candidate>| {
            c.map(|c| {
                format!(
                    "{}<br>score {:.3}{}",
                    escape(&c.id),
                    c.score,
                    c.offset_radii
                        .map(|o| format!(
                            "<br>offset {o:.2} radii, diameter ratio {:.2}",
                            c.diameter_ratio.unwrap_or(f64::NAN)
                        ))
                        .unwrap_or_default()
                )
            })
            .unwrap_or_else(|| "none".into())
        };
        html.push_str(&format!(
            "<tr><td>{}<br>{}</td><td>{}<br>{}</td><td>{}<br>{}</td>\
             <td class=\"{}\"><b>{}</b><br>confidence {:.3}</td></tr>",
            picture(Some(&r.query)),
            escape(&r.query.id),
            picture(b.map(|c| &c.meta)),
            label(b),
            picture(s.map(|c| &c.meta)),
            label(s),
            r.decision.name(),
            r.decision.name(),
            r.confidence
        ));
    }
    html.push_str("</table>");
    Ok(craterdex_durable::write_atomic(
        &dir.join("review.html"),
        html.as_bytes(),
    )?)
}

/// `ranked.csv` and `ranked.geojson` of a discovery, best first.
pub fn write_discovered(dir: &Path, ranked: &[crate::discover::Discovered]) -> Result<()> {
    std::fs::create_dir_all(dir).io("create", dir)?;
    let rows = ranked
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let m = &d.meta;
            vec![
                (i + 1).to_string(),
                m.id.clone(),
                format!("{:.5}", d.score),
                opt(m.source.as_ref()),
                opt(m.x),
                opt(m.y),
                opt(m.lat),
                opt(m.lon),
                opt(m.path.as_ref()),
            ]
        })
        .collect();
    write_csv(
        &dir.join("ranked.csv"),
        &[
            "rank", "id", "score", "source", "x", "y", "lat", "lon", "path",
        ],
        rows,
    )?;
    let features = ranked
        .iter()
        .enumerate()
        .map(|(i, d)| {
            feature(
                &d.meta,
                json!({"rank": i + 1, "id": d.meta.id, "score": d.score}),
            )
        })
        .collect();
    write_geojson(&dir.join("ranked.geojson"), features, None)
}

/// `review.html` of a dedup: the groups a person should sign off, weakest first (by the
/// least confident pair that joined the group), each member's crop side by side with the
/// proposed survivor marked; at most `limit` groups, self-contained.
pub fn write_dedup_review(
    dir: &Path,
    groups: &[DedupGroup],
    regs: &[Arc<SourceRegistration>],
    limit: usize,
) -> Result<()> {
    std::fs::create_dir_all(dir).io("create", dir)?;
    let weakest = |g: &DedupGroup| g.pairs.iter().map(|p| p.2).fold(f32::INFINITY, f32::min);
    let mut order: Vec<&DedupGroup> = groups.iter().collect();
    order.sort_by(|a, b| weakest(a).total_cmp(&weakest(b)));
    let mut html = format!(
        "<!doctype html><meta charset=\"utf-8\"><title>craterdex dedup review</title>\
         <style>body{{font:14px sans-serif;margin:2em}}.group{{border-top:1px solid #ccc;padding:8px 0}}\
         figure{{display:inline-block;margin:0 8px 0 0;text-align:center}}\
         .keep img{{outline:3px solid #070}}.none{{width:128px;height:128px;background:#eee;\
         color:#888;text-align:center;line-height:128px}}</style>\
         <h1>Duplicate groups to review</h1><p>{} groups; shown: {}, the least certain first. \
         The proposed surviving entry is outlined.</p>",
        groups.len(),
        order.len().min(limit)
    );
    html.push_str(&registration_section(regs));
    for g in order.into_iter().take(limit) {
        let pairs = g
            .pairs
            .iter()
            .map(|(a, b, s)| {
                format!(
                    "{} - {}: {s:.3}",
                    escape(&g.members[*a].id),
                    escape(&g.members[*b].id)
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        html.push_str(&format!(
            "<div class=\"group\"><p>weakest pair confidence {:.3} ({pairs})</p>",
            weakest(g)
        ));
        for (i, m) in g.members.iter().enumerate() {
            html.push_str(&format!(
                "<figure class=\"{}\">{}<figcaption>{}</figcaption></figure>",
                if i == g.survivor { "keep" } else { "" },
                picture(Some(m)),
                escape(&m.id)
            ));
        }
        html.push_str("</div>");
    }
    Ok(craterdex_durable::write_atomic(
        &dir.join("review.html"),
        html.as_bytes(),
    )?)
}
