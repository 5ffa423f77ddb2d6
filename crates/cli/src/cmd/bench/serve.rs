//! `craterdex bench serve`: a bounded load test of `craterdex serve` on loopback.
//!
//! Starts the server as a child process on a free port, then for a fixed time keeps N client
//! connections busy with feature searches (JSON bodies of real query features), then with
//! image uploads (multipart), and reports sustained requests/s, p50/p99 latency, errors and
//! the server's resident memory sampled through the run. Client and server share the
//! machine's cores, as they would with wrk or oha on the same host.

use super::client::Client;
use crate::output::Bars;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct ServeBench {
    /// The index to serve.
    #[arg(long)]
    index: PathBuf,
    /// Benchmark manifest whose query images make the requests.
    #[arg(long)]
    manifest: PathBuf,
    /// Distinct queries cycled through.
    #[arg(long, default_value_t = 64)]
    queries: usize,
    /// Seconds per phase.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Concurrent connections for feature searches.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Concurrent connections for image uploads.
    #[arg(long, default_value_t = 2)]
    image_concurrency: usize,
    /// Extra arguments for `craterdex serve`, e.g. "--max-concurrent-images 4".
    #[arg(long, allow_hyphen_values = true)]
    serve_args: Option<String>,
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    model: crate::args::ModelOpts,
}

struct Server {
    child: Child,
    /// host:port on loopback.
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(b: &ServeBench) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let exe = std::env::current_exe().context("cannot find the craterdex binary")?;
        let mut cmd = Command::new(exe);
        // --quiet: the access log of thousands of requests would bury the bench's table
        cmd.arg("--quiet")
            .arg("serve")
            .arg("--index")
            .arg(&b.index)
            .arg("--addr")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--resize")
            .arg(serde_json::to_string(&b.model.choice.resize)?.trim_matches('"'));
        if let Some(m) = &b.model.choice.model {
            cmd.arg("--model").arg(m);
        }
        if let Some(s) = b.model.choice.size {
            cmd.arg("--size").arg(s.to_string());
        }
        if let Some(extra) = &b.serve_args {
            cmd.args(extra.split_whitespace());
        }
        let child = cmd.stdout(Stdio::null()).stderr(Stdio::inherit()).spawn()?;
        let server = Server {
            child,
            addr: format!("127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(300);
        let mut client = Client::new(&server.addr, Duration::from_secs(2))?;
        while Instant::now() < deadline {
            if client.get("/v1/ready").is_ok_and(|a| a.status == 200) {
                return Ok(server);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        bail!("the server did not become ready within 300 s")
    }

    fn rss_mb(&self) -> f64 {
        super::proc_status_kb(&format!("/proc/{}/status", self.child.id()), "VmRSS:")
            .map_or(f64::NAN, |kb| kb / 1024.0)
    }

    fn stop(mut self) -> Result<bool> {
        // SIGTERM: the graceful path a service manager uses.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status.success());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(false)
    }
}

struct Request {
    path: String,
    content_type: String,
    body: Vec<u8>,
}

#[derive(Default)]
struct Outcome {
    latencies_ms: Vec<f64>,
    errors: Vec<String>,
}

/// Keeps `concurrency` connections busy for `seconds`, sampling the server's memory.
fn phase(
    server: &Server,
    requests: &[Request],
    concurrency: usize,
    seconds: u64,
) -> (Outcome, f64, Vec<f64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let outcome = Arc::new(Mutex::new(Outcome::default()));
    let start = Instant::now();
    let rss = std::thread::scope(|s| {
        for c in 0..concurrency {
            let (stop, outcome) = (stop.clone(), outcome.clone());
            let addr = server.addr.clone();
            s.spawn(move || {
                let mut local = Outcome::default();
                let mut client = match Client::new(&addr, Duration::from_secs(60)) {
                    Ok(c) => c,
                    Err(e) => {
                        local.errors.push(e.to_string());
                        stop.store(true, Ordering::Relaxed);
                        return;
                    }
                };
                let mut i = c;
                while !stop.load(Ordering::Relaxed) {
                    let r = &requests[i % requests.len()];
                    i += concurrency;
                    let t = Instant::now();
                    match client.post(&r.path, &r.content_type, &r.body) {
                        Ok(a) if a.status == 200 => {
                            local.latencies_ms.push(t.elapsed().as_secs_f64() * 1e3)
                        }
                        Ok(a) => local.errors.push(format!(
                            "{}: {}",
                            a.status,
                            String::from_utf8_lossy(&a.body)
                        )),
                        Err(e) => local.errors.push(format!("{e:#}")),
                    }
                }
                let mut o = outcome.lock().unwrap_or_else(|e| e.into_inner());
                o.latencies_ms.extend(local.latencies_ms);
                o.errors.extend(local.errors);
            });
        }
        let mut rss = vec![server.rss_mb()];
        let end = start + Duration::from_secs(seconds);
        while Instant::now() < end {
            std::thread::sleep(Duration::from_millis(250));
            rss.push(server.rss_mb());
        }
        stop.store(true, Ordering::Relaxed);
        rss
    });
    let secs = start.elapsed().as_secs_f64();
    let outcome = Arc::try_unwrap(outcome)
        .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
        .unwrap_or_default();
    (outcome, secs, rss)
}

fn multipart(bytes: &[u8], filename: &str) -> (String, Vec<u8>) {
    let boundary = "craterdexbench0b3c9f";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(bytes);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

pub fn run(b: ServeBench) -> Result<()> {
    let bench = craterdex_eval::manifest::load(&b.manifest, None)?;
    let mut items = bench.query_items();
    items.truncate(b.queries.max(1));
    let feats = b.model.load()?.extract(&items, "queries", &Bars::new())?;
    // Feature queries in both body formats the API takes: safetensors (the format of
    // `craterdex extract`, 0.4 MB per query) and JSON (2 MB of decimal text per query).
    let path = "/v1/search/features?top_k=10&shortlist=100";
    let mut st_requests = Vec::new();
    let mut json_requests = Vec::new();
    for i in 0..feats.len() {
        let (d, t) = (feats.dim, feats.tokens);
        let view = craterdex_model::extract::f32_view;
        let tensors = vec![
            ("cls", view(vec![d], feats.cls_of(i))?),
            ("patch_tokens", view(vec![t, d], feats.patches_of(i))?),
            ("attention", view(vec![t], feats.attention_of(i))?),
        ];
        st_requests.push(Request {
            path: path.into(),
            content_type: "application/octet-stream".into(),
            body: safetensors::serialize(tensors, &None)?,
        });
        json_requests.push(Request {
            path: path.into(),
            content_type: "application/json".into(),
            body: serde_json::to_vec(&serde_json::json!({
                "cls": feats.cls_of(i),
                "patches": feats.patches_of(i),
                "attention": feats.attention_of(i),
            }))?,
        });
    }
    let image_requests: Vec<Request> = items
        .iter()
        .map(|(id, path)| {
            let bytes =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            let (content_type, body) = multipart(&bytes, id);
            Ok(Request {
                path: "/v1/search/image?top_k=10&shortlist=100".into(),
                content_type,
                body,
            })
        })
        .collect::<Result<_>>()?;

    let server = Server::start(&b)?;
    let idle_rss = server.rss_mb();
    eprintln!(
        "server ready at {} ({idle_rss:.0} MB resident); {} s per phase",
        server.addr, b.seconds
    );
    let mut rows = Vec::new();
    println!(
        "{:<10} {:>5} {:>9} {:>7} {:>9} {:>8} {:>8}  server RSS MB at 0, 25, 50, 75, 100% of the phase",
        "phase", "conc", "requests", "errors", "req/s", "p50 ms", "p99 ms"
    );
    for (name, requests, conc) in [
        ("features", &st_requests, b.concurrency),
        ("feat-json", &json_requests, b.concurrency),
        ("images", &image_requests, b.image_concurrency),
    ] {
        let (out, secs, rss) = phase(&server, requests, conc.max(1), b.seconds);
        let mut lat = out.latencies_ms;
        lat.sort_by(f64::total_cmp);
        let pct = |p: f64| super::percentile(&lat, p);
        let rate = lat.len() as f64 / secs;
        let quarters: Vec<f64> = (0..=4).map(|q| rss[(rss.len() - 1) * q / 4]).collect();
        let max = rss.iter().copied().fold(f64::NAN, f64::max);
        println!(
            "{name:<10} {conc:>5} {:>9} {:>7} {rate:>9.1} {:>8.2} {:>8.2}  {} (max {max:.0})",
            lat.len(),
            out.errors.len(),
            pct(0.5),
            pct(0.99),
            quarters
                .iter()
                .map(|v| format!("{v:.0}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        for e in out.errors.iter().take(3) {
            eprintln!("  {name} error: {e}");
        }
        rows.push(serde_json::json!({
            "phase": name, "concurrency": conc, "seconds": secs, "requests": lat.len(),
            "errors": out.errors.len(), "requests_per_s": rate, "p50_ms": pct(0.5), "p99_ms": pct(0.99),
            "rss_mb_quarters": quarters, "rss_mb_max": max,
        }));
    }
    let clean = server.stop()?;
    println!(
        "SIGTERM: server {}",
        if clean {
            "stopped cleanly"
        } else {
            "did NOT stop cleanly"
        }
    );
    if let Some(p) = &b.json {
        let doc = serde_json::json!({"index": b.index, "idle_rss_mb": idle_rss, "phases": rows, "clean_shutdown": clean});
        craterdex_durable::write_atomic(p, &serde_json::to_vec_pretty(&doc)?)?;
    }
    Ok(())
}
