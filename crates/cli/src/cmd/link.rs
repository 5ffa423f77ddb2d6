//! `craterdex link`: new crater entries against a catalogue index: match, new or
//! ambiguous, with appearance and geometric evidence; `--insert-new` grows the index.

use crate::args::{EntriesOpts, ModelOpts};
use crate::cmd::detect::Found;
use crate::output::Bars;
use anyhow::Result;
use clap::Args;
use craterdex_detect::{Detection, GrayImage};
use craterdex_engine::{Descriptors, Engine, ImageMeta};
use craterdex_workflows::calibrate::decision_counts;
use craterdex_workflows::images::ImageLinks;
use craterdex_workflows::output::CratersOnBody;
use craterdex_workflows::{link, ImageLinkOptions, LinkOptions, LinkRule, ObservedImage};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["entries", "images"])))]
pub struct LinkCmd {
    /// The catalogue index (A).
    #[arg(long)]
    pub index: PathBuf,
    #[command(flatten)]
    pub entries: EntriesOpts,
    /// Whole new images (PNG, TIFF, JPEG, PNM), each its own source, instead of entries:
    /// their craters are detected, registered to the catalogue by their pattern, looked for
    /// where the catalogue's craters should be, and linked.
    #[arg(long = "image", num_args = 1.., conflicts_with_all = ["entries", "insert_new", "rims"])]
    pub images: Vec<PathBuf>,
    /// With --image: crop side over crater diameter (the catalogue's crops).
    #[arg(long, default_value_t = ImageLinkOptions::default().context)]
    pub context: f64,
    /// With --image: link only what the detector found; do not look for the catalogue's
    /// craters where the registration places them.
    #[arg(long)]
    pub detections_only: bool,
    #[command(flatten)]
    pub detector: crate::cmd::detect::DetectorOpts,
    /// Where links.csv, the links map layer (links.geojson with its QGIS style links.qml;
    /// links.gpkg when built with GDAL), registrations and review.html go.
    #[arg(long)]
    pub out: PathBuf,
    /// Also each entry's rim as a polygon (links_rims.geojson), for entries with a position
    /// and a diameter in km.
    #[arg(long)]
    pub rims: bool,
    /// Add every entry decided `new` to the index, in order (atomically, batch by batch).
    #[arg(long)]
    pub insert_new: bool,
    /// Print a JSON summary (decisions, rule, each source's registration, the index's
    /// images, the files written) instead of lines of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub tuning: LinkTuning,
    #[command(flatten)]
    pub model: ModelOpts,
}

/// Search and geometry settings shared by link and calibrate.
#[derive(Args)]
pub struct LinkTuning {
    /// Candidates looked at per entry.
    #[arg(long, default_value_t = LinkOptions::default().top_k)]
    pub top: usize,
    /// Stage-1 shortlist of the two-stage search.
    #[arg(long, default_value_t = LinkOptions::default().shortlist)]
    pub shortlist: usize,
    /// Entries searched (and inserted) at a time.
    #[arg(long, default_value_t = LinkOptions::default().batch)]
    pub link_batch: usize,
    /// Search radius: candidates farther than this many crater radii are excluded (both
    /// positions known). Default: the rule's (3).
    #[arg(long)]
    pub max_offset_radii: Option<f64>,
    /// Largest diameter ratio of a possible match. Default: the rule's (1.5).
    #[arg(long)]
    pub max_diameter_ratio: Option<f64>,
    /// Radius of the body in km (default Mars, 3389.5; the Moon is 1737.4).
    #[arg(long)]
    pub body_radius_km: Option<f64>,
    /// A rule file instead of the one stored with the index.
    #[arg(long)]
    pub rule: Option<PathBuf>,
    /// Compare positions as given: do not register each source image to the catalogue by
    /// its crater pattern first.
    #[arg(long)]
    pub no_register: bool,
}

impl LinkTuning {
    pub fn rule(&self, index: &std::path::Path) -> Result<LinkRule> {
        let mut rule = match &self.rule {
            Some(p) => LinkRule::load(p)?,
            None => LinkRule::for_index(index)?,
        };
        if let Some(v) = self.max_offset_radii {
            rule.max_offset_radii = v;
        }
        if let Some(v) = self.max_diameter_ratio {
            rule.max_diameter_ratio = v;
        }
        if let Some(v) = self.body_radius_km {
            rule.body_radius_km = v;
        }
        rule.validate()?;
        Ok(rule)
    }

    pub fn options(&self, insert_new: bool) -> LinkOptions {
        LinkOptions {
            top_k: self.top,
            shortlist: self.shortlist,
            batch: self.link_batch,
            insert_new,
            register: !self.no_register,
        }
    }
}

/// The engine over `index` with the model loaded, and the entries encoded for it.
pub fn encoded_entries(
    index: &std::path::Path,
    entries: &EntriesOpts,
    model: &ModelOpts,
) -> Result<(Engine, Vec<(ImageMeta, Descriptors)>)> {
    let loaded = entries.load()?;
    anyhow::ensure!(
        !loaded.items.is_empty(),
        "{}: no entries",
        entries
            .entries
            .as_deref()
            .unwrap_or(std::path::Path::new(""))
            .display()
    );
    let engine = Engine::open(index, None)?.with_extractor(Arc::new(model.load()?))?;
    let encoded = engine.encode_entries(&loaded, &Bars::new())?;
    Ok((engine, encoded))
}

pub fn run(c: LinkCmd) -> Result<()> {
    if !c.images.is_empty() {
        return run_images(c);
    }
    let rule = c.tuning.rule(&c.index)?;
    let (engine, entries) = encoded_entries(&c.index, &c.entries, &c.model)?;
    let before = engine.index().live();
    let (rows, grown) = link(
        &engine,
        entries,
        &rule,
        &c.tuning.options(c.insert_new),
        &Bars::new(),
    )?;
    let engine = grown.unwrap_or(engine);
    let regs = craterdex_workflows::registrations(&rows);
    let map = craterdex_workflows::output::MapLayers {
        body_radius_km: rule.body_radius_km,
        rims: c.rims,
    };
    let mut files = craterdex_workflows::output::write_links(&c.out, &rows, &map)?;
    craterdex_workflows::output::write_registrations(&c.out, &regs)?;
    craterdex_workflows::review::write_review(&c.out, &rows, 300)?;
    files.extend(["registrations.csv", "registrations.json", "review.html"].map(|f| c.out.join(f)));
    let written: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    if c.json {
        let decisions: serde_json::Map<String, serde_json::Value> = decision_counts(&rows)
            .into_iter()
            .map(|(d, n)| (d.name().to_string(), n.into()))
            .collect();
        let summary = serde_json::json!({
            "entries": rows.len(),
            "decisions": decisions,
            "rule": rule.source,
            "registrations": regs.iter().map(|r| (**r).clone()).collect::<Vec<_>>(),
            "index": {"dir": c.index.display().to_string(), "images_before": before, "images": engine.index().live()},
            "written": written,
        });
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(());
    }
    print_registrations(&regs);
    let counts = decision_counts(&rows)
        .map(|(d, n)| format!("{n} {}", d.name()))
        .join(", ");
    println!("{} entries: {counts} (rule: {})", rows.len(), rule.source);
    if c.insert_new {
        println!(
            "index {}: {} -> {} images",
            c.index.display(),
            before,
            engine.index().live()
        );
    }
    println!("wrote {}", crate::output::names_in(&c.out, &files));
    Ok(())
}

/// One line per source: its registration to the catalogue, or why it has none.
pub fn print_registrations(regs: &[Arc<craterdex_workflows::SourceRegistration>]) {
    for r in regs {
        let name = r.source.as_deref().unwrap_or("(entries without a source)");
        let placed = if r.registered {
            ""
        } else {
            "; positions compared as given"
        };
        println!("source {name}: {}{placed}", r.summary());
    }
}

/// Where the craters of the georeferenced images (their paths and source names) lie on
/// their body, if any image is.
fn craters_on_body(
    links: &ImageLinks,
    georeferenced: &[(&Path, &str)],
) -> Result<Option<CratersOnBody>> {
    let mut places = vec![None; links.craters.len()];
    let mut radii = Vec::new();
    for &(path, name) in georeferenced {
        let (at, craters): (Vec<usize>, Vec<_>) = links
            .craters
            .iter()
            .enumerate()
            .filter(|(_, c)| c.image == name)
            .map(|(i, c)| (i, (c.x, c.y, c.diameter_px)))
            .unzip();
        let (found, radius) = crate::cmd::detect::places_in(path, &craters)?;
        for (i, p) in at.into_iter().zip(found) {
            places[i] = Some(p);
        }
        radii.push((path, radius));
    }
    let radius = craterdex_workflows::output::shared_body_radius(radii)?;
    Ok(radius.map(|body_radius_km| CratersOnBody {
        places,
        body_radius_km,
    }))
}

/// An image read and searched for craters.
struct ReadImage<'a> {
    path: &'a Path,
    name: String,
    image: GrayImage,
    detections: Vec<Detection>,
    georeferenced: bool,
}

/// `link --image`: detect, then link, each image its own source.
fn run_images(c: LinkCmd) -> Result<()> {
    let rule = c.tuning.rule(&c.index)?;
    let engine = Engine::open(&c.index, None)?.with_extractor(Arc::new(c.model.load()?))?;
    let (config, net) = c.detector.load()?;
    let found = crate::cmd::detect::detect_images(
        &c.images,
        &config,
        &net,
        &c.detector.options(),
        "detect",
        |image| image,
    );
    let names = craterdex_workflows::output::source_names(&c.images);
    let mut failed = 0;
    let mut read = Vec::new();
    for ((path, name), result) in c.images.iter().zip(names).zip(found) {
        match result {
            Ok(Found {
                detections,
                on_body,
                image,
            }) => read.push(ReadImage {
                path,
                name,
                image,
                detections,
                georeferenced: on_body.is_some(),
            }),
            Err(e) => {
                failed += 1;
                eprintln!("{}: {e:#}", path.display());
            }
        }
    }
    let observed: Vec<ObservedImage> = read
        .iter()
        .map(|r| ObservedImage {
            source: r.name.clone(),
            image: &r.image,
            detections: r.detections.clone(),
        })
        .collect();
    let o = ImageLinkOptions {
        context: c.context,
        look_in_place: !c.detections_only,
        min_diameter: c.detector.options().min_diameter,
        ..Default::default()
    };
    let links = craterdex_workflows::link_images(
        &engine,
        &observed,
        &rule,
        &c.tuning.options(false),
        &o,
        &Bars::new(),
    )?;
    let regs = craterdex_workflows::images::image_registrations(&links);
    let georeferenced: Vec<(&Path, &str)> = read
        .iter()
        .filter(|r| r.georeferenced)
        .map(|r| (r.path, r.name.as_str()))
        .collect();
    let on_body = craters_on_body(&links, &georeferenced)?;
    let mut files =
        craterdex_workflows::output::write_image_links(&c.out, &links, on_body.as_ref())?;
    craterdex_workflows::output::write_registrations(&c.out, &regs)?;
    craterdex_workflows::review::write_image_review(&c.out, &links, &observed)?;
    files.extend(["registrations.csv", "registrations.json", "review.html"].map(|f| c.out.join(f)));
    if c.json {
        let summary = serde_json::json!({
            "images": links.images,
            "rule": rule.source,
            "written": files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        for s in &links.images {
            let reg = s
                .registration
                .as_ref()
                .map_or("not registered".into(), |r| r.summary());
            println!(
                "image {}: {} craters detected, {} catalogue craters looked for in place; {} matched, {} new; {reg}{}",
                s.image,
                s.detections,
                s.looked_for,
                s.matched,
                s.new,
                s.note.as_ref().map(|n| format!(" ({n})")).unwrap_or_default()
            );
        }
        println!("wrote {}", crate::output::names_in(&c.out, &files));
    }
    anyhow::ensure!(
        failed == 0,
        "{failed} of {} images could not be read or searched",
        c.images.len()
    );
    Ok(())
}
