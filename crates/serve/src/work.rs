//! A request's work: admitted into a bounded number of slots (503 at once when they are
//! taken), run off the async threads holding its slots until the work itself has ended (not
//! only until the client was answered), and stopped when the request is given up (a timeout,
//! a client gone): the engine checks between forward passes and between a search's stages.
//! A write has one commit point: before it, giving up leaves nothing written; from it on, the
//! write finishes and its request is answered with its outcome, timeout or not.

use crate::error::{ApiError, ApiResult};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// The slots a request holds, each released once the request and its work have both ended.
#[derive(Clone, Default)]
pub struct Admission(Vec<Arc<OwnedSemaphorePermit>>);

/// Admits a request into one slot of `slots` (503 at once when all are taken), keeping the
/// slots of any group it was admitted to before.
pub async fn admit(State(slots): State<Arc<Semaphore>>, mut req: Request, next: Next) -> Response {
    let Ok(permit) = slots.try_acquire_owned() else {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many requests in flight; retry shortly",
        )
        .into_response();
    };
    let mut admission = req
        .extensions()
        .get::<Admission>()
        .cloned()
        .unwrap_or_default();
    admission.0.push(Arc::new(permit));
    req.extensions_mut().insert(admission);
    next.run(req).await
}

const RUNNING: u8 = 0;
const GIVEN_UP: u8 = 1;
const COMMITTING: u8 = 2;

/// What a request's work and the request agree on: whether the request still waits, and
/// whether the work has passed its commit point.
#[derive(Default)]
pub struct Ticket(AtomicU8);

impl Ticket {
    /// The work is about to change stored data: from here on it finishes. Fails where the
    /// request was given up first, and then nothing may be written.
    pub fn commit(&self) -> ApiResult<()> {
        match self
            .0
            .compare_exchange(RUNNING, COMMITTING, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) | Err(COMMITTING) => Ok(()),
            Err(_) => Err(stopped()),
        }
    }

    /// Gives the work up unless it is committing; whether it was given up.
    fn give_up(&self) -> bool {
        self.0
            .compare_exchange(RUNNING, GIVEN_UP, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
            || self.0.load(Ordering::SeqCst) == GIVEN_UP
    }
}

impl craterdex_engine::Progress for Ticket {
    fn cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst) == GIVEN_UP
    }
}

fn stopped() -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "the request was given up before its work finished; nothing was written",
    )
}

/// Gives the work up when the request is dropped before the work ended.
struct GiveUpOnDrop(Arc<Ticket>);

impl Drop for GiveUpOnDrop {
    fn drop(&mut self) {
        self.0.give_up();
    }
}

/// The time a request of the writing routes must end by (they answer their own timeouts:
/// a write past its commit point is answered with its outcome).
pub fn deadline(timeout: Duration) -> Instant {
    Instant::now() + timeout
}

/// `future` (reading a body, say) unless `deadline` passes first: 408.
pub async fn before<T>(
    deadline: Option<Instant>,
    timeout: Duration,
    future: impl std::future::Future<Output = ApiResult<T>>,
) -> ApiResult<T> {
    match deadline {
        None => future.await,
        Some(d) => tokio::time::timeout_at(d, future)
            .await
            .unwrap_or_else(|_| Err(timed_out(timeout))),
    }
}

fn timed_out(timeout: Duration) -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        format!(
            "the request took longer than the server's timeout ({} s); its work was stopped \
             and nothing was written",
            timeout.as_secs()
        ),
    )
}

/// Runs `work` off the async threads, holding `admission`'s slots until it has ended, and
/// gives it up when this future is dropped or `deadline` passes first (408), unless it has
/// committed: then it is waited for.
pub async fn run<T: Send + 'static>(
    admission: Admission,
    deadline: Option<(Instant, Duration)>,
    work: impl FnOnce(&Ticket) -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    let ticket = Arc::new(Ticket::default());
    let _give_up = GiveUpOnDrop(ticket.clone());
    let held = ticket.clone();
    let mut task = tokio::task::spawn_blocking(move || {
        let _slots = admission;
        work(&held)
    });
    let joined = match deadline {
        None => (&mut task).await,
        Some((at, timeout)) => tokio::select! {
            r = &mut task => r,
            _ = tokio::time::sleep_until(at) => {
                if ticket.give_up() {
                    return Err(timed_out(timeout));
                }
                (&mut task).await
            }
        },
    };
    joined.map_err(ApiError::internal)?
}

#[cfg(test)]
mod tests {
    use super::*;
    use craterdex_engine::Progress;

    #[test]
    fn a_ticket_commits_or_gives_up_never_both() {
        let t = Ticket::default();
        assert!(!t.cancelled());
        assert!(t.commit().is_ok());
        assert!(!t.give_up(), "committed work is not given up");
        assert!(!t.cancelled());
        let t = Ticket::default();
        assert!(t.give_up());
        assert!(t.cancelled());
        assert_eq!(
            t.commit().unwrap_err().status(),
            StatusCode::REQUEST_TIMEOUT
        );
    }
}
