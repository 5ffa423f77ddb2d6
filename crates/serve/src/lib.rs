//! craterdex-serve: the search service behind `craterdex serve`.
//!
//! Owns: answering the JSON HTTP API under `/v1` (search by uploaded image, by precomputed
//! backbone features or by an indexed image; linking an upload to the catalogue;
//! statistics, health and readiness; adding and removing images behind an API key) whose
//! types, readers, statuses, OpenAPI document and page are craterdex-api's (shared with
//! `craterdex.cluster`'s router); and the service's limits (upload size, image dimensions,
//! request timeout, a concurrency limit that sheds load with 503, graceful shutdown). Every search and write goes through one
//! [`craterdex_engine::SharedEngine`]: a request takes a snapshot of the engine, and a write
//! goes through the index's atomic path and swaps the engine over the changed index in
//! whole, so a search sees the index wholly before or wholly after a write. Knows nothing of
//! benchmarks, evaluation or the command line.
//!
//! Modules: `router` (routes and limits); the resources `search`, `images`, `link`,
//! `register` and `status`; `upload` (multipart forms and images), `auth` (keys), `guard`
//! (hosts and browsers), `error` (why the server could not run).

mod access;
mod auth;
pub mod connections;
mod error;
mod guard;
mod images;
mod link;
mod metrics;
mod register;
mod router;
mod search;
mod status;
mod upload;
mod work;

pub use error::{ApiError, Error};
pub use guard::LOOPBACK_HOSTS;
pub use router::router;

use craterdex_engine::{Engine, Extractor, MergePolicy, SearchLimits, SharedEngine};
use craterdex_errors::IoContext;
use error::ApiResult;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

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
    /// The largest searches a request may ask for.
    pub limits: SearchLimits,
    /// Use what can be decoded of truncated or corrupt uploads (default: 422).
    pub allow_partial_images: bool,
    /// How segments written by the API are merged in the background (`None`: never; every
    /// add then stays a segment of its own).
    pub merge: Option<MergePolicy>,
    /// Show where indexed images are stored (`meta.path`) in responses; off, the server's
    /// file paths stay on the server.
    pub expose_paths: bool,
    /// Connections open at once; one more is closed as it comes ([`serve_blocking`] keeps
    /// it under the open-files limit).
    pub max_connections: usize,
    /// Time a connection has to send a request's head, from its opening or the end of its
    /// last response; one that sends nothing for this long (idle, or half a head) is closed.
    pub header_timeout: Duration,
    /// Host names the server answers to (a request naming another gets 421: a page of
    /// another site that rebinds its name to this server's address is refused); `None` or
    /// `*` among them: any. [`serve_blocking`] defaults `None` to [`LOOPBACK_HOSTS`] on a
    /// loopback address.
    pub allowed_hosts: Option<Vec<String>>,
    /// The crater detector directory `POST /v1/link/image` runs (none: that route answers
    /// 501).
    pub detector: Option<PathBuf>,
    /// The arithmetic the detector runs in (`craterdex detect --detector-precision`; by
    /// default the fastest here, [`craterdex_detect::default_precision`]).
    pub detector_precision: craterdex_model::Precision,
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
            limits: craterdex_api::DEFAULT_LIMITS,
            allow_partial_images: false,
            merge: Some(MergePolicy::default()),
            expose_paths: false,
            max_connections: 1024,
            header_timeout: Duration::from_secs(10),
            allowed_hosts: None,
            detector: None,
            detector_precision: craterdex_detect::default_precision(),
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

impl Counters {
    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Shared state of a running service.
pub struct Service {
    config: Config,
    engine: OnceLock<SharedEngine>,
    load_error: RwLock<Option<String>>,
    draining: AtomicBool,
    counters: Counters,
    link_context: link::ContextCache,
    registrations: register::Registrations,
    /// Slots of requests doing work, and of those running the model ([`Config`]'s
    /// `max_concurrent` and `max_concurrent_images`), each held until the work has ended.
    search_slots: Arc<tokio::sync::Semaphore>,
    image_slots: Arc<tokio::sync::Semaphore>,
    metrics: metrics::Metrics,
    /// The configured crater detector, read when the index loads.
    detector: OnceLock<Arc<(craterdex_detect::DetectorConfig, craterdex_detect::Net)>>,
}

impl Service {
    /// A service that is not ready yet: call `load` (the server does it after binding, so
    /// health answers while a large index or the model loads).
    pub fn new(config: Config) -> Arc<Self> {
        let slots = |n: usize| Arc::new(tokio::sync::Semaphore::new(n.max(1)));
        Arc::new(Self {
            search_slots: slots(config.max_concurrent),
            image_slots: slots(config.max_concurrent_images),
            metrics: Default::default(),
            config,
            engine: OnceLock::new(),
            load_error: RwLock::new(None),
            draining: AtomicBool::new(false),
            counters: Counters::default(),
            link_context: Default::default(),
            registrations: Default::default(),
            detector: OnceLock::new(),
        })
    }

    /// Opens the index (verifying checksums) for queries from `extractor` (image searches
    /// and adds; without one, feature and similar-image searches only).
    pub fn load(&self, extractor: Option<Extractor>) -> Result<(), craterdex_engine::Error> {
        if let Some(dir) = &self.config.detector {
            let precision = self.config.detector_precision;
            match craterdex_detect::read_detector_dir(dir)
                .and_then(|(config, net)| Ok((config, net.with_precision(precision)?)))
            {
                Ok(d) => {
                    let _ = self.detector.set(Arc::new(d));
                }
                Err(e) => {
                    let message = format!("the crater detector {}: {e}", dir.display());
                    *self.load_error.write().unwrap_or_else(|e| e.into_inner()) =
                        Some(message.clone());
                    return Err(craterdex_engine::Error::Invalid(message));
                }
            }
        }
        match Engine::open(&self.config.index_dir, extractor.map(Arc::new)) {
            Ok(engine) => {
                // a second load keeps the first engine: the service loads once
                let shared = SharedEngine::new(engine);
                if let (Some(policy), Some(_)) = (&self.config.merge, &self.config.api_key) {
                    shared.merge_in_background(policy.clone());
                }
                let _ = self.engine.set(shared);
                Ok(())
            }
            Err(e) => {
                *self.load_error.write().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
                Err(e)
            }
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The engine, once loaded (503 before).
    fn shared(&self) -> ApiResult<&SharedEngine> {
        self.engine
            .get()
            .ok_or_else(|| ApiError::unavailable("the index is still loading; see /v1/ready"))
    }

    /// An image's metadata as a response shows it: without the server's file path unless
    /// the operator asked for paths.
    fn shown(&self, mut meta: craterdex_engine::ImageMeta) -> craterdex_engine::ImageMeta {
        if !self.config.expose_paths {
            meta.path = None;
        }
        meta
    }

    /// The engine as it is now.
    fn snapshot(&self) -> ApiResult<Arc<Engine>> {
        Ok(self.shared()?.snapshot())
    }

    /// Marks the service as shutting down: readiness fails, in-flight requests finish.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }
}

/// What loads the model before the index opens (run off the async threads).
pub type Loader = Box<dyn FnOnce() -> Result<Option<Extractor>, craterdex_engine::Error> + Send>;

/// Serves until `shutdown` resolves, then stops accepting connections and waits for
/// in-flight requests. `load` runs after the listener is bound (readiness reports it); a
/// failed load stops the server with that error.
pub async fn run(
    listener: tokio::net::TcpListener,
    service: Arc<Service>,
    load: Loader,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let load_failed = Arc::new(tokio::sync::Notify::new());
    let loader = service.clone();
    let failed = load_failed.clone();
    let loading = tokio::spawn(async move {
        let r = match tokio::task::spawn_blocking(move || loader.load(load()?)).await {
            Ok(r) => r.map_err(Error::Load),
            Err(e) => Err(Error::Loader(e.to_string())),
        };
        if r.is_err() {
            failed.notify_one();
        }
        r
    });
    let drain = service.clone();
    let limits = connections::ConnectionLimits {
        max_connections: service.config.max_connections,
        header_timeout: service.config.header_timeout,
    };
    let app = router(service);
    connections::serve(listener, app, limits, async move {
        tokio::select! {
            _ = shutdown => {},
            _ = load_failed.notified() => {},
        }
        drain.start_draining();
    })
    .await;
    loading.await.map_err(|e| Error::Loader(e.to_string()))?
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

/// File handles kept for the index's segments, the model, uploads and logs.
const FILES_BESIDE_CONNECTIONS: u64 = 128;

/// Binds `addr`, serves until Ctrl-C or SIGTERM, and returns once in-flight requests are done.
pub fn serve_blocking(addr: &str, config: Config, load: Loader) -> Result<(), Error> {
    let here = std::path::Path::new(addr);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .io("start the async runtime for", here)?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .io("listen on", here)?;
        let local = listener.local_addr().io("listen on", here)?;
        let mut config = config;
        if config.allowed_hosts.is_none() && local.ip().is_loopback() {
            config.allowed_hosts = Some(LOOPBACK_HOSTS.map(String::from).to_vec());
        }
        // the index, the model and the uploads need file handles beside the connections
        if let Some(open_files) = connections::raise_open_files_limit() {
            let room = open_files.saturating_sub(FILES_BESIDE_CONNECTIONS) as usize;
            config.max_connections = config.max_connections.min(room.max(1));
        }
        tracing::info!(
            "craterdex serve: http://{local}/ (API under /v1, document at /v1/openapi.json); loading {}",
            config.index_dir.display()
        );
        let service = Service::new(config);
        run(listener, service, load, shutdown_signal()).await?;
        tracing::info!("craterdex serve: stopped");
        Ok(())
    })
}
