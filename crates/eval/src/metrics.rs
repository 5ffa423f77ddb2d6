//! Retrieval metrics with cluster-tolerant relevance: a gallery image is relevant to a
//! query when its crater id is in the query's relevant set.
//!
//! Rankings are implied by score vectors over the whole gallery: higher first, ties broken
//! towards the lower gallery index. AP divides by the number of relevant gallery images.
//! Queries with no relevant gallery image are left out of every mean and counted apart.

use serde::Serialize;
use std::collections::BTreeSet;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueryResult {
    pub query: usize,
    /// 1-based rank of the first relevant image (None: no relevant image exists).
    pub first_relevant_rank: Option<usize>,
    pub average_precision: Option<f64>,
    pub relevant: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    #[serde(rename = "R@1")]
    pub r1: f64,
    #[serde(rename = "R@5")]
    pub r5: f64,
    #[serde(rename = "R@10")]
    pub r10: f64,
    #[serde(rename = "mAP")]
    pub map: f64,
    pub queries: usize,
    pub queries_without_relevant: usize,
}

/// Evaluates one query from its score over every gallery image (higher first, ties to the
/// lower gallery index).
pub fn evaluate_query(
    query: usize,
    scores: &[f32],
    gallery_craters: &[String],
    relevant: &BTreeSet<String>,
) -> QueryResult {
    let mut ranking: Vec<usize> = (0..scores.len()).collect();
    ranking.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    evaluate_ranking(query, &ranking, gallery_craters, relevant)
}

/// Evaluates one query from a ranking of gallery positions, best first. The ranking may
/// leave images out (an IVF stage 1 sees only its probed lists): relevant images it does not
/// contain count as never found.
pub fn evaluate_ranking(
    query: usize,
    ranking: &[usize],
    gallery_craters: &[String],
    relevant: &BTreeSet<String>,
) -> QueryResult {
    let total = gallery_craters
        .iter()
        .filter(|c| relevant.contains(*c))
        .count();
    if total == 0 {
        return QueryResult {
            query,
            first_relevant_rank: None,
            average_precision: None,
            relevant: 0,
        };
    }
    let ranks: Vec<usize> = ranking
        .iter()
        .enumerate()
        .filter(|(_, &g)| relevant.contains(&gallery_craters[g]))
        .map(|(r, _)| r)
        .collect();
    let ap = ranks
        .iter()
        .enumerate()
        .map(|(k, &r)| (k + 1) as f64 / (r + 1) as f64)
        .sum::<f64>()
        / total as f64;
    QueryResult {
        query,
        first_relevant_rank: ranks.first().map(|r| r + 1),
        average_precision: Some(ap),
        relevant: total,
    }
}

pub fn summarise(results: &[QueryResult]) -> Summary {
    let valid: Vec<&QueryResult> = results
        .iter()
        .filter(|r| r.average_precision.is_some())
        .collect();
    let n = valid.len().max(1) as f64;
    let recall = |k: usize| {
        valid
            .iter()
            .filter(|r| r.first_relevant_rank.is_some_and(|f| f <= k))
            .count() as f64
            / n
    };
    Summary {
        r1: recall(1),
        r5: recall(5),
        r10: recall(10),
        map: valid
            .iter()
            .map(|r| r.average_precision.unwrap())
            .sum::<f64>()
            / n,
        queries: valid.len(),
        queries_without_relevant: results.len() - valid.len(),
    }
}

/// Recall@k from each query's 1-based rank of its first relevant result (None: not found
/// in the returned list). For truncated result lists, where AP cannot be computed.
pub fn recall_from_ranks(first_ranks: &[Option<usize>], k: usize) -> f64 {
    first_ranks
        .iter()
        .filter(|r| r.is_some_and(|r| r <= k))
        .count() as f64
        / first_ranks.len().max(1) as f64
}

/// Shortlist recall R@S: share of queries with a relevant image among the `s` best by `scores`.
pub fn shortlist_recall(results: &[QueryResult], s: usize) -> f64 {
    let valid: Vec<&QueryResult> = results.iter().filter(|r| r.relevant > 0).collect();
    valid
        .iter()
        .filter(|r| r.first_relevant_rank.is_some_and(|f| f <= s))
        .count() as f64
        / valid.len().max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }
    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn average_precision_by_hand() {
        // ranking by score: g2 (0.9), g0 (0.8), g3 (0.5), g1 (0.1); relevant: a = g0, g3
        let craters = ids(&["a", "b", "c", "a"]);
        let r = evaluate_query(0, &[0.8, 0.1, 0.9, 0.5], &craters, &set(&["a"]));
        assert_eq!(r.first_relevant_rank, Some(2));
        // precision at rank 2 = 1/2, at rank 3 = 2/3 -> AP = (0.5 + 0.6667) / 2
        assert!((r.average_precision.unwrap() - (0.5 + 2.0 / 3.0) / 2.0).abs() < 1e-12);
    }

    #[test]
    fn partial_rankings_count_missing_relevant_images_as_not_found() {
        let craters = ids(&["a", "b", "a", "c"]);
        // ranking holds g2 (relevant) then g1; g0 (relevant) is missing
        let r = evaluate_ranking(0, &[2, 1], &craters, &set(&["a"]));
        assert_eq!(r.first_relevant_rank, Some(1));
        assert_eq!(r.relevant, 2);
        assert!((r.average_precision.unwrap() - 0.5).abs() < 1e-12);
        let none = evaluate_ranking(0, &[1, 3], &craters, &set(&["a"]));
        assert_eq!(
            (none.first_relevant_rank, none.average_precision),
            (None, Some(0.0))
        );
    }

    #[test]
    fn recall_from_truncated_lists() {
        let ranks = [Some(1), Some(3), None, Some(10)];
        assert_eq!(recall_from_ranks(&ranks, 1), 0.25);
        assert_eq!(recall_from_ranks(&ranks, 5), 0.5);
        assert_eq!(recall_from_ranks(&ranks, 10), 0.75);
    }

    #[test]
    fn ties_go_to_the_lower_gallery_index() {
        let craters = ids(&["x", "a"]);
        let r = evaluate_query(0, &[0.5, 0.5], &craters, &set(&["a"]));
        assert_eq!(r.first_relevant_rank, Some(2));
        let craters = ids(&["a", "x"]);
        assert_eq!(
            evaluate_query(0, &[0.5, 0.5], &craters, &set(&["a"])).first_relevant_rank,
            Some(1)
        );
    }

    #[test]
    fn several_relevant_ids_and_a_query_without_relevant_images() {
        let craters = ids(&["a", "b", "c"]);
        let q0 = evaluate_query(0, &[0.1, 0.9, 0.5], &craters, &set(&["a", "b"])); // b rank 1, a rank 3
        assert!((q0.average_precision.unwrap() - (1.0 + 2.0 / 3.0) / 2.0).abs() < 1e-12);
        let q1 = evaluate_query(1, &[0.1, 0.9, 0.5], &craters, &set(&["zzz"]));
        assert_eq!(q1.average_precision, None);
        let q2 = evaluate_query(2, &[0.1, 0.2, 0.9], &craters, &set(&["a"])); // rank 3
        let s = summarise(&[q0, q1, q2]);
        assert_eq!((s.queries, s.queries_without_relevant), (2, 1));
        assert_eq!((s.r1, s.r5), (0.5, 1.0));
        assert!((s.map - ((1.0 + 2.0 / 3.0) / 2.0 + 1.0 / 3.0) / 2.0).abs() < 1e-12);
    }
}
