//! `calibrate`: the rule's weights and thresholds from labelled pairs (entries whose
//! crater is known, linked against an index whose entries carry crater ids).
//!
//! - The confidence's weights are a logistic regression of "this candidate is the entry's
//!   crater" on every candidate of every labelled entry: on the appearance score alone for
//!   candidates without geometry, on score, offset and diameter ratio for those with.
//! - `match_confidence` is the lowest confidence at which the matches declared on the
//!   labelled entries (their most confident candidate) reach the target precision.
//! - `new_confidence` is the confidence below which at most `1 - target` of the correct
//!   best candidates fall, so a known crater is rarely called new.

use crate::error::{Error, Result};
use crate::link::{Candidate, Decision, LinkRow};
use crate::rule::LinkRule;
use craterdex_errors::ensure;
use serde::Serialize;

/// A calibrated rule and what it does on the pairs it was fitted on.
#[derive(Clone, Debug, Serialize)]
pub struct Calibration {
    pub rule: LinkRule,
    pub labelled: usize,
    /// Labelled entries whose most confident candidate is their own crater.
    pub correct_best: usize,
    /// Candidate pairs the weights were fitted on (appearance only, with geometry, with
    /// registered geometry).
    pub pairs: (usize, usize, usize),
    pub target_precision: f64,
    /// On the labelled entries, with the calibrated rule.
    pub match_precision: f64,
    pub match_recall: f64,
    pub ambiguous: usize,
    pub called_new: usize,
}

/// The lowest threshold whose matches (value >= threshold) are at least `target` precise;
/// above every value when no threshold is.
fn match_threshold(pairs: &[(f64, bool)], target: f64) -> f64 {
    let mut sorted = pairs.to_vec();
    sorted.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut best = f64::INFINITY;
    let mut correct = 0usize;
    for (i, &(v, ok)) in sorted.iter().enumerate() {
        correct += ok as usize;
        // only where the next value differs: a threshold cannot split equal values
        let boundary = sorted.get(i + 1).is_none_or(|n| n.0 < v);
        if boundary && correct as f64 / (i + 1) as f64 >= target {
            best = v;
        }
    }
    best
}

/// Solves the small symmetric system `a x = b` by Gaussian elimination with pivoting.
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Option<Vec<f64>> {
    let n = b.len();
    for col in 0..n {
        let pivot = (col..n).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-15 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        for row in col + 1..n {
            let f = a[row][col] / a[col][col];
            for k in col..n {
                a[row][k] -= f * a[col][k];
            }
            b[row] -= f * b[col];
        }
    }
    let mut x = vec![0.0; n];
    for row in (0..n).rev() {
        let s: f64 = (row + 1..n).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - s) / a[row][row];
    }
    Some(x)
}

/// Penalised negative log-likelihood of the logistic model.
fn logistic_loss(xs: &[Vec<f64>], ys: &[bool], w: &[f64], ridge: f64) -> f64 {
    let penalty: f64 = w[1..].iter().map(|v| v * v).sum::<f64>() * ridge / 2.0;
    xs.iter()
        .zip(ys)
        .map(|(x, &y)| {
            let z = w[0] + x.iter().zip(&w[1..]).map(|(a, b)| a * b).sum::<f64>();
            let m = if y { -z } else { z };
            // log(1 + e^m) without overflow
            m.max(0.0) + (-m.abs()).exp().ln_1p()
        })
        .sum::<f64>()
        + penalty
}

/// Logistic regression `p = sigmoid(w . [1, x])` by Newton's method with a backtracking
/// line search (each step lowers the loss), and a small ridge on the non-bias weights so
/// that separable data still gives finite weights.
pub fn fit_logistic(xs: &[Vec<f64>], ys: &[bool], start: &[f64]) -> Vec<f64> {
    const RIDGE: f64 = 1e-2;
    let n = start.len();
    let mut w = start.to_vec();
    let mut loss = logistic_loss(xs, ys, &w, RIDGE);
    if !loss.is_finite() {
        w = vec![0.0; n];
        loss = logistic_loss(xs, ys, &w, RIDGE);
    }
    for _ in 0..100 {
        let mut grad = vec![0.0; n];
        let mut hess = vec![vec![0.0; n]; n];
        for k in 1..n {
            grad[k] += RIDGE * w[k];
            hess[k][k] += RIDGE;
        }
        hess[0][0] += 1e-9;
        for (x, &y) in xs.iter().zip(ys) {
            let feat: Vec<f64> = std::iter::once(1.0).chain(x.iter().copied()).collect();
            let z: f64 = feat.iter().zip(&w).map(|(f, w)| f * w).sum();
            let p = 1.0 / (1.0 + (-z).exp());
            let e = p - y as u8 as f64;
            let h = (p * (1.0 - p)).max(1e-12);
            for i in 0..n {
                grad[i] += e * feat[i];
                for j in 0..n {
                    hess[i][j] += h * feat[i] * feat[j];
                }
            }
        }
        let Some(step) = solve(hess, grad) else {
            break;
        };
        let mut t = 1.0;
        let mut moved = false;
        for _ in 0..40 {
            let trial: Vec<f64> = w.iter().zip(&step).map(|(wi, si)| wi - t * si).collect();
            let l = logistic_loss(xs, ys, &trial, RIDGE);
            if l.is_finite() && l <= loss {
                moved = l < loss - 1e-12;
                w = trial;
                loss = l;
                break;
            }
            t /= 2.0;
        }
        if !moved {
            break;
        }
    }
    w
}

fn is_right(row: &LinkRow, c: &Candidate) -> bool {
    row.query.crater_id.is_some() && c.crater_id == row.query.crater_id
}

/// Calibrates `base` (its geometry limits are kept) on rows that `link` produced for
/// labelled entries without inserting anything.
pub fn calibrate(rows: &[LinkRow], base: &LinkRule, target: f64) -> Result<Calibration> {
    ensure!(
        (0.5..1.0).contains(&target),
        Error::Invalid(format!(
            "the target precision must be in [0.5, 1), got {target}"
        ))
    );
    let labelled: Vec<&LinkRow> = rows
        .iter()
        .filter(|r| r.query.crater_id.is_some() && !r.candidates.is_empty())
        .collect();
    ensure!(
        labelled.len() >= 20,
        Error::Calibration(format!(
            "{} labelled entries with a candidate: calibration needs at least 20 (entries and \
         index entries with crater ids)",
            labelled.len()
        ))
    );
    let (mut ax, mut ay, mut gx, mut gy) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut rx, mut ry) = (Vec::new(), Vec::new());
    for r in &labelled {
        for c in &r.candidates {
            let s = c.score as f64;
            match c.offset_radii.zip(c.diameter_ratio) {
                Some((o, q)) if c.registered => {
                    rx.push(vec![s, o, q.ln()]);
                    ry.push(is_right(r, c));
                }
                Some((o, q)) => {
                    gx.push(vec![s, o, q.ln()]);
                    gy.push(is_right(r, c));
                }
                None => {
                    ax.push(vec![s]);
                    ay.push(is_right(r, c));
                }
            }
        }
    }
    let fittable = |ys: &[bool]| ys.len() >= 20 && ys.iter().any(|&y| y) && ys.iter().any(|&y| !y);
    let mut rule = base.clone();
    if fittable(&ay) {
        let w = fit_logistic(&ax, &ay, &base.appearance_weights);
        rule.appearance_weights = [w[0], w[1]];
    }
    if fittable(&gy) {
        let w = fit_logistic(&gx, &gy, &base.geometry_weights);
        rule.geometry_weights = [w[0], w[1], w[2], w[3]];
    }
    if fittable(&ry) {
        let w = fit_logistic(&rx, &ry, &base.registered.weights);
        rule.registered.weights = [w[0], w[1], w[2], w[3]];
    }
    // the most confident candidate of each labelled entry under the fitted weights
    let best: Vec<(f64, bool)> = labelled
        .iter()
        .map(|r| {
            r.candidates
                .iter()
                .map(|c| (rule.confidence(c.score, c.geometry()), is_right(r, c)))
                .max_by(|a, b| a.0.total_cmp(&b.0))
                .expect("a labelled row has a candidate")
        })
        .collect();
    let correct: Vec<f64> = best.iter().filter(|p| p.1).map(|p| p.0).collect();
    ensure!(
        correct.len() >= 2,
        Error::Calibration(format!(
            "calibration needs labelled entries whose best candidate is their own crater \
         ({} of {} are)",
            correct.len(),
            best.len()
        ))
    );
    let m = match_threshold(&best, target);
    // no threshold that precise: nothing is matched without review
    rule.match_confidence = if m.is_finite() { m } else { 1.0 };
    let mut sorted = correct.clone();
    sorted.sort_by(f64::total_cmp);
    let low = sorted[((1.0 - target) * sorted.len() as f64).floor() as usize];
    rule.new_confidence = low.min(rule.match_confidence);
    let declared: Vec<&(f64, bool)> = best
        .iter()
        .filter(|p| p.0 >= rule.match_confidence)
        .collect();
    let hits = declared.iter().filter(|p| p.1).count();
    rule.source = format!(
        "calibrated on {} labelled entries at target precision {target}",
        labelled.len()
    );
    rule.validate()?;
    Ok(Calibration {
        labelled: labelled.len(),
        correct_best: correct.len(),
        pairs: (ay.len(), gy.len(), ry.len()),
        target_precision: target,
        match_precision: if declared.is_empty() {
            1.0
        } else {
            hits as f64 / declared.len() as f64
        },
        match_recall: hits as f64 / correct.len() as f64,
        ambiguous: best
            .iter()
            .filter(|p| p.0 >= rule.new_confidence && p.0 < rule.match_confidence)
            .count(),
        called_new: best.iter().filter(|p| p.0 < rule.new_confidence).count(),
        rule,
    })
}

/// How many rows got each decision.
pub fn decision_counts(rows: &[LinkRow]) -> [(Decision, usize); 3] {
    [Decision::Match, Decision::New, Decision::Ambiguous]
        .map(|d| (d, rows.iter().filter(|r| r.decision == d).count()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_match_threshold_is_the_lowest_that_keeps_the_target_precision() {
        // values 10..1; the wrong ones at 7 and 3
        let pairs: Vec<(f64, bool)> = (1..=10)
            .rev()
            .map(|s| (s as f64, s != 7 && s != 3))
            .collect();
        // prefixes: 10,9,8 precise; with 7 3/4; ... at 4: 6/7 = 0.857; at 1: 8/10
        assert_eq!(match_threshold(&pairs, 0.99), 8.0);
        assert_eq!(match_threshold(&pairs, 0.85), 4.0);
        assert_eq!(match_threshold(&pairs, 0.8), 1.0);
        assert_eq!(match_threshold(&[(1.0, false)], 0.9), f64::INFINITY);
    }

    #[test]
    fn logistic_fits_recover_the_rate_and_the_direction_of_each_feature() {
        // p(same) = sigmoid(-2 + 6 s - 1.5 o): sampled exactly by frequency on a grid
        let (mut xs, mut ys) = (Vec::new(), Vec::new());
        for si in 0..=10 {
            for oi in 0..=6 {
                let (s, o) = (si as f64 / 10.0, oi as f64 / 2.0);
                let p = 1.0 / (1.0 + (2.0 - 6.0 * s + 1.5 * o).exp());
                for k in 0..200 {
                    xs.push(vec![s, o]);
                    ys.push((k as f64 + 0.5) / 200.0 < p);
                }
            }
        }
        let w = fit_logistic(&xs, &ys, &[0.0, 0.0, 0.0]);
        assert!((w[0] + 2.0).abs() < 0.2, "{w:?}");
        assert!((w[1] - 6.0).abs() < 0.4, "{w:?}");
        assert!((w[2] + 1.5).abs() < 0.15, "{w:?}");
    }
}
