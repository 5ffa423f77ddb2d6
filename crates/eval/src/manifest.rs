//! CraterBench-R manifests (docs/formats.md).
//!
//! `{"split_name", "version", "gallery_images": [{"image_id", "path", "crater_id",
//! "view_type"}], "query_images": [... same shape, optional "relevant_crater_ids"]}`.
//! Paths are relative to the dataset root (the manifest's folder, or its parent when the
//! manifest sits in `splits/`). Relevance per query: its `relevant_crater_ids`, else
//! `metadata/query_relevance.json`, else its own crater id.

use crate::error::{Error, Result};
use craterdex_engine::{Entries, LearnFrom};
use craterdex_errors::{ensure, IoContext, OrInvalid};
use craterdex_index::ImageMeta;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub image_id: String,
    pub path: String,
    /// Required of a benchmark's entries ([`load`]); a new observation's entries to link
    /// have none ([`load_entries`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crater_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relevant_crater_ids: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lat: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lon: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diameter_km: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    #[serde(default)]
    pub split_name: String,
    #[serde(default)]
    pub version: String,
    pub gallery_images: Vec<Entry>,
    #[serde(default)]
    pub query_images: Vec<Entry>,
}

/// A loaded benchmark: entries, the root their paths are relative to, and the relevant
/// crater ids of every query.
#[derive(Clone, Debug)]
pub struct Benchmark {
    pub root: PathBuf,
    pub manifest: Manifest,
    pub relevance: Vec<BTreeSet<String>>,
}

/// Where each image id sits in a list of entries.
pub fn positions(entries: &[Entry]) -> std::collections::HashMap<&str, usize> {
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| (e.image_id.as_str(), i))
        .collect()
}

impl Entry {
    /// The crater id; empty when the entry has none (never in a [`load`]ed benchmark).
    pub fn crater(&self) -> &str {
        self.crater_id.as_deref().unwrap_or_default()
    }
}

impl Benchmark {
    pub fn gallery_path(&self, i: usize) -> PathBuf {
        self.root.join(&self.manifest.gallery_images[i].path)
    }
    pub fn query_path(&self, i: usize) -> PathBuf {
        self.root.join(&self.manifest.query_images[i].path)
    }
    /// Crater ids that are relevant to at least one query.
    pub fn query_crater_ids(&self) -> BTreeSet<String> {
        self.relevance.iter().flatten().cloned().collect()
    }

    /// `(image id, path)` of every gallery image.
    pub fn gallery_items(&self) -> Vec<(String, PathBuf)> {
        (0..self.manifest.gallery_images.len())
            .map(|i| {
                (
                    self.manifest.gallery_images[i].image_id.clone(),
                    self.gallery_path(i),
                )
            })
            .collect()
    }

    /// `(image id, path)` of every query image.
    pub fn query_items(&self) -> Vec<(String, PathBuf)> {
        (0..self.manifest.query_images.len())
            .map(|i| {
                (
                    self.manifest.query_images[i].image_id.clone(),
                    self.query_path(i),
                )
            })
            .collect()
    }

    /// Index metadata of the gallery images with these ids (in this order).
    pub fn gallery_metas(&self, ids: &[String]) -> Vec<ImageMeta> {
        self.metas(&self.manifest.gallery_images, ids, |i| self.gallery_path(i))
    }

    /// Metadata of the query images with these ids (in this order), as entries to link.
    pub fn query_metas(&self, ids: &[String]) -> Vec<ImageMeta> {
        self.metas(&self.manifest.query_images, ids, |i| self.query_path(i))
    }

    fn metas(
        &self,
        entries: &[Entry],
        ids: &[String],
        path: impl Fn(usize) -> PathBuf,
    ) -> Vec<ImageMeta> {
        let by_id = positions(entries);
        ids.iter()
            .map(|id| {
                let i = by_id[id.as_str()];
                let e = &entries[i];
                ImageMeta {
                    id: id.clone(),
                    crater_id: e.crater_id.clone(),
                    source: Some(e.path.clone()),
                    view: e.view_type.clone(),
                    lat: e.lat,
                    lon: e.lon,
                    diameter_km: e.diameter_km,
                    x: None,
                    y: None,
                    diameter_px: None,
                    path: Some(path(i).display().to_string()),
                }
            })
            .collect()
    }

    /// Positions in `gallery_ids` of the images whose crater no query finds relevant: the
    /// only ones an index built from this benchmark, or its evaluation, learns whitening
    /// from (unsupervised, but never from the craters being looked for).
    /// The gallery as the entries of a new index. Whitening and codec learn from the images
    /// of craters that no query looks for, as evaluation does, so that searching the
    /// manifest's queries measures what `eval` reports (without queries: the usual sample).
    pub fn gallery_entries(&self) -> Entries {
        let items = self.gallery_items();
        let ids: Vec<String> = items.iter().map(|(id, _)| id.clone()).collect();
        let learn = if self.manifest.query_images.is_empty() {
            LearnFrom::Sample
        } else {
            let rows = self.unqueried_gallery_rows(&ids);
            LearnFrom::Ids(rows.into_iter().map(|r| ids[r].clone()).collect())
        };
        Entries {
            metas: self.gallery_metas(&ids),
            items,
            learn,
        }
    }

    pub fn unqueried_gallery_rows(&self, gallery_ids: &[String]) -> Vec<usize> {
        let queried = self.query_crater_ids();
        let by_id = positions(&self.manifest.gallery_images);
        gallery_ids
            .iter()
            .enumerate()
            .filter(|(_, id)| {
                by_id
                    .get(id.as_str())
                    .is_some_and(|&i| !queried.contains(self.manifest.gallery_images[i].crater()))
            })
            .map(|(r, _)| r)
            .collect()
    }
}

/// Benchmark fields in the order of the feature rows actually extracted (an unreadable image
/// drops out of the features, so rows and manifest entries need not line up).
pub struct Aligned {
    pub gallery_craters: Vec<String>,
    pub gallery_paths: Vec<PathBuf>,
    pub query_paths: Vec<PathBuf>,
    pub relevance: Vec<BTreeSet<String>>,
}

impl Benchmark {
    /// Lines the benchmark up with extracted rows; every id must come from this manifest.
    pub fn align(&self, gallery_ids: &[String], query_ids: &[String]) -> Aligned {
        let g = positions(&self.manifest.gallery_images);
        let q = positions(&self.manifest.query_images);
        let gi: Vec<usize> = gallery_ids.iter().map(|id| g[id.as_str()]).collect();
        let qi: Vec<usize> = query_ids.iter().map(|id| q[id.as_str()]).collect();
        Aligned {
            gallery_craters: gi
                .iter()
                .map(|&i| self.manifest.gallery_images[i].crater().to_string())
                .collect(),
            gallery_paths: gi.iter().map(|&i| self.gallery_path(i)).collect(),
            query_paths: qi.iter().map(|&i| self.query_path(i)).collect(),
            relevance: qi.iter().map(|&i| self.relevance[i].clone()).collect(),
        }
    }
}

fn entry_list(v: &serde_json::Value, key: &str, file: &Path) -> Result<Vec<Entry>> {
    let Some(list) = v.get(key) else {
        return Ok(Vec::new());
    };
    let arr = list
        .as_array()
        .or_invalid_with(|| format!("{}: {key:?} is not a list", file.display()))?;
    arr.iter()
        .enumerate()
        .map(|(i, e)| {
            let keys: Vec<&String> = e.as_object().map(|o| o.keys().collect()).unwrap_or_default();
            Ok(serde_json::from_value::<Entry>(e.clone()).or_invalid_with(|| {
                format!(
                    "{}: {key}[{i}] needs image_id and path (strings; crater_id a string where given); found keys {keys:?}",
                    file.display()
                )
            })?)
        })
        .collect()
}

/// Parses `metadata/query_relevance.json` in the shapes we know of: a map from query crater
/// id to a list of ids (or to an object holding one under `filtered`/`relevant`/...), or a
/// list of objects with a query crater id and a list of relevant ids.
fn relevance_file(path: &Path) -> Result<BTreeMap<String, Vec<String>>> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).io("read", path)?)
        .or_invalid_with(|| format!("{} is not JSON", path.display()))?;
    const LIST_KEYS: [&str; 5] = [
        "relevant_crater_ids",
        "filtered",
        "gallery_filtered",
        "relevant",
        "crater_ids",
    ];
    const ID_KEYS: [&str; 3] = ["query_crater_id", "crater_id", "query_id"];
    let ids = |x: &serde_json::Value| -> Option<Vec<String>> {
        let arr = x.as_array().or_else(|| {
            LIST_KEYS
                .iter()
                .find_map(|k| x.get(*k).and_then(|v| v.as_array()))
        })?;
        Some(
            arr.iter()
                .filter_map(|s| {
                    s.as_str()
                        .map(String::from)
                        .or_else(|| s.as_i64().map(|n| n.to_string()))
                })
                .collect(),
        )
    };
    let body = ["filtered", "query_relevance", "relevance"]
        .iter()
        .find_map(|k| v.get(*k))
        .unwrap_or(&v);
    let mut out = BTreeMap::new();
    match body {
        serde_json::Value::Object(map) => {
            for (k, x) in map {
                let list = ids(x).or_invalid_with(|| {
                    format!(
                        "{}: entry {k:?} holds no list of crater ids (looked for {LIST_KEYS:?})",
                        path.display()
                    )
                })?;
                out.insert(k.clone(), list);
            }
        }
        serde_json::Value::Array(arr) => {
            for (i, x) in arr.iter().enumerate() {
                let id = ID_KEYS
                    .iter()
                    .find_map(|k| x.get(*k).and_then(|v| v.as_str()));
                let keys: Vec<String> = x
                    .as_object()
                    .map(|o| o.keys().cloned().collect())
                    .unwrap_or_default();
                match (id, ids(x)) {
                    (Some(id), Some(list)) => {
                        out.insert(id.to_string(), list);
                    }
                    _ => return Err(Error::Invalid(format!(
                        "{}: item {i} needs one of {ID_KEYS:?} and one of {LIST_KEYS:?}; found keys {keys:?}",
                        path.display()
                    ))),
                }
            }
        }
        _ => {
            return Err(crate::Error::Invalid(format!(
                "{}: expected an object or a list",
                path.display()
            )))
        }
    }
    Ok(out)
}

/// Loads a benchmark's manifest: every gallery entry has a crater id, every query a crater
/// id or relevant crater ids. `root` overrides the dataset root. Every missing image is
/// reported together, before anything else happens.
pub fn load(path: &Path, root: Option<&Path>) -> Result<Benchmark> {
    let bench = load_entries(path, root)?;
    let m = &bench.manifest;
    let unlabelled = |list: &[Entry], key: &str, need_relevant: bool| -> Result<()> {
        let bad: Vec<usize> = (0..list.len())
            .filter(|&i| {
                list[i].crater_id.is_none()
                    && !(need_relevant && list[i].relevant_crater_ids.is_some())
            })
            .collect();
        ensure!(
            bad.is_empty(),
            Error::Invalid(format!(
                "{}: {} of the {key} have no crater_id (first: {key}[{}]); a benchmark needs them (entries to link do not)",
                path.display(),
                bad.len(),
                bad.first().copied().unwrap_or_default()
            ))
        );
        Ok(())
    };
    unlabelled(&m.gallery_images, "gallery_images", false)?;
    unlabelled(&m.query_images, "query_images", true)?;
    Ok(bench)
}

/// Loads a manifest's entries, crater ids optional (a new observation has none). `root`
/// overrides the dataset root. Every missing image is reported together, before anything
/// else happens.
pub fn load_entries(path: &Path, root: Option<&Path>) -> Result<Benchmark> {
    let bytes = std::fs::read(path).io("read", path)?;
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .or_invalid_with(|| format!("{} is not JSON", path.display()))?;
    let keys: Vec<String> = v
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    ensure!(
        v.get("gallery_images").is_some(),
        Error::Invalid(format!(
            "{}: expected a CraterBench-R manifest with \"gallery_images\" (and \"query_images\"); found keys {keys:?}",
            path.display()
        ))
    );
    let manifest = Manifest {
        split_name: v
            .get("split_name")
            .and_then(|s| s.as_str())
            .unwrap_or_default()
            .to_string(),
        version: v
            .get("version")
            .and_then(|s| s.as_str())
            .unwrap_or_default()
            .to_string(),
        gallery_images: entry_list(&v, "gallery_images", path)?,
        query_images: entry_list(&v, "query_images", path)?,
    };
    let here = path.parent().unwrap_or(Path::new(".")).to_path_buf();
    let root = match root {
        Some(r) => r.to_path_buf(),
        None => {
            let candidates = [
                here.clone(),
                here.parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| here.clone()),
            ];
            let probe = manifest.gallery_images.first().map(|e| e.path.clone());
            candidates
                .iter()
                .find(|c| probe.as_ref().is_some_and(|p| c.join(p).exists()))
                .cloned()
                .unwrap_or(here.clone())
        }
    };
    let missing: Vec<String> = manifest
        .gallery_images
        .iter()
        .chain(&manifest.query_images)
        .filter(|e| !root.join(&e.path).is_file())
        .map(|e| e.path.clone())
        .collect();
    if !missing.is_empty() {
        let shown: Vec<&String> = missing.iter().take(20).collect();
        return Err(crate::Error::Invalid(format!(
            "{}: {} of {} images are missing under {} (first: {shown:?})",
            path.display(),
            missing.len(),
            manifest.gallery_images.len() + manifest.query_images.len(),
            root.display()
        )));
    }
    let rel_path = root.join("metadata/query_relevance.json");
    let rel_file = if rel_path.exists() {
        Some(relevance_file(&rel_path)?)
    } else {
        None
    };
    let relevance = manifest
        .query_images
        .iter()
        .map(|q| {
            let ids = q
                .relevant_crater_ids
                .clone()
                .or_else(|| rel_file.as_ref().and_then(|r| r.get(q.crater()).cloned()))
                .unwrap_or_else(|| vec![q.crater().to_string()]);
            ids.into_iter().collect()
        })
        .collect();
    Ok(Benchmark {
        root,
        manifest,
        relevance,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, rel: &str, text: &str) {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn loads_the_published_shape_with_relevance_sources() {
        let d = tempfile::tempdir().unwrap();
        for f in [
            "images/gallery/a_2x.jpg",
            "images/gallery/b_2x.jpg",
            "images/query/a_q0.jpg",
            "images/query/b_q0.jpg",
        ] {
            write(d.path(), f, "x");
        }
        write(
            d.path(),
            "splits/test.json",
            r#"{"split_name": "test", "version": "release_v1",
            "gallery_images": [{"image_id": "a_2x", "path": "images/gallery/a_2x.jpg", "crater_id": "a", "view_type": "2x"},
                               {"image_id": "b_2x", "path": "images/gallery/b_2x.jpg", "crater_id": "b", "view_type": "2x"}],
            "query_images": [{"image_id": "a_q0", "path": "images/query/a_q0.jpg", "crater_id": "a", "relevant_crater_ids": ["a", "b"]},
                             {"image_id": "b_q0", "path": "images/query/b_q0.jpg", "crater_id": "b"}]}"#,
        );
        let b = load(&d.path().join("splits/test.json"), None).unwrap();
        assert_eq!(b.root, d.path());
        assert_eq!(b.relevance[0], ["a".to_string(), "b".to_string()].into());
        assert_eq!(b.relevance[1], ["b".to_string()].into());
        write(
            d.path(),
            "metadata/query_relevance.json",
            r#"{"b": {"filtered": ["b", "c"]}}"#,
        );
        let b = load(&d.path().join("splits/test.json"), None).unwrap();
        assert_eq!(b.relevance[1], ["b".to_string(), "c".to_string()].into());
    }

    #[test]
    fn entries_to_link_need_no_crater_ids_and_a_benchmark_does() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "images/new1.png", "x");
        write(d.path(), "images/new2.png", "x");
        write(
            d.path(),
            "new.json",
            r#"{"gallery_images": [],
            "query_images": [{"image_id": "n1", "path": "images/new1.png", "lat": 1.0, "lon": 2.0, "diameter_km": 3.0},
                             {"image_id": "n2", "path": "images/new2.png", "crater_id": "c7"}]}"#,
        );
        let path = d.path().join("new.json");
        let b = load_entries(&path, None).unwrap();
        let metas = b.query_metas(&["n1".to_string(), "n2".to_string()]);
        assert_eq!(metas[0].crater_id, None);
        assert_eq!(metas[0].lat, Some(1.0));
        assert_eq!(metas[1].crater_id.as_deref(), Some("c7"));
        let e = format!("{:#}", load(&path, None).unwrap_err());
        assert!(
            e.contains("new.json") && e.contains("query_images[0]") && e.contains("crater_id"),
            "{e}"
        );
    }

    #[test]
    fn wrong_keys_are_listed_and_missing_files_reported_together() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "m.json", r#"{"images": []}"#);
        let e = format!("{:#}", load(&d.path().join("m.json"), None).unwrap_err());
        assert!(
            e.contains("gallery_images") && e.contains("\"images\""),
            "{e}"
        );
        write(
            d.path(),
            "m.json",
            r#"{"gallery_images": [{"id": "x", "file": "y"}]}"#,
        );
        let e = format!("{:#}", load(&d.path().join("m.json"), None).unwrap_err());
        assert!(e.contains("found keys") && e.contains("\"file\""), "{e}");
        write(
            d.path(),
            "m.json",
            r#"{"gallery_images": [{"image_id": "1", "path": "g1.png", "crater_id": "c"}, {"image_id": "2", "path": "g2.png", "crater_id": "c"}]}"#,
        );
        let e = format!("{:#}", load(&d.path().join("m.json"), None).unwrap_err());
        assert!(
            e.contains("2 of 2 images are missing") && e.contains("g1.png") && e.contains("g2.png"),
            "{e}"
        );
    }

    #[test]
    fn relevance_file_as_a_list() {
        let d = tempfile::tempdir().unwrap();
        write(
            d.path(),
            "r.json",
            r#"[{"query_crater_id": "q", "relevant_crater_ids": ["q", "r"]}]"#,
        );
        let r = relevance_file(&d.path().join("r.json")).unwrap();
        assert_eq!(r["q"], vec!["q".to_string(), "r".to_string()]);
        write(d.path(), "r.json", r#"[{"x": 1}]"#);
        assert!(format!(
            "{:#}",
            relevance_file(&d.path().join("r.json")).unwrap_err()
        )
        .contains("found keys [\"x\"]"));
    }
}
