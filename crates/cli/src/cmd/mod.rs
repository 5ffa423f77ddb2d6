//! One module per command.

pub mod bench;
pub mod bench_build;
pub mod calibrate;
pub mod cpu;
pub mod dedup;
pub mod demo;
pub mod detect;
pub mod discover;
pub mod eval;
pub mod eval_discover;
pub mod eval_link;
pub mod extract;
pub mod index;
pub mod link;
pub mod model;
pub mod search;
pub mod serve;
