//! `craterdex bench detect`: the detector over whole labelled tiles at every kernel level
//! this CPU runs (each level a child process, `CRATERDEX_KERNEL` set, the level being fixed
//! per process) and every precision (f32 and the one `--detector-precision` names, where it
//! names one), and pycda's own pipeline on TensorFlow over the same
//! tiles in the same run; time, rate and F1 per size bin of each.

use super::python::{pinned_python, script_file, PYCDA, PYCDA_SCRIPT};
use crate::args::TileArgs;
use crate::cmd::detect::{detect_images, drop_image, found_circles, labelled, DetectorOpts};
use anyhow::{Context, Result};
use clap::Args;
use craterdex_eval::detection::{score, BinCounts, Circle};
use craterdex_kernels::level::Level;
use craterdex_model::Precision;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::process::Command;
use strum::VariantNames;

#[derive(Args)]
pub struct DetectBench {
    #[command(flatten)]
    tiles: TileArgs,
    /// Passes over the tiles per level and precision; the fastest is reported.
    #[arg(long, default_value_t = 2)]
    repeats: usize,
    /// Kernel levels to time (default: every level this CPU runs).
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(Level::VARIANTS))]
    levels: Vec<String>,
    /// Skip pycda's pipeline (its Python environment is about 700 MB, installed once).
    #[arg(long)]
    no_reference: bool,
    /// Internal: run at this process's kernel level only and write the rows here.
    #[arg(long, hide = true)]
    worker: Option<PathBuf>,
    #[command(flatten)]
    detector: DetectorOpts,
}

#[derive(Serialize, Deserialize)]
struct Row {
    engine: String,
    level: String,
    precision: String,
    seconds: f64,
    bins: Vec<BinCounts>,
}

/// Every tile's labelled craters.
fn labels(b: &DetectBench) -> Result<Vec<Vec<Circle>>> {
    b.tiles
        .pairs()?
        .iter()
        .map(|(t, l)| labelled(l).with_context(|| format!("labels of {}", t.display())))
        .collect()
}

/// This process's level: each precision's fastest pass over the tiles, and its scores.
fn worker(b: &DetectBench) -> Result<Vec<Row>> {
    let images: Vec<PathBuf> = b.tiles.pairs()?.into_iter().map(|(t, _)| t).collect();
    let truth = labels(b)?;
    // f32 and the precision named, or every one this level runs
    let mut precisions = vec![Precision::F32];
    match b.detector.precision() {
        Precision::F32 => {
            if craterdex_kernels::bf16::available() {
                precisions.push(Precision::Bf16);
            }
            precisions.push(Precision::Int8);
        }
        Precision::Bf16 if !craterdex_kernels::bf16::available() => eprintln!(
            "bf16 is not timed at {}: this level has no bf16 products",
            craterdex_kernels::active()
        ),
        named => precisions.push(named),
    }
    let mut rows = Vec::new();
    for precision in precisions {
        let (config, net) = b.detector.load_f32()?;
        let net = net.with_precision(precision)?;
        let o = b.detector.options();
        let mut best = f64::INFINITY;
        let mut found = Vec::new();
        for _ in 0..b.repeats.max(1) {
            let t = std::time::Instant::now();
            found = detect_images(
                &images,
                &config,
                &net,
                &o,
                &format!("{precision}"),
                drop_image,
            )
            .into_iter()
            .map(|f| f.map(|f| f.detections))
            .collect::<Result<Vec<_>>>()?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        let scored: Vec<(Vec<Circle>, Vec<Circle>)> = found
            .iter()
            .zip(&truth)
            .map(|(f, t)| (found_circles(f), t.clone()))
            .collect();
        rows.push(Row {
            engine: format!("craterdex {}", config.name),
            level: craterdex_kernels::active().to_string(),
            precision: precision.to_string(),
            seconds: best,
            bins: score(&scored),
        });
    }
    Ok(rows)
}

#[derive(Deserialize)]
struct PycdaTile {
    seconds: f64,
    detections: Vec<[f64; 4]>,
}

#[derive(Deserialize)]
struct PycdaRun {
    tensorflow: String,
    tiles: Vec<PycdaTile>,
}

/// pycda's pipeline over the tiles in its pinned Python.
fn pycda(b: &DetectBench) -> Result<Row> {
    let python = pinned_python(&PYCDA, "tf_keras, skimage, pandas, matplotlib");
    let sdist = craterdex_fetch::pycda_sdist()?;
    let script = script_file("pycda_reference.py", PYCDA_SCRIPT)?;
    let out = std::env::temp_dir().join(format!("craterdex-{}-pycda.json", std::process::id()));
    eprintln!(
        "pycda's pipeline in {} ({})",
        python.exe.display(),
        python.origin
    );
    let status = Command::new(&python.exe)
        .arg(&script)
        .arg(&sdist)
        .arg(&out)
        .args(b.tiles.pairs()?.iter().map(|(t, _)| t.clone()))
        .env("TF_CPP_MIN_LOG_LEVEL", "3")
        .status()
        .with_context(|| format!("cannot run {}", python.exe.display()))?;
    anyhow::ensure!(
        status.success(),
        "pycda's pipeline failed ({status}; its message is above)"
    );
    let run: PycdaRun = serde_json::from_slice(&std::fs::read(&out)?)
        .with_context(|| format!("reading {}", out.display()))?;
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_file(&script);
    let truth = labels(b)?;
    let scored: Vec<(Vec<Circle>, Vec<Circle>)> = run
        .tiles
        .iter()
        .zip(truth)
        .map(|(t, truth)| {
            let found = t.detections.iter().map(|d| Circle {
                x: d[0],
                y: d[1],
                diameter: d[2],
            });
            (found.collect(), truth)
        })
        .collect();
    Ok(Row {
        engine: format!("pycda 0.1.16 (TensorFlow {})", run.tensorflow),
        level: "its own".into(),
        precision: "f32".into(),
        seconds: run.tiles.iter().map(|t| t.seconds).sum(),
        bins: score(&scored),
    })
}

pub fn run(b: DetectBench) -> Result<()> {
    if let Some(path) = &b.worker {
        let rows = worker(&b)?;
        return Ok(std::fs::write(path, serde_json::to_vec(&rows)?)?);
    }
    let pairs = b.tiles.pairs()?;
    let megapixels: f64 = pairs
        .iter()
        .map(|(t, _)| {
            craterdex_detect::GrayImage::open(t)
                .map(|g| g.width as f64 * g.height as f64 / 1e6)
                .map_err(anyhow::Error::from)
        })
        .sum::<Result<f64>>()?;
    let rows: Vec<Row> = super::rows_per_level(&super::chosen_levels(&b.levels)?)?;
    // craterdex's rows are printed even where pycda's pipeline fails; the run still fails
    let (reference, reference_failed) = match (!b.no_reference).then(|| pycda(&b)) {
        Some(Ok(row)) => (Some(row), None),
        Some(Err(e)) => (None, Some(e)),
        None => (None, None),
    };
    println!("{}", craterdex_kernels::level::describe());
    println!(
        "{} tiles ({megapixels:.1} megapixels), {} threads; craterdex: fastest of {} passes, pycda: one",
        pairs.len(),
        rayon::current_num_threads(),
        b.repeats.max(1)
    );
    let f1 = |r: &Row, bin: &str| {
        r.bins
            .iter()
            .find(|b| b.bin == bin)
            .map_or(f64::NAN, |b| b.f1)
    };
    println!(
        "{:<40} {:>9} {:>9} {:>9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "engine",
        "level",
        "precision",
        "s/image",
        "images/s",
        "MP/s",
        "x pycda",
        "F1 8-20",
        "F1 20-50",
        "F1 50-200",
        "F1 >=20"
    );
    for r in rows.iter().chain(reference.iter()) {
        let speedup = reference
            .as_ref()
            .map_or(f64::NAN, |p| p.seconds / r.seconds);
        println!(
            "{:<40} {:>9} {:>9} {:>9.3} {:>8.2} {:>8.2} {:>9.2} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
            r.engine,
            r.level,
            r.precision,
            r.seconds / pairs.len() as f64,
            pairs.len() as f64 / r.seconds,
            megapixels / r.seconds,
            speedup,
            f1(r, "8-20"),
            f1(r, "20-50"),
            f1(r, "50-200"),
            f1(r, ">=20"),
        );
    }
    match reference_failed {
        Some(e) => Err(e.context(
            "pycda's pipeline gave no row, so the table has no x pycda \
             (rerun with --no-reference to time craterdex alone)",
        )),
        None => Ok(()),
    }
}
