//! A set of shard indexes searched as one catalogue ([`ShardedEngine`]), and the merge of
//! per-shard hit lists ([`merge_hits`]) that a cluster's router applies to the answers of
//! its shard replicas. Every shard has the same encoder (checked when the set is read), so a
//! query is encoded once and scores compare across shards; every view of a crater lies in
//! one shard, so each shard's grouping of views is already the grouping of the whole.

use crate::engine::{Engine, QueryHits, SearchHit};
use crate::error::{Error, Result};
use crate::extractor::Extractor;
use crate::progress::Progress;
use craterdex_errors::ensure;
use craterdex_index::shards::ShardSet;
use craterdex_index::SearchParams;
use craterdex_model::extract::FeatureSet;
use craterdex_tokens::Descriptors;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The first `top_k` hits of the shards' lists (each ranked as `search` ranks it), ranked
/// again: by score, or, with `group_views`, crater by crater (a crater's views, which lie in
/// one shard, stay together behind its best view). Ties keep shard order, then rank.
pub fn merge_hits(
    per_shard: Vec<Vec<SearchHit>>,
    top_k: usize,
    group_views: bool,
) -> Vec<SearchHit> {
    // runs of one crater's hits in a grouped list move as one block, keyed by their first
    let mut blocks: Vec<(f32, usize, usize, Vec<SearchHit>)> = Vec::new();
    for (shard, hits) in per_shard.into_iter().enumerate() {
        for (rank, hit) in hits.into_iter().enumerate() {
            let joins = group_views
                && hit.crater_id.is_some()
                && blocks
                    .last()
                    .is_some_and(|(_, s, _, b)| *s == shard && b[0].crater_id == hit.crater_id);
            match blocks.last_mut() {
                Some(block) if joins => block.3.push(hit),
                _ => blocks.push((hit.score, shard, rank, vec![hit])),
            }
        }
    }
    blocks.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut out: Vec<SearchHit> = blocks.into_iter().flat_map(|b| b.3).take(top_k).collect();
    for (i, h) in out.iter_mut().enumerate() {
        h.rank = i + 1;
    }
    out
}

/// The encoder a shard set shares, on its own: what a cluster's router holds to encode each
/// query once and send its descriptors (not its much larger features) to every shard.
pub struct QueryEncoder {
    encoder: craterdex_tokens::Encoder,
    /// The feature width its whitening expects, when it whitens.
    width: Option<usize>,
}

impl QueryEncoder {
    /// From the bytes of a shard's `encoder.json` (every shard of a set has the same).
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        let encoder: craterdex_tokens::Encoder = serde_json::from_slice(bytes)
            .map_err(|e| Error::Invalid(format!("encoder.json: {e}")))?;
        let width = encoder.validate()?;
        Ok(Self { encoder, width })
    }

    /// The width of its tokens for features of width `feature_dim`.
    pub fn token_dim(&self, feature_dim: usize) -> usize {
        self.encoder.token_dim(feature_dim)
    }

    /// Descriptors of every image of `features`, refused when their width is not the one
    /// the encoder learned on.
    pub fn encode(&self, features: &FeatureSet) -> Result<Vec<Descriptors>> {
        if let Some(w) = self.width {
            ensure!(
                features.dim == w,
                Error::Invalid(format!(
                    "{}-d features for an encoder of {w}-d features",
                    features.dim
                ))
            );
        }
        Ok(crate::recipe::encode_all(&self.encoder, features))
    }
}

/// Every shard of a set, open, searched as one catalogue on this machine.
pub struct ShardedEngine {
    pub set: ShardSet,
    shards: Vec<Engine>,
}

impl ShardedEngine {
    /// Opens the set in `dir` (every shard's checksums verified) for queries from
    /// `extractor`.
    pub fn open(dir: &Path, extractor: Option<Arc<Extractor>>) -> Result<Self> {
        let set = ShardSet::read(dir)?;
        let shards = set
            .shards
            .iter()
            .map(|s| Engine::open(&dir.join(&s.name), extractor.clone()))
            .collect::<Result<Vec<_>>>()?;
        ensure!(
            !shards.is_empty(),
            Error::Invalid(format!("{}: a set of no shards", dir.display()))
        );
        Ok(Self { set, shards })
    }

    pub fn shards(&self) -> &[Engine] {
        &self.shards
    }

    /// Images that can be found, over all shards.
    pub fn live(&self) -> usize {
        self.shards.iter().map(|e| e.index().live()).sum()
    }

    /// Ranked hits for each query's descriptors: every shard searched, the lists merged.
    pub fn search(&self, queries: &[Descriptors], params: &SearchParams) -> Vec<Vec<SearchHit>> {
        let per_shard: Vec<Vec<Vec<SearchHit>>> = self
            .shards
            .iter()
            .map(|e| e.search(queries, params))
            .collect();
        (0..queries.len())
            .map(|q| {
                let lists = per_shard.iter().map(|s| s[q].clone()).collect();
                merge_hits(lists, params.top_k, params.group_views)
            })
            .collect()
    }

    /// Ranked hits for backbone features: encoded once (the shards share their encoder).
    pub fn search_features(&self, features: &FeatureSet, params: &SearchParams) -> Vec<QueryHits> {
        QueryHits::named(
            &features.ids,
            self.search(&self.shards[0].encode(features), params),
        )
    }

    /// Ranked hits for query images `(name, path)`: each read by the model once.
    pub fn search_images(
        &self,
        items: &[(String, PathBuf)],
        params: &SearchParams,
        progress: &dyn Progress,
    ) -> Result<Vec<QueryHits>> {
        let features = self.shards[0].query_features(items, progress)?;
        Ok(self.search_features(&features, params))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_images::{image, write_index};
    use craterdex_index::Mode;

    /// With a shortlist at least the shard size, the shards' merged hits and scores equal
    /// the whole index's, ungrouped and grouped; at a small shortlist, the shards' hits are
    /// never worse (each shard shortlists its own best).
    #[test]
    fn shards_searched_as_one_equal_the_whole_index() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("idx");
        let images: Vec<_> = (0..120)
            .map(|i| {
                let (mut m, d) = image(i);
                m.crater_id = Some(format!("c{}", i / 3));
                (m, d)
            })
            .collect();
        write_index(&dir, &images);
        let whole = Engine::open(&dir, None).unwrap();
        whole
            .index()
            .split(&tmp.path().join("set"), 3, &[])
            .unwrap();
        let sharded = ShardedEngine::open(&tmp.path().join("set"), None).unwrap();
        assert_eq!(sharded.live(), 120);
        // queries: images of the index and unrelated ones
        let queries: Vec<Descriptors> = [5, 40, 77, 119, 500, 501]
            .iter()
            .map(|&i| image(i).1)
            .collect();
        for group_views in [false, true] {
            let params = SearchParams {
                top_k: 12,
                shortlist: 120,
                mode: Mode::TwoStage,
                group_views,
                ..Default::default()
            };
            let key = |hits: &[SearchHit]| -> Vec<(String, i64)> {
                hits.iter()
                    .map(|h| (h.id.clone(), (h.score * 1e6).round() as i64))
                    .collect()
            };
            let (a, b) = (
                whole.search(&queries, &params),
                sharded.search(&queries, &params),
            );
            for (q, (a, b)) in a.iter().zip(&b).enumerate() {
                assert_eq!(key(a), key(b), "query {q}, grouped {group_views}");
                assert!(b.iter().enumerate().all(|(i, h)| h.rank == i + 1));
            }
            if group_views {
                // views of one crater stay together in the merged list
                for hits in &b {
                    let craters: Vec<_> = hits.iter().map(|h| h.crater_id.clone()).collect();
                    let mut seen = std::collections::HashSet::new();
                    let mut last = None;
                    for c in craters {
                        if Some(&c) != last.as_ref() {
                            assert!(seen.insert(c.clone()), "{c:?} split in the list");
                            last = Some(c);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn merged_lists_keep_score_order_and_blocks() {
        let hit = |id: &str, crater: &str, score: f32| SearchHit {
            rank: 0,
            id: id.into(),
            crater_id: Some(crater.into()),
            score,
            stage1: None,
            stage2: None,
            inliers: None,
            meta: Default::default(),
            row: 0,
        };
        let a = vec![
            hit("a1", "A", 0.9),
            hit("a2", "A", 0.5),
            hit("b1", "B", 0.7),
        ];
        let b = vec![hit("c1", "C", 0.8), hit("c2", "C", 0.6)];
        let ids = |v: Vec<SearchHit>| v.into_iter().map(|h| h.id).collect::<Vec<_>>();
        assert_eq!(
            ids(merge_hits(vec![a.clone(), b.clone()], 4, true)),
            ["a1", "a2", "c1", "c2"]
        );
        assert_eq!(
            ids(merge_hits(vec![a, b], 4, false)),
            ["a1", "c1", "b1", "c2"]
        );
    }
}
