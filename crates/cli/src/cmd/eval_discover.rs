//! `craterdex eval-discover`: the MarsRetrieval-style evaluation of `discover` on real
//! tiles with crater lists. For each target class (a diameter range in pixels) the tiles are
//! cut into windows of 3x the class's middle diameter every half window, a few craters of
//! the class are the exemplars, and the ranking of the windows is scored against every
//! other crater of the class: a window is a true positive when its centre lies within
//! 0.75 strides of an unmatched one (every point of a tile is that close to some window
//! centre). craterdex (late interaction, max over exemplars) against the single-vector
//! baseline.

use crate::args::{csv_metas_in_order, ModelOpts, TileArgs};
use crate::output::Bars;
use anyhow::{ensure, Context, Result};
use clap::Args;
use craterdex_engine::inputs::images_in;
use craterdex_engine::{Engine, IndexRecipe};
use craterdex_eval::catalogue::read_pixel_catalogue;
use craterdex_eval::observations::FRAME_STRIDE;
use craterdex_workflows::discover::{discover, score_discovery, DiscoveryScore, Fuse, Scoring};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;
use std::path::PathBuf;

#[derive(Args)]
pub struct EvalDiscoverCmd {
    #[command(flatten)]
    tiles: TileArgs,
    #[arg(long)]
    out: PathBuf,
    /// Target classes: diameter ranges in pixels.
    #[arg(long, value_delimiter = ',', default_value = "20-40,40-80")]
    classes: Vec<String>,
    /// Exemplar craters per class.
    #[arg(long, default_value_t = 5)]
    exemplars: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    model: ModelOpts,
}

#[derive(Serialize)]
struct ClassReport {
    class: String,
    window: usize,
    stride: usize,
    radius: f64,
    windows: usize,
    craterdex: DiscoveryScore,
    single_vector: DiscoveryScore,
}

fn parse_class(s: &str) -> Result<(f64, f64)> {
    let (a, b) = s
        .split_once('-')
        .with_context(|| format!("class {s:?}: give a diameter range like 20-40"))?;
    let (a, b): (f64, f64) = (a.trim().parse()?, b.trim().parse()?);
    ensure!(a > 0.0 && a < b, "class {s:?}: an empty diameter range");
    Ok((a, b))
}

pub fn run(c: EvalDiscoverCmd) -> Result<()> {
    let pairs = c.tiles.pairs()?;
    let images: Vec<PathBuf> = pairs.iter().map(|(t, _)| t.clone()).collect();
    let extractor = std::sync::Arc::new(c.model.load()?);
    let bars = Bars::new();
    let catalogues = pairs
        .iter()
        .map(|(_, p)| read_pixel_catalogue(p))
        .collect::<Result<Vec<_>, _>>()?;
    let mut reports = Vec::new();
    for class in &c.classes {
        let (lo, hi) = parse_class(class)?;
        let window = ((3.0 * (lo + hi) / 2.0 / 2.0).round() as usize * 2).max(16);
        let stride = window / 2;
        let radius = 0.75 * stride as f64;
        let dir = c.out.join(format!("class-{class}"));
        let windows = craterdex_eval::tiles::cut(&images, &dir.join("cut"), window, stride)?;
        let items = images_in(&dir.join("cut/windows"))?;
        let feats = extractor.extract(&items, &format!("windows {class} px"), &bars)?;
        let metas = csv_metas_in_order(
            &dir.join("cut/windows.csv"),
            &feats.ids,
            &dir.join("cut/windows"),
        )?;
        let recipe = IndexRecipe::default();
        let encoder = recipe.learn_encoder(&feats, None, &[], &bars)?;
        let index = recipe.index_in_memory(&encoder, &feats, metas, None)?;
        let engine = Engine::new(index, Some(extractor.clone()))?;
        // the class's craters, exemplars drawn by seed, every other one a target
        let mut members: Vec<(usize, String, f64, f64, f64)> = catalogues
            .iter()
            .enumerate()
            .flat_map(|(t, cat)| {
                cat.iter()
                    .filter(|k| k.diameter >= lo && k.diameter < hi)
                    .map(move |k| (t, format!("{t}-{}", k.id), k.x, k.y, k.diameter))
            })
            .collect();
        ensure!(
            members.len() > c.exemplars,
            "class {class}: {} craters, not more than the {} exemplars",
            members.len(),
            c.exemplars
        );
        members.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(c.seed));
        let crops = craterdex_eval::tiles::crater_crops(
            &images,
            &members[..(c.exemplars * 4).min(members.len())],
            2.0,
            &dir.join("exemplars"),
        )?;
        let chosen: Vec<(String, PathBuf)> = crops.into_iter().take(c.exemplars).collect();
        ensure!(
            !chosen.is_empty(),
            "class {class}: no exemplar crop fits its tile"
        );
        let chosen_ids: Vec<&str> = chosen.iter().map(|(id, _)| id.as_str()).collect();
        let (_, exemplars) = engine.encode_images(&chosen, &bars)?;
        let targets: Vec<(f64, f64)> = members
            .iter()
            .filter(|m| !chosen_ids.contains(&m.1.as_str()))
            .map(|m| (m.2 + m.0 as f64 * FRAME_STRIDE, m.3))
            .collect();
        let ks = [10, 50, 100, 500];
        let score = |scoring| -> Result<DiscoveryScore> {
            let ranked = discover(&engine, &exemplars, Fuse::Max, scoring)?;
            let centres: Vec<(f64, f64)> = ranked
                .iter()
                .map(|d| (d.meta.x.unwrap_or(f64::NAN), d.meta.y.unwrap_or(f64::NAN)))
                .collect();
            Ok(score_discovery(&centres, &targets, radius, &ks))
        };
        let r = ClassReport {
            class: class.clone(),
            window,
            stride,
            radius,
            windows: windows.len(),
            craterdex: score(Scoring::LateInteraction)?,
            single_vector: score(Scoring::SingleVector)?,
        };
        for (name, s) in [
            ("craterdex", &r.craterdex),
            ("single vector", &r.single_vector),
        ] {
            let at =
                s.at.iter()
                    .map(|(k, p, rc)| format!("P@{k} {p:.3} R@{k} {rc:.3}"))
                    .collect::<Vec<_>>()
                    .join(", ");
            println!(
                "class {class} px ({} windows of {window} px, {} targets, radius {radius} px) {name:<13}: F1* {:.3} at K={}, AUPRC {:.3}; {at}",
                r.windows, s.targets, s.best_f1, s.best_k, s.auprc
            );
        }
        reports.push(r);
    }
    let json = c.out.join("results.json");
    craterdex_durable::write_atomic(&json, &serde_json::to_vec_pretty(&reports)?)?;
    eprintln!("wrote {}", json.display());
    Ok(())
}
