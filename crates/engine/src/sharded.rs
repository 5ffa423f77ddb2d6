//! A set of shard indexes searched as one catalogue: on this machine ([`ShardedEngine`]) or
//! wherever its shards answer ([`ShardCalls`], [`OverShards`]: a cluster's router), and the
//! merge of per-shard hit lists ([`merge_hits`]). Every shard has the same encoder (checked when the set is read), so a
//! query is encoded once and scores compare across shards; every view of a crater lies in
//! one shard, so each shard's grouping of views is already the grouping of the whole.

use crate::catalogue::{encode_in_views, suns_of, Catalogue};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::extractor::Extractor;
use crate::hits::{QueryHits, SearchHit};
use crate::options::{verified_search_params, SearchOptions, VERIFY_VIEWS_PER_CRATER};
use crate::progress::Progress;
use crate::search::{SearchAnswer, SearchInput};
use crate::verify::{candidate_params, crater_candidates};
use crate::views::{QueryViews, Suns};
use craterdex_errors::ensure;
use craterdex_index::shards::ShardSet;
use craterdex_index::{Index, SearchParams};
use craterdex_model::extract::FeatureSet;
use craterdex_tokens::Descriptors;
use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, OnceLock};

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
    /// The catalogue's suns, measured on first need ([`ShardedEngine::catalogue_suns`]).
    suns: OnceLock<Suns>,
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
        Ok(Self {
            set,
            shards,
            suns: OnceLock::new(),
        })
    }

    pub fn shards(&self) -> &[Engine] {
        &self.shards
    }

    /// Images that can be found, over all shards.
    pub fn live(&self) -> usize {
        self.shards.iter().map(|e| e.index().live()).sum()
    }

    /// Ranked hits for each query's descriptors: every shard searched, the lists merged.
    pub fn search_descriptors(
        &self,
        queries: &[Descriptors],
        params: &SearchParams,
    ) -> Vec<Vec<SearchHit>> {
        let per_shard = self
            .shards
            .iter()
            .map(|e| e.search_descriptors(queries, params))
            .collect();
        merged_per_query(per_shard, queries.len(), params)
    }

    /// The queries of `input` searched as one index searches them ([`Engine::search`]):
    /// rechecked by default, in views, verified or plainly.
    pub fn search(
        &self,
        input: SearchInput,
        options: &SearchOptions,
        progress: &dyn Progress,
    ) -> Result<SearchAnswer> {
        crate::search::search(&OverShards(self), input, options, progress)
    }

    /// The headings of the catalogue's suns, from the images of every shard that the index
    /// they were cut from samples ([`crate::sun_sample`], [`Engine::catalogue_suns`]);
    /// measured once.
    pub fn catalogue_suns(&self) -> Suns {
        *self.suns.get_or_init(|| {
            let indexes: Vec<&Index> = self.shards.iter().map(Engine::index).collect();
            suns_of(&indexes)
        })
    }
}

/// What a set of shards answers shard by shard, wherever its shards are: on this machine
/// ([`ShardedEngine`]) or on a cluster's replicas (a router's calls, in the Python
/// package). [`OverShards`] makes a catalogue of it, which merges the shards' answers.
/// Lists per shard come as `[shard][query]`; a shard that did not answer gives empty lists.
pub trait ShardCalls {
    /// Descriptors of features under the set's shared encoder.
    fn encode(&self, features: &FeatureSet) -> Result<Vec<Descriptors>>;
    /// Every shard's ranked hits for queries given as their `views`
    /// ([`Engine::search_views`]).
    fn search_views(
        &self,
        queries: &[Vec<Descriptors>],
        views: QueryViews,
        params: &SearchParams,
    ) -> Result<Vec<Vec<Vec<SearchHit>>>>;
    /// Every shard's verified hits ([`Engine::verify_chosen`]) for queries `ids` given as
    /// the features of their `views`, the candidates of shard `s` named by `chosen[s]`.
    #[allow(clippy::too_many_arguments)]
    fn verify_chosen(
        &self,
        ids: &[String],
        variants: &FeatureSet,
        views: QueryViews,
        params: &SearchParams,
        top: usize,
        chosen: &[Vec<HashSet<String>>],
        progress: &dyn Progress,
    ) -> Result<Vec<Vec<Vec<SearchHit>>>>;
    /// The headings of the whole set's suns ([`crate::suns_from_samples`]).
    fn suns(&self) -> Result<Suns>;
    /// The most views of one crater in any shard: how deep a verified search lists its
    /// candidates ([`crate::verify::candidate_params`]); where the shards cannot say, the
    /// deepest it lists.
    fn views_per_crater(&self) -> usize {
        VERIFY_VIEWS_PER_CRATER
    }
    /// The model that reads query images, where the set has one here.
    fn model(&self) -> Option<&Extractor> {
        None
    }
    /// The stored descriptors of image `id`, from the shard that holds it.
    fn stored(&self, id: &str) -> Result<Descriptors> {
        Err(Error::NoSuchImage(id.to_string()))
    }
}

/// A set of shards searched as one catalogue: each shard's lists merged ([`merge_hits`]);
/// a verified search verifies the best candidates of all shards, each in its own shard.
pub struct OverShards<'a>(pub &'a dyn ShardCalls);

impl Catalogue for OverShards<'_> {
    fn encode(&self, features: &FeatureSet) -> Result<Vec<Descriptors>> {
        self.0.encode(features)
    }
    fn search_views(
        &self,
        queries: &[Vec<Descriptors>],
        views: QueryViews,
        params: &SearchParams,
    ) -> Result<Vec<Vec<SearchHit>>> {
        let per_shard = self.0.search_views(queries, views, params)?;
        Ok(merged_per_query(per_shard, queries.len(), params))
    }
    /// As one index verifies them ([`Engine::search_variants_verified`]): the candidates
    /// are the best `top` of all shards' lists, each verified by its shard (its images, its
    /// late-interaction scores per view), and the shards' lists, ranked again, are merged.
    fn search_variants_verified(
        &self,
        ids: &[String],
        variants: &FeatureSet,
        views: QueryViews,
        params: &SearchParams,
        top: usize,
        progress: &dyn Progress,
    ) -> Result<Vec<QueryHits>> {
        let per_query = encode_in_views(self, variants, views)?;
        let verified = verified_search_params(params);
        let listed = self.0.search_views(
            &per_query,
            views,
            &candidate_params(&verified, top, self.0.views_per_crater()),
        )?;
        let chosen: Vec<Vec<HashSet<String>>> = best_of_shards(listed, top)
            .into_iter()
            .map(|lists| {
                lists
                    .into_iter()
                    .map(|hits| hits.into_iter().map(|h| h.id).collect())
                    .collect()
            })
            .collect();
        let per_shard = self
            .0
            .verify_chosen(ids, variants, views, params, top, &chosen, progress)?;
        Ok(QueryHits::named(
            ids,
            merged_per_query(per_shard, ids.len(), &verified),
        ))
    }
    fn suns(&self) -> Result<Suns> {
        self.0.suns()
    }
    fn model(&self) -> Option<&Extractor> {
        self.0.model()
    }
    fn stored(&self, id: &str) -> Result<Descriptors> {
        self.0.stored(id)
    }
}

impl ShardCalls for ShardedEngine {
    fn encode(&self, features: &FeatureSet) -> Result<Vec<Descriptors>> {
        // the shards share their encoder: the first encodes the queries for all
        Ok(self.shards[0].encode(features))
    }
    fn search_views(
        &self,
        queries: &[Vec<Descriptors>],
        views: QueryViews,
        params: &SearchParams,
    ) -> Result<Vec<Vec<Vec<SearchHit>>>> {
        Ok(self
            .shards
            .iter()
            .map(|e| e.search_views(queries, views, params))
            .collect())
    }
    fn verify_chosen(
        &self,
        ids: &[String],
        variants: &FeatureSet,
        views: QueryViews,
        params: &SearchParams,
        top: usize,
        chosen: &[Vec<HashSet<String>>],
        progress: &dyn Progress,
    ) -> Result<Vec<Vec<Vec<SearchHit>>>> {
        ensure!(
            chosen.iter().all(|c| c.len() == ids.len()),
            Error::Invalid(format!(
                "candidates chosen for other than {} queries",
                ids.len()
            ))
        );
        // the shards share their encoder: the queries are prepared once for all
        let queries = self.shards[0].viewed_queries(ids, variants, views)?;
        self.shards
            .iter()
            .zip(chosen)
            .map(|(e, chosen)| {
                e.verify_chosen_viewed(&queries, views, params, top, chosen, progress)
            })
            .collect()
    }
    fn suns(&self) -> Result<Suns> {
        Ok(self.catalogue_suns())
    }
    fn views_per_crater(&self) -> usize {
        self.shards
            .iter()
            .map(Engine::views_per_crater)
            .max()
            .unwrap_or(1)
    }
    fn model(&self) -> Option<&Extractor> {
        self.shards[0].extractor().map(|x| &**x)
    }
    fn stored(&self, id: &str) -> Result<Descriptors> {
        self.shards
            .iter()
            .find_map(|e| Catalogue::stored(e, id).ok())
            .ok_or_else(|| Error::NoSuchImage(id.to_string()))
    }
}

/// Each query's hits over every shard (`per_shard[shard][query]`, each list ranked as
/// `params` rank), merged by [`merge_hits`].
fn merged_per_query(
    per_shard: Vec<Vec<Vec<SearchHit>>>,
    queries: usize,
    params: &SearchParams,
) -> Vec<Vec<SearchHit>> {
    by_query(per_shard, queries)
        .into_iter()
        .map(|lists| merge_hits(lists, params.top_k, params.group_views))
        .collect()
}

/// Lists per shard and query turned into lists per query and shard.
fn by_query<T>(per_shard: Vec<Vec<T>>, queries: usize) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = (0..queries).map(|_| Vec::new()).collect();
    for lists in per_shard {
        for (q, list) in lists.into_iter().enumerate() {
            out[q].push(list);
        }
    }
    out
}

/// Of each shard's candidate lists (`listed[shard][query]`, best first), each query's
/// candidates over all shards ranked by score (ties: shard order, then rank) as
/// [`crater_candidates`] picks them, handed back to the shards that hold them: what one
/// index's search of the whole catalogue verifies.
fn best_of_shards(listed: Vec<Vec<Vec<SearchHit>>>, top: usize) -> Vec<Vec<Vec<SearchHit>>> {
    let shards = listed.len();
    let queries = listed.first().map_or(0, Vec::len);
    let mut out: Vec<Vec<Vec<SearchHit>>> = vec![vec![Vec::new(); queries]; shards];
    for (q, lists) in by_query(listed, queries).into_iter().enumerate() {
        let mut all: Vec<(usize, usize, SearchHit)> = lists
            .into_iter()
            .enumerate()
            .flat_map(|(s, hits)| hits.into_iter().enumerate().map(move |(r, h)| (s, r, h)))
            .collect();
        all.sort_by(|a, b| {
            b.2.score
                .total_cmp(&a.2.score)
                .then(a.0.cmp(&b.0))
                .then(a.1.cmp(&b.1))
        });
        for (s, _, hit) in crater_candidates(all, top, |(_, _, hit)| hit) {
            out[s][q].push(hit);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::SUN_SAMPLE;
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
                whole.search_descriptors(&queries, &params),
                sharded.search_descriptors(&queries, &params),
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

    /// A cluster's router finds the suns of a set from what each shard samples of its own
    /// images: the same suns as the set on this machine and the index it was cut from.
    #[test]
    fn the_suns_from_each_shards_sample_are_the_whole_index_suns() {
        let tmp = tempfile::tempdir().unwrap();
        // 240 images lit from two sides (30 and 200 degrees), one of them unreadable: more
        // than a sample in every shard
        let images: Vec<_> = (0..240)
            .map(|i| {
                let (mut m, d) = image(i);
                let sun = if i % 3 == 0 { 200f32 } else { 30f32 }.to_radians();
                let path = tmp.path().join(format!("{i}.png"));
                match i {
                    7 => std::fs::write(&path, b"not a png").unwrap(),
                    _ => image::GrayImage::from_fn(32, 32, |x, y| {
                        let (dx, dy) = (x as f32 - 15.5, y as f32 - 15.5);
                        let v = 128.0 + 3.0 * (dx * sun.cos() + dy * sun.sin());
                        image::Luma([v as u8])
                    })
                    .save(&path)
                    .unwrap(),
                }
                m.path = Some(path.display().to_string());
                m.crater_id = Some(format!("c{}", i / 2));
                (m, d)
            })
            .collect();
        let dir = tmp.path().join("idx");
        write_index(&dir, &images);
        let whole = Engine::open(&dir, None).unwrap();
        whole
            .index()
            .split(&tmp.path().join("set"), 3, &[])
            .unwrap();
        let set = ShardedEngine::open(&tmp.path().join("set"), None).unwrap();
        let samples: Vec<_> = set.shards().iter().map(Engine::sun_sample_angles).collect();
        assert!(samples.iter().all(|s| s.len() == SUN_SAMPLE));
        let suns = crate::suns_from_samples(samples);
        assert_eq!(suns.len(), 2, "{suns}");
        assert_eq!(suns, whole.catalogue_suns());
        assert_eq!(suns, set.catalogue_suns());
    }

    /// Each query's best candidates over all shards go back to the shards that hold them:
    /// by score, ties to the first shard, at most `top` in all.
    #[test]
    fn the_best_candidates_of_all_shards_return_to_their_shards() {
        let hit = |id: &str, score: f32| SearchHit::for_test(id, None, score);
        let listed = vec![
            vec![vec![hit("a", 0.9), hit("b", 0.4)], vec![hit("p", 0.2)]],
            vec![vec![hit("c", 0.8), hit("d", 0.4)], vec![hit("q", 0.3)]],
        ];
        let chosen = best_of_shards(listed, 3);
        let ids = |hits: &[SearchHit]| hits.iter().map(|h| h.id.clone()).collect::<Vec<_>>();
        // query 0: a, c, then b (tied with d, the first shard's)
        assert_eq!(ids(&chosen[0][0]), ["a", "b"]);
        assert_eq!(ids(&chosen[1][0]), ["c"]);
        // query 1: fewer than `top` in all, every one kept
        assert_eq!(ids(&chosen[0][1]), ["p"]);
        assert_eq!(ids(&chosen[1][1]), ["q"]);
    }

    /// A crater whose views rank below another crater's many views still comes back to its
    /// shard as a candidate: the candidates are the best `top` images and the best view of
    /// each further crater until `top` craters are in, over all shards.
    #[test]
    fn the_candidates_of_all_shards_reach_top_craters() {
        let hit = |id: &str, crater: &str, score: f32| SearchHit::for_test(id, Some(crater), score);
        let listed = vec![
            vec![vec![
                hit("a1", "A", 0.9),
                hit("a2", "A", 0.8),
                hit("a3", "A", 0.7),
            ]],
            vec![vec![
                hit("b1", "B", 0.6),
                hit("b2", "B", 0.5),
                hit("c1", "C", 0.4),
            ]],
        ];
        let chosen = best_of_shards(listed, 2);
        let ids = |hits: &[SearchHit]| hits.iter().map(|h| h.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&chosen[0][0]), ["a1", "a2"]);
        assert_eq!(ids(&chosen[1][0]), ["b1"]);
    }

    #[test]
    fn merged_lists_keep_score_order_and_blocks() {
        let hit = |id: &str, crater: &str, score: f32| SearchHit::for_test(id, Some(crater), score);
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
