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
    #[arg(long, value_delimiter = ',', default_value = "0.5,4")]
    georef_errors: Vec<f64>,
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
    extractor: &Extractor,
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
        "{:>6} {:>6}  {:<22} {:>9} {:>7} {:>6}",
        "error", "radius", "method", "precision", "recall", "F1"
    );
    for l in &result.levels {
        for (name, s) in [
            ("craterdex", &l.craterdex),
            ("appearance only", &l.appearance_only),
            ("geometry only (1 r)", &l.geometry_only),
            ("geometry only (radius)", &l.geometry_only_wide),
        ] {
            println!(
                "{:>6} {:>6}  {:<22} {:>9.3} {:>7.3} {:>6.3}{}",
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
        println!(
            "{:>6} {:>6}  dedup: {} of {} groups found exactly, pair precision {:.3}, recall {:.3}",
            l.georef_error,
            l.search_radius,
            l.dedup.found_exactly,
            l.dedup.true_groups,
            l.dedup.pair_precision,
            l.dedup.pair_recall
        );
    }
    let os = &result.open_set;
    println!(
        "open set ({} entries, {} known): known/new accuracy {:.3}, new-crater AUROC {:.3}, top-1 on known {:.3}",
        os.entries, os.known, os.known_new_accuracy, os.new_auroc, os.top1_known
    );
}

pub fn run(c: EvalLinkCmd) -> Result<()> {
    let tiles = c.tiles.pairs()?;
    let o = ObservationOptions {
        min_diameter: c.min_diameter,
        georef_errors: c.georef_errors.clone(),
        seed: c.seed,
        ..Default::default()
    };
    let extractor = c.model.load()?;
    let result = link_benchmark_on_tiles(&tiles, &c.out, &o, &extractor, c.target_precision)?;
    print_link_report(&result);
    eprintln!("wrote {}/results.json and review.html", c.out.display());
    Ok(())
}
