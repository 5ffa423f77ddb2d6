//! The paper's evaluation regimes over one feature extraction of a benchmark, each scored by
//! building an index with the shipped build recipe ([`IndexRecipe`], in memory) and ranking
//! the whole gallery for every query through the shipped search ([`Engine`]): the numbers
//! measure the code users run, int8 stage 1, quantised reranking and IVF included.
//!
//! Names: `cls`, `gap`, `gem`, `max` (single vectors, stage 1); `raw_attn_kK`,
//! `inst_attn_kK`, `inst_fps_kK`, `kmeans_kK`, `full_li` (exhaustive late interaction over f32
//! tokens); `two_stage_sS_k32` (CLS shortlist of S, `inst_fps_k32` rerank, f32);
//! `inst_fps_k32_{f16,int8,pq96,pq48}` (exhaustive, per codec); `two_stage_s100_k32_int8`, the
//! shipped default recipe; `two_stage_s100_k32_int8_ivf`, the same with IVF stage 1. Each also
//! with whitening, suffixed `_white`, learned only from gallery images of craters that no
//! query finds relevant. The single vectors, `inst_fps_k32` and the two-stage regimes are also
//! run with their hits listed crater by crater ([`SearchParams::group_views`], what `search`
//! does by default), suffixed `_grouped`. On request the shipped recipe is also searched
//! with each query in several views, turned (`_turnsN`) or under the opposite sun
//! (`_oppsun`), and with its first N hits spatially verified (`_verifyN`).
//!
//! [`queries`] holds the forms a regime's queries take and how each is searched; [`output`]
//! the JSON, per-query CSV and table a run is written as.

mod output;
mod queries;
mod recheck;

pub use output::{per_query_csv, per_query_rows, table, to_json};
pub use queries::TIMED_QUERIES;
use queries::{query_ms, Queries, Search};

use crate::error::Result;
use crate::metrics::{evaluate_ranking, shortlist_recall, summarise, QueryResult, Summary};
pub use crate::regime::{Family, RegimeId, Tokens, Whiten};
use craterdex_engine::{
    encode_all, Aggregation, Codec, Descriptors, Encoder, Engine, FeatureSet, ImageMeta,
    IndexRecipe, IvfSetting, Mode, PatchGrid, PatchGrids, Pooling, QueryViews, RecheckPlan, Recipe,
    SearchParams, SeedStrategy, Stage,
};
use craterdex_tokens::whitening::DEFAULT_REGULARISATION;
use craterdex_tokens::DEFAULT_PAIR_BLEND;
use rayon::prelude::*;
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};

#[derive(Clone, Debug)]
pub struct EvalOptions {
    pub ks: Vec<usize>,
    pub kmeans_ks: Vec<usize>,
    pub shortlists: Vec<usize>,
    pub codecs: Vec<Codec>,
    pub full_li: bool,
    /// The shipped default recipe (int8 two-stage) and its IVF form.
    pub default_recipe: bool,
    /// Which whitening variants to run.
    pub whitening: Vec<Whiten>,
    pub whiten_reg: f32,
    pub seed: u64,
    /// Unless plain, the shipped recipe is also run with each query searched in these views
    /// (`craterdex search --turns N --opposite-sun`), as `..._grouped_turnsN_oppsun`.
    pub views: QueryViews,
    /// With more than 0, the shipped recipe is also run with each query's first `verify`
    /// hits spatially verified (`craterdex search --verify`), as `..._verifyN` (views
    /// grouped and not).
    pub verify: usize,
    /// The shipped recipe also rechecked as `craterdex search` does by default
    /// ([`craterdex_engine::SearchOptions::recheck`]), as `..._grouped_recheck`: one call of
    /// the engine's search per query set, its stages those of the engine's [`RecheckPlan`];
    /// needs the queries in the last stage's views (`views`) and, toward the gallery's suns,
    /// in each stage's ([`EvalInput::query_toward`]). The search in views then verifies the
    /// last stage's images, as the engine's search again does.
    pub recheck: bool,
}

impl Default for EvalOptions {
    fn default() -> Self {
        Self {
            ks: vec![8, 16, 32, 64, 128],
            kmeans_ks: vec![16, 32],
            shortlists: vec![50, 100, 200, 500],
            codecs: vec![
                Codec::F16,
                Codec::Int8,
                Codec::Pq { m: 96 },
                Codec::Pq { m: 48 },
            ],
            full_li: true,
            default_recipe: true,
            whitening: vec![Whiten::Off, Whiten::Pca, Whiten::Pairs],
            whiten_reg: DEFAULT_REGULARISATION,
            seed: 0,
            views: QueryViews::PLAIN,
            verify: 0,
            recheck: false,
        }
    }
}

impl EvalOptions {
    /// Images verified per query by the verified search in views: as deep as the engine's
    /// last search again ([`RecheckPlan::last`]) where rechecking, else `verify`.
    fn verify_in_views(&self) -> usize {
        if self.recheck {
            RecheckPlan::shipped().last().verify
        } else {
            self.verify
        }
    }

    /// A reduced set: K 16 and 32, S 100, int8, the default recipe, no full LI or k-means.
    pub fn quick() -> Self {
        Self {
            ks: vec![16, 32],
            kmeans_ks: vec![],
            shortlists: vec![100],
            codecs: vec![Codec::Int8],
            full_li: false,
            ..Default::default()
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct RegimeResult {
    #[serde(rename = "name")]
    pub id: RegimeId,
    #[serde(flatten)]
    pub summary: Summary,
    /// Tokens per image (token regimes).
    #[serde(rename = "K", skip_serializing_if = "Option::is_none")]
    pub k: Option<usize>,
    /// Stored bytes per image for the searched representation.
    pub bytes_per_image: usize,
    /// Shortlist recall R@S (two-stage regimes).
    #[serde(rename = "R@S", skip_serializing_if = "Option::is_none")]
    pub shortlist_recall: Option<f64>,
    /// Milliseconds per query, one query at a time for its 10 best (the mean over up to
    /// [`TIMED_QUERIES`] queries, on this machine's threads and kernel level).
    pub query_ms: f64,
    /// The share of queries a rechecked regime searched again (toward the gallery's suns
    /// first where it has them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub searched_again: Option<f64>,
    /// The share of queries a rechecked regime searched in turns and under the opposite sun
    /// (those still unsure after the search toward the gallery's suns).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub searched_in_turns: Option<f64>,
    /// The share of queries a rechecked regime searched relit toward the gallery's suns
    /// (those still unsure after the search turned toward them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub searched_relit: Option<f64>,
    #[serde(skip)]
    pub per_query: Vec<QueryResult>,
    /// The 10 best gallery positions per query.
    #[serde(skip)]
    pub top: Vec<Vec<usize>>,
}

pub struct EvalInput<'a> {
    pub gallery: &'a FeatureSet,
    pub queries: &'a FeatureSet,
    /// Index metadata of the gallery images, in feature order.
    pub gallery_metas: Vec<ImageMeta>,
    pub gallery_craters: &'a [String],
    pub relevance: &'a [BTreeSet<String>],
    /// Gallery positions whitening may learn from (craters no query looks for).
    pub whitening_rows: Vec<usize>,
    /// Features of each query's views (`craterdex_engine::QueryViews::images`, rows
    /// `q * views.count() + v`), for the regime in views ([`EvalOptions::views`]).
    pub query_variants: Option<&'a FeatureSet>,
    /// The rechecked regime's searches again toward the gallery's suns, in order
    /// (the [`RecheckPlan`]'s stages toward them, and each query's features in its views, rows as
    /// `query_variants`').
    pub query_toward: Vec<(Stage, &'a FeatureSet)>,
}

/// Runs every regime on the features of benchmark `b`'s gallery and queries (what `craterdex
/// eval` and the Python `evaluate` do after extraction); `progress` as for [`run`].
pub fn run_on_benchmark(
    b: &crate::manifest::Benchmark,
    gallery: &FeatureSet,
    queries: &FeatureSet,
    query_variants: Option<&FeatureSet>,
    query_toward: Vec<(Stage, &FeatureSet)>,
    o: &EvalOptions,
    progress: &dyn Fn(&str),
) -> Result<Vec<RegimeResult>> {
    let aligned = b.align(&gallery.ids, &queries.ids);
    let input = EvalInput {
        gallery,
        queries,
        gallery_metas: b.gallery_metas(&gallery.ids),
        gallery_craters: &aligned.gallery_craters,
        relevance: &aligned.relevance,
        whitening_rows: b.unqueried_gallery_rows(&gallery.ids),
        query_variants,
        query_toward,
    };
    run(&input, o, progress)
}

/// Runs every regime; `progress` receives each regime's name as it starts.
pub fn run(
    input: &EvalInput,
    o: &EvalOptions,
    progress: &dyn Fn(&str),
) -> Result<Vec<RegimeResult>> {
    let n = input.gallery.len();
    let positions: HashMap<&str, usize> = input
        .gallery_metas
        .iter()
        .enumerate()
        .map(|(i, m)| (m.id.as_str(), i))
        .collect();
    let mut out = Vec::new();
    for &white in &o.whitening {
        let base = |pooling: Pooling| IndexRecipe {
            recipe: Recipe {
                pooling,
                aggregation: Aggregation::None,
                whiten: white != Whiten::Off,
                whiten_reg: o.whiten_reg,
                whiten_dim: None,
                whiten_pairs: (white == Whiten::Pairs).then_some(DEFAULT_PAIR_BLEND),
            },
            codec: Codec::F32,
            ivf: IvfSetting::Off,
            nprobe: None,
            seed: o.seed,
        };
        // made under the shipped recipe's encoder, the one regime that verifies
        let gallery_grids = PatchGrids::new(input.gallery);
        // Ranks the gallery for every query through an index built from `gallery` descriptors.
        let score = |recipe: &IndexRecipe,
                     encoder: &Encoder,
                     gallery: Vec<Descriptors>,
                     queries: &[Descriptors],
                     variants: Option<&[Vec<Descriptors>]>,
                     searches: Vec<Search>,
                     out: &mut Vec<RegimeResult>|
         -> Result<()> {
            // the build counts towards the index's first regime
            if let Some(first) = searches.first() {
                progress(&first.id.to_string());
            }
            let index = recipe.index_from_descriptors(
                encoder,
                input.gallery.dim,
                gallery,
                input.gallery_metas.clone(),
                None,
            )?;
            let engine = Engine::new(index, None)?;
            // the queries' patch grids under this index's encoder, once for every search
            // that verifies
            let grids_of = |f: &FeatureSet| -> Vec<PatchGrid> {
                craterdex_engine::feature_refs(f)
                    .into_par_iter()
                    .map(|f| engine.patch_grid(f))
                    .collect()
            };
            let verifies = |in_views: bool| {
                searches
                    .iter()
                    .any(|s| s.verify.is_some() && s.in_views == in_views)
            };
            let query_grids = match verifies(false) {
                true => grids_of(input.queries),
                false => Vec::new(),
            };
            let variant_grids: Vec<Vec<PatchGrid>> = match (verifies(true), input.query_variants) {
                (true, Some(f)) => grids_of(f)
                    .chunks(o.views.count())
                    .map(<[PatchGrid]>::to_vec)
                    .collect(),
                _ => Vec::new(),
            };
            // the grouped search's parameters, which the rechecked regime searches with
            let grouped_params = searches
                .iter()
                .find(|s| s.params.group_views && s.verify.is_none() && !s.in_views)
                .map(|s| s.params);
            for (i, s) in searches.into_iter().enumerate() {
                if i > 0 {
                    progress(&s.id.to_string());
                }
                let these = match (s.in_views, variants, s.verify) {
                    (true, Some(v), Some(top)) => Queries::InViewsVerified {
                        variants: v,
                        views: o.views,
                        grids: &variant_grids,
                        top,
                        gallery: &gallery_grids,
                    },
                    (true, Some(v), _) => Queries::InViews(v, o.views),
                    (_, _, Some(top)) => Queries::Verified {
                        queries,
                        grids: &query_grids,
                        top,
                        gallery: &gallery_grids,
                    },
                    _ => Queries::Plain(queries),
                };
                let hits = these.search(&engine, &s.params);
                let rankings: Vec<Vec<usize>> = hits
                    .iter()
                    .map(|h| h.iter().map(|h| positions[h.id.as_str()]).collect())
                    .collect();
                let (per_query, top) = results_of(&rankings, input);
                // R@S: a relevant image among the candidates stage 1 passed to reranking (a
                // property of stage 1: grouping only reorders, so its rows leave it out)
                let shortlist_recall = (s.params.mode == Mode::TwoStage && !s.params.group_views)
                    .then(|| {
                        let reranked: Vec<QueryResult> = hits
                            .iter()
                            .enumerate()
                            .map(|(q, h)| {
                                let shortlist: Vec<usize> = h
                                    .iter()
                                    .filter(|h| h.stage2.is_some())
                                    .map(|h| positions[h.id.as_str()])
                                    .collect();
                                evaluate_ranking(
                                    q,
                                    &shortlist,
                                    input.gallery_craters,
                                    &input.relevance[q],
                                )
                            })
                            .collect();
                        shortlist_recall(&reranked, s.params.shortlist)
                    });
                let bytes_per_image = engine.index().token_bytes_per_image()
                    + if s.params.mode == Mode::Exhaustive {
                        0
                    } else {
                        engine.index().single_dim() * 4
                    };
                let ms = query_ms(&engine, &these, &s.params);
                out.push(RegimeResult {
                    id: s.id,
                    summary: summarise(&per_query),
                    k: s.k,
                    bytes_per_image,
                    shortlist_recall,
                    query_ms: ms,
                    searched_again: None,
                    searched_in_turns: None,
                    searched_relit: None,
                    per_query,
                    top,
                });
            }
            let in_last_views = o.views == RecheckPlan::shipped().last().views;
            if let (true, Some(_), Some(params)) =
                (o.recheck && in_last_views, variants, grouped_params)
            {
                progress("recheck");
                let bytes_per_image = out.last().map_or(0, |r| r.bytes_per_image);
                let rechecked = recheck::rechecked_regime(
                    &engine,
                    &gallery_grids,
                    input,
                    &params,
                    white,
                    bytes_per_image,
                    &positions,
                )?;
                out.extend(rechecked);
            }
            Ok(())
        };
        let rank_all = |mode: Mode, shortlist: usize| SearchParams {
            top_k: n,
            shortlist,
            mode,
            stage1: Default::default(),
            group_views: false,
        };

        // single vectors: stage 1 of an index without tokens
        let mut cls_encoder = None;
        for pooling in [
            Pooling::Cls,
            Pooling::Gap,
            Pooling::Gem { p: 3.0 },
            Pooling::Max,
        ] {
            let recipe = base(pooling);
            let encoder = recipe.learn_encoder(
                input.gallery,
                Some(&input.whitening_rows),
                &input.gallery_metas,
                &craterdex_engine::Silent,
            )?;
            let id = RegimeId::of(Tokens::Single(pooling)).whitened(white);
            score(
                &recipe,
                &encoder,
                encode_all(&encoder, input.gallery),
                &encode_all(&encoder, input.queries),
                None,
                Search::new(id, rank_all(Mode::Stage1, 0))
                    .and_grouped()
                    .into(),
                &mut out,
            )?;
            if pooling == Pooling::Cls {
                cls_encoder = Some(encoder);
            }
        }
        // token regimes share the CLS encoder's whitening (and its CLS single vector, the
        // two-stage shortlist)
        let cls_encoder = cls_encoder.expect("the CLS regime runs first");
        let tokens = |aggregation: Aggregation| {
            let encoder = cls_encoder.with_aggregation(aggregation);
            let g = encode_all(&encoder, input.gallery);
            let q = encode_all(&encoder, input.queries);
            (encoder, g, q)
        };
        let exhaustive =
            |id: RegimeId| Search::new(id.whitened(white), rank_all(Mode::Exhaustive, 0));
        let f32_recipe = base(Pooling::Cls);
        for &k in &o.ks {
            for (id, aggregation) in [
                (
                    RegimeId::of(Tokens::Raw(k)),
                    Aggregation::Raw {
                        seeds: SeedStrategy::Attention,
                        k,
                    },
                ),
                (
                    RegimeId::of(Tokens::Instance {
                        seeds: SeedStrategy::Attention,
                        k,
                    }),
                    Aggregation::Instance {
                        seeds: SeedStrategy::Attention,
                        k,
                        soft_m: 1,
                    },
                ),
                (
                    RegimeId::fps(k),
                    Aggregation::Instance {
                        seeds: SeedStrategy::Fps,
                        k,
                        soft_m: 1,
                    },
                ),
            ] {
                let (encoder, g, q) = tokens(aggregation);
                let mut searches = vec![exhaustive(id)];
                if id == RegimeId::fps(32) {
                    searches = searches.remove(0).and_grouped().into();
                    searches.extend(o.shortlists.iter().flat_map(|&s| {
                        let two_stage = RegimeId {
                            shortlist: Some(s),
                            ..id
                        };
                        Search::new(two_stage.whitened(white), rank_all(Mode::TwoStage, s))
                            .and_grouped()
                    }));
                }
                score(&f32_recipe, &encoder, g, &q, None, searches, &mut out)?;
            }
        }
        for &k in &o.kmeans_ks {
            let (encoder, g, q) = tokens(Aggregation::KMeans {
                k,
                iterations: 20,
                seed: o.seed,
            });
            let s = exhaustive(RegimeId::of(Tokens::KMeans(k)));
            score(&f32_recipe, &encoder, g, &q, None, vec![s], &mut out)?;
        }
        if o.full_li {
            let (encoder, g, q) = tokens(Aggregation::Full);
            let s = Search {
                k: Some(input.gallery.tokens),
                ..exhaustive(RegimeId::of(Tokens::Full))
            };
            score(&f32_recipe, &encoder, g, &q, None, vec![s], &mut out)?;
        }
        // K = 32 FPS instance tokens under each codec, and the shipped default recipe
        let fps32 = Aggregation::Instance {
            seeds: SeedStrategy::Fps,
            k: 32,
            soft_m: 1,
        };
        let needs_fps32 = !o.codecs.is_empty() || o.default_recipe;
        let (encoder, g32, q32) = if needs_fps32 {
            tokens(fps32)
        } else {
            (cls_encoder.clone(), Vec::new(), Vec::new())
        };
        for &codec in &o.codecs {
            let recipe = IndexRecipe {
                codec,
                ..f32_recipe.clone()
            };
            let s = exhaustive(RegimeId {
                codec: Some(codec),
                ..RegimeId::fps(32)
            });
            let id = s.id;
            if let Err(e) = score(
                &recipe,
                &encoder,
                g32.clone(),
                &q32,
                None,
                vec![s],
                &mut out,
            ) {
                tracing::warn!("regime {id} skipped: {e}");
            }
        }
        if o.default_recipe {
            let shipped = IndexRecipe {
                codec: Codec::Int8,
                ..f32_recipe.clone()
            };
            let search =
                |id: RegimeId| Search::new(id.whitened(white), rank_all(Mode::TwoStage, 100));
            let mut searches: Vec<Search> = search(RegimeId::shipped()).and_grouped().into();
            let variants = match input.query_variants.filter(|_| !o.views.is_plain()) {
                Some(v) => Some(views_of(&encoder, v, input.queries, o.views)?),
                None => None,
            };
            if o.verify > 0 {
                searches.extend(search(RegimeId::shipped()).and_grouped().map(|s| Search {
                    id: RegimeId {
                        verify: Some(o.verify),
                        ..s.id
                    },
                    verify: Some(o.verify),
                    ..s
                }));
            }
            if variants.is_some() {
                let [_, grouped] = search(RegimeId::shipped()).and_grouped();
                searches.push(Search {
                    id: RegimeId {
                        views: o.views,
                        ..grouped.id
                    },
                    in_views: true,
                    ..grouped.clone()
                });
                if o.verify > 0 {
                    // in views and verified: each candidate through the views that match it best
                    let verify = o.verify_in_views();
                    searches.push(Search {
                        id: RegimeId {
                            views: o.views,
                            verify: Some(verify),
                            ..grouped.id
                        },
                        in_views: true,
                        verify: Some(verify),
                        ..grouped
                    });
                }
            }
            score(
                &shipped,
                &encoder,
                g32.clone(),
                &q32,
                variants.as_deref(),
                searches,
                &mut out,
            )?;
            let ivf = IndexRecipe {
                ivf: IvfSetting::Lists(craterdex_index::ivf::default_lists(n).min(n)),
                ..shipped
            };
            let with_ivf = RegimeId {
                ivf: true,
                ..RegimeId::shipped()
            };
            score(
                &ivf,
                &encoder,
                g32,
                &q32,
                None,
                search(with_ivf).and_grouped().into(),
                &mut out,
            )?;
        }
    }
    Ok(out)
}

/// Each query's views encoded by `encoder`, in the queries' order: `variants` holds
/// `views.count()` rows per query, named `<query id>#<view>`.
fn views_of(
    encoder: &Encoder,
    variants: &FeatureSet,
    queries: &FeatureSet,
    views: QueryViews,
) -> Result<Vec<Vec<Descriptors>>> {
    let per = views.count();
    let aligned = variants.len() == per * queries.len()
        && queries.ids.iter().enumerate().all(|(q, id)| {
            variants.ids[q * per]
                .rsplit_once('#')
                .is_some_and(|(base, _)| base == id)
        });
    if !aligned {
        return Err(crate::Error::Invalid(format!(
            "the query views ({} images) are not {per} per query of the {} queries, in order",
            variants.len(),
            queries.len()
        )));
    }
    Ok(encode_all(encoder, variants)
        .chunks(per)
        .map(<[Descriptors]>::to_vec)
        .collect())
}

/// Per-query metrics and the 10 best gallery positions from each query's ranking.
fn results_of(rankings: &[Vec<usize>], input: &EvalInput) -> (Vec<QueryResult>, Vec<Vec<usize>>) {
    rankings
        .par_iter()
        .enumerate()
        .map(|(q, ranking)| {
            let r = evaluate_ranking(q, ranking, input.gallery_craters, &input.relevance[q]);
            (r, ranking.iter().take(10).copied().collect())
        })
        .unzip()
}
