//! `discover`: rank the tiles of a mosaic by how much they look like one or more exemplar
//! craters (scores fused over the exemplars), and score such a ranking against a reference
//! catalogue as MarsRetrieval does: a tile is a true positive when its centre lies within a
//! tolerance radius of a catalogue crater of the target class not matched by a better
//! ranked tile.

use crate::error::{Error, Result};
use craterdex_engine::Engine;
use craterdex_errors::ensure;
use craterdex_index::{ImageMeta, Stage1};
use craterdex_tokens::Descriptors;
use serde::Serialize;
use std::collections::HashMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Fuse {
    /// A tile is as good as its best exemplar match.
    Max,
    /// The mean over exemplars: rewards tiles like all of them.
    Mean,
}

impl std::str::FromStr for Fuse {
    type Err = crate::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "max" => Ok(Fuse::Max),
            "mean" => Ok(Fuse::Mean),
            _ => Err(crate::Error::Invalid(format!(
                "fuse must be max or mean, not {s:?}"
            ))),
        }
    }
}

/// How a tile is scored against an exemplar.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scoring {
    /// Late interaction of the instance tokens (every tile, exactly).
    LateInteraction,
    /// The single vectors alone (the CLS-style baseline).
    SingleVector,
}

#[derive(Clone, Debug, Serialize)]
pub struct Discovered {
    pub meta: ImageMeta,
    pub score: f32,
}

/// Every live entry of the index, best first, scored against the exemplars and fused.
pub fn discover(
    engine: &Engine,
    exemplars: &[Descriptors],
    fuse: Fuse,
    scoring: Scoring,
) -> Result<Vec<Discovered>> {
    ensure!(
        !exemplars.is_empty(),
        Error::Invalid("no exemplar to look for".into())
    );
    let idx = engine.index();
    let rows: Vec<usize> = idx.live_rows().collect();
    let mut fused = vec![
        match fuse {
            Fuse::Max => f32::NEG_INFINITY,
            Fuse::Mean => 0.0,
        };
        rows.len()
    ];
    let position: HashMap<usize, usize> = rows.iter().enumerate().map(|(i, &r)| (r, i)).collect();
    for e in exemplars {
        let scores: Vec<(usize, f32)> = match scoring {
            Scoring::LateInteraction => rows
                .iter()
                .copied()
                .zip(idx.late_interaction(&e.tokens, &rows))
                .collect(),
            Scoring::SingleVector => idx
                .stage1(&e.single, rows.len(), Stage1::Exact)
                .pop()
                .unwrap_or_default()
                .into_iter()
                .map(|s| (s.row, s.score))
                .collect(),
        };
        for (row, s) in scores {
            let Some(&i) = position.get(&row) else {
                continue;
            };
            match fuse {
                Fuse::Max => fused[i] = fused[i].max(s),
                Fuse::Mean => fused[i] += s / exemplars.len() as f32,
            }
        }
    }
    let mut out: Vec<Discovered> = rows
        .iter()
        .zip(fused)
        .map(|(&r, score)| Discovered {
            meta: idx.meta(r).clone(),
            score,
        })
        .collect();
    out.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.meta.id.cmp(&b.meta.id)));
    Ok(out)
}

/// MarsRetrieval-style quality of a ranking of positions against reference positions.
#[derive(Clone, Debug, Serialize)]
pub struct DiscoveryScore {
    pub targets: usize,
    pub predictions: usize,
    /// (K, precision@K, recall@K)
    pub at: Vec<(usize, f64, f64)>,
    /// The best F1 over K, and the K where it is reached.
    pub best_f1: f64,
    pub best_k: usize,
    /// Area under the precision-recall curve (average precision over the whole ranking).
    pub auprc: f64,
}

/// Scores predicted centres (best first) against target centres: each prediction is a true
/// positive when an unmatched target lies within `radius` (the nearest such one is matched;
/// a grid keeps it linear).
pub fn score_discovery(
    predicted: &[(f64, f64)],
    targets: &[(f64, f64)],
    radius: f64,
    ks: &[usize],
) -> DiscoveryScore {
    let cell = radius.max(1e-9);
    let key = |x: f64, y: f64| ((x / cell).floor() as i64, (y / cell).floor() as i64);
    let mut grid: HashMap<(i64, i64), Vec<usize>> = HashMap::new();
    for (i, &(x, y)) in targets.iter().enumerate() {
        grid.entry(key(x, y)).or_default().push(i);
    }
    let mut matched = vec![false; targets.len()];
    let mut hits = Vec::with_capacity(predicted.len());
    for &(x, y) in predicted {
        let (cx, cy) = key(x, y);
        let mut best: Option<(f64, usize)> = None;
        for gx in cx - 1..=cx + 1 {
            for gy in cy - 1..=cy + 1 {
                for &t in grid.get(&(gx, gy)).map(Vec::as_slice).unwrap_or(&[]) {
                    let d = (targets[t].0 - x).hypot(targets[t].1 - y);
                    if !matched[t] && d <= radius && best.is_none_or(|b| d < b.0) {
                        best = Some((d, t));
                    }
                }
            }
        }
        if let Some((_, t)) = best {
            matched[t] = true;
        }
        hits.push(best.is_some());
    }
    let n = targets.len().max(1) as f64;
    let (mut tp, mut ap, mut best_f1, mut best_k) = (0usize, 0.0, 0.0, 0usize);
    let mut at = Vec::new();
    for (i, &hit) in hits.iter().enumerate() {
        let k = i + 1;
        if hit {
            tp += 1;
            ap += tp as f64 / k as f64;
        }
        let (p, r) = (tp as f64 / k as f64, tp as f64 / n);
        let f1 = if p + r > 0.0 {
            2.0 * p * r / (p + r)
        } else {
            0.0
        };
        if f1 > best_f1 {
            best_f1 = f1;
            best_k = k;
        }
        if ks.contains(&k) {
            at.push((k, p, r));
        }
    }
    DiscoveryScore {
        targets: targets.len(),
        predictions: predicted.len(),
        at,
        best_f1,
        best_k,
        auprc: ap / n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerance_matching_counts_each_target_once() {
        let targets = [(0.0, 0.0), (100.0, 0.0)];
        // two predictions on the first target, then the second, then a miss
        let predicted = [(1.0, 0.0), (-2.0, 1.0), (99.0, 3.0), (50.0, 50.0)];
        let s = score_discovery(&predicted, &targets, 5.0, &[1, 2, 4]);
        assert_eq!(s.at, vec![(1, 1.0, 0.5), (2, 0.5, 0.5), (4, 0.5, 1.0)]);
        // precision at the two hits: 1/1 and 2/3
        assert!((s.auprc - (1.0 + 2.0 / 3.0) / 2.0).abs() < 1e-12);
        assert_eq!(s.best_k, 3);
        assert!((s.best_f1 - 0.8).abs() < 1e-12);
    }
}
