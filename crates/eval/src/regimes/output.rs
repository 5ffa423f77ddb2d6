//! A run's results written out: the JSON of `craterdex eval --json`, per-query CSV rows for
//! diffing two runs, and the paper-style table.

use super::RegimeResult;
use crate::regime::Whiten;

/// `{"regimes": {name: {...}}}` as written by `craterdex eval --json`.
pub fn to_json(results: &[RegimeResult], extra: serde_json::Value) -> serde_json::Value {
    let mut regimes = serde_json::Map::new();
    for r in results {
        let mut v = serde_json::to_value(r).unwrap_or_default();
        v["family"] = serde_json::to_value(r.id.family()).unwrap_or_default();
        v["whitening"] = serde_json::to_value(r.id.whitening).unwrap_or_default();
        v["grouped"] = r.id.grouped.into();
        // kept for readers of runs from before the whitening variants
        v["whitened"] = (r.id.whitening != Whiten::Off).into();
        regimes.insert(r.id.to_string(), v);
    }
    serde_json::json!({"regimes": regimes, "run": extra})
}

/// Per-query rows for diffing two runs: the query split (`test` as built, or the turned or
/// relit split's name), regime, query id, first relevant rank, AP, and the ten best gallery
/// image ids (space-separated, best first).
pub fn per_query_csv(
    split: &str,
    results: &[RegimeResult],
    query_ids: &[String],
    gallery_ids: &[String],
) -> String {
    let mut s = String::from(PER_QUERY_HEADER);
    s.push_str(&per_query_rows(split, results, query_ids, gallery_ids));
    s
}

/// The header line of [`per_query_csv`].
const PER_QUERY_HEADER: &str =
    "split,regime,query_id,first_relevant_rank,average_precision,relevant,top10\n";

/// [`per_query_csv`] without its header: a second query split's rows to append.
pub fn per_query_rows(
    split: &str,
    results: &[RegimeResult],
    query_ids: &[String],
    gallery_ids: &[String],
) -> String {
    let mut s = String::new();
    for r in results {
        for q in &r.per_query {
            let top: Vec<&str> = r.top[q.query]
                .iter()
                .map(|&g| gallery_ids[g].as_str())
                .collect();
            s.push_str(&format!(
                "{},{},{},{},{},{},{}\n",
                split,
                r.id,
                query_ids[q.query],
                q.first_relevant_rank
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
                q.average_precision
                    .map(|v| format!("{v:.6}"))
                    .unwrap_or_default(),
                q.relevant,
                top.join(" ")
            ));
        }
    }
    s
}

/// The paper-style table.
pub fn table(results: &[RegimeResult]) -> String {
    let mut s = format!(
        "{:<42} {:>6} {:>6} {:>6} {:>6} {:>8} {:>6} {:>8}\n",
        "regime", "R@1", "R@5", "R@10", "mAP", "bytes", "R@S", "ms/query"
    );
    for r in results {
        s.push_str(&format!(
            "{:<42} {:>6.3} {:>6.3} {:>6.3} {:>6.3} {:>8} {:>6} {:>8.2}\n",
            r.id.to_string(),
            r.summary.r1,
            r.summary.r5,
            r.summary.r10,
            r.summary.map,
            r.bytes_per_image,
            r.shortlist_recall
                .map(|v| format!("{v:.3}"))
                .unwrap_or_default(),
            r.query_ms
        ));
    }
    for r in results {
        if let (Some(share), Some(turns)) = (r.searched_again, r.searched_in_turns) {
            let relit = r
                .searched_relit
                .map(|v| format!("{:.1}% relit toward its suns, ", 100.0 * v))
                .unwrap_or_default();
            s.push_str(&format!(
                "{}: {:.1}% of the queries searched again, {relit}{:.1}% in turns and under \
                 the opposite sun\n",
                r.id,
                100.0 * share,
                100.0 * turns
            ));
        }
    }
    s
}
