//! craterdex's own image loader (format sniffing, the strict JPEG check, decoding with the
//! image crate's limits) and the model's preprocessing (turned and brightness-standardised
//! views at two sizes included). Nothing may panic or allocate without bound.
#![no_main]
use craterdex_model::preprocess::{
    decode_image_with, to_tensor, to_tensors_at_each_size, Brightness, Orientation, Preprocess,
    ResizeMode,
};
use libfuzzer_sys::fuzz_target;

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
    for allow_partial in [false, true] {
        if let Ok(img) = decode_image_with(data, allow_partial) {
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
