//! The `k` best of a stream of scores, and merging partial top lists from threads.
//!
//! Order: higher score first, ties towards the lower row (so results do not depend on how
//! a scan was split).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scored {
    pub row: usize,
    pub score: f32,
}

/// Heap entry ordered so the heap's top is the worst kept result (lowest score, then highest row).
#[derive(PartialEq)]
struct Worst(Scored);
impl Eq for Worst {}
impl Ord for Worst {
    fn cmp(&self, o: &Self) -> Ordering {
        o.0.score
            .total_cmp(&self.0.score)
            .then(self.0.row.cmp(&o.0.row))
    }
}
impl PartialOrd for Worst {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// Keeps the `k` best of a stream of scores.
pub struct TopK {
    k: usize,
    heap: BinaryHeap<Worst>,
}

impl TopK {
    /// The `k` best of several partial top lists (from threads that scanned parts).
    pub fn merge(parts: &[Vec<Scored>], k: usize) -> Vec<Scored> {
        let mut top = TopK::new(k);
        parts
            .iter()
            .flatten()
            .for_each(|s| top.push(s.row, s.score));
        top.into_sorted()
    }

    /// Per query, the `k` best of the partial lists that parts of a scan produced
    /// (`partials[part][query]`).
    pub fn merge_per_query(partials: &[Vec<Vec<Scored>>], nq: usize, k: usize) -> Vec<Vec<Scored>> {
        (0..nq)
            .map(|q| {
                let mut top = TopK::new(k);
                partials
                    .iter()
                    .flat_map(|p| &p[q])
                    .for_each(|s| top.push(s.row, s.score));
                top.into_sorted()
            })
            .collect()
    }

    pub fn new(k: usize) -> Self {
        Self {
            k,
            heap: BinaryHeap::with_capacity(k + 1),
        }
    }
    #[inline]
    pub fn push(&mut self, row: usize, score: f32) {
        if self.k == 0 {
            return;
        }
        if self.heap.len() < self.k {
            self.heap.push(Worst(Scored { row, score }));
        } else if let Some(top) = self.heap.peek() {
            if score > top.0.score || (score == top.0.score && row < top.0.row) {
                self.heap.pop();
                self.heap.push(Worst(Scored { row, score }));
            }
        }
    }
    /// Best first; ties by lower row.
    pub fn into_sorted(self) -> Vec<Scored> {
        let mut v: Vec<Scored> = self.heap.into_iter().map(|w| w.0).collect();
        sort_scored(&mut v);
        v
    }
}

pub fn sort_scored(v: &mut [Scored]) {
    v.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.row.cmp(&b.row)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_best_and_breaks_ties_towards_lower_rows() {
        let mut top = TopK::new(3);
        for (row, score) in [(5, 0.5), (1, 0.9), (7, 0.5), (2, 0.1), (3, 0.5), (9, 0.95)] {
            top.push(row, score);
        }
        let got: Vec<usize> = top.into_sorted().iter().map(|s| s.row).collect();
        assert_eq!(got, vec![9, 1, 3]);
        let parts = vec![
            vec![Scored { row: 4, score: 1.0 }, Scored { row: 6, score: 0.2 }],
            vec![Scored { row: 2, score: 1.0 }],
        ];
        let merged: Vec<usize> = TopK::merge(&parts, 2).iter().map(|s| s.row).collect();
        assert_eq!(merged, vec![2, 4]);
        assert!(TopK::new(0).into_sorted().is_empty());
    }
}
