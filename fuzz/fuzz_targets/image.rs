//! craterdex's own image loader (format sniffing, the strict JPEG check, decoding with the
//! image crate's limits) and the model's preprocessing (turned and brightness-standardised
//! views at two sizes included). Nothing may panic or allocate without bound.
//!
//! Images are accepted up to 4 megapixels here rather than the crop budget of 32: the
//! per-input time limit is there to catch work out of proportion to the pixels, and decoding
//! and preprocessing a crop near the top of the budget is linear work that takes longer than
//! that limit under AddressSanitizer (found by this target: a 795-byte JPEG declaring
//! 3584x5120 pixels took 12 s; 2048x2048 takes 1.7 s).
#![no_main]
use craterdex_model::preprocess::{
    decode, to_tensor, to_tensors_at_each_size, Brightness, DecodeLimits, Orientation, Preprocess,
    ResizeMode,
};
use libfuzzer_sys::fuzz_target;

const FUZZ_MAX_PIXELS: u64 = 1 << 22;

fuzz_target!(|data: &[u8]| {
    let prep = Preprocess {
        size: 28,
        mean: [0.5; 3],
        std: [0.25; 3],
        resize: ResizeMode::CenterCrop,
        orientation: Orientation::AsIs,
        brightness: Brightness::AsIs,
        extra_sizes: Vec::new(),
    };
    let turned = Preprocess {
        orientation: Orientation::Shading,
        brightness: Brightness::Standardised,
        extra_sizes: vec![21],
        ..prep.clone()
    };
    let mut preprocessed = false;
    for allow_partial in [false, true] {
        let limits = DecodeLimits {
            max_pixels: Some(FUZZ_MAX_PIXELS),
            max_side: None,
            allow_partial,
        };
        if let Ok(img) = decode(data, &limits).map(|d| d.image) {
            // data that decodes strictly decodes the same when partial images are allowed
            if std::mem::replace(&mut preprocessed, true) {
                continue;
            }
            assert_eq!(to_tensor(&img, &prep).len(), 3 * 28 * 28);
            let sizes = to_tensors_at_each_size(&img, &turned);
            assert_eq!(sizes.len(), 2);
            for (views, s) in sizes.iter().zip([28, 21]) {
                assert_eq!(views.len(), 2);
                assert!(views.iter().all(|v| v.len() == 3 * s * s));
            }
        }
    }
});
