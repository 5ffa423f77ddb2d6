//! Spatial verification of a search's best images: each query's candidates registered with
//! it patch by patch ([`craterdex_tokens::verify`]) and ranked again; the patch grids it
//! compares, the candidates' features read from their images, and what a shard of a set
//! answers once the set has chosen the candidates of every shard.

use crate::catalogue::encode_in_views;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::hits::{QueryHits, SearchHit};
use crate::options::{
    verified_search_params, VERIFY_CHANCE_SHARE, VERIFY_VIEWS, VERIFY_VIEWS_PER_CRATER,
    VERIFY_WEIGHT,
};
use crate::progress::Progress;
use crate::recipe::feature_refs;
use crate::views::QueryViews;
use craterdex_errors::ensure;
use craterdex_index::SearchParams;
use craterdex_model::extract::FeatureSet;
use craterdex_tokens::verify::verified_score;
use craterdex_tokens::{Descriptors, FeatureRef};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

/// An image's patch tokens as spatial verification compares them ([`Engine::patch_grid`]):
/// a square grid of unit rows `dim` wide, row by row.
#[derive(Clone, Debug)]
pub struct PatchGrid {
    pub tokens: Vec<f32>,
    pub dim: usize,
}

/// The patch grids of a feature set's images ([`Engine::patch_grid`]), made when first asked
/// for and kept: verification needs those of a few candidates per query, not the whole
/// gallery's.
pub struct PatchGrids<'a> {
    refs: Vec<FeatureRef<'a>>,
    positions: std::collections::HashMap<&'a str, usize>,
    made: std::sync::Mutex<std::collections::HashMap<usize, Arc<PatchGrid>>>,
}

impl<'a> PatchGrids<'a> {
    pub fn new(features: &'a FeatureSet) -> Self {
        Self {
            refs: feature_refs(features),
            positions: features
                .ids
                .iter()
                .enumerate()
                .map(|(i, id)| (id.as_str(), i))
                .collect(),
            made: Default::default(),
        }
    }

    /// The grid of image `id` under `engine`'s encoder (one engine per set of grids).
    pub fn get(&self, engine: &Engine, id: &str) -> Option<Arc<PatchGrid>> {
        let &i = self.positions.get(id)?;
        if let Some(g) = self.made.lock().ok()?.get(&i) {
            return Some(g.clone());
        }
        let grid = Arc::new(engine.patch_grid(self.refs[i]));
        self.made.lock().ok()?.insert(i, grid.clone());
        Some(grid)
    }
}

/// The search that lists verification's candidates ([`crater_candidates`] picks them):
/// the `top` best images times `views_per_crater` (the most views of a crater in the
/// catalogue, at most [`VERIFY_VIEWS_PER_CRATER`]), views not grouped (grouping would list
/// every view of a crater behind its best).
pub(crate) fn candidate_params(
    params: &SearchParams,
    top: usize,
    views_per_crater: usize,
) -> SearchParams {
    SearchParams {
        top_k: top * views_per_crater.clamp(1, VERIFY_VIEWS_PER_CRATER),
        group_views: false,
        ..*params
    }
}

/// What verification verifies of a query's hits ranked best first: the `top` best images,
/// then the best image of each further crater until `top` craters are in. In a catalogue
/// holding each crater under several suns, the `top` best images are the views of a few
/// craters, and a crater whose views all rank below them would go unverified. An image
/// without a crater id counts as a crater of its own. `hit` reads the hit of an item.
pub(crate) fn crater_candidates<T>(
    ranked: Vec<T>,
    top: usize,
    hit: impl Fn(&T) -> &SearchHit,
) -> Vec<T> {
    let mut craters: HashSet<String> = HashSet::new();
    let mut out = Vec::with_capacity(top);
    for (i, item) in ranked.into_iter().enumerate() {
        if i >= top && craters.len() >= top {
            break;
        }
        let h = hit(&item);
        let new = craters.insert(h.crater_id.as_ref().unwrap_or(&h.id).clone());
        if i < top || new {
            out.push(item);
        }
    }
    out
}

/// [`crater_candidates`] of each query's hits.
pub(crate) fn crater_candidates_per_query(
    lists: Vec<Vec<SearchHit>>,
    top: usize,
) -> Vec<Vec<SearchHit>> {
    lists
        .into_iter()
        .map(|hits| crater_candidates(hits, top, |h| h))
        .collect()
}

/// The search whose hits verification ranks again: as asked, at least `top` deep.
fn listed_params(params: &SearchParams, top: usize) -> SearchParams {
    SearchParams {
        top_k: params.top_k.max(top),
        ..*params
    }
}

/// Queries in their views as verification compares them ([`Engine::viewed_queries`]): per
/// query, its views' descriptors and patch grids, in the order of [`QueryViews::images`].
pub(crate) struct ViewedQueries {
    pub descriptors: Vec<Vec<Descriptors>>,
    pub grids: Vec<Vec<PatchGrid>>,
}

impl ViewedQueries {
    /// Each query's descriptors and grids, as [`Engine::verify_listed`] takes them.
    pub fn slices(&self) -> (Vec<&[Descriptors]>, Vec<&[PatchGrid]>) {
        (
            self.descriptors.iter().map(Vec::as_slice).collect(),
            self.grids.iter().map(Vec::as_slice).collect(),
        )
    }
}

/// The indexed rows of `lists`' hits, each once, in order.
fn rows_of(lists: &[Vec<SearchHit>]) -> Vec<usize> {
    let mut rows: Vec<usize> = lists.iter().flatten().map(|h| h.row).collect();
    rows.sort_unstable();
    rows.dedup();
    rows
}

/// One query as verification sees it: its views' descriptors and patch grids, in the order
/// of [`QueryViews::images`].
struct QueryInViews<'a> {
    descriptors: &'a [Descriptors],
    views: QueryViews,
    grids: &'a [PatchGrid],
}

impl Engine {
    /// The most views of one crater in the index: how deep verification lists its
    /// candidates ([`candidate_params`]).
    pub fn views_per_crater(&self) -> usize {
        self.index().most_views_per_crater()
    }

    /// The search that lists this index's verification candidates for the `top` best.
    fn candidates_search(&self, params: &SearchParams, top: usize) -> SearchParams {
        candidate_params(params, top, self.views_per_crater())
    }

    /// An image's patch tokens as spatial verification compares them: unit length, under
    /// the index's token whitening.
    pub fn patch_grid(&self, f: FeatureRef) -> PatchGrid {
        PatchGrid {
            dim: self.index().encoder.token_dim(f.cls.len()),
            tokens: self.index().encoder.prepared_tokens(f).0,
        }
    }

    /// Ranked hits for each query with its `top` best images spatially verified
    /// ([`craterdex_tokens::verify`]): every candidate whose patch grid `candidate` gives
    /// scores its late-interaction score plus [`VERIFY_WEIGHT`] per inlier beyond
    /// [`VERIFY_CHANCE_SHARE`] of the grid (and records its inliers), then the hits are
    /// ranked again as `params` rank (crater by crater when grouping views). Candidates
    /// without a grid keep their scores. `grids` are the queries' own
    /// ([`Engine::patch_grid`]).
    pub fn search_verified(
        &self,
        queries: &[Descriptors],
        grids: &[PatchGrid],
        params: &SearchParams,
        top: usize,
        candidate: &(dyn Fn(&SearchHit) -> Option<Arc<PatchGrid>> + Sync),
    ) -> Vec<Vec<SearchHit>> {
        let per_query: Vec<&[PatchGrid]> = grids.iter().map(std::slice::from_ref).collect();
        let descriptors: Vec<&[Descriptors]> = queries.iter().map(std::slice::from_ref).collect();
        self.verify_search(
            &|p| self.search_descriptors(queries, p),
            &descriptors,
            QueryViews::PLAIN,
            &per_query,
            params,
            top,
            candidate,
        )
    }

    /// [`Engine::search_verified`] for queries given as their `views`
    /// ([`Engine::search_views`]): a candidate's inliers are the most that the
    /// [`VERIFY_VIEWS`] views it matches best by late interaction gather (`grids[q]` holds
    /// query `q`'s views' grids).
    pub fn search_views_verified(
        &self,
        queries: &[Vec<Descriptors>],
        views: QueryViews,
        grids: &[Vec<PatchGrid>],
        params: &SearchParams,
        top: usize,
        candidate: &(dyn Fn(&SearchHit) -> Option<Arc<PatchGrid>> + Sync),
    ) -> Vec<Vec<SearchHit>> {
        let per_query: Vec<&[PatchGrid]> = grids.iter().map(Vec::as_slice).collect();
        let descriptors: Vec<&[Descriptors]> = queries.iter().map(Vec::as_slice).collect();
        self.verify_search(
            &|p| self.search_views(queries, views, p),
            &descriptors,
            views,
            &per_query,
            params,
            top,
            candidate,
        )
    }

    /// What `search` ranks for `params`, each query's `top` best images verified against
    /// the `grids` of its `views` (`descriptors`) and ranked again.
    #[allow(clippy::too_many_arguments)]
    fn verify_search(
        &self,
        search: &dyn Fn(&SearchParams) -> Vec<Vec<SearchHit>>,
        descriptors: &[&[Descriptors]],
        views: QueryViews,
        grids: &[&[PatchGrid]],
        params: &SearchParams,
        top: usize,
        candidate: &(dyn Fn(&SearchHit) -> Option<Arc<PatchGrid>> + Sync),
    ) -> Vec<Vec<SearchHit>> {
        let params = &verified_search_params(params);
        let listed = search(&listed_params(params, top));
        let candidates =
            crater_candidates_per_query(search(&self.candidates_search(params, top)), top);
        self.verify_listed(
            listed,
            candidates,
            descriptors,
            views,
            grids,
            params,
            candidate,
        )
    }

    /// Each query's `listed` hits (as `params` ranked them: a verified search's params) with
    /// its `candidates` verified against the `grids` of its `views` (`descriptors`) and
    /// ranked again.
    #[allow(clippy::too_many_arguments)]
    fn verify_listed(
        &self,
        listed: Vec<Vec<SearchHit>>,
        candidates: Vec<Vec<SearchHit>>,
        descriptors: &[&[Descriptors]],
        views: QueryViews,
        grids: &[&[PatchGrid]],
        params: &SearchParams,
        candidate: &(dyn Fn(&SearchHit) -> Option<Arc<PatchGrid>> + Sync),
    ) -> Vec<Vec<SearchHit>> {
        use rayon::prelude::*;
        listed
            .into_par_iter()
            .zip(candidates)
            .zip(grids)
            .zip(descriptors)
            .map(|(((hits, candidates), grids), descriptors)| {
                let query = QueryInViews {
                    descriptors,
                    views,
                    grids,
                };
                self.verified(&query, hits, candidates, params, candidate)
            })
            .collect()
    }

    /// `hits` (as `params` ranked them) with `candidates` verified against `query` (the
    /// most inliers over the grids of the views each matches best) and ranked again,
    /// `params.top_k` kept.
    fn verified(
        &self,
        query: &QueryInViews,
        mut hits: Vec<SearchHit>,
        candidates: Vec<SearchHit>,
        params: &SearchParams,
        grid: &(dyn Fn(&SearchHit) -> Option<Arc<PatchGrid>> + Sync),
    ) -> Vec<SearchHit> {
        use rayon::prelude::*;
        // candidates in parallel: one query alone still uses every thread
        let verified: Vec<SearchHit> = candidates
            .into_par_iter()
            .filter_map(|mut c| {
                let first = query.grids.first()?;
                let g = grid(&c).filter(|g| g.dim == first.dim)?;
                let n = self
                    .best_views(query, c.row)
                    .into_iter()
                    .filter_map(|v| query.grids.get(v))
                    .map(|q| craterdex_tokens::verify::inliers(&q.tokens, &g.tokens, q.dim))
                    .max()?;
                c.inliers = Some(n);
                let chance = VERIFY_CHANCE_SHARE * (first.tokens.len() / first.dim) as f32;
                c.score = verified_score(c.score, n, chance, VERIFY_WEIGHT);
                Some(c)
            })
            .collect();
        for c in verified {
            match hits.iter_mut().find(|h| h.row == c.row) {
                Some(h) => *h = c,
                None => hits.push(c),
            }
        }
        if params.group_views {
            craterdex_index::order_by_crater(
                &mut hits,
                |h| (h.score, h.row),
                |row| self.index().meta(row).crater_id.as_deref(),
            );
        } else {
            hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.row.cmp(&b.row)));
        }
        hits.truncate(params.top_k);
        for (i, h) in hits.iter_mut().enumerate() {
            h.rank = i + 1;
        }
        hits
    }

    /// The views of a query (as given, then turned, mirrored or relit) that indexed image
    /// `row` matches best by late interaction, best first, each counted its
    /// [`QueryViews::margin`] lower as the search in views counts them: the views that
    /// register the query to the image.
    fn best_views(&self, query: &QueryInViews, row: usize) -> Vec<usize> {
        let keep = VERIFY_VIEWS;
        if query.descriptors.len() <= keep {
            return (0..query.descriptors.len()).collect();
        }
        let mut scored: Vec<(usize, f32)> = query
            .descriptors
            .iter()
            .enumerate()
            .map(|(v, d)| {
                let li = self.index().late_interaction(&d.tokens, &[row]);
                (
                    v,
                    li.first().copied().unwrap_or(f32::MIN) - query.views.margin(v),
                )
            })
            .collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1));
        scored.into_iter().take(keep).map(|(v, _)| v).collect()
    }

    /// Queries `ids` given as the features of their `views` (`variants`: each query's
    /// [`QueryViews::count`] rows in a row; one row each for a plain search), searched in
    /// those views with their `top` best images verified ([`Engine::search_views_verified`]),
    /// the candidates' grids from their images.
    pub(crate) fn search_variants_verified(
        &self,
        ids: &[String],
        variants: &FeatureSet,
        views: QueryViews,
        params: &SearchParams,
        top: usize,
        progress: &dyn Progress,
    ) -> Result<Vec<QueryHits>> {
        let (queries, params, candidates) =
            self.candidates_in_views(ids, variants, views, params, top)?;
        let results =
            self.verify_candidates(&queries, views, &params, top, candidates, progress)?;
        Ok(QueryHits::named(ids, results))
    }

    /// Queries `ids` in their `views` (`variants`), the verified search's parameters and the
    /// candidates it verifies: where every verified search in views starts.
    fn candidates_in_views(
        &self,
        ids: &[String],
        variants: &FeatureSet,
        views: QueryViews,
        params: &SearchParams,
        top: usize,
    ) -> Result<(ViewedQueries, SearchParams, Vec<Vec<SearchHit>>)> {
        let queries = self.viewed_queries(ids, variants, views)?;
        let params = verified_search_params(params);
        let listed = self.search_views(
            &queries.descriptors,
            views,
            &self.candidates_search(&params, top),
        );
        Ok((queries, params, crater_candidates_per_query(listed, top)))
    }

    /// [`Engine::search_variants_verified`] with the candidates' patch grids taken from
    /// `gallery` (the indexed images' features, already extracted: a benchmark's gallery)
    /// rather than from their images, so that it needs no model.
    pub fn search_variants_verified_on(
        &self,
        ids: &[String],
        variants: &FeatureSet,
        views: QueryViews,
        params: &SearchParams,
        top: usize,
        gallery: &PatchGrids,
    ) -> Result<Vec<QueryHits>> {
        let (queries, params, candidates) =
            self.candidates_in_views(ids, variants, views, params, top)?;
        let results = self.verify_with_grids(&queries, views, &params, top, candidates, gallery);
        Ok(QueryHits::named(ids, results))
    }

    /// This index's hits for `queries` in their `views` as a verified search lists them
    /// (`params`: a verified search's), its `candidates` among them verified and ranked
    /// again: what each shard of a set answers once the set has chosen the candidates of
    /// every shard ([`crate::ShardedEngine::search_variants_verified`]).
    pub(crate) fn verify_candidates(
        &self,
        queries: &ViewedQueries,
        views: QueryViews,
        params: &SearchParams,
        top: usize,
        candidates: Vec<Vec<SearchHit>>,
        progress: &dyn Progress,
    ) -> Result<Vec<Vec<SearchHit>>> {
        let features = self.candidate_features(&rows_of(&candidates), progress)?;
        let grids = PatchGrids::new(&features);
        Ok(self.verify_with_grids(queries, views, params, top, candidates, &grids))
    }

    /// [`Engine::verify_candidates`] with the candidates' patch grids from `grids`.
    fn verify_with_grids(
        &self,
        queries: &ViewedQueries,
        views: QueryViews,
        params: &SearchParams,
        top: usize,
        candidates: Vec<Vec<SearchHit>>,
        grids: &PatchGrids,
    ) -> Vec<Vec<SearchHit>> {
        let listed = self.search_views(&queries.descriptors, views, &listed_params(params, top));
        let (descriptors, query_grids) = queries.slices();
        self.verify_listed(
            listed,
            candidates,
            &descriptors,
            views,
            &query_grids,
            params,
            &|hit| grids.get(self, &hit.id),
        )
    }

    /// What this index answers as one shard of a set whose verified search chose the
    /// candidates of every shard ([`crate::ShardCalls::verify_chosen`]): its hits for
    /// queries `ids` given as the features of their `views`, listed as a verified search of
    /// `params` lists them, the candidates it listed that `chosen[q]` names (by id) verified
    /// and ranked again. The candidates are listed again here, so that their rows and scores
    /// are this index's as it stands now.
    #[allow(clippy::too_many_arguments)]
    pub fn verify_chosen(
        &self,
        ids: &[String],
        variants: &FeatureSet,
        views: QueryViews,
        params: &SearchParams,
        top: usize,
        chosen: &[HashSet<String>],
        progress: &dyn Progress,
    ) -> Result<Vec<Vec<SearchHit>>> {
        ensure!(
            chosen.len() == ids.len(),
            Error::Invalid(format!(
                "candidates for {} queries, {} queries",
                chosen.len(),
                ids.len()
            ))
        );
        let queries = self.viewed_queries(ids, variants, views)?;
        self.verify_chosen_viewed(&queries, views, params, top, chosen, progress)
    }

    /// [`Engine::verify_chosen`] for queries already prepared for verification (one
    /// preparation serves every shard of a set on this machine).
    pub(crate) fn verify_chosen_viewed(
        &self,
        queries: &ViewedQueries,
        views: QueryViews,
        params: &SearchParams,
        top: usize,
        chosen: &[HashSet<String>],
        progress: &dyn Progress,
    ) -> Result<Vec<Vec<SearchHit>>> {
        let params = verified_search_params(params);
        let candidates = self
            .search_views(
                &queries.descriptors,
                views,
                &self.candidates_search(&params, top),
            )
            .into_iter()
            .zip(chosen)
            .map(|(hits, keep)| hits.into_iter().filter(|h| keep.contains(&h.id)).collect())
            .collect();
        self.verify_candidates(queries, views, &params, top, candidates, progress)
    }

    /// Queries `ids` given as the features of their `views` (each query's
    /// [`QueryViews::count`] rows in a row) as verification compares them, refused where
    /// they cannot be verified.
    pub(crate) fn viewed_queries(
        &self,
        ids: &[String],
        variants: &FeatureSet,
        views: QueryViews,
    ) -> Result<ViewedQueries> {
        ensure!(
            craterdex_tokens::verify::grid_side(variants.tokens).is_some(),
            Error::Invalid(format!(
                "spatial verification needs one square grid of patch tokens per image; this \
                 model gives {} tokens per image (an oriented index's crops are seen several \
                 times, a multi-scale one's at several sizes)",
                variants.tokens
            ))
        );
        let per = views.count();
        ensure!(
            variants.len() == ids.len() * per,
            Error::Invalid(format!(
                "{} view rows for {} queries of {per} views each",
                variants.len(),
                ids.len()
            ))
        );
        let descriptors = encode_in_views(self, variants, views)?;
        let all: Vec<PatchGrid> = feature_refs(variants)
            .into_iter()
            .map(|f| self.patch_grid(f))
            .collect();
        let grids = all.chunks(per).map(<[PatchGrid]>::to_vec).collect();
        Ok(ViewedQueries { descriptors, grids })
    }

    /// The features of the indexed images at `rows`, read where the index recorded them and
    /// run through the model; those without a path or a readable image are left out (a note
    /// says how many).
    fn candidate_features(&self, rows: &[usize], progress: &dyn Progress) -> Result<FeatureSet> {
        let mut unplaced = 0;
        let candidates: Vec<(String, PathBuf)> = rows
            .iter()
            .filter_map(|&r| {
                let m = self.index().meta(r);
                let path = m.path.as_ref().map(PathBuf::from);
                unplaced += usize::from(path.is_none());
                path.map(|p| (m.id.clone(), p))
            })
            .collect();
        if unplaced > 0 {
            progress.note(&format!(
                "verification: {unplaced} candidates have no image path in the index and keep their scores"
            ));
        }
        if candidates.is_empty() {
            return Ok(FeatureSet::default());
        }
        self.extractor_or_err()?
            .extract(&candidates, "candidates to verify", progress)
            .or_else(|e| match e {
                // none readable: nothing to verify, the plain ranking stands
                Error::Invalid(_) => Ok(FeatureSet::default()),
                e => Err(e),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(hits: &[SearchHit]) -> Vec<&str> {
        hits.iter().map(|h| h.id.as_str()).collect()
    }

    /// Where the best images are the views of a few craters, verification also takes the
    /// best view of each further crater, until as many craters as images were asked for.
    #[test]
    fn candidates_reach_as_many_craters_as_images_asked_for() {
        let ranked: Vec<SearchHit> = [
            ("a1", "A"),
            ("a2", "A"),
            ("a3", "A"),
            ("b1", "B"),
            ("a4", "A"),
            ("c1", "C"),
            ("b2", "B"),
            ("d1", "D"),
        ]
        .iter()
        .enumerate()
        .map(|(i, (id, crater))| SearchHit::for_test(id, Some(crater), 1.0 - i as f32 / 10.0))
        .collect();
        let picked = crater_candidates(ranked, 3, |h| h);
        assert_eq!(ids(&picked), ["a1", "a2", "a3", "b1", "c1"]);
    }

    /// With one view per crater (or no crater ids) the candidates are the best images, as
    /// many as asked for.
    #[test]
    fn with_one_view_per_crater_the_candidates_are_the_best_images() {
        let ranked: Vec<SearchHit> = (0..10)
            .map(|i| SearchHit::for_test(&format!("i{i}"), None, -(i as f32)))
            .collect();
        assert_eq!(
            ids(&crater_candidates(ranked, 4, |h| h)),
            ["i0", "i1", "i2", "i3"]
        );
        let params = SearchParams {
            top_k: 10,
            shortlist: 100,
            mode: craterdex_index::Mode::TwoStage,
            stage1: craterdex_index::Stage1::Exact,
            group_views: true,
        };
        assert_eq!(candidate_params(&params, 50, 1).top_k, 50);
        assert_eq!(candidate_params(&params, 50, 3).top_k, 150);
        assert_eq!(
            candidate_params(&params, 50, 40).top_k,
            50 * VERIFY_VIEWS_PER_CRATER
        );
        assert!(!candidate_params(&params, 50, 3).group_views);
    }
}
