//! `dedup`: groups of one index's entries that show the same crater.
//!
//! Every live entry searches the index with its own descriptors. A pair is kept when each
//! is among the other's candidates (mutual), its confidence reaches the rule's
//! `match_confidence` and, where both have positions, geometry allows it. Kept pairs are
//! merged most confident first into groups, except where a merge would put two entries of
//! one source image in a group (one image shows one crater once). Each group proposes the
//! member with the highest total confidence to the others as its surviving entry.

use crate::error::Result;
use crate::link::{entry_candidates, upright, Neighbours};
use crate::register::{Frames, RegisterOptions};
use crate::rule::LinkRule;
use craterdex_engine::{Engine, Progress};
use craterdex_errors::OrInvalid;
use craterdex_index::{ImageMeta, Index, Mode, SearchParams};
use craterdex_tokens::Descriptors;
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};

/// How `dedup` runs; `Default` is what the command line and Python use.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DedupOptions {
    /// Candidates looked at per entry.
    pub top_k: usize,
    /// Stage-1 shortlist of the two-stage search.
    pub shortlist: usize,
    /// Entries searched at a time.
    pub batch: usize,
    /// Register the index's source images to each other before comparing positions
    /// ([`Frames::of_index`]).
    pub register: bool,
}

impl Default for DedupOptions {
    fn default() -> Self {
        DedupOptions {
            top_k: 10,
            shortlist: 100,
            batch: 256,
            register: true,
        }
    }
}

/// A group of entries of one crater; `members[survivor]` is the proposed entry to keep.
#[derive(Clone, Debug, Serialize)]
pub struct DedupGroup {
    pub members: Vec<ImageMeta>,
    pub survivor: usize,
    /// The pairs that joined the group: (member, member, score).
    pub pairs: Vec<(usize, usize, f32)>,
}

/// A pair of rows with their score, for the merge.
type Pair = (usize, usize, f32);

/// One direction of a candidate pair: the entry `from` found `to` with `confidence`
/// reaching the rule's `match_confidence` (ids, so that partitions run apart can be joined).
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct Edge {
    pub from: String,
    pub to: String,
    pub confidence: f32,
}

/// The edges of the entries at `rows`, each searching the whole index with its own
/// descriptors; geometric neighbours come from `near` ([`Neighbours::of_index`], or
/// [`Neighbours::around`] the rows for one partition of a catalogue cut by position).
pub fn edges(
    engine: &Engine,
    near: &Neighbours,
    rule: &LinkRule,
    frames: &Frames,
    o: &DedupOptions,
    rows: &[usize],
    progress: &dyn Progress,
) -> Vec<Edge> {
    let idx = engine.index();
    let params = SearchParams {
        top_k: o.top_k.max(1) + 1,
        shortlist: o.shortlist.max(o.top_k + 1),
        mode: Mode::TwoStage,
        // duplicates are other images: the entry's own crater's views would take their places
        group_views: false,
        ..Default::default()
    };
    let mut out = Vec::new();
    progress.start("dedup", rows.len());
    for (done, chunk) in rows.chunks(o.batch.max(1)).enumerate() {
        let descs: Vec<_> = chunk.iter().map(|&r| idx.descriptors_of(r)).collect();
        for ((&row, desc), hits) in chunk
            .iter()
            .zip(&descs)
            .zip(engine.search_descriptors(&descs, &params))
        {
            let from = &idx.meta(row).id;
            for c in entry_candidates(engine, near, rule, frames, idx.meta(row), desc, hits) {
                if c.confidence >= rule.match_confidence {
                    out.push(Edge {
                        from: from.clone(),
                        to: c.id,
                        confidence: c.confidence as f32,
                    });
                }
            }
        }
        progress.advance(((done + 1) * o.batch.max(1)).min(rows.len()));
    }
    progress.finish();
    out
}

/// Mutual pairs of `edges` (both directions present; the weaker confidence), strongest
/// first. Edges may come in any order.
fn mutual_pairs(index: &Index, edges: &[Edge]) -> Result<Vec<Pair>> {
    let mut directed: HashMap<(usize, usize), f32> = HashMap::new();
    for e in edges {
        let row = |id: &str| {
            index.row_of(id).or_invalid_with(|| {
                format!("dedup edge names {id:?}, which the index does not hold")
            })
        };
        directed.insert((row(&e.from)?, row(&e.to)?), e.confidence);
    }
    let mut pairs: Vec<Pair> = directed
        .iter()
        .filter(|((a, b), _)| a < b)
        .filter_map(|(&(a, b), &s)| Some((a, b, s.min(*directed.get(&(b, a))?))))
        .collect();
    pairs.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)).then(a.1.cmp(&b.1)));
    Ok(pairs)
}

fn find(parent: &mut [usize], mut x: usize) -> usize {
    while parent[x] != x {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    x
}

/// The groups of two or more entries, largest first, with the index's sources placed by
/// `frames` ([`frames_of_index`]; the caller keeps them for its report) and compared at one
/// orientation ([`upright_engine`]).
pub fn dedup(
    engine: &Engine,
    rule: &LinkRule,
    opts: &DedupOptions,
    frames: &Frames,
    progress: &dyn Progress,
) -> Result<Vec<DedupGroup>> {
    let upright = upright_engine(engine, frames, progress)?;
    let searched = upright.as_ref().unwrap_or(engine);
    let sidx = searched.index();
    let rows: Vec<usize> = sidx.live_rows().collect();
    let near = Neighbours::of_index(sidx, rule, frames);
    merge(
        engine.index(),
        &edges(searched, &near, rule, frames, opts, &rows, progress),
    )
}

/// The index's live entries with the crops of every source registered at a rotation of
/// [`crate::link::UPRIGHT_MIN_DEG`] or more re-encoded turned to the reference source's orientation, as an
/// in-memory engine (same ids, encoder and codec; exact stage 1), so that every pair is
/// compared the right way up both ways; None when no crop was turned (no model, no turned
/// source, or no image paths). Edges computed on it merge on the index as usual (by id).
pub fn upright_engine(
    engine: &Engine,
    frames: &Frames,
    progress: &dyn Progress,
) -> Result<Option<Engine>> {
    let idx = engine.index();
    let live: Vec<usize> = idx.live_rows().collect();
    let metas: Vec<&ImageMeta> = live.iter().map(|&r| idx.meta(r)).collect();
    let turned = upright(engine, frames, &metas, progress);
    if turned.is_empty() {
        return Ok(None);
    }
    let mut replaced: HashMap<usize, Descriptors> = turned.into_iter().collect();
    let all: Vec<(ImageMeta, Descriptors)> = live
        .iter()
        .enumerate()
        .map(|(k, &r)| {
            let desc = replaced.remove(&k).unwrap_or_else(|| idx.descriptors_of(r));
            (idx.meta(r).clone(), desc)
        })
        .collect();
    let mini = Index::in_memory(&idx.encoder, &idx.codec, None, &all, None)?;
    Ok(Some(Engine::new(mini, None)?))
}

/// The registration of the index's sources to each other, when the options ask for it.
pub fn frames_of_index(idx: &Index, rule: &LinkRule, o: &DedupOptions) -> Frames {
    if o.register {
        Frames::of_index(idx, &RegisterOptions::default(), rule.body_radius_km)
    } else {
        Frames::none()
    }
}

/// The groups that `edges` (of every live entry, from one run or from partitions) make.
pub fn merge(idx: &Index, edges: &[Edge]) -> Result<Vec<DedupGroup>> {
    let pairs = mutual_pairs(idx, edges)?;
    let n = idx.rows();
    let mut parent: Vec<usize> = (0..n).collect();
    let mut sources: Vec<BTreeSet<String>> = (0..n)
        .map(|r| idx.meta(r).source.iter().cloned().collect())
        .collect();
    let mut joined: Vec<Pair> = Vec::new();
    for &(a, b, s) in &pairs {
        let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
        if ra == rb {
            joined.push((a, b, s));
            continue;
        }
        if !sources[ra].is_disjoint(&sources[rb]) {
            continue;
        }
        let moved = std::mem::take(&mut sources[rb]);
        sources[ra].extend(moved);
        parent[rb] = ra;
        joined.push((a, b, s));
    }
    let mut by_root: HashMap<usize, Vec<usize>> = HashMap::new();
    for &(a, b, _) in &joined {
        for r in [a, b] {
            let root = find(&mut parent, r);
            let members = by_root.entry(root).or_default();
            if !members.contains(&r) {
                members.push(r);
            }
        }
    }
    let mut groups: Vec<DedupGroup> = by_root
        .into_values()
        .map(|mut rows| {
            rows.sort_unstable();
            let pos = |r: usize| rows.iter().position(|&x| x == r).expect("member");
            let group_pairs: Vec<(usize, usize, f32)> = joined
                .iter()
                .filter(|(a, _, _)| rows.contains(a))
                .map(|&(a, b, s)| (pos(a), pos(b), s))
                .collect();
            let mut strength = vec![0.0f32; rows.len()];
            for &(a, b, s) in &group_pairs {
                strength[a] += s;
                strength[b] += s;
            }
            let survivor = (0..rows.len())
                .max_by(|&x, &y| strength[x].total_cmp(&strength[y]).then(y.cmp(&x)))
                .unwrap_or(0);
            DedupGroup {
                members: rows.iter().map(|&r| idx.meta(r).clone()).collect(),
                survivor,
                pairs: group_pairs,
            }
        })
        .collect();
    groups.sort_by(|a, b| {
        b.members
            .len()
            .cmp(&a.members.len())
            .then_with(|| a.members[0].id.cmp(&b.members[0].id))
    });
    Ok(groups)
}

/// Quality against crater ids: pair precision and recall over all pairs within groups, and
/// the share of true groups (crater ids with two or more live entries) found exactly.
#[derive(Clone, Debug, Serialize)]
pub struct DedupScore {
    pub true_groups: usize,
    pub found_exactly: usize,
    pub pair_precision: f64,
    pub pair_recall: f64,
}

pub fn score_groups(groups: &[DedupGroup], entries: &[ImageMeta]) -> DedupScore {
    let mut truth: HashMap<&str, BTreeSet<&str>> = HashMap::new();
    for m in entries {
        if let Some(c) = &m.crater_id {
            truth.entry(c).or_default().insert(&m.id);
        }
    }
    let true_pairs: usize = truth.values().map(|g| g.len() * (g.len() - 1) / 2).sum();
    let (mut predicted, mut correct) = (0usize, 0usize);
    let mut found = 0;
    for g in groups {
        for i in 0..g.members.len() {
            for j in i + 1..g.members.len() {
                predicted += 1;
                let same = g.members[i].crater_id.is_some()
                    && g.members[i].crater_id == g.members[j].crater_id;
                correct += same as usize;
            }
        }
        let ids: BTreeSet<&str> = g.members.iter().map(|m| m.id.as_str()).collect();
        if let Some(c) = g.members[0].crater_id.as_deref() {
            found += (truth.get(c) == Some(&ids)) as usize;
        }
    }
    DedupScore {
        true_groups: truth.values().filter(|g| g.len() >= 2).count(),
        found_exactly: found,
        pair_precision: if predicted == 0 {
            1.0
        } else {
            correct as f64 / predicted as f64
        },
        pair_recall: if true_pairs == 0 {
            1.0
        } else {
            correct as f64 / true_pairs as f64
        },
    }
}
