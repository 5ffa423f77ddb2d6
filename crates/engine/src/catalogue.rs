//! The searches of query images that one index ([`crate::Engine`]), a set of shards on this
//! machine ([`crate::ShardedEngine`]) and a cluster's shards ([`crate::ShardCalls`] of a
//! router) answer alike: as the search options ask ([`search_as`]), and rechecked where a
//! first hit does not register ([`search_rechecked`]). Each catalogue says how it searches
//! descriptors, verifies candidates and finds its suns; the order of the searches lives here
//! once.

use crate::engine::{recheck_answers, sun_headings_of, QueryFeatures, QueryHits, SearchHit};
use crate::error::Result;
use crate::extractor::Extractor;
use crate::options::{
    SearchOptions, RECHECK_AGAIN_VERIFY, RECHECK_KEEP_SHARE, RECHECK_RELIT_KEEP_SHARE,
    RECHECK_TOWARD_VERIFY, RECHECK_TURNS, RECHECK_VERIFY, RECHECK_VIEWS, SUN_SAMPLE,
};
use crate::progress::{go_on, Progress};
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
}

/// The suns of a catalogue made of `indexes` (one, or a set's shards): the headings of the
/// dipoles of [`sun_sample`] of their live images ([`sun_headings_of`]), read where the
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

/// Of a catalogue's images `(id, path)`, the [`SUN_SAMPLE`] whose dipoles give its suns (or
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
/// ids of its images and their shading dipoles' headings in radians (None where the image
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

/// Query images `(id, path)` read by `model` and searched in `catalogue` as `options` ask
/// ([`search_as`]).
pub(crate) fn search_images_as(
    catalogue: &dyn Catalogue,
    model: &Extractor,
    items: &[(String, PathBuf)],
    params: &SearchParams,
    options: &SearchOptions,
    progress: &dyn Progress,
) -> Result<Vec<QueryHits>> {
    let features = |only: Option<&std::collections::HashSet<String>>, views: QueryViews| {
        let some: Vec<(String, PathBuf)>;
        let items = match only {
            None => items,
            Some(ids) => {
                some = items
                    .iter()
                    .filter(|(id, _)| ids.contains(id))
                    .cloned()
                    .collect();
                &some
            }
        };
        match views.is_plain() {
            // as given: through the feature cache
            true => model
                .extract(items, "queries", progress)
                .map(|f| (f.ids.clone(), f)),
            false => model.variant_features(items, views, progress),
        }
    };
    search_as(catalogue, &features, params, options, progress)
}

/// Queries whose ids and features in some views `features` gives, searched in `catalogue`
/// as `options` ask: rechecked ([`search_rechecked`]), in their views, with their best
/// images spatially verified, or plainly; `params` are `options`' own, checked by the front
/// end.
pub fn search_as(
    catalogue: &dyn Catalogue,
    features: &QueryFeatures,
    params: &SearchParams,
    options: &SearchOptions,
    progress: &dyn Progress,
) -> Result<Vec<QueryHits>> {
    if options.rechecks() {
        return search_rechecked(catalogue, features, params, progress);
    }
    let (views, verify) = (options.views(), options.verify);
    let (ids, features) = features(None, views)?;
    if verify > 0 {
        return catalogue
            .search_variants_verified(&ids, &features, views, params, verify, progress);
    }
    let per_query: Vec<Vec<Descriptors>> = catalogue
        .encode(&features)?
        .chunks(views.count())
        .map(<[Descriptors]>::to_vec)
        .collect();
    Ok(QueryHits::named(
        &ids,
        catalogue.search_views(&per_query, views, params)?,
    ))
}

/// One search again of the queries a rechecked search is still unsure of
/// ([`crate::SearchOptions::recheck`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Recheck {
    /// The views of each query it searches.
    pub views: QueryViews,
    /// Images it verifies per query.
    pub verify: usize,
    /// The share of a query's patches its new first hit must gather as inliers to be kept
    /// ([`crate::registers_better`]).
    pub keep_share: f32,
}

/// The searches again toward a catalogue's `suns` that a rechecked search runs, in order, for
/// the queries still unsure after each ([`crate::SearchOptions::recheck`]): turned toward them
/// ([`QueryViews::toward`], kept at [`RECHECK_KEEP_SHARE`]), then relit toward them
/// ([`QueryViews::relit_toward`], kept at [`RECHECK_RELIT_KEEP_SHARE`]), each verifying
/// [`RECHECK_TOWARD_VERIFY`]; none without suns. After them, [`RECHECK_VIEWS`].
pub fn toward_stages(suns: Suns) -> Vec<Recheck> {
    if suns.is_empty() {
        return Vec::new();
    }
    vec![
        Recheck {
            views: QueryViews::toward(suns),
            verify: RECHECK_TOWARD_VERIFY,
            keep_share: RECHECK_KEEP_SHARE,
        },
        Recheck {
            views: QueryViews::relit_toward(suns),
            verify: RECHECK_TOWARD_VERIFY,
            keep_share: RECHECK_RELIT_KEEP_SHARE,
        },
    ]
}

/// The last search again of a rechecked search, for the queries still unsure after
/// [`toward_stages`]: in [`RECHECK_VIEWS`] (turns and the opposite sun), verifying
/// [`RECHECK_AGAIN_VERIFY`], kept at [`RECHECK_KEEP_SHARE`].
pub const RECHECK_AGAIN: Recheck = Recheck {
    views: RECHECK_VIEWS,
    verify: RECHECK_AGAIN_VERIFY,
    keep_share: RECHECK_KEEP_SHARE,
};

/// What [`crate::Engine::search_rechecked`] does, over any catalogue.
pub fn search_rechecked(
    catalogue: &dyn Catalogue,
    features: &QueryFeatures,
    params: &SearchParams,
    progress: &dyn Progress,
) -> Result<Vec<QueryHits>> {
    let (ids, plain) = features(None, QueryViews::PLAIN)?;
    let Some(side) = craterdex_tokens::verify::grid_side(plain.tokens) else {
        let per_query: Vec<Vec<Descriptors>> = catalogue
            .encode(&plain)?
            .into_iter()
            .map(|d| vec![d])
            .collect();
        return Ok(QueryHits::named(
            &ids,
            catalogue.search_views(&per_query, QueryViews::PLAIN, params)?,
        ));
    };
    let mut hits = catalogue.search_variants_verified(
        &ids,
        &plain,
        QueryViews::PLAIN,
        params,
        RECHECK_VERIFY,
        progress,
    )?;
    // the unsure queries of `hits` searched again as `stage` asks; how many
    let search_again = |hits: &mut [QueryHits], stage: Recheck| {
        go_on(progress)?;
        recheck_answers(hits, side * side, stage.keep_share, &|again| {
            let (ids, in_views) = features(Some(again), stage.views)?;
            catalogue.search_variants_verified(
                &ids,
                &in_views,
                stage.views,
                params,
                stage.verify,
                progress,
            )
        })
    };
    let suns = catalogue.suns()?;
    let mut stages_that_searched = 0;
    for (i, stage) in toward_stages(suns).into_iter().enumerate() {
        let n = search_again(&mut hits, stage)?;
        if n > 0 {
            let how = match stage.views.relit {
                false => "turned",
                true => "relit",
            };
            let nor = if i == 0 {
                ""
            } else {
                " nor turned toward its suns"
            };
            progress.note(&format!(
                "{n} of {} queries did not register with their first hit{nor}: searched again \
                 {how} toward the catalogue's suns ({suns})",
                hits.len(),
            ));
            stages_that_searched += 1;
        }
    }
    let again = search_again(&mut hits, RECHECK_AGAIN)?;
    if again > 0 {
        let nor = match stages_that_searched {
            0 => "",
            1 => " nor turned toward its suns",
            _ => " nor turned or relit toward its suns",
        };
        progress.note(&format!(
            "{again} of {} queries did not register with their first hit{nor}: searched again \
             in {RECHECK_TURNS} turns and under the opposite sun",
            hits.len(),
        ));
    }
    Ok(hits)
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
