//! Connections: at most so many at once (more are closed as they come), a time limit on
//! sending a request's head that also closes a connection idling between requests, and a
//! graceful stop (no new connections; each open one finishes its request in flight).
//! `axum::serve` sets neither limit, so idle and half-sent connections stayed open for ever
//! and took file handles from requests that would do work.

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// How long the accept loop waits after a failed accept (out of file handles, say) before
/// it tries again, so that it does not spin while connections close.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// What a connection may hold.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// Connections open at once; one more is closed as it is accepted.
    pub max_connections: usize,
    /// Time to send a request's head, from the connection's opening or the end of its last
    /// response: a connection that sends nothing for this long is closed.
    pub header_timeout: Duration,
}

/// Serves `app` on `listener` within `limits` until `shutdown` resolves, then stops
/// accepting and waits for every open connection to finish its request in flight.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: ConnectionLimits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => {
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // over the limit: closed at once, its file handle given back
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let connection = graceful.watch(
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone())),
        );
        tokio::spawn(async move {
            // a connection's end (closed, timed out, reset) is no failure of the server
            let _ = connection.await;
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Raises this process's soft limit on open files to its hard limit, so that the connection
/// limit and not the operating system's default (often 1024) bounds connections; returns the
/// soft limit now in force, where it is known.
pub fn raise_open_files_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit and setrlimit read and write the struct given, nothing else.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return None;
            }
            if limit.rlim_cur < limit.rlim_max {
                let raised = libc::rlimit {
                    rlim_cur: limit.rlim_max,
                    ..limit
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                    limit = raised;
                }
            }
        }
        // rlim_t is u64 on Linux, not on every Unix
        #[allow(clippy::unnecessary_cast)]
        Some(limit.rlim_cur as u64)
    }
    #[cfg(not(unix))]
    {
        None
    }
}
