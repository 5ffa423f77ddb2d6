//! The tables scientists open: CSV for spreadsheets and pandas, GeoJSON points for QGIS.

use crate::dedup::DedupGroup;
use crate::link::LinkRow;
use anyhow::{Context, Result};
use craterdex_index::ImageMeta;
use serde_json::{json, Value};
use std::path::Path;

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|x| x.to_string()).unwrap_or_default()
}

fn write_csv(path: &Path, header: &[&str], rows: Vec<Vec<String>>) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(header)?;
    for r in rows {
        w.write_record(r)?;
    }
    let bytes = w.into_inner().context("csv buffer")?;
    craterdex_durable::write_atomic(path, &bytes)
}

/// A GeoJSON point feature (null geometry where the entry has no position).
fn feature(meta: &ImageMeta, properties: Value) -> Value {
    let geometry = match (meta.lon, meta.lat) {
        (Some(lon), Some(lat)) => json!({"type": "Point", "coordinates": [lon, lat]}),
        _ => Value::Null,
    };
    json!({"type": "Feature", "geometry": geometry, "properties": properties})
}

fn write_geojson(path: &Path, features: Vec<Value>) -> Result<()> {
    let doc = json!({"type": "FeatureCollection", "features": features});
    craterdex_durable::write_atomic(path, &serde_json::to_vec_pretty(&doc)?)
}

const LINK_HEADER: [&str; 16] = [
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
    "path",
];

/// `links.csv` and `links.geojson` in `dir`.
pub fn write_links(dir: &Path, rows: &[LinkRow]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
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
                opt(r.query.path.as_ref()),
            ]
        })
        .collect();
    write_csv(&dir.join("links.csv"), &LINK_HEADER, table)?;
    let features = rows
        .iter()
        .map(|r| {
            feature(
                &r.query,
                json!({
                    "query": r.query.id,
                    "decision": r.decision.name(),
                    "confidence": r.confidence,
                    "best_id": r.best.as_ref().map(|b| &b.id),
                    "score": r.best.as_ref().map(|b| b.score),
                    "offset_radii": r.best.as_ref().and_then(|b| b.offset_radii),
                    "inserted": r.inserted,
                }),
            )
        })
        .collect();
    write_geojson(&dir.join("links.geojson"), features)
}

/// `groups.csv` (one row per member of a group), `merged.csv` and `merged.geojson` (the
/// merged catalogue: every surviving entry of a group, listing the ids it absorbs, and
/// every entry of `live` in no group) in `dir`.
pub fn write_dedup(dir: &Path, groups: &[DedupGroup], live: &[ImageMeta]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut members = Vec::new();
    let mut merged = Vec::new();
    let mut features = Vec::new();
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
        features.push(feature(
            keep,
            json!({"group": g, "id": keep.id, "members": group.members.len(), "absorbs": absorbed}),
        ));
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
        features.push(feature(m, json!({"id": m.id, "members": 1})));
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
    write_geojson(&dir.join("merged.geojson"), features)
}
