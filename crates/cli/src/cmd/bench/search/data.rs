//! The synthetic galleries of the search benchmark: unit token sets with planted
//! near-duplicate queries, and clustered images for the scale runs.

use craterdex_index::ImageMeta;
use craterdex_tokens::Descriptors;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

pub(super) fn unit_rows(rng: &mut rand_chacha::ChaCha8Rng, rows: usize, d: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..rows * d).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    craterdex_tokens::l2_normalize_rows(&mut v, d);
    v
}

/// Random unit descriptors, and queries that are noisy copies (cosine ~0.7) of random
/// gallery images, returned with their targets. Images pair up into craters (2i and 2i+1),
/// as a catalogue's 2x and 3x views do, so that grouped search has views to list.
pub(crate) fn synthetic(
    n: usize,
    nq: usize,
    k: usize,
    d: usize,
) -> (Vec<(ImageMeta, Descriptors)>, Vec<Descriptors>, Vec<usize>) {
    let gallery: Vec<(ImageMeta, Descriptors)> = (0..n)
        .into_par_iter()
        .map(|i| {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(i as u64);
            let meta = ImageMeta {
                id: format!("g{i}"),
                crater_id: Some(format!("c{}", i / 2)),
                ..Default::default()
            };
            (
                meta,
                Descriptors {
                    single: unit_rows(&mut rng, 1, d),
                    tokens: unit_rows(&mut rng, k, d),
                },
            )
        })
        .collect();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(u64::MAX);
    let targets: Vec<usize> = (0..nq).map(|_| rng.gen_range(0..n)).collect();
    let sigma = 1.0 / (d as f32).sqrt();
    let queries = targets
        .iter()
        .map(|&t| {
            let noisy = |v: &[f32], rng: &mut rand_chacha::ChaCha8Rng| {
                let mut o: Vec<f32> = v
                    .iter()
                    .map(|x| x + sigma * rng.gen_range(-1.7f32..1.7))
                    .collect();
                craterdex_tokens::l2_normalize_rows(&mut o, d);
                o
            };
            Descriptors {
                single: noisy(&gallery[t].1.single, &mut rng),
                tokens: noisy(&gallery[t].1.tokens, &mut rng),
            }
        })
        .collect();
    (gallery, queries, targets)
}

/// The descriptors of synthetic image `i` of a clustered gallery: the single vector lies
/// around one of `clusters` centres (cosine ~0.64 to it, ~0.4 to its cluster mates), the
/// tokens are random. Deterministic in `i`, so any image can be regenerated as a target.
pub(super) fn clustered_image(i: usize, k: usize, d: usize, clusters: usize) -> Descriptors {
    let centre = unit_rows(
        &mut rand_chacha::ChaCha8Rng::seed_from_u64((1 << 40) + (i % clusters) as u64),
        1,
        d,
    );
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(i as u64);
    let spread = unit_rows(&mut rng, 1, d);
    let mut single: Vec<f32> = centre
        .iter()
        .zip(&spread)
        .map(|(c, s)| c + 1.2 * s)
        .collect();
    craterdex_tokens::l2_normalize_rows(&mut single, d);
    Descriptors {
        single,
        tokens: unit_rows(&mut rng, k, d),
    }
}

pub(super) fn near_copy(v: &[f32], d: usize, rng: &mut rand_chacha::ChaCha8Rng) -> Vec<f32> {
    let sigma = 1.0 / (d as f32).sqrt();
    let mut o: Vec<f32> = v
        .iter()
        .map(|x| x + sigma * rng.gen_range(-1.7f32..1.7))
        .collect();
    craterdex_tokens::l2_normalize_rows(&mut o, d);
    o
}
