//! craterdex-serve: the search service behind `craterdex serve`.
//!
//! Owns: the JSON HTTP API under `/v1` (search by uploaded image, by precomputed backbone
//! features or by an indexed image; statistics, health and readiness; adding and removing
//! images behind an API key), its OpenAPI document, the web page, and the service's limits
//! (upload size, image dimensions, request timeout, a concurrency limit that sheds load with
//! 503, graceful shutdown). Every search and write goes through one craterdex-engine
//! `Engine` (the index, its encoder and, for images, the model). Knows nothing of
//! benchmarks, evaluation or the command line.
//!
//! Reads and writes: every request takes a snapshot (`Arc<Engine>`) of the open index. A write
//! goes through the index's atomic path (new segment or new manifest, then rename), is
//! serialised by one writer lock, and then the engine over the reopened index replaces the
//! snapshot, so a search sees the index either wholly before or wholly after a write.
//!
//! Modules: `router` (routes and limits), `handlers`, `features` (request bodies), `auth`
//! (keys and ids), `error` (the JSON error shape).

mod auth;
pub mod error;
pub mod features;
mod handlers;
mod router;

use anyhow::{Context, Result};
use craterdex_engine::{Engine, Extractor};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub use router::router;

type Svc = Arc<Service>;

/// The service's settings; `Config::new` gives the documented defaults.
#[derive(Clone, Debug)]
pub struct Config {
    pub index_dir: PathBuf,
    /// Where images added through the API are kept (content-addressed file names).
    pub upload_dir: PathBuf,
    /// Key for writes (and reads when `protect_reads`); writes are refused when `None`.
    pub api_key: Option<String>,
    pub protect_reads: bool,
    pub max_upload_bytes: usize,
    /// Largest accepted width or height of an uploaded image, in pixels.
    pub max_image_side: u32,
    pub request_timeout: Duration,
    /// Requests doing search work at once; more are answered 503 at once.
    pub max_concurrent: usize,
    /// Requests running the vision transformer at once (image search, adding images).
    pub max_concurrent_images: usize,
    pub max_top_k: usize,
    pub max_shortlist: usize,
    /// Use what can be decoded of truncated or corrupt uploads (default: 422).
    pub allow_partial_images: bool,
}

impl Config {
    pub fn new(index_dir: PathBuf) -> Self {
        let mut uploads = index_dir.clone().into_os_string();
        uploads.push(".uploads");
        Self {
            index_dir,
            upload_dir: PathBuf::from(uploads),
            api_key: None,
            protect_reads: false,
            max_upload_bytes: 16 << 20,
            max_image_side: 4096,
            request_timeout: Duration::from_secs(30),
            max_concurrent: 64,
            max_concurrent_images: 8,
            max_top_k: 1000,
            max_shortlist: 10_000,
            allow_partial_images: false,
        }
    }
}

/// Counters reported by `/v1/stats`.
#[derive(Default)]
struct Counters {
    searches: AtomicU64,
    image_searches: AtomicU64,
    added: AtomicU64,
    removed: AtomicU64,
    client_errors: AtomicU64,
}

/// Shared state of a running service.
pub struct Service {
    config: Config,
    engine: RwLock<Option<Arc<Engine>>>,
    load_error: RwLock<Option<String>>,
    draining: AtomicBool,
    writer: tokio::sync::Mutex<()>,
    counters: Counters,
    /// The link rule and position grid of the engine they were made for.
    link_cache: std::sync::Mutex<LinkCache>,
}

type LinkCache = Option<(
    std::sync::Weak<Engine>,
    Arc<(
        craterdex_workflows::LinkRule,
        craterdex_workflows::Neighbours,
    )>,
)>;

impl Service {
    /// A service that is not ready yet: call `load` (the server does it after binding, so
    /// health answers while a large index or the model loads).
    pub fn new(config: Config) -> Arc<Self> {
        Arc::new(Self {
            config,
            engine: RwLock::new(None),
            load_error: RwLock::new(None),
            draining: AtomicBool::new(false),
            writer: tokio::sync::Mutex::new(()),
            counters: Counters::default(),
            link_cache: std::sync::Mutex::new(None),
        })
    }

    /// Opens the index (verifying checksums) for queries from `extractor` (image searches
    /// and adds; without one, feature and similar-image searches only).
    pub fn load(&self, extractor: Option<Extractor>) -> Result<()> {
        match Engine::open(&self.config.index_dir, extractor.map(Arc::new)) {
            Ok(engine) => {
                self.replace_engine(engine);
                Ok(())
            }
            Err(e) => {
                *self.load_error.write().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
                Err(e.into())
            }
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The current engine snapshot, if loaded.
    fn snapshot(&self) -> Option<Arc<Engine>> {
        self.engine
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn replace_engine(&self, engine: Engine) {
        *self.engine.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(engine));
    }

    /// Marks the service as shutting down: readiness fails, in-flight requests finish.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }
}

/// Serves until `shutdown` resolves, then stops accepting connections and waits for
/// in-flight requests. `load` runs after the listener is bound (readiness reports it).
pub async fn run(
    listener: tokio::net::TcpListener,
    service: Arc<Service>,
    load: Box<dyn FnOnce() -> Result<Option<Extractor>> + Send>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    // A failed load (unreadable index, wrong model) stops the server with that error.
    let load_failed = Arc::new(tokio::sync::Notify::new());
    let loader = service.clone();
    let failed = load_failed.clone();
    let loading = tokio::spawn(async move {
        let r = tokio::task::spawn_blocking(move || loader.load(load()?))
            .await
            .context("the loader panicked")
            .and_then(|r| r);
        if r.is_err() {
            failed.notify_one();
        }
        r
    });
    let drain = service.clone();
    let app = router(service);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            tokio::select! {
                _ = shutdown => {},
                _ = load_failed.notified() => {},
            }
            drain.start_draining();
        })
        .await
        .context("server error")?;
    loading.await.context("the loader panicked")?
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Binds `addr`, serves until Ctrl-C or SIGTERM, and returns once in-flight requests are done.
pub fn serve_blocking(
    addr: &str,
    config: Config,
    load: Box<dyn FnOnce() -> Result<Option<Extractor>> + Send>,
) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let local = listener.local_addr()?;
        eprintln!(
            "craterdex serve: http://{local}/ (API under /v1, document at /v1/openapi.json); loading {}",
            config.index_dir.display()
        );
        let service = Service::new(config);
        run(listener, service, load, shutdown_signal()).await?;
        eprintln!("craterdex serve: stopped");
        Ok(())
    })
}
