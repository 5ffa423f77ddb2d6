//! `craterdex eval-link`: the link, dedup and open-set benchmark on real tiles. A second
//! observation of each tile is simulated (`craterdex_eval::observations`), both are
//! extracted with the model, and `craterdex_workflows::evaluate::link_benchmark` scores
//! the calibrated rule against appearance alone and geometry alone.

use crate::args::{csv_metas_in_order, ModelOpts, TileArgs};
use crate::output::Bars;
use anyhow::Result;
use clap::Args;
use craterdex_engine::inputs::images_in;
use craterdex_engine::{Extractor, IndexRecipe};
use craterdex_eval::observations::{second_csv_name, simulate, ObservationOptions};
use craterdex_workflows::evaluate::{link_benchmark, LinkBenchInput, LinkBenchReport};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Args)]
pub struct EvalLinkCmd {
    #[command(flatten)]
    tiles: TileArgs,
    /// Where the simulated observations and results.json go.
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value_t = 8.0)]
    min_diameter: f64,
    /// Georeferencing errors of the second observation, in median crater radii.
    #[arg(long, value_delimiter = ',', default_value = "0.5,4,10")]
    georef_errors: Vec<f64>,
    /// The second observation is turned by up to this many degrees either way.
    #[arg(long, default_value_t = ObservationOptions::default().max_rotation_deg)]
    max_rotation: f64,
    /// Its resolution relative to the first, as MIN,MAX.
    #[arg(long, value_delimiter = ',', default_values_t = [ObservationOptions::default().scale.0, ObservationOptions::default().scale.1])]
    scale: Vec<f64>,
    /// Largest rotation (degrees) and relative scale error of the georeferencing transform
    /// itself, as DEG,FRACTION.
    #[arg(long, value_delimiter = ',', default_values_t = [ObservationOptions::default().transform_error.0, ObservationOptions::default().transform_error.1])]
    transform_error: Vec<f64>,
    /// Report its positions in the first observation's frame (shifted) instead of its own
    /// turned and scaled pixel frame.
    #[arg(long)]
    catalogue_frame: bool,
    /// Precision the calibrated `match` decisions aim at.
    #[arg(long, default_value_t = 0.99)]
    target_precision: f64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    model: ModelOpts,
}

/// Simulates the observations of `tiles` under `out/observations`, extracts them and
/// scores linking, dedup and the open set; the review page goes to `out/review.html`.
pub fn link_benchmark_on_tiles(
    tiles: &[(PathBuf, PathBuf)],
    out: &Path,
    o: &ObservationOptions,
    extractor: &Arc<Extractor>,
    target_precision: f64,
) -> Result<LinkBenchReport> {
    let sim = out.join("observations");
    let report = simulate(tiles, &sim, o)?;
    eprintln!(
        "      observations: {} craters, {} first-observation crops, {} second ({} missed, {} false detections)",
        report.craters, report.first, report.second, report.missed, report.false_detections
    );
    let bars = Bars::new();
    let first = extractor.extract(&images_in(&sim.join("first"))?, "first observation", &bars)?;
    let second = extractor.extract(
        &images_in(&sim.join("second"))?,
        "second observation",
        &bars,
    )?;
    let first_metas = csv_metas_in_order(&sim.join("first.csv"), &first.ids, &sim.join("first"))?;
    let second_metas = o
        .georef_errors
        .iter()
        .map(|&e| {
            Ok((
                e,
                csv_metas_in_order(
                    &sim.join(second_csv_name(e)),
                    &second.ids,
                    &sim.join("second"),
                )?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let result = link_benchmark(
        LinkBenchInput {
            first: &first,
            first_metas,
            second: &second,
            second_metas,
            extractor: Some(extractor.clone()),
        },
        &IndexRecipe::default(),
        target_precision,
        Some(out),
        &bars,
    )?;
    craterdex_durable::write_atomic(
        &out.join("results.json"),
        &serde_json::to_vec_pretty(&result)?,
    )?;
    Ok(result)
}

/// The benchmark's table.
pub fn print_link_report(result: &LinkBenchReport) {
    println!(
        "{:>6} {:>6}  {:<34} {:>9} {:>7} {:>6}",
        "error", "radius", "method", "precision", "recall", "F1"
    );
    for l in &result.levels {
        for (name, s) in [
            ("registered + appearance (default)", &l.default_rule),
            ("registered, calibrated", &l.registered_calibrated),
            ("registration only", &l.registration_only),
            (
                "unregistered, calibrated (before)",
                &l.unregistered_calibrated,
            ),
            ("appearance only", &l.appearance_only),
            ("geometry only (1 r)", &l.geometry_only),
            ("geometry only (radius)", &l.geometry_only_wide),
        ] {
            println!(
                "{:>6} {:>6}  {:<34} {:>9.3} {:>7.3} {:>6.3}{}",
                l.georef_error,
                l.search_radius,
                name,
                s.precision,
                s.recall,
                s.f1,
                s.calibration_failed
                    .as_ref()
                    .map(|w| format!("  (not calibrated: {w})"))
                    .unwrap_or_default()
            );
        }
        for (name, d) in [
            ("default", &l.dedup),
            ("unregistered", &l.dedup_unregistered),
        ] {
            println!(
                "{:>6} {:>6}  dedup {name}: {} of {} groups found exactly, pair precision {:.3}, recall {:.3}",
                l.georef_error,
                l.search_radius,
                d.found_exactly,
                d.true_groups,
                d.pair_precision,
                d.pair_recall
            );
        }
        let r = &l.registration;
        println!(
            "{:>6} {:>6}  registration: {} of {} sources, {} inliers, median residual {:.3} radii, slowest {:.0} ms ({} entries)",
            l.georef_error, l.search_radius, r.registered, r.sources, r.inliers, r.median_residual_radii, r.slowest_ms, r.slowest_entries
        );
    }
    for (name, os) in [
        ("default", &result.open_set),
        ("unregistered", &result.open_set_unregistered),
    ] {
        println!(
            "open set {name} ({} entries, {} known): known/new accuracy {:.3}, new-crater AUROC {:.3}, top-1 on known {:.3}",
            os.entries, os.known, os.known_new_accuracy, os.new_auroc, os.top1_known
        );
    }
}

pub fn run(c: EvalLinkCmd) -> Result<()> {
    anyhow::ensure!(
        c.scale.len() == 2 && c.transform_error.len() == 2,
        "--scale and --transform-error take two values each (MIN,MAX and DEG,FRACTION)"
    );
    let tiles = c.tiles.pairs()?;
    let o = ObservationOptions {
        min_diameter: c.min_diameter,
        georef_errors: c.georef_errors.clone(),
        max_rotation_deg: c.max_rotation,
        scale: (c.scale[0], c.scale[1]),
        observation_frame: !c.catalogue_frame,
        transform_error: (c.transform_error[0], c.transform_error[1]),
        seed: c.seed,
        ..Default::default()
    };
    let extractor = Arc::new(c.model.load()?);
    let result = link_benchmark_on_tiles(&tiles, &c.out, &o, &extractor, c.target_precision)?;
    print_link_report(&result);
    eprintln!("wrote {}/results.json and review.html", c.out.display());
    Ok(())
}
