//! `craterdex dedup`: groups of one index's entries that show the same crater, and the
//! merged catalogue.

use crate::args::dir_entries;
use crate::cmd::detect::{detect_images, drop_image, per_image_detections, write_crops};
use crate::cmd::link::print_registrations;
use crate::output::Bars;
use anyhow::Result;
use clap::Args;
use craterdex_engine::{Engine, ImageMeta, RecipeOptions};
use craterdex_workflows::dedup::{frames_of_index, score_groups};
use craterdex_workflows::link::crop_turn_deg;
use craterdex_workflows::output::write_detections;
use craterdex_workflows::{dedup, DedupOptions, LinkRule};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["index", "images"])))]
pub struct DedupCmd {
    /// The index whose entries are grouped.
    #[arg(long)]
    pub index: Option<PathBuf>,
    /// Whole overlapping images (PNG, TIFF, JPEG, PNM; built with GDAL, georeferenced
    /// rasters), each its own source, instead of an index: their craters are detected
    /// (OUT/detections.csv as `detect` writes it), cut as crops (OUT/crops, OUT/crops.csv),
    /// indexed with the default recipe (OUT/index) and grouped across the images, which are
    /// registered to each other by their crater patterns in their own pixels.
    #[arg(long = "image", num_args = 1..)]
    pub images: Vec<PathBuf>,
    /// With --image: crop side over crater diameter.
    #[arg(long, default_value_t = 2.0, requires = "images")]
    pub context: f64,
    #[command(flatten)]
    pub detector: crate::cmd::detect::DetectorOpts,
    /// Where groups.csv, merged.csv, the merged map layer (merged.geojson with its QGIS
    /// style merged.qml; merged.gpkg when built with GDAL) and review.html go.
    #[arg(long)]
    pub out: PathBuf,
    /// Also each merged entry's rim as a polygon (merged_rims.geojson), for entries with a
    /// position and a diameter in km.
    #[arg(long)]
    pub rims: bool,
    /// Candidates looked at per entry.
    #[arg(long, default_value_t = DedupOptions::default().top_k)]
    pub top: usize,
    /// A rule file instead of the one stored with the index.
    #[arg(long)]
    pub rule: Option<PathBuf>,
    /// Compare positions as given: do not register the index's sources to each other by
    /// their crater patterns first.
    #[arg(long)]
    pub no_register: bool,
    /// Print a JSON summary (groups, the merged catalogue's size, the rule, each source's
    /// registration, the score against crater ids where the index has them, the files
    /// written) instead of lines of text.
    #[arg(long)]
    pub json: bool,
    /// The model that re-encodes the crops of a source registered turned (loaded only then).
    #[command(flatten)]
    pub model: crate::args::ModelOpts,
}

/// `dedup --image`: the images' craters detected, cut and indexed under `out`; the engine
/// over that index (with the model), and how many images could not be read or searched
/// (named on stderr, and in OUT/images.csv with why).
fn index_images(c: &DedupCmd) -> Result<(Engine, PathBuf, usize)> {
    let (config, net) = c.detector.load()?;
    let found = detect_images(
        &c.images,
        &config,
        &net,
        &c.detector.options(),
        "detect",
        drop_image,
    );
    let per_image = per_image_detections(&c.images, found);
    let failed = per_image.iter().filter(|d| d.found.is_err()).count();
    write_detections(&c.out, &per_image)?;
    let cut = write_crops(&c.out, &per_image, c.context)?;
    anyhow::ensure!(
        cut > 0,
        "no crater found in the images could be cut as a crop: nothing to group"
    );
    let crops = c.out.join("crops");
    let entries = dir_entries(&crops, Some(&c.out.join("crops.csv")))?;
    let index = c.out.join("index");
    let recipe = RecipeOptions::default().recipe()?;
    let engine = Engine::build(
        &index,
        &entries,
        &recipe,
        Arc::new(c.model.load()?),
        &Bars::new(),
    )?;
    Ok((engine, index, failed))
}

pub fn run(c: DedupCmd) -> Result<()> {
    let (engine, index, failed) = match &c.index {
        Some(index) => (Engine::open(index, None)?, index.clone(), 0),
        None => index_images(&c)?,
    };
    dedup_index(&c, engine, &index)?;
    anyhow::ensure!(
        failed == 0,
        "{failed} of {} images could not be read or searched",
        c.images.len()
    );
    Ok(())
}

/// Groups the entries of the index at `index` (`engine` over it).
fn dedup_index(c: &DedupCmd, engine: Engine, index: &Path) -> Result<()> {
    let rule = match &c.rule {
        Some(p) => LinkRule::load(p)?,
        None => LinkRule::for_index(index)?,
    };
    let opts = DedupOptions {
        top_k: c.top,
        register: !c.no_register,
        ..DedupOptions::default()
    };
    let frames = frames_of_index(engine.index(), &rule, &opts);
    let turned = frames
        .registrations()
        .iter()
        .any(|r| crop_turn_deg(r).is_some());
    let engine = if turned && engine.extractor().is_none() {
        // its crops are compared turned to the reference's orientation
        engine.with_extractor(Arc::new(c.model.load()?))?
    } else {
        engine
    };
    let groups = dedup(&engine, &rule, &opts, &frames, &Bars::new())?;
    let idx = engine.index();
    let live: Vec<ImageMeta> = idx.live_rows().map(|r| idx.meta(r).clone()).collect();
    let regs = frames.registrations();
    let map = craterdex_workflows::output::MapLayers {
        body_radius_km: rule.body_radius_km,
        rims: c.rims,
    };
    let mut files = craterdex_workflows::output::write_dedup(&c.out, &groups, &live, &map)?;
    craterdex_workflows::output::write_registrations(&c.out, &regs)?;
    craterdex_workflows::review::write_dedup_review(&c.out, &groups, &regs, 300)?;
    files.extend(["registrations.csv", "registrations.json", "review.html"].map(|f| c.out.join(f)));
    let absorbed: usize = groups.iter().map(|g| g.members.len() - 1).sum();
    let scored = live
        .iter()
        .any(|m| m.crater_id.is_some())
        .then(|| score_groups(&groups, &live));
    if c.json {
        let written: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        let summary = serde_json::json!({
            "entries": live.len(),
            "groups": groups.len(),
            "merged_entries": live.len() - absorbed,
            "rule": rule.source,
            "registrations": regs.iter().map(|r| (**r).clone()).collect::<Vec<_>>(),
            "score_against_crater_ids": scored,
            "written": written,
        });
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(());
    }
    print_registrations(&regs);
    println!(
        "{} entries: {} groups of the same crater; the merged catalogue has {} entries (rule: {})",
        live.len(),
        groups.len(),
        live.len() - absorbed,
        rule.source
    );
    if let Some(s) = scored {
        println!(
            "against the index's crater ids: {} of {} groups found exactly, pair precision {:.4}, pair recall {:.4}",
            s.found_exactly, s.true_groups, s.pair_precision, s.pair_recall
        );
    }
    println!("wrote {}", crate::output::names_in(&c.out, &files));
    Ok(())
}
