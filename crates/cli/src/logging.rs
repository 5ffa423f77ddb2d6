//! Where the libraries' `tracing` events go: stderr. A command's own notes (info) read as
//! plain lines, warnings and errors say so; `serve` writes a service log instead (time,
//! level, source and fields on each line, the access log among them). `-v` adds debug then
//! trace events, `-q` keeps warnings and errors, `-qq` errors only.
//!
//! Installed before the command line is parsed, since parsing already runs library code
//! (option defaults that depend on the CPU, which may warn), then set to what it asks for.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::reload;
use tracing_subscriber::util::SubscriberInitExt;

/// The most verbose level shown: info by default, moved by `-v` and `-q`.
pub fn level(verbose: u8, quiet: u8) -> Level {
    match i16::from(verbose) - i16::from(quiet) {
        ..=-2 => Level::ERROR,
        -1 => Level::WARN,
        0 => Level::INFO,
        1 => Level::DEBUG,
        _ => Level::TRACE,
    }
}

/// The installed subscriber's settings, changed once the command line is read.
pub struct Logging {
    filter: Option<reload::Handle<LevelFilter, tracing_subscriber::Registry>>,
    service: Arc<AtomicBool>,
}

impl Logging {
    /// Shows events up to `level`; `service`: in the log format of a long-running server.
    pub fn configure(&self, level: Level, service: bool) {
        self.service.store(service, Ordering::Relaxed);
        if let Some(filter) = &self.filter {
            let _ = filter.reload(LevelFilter::from_level(level));
        }
    }
}

/// Installs the subscriber (info and above, plain lines) for this process.
pub fn install() -> Logging {
    use std::io::IsTerminal;
    let service = Arc::new(AtomicBool::new(false));
    let (filter, handle) = reload::Layer::new(LevelFilter::INFO);
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(|| AboveBars(Vec::new()))
        .with_ansi(std::io::stderr().is_terminal())
        .event_format(Lines {
            service: service.clone(),
        });
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(lines)
        .try_init()
        .is_ok();
    Logging {
        filter: installed.then_some(handle),
        service,
    }
}

/// One event's line, written above the progress bar on screen when it is complete.
struct AboveBars(Vec<u8>);

impl std::io::Write for AboveBars {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for AboveBars {
    fn drop(&mut self) {
        crate::output::above_bars(&self.0);
    }
}

/// Plain: `message key=value ...`, headed `warning:` or `error:` where it is one, as a
/// command line tool's own lines read (debug and trace events name their source). Service:
/// tracing's full format, with the time.
struct Lines {
    service: Arc<AtomicBool>,
}

impl<S, N> FormatEvent<S, N> for Lines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        if self.service.load(Ordering::Relaxed) {
            return tracing_subscriber::fmt::format::Format::default()
                .format_event(ctx, writer, event);
        }
        let meta = event.metadata();
        match *meta.level() {
            Level::ERROR => write!(writer, "error: ")?,
            Level::WARN => write!(writer, "warning: ")?,
            Level::INFO => {}
            _ => write!(writer, "{} {}: ", meta.level(), meta.target())?,
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosity_moves_the_level_both_ways_and_stops_at_the_ends() {
        assert_eq!(level(0, 0), Level::INFO);
        assert_eq!(level(1, 0), Level::DEBUG);
        assert_eq!(level(5, 0), Level::TRACE);
        assert_eq!(level(0, 1), Level::WARN);
        assert_eq!(level(0, 4), Level::ERROR);
        assert_eq!(level(2, 1), Level::DEBUG);
    }
}
