//! The rechecked regime: the shipped recipe searched as `craterdex search` searches a query
//! image by default, through the engine's one search ([`craterdex_engine::search`]) with the
//! queries' views extracted beforehand and the candidates' patch grids taken from the
//! gallery's features. Its shares of queries searched again are the stages the answer says
//! ran.

use super::{results_of, EvalInput, RegimeResult, TIMED_QUERIES};
use crate::error::Result;
use crate::metrics::summarise;
use crate::regime::{RegimeId, Whiten};
use craterdex_engine::{
    Catalogue, Descriptors, Engine, Extractor, FeatureSet, PatchGrids, QueryHits, QueryViews,
    RecheckPlan, SearchInput, SearchOptions, SearchParams, Silent, Suns,
};
use std::collections::{HashMap, HashSet};

/// An index whose candidates are verified against the gallery's own features, and whose
/// suns are those the queries' views were made toward: what the rechecked search needs of a
/// catalogue, without a model.
struct OnGallery<'a> {
    engine: &'a Engine,
    gallery: &'a PatchGrids<'a>,
    suns: Suns,
}

impl Catalogue for OnGallery<'_> {
    fn encode(&self, features: &FeatureSet) -> craterdex_engine::Result<Vec<Descriptors>> {
        Ok(self.engine.encode(features))
    }
    fn search_views(
        &self,
        queries: &[Vec<Descriptors>],
        views: QueryViews,
        params: &SearchParams,
    ) -> craterdex_engine::Result<Vec<Vec<craterdex_engine::SearchHit>>> {
        Ok(self.engine.search_views(queries, views, params))
    }
    fn search_variants_verified(
        &self,
        ids: &[String],
        variants: &FeatureSet,
        views: QueryViews,
        params: &SearchParams,
        top: usize,
        _progress: &dyn craterdex_engine::Progress,
    ) -> craterdex_engine::Result<Vec<QueryHits>> {
        self.engine
            .search_variants_verified_on(ids, variants, views, params, top, self.gallery)
    }
    fn suns(&self) -> craterdex_engine::Result<Suns> {
        Ok(self.suns)
    }
    fn model(&self) -> Option<&Extractor> {
        None
    }
    fn stored(&self, id: &str) -> craterdex_engine::Result<Descriptors> {
        self.engine.stored(id)
    }
}

/// The queries' features in the views a rechecked search asks for, from those extracted
/// before: as given, each stage toward the gallery's suns, and in turns (`in_views`).
#[derive(Clone, Copy)]
struct Prepared<'a> {
    input: &'a EvalInput<'a>,
    in_views: (QueryViews, &'a FeatureSet),
}

impl Prepared<'_> {
    /// The features of the queries named by `only` (all of them for None) in `views`, each
    /// query's views in a row ([`craterdex_engine::QueryFeatures`]).
    fn features(
        &self,
        only: Option<&HashSet<String>>,
        views: QueryViews,
    ) -> craterdex_engine::Result<(Vec<String>, FeatureSet)> {
        let ids = &self.input.queries.ids;
        let set = match views.is_plain() {
            true => Some(self.input.queries),
            false => std::iter::once(self.in_views)
                .chain(self.input.query_toward.iter().map(|(s, f)| (s.views, *f)))
                .find(|(v, _)| *v == views)
                .map(|(_, f)| f),
        };
        let set = set.ok_or_else(|| {
            craterdex_engine::Error::Invalid(format!(
                "the evaluation has no query views {views:?} extracted"
            ))
        })?;
        let per = set.len() / ids.len().max(1);
        let chosen: Vec<usize> = (0..ids.len())
            .filter(|&q| only.is_none_or(|o| o.contains(&ids[q])))
            .collect();
        let rows: Vec<usize> = chosen
            .iter()
            .flat_map(|&q| q * per..(q + 1) * per)
            .collect();
        Ok((
            chosen.iter().map(|&q| ids[q].clone()).collect(),
            set.select(&rows),
        ))
    }
}

/// The shipped recipe's index `engine`, searched with `params` (the grouped regime's)
/// rechecked as the engine's default search of a query image is; `gallery` holds the
/// gallery's patch grids under `engine`'s encoder. None without the queries in the last
/// stage's views (`craterdex eval --recheck` extracts them).
pub(super) fn rechecked_regime(
    engine: &Engine,
    gallery: &PatchGrids,
    input: &EvalInput,
    params: &SearchParams,
    white: Whiten,
    bytes_per_image: usize,
    positions: &HashMap<&str, usize>,
) -> Result<Option<RegimeResult>> {
    let suns = input
        .query_toward
        .first()
        .map_or(Suns::default(), |(s, _)| s.views.toward);
    let plan = RecheckPlan::for_suns(suns);
    let last = plan.last().views;
    let Some(in_views) = input.query_variants else {
        return Ok(None);
    };
    let catalogue = OnGallery {
        engine,
        gallery,
        suns,
    };
    let prepared = Prepared {
        input,
        in_views: (last, in_views),
    };
    let features = |only: Option<&HashSet<String>>, views| prepared.features(only, views);
    let options = SearchOptions {
        top_k: params.top_k,
        shortlist: params.shortlist,
        mode: params.mode,
        nprobe: None,
        group_views: params.group_views,
        turns: 1,
        opposite_sun: false,
        // the plan's stages verify; an explicit verify would search in place of rechecking
        verify: 0,
        recheck: true,
        recheck_views: None,
    };
    let answer = craterdex_engine::search(
        &catalogue,
        SearchInput::Viewed(&features),
        &options,
        &Silent,
    )?;
    let rankings: Vec<Vec<usize>> = answer
        .hits
        .iter()
        .map(|a| a.results.iter().map(|h| positions[h.id.as_str()]).collect())
        .collect();
    let (per_query, top) = results_of(&rankings, input);
    // each stage's share of the queries, as the answer says it ran (a stage that did not run
    // searched none)
    let n = input.queries.len().max(1) as f64;
    let share = |pick: &dyn Fn(&craterdex_engine::Stage) -> bool| {
        answer
            .stages
            .iter()
            .skip(1)
            .find(|r| pick(&r.stage))
            .map_or(0.0, |r| r.searched as f64 / n)
    };
    let again = plan.again().first().map(|s| s.name);
    let id = RegimeId {
        recheck: true,
        ..RegimeId::shipped().whitened(white).grouped(true)
    };
    Ok(Some(RegimeResult {
        id,
        summary: summarise(&per_query),
        k: id.k(),
        bytes_per_image,
        shortlist_recall: None,
        query_ms: query_ms(&catalogue, prepared, &options),
        searched_again: Some(share(&|s| Some(s.name) == again)),
        searched_in_turns: Some(share(&|s| s.views == last)),
        searched_relit: (!suns.is_empty()).then(|| share(&|s| s.views.relit)),
        per_query,
        top,
    }))
}

/// Mean milliseconds per query of the rechecked search answering the first
/// [`TIMED_QUERIES`] queries one at a time for their 10 best, as a user's single query
/// runs: every stage it needs included.
fn query_ms(catalogue: &OnGallery, prepared: Prepared, options: &SearchOptions) -> f64 {
    let options = SearchOptions {
        top_k: 10,
        ..*options
    };
    let ids = &prepared.input.queries.ids;
    let timed = ids.len().min(TIMED_QUERIES);
    let t = std::time::Instant::now();
    for id in &ids[..timed] {
        let one = HashSet::from([id.clone()]);
        let only = |asked: Option<&HashSet<String>>, views: QueryViews| match asked {
            Some(a) if !a.contains(id) => prepared.features(Some(&HashSet::new()), views),
            _ => prepared.features(Some(&one), views),
        };
        let _ = std::hint::black_box(craterdex_engine::search(
            catalogue,
            SearchInput::Viewed(&only),
            &options,
            &Silent,
        ));
    }
    t.elapsed().as_secs_f64() * 1e3 / timed.max(1) as f64
}
