//! `craterdex bench search-images`: what the default search of one query image costs, by
//! kind of query (upright, turned, relit, ...: each a benchmark split, of one catalogue or
//! several), at
//! every kernel level this CPU runs (each level a child process, `CRATERDEX_KERNEL` set, the
//! level being fixed per process), in one run: latency p50/p99, forward passes and stages
//! per query, each kind's cost as a multiple of the first kind's, R@1 and peak memory.

use crate::args::{ModelOpts, SearchOpts};
use anyhow::{bail, Context, Result};
use clap::Args;
use craterdex_engine::{search, Engine, Extractor, SearchInput, Silent};
use craterdex_kernels::level::Level;
use craterdex_model::extract::read_image;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use strum::VariantNames;

#[derive(Args)]
pub struct SearchImagesBench {
    /// The catalogue searched.
    #[arg(long)]
    index: PathBuf,
    /// A kind of query and the benchmark manifest of its images, `NAME=MANIFEST` (e.g.
    /// `upright=bench/splits/test.json`). The first kind is the reference the others' costs
    /// are divided by.
    #[arg(long = "split", required = true, value_parser = parse_split)]
    splits: Vec<(String, PathBuf)>,
    /// Another catalogue for one kind, `NAME=INDEX` (the other kinds search --index), so
    /// that kinds from several benchmarks share one reference. Same model.
    #[arg(long = "index-for", value_parser = parse_split)]
    index_for: Vec<(String, PathBuf)>,
    /// Queries timed per kind (the first of each manifest), searched one at a time.
    #[arg(long, default_value_t = 20)]
    queries: usize,
    /// Kernel levels to time (default: every level this CPU runs).
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::PossibleValuesParser::new(Level::VARIANTS))]
    levels: Vec<String>,
    #[command(flatten)]
    search: SearchOpts,
    #[command(flatten)]
    model: ModelOpts,
    /// Internal: run at this process's kernel level only and write the rows here.
    #[arg(long, hide = true)]
    worker: Option<PathBuf>,
}

fn parse_split(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => {
            Ok((name.to_string(), PathBuf::from(path)))
        }
        _ => Err(format!("expected NAME=PATH, not {s:?}")),
    }
}

impl SearchImagesBench {
    /// The catalogue each kind searches, each opened once.
    fn catalogues(&self, extractor: &Arc<Extractor>) -> Result<Vec<(PathBuf, Engine)>> {
        let mut dirs = vec![self.index.clone()];
        for (_, dir) in &self.index_for {
            if !dirs.contains(dir) {
                dirs.push(dir.clone());
            }
        }
        dirs.into_iter()
            .map(|d| {
                let engine = Engine::open(&d, Some(extractor.clone()))
                    .with_context(|| format!("opening {}", d.display()))?;
                Ok((d, engine))
            })
            .collect()
    }

    /// Which of [`Self::catalogues`] the kind `name` searches.
    fn catalogue_of<'e>(&self, name: &str, engines: &'e [(PathBuf, Engine)]) -> &'e Engine {
        let dir = self
            .index_for
            .iter()
            .find(|(k, _)| k == name)
            .map_or(&self.index, |(_, d)| d);
        let (_, engine) = engines
            .iter()
            .find(|(d, _)| d == dir)
            .unwrap_or(&engines[0]);
        engine
    }
}

/// One kind of query at one level.
#[derive(Serialize, Deserialize)]
struct Row {
    level: String,
    precision: String,
    kind: String,
    /// `first`: the kinds' first pass; `again`: the same queries again, the candidates'
    /// features now in the feature cache.
    cache: String,
    /// Each query's milliseconds, ascending.
    ms: Vec<f64>,
    /// Forward passes per query, on average.
    passes: f64,
    /// Stages that searched a query, on average (1: the search as given answered).
    stages: f64,
    /// Queries whose first hit is one of their relevant craters.
    right: usize,
    /// The process's peak resident memory when this kind was done, MB.
    peak_mb: f64,
}

/// A query image, `(id, path)`, and the craters that answer it.
type Query = ((String, PathBuf), Vec<String>);

/// The first `n` queries of a manifest.
type Queries = Vec<Query>;

fn queries_of(manifest: &std::path::Path, n: usize) -> Result<Queries> {
    let bench = craterdex_eval::manifest::load(manifest, None)?;
    let queries: Queries = bench
        .query_items()
        .into_iter()
        .zip(bench.relevance.iter().map(|r| r.iter().cloned().collect()))
        .take(n)
        .collect();
    if queries.is_empty() {
        bail!("{}: no query images", manifest.display());
    }
    Ok(queries)
}

/// One kind's queries searched one at a time, each decoded within its time and handed over
/// as pixels (so that the feature cache never serves the query itself; the candidates that
/// verification reads from the index are served by it once a pass has run).
fn time_kind(
    engine: &Engine,
    extractor: &Extractor,
    b: &SearchImagesBench,
    (kind, cache): (&str, &str),
    queries: &[Query],
) -> Result<Row> {
    let options = b.search.options();
    let (mut ms, mut passes, mut stages, mut right) = (Vec::new(), 0u64, 0usize, 0usize);
    for ((id, path), relevant) in queries {
        let before = extractor.vit().images_run();
        let t = std::time::Instant::now();
        let image = read_image(id, path, false)
            .map_err(|f| anyhow::anyhow!("{}: {}", f.path.display(), f.error))?;
        let answer = search(
            engine,
            SearchInput::Decoded {
                ids: std::slice::from_ref(id),
                images: std::slice::from_ref(&image),
            },
            &options,
            &Silent,
        )
        .with_context(|| format!("searching {}", path.display()))?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        passes += extractor.vit().images_run() - before;
        stages += answer
            .stages
            .iter()
            .filter(|s| s.searched > 0)
            .count()
            .max(1);
        let first = answer
            .hits
            .first()
            .and_then(|h| h.results.first())
            .and_then(|h| h.crater_id.as_deref());
        right += usize::from(first.is_some_and(|c| relevant.iter().any(|r| r == c)));
    }
    ms.sort_by(f64::total_cmp);
    let n = queries.len() as f64;
    Ok(Row {
        level: craterdex_kernels::active().to_string(),
        precision: extractor.vit().precision().to_string(),
        kind: kind.to_string(),
        cache: cache.to_string(),
        ms,
        passes: passes as f64 / n,
        stages: stages as f64 / n,
        right,
        peak_mb: super::proc_status_kb("/proc/self/status", "VmHWM:").unwrap_or(f64::NAN) / 1e3,
    })
}

/// This process's level: every kind twice, the first pass with the feature cache as found
/// (cold for a new catalogue), the second with it holding what the first pass verified
/// against; one query of each kind searched untimed before (the index's pages and the
/// model's buffers).
fn worker(b: &SearchImagesBench) -> Result<Vec<Row>> {
    let kinds = b
        .splits
        .iter()
        .map(|(name, m)| Ok((name.as_str(), queries_of(m, b.queries)?)))
        .collect::<Result<Vec<_>>>()?;
    let extractor = Arc::new(Extractor::load(&b.model.options(), &Silent)?);
    let engines = b.catalogues(&extractor)?;
    for (kind, queries) in &kinds {
        let engine = b.catalogue_of(kind, &engines);
        time_kind(engine, &extractor, b, ("warm-up", ""), &queries[..1])?;
    }
    let mut rows = Vec::new();
    for cache in ["first", "again"] {
        for (kind, queries) in &kinds {
            let engine = b.catalogue_of(kind, &engines);
            rows.push(time_kind(engine, &extractor, b, (kind, cache), queries)?);
        }
    }
    Ok(rows)
}

pub fn run(b: SearchImagesBench) -> Result<()> {
    if let Some(path) = &b.worker {
        let rows = worker(&b)?;
        return Ok(std::fs::write(path, serde_json::to_vec(&rows)?)?);
    }
    if b.queries == 0 {
        bail!("--queries must be at least 1");
    }
    if let Some((name, _)) = b
        .index_for
        .iter()
        .find(|(name, _)| !b.splits.iter().any(|(k, _)| k == name))
    {
        bail!("--index-for {name}: no --split of that name");
    }
    for (_, m) in &b.splits {
        queries_of(m, b.queries)?;
    }
    let levels = super::chosen_levels(&b.levels)?;
    let rows: Vec<Row> = super::rows_per_level(&levels)?;
    let search = match b.search.recheck_views {
        Some(n) => format!("the rechecked search within {n} views a query"),
        None => "the default search".to_string(),
    };
    print!("{}", table(&rows, &b.splits[0].0, &search));
    Ok(())
}

/// The rows as a table, each level's kinds against its `reference` kind in the same pass.
fn table(rows: &[Row], reference: &str, search: &str) -> String {
    let threads = rayon::current_num_threads();
    let mut s = format!(
        "{}\n{search}, {threads} thread{}, one query image at a time, decoded within \
         its time; pass first: the feature cache as found, again: the same queries again, the \
         candidates that verification reads in the cache; x {reference}: against the \
         {reference} queries of the same level and pass; peak MB: the process's so far\n\
         {:<8} {:<9} {:<16} {:<6} {:>4} {:>9} {:>9} {:>9} {:>7} {:>7} {:>9} {:>9} {:>6} {:>8}\n",
        craterdex_kernels::level::describe(),
        if threads == 1 { "" } else { "s" },
        "level",
        "precision",
        "queries",
        "pass",
        "n",
        "p50 ms",
        "p99 ms",
        "mean ms",
        "passes",
        "stages",
        "x passes",
        "x p50 ms",
        "R@1",
        "peak MB"
    );
    for r in rows.iter() {
        let base = rows
            .iter()
            .find(|b| b.level == r.level && b.cache == r.cache && b.kind == reference)
            .unwrap_or(r);
        let p50 = super::percentile(&r.ms, 0.5);
        let mean = r.ms.iter().sum::<f64>() / r.ms.len().max(1) as f64;
        s += &format!(
            "{:<8} {:<9} {:<16} {:<6} {:>4} {:>9.1} {:>9.1} {:>9.1} {:>7.2} {:>7.2} {:>9.2} \
             {:>9.2} {:>6.3} {:>8.0}\n",
            r.level,
            r.precision,
            r.kind,
            r.cache,
            r.ms.len(),
            p50,
            super::percentile(&r.ms, 0.99),
            mean,
            r.passes,
            r.stages,
            r.passes / base.passes,
            p50 / super::percentile(&base.ms, 0.5),
            r.right as f64 / r.ms.len().max(1) as f64,
            r.peak_mb
        );
    }
    s
}
