//! An index directory the fuzzer writes: two small real indexes (int8 with IVF lists, and
//! PQ) are built once; each input replaces one of their files (the first byte picks the
//! index and the file, the rest is the new content). The index is then opened, with and
//! without checksum verification, and when it opens it is searched in every mode and read
//! back. Nothing may panic or allocate without bound.
#![no_main]
use craterdex_fuzz::{index_templates, unit, D, K};
use craterdex_index::{Index, Mode, SearchParams, Stage1};
use craterdex_tokens::Descriptors;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let files = &index_templates()[(pick & 1) as usize];
    let target = (pick >> 1) as usize % files.len();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for (i, (rel, bytes)) in files.iter().enumerate() {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, if i == target { body } else { bytes }).unwrap();
    }
    for verify in [true, false] {
        let Ok(idx) = Index::open_with(dir, verify) else {
            continue;
        };
        let query = Descriptors {
            single: unit(7, 1)[..idx.single_dim().min(D)].to_vec(),
            tokens: unit(8, K),
        };
        if query.single.len() != idx.single_dim() || idx.token_dim() != D {
            continue;
        }
        for mode in [Mode::Stage1, Mode::TwoStage, Mode::Exhaustive] {
            for stage1 in [Stage1::Auto, Stage1::Exact, Stage1::Probe(3)] {
                for group_views in [false, true] {
                    let p = SearchParams {
                        top_k: 5,
                        shortlist: 10,
                        mode,
                        stage1,
                        group_views,
                    };
                    for hits in idx.search(std::slice::from_ref(&query), &p) {
                        for h in hits {
                            let _ = idx.meta(h.row);
                        }
                    }
                }
            }
        }
        for row in 0..idx.rows().min(3) {
            let _ = idx.descriptors_of(row);
        }
    }
});
