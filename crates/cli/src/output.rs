//! Everything the command line prints: progress bars (rate and ETA, hidden when stderr is not
//! a terminal), result tables and JSON.

use anyhow::Result;
use craterdex_engine::{Progress, QueryHits};
use indicatif::{ProgressBar, ProgressStyle};
use std::sync::Mutex;

/// The bar last put on screen: log lines are written above it, not through it.
static SHOWN: Mutex<Option<ProgressBar>> = Mutex::new(None);

fn shown(pb: ProgressBar) -> ProgressBar {
    *SHOWN.lock().unwrap_or_else(|e| e.into_inner()) = Some(pb.clone());
    pb
}

/// Writes `text` to stderr, above the bar on screen while there is one.
pub fn above_bars(text: &[u8]) {
    use std::io::Write;
    let write = || {
        let _ = std::io::stderr().write_all(text);
    };
    let bar = SHOWN.lock().unwrap_or_else(|e| e.into_inner()).clone();
    match bar.filter(|pb| !pb.is_finished() && !pb.is_hidden()) {
        Some(pb) => pb.suspend(write),
        None => write(),
    }
}

/// A bar of `len` steps labelled `what`.
pub fn bar(len: usize, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len as u64);
    pb.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:32}] {pos}/{len} {per_sec} ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    shown(pb)
}

/// The engine's progress drawn as bars on stderr; notes printed above them.
#[derive(Default)]
pub struct Bars {
    current: Mutex<Option<ProgressBar>>,
}

impl Bars {
    pub fn new() -> Self {
        Self::default()
    }
    fn with<T>(&self, f: impl FnOnce(&mut Option<ProgressBar>) -> T) -> T {
        f(&mut self.current.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Progress for Bars {
    fn start(&self, what: &str, total: usize) {
        self.with(|c| *c = Some(bar(total, what)));
    }
    fn advance(&self, done: usize) {
        self.with(|c| {
            if let Some(pb) = c {
                pb.set_position(done as u64);
            }
        });
    }
    fn finish(&self) {
        self.with(|c| {
            if let Some(pb) = c.take() {
                pb.finish();
            }
        });
    }
    fn note(&self, message: &str) {
        self.with(|c| match c {
            Some(pb) => pb.suspend(|| eprintln!("{message}")),
            None => eprintln!("{message}"),
        });
    }
}

/// A download's bytes as a bar with rate and ETA, one per file.
#[derive(Default)]
pub struct DownloadBar {
    current: Option<ProgressBar>,
}

impl craterdex_fetch::DownloadProgress for DownloadBar {
    fn start(&mut self, file: &str, bytes: u64) {
        if let Some(pb) = &self.current {
            // a retry starts the same file again and reports the bytes it resumes from
            pb.set_length(bytes);
            pb.set_position(0);
            return;
        }
        let pb = ProgressBar::new(bytes);
        pb.set_style(
            ProgressStyle::with_template(
                "{msg:>24} [{bar:32}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        pb.set_message(file.to_string());
        self.current = Some(shown(pb));
    }
    fn advance(&mut self, bytes: u64) {
        if let Some(pb) = &self.current {
            pb.inc(bytes);
        }
    }
    fn finish(&mut self) {
        if let Some(pb) = self.current.take() {
            pb.finish();
        }
    }
}

/// `DIR/first, second, ...`: files written in one directory, named once.
pub fn names_in(dir: &std::path::Path, files: &[std::path::PathBuf]) -> String {
    let names: Vec<String> = files
        .iter()
        .map(|f| {
            f.file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default()
        })
        .collect();
    format!("{}/{}", dir.display(), names.join(", "))
}

/// Pretty JSON on stdout.
pub fn print_json(value: &impl serde::Serialize) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// One query's search results as a table (with inliers and scores where it was verified).
pub fn hits_table(q: &QueryHits) -> String {
    use std::fmt::Write;
    let f = |v: Option<f32>| v.map(|v| format!("{v:.4}")).unwrap_or_else(|| "-".into());
    // a verified search ranks by late interaction and inliers: show both
    let verified = q.results.iter().any(|h| h.inliers.is_some());
    let mut table = format!("query {}\n", q.query);
    let _ = write!(
        table,
        "  {:>4}  {:<32} {:<20} {:>8} {:>8}",
        "rank", "image", "crater", "stage1", "stage2"
    );
    if verified {
        let _ = write!(table, " {:>7} {:>8}", "inliers", "score");
    }
    table.push('\n');
    for h in &q.results {
        let _ = write!(
            table,
            "  {:>4}  {:<32} {:<20} {:>8} {:>8}",
            h.rank,
            h.id,
            h.crater_id.as_deref().unwrap_or("-"),
            f(h.stage1),
            f(h.stage2)
        );
        if verified {
            let inliers = h.inliers.map_or("-".to_string(), |n| n.to_string());
            let _ = write!(table, " {inliers:>7} {:>8.4}", h.score);
        }
        table.push('\n');
    }
    table
}
