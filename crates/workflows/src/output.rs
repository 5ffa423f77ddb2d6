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
        let style = |shape| style::categorized(self.attribute, self.categories, shape);
        let mut layers = vec![(
            self.name.to_string(),
            self.points,
            style(style::Shape::Points),
        )];
        if map.rims {
            let rims = style(style::Shape::Rims);
            layers.push((format!("{}_rims", self.name), self.rims, rims));
        }
        write_styled_layers(dir, self.name, layers, map.body_radius_km)
    }
}

/// Each layer (name, features on a body of `body_radius_km`, QGIS style) as `NAME.geojson`
/// with `NAME.qml` beside it in `dir`, then with GDAL `PACKAGE.gpkg` holding them all with
/// their styles; returns the files written.
fn write_styled_layers(
    dir: &Path,
    package: &str,
    layers: Vec<(String, Vec<Value>, String)>,
    body_radius_km: f64,
) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let mut files = Vec::new();
    for (name, features, qml) in layers {
        let (path, qml_path) = (
            dir.join(format!("{name}.geojson")),
            dir.join(format!("{name}.qml")),
        );
        write_geojson(&path, features, Some(body_radius_km))?;
        craterdex_durable::write_atomic(&qml_path, qml.as_bytes())?;
        files.extend([path.clone(), qml_path]);
        written.push((name, path, qml));
    }
    #[cfg(feature = "gdal")]
    {
        let gpkg = dir.join(format!("{package}.gpkg"));
        crate::gpkg::write(&gpkg, &written)?;
        files.push(gpkg);
    }
    #[cfg(not(feature = "gdal"))]
    let _ = (package, written);
    Ok(files)
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

const DETECTION_HEADER: [&str; 11] = [
    "id",
    "image",
    "source",
    "x",
    "y",
    "diameter_px",
    "score",
    "scale",
    "lat",
    "lon",
    "diameter_km",
];

/// Where a crater found in a georeferenced image lies on its body: centre in degrees (the
/// image's own geographic system and longitude convention) and diameter in km.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BodyPlace {
    pub lat: f64,
    pub lon: f64,
    pub diameter_km: f64,
}

/// The craters found in one image, or why there are none to list.
pub struct ImageDetections {
    pub image: PathBuf,
    pub found: std::result::Result<Vec<craterdex_detect::Detection>, String>,
    /// For a georeferenced image: each crater's place on the body, in the order of `found`,
    /// and the body's radius in km.
    pub on_body: Option<(Vec<BodyPlace>, f64)>,
}

/// The id of the `n`th crater found in `source` (detections.csv, crops.csv).
pub fn detection_id(source: &str, n: usize) -> String {
    format!("{source}-{n:05}")
}

/// Each image's name among the sources: its file stem, numbered where two images share one.
pub fn source_names(images: &[PathBuf]) -> Vec<String> {
    let stems: Vec<String> = images
        .iter()
        .map(|p| {
            p.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "image".into())
        })
        .collect();
    stems
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if stems.iter().filter(|t| *t == s).count() > 1 {
                format!("{s}-{i}")
            } else {
                s.clone()
            }
        })
        .collect()
}

/// The radius shared by the bodies of the georeferenced images (each image's path and body
/// radius in km), if any is; images on bodies of different radii cannot share one map layer.
pub fn shared_body_radius<'a>(
    radii: impl IntoIterator<Item = (&'a Path, f64)>,
) -> Result<Option<f64>> {
    let mut radii = radii.into_iter();
    let Some((_, first)) = radii.next() else {
        return Ok(None);
    };
    if let Some((other, _)) = radii.find(|(_, r)| (r - first).abs() > 1e-6 * first) {
        return Err(crate::error::Error::Invalid(format!(
            "{}: on a body of another radius than the other georeferenced images \
             ({first} km): give each body's images a run of their own",
            other.display()
        )));
    }
    Ok(Some(first))
}

/// `detections.csv` (one row per crater found: `id` as `<source>-<n>`, the image, its
/// source name, centre and diameter in its pixels, score, the pyramid scale it was found
/// at, and for a georeferenced image latitude, longitude and diameter in km),
/// `detections.geojson` (each crater's rim as a polygon in the image's pixel frame as QGIS
/// shows an image without georeferencing: x right, y up from the top edge, so y is minus
/// the row), `detections_lonlat.geojson` where any image is georeferenced (those images'
/// rims in longitude and latitude, declaring the body's coordinate system, with its QGIS
/// style `detections_lonlat.qml`, and with GDAL `detections.gpkg` holding it) and `images.csv`
/// (per image: its source name, `found`, `none` or `failed`, the craters found, and why it
/// failed) in `dir`. Returns the files written.
pub fn write_detections(dir: &Path, per_image: &[ImageDetections]) -> Result<Vec<PathBuf>> {
    let body_radius_km = shared_body_radius(
        per_image
            .iter()
            .filter_map(|d| Some((d.image.as_path(), d.on_body.as_ref()?.1))),
    )?;
    craterdex_durable::create_dir_all(dir)?;
    let images: Vec<PathBuf> = per_image.iter().map(|d| d.image.clone()).collect();
    let sources = source_names(&images);
    let mut rows = Vec::new();
    let (mut features, mut body_features) = (Vec::new(), Vec::new());
    let mut statuses = Vec::new();
    for (d, source) in per_image.iter().zip(&sources) {
        let image = d.image.display().to_string();
        let (status, count, why) = match &d.found {
            Ok(found) if found.is_empty() => ("none", 0, String::new()),
            Ok(found) => ("found", found.len(), String::new()),
            Err(e) => ("failed", 0, e.clone()),
        };
        statuses.push(vec![
            image.clone(),
            source.clone(),
            status.to_string(),
            count.to_string(),
            why,
        ]);
        let Ok(found) = &d.found else { continue };
        for (n, c) in found.iter().enumerate() {
            let id = detection_id(source, n);
            let place = d.on_body.as_ref().and_then(|(p, _)| p.get(n));
            rows.push(vec![
                id.clone(),
                image.clone(),
                source.clone(),
                format!("{:.2}", c.x),
                format!("{:.2}", c.y),
                format!("{:.2}", c.diameter),
                format!("{:.4}", c.score),
                c.scale.to_string(),
                opt(place.map(|p| format!("{:.6}", p.lat))),
                opt(place.map(|p| format!("{:.6}", p.lon))),
                opt(place.map(|p| format!("{:.4}", p.diameter_km))),
            ]);
            let mut properties = json!({
                "id": id, "image": image, "source": source,
                "x": c.x, "y": c.y, "diameter_px": c.diameter, "score": c.score,
            });
            if let Some(p) = place {
                properties["lat"] = json!(p.lat);
                properties["lon"] = json!(p.lon);
                properties["diameter_km"] = json!(p.diameter_km);
            }
            let ring: Vec<[f64; 2]> = (0..=RIM_VERTICES)
                .map(|k| {
                    let a = std::f64::consts::TAU * k as f64 / RIM_VERTICES as f64;
                    let r = c.diameter / 2.0;
                    // pixel centres at +0.5: QGIS puts the image's corner at (0, 0)
                    [c.x + 0.5 + r * a.cos(), -(c.y + 0.5 + r * a.sin())]
                })
                .collect();
            features.push(json!({
                "type": "Feature",
                "geometry": {"type": "Polygon", "coordinates": [ring]},
                "properties": properties.clone(),
            }));
            let on_body = place.zip(body_radius_km).and_then(|(p, radius)| {
                geometry::rim_ring(p.lat, p.lon, p.diameter_km, radius, RIM_VERTICES)
            });
            if let Some(ring) = on_body {
                body_features.push(json!({
                    "type": "Feature",
                    "geometry": {"type": "Polygon", "coordinates": [ring]},
                    "properties": properties,
                }));
            }
        }
    }
    let (csv_path, geojson) = (dir.join("detections.csv"), dir.join("detections.geojson"));
    let images_path = dir.join("images.csv");
    write_csv(&csv_path, &DETECTION_HEADER, rows)?;
    write_geojson(&geojson, features, None)?;
    write_csv(
        &images_path,
        &["image", "source", "status", "craters", "reason"],
        statuses,
    )?;
    let mut files = vec![csv_path, geojson, images_path];
    if let Some(radius) = body_radius_km {
        let qml = style::single(style::DETECTED, style::Shape::Rims);
        let layer = ("detections_lonlat".to_string(), body_features, qml);
        files.extend(write_styled_layers(dir, "detections", vec![layer], radius)?);
    }
    Ok(files)
}

/// The columns of `links.csv` of `link --image`, and of Python's `Index.link_images`: the
/// fields of [`ImageCraterRecord`], in order.
pub const IMAGE_LINK_HEADER: [&str; 22] = [
    "image",
    "id",
    "x",
    "y",
    "diameter_px",
    "found_by",
    "detector_score",
    "decision",
    "confidence",
    "catalogue_id",
    "catalogue_crater_id",
    "score",
    "offset_radii",
    "diameter_ratio",
    "catalogue_x",
    "catalogue_y",
    "catalogue_diameter_px",
    "second_id",
    "second_score",
    "lat",
    "lon",
    "diameter_km",
];

/// One crater of a new image as `links.csv` and Python's `Index.link_images` give it: where it
/// is in its image, how it was found, the decision and the catalogue crater (its position in
/// the catalogue where it was matched), and in a georeferenced image where it lies on the body.
#[derive(Debug, PartialEq, serde::Serialize)]
pub struct ImageCraterRecord<'a> {
    pub image: &'a str,
    pub id: &'a str,
    pub x: f64,
    pub y: f64,
    pub diameter_px: f64,
    pub found_by: &'static str,
    pub detector_score: Option<f32>,
    pub decision: &'static str,
    pub confidence: f64,
    pub catalogue_id: Option<&'a str>,
    pub catalogue_crater_id: Option<&'a str>,
    pub score: Option<f32>,
    pub offset_radii: Option<f64>,
    pub diameter_ratio: Option<f64>,
    pub catalogue_x: Option<f64>,
    pub catalogue_y: Option<f64>,
    pub catalogue_diameter_px: Option<f64>,
    pub second_id: Option<&'a str>,
    pub second_score: Option<f32>,
    pub lat: Option<f64>,
    pub lon: Option<f64>,
    pub diameter_km: Option<f64>,
}

impl<'a> ImageCraterRecord<'a> {
    pub fn of(c: &'a crate::images::ImageCrater) -> Self {
        let (b, s) = (c.link.best.as_ref(), c.link.second.as_ref());
        let matched = b
            .filter(|_| c.decision == crate::images::ImageDecision::Match)
            .map(|b| &b.meta);
        ImageCraterRecord {
            image: &c.image,
            id: &c.link.query.id,
            x: c.x,
            y: c.y,
            diameter_px: c.diameter_px,
            found_by: c.found_by.name(),
            detector_score: c.detector_score,
            decision: c.decision.name(),
            confidence: c.link.confidence,
            catalogue_id: b.map(|b| b.id.as_str()),
            catalogue_crater_id: b.and_then(|b| b.crater_id.as_deref()),
            score: b.map(|b| b.score),
            offset_radii: b.and_then(|b| b.offset_radii),
            diameter_ratio: b.and_then(|b| b.diameter_ratio),
            catalogue_x: matched.and_then(|m| m.x),
            catalogue_y: matched.and_then(|m| m.y),
            catalogue_diameter_px: matched.and_then(|m| m.diameter_px),
            second_id: s.map(|s| s.id.as_str()),
            second_score: s.map(|s| s.score),
            lat: None,
            lon: None,
            diameter_km: None,
        }
    }

    /// The record of a crater that lies at `place` on the body.
    pub fn on_body(self, place: Option<&BodyPlace>) -> Self {
        ImageCraterRecord {
            lat: place.map(|p| p.lat),
            lon: place.map(|p| p.lon),
            diameter_km: place.map(|p| p.diameter_km),
            ..self
        }
    }

    /// Its `links.csv` row, column by column as [`IMAGE_LINK_HEADER`] names them.
    fn csv_row(&self) -> Vec<String> {
        let f = |v: f64| format!("{v:.2}");
        vec![
            self.image.to_string(),
            self.id.to_string(),
            f(self.x),
            f(self.y),
            f(self.diameter_px),
            self.found_by.into(),
            opt(self.detector_score.map(|v| format!("{v:.4}"))),
            self.decision.into(),
            format!("{:.4}", self.confidence),
            opt(self.catalogue_id),
            opt(self.catalogue_crater_id),
            opt(self.score.map(|v| format!("{v:.5}"))),
            opt(self.offset_radii.map(|v| format!("{v:.3}"))),
            opt(self.diameter_ratio.map(|v| format!("{v:.3}"))),
            opt(self.catalogue_x.map(f)),
            opt(self.catalogue_y.map(f)),
            opt(self.catalogue_diameter_px.map(f)),
            opt(self.second_id),
            opt(self.second_score.map(|v| format!("{v:.5}"))),
            opt(self.lat.map(|v| format!("{v:.6}"))),
            opt(self.lon.map(|v| format!("{v:.6}"))),
            opt(self.diameter_km.map(|v| format!("{v:.4}"))),
        ]
    }
}

const IMAGE_SUMMARY_HEADER: [&str; 11] = [
    "image",
    "width",
    "height",
    "detections",
    "looked_for",
    "matched",
    "new",
    "registered",
    "rotation_deg",
    "scale",
    "note",
];

/// Where the craters of georeferenced new images lie on their body: one place per crater of
/// [`crate::images::ImageLinks::craters`], in order (none for the craters of images without
/// georeferencing), and the body's radius in km.
pub struct CratersOnBody {
    pub places: Vec<Option<BodyPlace>>,
    pub body_radius_km: f64,
}

/// `links.csv` of `link --image` (one row per crater looked at: where it is in its image,
/// how it was found, the decision and the catalogue crater, and with `on_body` its latitude,
/// longitude and diameter in km) and `images.csv` (one row per image: what was found, its
/// registration, and why its results are weaker where they are) in `dir`. With `on_body`,
/// also the `links` map layer of the craters placed on the body (centres and rims coloured
/// by decision, on the body's coordinate system; with GDAL a GeoPackage of both). Returns
/// the files written.
pub fn write_image_links(
    dir: &Path,
    links: &crate::images::ImageLinks,
    on_body: Option<&CratersOnBody>,
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).io("create", dir)?;
    let place = |i: usize| on_body.and_then(|b| b.places.get(i)?.as_ref());
    let table = links
        .craters
        .iter()
        .enumerate()
        .map(|(i, c)| ImageCraterRecord::of(c).on_body(place(i)).csv_row())
        .collect();
    let csv = dir.join("links.csv");
    write_csv(&csv, &IMAGE_LINK_HEADER, table)?;
    let summaries = links
        .images
        .iter()
        .map(|s| {
            let r = s.registration.as_ref();
            vec![
                s.image.clone(),
                s.width.to_string(),
                s.height.to_string(),
                s.detections.to_string(),
                s.looked_for.to_string(),
                s.matched.to_string(),
                s.new.to_string(),
                r.is_some_and(|r| r.registered).to_string(),
                opt(r.and_then(|r| r.rotation_deg).map(|v| format!("{v:.2}"))),
                opt(r.and_then(|r| r.scale).map(|v| format!("{v:.4}"))),
                opt(s.note.as_ref()),
            ]
        })
        .collect();
    let images = dir.join("images.csv");
    write_csv(&images, &IMAGE_SUMMARY_HEADER, summaries)?;
    let mut files = vec![csv, images];
    if let Some(b) = on_body {
        let map = MapLayers {
            body_radius_km: b.body_radius_km,
            rims: true,
        };
        let mut layer = Layer::new("links", "decision", &style::IMAGE_DECISIONS);
        for (i, c) in links.craters.iter().enumerate() {
            let Some(p) = place(i) else { continue };
            let r = ImageCraterRecord::of(c).on_body(Some(p));
            let meta = ImageMeta {
                id: r.id.to_string(),
                lat: Some(p.lat),
                lon: Some(p.lon),
                diameter_km: Some(p.diameter_km),
                ..Default::default()
            };
            layer.push(&meta, serde_json::to_value(&r)?, &map);
        }
        files.extend(layer.write(dir, &map)?);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_crater_record_has_the_columns_of_links_csv_in_order() {
        let record = ImageCraterRecord {
            image: "new.png",
            id: "new.png#3",
            x: 10.0,
            y: 20.0,
            diameter_px: 30.0,
            found_by: "detector",
            detector_score: Some(0.9),
            decision: "match",
            confidence: 0.99,
            catalogue_id: Some("c1"),
            catalogue_crater_id: Some("crater1"),
            score: Some(0.8),
            offset_radii: Some(0.1),
            diameter_ratio: Some(1.1),
            catalogue_x: Some(1.0),
            catalogue_y: Some(2.0),
            catalogue_diameter_px: Some(3.0),
            second_id: Some("c2"),
            second_score: Some(0.5),
            lat: Some(-4.5),
            lon: Some(137.25),
            diameter_km: Some(1.5),
        };
        // serialised as written (Python reads the columns in this order)
        let text = serde_json::to_string(&record).unwrap();
        let at: Vec<usize> = IMAGE_LINK_HEADER
            .iter()
            .map(|k| text.find(&format!("\"{k}\":")).unwrap())
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{text}");
        let fields = serde_json::from_str::<Value>(&text).unwrap();
        assert_eq!(fields.as_object().unwrap().len(), IMAGE_LINK_HEADER.len());
        let row = record.csv_row();
        assert_eq!(row.len(), IMAGE_LINK_HEADER.len());
        assert_eq!(
            (row[2].as_str(), row[10].as_str(), row[18].as_str()),
            ("10.00", "crater1", "0.50000")
        );
        assert_eq!(&row[19..], ["-4.500000", "137.250000", "1.5000"]);
    }
}
