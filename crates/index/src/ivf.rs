//! Inverted-file (IVF) stage 1 for large galleries: single vectors are grouped into lists
//! by their nearest centroid (spherical k-means on a sample, inner product); a query scans
//! only the `nprobe` lists whose centroids score highest.
//!
//! Chosen over HNSW because it fits the index's immutable, memory-mapped segments: a segment
//! stores one 4-byte list id per image, adding a segment assigns its images to the existing
//! centroids, removal stays a mask, and nothing has to be rebuilt or held in memory beyond
//! the centroids and the per-segment lists (HNSW needs a graph of ~M x 8 bytes per image,
//! rebuilt or patched on every change, and a million sequential inserts to build).

use crate::error::{Error, Result};
use crate::topk::TopK;
use craterdex_errors::ensure;
use craterdex_kernels::f32::F32Query;
use rand::{seq::index::sample, SeedableRng};
use rayon::prelude::*;

/// Centroids `[lists, dim]`, unit length.
#[derive(Clone, Debug, PartialEq)]
pub struct Ivf {
    pub dim: usize,
    pub centroids: Vec<f32>,
}

/// Lloyd iterations of the spherical k-means.
const ITERATIONS: usize = 8;
/// Training samples per list (more adds time, little quality).
const SAMPLES_PER_LIST: usize = 32;

/// A list count for `n` images: about 4 sqrt(n), the usual IVF rule.
pub fn default_lists(n: usize) -> usize {
    ((4.0 * (n as f64).sqrt()).round() as usize).clamp(16, 65_536)
}

/// Lists scanned per query by default (1/32 of them): shortlist recall R@100 0.91 (125 of
/// 4,000 lists) on the million-image synthetic benchmark, whose clusters overlap heavily;
/// 1/8 of them gave 0.99 at three times the cost.
pub fn default_nprobe(lists: usize) -> usize {
    (lists / 32).clamp(8, 512).min(lists)
}

impl Ivf {
    pub fn lists(&self) -> usize {
        self.centroids.len() / self.dim
    }

    /// Spherical k-means on (a seeded sample of) `vectors` `[n, dim]`.
    pub fn train(vectors: &[f32], dim: usize, lists: usize, seed: u64) -> Result<Self> {
        let n = vectors.len() / dim;
        ensure!(
            lists >= 1 && n >= lists,
            Error::Invalid(format!(
                "IVF with {lists} lists needs at least {lists} images, got {n}"
            ))
        );
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let take = n.min(lists * SAMPLES_PER_LIST);
        let rows = sample(&mut rng, n, take).into_vec();
        let data: Vec<f32> = rows
            .iter()
            .flat_map(|&r| vectors[r * dim..(r + 1) * dim].iter().copied())
            .collect();
        let centroids = craterdex_tokens::kmeans::lloyd(
            &data,
            dim,
            data[..lists * dim].to_vec(),
            ITERATIONS,
            craterdex_tokens::kmeans::Centres::UnitMean,
            &mut rng,
            |centroids: &[f32]| {
                nearest(centroids, dim, &data)
                    .into_iter()
                    .map(|l| l as usize)
                    .collect()
            },
        );
        Ok(Self { dim, centroids })
    }

    /// The list of each vector `[n, dim]`.
    pub fn assign(&self, vectors: &[f32]) -> Vec<u32> {
        nearest(&self.centroids, self.dim, vectors)
    }

    /// The `nprobe` best lists for one query.
    pub fn probe(&self, query: &[f32], nprobe: usize) -> Vec<u32> {
        let mut top = TopK::new(nprobe.min(self.lists()));
        let mut scores = Vec::new();
        F32Query::new(query, self.dim).dots(&self.centroids, &mut scores);
        for (l, &s) in scores.iter().enumerate() {
            top.push(l, s);
        }
        top.into_sorted()
            .into_iter()
            .map(|s| s.row as u32)
            .collect()
    }
}

/// Nearest centroid (largest inner product, ties to the lower list) of each row: blocks of
/// rows against every centroid.
fn nearest(centroids: &[f32], dim: usize, vectors: &[f32]) -> Vec<u32> {
    vectors
        .par_chunks(craterdex_kernels::f32::BLOCK * dim)
        .flat_map_iter(|chunk| {
            let nq = chunk.len() / dim;
            let mut scores = Vec::new();
            F32Query::new(chunk, dim).dots(centroids, &mut scores);
            let mut best = vec![(0u32, f32::NEG_INFINITY); nq];
            for (l, row) in scores.chunks_exact(nq).enumerate() {
                for (b, &s) in best.iter_mut().zip(row) {
                    if s > b.1 {
                        *b = (l as u32, s);
                    }
                }
            }
            best.into_iter().map(|b| b.0)
        })
        .collect()
}

/// One segment's rows grouped by list (CSR), built when the segment is opened.
#[derive(Clone, Debug, Default)]
pub struct InvertedLists {
    offsets: Vec<u32>,
    rows: Vec<u32>,
}

impl InvertedLists {
    pub fn build(assignment: &[u32], lists: usize) -> Result<Self> {
        let mut offsets = vec![0u32; lists + 1];
        for &l in assignment {
            ensure!(
                (l as usize) < lists,
                Error::Corrupt(format!(
                    "list id {l} out of range (index has {lists} lists)"
                ))
            );
            offsets[l as usize + 1] += 1;
        }
        for l in 0..lists {
            offsets[l + 1] += offsets[l];
        }
        let mut fill = offsets.clone();
        let mut rows = vec![0u32; assignment.len()];
        for (r, &l) in assignment.iter().enumerate() {
            rows[fill[l as usize] as usize] = r as u32;
            fill[l as usize] += 1;
        }
        Ok(Self { offsets, rows })
    }

    /// Local rows in list `l`, ascending.
    pub fn list(&self, l: u32) -> &[u32] {
        let l = l as usize;
        &self.rows[self.offsets[l] as usize..self.offsets[l + 1] as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    /// Unit vectors around `clusters` random centres.
    fn clustered(n: usize, clusters: usize, dim: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let centres: Vec<f32> = (0..clusters * dim)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let mut v: Vec<f32> = (0..n)
            .flat_map(|i| {
                let c = i % clusters;
                (0..dim)
                    .map(|j| centres[c * dim + j] + 0.3 * rng.gen_range(-1.0f32..1.0))
                    .collect::<Vec<_>>()
            })
            .collect();
        craterdex_tokens::l2_normalize_rows(&mut v, dim);
        v
    }

    #[test]
    fn lists_follow_clusters_and_probing_finds_them() {
        let (dim, clusters) = (32, 20);
        let v = clustered(4000, clusters, dim, 1);
        let ivf = Ivf::train(&v, dim, clusters, 0).unwrap();
        assert_eq!(ivf.lists(), clusters);
        let assign = ivf.assign(&v);
        // Members of one generating cluster share a list.
        let mut agree = 0;
        for i in 0..4000 - clusters {
            agree += (assign[i] == assign[i + clusters]) as usize;
        }
        assert!(agree as f64 / (4000 - clusters) as f64 > 0.95, "{agree}");
        for i in 0..50 {
            let q = &v[i * dim..(i + 1) * dim];
            assert_eq!(ivf.probe(q, 1)[0], assign[i]);
        }
        // Seeded: the same input gives the same centroids.
        assert_eq!(Ivf::train(&v, dim, clusters, 0).unwrap(), ivf);
    }

    #[test]
    fn inverted_lists_hold_every_row_once() {
        let assign = [2u32, 0, 2, 1, 0, 2];
        let inv = InvertedLists::build(&assign, 4).unwrap();
        assert_eq!(inv.list(0), &[1, 4]);
        assert_eq!(inv.list(1), &[3]);
        assert_eq!(inv.list(2), &[0, 2, 5]);
        assert!(inv.list(3).is_empty());
        assert!(InvertedLists::build(&[5], 4).is_err());
    }

    #[test]
    fn too_few_vectors_is_an_error() {
        assert!(Ivf::train(&[1.0, 0.0], 2, 4, 0).is_err());
    }
}
