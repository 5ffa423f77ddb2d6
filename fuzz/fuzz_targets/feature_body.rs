//! Posted feature bodies (craterdex serve, the cluster router), safetensors as `craterdex
//! extract` writes them or JSON: parsed and checked against a feature width. Nothing may
//! panic.
#![no_main]
use craterdex_model::posted::{check_features, parse_features};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for content_type in ["application/json", "application/octet-stream"] {
        if let Ok(parts) = parse_features(data, content_type) {
            let _ = check_features(parts.clone(), 384);
            let _ = check_features(parts, 4);
        }
    }
});
