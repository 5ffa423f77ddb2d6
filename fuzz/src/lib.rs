//! What the fuzz targets and the seed writer (`examples/seeds.rs`) share: the small real
//! indexes whose files the `index_files` target replaces, and the split of one input into
//! two files.

use craterdex_index::ivf::Ivf;
use craterdex_index::{Codec, ImageMeta, Index, TokenCodec};
use craterdex_tokens::{Descriptors, Encoder, Recipe};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Feature width and tokens per image of the template indexes.
pub const D: usize = 64;
pub const K: usize = 8;

/// Every file of a template index, as (path inside the index, bytes), sorted.
pub type Files = Vec<(PathBuf, Vec<u8>)>;

/// `n` deterministic pseudo-random unit vectors of width [`D`].
pub fn unit(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v: Vec<f32> = (0..n * D)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    craterdex_tokens::l2_normalize_rows(&mut v, D);
    v
}

fn collect(root: &Path, dir: &Path, out: &mut Files) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            collect(root, &p, out);
        } else {
            out.push((
                p.strip_prefix(root).unwrap().to_path_buf(),
                std::fs::read(&p).unwrap(),
            ));
        }
    }
    out.sort();
}

/// Two indexes with every kind of file: int8 tokens with IVF lists, and PQ tokens with
/// codebooks; each built, then added to (a second segment) and removed from.
pub fn index_templates() -> &'static [Files; 2] {
    static T: OnceLock<[Files; 2]> = OnceLock::new();
    T.get_or_init(|| {
        let images: Vec<(ImageMeta, Descriptors)> = (0..40)
            .map(|i| {
                let meta = ImageMeta {
                    id: format!("img{i}"),
                    crater_id: Some(format!("c{}", i / 2)),
                    lat: Some(i as f64),
                    ..Default::default()
                };
                (
                    meta,
                    Descriptors {
                        single: unit(i, 1),
                        tokens: unit(1000 + i, K),
                    },
                )
            })
            .collect();
        let sample: Vec<f32> = images.iter().flat_map(|(_, d)| d.tokens.clone()).collect();
        let enc = Encoder::plain(Recipe::default());
        let build = |codec: Codec, ivf: bool| -> Files {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("idx");
            let tc = TokenCodec::train(codec, D, &sample, 1).unwrap();
            let singles: Vec<f32> = images.iter().flat_map(|(_, d)| d.single.clone()).collect();
            let lists = Ivf::train(&singles, D, 4, 0).unwrap();
            Index::create(
                &dir,
                &enc,
                &tc,
                Some("m".into()),
                &images[..30],
                ivf.then_some((&lists, 2)),
            )
            .unwrap();
            Index::add(&dir, &images[30..]).unwrap();
            Index::remove(&dir, &["img3".to_string()]).unwrap();
            let mut files = Vec::new();
            collect(&dir, &dir, &mut files);
            files
        };
        [build(Codec::Int8, true), build(Codec::Pq { m: 8 }, false)]
    })
}

/// One input as two files: the bytes before the first NUL and, when there is one, those after.
pub fn split_at_nul(data: &[u8]) -> (&[u8], Option<&[u8]>) {
    match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    }
}

/// One directory for a whole fuzzing run: a fresh one per input would make the file system,
/// not the parser, the thing being timed.
pub fn scratch() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().unwrap()).path()
}
