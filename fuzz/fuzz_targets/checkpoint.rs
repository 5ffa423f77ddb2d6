//! Checkpoints a user imports (`craterdex model import`): a safetensors file in any supported
//! layout with an optional Hugging Face `config.json` beside it (the input split at the first
//! NUL byte: config, then weights), or, when the input starts with 0xFF, an ONNX export. An
//! import that succeeds is loaded at a small input size and run on one image. Nothing may
//! panic or allocate without bound.
#![no_main]
use craterdex_model::import::import_file;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = craterdex_fuzz::scratch();
    let (file, name) = match data.split_first() {
        Some((0xFF, onnx)) => {
            let p = dir.join("model.onnx");
            std::fs::write(&p, onnx).unwrap();
            (p, "fuzz-onnx")
        }
        _ => {
            let (config, weights) = craterdex_fuzz::split_at_nul(data);
            let p = dir.join("model.safetensors");
            std::fs::write(dir.join("config.json"), config).unwrap();
            std::fs::write(&p, weights.unwrap_or_default()).unwrap();
            (p, "fuzz-st")
        }
    };
    let Ok((model_dir, _)) = import_file(&file, name, &dir.join("models")) else {
        return;
    };
    let Ok(vit) = craterdex_model::load(&model_dir, Some(28)) else {
        return;
    };
    let s = vit.input_size();
    let image = vec![0.25f32; 3 * s * s];
    if let Ok(out) = vit.forward(&[image]) {
        assert_eq!(out[0].cls.len(), vit.dim());
    }
});
