//! The queries of a regime's search and how each form is searched and timed.

use crate::regime::RegimeId;
use craterdex_engine::{
    Descriptors, Engine, PatchGrid, PatchGrids, QueryViews, SearchHit, SearchParams,
};

/// Queries timed one at a time per regime.
pub const TIMED_QUERIES: usize = 32;

/// One index form of a regime, searched once for a ranking of the whole gallery.
#[derive(Clone)]
pub(super) struct Search {
    pub(super) id: RegimeId,
    /// Tokens per image (for every-token regimes, the patch count).
    pub(super) k: Option<usize>,
    pub(super) params: SearchParams,
    /// Each query searched in its views ([`super::EvalOptions::views`]).
    pub(super) in_views: bool,
    /// Each query's first N hits spatially verified.
    pub(super) verify: Option<usize>,
}

impl Search {
    pub(super) fn new(id: RegimeId, params: SearchParams) -> Self {
        Self {
            k: id.k(),
            id,
            params,
            in_views: false,
            verify: None,
        }
    }

    /// The search and its `_grouped` form.
    pub(super) fn and_grouped(self) -> [Search; 2] {
        let grouped = Search {
            id: self.id.grouped(true),
            params: SearchParams {
                group_views: true,
                ..self.params
            },
            ..self.clone()
        };
        [self, grouped]
    }
}

/// Mean milliseconds per query of `engine` answering `queries` one at a time for their 10
/// best, as a user's single query runs.
pub(super) fn query_ms(engine: &Engine, queries: &Queries, params: &SearchParams) -> f64 {
    let params = SearchParams {
        top_k: 10,
        ..*params
    };
    let timed = queries.len().min(TIMED_QUERIES);
    let t = std::time::Instant::now();
    for q in 0..timed {
        std::hint::black_box(queries.range(q..q + 1).search(engine, &params));
    }
    t.elapsed().as_secs_f64() * 1e3 / timed.max(1) as f64
}

/// The queries of a search: one set of descriptors each, or each in its views, or each with
/// its patch grid for spatial verification.
pub(super) enum Queries<'q> {
    Plain(&'q [Descriptors]),
    InViews(&'q [Vec<Descriptors>], QueryViews),
    Verified {
        queries: &'q [Descriptors],
        grids: &'q [PatchGrid],
        top: usize,
        gallery: &'q PatchGrids<'q>,
    },
    InViewsVerified {
        variants: &'q [Vec<Descriptors>],
        views: QueryViews,
        grids: &'q [Vec<PatchGrid>],
        top: usize,
        gallery: &'q PatchGrids<'q>,
    },
}

impl Queries<'_> {
    pub(super) fn len(&self) -> usize {
        match self {
            Queries::Plain(d) | Queries::Verified { queries: d, .. } => d.len(),
            Queries::InViews(v, _) | Queries::InViewsVerified { variants: v, .. } => v.len(),
        }
    }

    /// The queries at `range`.
    pub(super) fn range(&self, range: std::ops::Range<usize>) -> Queries<'_> {
        match self {
            Queries::Plain(d) => Queries::Plain(&d[range]),
            Queries::InViews(v, views) => Queries::InViews(&v[range], *views),
            Queries::Verified {
                queries,
                grids,
                top,
                gallery,
            } => Queries::Verified {
                queries: &queries[range.clone()],
                grids: &grids[range],
                top: *top,
                gallery,
            },
            Queries::InViewsVerified {
                variants,
                views,
                grids,
                top,
                gallery,
            } => Queries::InViewsVerified {
                variants: &variants[range.clone()],
                views: *views,
                grids: &grids[range],
                top: *top,
                gallery,
            },
        }
    }

    /// Every query's hits from `engine`, a query in views ranked over them, a verified one
    /// as [`Engine::search_verified`] reranks them.
    pub(super) fn search(&self, engine: &Engine, params: &SearchParams) -> Vec<Vec<SearchHit>> {
        match self {
            Queries::Plain(d) => engine.search_descriptors(d, params),
            Queries::InViews(v, views) => engine.search_views(v, *views, params),
            Queries::Verified {
                queries,
                grids,
                top,
                gallery,
            } => engine.search_verified(queries, grids, params, *top, &|h| {
                gallery.get(engine, &h.id)
            }),
            Queries::InViewsVerified {
                variants,
                views,
                grids,
                top,
                gallery,
            } => engine.search_views_verified(variants, *views, grids, params, *top, &|h| {
                gallery.get(engine, &h.id)
            }),
        }
    }
}
