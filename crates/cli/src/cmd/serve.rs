//! `craterdex serve`: the HTTP service over one index.

use crate::args::ModelChoice;
use crate::output::Bars;
use anyhow::{bail, Context, Result};
use clap::Args;
use craterdex_engine::Extractor;
use std::path::PathBuf;

#[derive(Args)]
pub struct ServeCmd {
    #[arg(long)]
    index: PathBuf,
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: String,
    #[command(flatten)]
    model: ModelChoice,
    /// Serve feature and similar-image searches only, without loading a model.
    #[arg(long)]
    no_model: bool,
    /// Run the candidates that a verified or rechecked search reads through the model
    /// every time, without the on-disk feature cache ($CRATERDEX_HOME/features, keyed by
    /// the image's content and the model), which otherwise serves an image read before.
    #[arg(long)]
    no_cache: bool,
    /// File holding the API key for writes; without a key, adding and removing images is
    /// disabled.
    #[arg(long, conflicts_with = "api_key")]
    api_key_file: Option<PathBuf>,
    /// The API key for writes (prefer the environment variable or --api-key-file: other
    /// users can read a command line).
    #[arg(long, env = "CRATERDEX_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Require the API key for reads too.
    #[arg(long)]
    protect_reads: bool,
    /// Where images added through the API are stored (default: <index>.uploads).
    #[arg(long)]
    upload_dir: Option<PathBuf>,
    #[arg(long, default_value_t = defaults().max_upload_bytes >> 20)]
    max_upload_mb: usize,
    #[arg(long, default_value_t = defaults().max_image_side)]
    max_image_side: u32,
    /// Use what can be decoded of truncated or corrupt uploads instead of answering 422.
    #[arg(long)]
    allow_partial_images: bool,
    /// The most views of one query image a search runs through the model, whatever the
    /// request: `turns`/`opposite_sun` past it get 400, and a rechecked search runs within
    /// it (a request's own `recheck_views` may ask less). 3: a query costs at most three
    /// forward passes (docs/results.md, "A search of bounded cost"). Default: no bound.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    max_query_views: Option<u16>,
    /// Time a request has, from its head to its answer; past it the request gets 408 and
    /// its work stops (a write before its commit point writes nothing).
    #[arg(long, default_value_t = defaults().request_timeout.as_secs())]
    timeout_secs: u64,
    /// Requests doing work at once; more are answered 503. A request's slot is held until
    /// its work has ended, past a timeout too.
    #[arg(long, default_value_t = defaults().max_concurrent)]
    max_concurrent: usize,
    /// Requests running the model at once (image search, adding and linking images).
    #[arg(long, default_value_t = defaults().max_concurrent_images)]
    max_concurrent_images: usize,
    /// Connections open at once; more are closed as they come (kept under the open-files
    /// limit, which the server raises to its hard limit).
    #[arg(long, default_value_t = defaults().max_connections)]
    max_connections: usize,
    /// Seconds a connection has to send a request's head, from its opening or its last
    /// answer; idle and half-sent connections are closed after it.
    #[arg(long, default_value_t = defaults().header_timeout.as_secs())]
    header_timeout_secs: u64,
    /// A host name the server answers to (repeat for more; `*`: any). Default: on a loopback
    /// address localhost, 127.0.0.1 and ::1, so that a web page of another site cannot
    /// rebind its name to this server and read it; elsewhere any.
    #[arg(long = "allowed-host", value_name = "HOST")]
    allowed_hosts: Vec<String>,
    /// Show where indexed images are stored (`meta.path`) in responses; by default the
    /// server's file paths stay on the server.
    #[arg(long)]
    expose_paths: bool,
    /// Segments written through the API are merged in the background (module docs of
    /// craterdex-index's merge; docs/formats/index.md).
    #[command(flatten)]
    merge: crate::args::MergeOpts,
    /// The crater detector `POST /v1/link/image` runs on whole images: a detector directory,
    /// a name under $CRATERDEX_HOME/detectors (pycda-unet is fetched from PyPI on first use)
    /// or a Keras or ONNX file. Without one that route answers 501.
    #[arg(long)]
    detector: Option<String>,
    /// Arithmetic of the detector's products (as `craterdex detect --detector-precision`):
    /// int8 is the fastest on CPUs with VNNI or AMX.
    #[arg(long, default_value_t = defaults().detector_precision, requires = "detector")]
    detector_precision: craterdex_model::Precision,
}

/// The service's documented defaults (one place: `craterdex_serve::Config::new`).
fn defaults() -> craterdex_serve::Config {
    craterdex_serve::Config::new(PathBuf::new())
}

pub fn run(c: ServeCmd) -> Result<()> {
    let mut config = craterdex_serve::Config::new(c.index.clone());
    config.api_key = match &c.api_key_file {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .with_context(|| format!("cannot read the API key file {}", f.display()))?
                .trim()
                .to_string(),
        ),
        None => c.api_key.clone(),
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
    config.allow_partial_images = c.allow_partial_images;
    config.limits.max_query_views = c.max_query_views.map(usize::from);
    config.request_timeout = std::time::Duration::from_secs(c.timeout_secs.max(1));
    config.max_concurrent = c.max_concurrent.max(1);
    config.max_concurrent_images = c.max_concurrent_images.max(1);
    config.max_connections = c.max_connections.max(1);
    config.header_timeout = std::time::Duration::from_secs(c.header_timeout_secs.max(1));
    config.merge = c.merge.policy();
    config.expose_paths = c.expose_paths;
    config.allowed_hosts = Some(c.allowed_hosts).filter(|hosts| !hosts.is_empty());
    config.detector = c
        .detector
        .as_deref()
        .map(|d| craterdex_fetch::detector_dir(d, 1.0 / 255.0))
        .transpose()?;
    config.detector_precision = c.detector_precision;
    if c.no_model && c.model.model.is_some() {
        bail!("--no-model and --model exclude each other");
    }
    let options = craterdex_engine::ModelOptions {
        cache: !c.no_cache,
        ..c.model.options()
    };
    let no_model = c.no_model;
    craterdex_serve::serve_blocking(
        &c.addr,
        config,
        Box::new(move || {
            if no_model {
                return Ok(None);
            }
            Extractor::load(&options, &Bars::new()).map(Some)
        }),
    )?;
    Ok(())
}
