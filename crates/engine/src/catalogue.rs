//! What a search needs of a catalogue: one index ([`crate::Engine`]), a set of shards on
//! this machine ([`crate::ShardedEngine`]) or a cluster's shards ([`crate::ShardCalls`] of a
//! router) each say how they search descriptors, verify candidates and find their suns; the
//! one search ([`crate::search`]) runs the same order over any of them. Also the catalogue's
//! suns: the sample of its images whose shading gives them.

use crate::engine::sun_headings_of;
use crate::error::{Error, Result};
use crate::extractor::Extractor;
use crate::hits::{QueryHits, SearchHit};
use crate::options::SUN_SAMPLE;
use crate::progress::Progress;
use crate::views::{sun_headings, QueryViews, Suns};
use craterdex_index::{Index, SearchParams};
use craterdex_model::extract::FeatureSet;
use craterdex_tokens::Descriptors;
use std::path::{Path, PathBuf};

/// What a search of query images needs of a catalogue.
pub trait Catalogue {
    /// Descriptors of features under the catalogue's encoder.
    fn encode(&self, features: &FeatureSet) -> Result<Vec<Descriptors>>;
    /// Ranked hits for queries given as their `views`, each image by its best view.
    fn search_views(
        &self,
        queries: &[Vec<Descriptors>],
        views: QueryViews,
        params: &SearchParams,
    ) -> Result<Vec<Vec<SearchHit>>>;
    /// Queries `ids` given as the features of their `views`, with their `top` best images
    /// spatially verified.
    fn search_variants_verified(
        &self,
        ids: &[String],
        variants: &FeatureSet,
        views: QueryViews,
        params: &SearchParams,
        top: usize,
        progress: &dyn Progress,
    ) -> Result<Vec<QueryHits>>;
    /// The headings of the catalogue's suns.
    fn suns(&self) -> Result<Suns>;
    /// The model that reads its query images, where it has one here.
    fn model(&self) -> Option<&Extractor> {
        None
    }
    /// The stored descriptors of its image `id`.
    fn stored(&self, id: &str) -> Result<Descriptors> {
        Err(Error::NoSuchImage(id.to_string()))
    }
}

/// Each query's descriptors in its `views` under `catalogue`'s encoder: `features` holds
/// each query's [`QueryViews::count`] views in a row.
pub(crate) fn encode_in_views(
    catalogue: &dyn Catalogue,
    features: &FeatureSet,
    views: QueryViews,
) -> Result<Vec<Vec<Descriptors>>> {
    Ok(catalogue
        .encode(features)?
        .chunks(views.count())
        .map(<[Descriptors]>::to_vec)
        .collect())
}

/// The suns of a catalogue made of `indexes` (one, or a set's shards): the headings of the
/// suns' headings in [`sun_sample`] of their live images ([`sun_headings_of`]), read where the
/// indexes recorded them.
pub(crate) fn suns_of(indexes: &[&Index]) -> Suns {
    sun_headings_of(&sun_sample(
        indexes.iter().flat_map(|index| placed_images(index)),
    ))
}

/// The live images of `index` whose files it recorded: `(id, path)`.
pub(crate) fn placed_images(index: &Index) -> impl Iterator<Item = (&str, &Path)> {
    index.live_rows().filter_map(|r| {
        let m = index.meta(r);
        m.path.as_deref().map(|p| (m.id.as_str(), Path::new(p)))
    })
}

/// Of a catalogue's images `(id, path)`, the [`SUN_SAMPLE`] whose suns' headings give its suns (or
/// all of them): those whose ids hash lowest (crc32, ties by id), so that an index, the
/// shards it is cut into and a benchmark's gallery in any order sample the same images.
pub fn sun_sample<'a>(images: impl IntoIterator<Item = (&'a str, &'a Path)>) -> Vec<PathBuf> {
    sampled_images(images)
        .into_iter()
        .map(|(_, p)| p.to_path_buf())
        .collect()
}

/// [`sun_sample`] with each image's id.
pub(crate) fn sampled_images<'a>(
    images: impl IntoIterator<Item = (&'a str, &'a Path)>,
) -> Vec<(&'a str, &'a Path)> {
    let mut keyed: Vec<(u32, &str, &Path)> = images
        .into_iter()
        .map(|(id, path)| (crc32fast::hash(id.as_bytes()), id, path))
        .collect();
    if keyed.len() > SUN_SAMPLE {
        keyed.select_nth_unstable(SUN_SAMPLE - 1);
        keyed.truncate(SUN_SAMPLE);
    }
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, id, p)| (id, p)).collect()
}

/// The catalogue's suns from what each of its parts found of its own [`sun_sample`]: the
/// ids of its images and their suns' headings in radians (None where the image
/// could not be read). The sample of the whole is the [`SUN_SAMPLE`] of those ids that hash
/// lowest, as [`suns_of`] samples it: what a cluster's router measures from its shards.
pub fn suns_from_samples(parts: impl IntoIterator<Item = Vec<(String, Option<f32>)>>) -> Suns {
    let mut keyed: Vec<(u32, String, Option<f32>)> = parts
        .into_iter()
        .flatten()
        .map(|(id, angle)| (crc32fast::hash(id.as_bytes()), id, angle))
        .collect();
    keyed.sort_unstable_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    keyed.dedup_by(|a, b| a.1 == b.1);
    let angles: Vec<f32> = keyed
        .into_iter()
        .take(SUN_SAMPLE)
        .filter_map(|(_, _, angle)| angle)
        .collect();
    sun_headings(&angles)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sample is the same images whatever their order and however they are split, and
    /// at most SUN_SAMPLE of them.
    #[test]
    fn the_sun_sample_does_not_depend_on_order_or_sharding() {
        let ids: Vec<String> = (0..500).map(|i| format!("crater-{i}_2x")).collect();
        let paths: Vec<PathBuf> = ids
            .iter()
            .map(|i| PathBuf::from(format!("{i}.png")))
            .collect();
        let images = || {
            ids.iter()
                .map(String::as_str)
                .zip(paths.iter().map(PathBuf::as_path))
        };
        let sample = sun_sample(images());
        assert_eq!(sample.len(), SUN_SAMPLE);
        let reversed: Vec<_> = images().rev().collect();
        assert_eq!(sun_sample(reversed), sample);
        // every third image in one part, the rest in another, sampled together
        let (a, b): (Vec<_>, Vec<_>) = images().enumerate().partition(|(i, _)| i % 3 == 0);
        let parts = b.into_iter().chain(a).map(|(_, x)| x);
        assert_eq!(sun_sample(parts), sample);
        // spread over the catalogue, not its first ids
        let first: Vec<&PathBuf> = paths.iter().take(SUN_SAMPLE).collect();
        assert_ne!(sample.iter().collect::<Vec<_>>(), first);
        // fewer images than the sample: all of them
        assert_eq!(sun_sample(images().take(10)).len(), 10);
        assert!(sun_sample(std::iter::empty()).is_empty());
    }
}
