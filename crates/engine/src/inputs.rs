//! Where the images of a job come from: a directory tree or a list file. Ids are stable
//! (paths relative to the directory, or as listed), so that re-runs and caches agree.

use crate::error::{Error, Result};
use craterdex_errors::IoContext;
use craterdex_index::ImageMeta;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// File extensions read as images.
pub const IMAGE_EXTENSIONS: [&str; 7] = ["jpg", "jpeg", "png", "tif", "tiff", "pgm", "ppm"];

/// Every image file under `dir` (recursively), sorted, with its path relative to `dir`
/// (without extension, `/`-separated) as id.
pub fn images_in(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).io("list", &d)? {
            let p = e.io("list", &d)?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| IMAGE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
            {
                let id = p
                    .strip_prefix(dir)
                    .unwrap_or(&p)
                    .with_extension("")
                    .to_string_lossy()
                    .replace(std::path::MAIN_SEPARATOR, "/");
                out.push((id, p));
            }
        }
    }
    out.sort();
    if out.is_empty() {
        return Err(crate::Error::Invalid(format!(
            "{}: no images (jpg, png, tif, pgm) found",
            dir.display()
        )));
    }
    Ok(out)
}

/// Lines of an image list: one path per line, relative to the list's folder; ids are the
/// paths as written. Blank lines and `#` comments are skipped.
pub fn images_in_list(list: &Path) -> Result<Vec<(String, PathBuf)>> {
    let text = std::fs::read_to_string(list).io("read", list)?;
    let base = list.parent().unwrap_or(Path::new("."));
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| (l.to_string(), base.join(l)))
        .collect())
}

/// Index metadata for images listed as `(id, path)`: their id and path, for the extracted
/// `ids` (in that order; an unreadable image is missing from them).
pub fn metas_for(items: &[(String, PathBuf)], ids: &[String]) -> Vec<ImageMeta> {
    let paths: HashMap<&str, &PathBuf> = items.iter().map(|(i, p)| (i.as_str(), p)).collect();
    ids.iter()
        .map(|id| ImageMeta {
            id: id.clone(),
            path: paths.get(id.as_str()).map(|p| p.display().to_string()),
            ..Default::default()
        })
        .collect()
}

/// The metadata of `ids` (the images extraction could read, in its order), from `metas`,
/// as an index records it: image paths made absolute, so that a search run from another
/// directory (spatial verification, serve's thumbnails) still finds the images. Fails
/// naming an id without metadata.
pub fn metas_in_order(
    metas: impl IntoIterator<Item = ImageMeta>,
    ids: &[String],
) -> Result<Vec<ImageMeta>> {
    let mut by_id: HashMap<String, ImageMeta> =
        metas.into_iter().map(|m| (m.id.clone(), m)).collect();
    ids.iter()
        .map(|id| {
            let mut m = by_id
                .remove(id)
                .ok_or_else(|| Error::Invalid(format!("no metadata for {id}")))?;
            m.path = m.path.map(|p| absolute_path(&p));
            Ok(m)
        })
        .collect()
}

/// `path` made absolute against the working directory (as given where that fails).
fn absolute_path(path: &str) -> String {
    std::path::absolute(path).map_or_else(|_| path.to_string(), |p| p.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metas_come_in_the_order_of_ids_with_absolute_paths() {
        let meta = |id: &str, path: Option<&str>| ImageMeta {
            id: id.into(),
            path: path.map(String::from),
            ..Default::default()
        };
        let ordered = metas_in_order(
            [meta("a", Some("crops/a.png")), meta("b", None)],
            &["b".into(), "a".into()],
        )
        .unwrap();
        assert_eq!(
            (ordered[0].id.as_str(), ordered[0].path.as_deref()),
            ("b", None)
        );
        let a = std::path::PathBuf::from(ordered[1].path.as_deref().unwrap());
        assert!(
            a.is_absolute() && a.ends_with("crops/a.png"),
            "{}",
            a.display()
        );
        let missing = metas_in_order([meta("a", None)], &["c".into()]).unwrap_err();
        assert!(missing.to_string().contains("no metadata for c"));
    }
}
