//! `calibrate`: the rule's thresholds and confidence from labelled pairs (entries whose
//! crater is known, linked against an index whose entries carry crater ids).
//!
//! - `match_score` is the lowest score at which the matches declared on the labelled
//!   entries reach the target precision (best candidate of the same crater);
//! - `new_score` is the score below which at most `1 - target` of the correct best
//!   candidates fall, so a known crater is rarely called new;
//! - the confidence is a logistic fit of "best candidate is the same crater" on the score.

use crate::link::{Decision, LinkRow};
use crate::rule::LinkRule;
use anyhow::{ensure, Result};
use serde::Serialize;

/// A calibrated rule and what it does on the pairs it was fitted on.
#[derive(Clone, Debug, Serialize)]
pub struct Calibration {
    pub rule: LinkRule,
    pub labelled: usize,
    /// Labelled entries whose best candidate is their own crater.
    pub correct_best: usize,
    pub target_precision: f64,
    /// On the labelled entries, with the calibrated rule.
    pub match_precision: f64,
    pub match_recall: f64,
    pub ambiguous: usize,
    pub called_new: usize,
}

/// `(score, best candidate is the query's crater)` for every labelled row with a candidate.
fn labelled(rows: &[LinkRow]) -> Vec<(f32, bool)> {
    rows.iter()
        .filter_map(|r| {
            let q = r.query.crater_id.as_ref()?;
            let b = r.best.as_ref()?;
            Some((b.score, b.crater_id.as_ref() == Some(q)))
        })
        .collect()
}

/// The lowest threshold whose matches (score >= threshold) are at least `target` precise;
/// above every score when no threshold is.
fn match_threshold(pairs: &[(f32, bool)], target: f64) -> f32 {
    let mut sorted = pairs.to_vec();
    sorted.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut best = f32::INFINITY;
    let mut correct = 0usize;
    for (i, &(score, ok)) in sorted.iter().enumerate() {
        correct += ok as usize;
        // only where the next score differs: a threshold cannot split equal scores
        let boundary = sorted.get(i + 1).is_none_or(|n| n.0 < score);
        if boundary && correct as f64 / (i + 1) as f64 >= target {
            best = score;
        }
    }
    best
}

/// Fits `p = sigmoid(a * score + b)` by Newton's method on the log-likelihood (with a
/// small ridge so that separable data still gives finite parameters).
fn platt(pairs: &[(f32, bool)]) -> (f64, f64) {
    let (mut a, mut b) = (1.0f64, 0.0f64);
    for _ in 0..100 {
        let (mut ga, mut gb, mut haa, mut hab, mut hbb) = (1e-3 * a, 0.0, 1e-3, 0.0, 1e-9);
        for &(s, y) in pairs {
            let s = s as f64;
            let p = 1.0 / (1.0 + (-(a * s + b)).exp());
            let e = p - y as u8 as f64;
            let w = (p * (1.0 - p)).max(1e-12);
            ga += e * s;
            gb += e;
            haa += w * s * s;
            hab += w * s;
            hbb += w;
        }
        let det = haa * hbb - hab * hab;
        if det.abs() < 1e-18 {
            break;
        }
        let da = (hbb * ga - hab * gb) / det;
        let db = (haa * gb - hab * ga) / det;
        a -= da;
        b -= db;
        if da.abs() + db.abs() < 1e-9 {
            break;
        }
    }
    (a, b)
}

/// Calibrates `base` (its geometry limits are kept) on rows that `link` produced for
/// labelled entries without inserting anything.
pub fn calibrate(rows: &[LinkRow], base: &LinkRule, target: f64) -> Result<Calibration> {
    ensure!(
        (0.5..1.0).contains(&target),
        "the target precision must be in [0.5, 1), got {target}"
    );
    let pairs = labelled(rows);
    ensure!(
        pairs.len() >= 20,
        "{} labelled entries with a candidate: calibration needs at least 20 (entries and \
         index entries with crater ids)",
        pairs.len()
    );
    let correct: Vec<f32> = pairs.iter().filter(|p| p.1).map(|p| p.0).collect();
    ensure!(
        correct.len() >= 2,
        "calibration needs labelled entries whose best candidate is their own crater \
         ({} of {} are)",
        correct.len(),
        pairs.len()
    );
    let match_score = match_threshold(&pairs, target);
    let mut sorted = correct.clone();
    sorted.sort_by(f32::total_cmp);
    let low = sorted[((1.0 - target) * sorted.len() as f64).floor() as usize];
    let new_score = low.min(match_score);
    let (platt_a, platt_b) = platt(&pairs);
    let mut rule = LinkRule {
        match_score: if match_score.is_finite() {
            match_score
        } else {
            // no threshold is that precise: nothing is matched without review
            f32::MAX
        },
        new_score,
        platt_a,
        platt_b,
        ..base.clone()
    };
    let declared: Vec<&(f32, bool)> = pairs.iter().filter(|p| p.0 >= rule.match_score).collect();
    let hits = declared.iter().filter(|p| p.1).count();
    let ambiguous = pairs
        .iter()
        .filter(|p| p.0 >= rule.new_score && p.0 < rule.match_score)
        .count();
    let called_new = pairs.iter().filter(|p| p.0 < rule.new_score).count();
    rule.source = format!(
        "calibrated on {} labelled entries at target precision {target}",
        pairs.len()
    );
    rule.validate()?;
    Ok(Calibration {
        labelled: pairs.len(),
        correct_best: correct.len(),
        target_precision: target,
        match_precision: if declared.is_empty() {
            1.0
        } else {
            hits as f64 / declared.len() as f64
        },
        match_recall: hits as f64 / correct.len() as f64,
        ambiguous,
        called_new,
        rule,
    })
}

/// Share of rows with each decision (for summaries).
pub fn decision_counts(rows: &[LinkRow]) -> [(Decision, usize); 3] {
    [Decision::Match, Decision::New, Decision::Ambiguous]
        .map(|d| (d, rows.iter().filter(|r| r.decision == d).count()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_match_threshold_is_the_lowest_that_keeps_the_target_precision() {
        // scores 10..1; the wrong ones at 7 and 3
        let pairs: Vec<(f32, bool)> = (1..=10)
            .rev()
            .map(|s| (s as f32, s != 7 && s != 3))
            .collect();
        // prefixes: 10,9,8 precise; with 7 3/4; ... at 4: 6/7 = 0.857; at 1: 8/10
        assert_eq!(match_threshold(&pairs, 0.99), 8.0);
        assert_eq!(match_threshold(&pairs, 0.85), 4.0);
        assert_eq!(match_threshold(&pairs, 0.8), 1.0);
        assert_eq!(match_threshold(&[(1.0, false)], 0.9), f32::INFINITY);
    }

    #[test]
    fn platt_confidence_rises_with_the_score_and_fits_the_rate() {
        // at score s, the same crater with probability s (0.1 .. 0.9)
        let mut pairs = Vec::new();
        for i in 1..10 {
            let s = i as f32 / 10.0;
            for j in 0..100 {
                pairs.push((s, (j as f32) < s * 100.0));
            }
        }
        let (a, b) = platt(&pairs);
        let p = |s: f64| 1.0 / (1.0 + (-(a * s + b)).exp());
        assert!(a > 0.0);
        assert!((p(0.5) - 0.5).abs() < 0.03, "{}", p(0.5));
        assert!(p(0.9) > 0.8 && p(0.1) < 0.2);
    }
}
