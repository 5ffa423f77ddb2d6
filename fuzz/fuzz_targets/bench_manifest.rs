//! CraterBench-R manifests (`splits/test.json`) and the optional
//! `metadata/query_relevance.json` beside them: the input is split at the first NUL byte
//! into the two files. Nothing may panic.
#![no_main]
use craterdex_eval::manifest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (m, relevance) = craterdex_fuzz::split_at_nul(data);
    let dir = craterdex_fuzz::scratch();
    std::fs::create_dir_all(dir.join("splits")).unwrap();
    std::fs::create_dir_all(dir.join("metadata")).unwrap();
    let path = dir.join("splits/test.json");
    std::fs::write(&path, m).unwrap();
    let relevance_path = dir.join("metadata/query_relevance.json");
    match relevance {
        Some(r) => std::fs::write(&relevance_path, r).unwrap(),
        None => {
            let _ = std::fs::remove_file(&relevance_path);
        }
    }
    if let Ok(b) = manifest::load(&path, None) {
        let ids: Vec<String> = b
            .manifest
            .gallery_images
            .iter()
            .map(|e| e.image_id.clone())
            .collect();
        let queries: Vec<String> = b
            .manifest
            .query_images
            .iter()
            .map(|e| e.image_id.clone())
            .collect();
        let _ = b.align(&ids, &queries);
        let _ = b.unqueried_gallery_rows(&ids);
        let _ = b.gallery_metas(&ids);
    }
});
