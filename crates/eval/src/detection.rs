//! How well craters are found: detections matched one to one against labelled craters, and
//! precision, recall and F1 per size bin.
//!
//! A detection finds a labelled crater when its centre lies within a quarter of the
//! crater's diameter plus 2 px of the crater's centre and its diameter is within a factor of
//! 1.5 of the crater's. Matching is greedy from the closest pair (by centre distance over
//! diameter), each crater and each detection used once. Recall counts labelled craters by
//! their own diameter; precision counts detections by theirs. How well the craters found are
//! sized is the median of their detections' diameters over theirs, per crater bin.

use serde::{Deserialize, Serialize};

/// A circle in an image's pixels: centre and diameter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Circle {
    pub x: f64,
    pub y: f64,
    pub diameter: f64,
}

/// The size bins reported, in pixels: `[lo, hi)`.
pub const SIZE_BINS: [(f64, f64); 4] = [
    (8.0, 20.0),
    (20.0, 50.0),
    (50.0, 200.0),
    (20.0, f64::INFINITY),
];

/// The name of a bin: `8-20`, `>=20`.
pub fn bin_name((lo, hi): (f64, f64)) -> String {
    if hi.is_infinite() {
        format!(">={lo}")
    } else {
        format!("{lo}-{hi}")
    }
}

/// Whether `d` finds `truth` (the rule above).
pub fn finds(d: &Circle, truth: &Circle) -> bool {
    let ratio = d.diameter.max(truth.diameter) / d.diameter.min(truth.diameter);
    (d.x - truth.x).hypot(d.y - truth.y) <= 0.25 * truth.diameter + 2.0 && ratio <= 1.5
}

/// For each detection, the labelled crater it found (one to one).
pub fn match_detections(found: &[Circle], truth: &[Circle]) -> Vec<Option<usize>> {
    let mut pairs = Vec::new();
    // craters sorted by x: a detection's candidates are within reach of its own x
    let mut order: Vec<usize> = (0..truth.len()).collect();
    order.sort_by(|&a, &b| truth[a].x.total_cmp(&truth[b].x));
    let xs: Vec<f64> = order.iter().map(|&i| truth[i].x).collect();
    for (di, d) in found.iter().enumerate() {
        // the crater is at most 1.5 d across, so within 0.375 d + 2 px
        let reach = 0.375 * d.diameter + 2.0;
        let start = xs.partition_point(|&x| x < d.x - reach);
        for &ti in order[start..]
            .iter()
            .take_while(|&&i| truth[i].x <= d.x + reach)
        {
            if finds(d, &truth[ti]) {
                let t = &truth[ti];
                pairs.push(((d.x - t.x).hypot(d.y - t.y) / t.diameter, di, ti));
            }
        }
    }
    pairs.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut of_detection = vec![None; found.len()];
    let mut taken = vec![false; truth.len()];
    for (_, di, ti) in pairs {
        if of_detection[di].is_none() && !taken[ti] {
            of_detection[di] = Some(ti);
            taken[ti] = true;
        }
    }
    of_detection
}

/// Counts of one size bin, summed over images.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BinCounts {
    pub bin: String,
    /// Labelled craters in the bin, and how many of them were found.
    pub craters: usize,
    pub craters_found: usize,
    /// Detections in the bin, and how many found a crater.
    pub detections: usize,
    pub detections_right: usize,
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    /// The median, over the craters found, of the detection's diameter over the crater's:
    /// above 1 the detector reads craters too wide (0 where none was found).
    #[serde(default)]
    pub diameter_ratio: f64,
}

/// The median of `values` (0 for none).
fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

impl BinCounts {
    fn finish(&mut self) {
        let ratio = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        self.precision = ratio(self.detections_right, self.detections);
        self.recall = ratio(self.craters_found, self.craters);
        self.f1 = if self.precision + self.recall > 0.0 {
            2.0 * self.precision * self.recall / (self.precision + self.recall)
        } else {
            0.0
        };
    }
}

/// Precision, recall and F1 per [`SIZE_BINS`] over images, each `(detections, labels)`.
pub fn score(images: &[(Vec<Circle>, Vec<Circle>)]) -> Vec<BinCounts> {
    let mut bins: Vec<BinCounts> = SIZE_BINS
        .iter()
        .map(|&b| BinCounts {
            bin: bin_name(b),
            ..Default::default()
        })
        .collect();
    let inside = |(lo, hi): (f64, f64), d: f64| d >= lo && d < hi;
    let mut ratios = vec![Vec::new(); SIZE_BINS.len()];
    for (found, truth) in images {
        let matched = match_detections(found, truth);
        // each crater's finding detection's diameter over its own
        let mut truth_found = vec![None; truth.len()];
        for (d, m) in found.iter().zip(&matched) {
            for (b, &range) in bins.iter_mut().zip(&SIZE_BINS) {
                if inside(range, d.diameter) {
                    b.detections += 1;
                    b.detections_right += usize::from(m.is_some());
                }
            }
            if let Some(t) = m {
                truth_found[*t] = Some(d.diameter / truth[*t].diameter);
            }
        }
        for (t, ratio) in truth.iter().zip(&truth_found) {
            for ((b, &range), of_bin) in bins.iter_mut().zip(&SIZE_BINS).zip(&mut ratios) {
                if inside(range, t.diameter) {
                    b.craters += 1;
                    b.craters_found += usize::from(ratio.is_some());
                    of_bin.extend(*ratio);
                }
            }
        }
    }
    for (b, of_bin) in bins.iter_mut().zip(ratios) {
        b.diameter_ratio = median(of_bin);
        b.finish();
    }
    bins
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(x: f64, y: f64, diameter: f64) -> Circle {
        Circle { x, y, diameter }
    }

    #[test]
    fn the_rule_takes_near_circles_of_like_size_only() {
        let t = c(100.0, 100.0, 40.0);
        assert!(finds(&c(111.9, 100.0, 40.0), &t));
        assert!(!finds(&c(112.1, 100.0, 40.0), &t));
        assert!(finds(&c(100.0, 100.0, 60.0), &t));
        assert!(!finds(&c(100.0, 100.0, 61.0), &t));
        assert!(!finds(&c(100.0, 100.0, 26.0), &t));
    }

    #[test]
    fn matching_is_one_to_one_and_closest_first() {
        let truth = [c(100.0, 100.0, 40.0), c(104.0, 100.0, 40.0)];
        let found = [
            c(103.0, 100.0, 40.0),
            c(101.0, 100.0, 40.0),
            c(102.0, 100.0, 40.0),
        ];
        let m = match_detections(&found, &truth);
        // the closest pair (found 1 with truth 0, 1 px) goes first, then found 0 takes
        // truth 1 (1 px); found 2 has nothing left
        assert_eq!(m, vec![Some(1), Some(0), None]);
    }

    #[test]
    fn bins_count_craters_by_their_size_and_detections_by_theirs() {
        let truth = vec![
            c(50.0, 50.0, 10.0),
            c(200.0, 200.0, 30.0),
            c(400.0, 400.0, 100.0),
        ];
        // the 30 px crater found as 21 px: right; the 25 px detection finds nothing
        let found = vec![
            c(50.0, 50.0, 10.0),
            c(201.0, 200.0, 21.0),
            c(600.0, 600.0, 25.0),
        ];
        let bins = score(&[(found, truth)]);
        let b = |name: &str| bins.iter().find(|b| b.bin == name).unwrap();
        assert_eq!((b("8-20").craters, b("8-20").craters_found), (1, 1));
        assert_eq!((b("20-50").craters, b("20-50").craters_found), (1, 1));
        assert_eq!((b("20-50").detections, b("20-50").detections_right), (2, 1));
        assert_eq!((b("50-200").craters, b("50-200").craters_found), (1, 0));
        let big = b(">=20");
        assert_eq!(
            (
                big.craters,
                big.craters_found,
                big.detections,
                big.detections_right
            ),
            (2, 1, 2, 1)
        );
        assert!((big.f1 - 0.5).abs() < 1e-12);
        // sized by the craters found: the 10 px one right, the 30 px one at 0.7 of its own
        assert_eq!(b("8-20").diameter_ratio, 1.0);
        assert!((b("20-50").diameter_ratio - 0.7).abs() < 1e-12);
        assert!((big.diameter_ratio - 0.7).abs() < 1e-12);
        assert_eq!(b("50-200").diameter_ratio, 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0, 10.0]), 2.5);
    }
}
