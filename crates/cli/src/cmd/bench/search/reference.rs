//! The reference run: faiss-cpu flat inner product for stage 1 and numpy MaxSim, timed on
//! the same data by scripts/bench_search_ref.py in the benchmark's Python environment.

use anyhow::{Context, Result};
use craterdex_index::ImageMeta;
use craterdex_tokens::Descriptors;
use std::collections::HashMap;
use std::path::Path;

pub(super) fn write_f32(path: &Path, parts: impl Iterator<Item = f32>) -> Result<()> {
    let bytes: Vec<u8> = parts.flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

/// Runs the reference script on identical data; returns "stage/S/mode" -> p50 ms.
pub(super) fn reference(
    dir: &Path,
    gallery: &[(ImageMeta, Descriptors)],
    queries: &[Descriptors],
    k: usize,
    d: usize,
    single: usize,
) -> Result<(String, HashMap<String, f64>)> {
    std::fs::create_dir_all(dir)?;
    write_f32(
        &dir.join("g_single"),
        gallery.iter().flat_map(|g| g.1.single.iter().copied()),
    )?;
    write_f32(
        &dir.join("g_tokens"),
        gallery.iter().flat_map(|g| g.1.tokens.iter().copied()),
    )?;
    write_f32(
        &dir.join("q_single"),
        queries.iter().flat_map(|q| q.single.iter().copied()),
    )?;
    write_f32(
        &dir.join("q_tokens"),
        queries.iter().flat_map(|q| q.tokens.iter().copied()),
    )?;
    let script = super::super::python::script_file(
        "bench_search_ref.py",
        super::super::python::SEARCH_SCRIPT,
    )?;
    let python = super::super::python::reference_python("numpy, faiss");
    eprintln!("reference Python: {}", python.origin);
    let threads = rayon::current_num_threads();
    let out = std::process::Command::new(&python.exe)
        .arg(&script)
        .arg(dir)
        .args([gallery.len(), queries.len(), k, d, threads, single].map(|v| v.to_string()))
        .env("OMP_NUM_THREADS", threads.to_string())
        .output()
        .context("cannot run python3 for the reference")?;
    let _ = std::fs::remove_file(&script);
    for f in ["g_single", "g_tokens", "q_single", "q_tokens"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    anyhow::ensure!(
        out.status.success(),
        "reference script failed under {} (needs numpy; faiss-cpu optional):\n{}",
        python.origin,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let engine = format!(
        "{} [BLAS: {}]",
        v["engine"].as_str().unwrap_or("?"),
        v["blas"]
            .as_array()
            .map(|a| a
                .iter()
                .filter_map(|x| x.as_str())
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default()
    );
    let map = v
        .as_object()
        .map(|o| {
            o.iter()
                .filter_map(|(key, x)| Some((key.clone(), x.get("p50_ms")?.as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    Ok((engine, map))
}
