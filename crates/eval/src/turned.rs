//! What turning or relighting the queries costs: every regime's mAP and R@1 on the query views
//! as built and on the same views turned (`bench-build --rotated-split`) or under another sun
//! (scripts/relight_bench.py), paired view by view.
//!
//! A turned crop that leaves the tile is missing from the turned split, so the two query
//! sets differ; comparing their plain means would mix the loss with a change of queries.

use crate::benchbuild::TURNED_SUFFIX;
use crate::regime::RegimeId;
use crate::regimes::RegimeResult;
use serde::Serialize;
use std::collections::HashMap;

/// One regime on the paired query views.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TurnedRow {
    pub regime: RegimeId,
    pub map: f64,
    pub map_turned: f64,
    #[serde(rename = "R@1")]
    pub r1: f64,
    #[serde(rename = "R@1_turned")]
    pub r1_turned: f64,
}

impl TurnedRow {
    /// mAP lost by turning the queries (negative: turned queries did better).
    pub fn loss(&self) -> f64 {
        self.map - self.map_turned
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Turned {
    /// The second query set's split name (`test_rotated`, or a sun of the relit benchmark).
    pub split: String,
    /// Query views that exist both as built and turned.
    pub paired_views: usize,
    pub rows: Vec<TurnedRow>,
}

/// One query's average precision and whether its first hit is relevant.
#[derive(Clone, Copy)]
struct Outcome {
    ap: f64,
    first: bool,
}

/// The upright view a turned view was made from (`<view>r` -> `<view>`).
pub fn upright_view_of(turned_id: &str) -> Option<&str> {
    turned_id.strip_suffix(TURNED_SUFFIX)
}

/// Pairs the two runs (same regimes, same gallery) query view by query view: a view of the
/// second set pairs with the first set's view of the same id (another sun:
/// scripts/relight_bench.py), else with the view it was turned from (`<view>r`); a regime
/// run on one side only is left out.
pub fn compare(
    upright: &[RegimeResult],
    upright_ids: &[String],
    turned: &[RegimeResult],
    turned_ids: &[String],
) -> Turned {
    let position: HashMap<&str, usize> = upright_ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    let pairs: Vec<(usize, usize)> = turned_ids
        .iter()
        .enumerate()
        .filter_map(|(t, id)| {
            let upright = position
                .get(id.as_str())
                .or_else(|| position.get(upright_view_of(id)?))?;
            Some((*upright, t))
        })
        .collect();
    let by_query = |res: &RegimeResult| -> HashMap<usize, Outcome> {
        res.per_query
            .iter()
            .filter_map(|q| {
                Some((
                    q.query,
                    Outcome {
                        ap: q.average_precision?,
                        first: q.first_relevant_rank == Some(1),
                    },
                ))
            })
            .collect()
    };
    let rows = upright
        .iter()
        .filter_map(|u| {
            let t = turned.iter().find(|r| r.id == u.id)?;
            let (bu, bt) = (by_query(u), by_query(t));
            let both: Vec<(Outcome, Outcome)> = pairs
                .iter()
                .filter_map(|(i, t)| Some((*bu.get(i)?, *bt.get(t)?)))
                .collect();
            let n = both.len().max(1) as f64;
            // (mAP, R@1) over the pairs, upright side or turned side
            let means = |turned_side: bool| {
                let (ap, first) = both
                    .iter()
                    .map(|p| if turned_side { p.1 } else { p.0 })
                    .fold((0.0, 0.0), |(ap, first), o| {
                        (ap + o.ap, first + f64::from(u8::from(o.first)))
                    });
                (ap / n, first / n)
            };
            let ((map, r1), (map_turned, r1_turned)) = (means(false), means(true));
            Some(TurnedRow {
                regime: u.id,
                map,
                map_turned,
                r1,
                r1_turned,
            })
        })
        .collect();
    Turned {
        split: String::new(),
        paired_views: pairs.len(),
        rows,
    }
}

/// The comparison as a text table.
pub fn table(t: &Turned) -> String {
    let mut s = format!(
        "{} query views as built and turned (paired)\n{:<42} {:>7} {:>7} {:>7} {:>6} {:>6}\n",
        t.paired_views, "regime", "mAP", "turned", "loss", "R@1", "turned"
    );
    for r in &t.rows {
        s.push_str(&format!(
            "{:<42} {:>7.4} {:>7.4} {:>7.4} {:>6.3} {:>6.3}\n",
            r.regime.to_string(),
            r.map,
            r.map_turned,
            r.loss(),
            r.r1,
            r.r1_turned
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{QueryResult, Summary};

    fn regime(name: &str, per_query: Vec<(usize, f64, usize)>) -> RegimeResult {
        RegimeResult {
            id: name.parse().unwrap(),
            summary: Summary::default(),
            k: None,
            bytes_per_image: 0,
            shortlist_recall: None,
            query_ms: 0.0,
            searched_again: None,
            searched_in_turns: None,
            searched_relit: None,
            per_query: per_query
                .into_iter()
                .map(|(query, ap, rank)| QueryResult {
                    query,
                    first_relevant_rank: Some(rank),
                    average_precision: Some(ap),
                    relevant: 2,
                })
                .collect(),
            top: vec![],
        }
    }

    #[test]
    fn views_pair_by_name_and_unpaired_views_do_not_count() {
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let upright_ids = ids(&["a_q0", "b_q0", "c_q0"]);
        // c's turned crop left the tile; the turned run lists its views in another order
        let turned_ids = ids(&["b_q0r", "a_q0r"]);
        let upright = vec![
            regime("cls", vec![(0, 1.0, 1), (1, 0.5, 2), (2, 0.0, 9)]),
            regime("gem", vec![(0, 1.0, 1)]),
        ];
        let turned = vec![regime("cls", vec![(0, 0.25, 4), (1, 1.0, 1)])];
        let t = compare(&upright, &upright_ids, &turned, &turned_ids);
        assert_eq!(t.paired_views, 2);
        assert_eq!(t.rows.len(), 1, "a regime run on one side only is left out");
        let r = &t.rows[0];
        // a: 1.0 -> 1.0 (turned position 1), b: 0.5 -> 0.25 (turned position 0)
        assert_eq!((r.map, r.map_turned), (0.75, 0.625));
        assert_eq!((r.r1, r.r1_turned), (0.5, 0.5));
        assert_eq!(r.loss(), 0.125);
        assert!(table(&t).contains("2 query views"));
        assert_eq!(upright_view_of("x_q1r"), Some("x_q1"));
        assert_eq!(upright_view_of("x_q1"), None);
        // a relit set keeps its views' ids
        let relit = compare(&upright, &upright_ids, &turned, &ids(&["b_q0", "a_q0"]));
        assert_eq!(relit.paired_views, 2);
        assert_eq!(relit.rows[0].map_turned, 0.625);
    }
}
