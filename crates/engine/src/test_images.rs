//! Deterministic synthetic descriptors for the engine's unit tests.

use craterdex_index::codec::{Codec, TokenCodec};
use craterdex_index::{ImageMeta, Index};
use craterdex_tokens::{Descriptors, Encoder, Recipe};
use std::path::Path;

pub const D: usize = 16;
pub const K: usize = 2;

/// Deterministic, distinct unit descriptors for image `i`.
pub fn image(i: usize) -> (ImageMeta, Descriptors) {
    // splitmix64 of (image, salt, element): independent values in [-1, 1)
    let value = |salt: usize, j: usize| -> f32 {
        let mut z =
            ((i as u64) << 32 ^ (salt as u64) << 24 ^ j as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    };
    let unit = |salt: usize, n: usize| -> Vec<f32> {
        let mut v: Vec<f32> = (0..n * D).map(|j| value(salt, j)).collect();
        craterdex_tokens::l2_normalize_rows(&mut v, D);
        v
    };
    let meta = ImageMeta {
        id: format!("img{i}"),
        ..Default::default()
    };
    (
        meta,
        Descriptors {
            single: unit(1, 1),
            tokens: unit(2, K),
        },
    )
}

/// Writes an int8 index of `images` (plain encoder, codec trained on them) at `dir`.
pub fn write_index(dir: &Path, images: &[(ImageMeta, Descriptors)]) {
    let sample: Vec<f32> = images.iter().flat_map(|(_, d)| d.tokens.clone()).collect();
    let codec = TokenCodec::train(Codec::Int8, D, &sample, 0).unwrap();
    Index::create(
        dir,
        &Encoder::plain(Recipe::default()),
        &codec,
        None,
        images,
        None,
    )
    .unwrap();
}
