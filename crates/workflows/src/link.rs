//! `link`: each new entry against a catalogue index, decided `match`, `new` or `ambiguous`
//! by the [`LinkRule`]; optionally growing the index with what is new.

use crate::geometry::{evidence, Position};
use crate::rule::LinkRule;
use anyhow::Result;
use craterdex_engine::{Engine, Progress, SearchHit};
use craterdex_index::{ImageMeta, Index, Mode, SearchParams};
use craterdex_tokens::Descriptors;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Match,
    New,
    Ambiguous,
}

impl Decision {
    pub fn name(self) -> &'static str {
        match self {
            Decision::Match => "match",
            Decision::New => "new",
            Decision::Ambiguous => "ambiguous",
        }
    }
}

/// An index entry that may be the query's crater, with the evidence for it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Candidate {
    pub id: String,
    pub crater_id: Option<String>,
    /// Appearance: the two-stage late-interaction score.
    pub score: f32,
    /// Centre distance in radii of the larger crater (both positions known).
    pub offset_radii: Option<f64>,
    /// Larger over smaller diameter (both positions known).
    pub diameter_ratio: Option<f64>,
    #[serde(skip)]
    pub meta: ImageMeta,
}

/// The outcome for one entry.
#[derive(Clone, Debug, Serialize)]
pub struct LinkRow {
    pub query: ImageMeta,
    pub decision: Decision,
    /// Calibrated probability that `best` is the same crater.
    pub confidence: f64,
    pub best: Option<Candidate>,
    /// The best candidate of another crater than `best`.
    pub second: Option<Candidate>,
    /// Added to the index by `--insert-new`.
    pub inserted: bool,
}

#[derive(Clone, Debug)]
pub struct LinkOptions {
    /// Candidates looked at per entry.
    pub top_k: usize,
    /// Stage-1 shortlist of the two-stage search.
    pub shortlist: usize,
    /// Entries searched (and, with `insert_new`, added) at a time.
    pub batch: usize,
    /// Add every `new` entry to the index, in order, so later entries can match it.
    pub insert_new: bool,
}

impl Default for LinkOptions {
    fn default() -> Self {
        LinkOptions {
            top_k: 10,
            shortlist: 100,
            batch: 256,
            insert_new: false,
        }
    }
}

fn same_crater(a: &ImageMeta, b: &ImageMeta) -> bool {
    match (&a.crater_id, &b.crater_id) {
        (Some(x), Some(y)) => x == y,
        _ => a.id == b.id,
    }
}

/// The candidates geometry allows, best first, with their evidence.
pub fn candidates(rule: &LinkRule, query: &ImageMeta, hits: &[SearchHit]) -> Vec<Candidate> {
    let q = Position::of(query);
    let mut out: Vec<Candidate> = hits
        .iter()
        .filter(|h| h.id != query.id)
        .filter_map(|h| {
            let ev = q
                .zip(Position::of(&h.meta))
                .and_then(|(a, b)| evidence(a, b, rule.body_radius_km));
            if let Some((offset, ratio)) = ev {
                if !rule.geometry_allows(offset, ratio) {
                    return None;
                }
            }
            Some(Candidate {
                id: h.id.clone(),
                crater_id: h.crater_id.clone(),
                score: h.score,
                offset_radii: ev.map(|e| e.0),
                diameter_ratio: ev.map(|e| e.1),
                meta: h.meta.clone(),
            })
        })
        .collect();
    out.sort_by(|a, b| b.score.total_cmp(&a.score));
    out
}

/// Applies the rule to ranked candidates (best first).
pub fn decide(rule: &LinkRule, query: ImageMeta, cands: Vec<Candidate>) -> LinkRow {
    let mut it = cands.into_iter();
    let best = it.next();
    let second = best
        .as_ref()
        .and_then(|b| it.find(|c| !same_crater(&c.meta, &b.meta)));
    let (decision, confidence) = match &best {
        None => (Decision::New, 0.0),
        Some(b) => {
            let close_rival = second
                .as_ref()
                .is_some_and(|s| rule.margin > 0.0 && b.score - s.score < rule.margin);
            let d = if b.score < rule.new_score {
                Decision::New
            } else if b.score >= rule.match_score && !close_rival {
                Decision::Match
            } else {
                Decision::Ambiguous
            };
            (d, rule.confidence(b.score))
        }
    };
    LinkRow {
        query,
        decision,
        confidence,
        best,
        second,
        inserted: false,
    }
}

fn params(o: &LinkOptions) -> SearchParams {
    SearchParams {
        top_k: o.top_k.max(1),
        shortlist: o.shortlist.max(o.top_k),
        mode: Mode::TwoStage,
        ..Default::default()
    }
}

/// Links every entry to `engine`'s index. Returns one row per entry, in order, and the
/// engine over the index as it is afterwards (grown when `insert_new`).
///
/// With `insert_new`, an entry decided `new` is added before any later entry is decided:
/// within a batch, later entries are also searched against the batch's new entries (an
/// in-memory index with the same encoder and codec, so scores are on the same scale), and
/// the batch's new entries are then added in one atomic step. An entry whose id is already
/// in the index is never added again, so a second run over the same entries adds nothing.
pub fn link(
    engine: Engine,
    entries: Vec<(ImageMeta, Descriptors)>,
    rule: &LinkRule,
    opts: &LinkOptions,
    progress: &dyn Progress,
) -> Result<(Vec<LinkRow>, Engine)> {
    let mut engine = engine;
    let params = params(opts);
    let mut rows = Vec::with_capacity(entries.len());
    progress.start("link", entries.len());
    let mut entries = entries.into_iter().peekable();
    while entries.peek().is_some() {
        let batch: Vec<(ImageMeta, Descriptors)> =
            entries.by_ref().take(opts.batch.max(1)).collect();
        let descs: Vec<Descriptors> = batch.iter().map(|(_, d)| d.clone()).collect();
        let results = engine.search(&descs, &params);
        let mut fresh: Vec<(ImageMeta, Descriptors)> = Vec::new();
        let mut fresh_engine: Option<Engine> = None;
        for ((meta, desc), hits) in batch.into_iter().zip(results) {
            let mut cands = candidates(rule, &meta, &hits);
            if let Some(mini) = &fresh_engine {
                let mini_hits = mini.search(std::slice::from_ref(&desc), &params);
                cands.extend(candidates(rule, &meta, &mini_hits[0]));
                cands.sort_by(|a, b| b.score.total_cmp(&a.score));
            }
            let mut row = decide(rule, meta, cands);
            let known_id = engine.index().row_of(&row.query.id).is_some()
                || fresh.iter().any(|(m, _)| m.id == row.query.id);
            if opts.insert_new && row.decision == Decision::New && !known_id {
                row.inserted = true;
                fresh.push((row.query.clone(), desc));
                let idx = engine.index();
                let mini = Index::in_memory(&idx.encoder, &idx.codec, None, &fresh, None)?;
                fresh_engine = Some(Engine::new(mini, None)?);
            }
            rows.push(row);
            progress.advance(rows.len());
        }
        if !fresh.is_empty() {
            engine = engine.add(&fresh)?.1;
            craterdex_durable::failpoint("link-after-batch");
        }
    }
    progress.finish();
    Ok((rows, engine))
}
