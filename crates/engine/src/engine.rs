//! [`Engine`]: one index, its encoder, and optionally the model that makes its queries.
//! Every front end asks it for ranked hits; none wires model, tokens and index itself.

use crate::catalogue::{self, placed_images, sampled_images, suns_of, Catalogue};
use crate::error::{Error, Result};
use crate::extractor::{split_fingerprint, split_reduction, BackboneRun, Extractor};
use crate::options::{
    verified_search_params, SearchOptions, RECHECK_INLIER_SHARE, VERIFY_CHANCE_SHARE, VERIFY_VIEWS,
    VERIFY_WEIGHT,
};
use crate::progress::Progress;
use crate::recipe::{encode_all, feature_refs};
use crate::views::{shading_angle_of, sun_headings, QueryViews, Suns};
use craterdex_errors::ensure;
use craterdex_index::{
    Hit, ImageMeta, Index, MergePolicy, MergeReport, PreparedMerge, SearchParams,
};
use craterdex_model::extract::FeatureSet;
use craterdex_tokens::verify::verified_score;
use craterdex_tokens::{Descriptors, FeatureRef};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

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

/// One result: the indexed image, its scores and what the index knows about it.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SearchHit {
    /// 1-based.
    pub rank: usize,
    pub id: String,
    pub crater_id: Option<String>,
    /// The score the ranking used (stage 2 where the image was reranked, else stage 1).
    pub score: f32,
    /// The single-vector score.
    pub stage1: Option<f32>,
    /// The late-interaction (MaxSim) score.
    pub stage2: Option<f32>,
    /// Patch correspondences one similarity transform explains, where the hit was
    /// spatially verified ([`Engine::search_verified`]); its score then includes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inliers: Option<usize>,
    pub meta: ImageMeta,
    /// The image's row in the index.
    #[serde(skip)]
    pub row: usize,
}

/// Whether a query's verified hits leave it unsure ([`crate::SearchOptions::recheck`]): its
/// first hit was verified and gathered fewer than [`RECHECK_INLIER_SHARE`] of the query's
/// `patches` as inliers. A first hit that could not be verified (no image) gives no reason
/// to search again.
pub fn unsure(hits: &[SearchHit], patches: usize) -> bool {
    hits.first()
        .and_then(|h| h.inliers)
        .is_some_and(|n| (n as f32) < RECHECK_INLIER_SHARE * patches as f32)
}

/// Whether a query of `patches` patches searched again keeps its new answer
/// ([`crate::SearchOptions::recheck`]): when the new first hit registers with it at least as
/// well (as many inliers) as the first hit of the search as given, and with at least
/// `keep_share` of its patches ([`crate::RECHECK_KEEP_SHARE`], or a search's own,
/// [`crate::Recheck`]). An
/// upright query searched again can meet a look-alike through a turned view, and a query
/// under another sun registers in no turned view; the answer as given, verified, then stands.
pub fn registers_better(
    again: &[SearchHit],
    given: &[SearchHit],
    patches: usize,
    keep_share: f32,
) -> bool {
    let inliers = |hits: &[SearchHit]| hits.first().and_then(|h| h.inliers).unwrap_or(0);
    let new = inliers(again);
    new >= inliers(given) && new as f32 >= keep_share * patches as f32
}

/// The ids and features of query images in some views ([`Engine::search_rechecked`]): of
/// the queries named, or of all of them (`None`), unreadable images left out.
pub type QueryFeatures<'a> =
    dyn Fn(Option<&HashSet<String>>, QueryViews) -> Result<(Vec<String>, FeatureSet)> + 'a;

/// Replaces the answers of the queries that `given` leaves [`unsure`] (of `patches` patches
/// each) by what `search_again` answers for them where that [`registers_better`] (by query
/// name; a query it does not answer keeps its own); how many were unsure. What
/// [`Engine::search_rechecked`] does with its two searches, and eval with its regimes'.
pub fn recheck_answers(
    given: &mut [QueryHits],
    patches: usize,
    keep_share: f32,
    search_again: &dyn Fn(&HashSet<String>) -> Result<Vec<QueryHits>>,
) -> Result<usize> {
    let again: HashSet<String> = given
        .iter()
        .filter(|h| unsure(&h.results, patches))
        .map(|h| h.query.clone())
        .collect();
    if again.is_empty() {
        return Ok(0);
    }
    let mut answers: HashMap<String, Vec<SearchHit>> = search_again(&again)?
        .into_iter()
        .map(|h| (h.query, h.results))
        .collect();
    for h in given.iter_mut() {
        if let Some(r) = answers.remove(&h.query) {
            if registers_better(&r, &h.results, patches, keep_share) {
                h.results = r;
            }
        }
    }
    Ok(again.len())
}

/// The search that lists verification's candidates: the `top` best images, views not
/// grouped (grouping would spend the places on the views of a few craters).
pub(crate) fn candidate_params(params: &SearchParams, top: usize) -> SearchParams {
    SearchParams {
        top_k: top,
        group_views: false,
        ..*params
    }
}

/// The search whose hits verification ranks again: as asked, at least `top` deep.
fn listed_params(params: &SearchParams, top: usize) -> SearchParams {
    SearchParams {
        top_k: params.top_k.max(top),
        ..*params
    }
}

/// The catalogue's sun headings ([`sun_headings`]) from the shading dipoles of the images at
/// `paths` (those unreadable left out): what [`Engine::catalogue_suns`] measures on an index,
/// and eval on a benchmark's gallery.
pub fn sun_headings_of(paths: &[PathBuf]) -> Suns {
    use rayon::prelude::*;
    let angles: Vec<f32> = paths
        .par_iter()
        .filter_map(|p| craterdex_model::preprocess::load_image(p).ok())
        .map(|im| shading_angle_of(&im))
        .collect();
    sun_headings(&angles)
}

/// The results of one query, named.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueryHits {
    pub query: String,
    pub results: Vec<SearchHit>,
}

impl QueryHits {
    /// Each query's hits under its name, in order.
    pub fn named(queries: &[String], results: Vec<Vec<SearchHit>>) -> Vec<QueryHits> {
        queries
            .iter()
            .zip(results)
            .map(|(q, results)| QueryHits {
                query: q.clone(),
                results,
            })
            .collect()
    }
}

/// An index ready to search, with the model for image queries when one is loaded.
pub struct Engine {
    index: Index,
    extractor: Option<Arc<Extractor>>,
    /// The catalogue's suns, measured on first need ([`Engine::catalogue_suns`]).
    suns: OnceLock<Suns>,
}

/// Fails unless queries from `extractor` can search `index`: the same model (when the index
/// records one) and the feature width its encoder expects.
fn check_compatible(index: &Index, extractor: &Extractor) -> Result<()> {
    let fingerprint = extractor.fingerprint();
    if let Some(built) = index.model() {
        // the same model with crops turned or lit another way: say which option makes them
        // match
        let ((model, orient, bright), (built_model, built_orient, built_bright)) =
            (split_fingerprint(&fingerprint), split_fingerprint(built));
        if model == built_model && orient != built_orient {
            return Err(Error::Orientation {
                built: built_orient,
                loaded: orient,
            });
        }
        if model == built_model && bright != built_bright {
            return Err(Error::Brightness {
                built: built_bright,
                loaded: bright,
            });
        }
        // the same model at another input size, token reduction, depth or extra sizes: say
        // which options make them match
        let (base, run) = split_reduction(model);
        let (built_base, built_run) = split_reduction(built_model);
        if base == built_base && run != built_run {
            let config = extractor.vit().config();
            let (depth, own_size) = (config.depth, config.image_size);
            let options = |run: &BackboneRun| {
                let size = match run.size {
                    "" => own_size.to_string(),
                    s => s.to_string(),
                };
                let blocks = match run.blocks {
                    "all" => depth.to_string(),
                    b => b.to_string(),
                };
                let sizes = match run.extra_sizes {
                    "" => String::new(),
                    s => format!(" --extra-sizes {s}"),
                };
                format!(
                    "--size {size} --keep-tokens {} --blocks {blocks}{sizes}",
                    run.kept
                )
            };
            return Err(Error::Invalid(format!(
                "the index was built with {}, the model runs with {}; its queries need the \
                 index's options",
                options(&built_run),
                options(&run)
            )));
        }
    }
    index.check_model(&fingerprint)?;
    let want = index.feature_dim();
    ensure!(
        extractor.dim() == want,
        Error::Invalid(format!(
            "the model gives {}-d features, the index expects {want}-d",
            extractor.dim()
        ))
    );
    Ok(())
}

impl Engine {
    /// Opens the index in `dir` (every checksum verified) for queries from `extractor`.
    pub fn open(dir: &Path, extractor: Option<Arc<Extractor>>) -> Result<Self> {
        Self::new(Index::open(dir)?, extractor)
    }

    /// An engine over an index already open (or held in memory).
    pub fn new(index: Index, extractor: Option<Arc<Extractor>>) -> Result<Self> {
        if let Some(x) = &extractor {
            check_compatible(&index, x)?;
        }
        Ok(Self {
            index,
            extractor,
            suns: OnceLock::new(),
        })
    }

    /// This engine answering image queries with `extractor` (checked against the index).
    pub fn with_extractor(self, extractor: Arc<Extractor>) -> Result<Self> {
        check_compatible(&self.index, &extractor)?;
        Ok(Self {
            extractor: Some(extractor),
            ..self
        })
    }

    pub fn index(&self) -> &Index {
        &self.index
    }
    pub fn extractor(&self) -> Option<&Arc<Extractor>> {
        self.extractor.as_ref()
    }

    pub(crate) fn extractor_or_err(&self) -> Result<&Extractor> {
        self.extractor
            .as_deref()
            .ok_or(Error::NoModel("image queries"))
    }

    /// Descriptors of features under the index's encoder.
    pub fn encode(&self, features: &FeatureSet) -> Vec<Descriptors> {
        encode_all(&self.index.encoder, features)
    }

    /// Ranked hits for each query's descriptors.
    pub fn search(&self, queries: &[Descriptors], params: &SearchParams) -> Vec<Vec<SearchHit>> {
        self.index
            .search(queries, params)
            .into_iter()
            .map(|hits| self.describe(&hits))
            .collect()
    }

    /// Ranked hits for backbone features (named by the feature set's ids).
    pub fn search_features(&self, features: &FeatureSet, params: &SearchParams) -> Vec<QueryHits> {
        QueryHits::named(&features.ids, self.search(&self.encode(features), params))
    }

    /// Extracts `(id, path)` images with the loaded model and encodes them for this index.
    /// Returns the ids that were extracted (unreadable images are skipped with a note) and
    /// their descriptors, in the same order.
    pub fn encode_images(
        &self,
        items: &[(String, PathBuf)],
        progress: &dyn Progress,
    ) -> Result<(Vec<String>, Vec<Descriptors>)> {
        let features = self
            .extractor_or_err()?
            .extract(items, "entries", progress)?;
        let descs = self.encode(&features);
        Ok((features.ids, descs))
    }

    /// Features of query images `(name, path)`, read by the loaded model.
    pub fn query_features(
        &self,
        items: &[(String, PathBuf)],
        progress: &dyn Progress,
    ) -> Result<FeatureSet> {
        self.extractor_or_err()?.extract(items, "queries", progress)
    }

    /// Ranked hits for queries given as their `views` ([`QueryViews::images`]: the query as
    /// given first), each image by its best score over them, each view counted its
    /// [`QueryViews::margin`] lower.
    pub fn search_views(
        &self,
        queries: &[Vec<Descriptors>],
        views: QueryViews,
        params: &SearchParams,
    ) -> Vec<Vec<SearchHit>> {
        self.index
            .search_variants(queries, params, &views.margins())
            .iter()
            .map(|h| self.describe(h))
            .collect()
    }

    /// An image's patch tokens as spatial verification compares them: unit length, under
    /// the index's token whitening.
    pub fn patch_grid(&self, f: FeatureRef) -> PatchGrid {
        PatchGrid {
            dim: self.index.encoder.token_dim(f.cls.len()),
            tokens: self.index.encoder.prepared_tokens(f).0,
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
            &|p| self.search(queries, p),
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
        let candidates = search(&candidate_params(params, top));
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
                |row| self.index.meta(row).crater_id.as_deref(),
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
                let li = self.index.late_interaction(&d.tokens, &[row]);
                (
                    v,
                    li.first().copied().unwrap_or(f32::MIN) - query.views.margin(v),
                )
            })
            .collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1));
        scored.into_iter().take(keep).map(|(v, _)| v).collect()
    }

    /// Extracts features of `(id, path)` query images and searches them as `options` ask
    /// ([`crate::SearchOptions`]): rechecked ([`Engine::search_rechecked`]), in their views
    /// ([`Engine::search_views`]), with the best images spatially verified
    /// ([`Engine::search_variants_verified`]; a query in several views through the
    /// [`VERIFY_VIEWS`] views that match each candidate best) or plainly; `params` are
    /// `options`' own, checked by the front end.
    pub fn search_images_as(
        &self,
        items: &[(String, PathBuf)],
        params: &SearchParams,
        options: &SearchOptions,
        progress: &dyn Progress,
    ) -> Result<Vec<QueryHits>> {
        catalogue::search_images_as(
            self,
            self.extractor_or_err()?,
            items,
            params,
            options,
            progress,
        )
    }

    /// The headings of the catalogue's suns ([`sun_headings`]) from the shading dipoles of
    /// [`crate::SUN_SAMPLE`] indexed images ([`crate::sun_sample`]), read where the index
    /// recorded them; measured once per engine. None where no image is readable.
    pub fn catalogue_suns(&self) -> Suns {
        *self.suns.get_or_init(|| suns_of(&[&self.index]))
    }

    /// This index's own [`crate::sun_sample`]: each image's id and the heading of its
    /// shading dipole in radians (None where its image cannot be read), what a cluster's
    /// router gathers from every shard ([`crate::suns_from_samples`]).
    pub fn sun_sample_angles(&self) -> Vec<(String, Option<f32>)> {
        use rayon::prelude::*;
        sampled_images(placed_images(&self.index))
            .par_iter()
            .map(|&(id, p)| {
                let angle = craterdex_model::preprocess::load_image(p)
                    .ok()
                    .map(|im| shading_angle_of(&im));
                (id.to_string(), angle)
            })
            .collect()
    }

    /// Queries searched as given with their [`crate::RECHECK_VERIFY`] best images verified;
    /// those whose first hit does not register with them ([`unsure`]) searched again toward
    /// the catalogue's suns ([`Engine::catalogue_suns`], [`crate::toward_stages`]: turned,
    /// then relit, two views per sun each, [`crate::RECHECK_TOWARD_VERIFY`] verified), and
    /// those still unsure in [`crate::RECHECK_VIEWS`] (turns and the
    /// opposite sun) with their [`crate::RECHECK_AGAIN_VERIFY`] best images verified
    /// ([`crate::SearchOptions::recheck`]); each new answer kept where it
    /// [`registers_better`]. `features` gives the queries' ids and features in some views
    /// (the ids asked for, or all of them; unreadable images left out). Where verification
    /// cannot run (no square patch grid: an oriented or multi-scale index) the search is
    /// plain.
    pub fn search_rechecked(
        &self,
        features: &QueryFeatures,
        params: &SearchParams,
        progress: &dyn Progress,
    ) -> Result<Vec<QueryHits>> {
        catalogue::search_rechecked(self, features, params, progress)
    }

    /// [`Engine::search_features`] with each query's `top` best images spatially verified
    /// ([`Engine::search_verified`]): the candidates' patch tokens come from their images,
    /// read where the index recorded them (`path`) and run through the model (the feature
    /// cache serves them again); candidates without a readable image are not verified,
    /// and a note says which. 0 is a plain search.
    pub fn search_features_verified(
        &self,
        queries: &FeatureSet,
        params: &SearchParams,
        top: usize,
        progress: &dyn Progress,
    ) -> Result<Vec<QueryHits>> {
        if top == 0 {
            return Ok(self.search_features(queries, params));
        }
        self.search_variants_verified(
            &queries.ids,
            queries,
            QueryViews::PLAIN,
            params,
            top,
            progress,
        )
    }

    /// Queries `ids` given as the features of their `views` (`variants`: each query's
    /// [`QueryViews::count`] rows in a row; one row each for a plain search), searched in
    /// those views with their `top` best images verified ([`Engine::search_views_verified`]),
    /// the candidates' grids from their images.
    pub fn search_variants_verified(
        &self,
        ids: &[String],
        variants: &FeatureSet,
        views: QueryViews,
        params: &SearchParams,
        top: usize,
        progress: &dyn Progress,
    ) -> Result<Vec<QueryHits>> {
        let queries = self.viewed_queries(ids, variants, views)?;
        let params = verified_search_params(params);
        let candidates =
            self.search_views(&queries.descriptors, views, &candidate_params(&params, top));
        let results =
            self.verify_candidates(&queries, views, &params, top, candidates, progress)?;
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
        let listed = self.search_views(&queries.descriptors, views, &listed_params(params, top));
        let (descriptors, query_grids) = queries.slices();
        Ok(self.verify_listed(
            listed,
            candidates,
            &descriptors,
            views,
            &query_grids,
            params,
            &|hit| grids.get(self, &hit.id),
        ))
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
            .search_views(&queries.descriptors, views, &candidate_params(&params, top))
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
        let descriptors = self
            .encode(variants)
            .chunks(per)
            .map(<[Descriptors]>::to_vec)
            .collect();
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
                let m = self.index.meta(r);
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

    /// Ranked hits for decoded query images named `ids` (arrays handed over from Python, an
    /// upload), searched as `options` ask ([`Engine::search_images_as`]).
    pub fn search_decoded(
        &self,
        ids: &[String],
        images: &[image::DynamicImage],
        params: &SearchParams,
        options: &SearchOptions,
        progress: &dyn Progress,
    ) -> Result<Vec<QueryHits>> {
        ensure!(
            ids.len() == images.len(),
            Error::Invalid(format!("{} ids for {} images", ids.len(), images.len()))
        );
        catalogue::search_as(
            self,
            &|only, views| {
                let (ids, images): (Vec<String>, Vec<image::DynamicImage>) = ids
                    .iter()
                    .zip(images)
                    .filter(|(id, _)| only.is_none_or(|o| o.contains(*id)))
                    .map(|(id, im)| (id.clone(), im.clone()))
                    .unzip();
                let features = self.decoded_variant_features(&ids, &images, views, progress)?;
                Ok((ids, features))
            },
            params,
            options,
            progress,
        )
    }

    /// The descriptors of one decoded image's `views` ([`QueryViews::images`]).
    pub fn encode_image_variants(
        &self,
        image: &image::DynamicImage,
        views: QueryViews,
        progress: &dyn Progress,
    ) -> Result<Vec<Descriptors>> {
        let features = self.decoded_variant_features(
            &["query".to_string()],
            std::slice::from_ref(image),
            views,
            progress,
        )?;
        Ok(self.encode(&features))
    }

    /// The descriptors of `(id, path)` images turned by `angle` radians about their centres
    /// (image axes, x right and y down), as the catalogue would see them: a registered
    /// observation's crops brought to the catalogue's orientation. Unreadable images fail.
    pub fn encode_turned(
        &self,
        items: &[(String, PathBuf)],
        angle: f32,
    ) -> Result<Vec<Descriptors>> {
        let extractor = self.extractor_or_err()?;
        let mut out = Vec::with_capacity(items.len());
        for chunk in items.chunks(64) {
            let images = chunk
                .iter()
                .map(|(_, p)| Ok(turned(&craterdex_model::preprocess::load_image(p)?, angle)))
                .collect::<Result<Vec<_>>>()?;
            let ids: Vec<String> = chunk.iter().map(|(id, _)| id.clone()).collect();
            out.extend(self.encode(&extractor.features_of_images(
                &ids,
                &images,
                &crate::Silent,
            )?));
        }
        Ok(out)
    }

    /// The descriptors of one decoded image turned by `angle` radians about its centre, as
    /// [`Engine::encode_turned`] turns files.
    pub fn encode_image_turned(
        &self,
        image: &image::DynamicImage,
        angle: f32,
    ) -> Result<Descriptors> {
        self.encode_image(&turned(image, angle))
    }

    /// The features of decoded images' `views` ([`Extractor::features_of_variants`]).
    pub fn decoded_variant_features(
        &self,
        ids: &[String],
        images: &[image::DynamicImage],
        views: QueryViews,
        progress: &dyn Progress,
    ) -> Result<FeatureSet> {
        self.extractor_or_err()?
            .features_of_variants(ids, images, views, progress)
    }

    /// The descriptors of one decoded image (an upload) under the index's encoder.
    pub fn encode_image(&self, image: &image::DynamicImage) -> Result<Descriptors> {
        let f = self.extractor_or_err()?.features_of(image)?;
        Ok(self.index.encoder.encode(FeatureRef {
            cls: &f.cls,
            patches: &f.patches,
            attention: &f.attention,
        }))
    }

    /// Searches with the stored descriptors of an indexed image.
    pub fn similar(&self, id: &str, params: &SearchParams) -> Result<Vec<SearchHit>> {
        let row = self
            .index
            .row_of(id)
            .ok_or_else(|| Error::NoSuchImage(id.to_string()))?;
        let desc = self.index.descriptors_of(row);
        Ok(self
            .search(std::slice::from_ref(&desc), params)
            .pop()
            .unwrap_or_default())
    }

    /// Hits with their ranks and metadata.
    pub fn describe(&self, hits: &[Hit]) -> Vec<SearchHit> {
        hits.iter()
            .enumerate()
            .map(|(i, h)| {
                let m = self.index.meta(h.row);
                SearchHit {
                    rank: i + 1,
                    id: m.id.clone(),
                    crater_id: m.crater_id.clone(),
                    score: h.score,
                    stage1: h.stage1,
                    stage2: h.stage2,
                    inliers: None,
                    meta: m.clone(),
                    row: h.row,
                }
            })
            .collect()
    }

    fn dir(&self) -> Result<&Path> {
        match self.index.dir() {
            Some(d) => Ok(d),
            None => Err(Error::InMemory),
        }
    }

    /// Adds encoded images through the index's atomic path and returns the engine over the
    /// index as it now is.
    pub fn add(&self, images: &[(ImageMeta, Descriptors)]) -> Result<(usize, Engine)> {
        self.dir()?;
        let (n, index) = self.index.add_images(images)?;
        Ok((n, self.over(index)))
    }

    /// Each image's record with its descriptors, in the order of `features`; `metas` (any
    /// order) holds a record for every image.
    pub fn encode_with_metas(
        &self,
        metas: Vec<ImageMeta>,
        features: &FeatureSet,
    ) -> Result<Vec<(ImageMeta, Descriptors)>> {
        let metas = crate::inputs::metas_in_order(metas, &features.ids)?;
        Ok(metas.into_iter().zip(self.encode(features)).collect())
    }

    /// Reads `entries` with the loaded model: each readable image's record with its
    /// descriptors (unreadable images are skipped with a note).
    pub fn encode_entries(
        &self,
        entries: &crate::Entries,
        progress: &dyn Progress,
    ) -> Result<Vec<(ImageMeta, Descriptors)>> {
        let features = self
            .extractor_or_err()?
            .extract(&entries.items, "entries", progress)?;
        self.encode_with_metas(entries.metas.clone(), &features)
    }

    /// Adds the features of new images; `metas` (any order) holds each one's record.
    pub fn add_features(
        &self,
        metas: Vec<ImageMeta>,
        features: &FeatureSet,
    ) -> Result<(usize, Engine)> {
        self.add(&self.encode_with_metas(metas, features)?)
    }

    /// Reads `entries` with the loaded model and adds them (unreadable images are skipped
    /// with a note).
    pub fn add_entries(
        &self,
        entries: &crate::Entries,
        progress: &dyn Progress,
    ) -> Result<(usize, Engine)> {
        self.add(&self.encode_entries(entries, progress)?)
    }

    /// Removes images by id; returns how many were present and the engine afterwards.
    pub fn remove(&self, ids: &[String]) -> Result<(usize, Engine)> {
        self.dir()?;
        let (n, index) = self.index.remove_ids(ids)?;
        Ok((n, self.over(index)))
    }

    /// Writes the next merge `policy` asks for beside the index (searches and writes go on);
    /// `None` when it asks for none, or another merger is at work and `wait` is false.
    /// [`Engine::commit_merge`] makes it visible.
    pub fn prepare_merge(&self, policy: &MergePolicy, wait: bool) -> Result<Option<PreparedMerge>> {
        self.dir()?;
        Ok(self.index.prepare_merge(policy, wait)?)
    }

    /// Makes a prepared merge visible and returns the engine over the index as it now is
    /// (`None` when the index was rebuilt meanwhile and the merge was dropped).
    pub fn commit_merge(&self, merge: PreparedMerge) -> Result<Option<Engine>> {
        Ok(if Index::commit_merge(merge)? {
            Some(self.reopened()?)
        } else {
            None
        })
    }

    /// Merges segments by `policy` until it asks for nothing more.
    pub fn merge(&self, policy: &MergePolicy) -> Result<(MergeReport, Engine)> {
        self.dir()?;
        let (report, index) = self.index.merged(policy)?;
        Ok((report, self.over(index)))
    }

    /// The index as its directory now holds it (segments already open are kept; new ones
    /// are checked for size and were checksummed as they were written).
    pub(crate) fn reopened(&self) -> Result<Engine> {
        Ok(self.over(self.index.reopened()?))
    }

    /// This engine over another state of its index.
    fn over(&self, index: Index) -> Engine {
        Engine {
            index,
            extractor: self.extractor.clone(),
            suns: OnceLock::new(),
        }
    }
}

impl Catalogue for Engine {
    fn encode(&self, features: &FeatureSet) -> Result<Vec<Descriptors>> {
        Ok(Engine::encode(self, features))
    }
    fn search_views(
        &self,
        queries: &[Vec<Descriptors>],
        views: QueryViews,
        params: &SearchParams,
    ) -> Result<Vec<Vec<SearchHit>>> {
        Ok(Engine::search_views(self, queries, views, params))
    }
    fn search_variants_verified(
        &self,
        ids: &[String],
        variants: &FeatureSet,
        views: QueryViews,
        params: &SearchParams,
        top: usize,
        progress: &dyn Progress,
    ) -> Result<Vec<QueryHits>> {
        Engine::search_variants_verified(self, ids, variants, views, params, top, progress)
    }
    fn suns(&self) -> Result<Suns> {
        Ok(self.catalogue_suns())
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

/// `image` turned by `angle` radians about its centre (image axes, x right and y down).
fn turned(image: &image::DynamicImage, angle: f32) -> image::DynamicImage {
    image::DynamicImage::ImageRgb32F(craterdex_model::preprocess::turn(&image.to_rgb32f(), angle))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{RECHECK_KEEP_SHARE, RECHECK_RELIT_KEEP_SHARE};

    fn hit(id: &str, inliers: Option<usize>) -> SearchHit {
        SearchHit {
            rank: 1,
            id: id.into(),
            crater_id: None,
            score: 0.5,
            stage1: None,
            stage2: None,
            inliers,
            meta: ImageMeta {
                id: id.into(),
                ..Default::default()
            },
            row: 0,
        }
    }

    fn answer(query: &str, first: SearchHit) -> QueryHits {
        QueryHits {
            query: query.into(),
            results: vec![first],
        }
    }

    #[test]
    fn a_query_whose_first_hit_does_not_register_is_answered_again() {
        let patches = 256;
        let least = (RECHECK_INLIER_SHARE * patches as f32).ceil() as usize;
        assert!(!unsure(&[hit("a", Some(least))], patches));
        assert!(unsure(&[hit("a", Some(least - 1))], patches));
        // nothing verified, or nothing found: no reason to search again
        assert!(!unsure(&[hit("a", None)], patches));
        assert!(!unsure(&[], patches));
        let mut given = vec![
            answer("registers", hit("x", Some(200))),
            answer("turned", hit("wrong", Some(20))),
            answer("no image", hit("y", None)),
            answer("turned too", hit("wrong", Some(3))),
            answer("upright, unsure", hit("own", Some(60))),
            answer("relit", hit("own, verified", Some(30))),
        ];
        let asked = std::sync::Mutex::new(Vec::new());
        let again = recheck_answers(&mut given, patches, RECHECK_KEEP_SHARE, &|ids| {
            let mut ids: Vec<String> = ids.iter().cloned().collect();
            ids.sort();
            asked.lock().unwrap().extend(ids.clone());
            // the second search answers three of the four (one image was unreadable): one
            // through a look-alike that registers worse than the answer as given, one better
            // than it but with too few inliers to register at all
            Ok(vec![
                answer("turned", hit("right", Some(150))),
                answer("upright, unsure", hit("look-alike", Some(40))),
                answer("relit", hit("turned look-alike", Some(50))),
            ])
        })
        .unwrap();
        assert_eq!(again, 4);
        assert_eq!(
            *asked.lock().unwrap(),
            ["relit", "turned", "turned too", "upright, unsure"]
        );
        let firsts: Vec<&str> = given.iter().map(|h| h.results[0].id.as_str()).collect();
        assert_eq!(firsts, ["x", "right", "y", "wrong", "own", "own, verified"]);
        // the new answer must register as well as the old and with its own share of inliers
        let keep = (RECHECK_KEEP_SHARE * patches as f32).ceil() as usize;
        let old = [hit("old", Some(10))];
        let k = RECHECK_KEEP_SHARE;
        assert!(registers_better(
            &[hit("new", Some(keep))],
            &old,
            patches,
            k
        ));
        let fewer = [hit("new", Some(keep - 1))];
        assert!(!registers_better(&fewer, &old, patches, k));
        // a search with a lower share of its own keeps it
        assert!(registers_better(
            &fewer,
            &old,
            patches,
            RECHECK_RELIT_KEEP_SHARE
        ));
        assert!(!registers_better(
            &[hit("new", Some(keep + 5))],
            &[hit("old", Some(keep + 6))],
            patches,
            k
        ));
        // every query registering: no second search at all
        let mut sure = vec![answer("registers", hit("x", Some(200)))];
        let none = recheck_answers(&mut sure, patches, RECHECK_KEEP_SHARE, &|_| {
            panic!("searched again")
        })
        .unwrap();
        assert_eq!(none, 0);
    }
}
