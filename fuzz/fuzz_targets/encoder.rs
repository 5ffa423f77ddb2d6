//! An index's `encoder.json`: parsed, validated, and, when valid, used to encode features
//! of the width it expects. Nothing may panic or allocate without bound.
#![no_main]
use craterdex_tokens::{Encoder, FeatureRef};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(enc) = serde_json::from_slice::<Encoder>(data) else {
        return;
    };
    let Ok(width) = enc.validate() else { return };
    let d = width.unwrap_or(32);
    let t = 16;
    let cls: Vec<f32> = (0..d).map(|i| (i as f32 * 0.37).sin()).collect();
    let patches: Vec<f32> = (0..t * d).map(|i| (i as f32 * 0.11).cos()).collect();
    let attention: Vec<f32> = (0..t).map(|i| i as f32 / t as f32).collect();
    let desc = enc.encode(FeatureRef {
        cls: &cls,
        patches: &patches,
        attention: &attention,
    });
    assert_eq!(desc.single.len(), enc.single_dim(d));
});
