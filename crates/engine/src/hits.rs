//! What a search answers per query: its hits, named.

use craterdex_index::ImageMeta;
use serde::Serialize;

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
    /// spatially verified ([`crate::Engine::search_verified`]); its score then includes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inliers: Option<usize>,
    pub meta: ImageMeta,
    /// The image's row in the index.
    #[serde(skip)]
    pub row: usize,
}

#[cfg(test)]
impl SearchHit {
    /// A hit as tests build them: image `id` of crater `crater`, scored `score`, row 0.
    pub(crate) fn for_test(id: &str, crater: Option<&str>, score: f32) -> Self {
        Self {
            rank: 0,
            id: id.into(),
            crater_id: crater.map(Into::into),
            score,
            stage1: None,
            stage2: None,
            inliers: None,
            meta: ImageMeta {
                id: id.into(),
                ..Default::default()
            },
            row: 0,
        }
    }
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
