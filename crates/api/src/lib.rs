//! craterdex-api: craterdex's HTTP API without a server. What a request takes and a
//! response answers ([`types`]), the readers of what requests carry ([`readers`]: search
//! options, entry forms, ids, uploads), failures as statuses and bodies ([`ApiError`]), the
//! OpenAPI document generated from the routes' declarations ([`paths`], [`openapi`]) and
//! the web page ([`page`]).
//!
//! Every front end of the API uses it: `craterdex serve` (axum, with the `axum` feature:
//! an [`ApiError`] answers itself) and `craterdex.cluster`'s router on Ray Serve (through
//! the Python module, which therefore links no HTTP server). Knows nothing of sockets,
//! runtimes, routing or the service's state.

mod error;
pub mod openapi;
pub mod page;
pub mod paths;
pub mod readers;
pub mod types;

pub use error::{status_of, ApiError, ApiResult};
pub use http::StatusCode;
pub use openapi::{document, document_json};
pub use readers::DEFAULT_LIMITS;
