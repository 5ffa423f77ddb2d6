//! `link`: each new entry against a catalogue index, decided `match`, `new` or `ambiguous`
//! by the [`LinkRule`]; optionally growing the index with what is new.

use crate::error::{Error, Result};
use crate::geometry::{evidence, in_band, largest_diameter, reach_band, Position, SpatialGrid};
use crate::register::{Frames, RegisterOptions, SourceRegistration};
use crate::rule::{Geometry, LinkRule};
use craterdex_engine::{Engine, Progress, SearchHit};
use craterdex_errors::ensure;
use craterdex_index::{Hit, ImageMeta, Index, Mode, SearchParams};
use craterdex_tokens::Descriptors;
use serde::Serialize;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Match,
    New,
    Ambiguous,
}

impl Candidate {
    /// The geometric evidence the rule scored, when both positions are known.
    pub fn geometry(&self) -> Option<Geometry> {
        Some(Geometry {
            offset_radii: self.offset_radii?,
            diameter_ratio: self.diameter_ratio?,
            registered: self.registered,
        })
    }
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Candidate {
    pub id: String,
    pub crater_id: Option<String>,
    /// Appearance: the two-stage late-interaction score.
    pub score: f32,
    /// Centre distance in radii of the larger crater (both positions known).
    pub offset_radii: Option<f64>,
    /// Larger over smaller diameter (both positions known).
    pub diameter_ratio: Option<f64>,
    /// Both positions are in the catalogue's frame by registration.
    pub registered: bool,
    /// The rule's probability that this is the query's crater.
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 1))]
    pub confidence: f64,
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
    /// Every candidate geometry allowed, most confident first (what calibration fits on).
    #[serde(skip)]
    pub candidates: Vec<Candidate>,
    /// The registration of the entry's source, when it was registered or tried.
    #[serde(skip)]
    pub registration: Option<Arc<SourceRegistration>>,
}

/// How `link` runs; `Default` is what the command line, Python and the service use.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinkOptions {
    /// Candidates looked at per entry.
    pub top_k: usize,
    /// Stage-1 shortlist of the two-stage search.
    pub shortlist: usize,
    /// Entries searched (and, with `insert_new`, added) at a time.
    pub batch: usize,
    /// Add every `new` entry to the index, in order, so later entries can match it.
    pub insert_new: bool,
    /// Register each source image of the entries to the catalogue before deciding
    /// (`crate::register`); entries whose source cannot be registered keep their positions.
    pub register: bool,
}

impl Default for LinkOptions {
    fn default() -> Self {
        LinkOptions {
            top_k: 10,
            shortlist: 100,
            batch: 256,
            insert_new: false,
            register: true,
        }
    }
}

fn same_crater(a: &ImageMeta, b: &ImageMeta) -> bool {
    match (&a.crater_id, &b.crater_id) {
        (Some(x), Some(y)) => x == y,
        _ => a.id == b.id,
    }
}

/// The candidates geometry allows, with their evidence and confidence, most confident
/// first; positions compared as `frames` places them.
pub fn candidates(
    rule: &LinkRule,
    frames: &Frames,
    query: &ImageMeta,
    hits: &[SearchHit],
) -> Vec<Candidate> {
    let placed = frames.place(query);
    let q = Position::of(&placed.meta);
    let mut out: Vec<Candidate> = hits
        .iter()
        .filter(|h| h.id != query.id)
        .filter_map(|h| {
            let there = frames.place(&h.meta);
            let registered = placed.registered && there.registered;
            let ev = q
                .zip(Position::of(&there.meta))
                .and_then(|(a, b)| evidence(a, b, rule.body_radius_km))
                .map(|(offset_radii, diameter_ratio)| Geometry {
                    offset_radii,
                    diameter_ratio,
                    registered,
                });
            if let Some(g) = ev {
                if !rule.geometry_allows(g) {
                    return None;
                }
            }
            Some(Candidate {
                id: h.id.clone(),
                crater_id: h.crater_id.clone(),
                score: h.score,
                offset_radii: ev.map(|e| e.offset_radii),
                diameter_ratio: ev.map(|e| e.diameter_ratio),
                registered: ev.is_some_and(|e| e.registered),
                confidence: rule.confidence(h.score, ev),
                meta: h.meta.clone(),
            })
        })
        .collect();
    sort_by_confidence(&mut out);
    out
}

fn sort_by_confidence(c: &mut [Candidate]) {
    c.sort_by(|a, b| {
        b.confidence
            .total_cmp(&a.confidence)
            .then(b.score.total_cmp(&a.score))
    });
}

/// Applies the rule to candidates (most confident first).
pub fn decide(
    rule: &LinkRule,
    query: ImageMeta,
    cands: Vec<Candidate>,
    registration: Option<Arc<SourceRegistration>>,
) -> LinkRow {
    let best = cands.first().cloned();
    let second = best.as_ref().and_then(|b| {
        cands
            .iter()
            .find(|c| !same_crater(&c.meta, &b.meta))
            .cloned()
    });
    let confidence = best.as_ref().map_or(0.0, |b| b.confidence);
    let decision = match &best {
        None => Decision::New,
        Some(_) if confidence >= rule.match_confidence => Decision::Match,
        Some(_) if confidence < rule.new_confidence => Decision::New,
        Some(_) => Decision::Ambiguous,
    };
    LinkRow {
        query,
        decision,
        confidence,
        best,
        second,
        inserted: false,
        candidates: cands,
        registration,
    }
}

/// Geometric neighbours looked at per entry, besides the appearance hits.
pub const MAX_NEIGHBOURS: usize = 20;

/// The index rows with positions on a grid, for the candidates geometry proposes.
pub struct Neighbours {
    grid: SpatialGrid,
}

impl Neighbours {
    pub fn of_index(index: &Index, rule: &LinkRule, frames: &Frames) -> Self {
        Self::of_rows(index, rule, frames, |_| true)
    }

    /// The index rows that can be candidates of `entries` by geometry: those in the bands
    /// of [`reach_band`] around them (the halo of a partition by position). Candidates
    /// found through these are exactly those found through [`Neighbours::of_index`].
    pub fn around(index: &Index, rule: &LinkRule, frames: &Frames, entries: &[ImageMeta]) -> Self {
        let bands: Vec<(bool, f64, f64)> = entries
            .iter()
            .filter_map(|m| Position::of(&frames.place(m).meta))
            .map(|p| {
                reach_band(
                    p,
                    rule.max_offset_radii,
                    rule.max_diameter_ratio,
                    rule.body_radius_km,
                )
            })
            .collect();
        let hull = |body: bool| {
            bands
                .iter()
                .filter(|b| b.0 == body)
                .fold(None, |acc: Option<(bool, f64, f64)>, b| {
                    Some(acc.map_or(*b, |a| (body, a.1.min(b.1), a.2.max(b.2))))
                })
        };
        let (body, frame) = (hull(true), hull(false));
        Self::of_rows(index, rule, frames, |p| {
            body.is_some_and(|b| in_band(p, b)) || frame.is_some_and(|f| in_band(p, f))
        })
    }

    /// The live rows whose positions `keep` accepts, on a grid sized as for the whole index
    /// (so that lookups read the same cells whichever rows are kept).
    fn of_rows(
        index: &Index,
        rule: &LinkRule,
        frames: &Frames,
        keep: impl Fn(Position) -> bool,
    ) -> Self {
        let positioned: Vec<(usize, Position)> = index
            .live_rows()
            .filter_map(|r| Some((r, Position::of(&frames.place(index.meta(r)).meta)?)))
            .collect();
        let largest = largest_diameter(positioned.iter().map(|(_, p)| *p));
        Neighbours {
            grid: SpatialGrid::of(
                positioned.into_iter().filter(|(_, p)| keep(*p)),
                rule.max_offset_radii,
                rule.max_diameter_ratio,
                rule.body_radius_km,
                largest,
            ),
        }
    }

    fn add(&mut self, index: &Index, frames: &Frames, rows: impl IntoIterator<Item = usize>) {
        for r in rows {
            if let Some(p) = Position::of(&frames.place(index.meta(r)).meta) {
                self.grid.insert(r, p);
            }
        }
    }
}

/// The candidates of an entry: its appearance `hits` with the geometric neighbours added
/// ([`evidence_of`], [`merged_evidence`]), filtered and scored by the rule ([`candidates`]).
pub fn entry_candidates(
    engine: &Engine,
    near: &Neighbours,
    rule: &LinkRule,
    frames: &Frames,
    meta: &ImageMeta,
    desc: &Descriptors,
    hits: Vec<SearchHit>,
) -> Vec<Candidate> {
    let placed = frames.place(meta);
    let top_k = hits.len();
    let evidence = evidence_of(engine, near, &placed.meta, desc, hits);
    candidates(rule, frames, meta, &merged_evidence(vec![evidence], top_k))
}

/// What one index, a whole catalogue or one shard of it, knows of an entry: its appearance
/// hits and the rows near the entry's position that geometry allows, each scored by late
/// interaction. The evidence of every shard of a set, merged ([`merged_evidence`]), is the
/// evidence of the whole catalogue: so a cluster links as one index does.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct LinkEvidence {
    pub hits: Vec<SearchHit>,
    /// Nearest first: [`MAX_NEIGHBOURS`] rows besides as many as there are hits (the
    /// merged hits may include some of them, and those do not count).
    pub near: Vec<NearHit>,
}

/// A row near an entry, with its offset from the entry in radii of the larger crater.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct NearHit {
    pub offset_radii: f64,
    pub hit: SearchHit,
}

/// An entry's [`LinkEvidence`] in one index: its appearance `hits` and, when `meta` (placed)
/// has a position, the nearest rows geometry allows.
fn evidence_of(
    engine: &Engine,
    near: &Neighbours,
    meta: &ImageMeta,
    desc: &Descriptors,
    hits: Vec<SearchHit>,
) -> LinkEvidence {
    let Some(p) = Position::of(meta) else {
        return LinkEvidence {
            hits,
            near: Vec::new(),
        };
    };
    let nearest: Vec<(usize, f64)> = near
        .grid
        .near(p)
        .into_iter()
        .map(|(r, offset, _)| (r, offset))
        .take(MAX_NEIGHBOURS + hits.len())
        .collect();
    // a row among the reranked hits is not scored again: its hit carries the same
    // late-interaction score
    let reranked: std::collections::HashMap<usize, &SearchHit> = hits
        .iter()
        .filter(|h| h.stage2.is_some())
        .map(|h| (h.row, h))
        .collect();
    let rows: Vec<usize> = nearest
        .iter()
        .map(|&(r, _)| r)
        .filter(|r| !reranked.contains_key(r))
        .collect();
    let scores = engine.index().late_interaction(&desc.tokens, &rows);
    let scored: Vec<Hit> = rows
        .into_iter()
        .zip(scores)
        .map(|(row, score)| Hit {
            row,
            score,
            stage1: None,
            stage2: Some(score),
        })
        .collect();
    let mut fresh = engine.describe(&scored).into_iter();
    let near = nearest
        .iter()
        .filter_map(|&(row, offset_radii)| {
            let hit = match reranked.get(&row) {
                Some(h) => SearchHit {
                    score: h.stage2?,
                    stage1: None,
                    ..(*h).clone()
                },
                None => fresh.next()?,
            };
            Some(NearHit { offset_radii, hit })
        })
        .collect();
    LinkEvidence { hits, near }
}

/// An entry's evidence in one index, searched as `opts` say: what a shard answers a
/// cluster's link. `meta` is placed by `frames`.
pub fn link_evidence(
    engine: &Engine,
    near: &Neighbours,
    frames: &Frames,
    opts: &LinkOptions,
    meta: &ImageMeta,
    desc: &Descriptors,
) -> LinkEvidence {
    let hits = engine
        .search_descriptors(std::slice::from_ref(desc), &params(opts))
        .pop()
        .unwrap_or_default();
    evidence_of(engine, near, &frames.place(meta).meta, desc, hits)
}

/// The hits of several indexes' evidence as one index would have them: the `top_k` best
/// appearance hits, then the [`MAX_NEIGHBOURS`] nearest rows that are not among them.
pub fn merged_evidence(parts: Vec<LinkEvidence>, top_k: usize) -> Vec<SearchHit> {
    let (hits, mut near): (Vec<Vec<SearchHit>>, Vec<Vec<NearHit>>) =
        parts.into_iter().map(|e| (e.hits, e.near)).unzip();
    let mut out = match <[_; 1]>::try_from(hits) {
        Ok([one]) => one,
        Err(hits) => craterdex_engine::merge_hits(hits, top_k, false),
    };
    let seen: std::collections::HashSet<String> = out.iter().map(|h| h.id.clone()).collect();
    let mut near: Vec<NearHit> = near.drain(..).flatten().collect();
    // a stable sort: rows of one index at one offset keep that index's order
    near.sort_by(|a, b| a.offset_radii.total_cmp(&b.offset_radii));
    out.extend(
        near.into_iter()
            .filter(|n| !seen.contains(&n.hit.id))
            .take(MAX_NEIGHBOURS)
            .map(|n| n.hit),
    );
    out
}

/// The decision for one entry from its evidence in every index of a set (a single index:
/// one part), as [`link_one`] decides it against one index holding them all.
pub fn link_decision(
    rule: &LinkRule,
    frames: &Frames,
    opts: &LinkOptions,
    meta: ImageMeta,
    parts: Vec<LinkEvidence>,
) -> LinkRow {
    let hits = merged_evidence(parts, params(opts).top_k);
    let cands = candidates(rule, frames, &meta, &hits);
    let registration = frames.place(&meta).registration.cloned();
    decide(rule, meta, cands, registration)
}

/// The registration of the entries' sources to the index, when the options ask for it
/// ([`Frames::none`] otherwise): what [`link`] does first, and what a distributed run does
/// once for all its [`link_partition`]s.
pub fn register_entries(
    engine: &Engine,
    rule: &LinkRule,
    o: &LinkOptions,
    metas: &[ImageMeta],
) -> Frames {
    if o.register {
        Frames::of_entries(
            engine.index(),
            metas,
            &RegisterOptions::default(),
            rule.body_radius_km,
        )
    } else {
        Frames::none()
    }
}

/// [`register_entries`], then the sources crater patterns did not register registered again,
/// seeded by their entries' confident appearance matches: the top hit of another source that
/// the rule would match on appearance alone (a source with few craters, or seen at another
/// resolution, whose craters' neighbourhoods differ from the catalogue's). What [`link`] does
/// first.
pub fn register_entries_seeded(
    engine: &Engine,
    rule: &LinkRule,
    opts: &LinkOptions,
    entries: &[(ImageMeta, Descriptors)],
) -> Frames {
    let metas: Vec<ImageMeta> = entries.iter().map(|(m, _)| m.clone()).collect();
    let mut frames = register_entries(engine, rule, opts, &metas);
    if !opts.register {
        return frames;
    }
    let failed: Vec<Option<String>> = frames
        .registrations()
        .iter()
        .filter(|r| !r.registered)
        .map(|r| r.source.clone())
        .collect();
    let chosen: Vec<&(ImageMeta, Descriptors)> = entries
        .iter()
        .filter(|(m, _)| failed.contains(&m.source))
        .collect();
    if chosen.len() < 2 {
        return frames;
    }
    let descs: Vec<Descriptors> = chosen.iter().map(|(_, d)| d.clone()).collect();
    let top = SearchParams {
        top_k: 1,
        ..params(opts)
    };
    let seeds: Vec<(String, String)> = chosen
        .iter()
        .zip(engine.search_descriptors(&descs, &top))
        .filter_map(|((m, _), hits)| {
            let h = hits.into_iter().next()?;
            let confident = rule.confidence(h.score, None) >= rule.match_confidence;
            (confident && h.meta.source != m.source).then(|| (m.id.clone(), h.id))
        })
        .collect();
    if seeds.len() < 2 {
        return frames;
    }
    let metas: Vec<ImageMeta> = chosen.iter().map(|(m, _)| m.clone()).collect();
    let seeded = Frames::of_entries_seeded(
        engine.index(),
        &metas,
        &seeds,
        &RegisterOptions::default(),
        rule.body_radius_km,
    );
    let now_registered = seeded
        .registrations()
        .into_iter()
        .filter(|r| r.registered)
        .map(|r| (*r).clone());
    frames.extend(Frames::of_registrations(
        now_registered,
        rule.body_radius_km,
    ));
    frames
}

/// Below this rotation a registered source's crops are compared as they are.
pub const UPRIGHT_MIN_DEG: f64 = 10.0;

/// The angle (degrees) to turn the crops of `reg`'s source by to compare them at the
/// catalogue's orientation: its rotation, when registered at [`UPRIGHT_MIN_DEG`] or more.
pub fn crop_turn_deg(reg: &SourceRegistration) -> Option<f64> {
    reg.rotation_deg
        .filter(|d| reg.registered && d.abs() >= UPRIGHT_MIN_DEG)
}

/// The descriptors of entries' crops (`metas`) turned to the catalogue's orientation, by
/// entry position: for every source registered at a rotation of [`UPRIGHT_MIN_DEG`] or more whose
/// entries name their image files, when the engine has a model. A source whose images
/// cannot all be read keeps its descriptors (said through `progress`).
pub fn upright(
    engine: &Engine,
    frames: &Frames,
    metas: &[&ImageMeta],
    progress: &dyn Progress,
) -> Vec<(usize, Descriptors)> {
    let mut turned = Vec::new();
    if engine.extractor().is_none() {
        return turned;
    }
    for reg in frames.registrations() {
        let Some(deg) = crop_turn_deg(&reg) else {
            continue;
        };
        let (at, items): (Vec<usize>, Vec<(String, std::path::PathBuf)>) = metas
            .iter()
            .enumerate()
            .filter(|(_, m)| m.source == reg.source)
            .filter_map(|(i, m)| Some((i, (m.id.clone(), m.path.clone()?.into()))))
            .unzip();
        match engine.encode_turned(&items, deg.to_radians() as f32) {
            Ok(descs) => turned.extend(at.into_iter().zip(descs)),
            Err(e) => progress.note(&format!(
                "source {:?}: crops compared as given, not turned by {deg:.1} degrees: {e}",
                reg.source.as_deref().unwrap_or("(none)")
            )),
        }
    }
    turned
}

/// `entries` with the descriptors [`upright`] turned in their places.
fn with_turned(
    mut entries: Vec<(ImageMeta, Descriptors)>,
    turned: Vec<(usize, Descriptors)>,
) -> Vec<(ImageMeta, Descriptors)> {
    for (i, d) in turned {
        entries[i].1 = d;
    }
    entries
}

/// Each source's registration once, from link rows (for the outputs), in source order.
pub fn registrations(rows: &[LinkRow]) -> Vec<Arc<SourceRegistration>> {
    let mut seen: Vec<Arc<SourceRegistration>> = Vec::new();
    for r in rows.iter().filter_map(|r| r.registration.as_ref()) {
        if !seen.iter().any(|s| Arc::ptr_eq(s, r)) {
            seen.push(r.clone());
        }
    }
    seen.sort_by(|a, b| a.source.cmp(&b.source));
    seen
}

pub(crate) fn params(o: &LinkOptions) -> SearchParams {
    SearchParams {
        top_k: o.top_k.max(1),
        shortlist: o.shortlist.max(o.top_k),
        mode: Mode::TwoStage,
        // candidates are judged image by image (the rule is calibrated on them)
        group_views: false,
        ..Default::default()
    }
}

/// One entry against the index, nothing inserted: what [`link`] decides for it. One entry
/// is no pattern to register: `frames` holds its source's registration when the caller
/// registered the source's craters before (else [`Frames::none`]: its position as given),
/// and `desc` is of its crop as the catalogue sees it ([`UPRIGHT_MIN_DEG`]). `near` is the
/// index's [`Neighbours`] with [`Frames::none`] (build it once per index, not per entry).
pub fn link_one(
    engine: &Engine,
    near: &Neighbours,
    rule: &LinkRule,
    opts: &LinkOptions,
    frames: &Frames,
    meta: ImageMeta,
    desc: &Descriptors,
) -> LinkRow {
    let evidence = link_evidence(engine, near, frames, opts, &meta, desc);
    link_decision(rule, frames, opts, meta, vec![evidence])
}

/// What [`link`] decides for `entries` without inserting, when they are one partition of a
/// larger set cut by position: geometric neighbours come from the index rows around these
/// entries only ([`Neighbours::around`]), which are all the rows geometry could propose, and
/// `frames` are [`register_entries`] of the whole set (a source's transform estimated once
/// and shared by its partitions), so the rows are those of [`link`] over the whole set.
pub fn link_partition(
    engine: &Engine,
    entries: &[(ImageMeta, Descriptors)],
    rule: &LinkRule,
    opts: &LinkOptions,
    frames: &Frames,
    progress: &dyn Progress,
) -> Result<Vec<LinkRow>> {
    ensure!(
        !opts.insert_new,
        Error::Invalid(
            "inserting new entries is one writer's job: link partitions without it, then insert"
                .to_string()
        )
    );
    let metas: Vec<ImageMeta> = entries.iter().map(|(m, _)| m.clone()).collect();
    let refs: Vec<&ImageMeta> = entries.iter().map(|(m, _)| m).collect();
    let turned = upright(engine, frames, &refs, progress);
    // a copy only where some crops were turned
    let turned_entries;
    let entries = if turned.is_empty() {
        entries
    } else {
        turned_entries = with_turned(entries.to_vec(), turned);
        &turned_entries[..]
    };
    let near = Neighbours::around(engine.index(), rule, frames, &metas);
    let params = params(opts);
    let mut rows = Vec::with_capacity(entries.len());
    progress.start("link", entries.len());
    for batch in entries.chunks(opts.batch.max(1)) {
        let descs: Vec<Descriptors> = batch.iter().map(|(_, d)| d.clone()).collect();
        for ((meta, desc), hits) in batch.iter().zip(engine.search_descriptors(&descs, &params)) {
            let cands = entry_candidates(engine, &near, rule, frames, meta, desc, hits);
            let registration = frames.place(meta).registration.cloned();
            rows.push(decide(rule, meta.clone(), cands, registration));
        }
        progress.advance(rows.len());
    }
    progress.finish();
    Ok(rows)
}

/// Links every entry to `engine`'s index. Returns one row per entry, in order, and, when
/// entries were inserted (`insert_new`), the engine over the grown index.
///
/// With `insert_new`, an entry decided `new` is added before any later entry is decided:
/// within a batch, later entries are also searched against the batch's new entries (an
/// in-memory index with the same encoder and codec, so scores are on the same scale), and
/// the batch's new entries are then added in one atomic step. An entry whose id is already
/// in the index is never added again, so a second run over the same entries adds nothing.
pub fn link(
    engine: &Engine,
    entries: Vec<(ImageMeta, Descriptors)>,
    rule: &LinkRule,
    opts: &LinkOptions,
    progress: &dyn Progress,
) -> Result<(Vec<LinkRow>, Option<Engine>)> {
    let mut grown: Option<Engine> = None;
    let params = params(opts);
    let mut rows = Vec::with_capacity(entries.len());
    let frames = register_entries_seeded(engine, rule, opts, &entries);
    let refs: Vec<&ImageMeta> = entries.iter().map(|(m, _)| m).collect();
    let turned = upright(engine, &frames, &refs, progress);
    let entries = with_turned(entries, turned);
    let mut near = Neighbours::of_index(engine.index(), rule, &frames);
    progress.start("link", entries.len());
    let mut entries = entries.into_iter().peekable();
    while entries.peek().is_some() {
        let batch: Vec<(ImageMeta, Descriptors)> =
            entries.by_ref().take(opts.batch.max(1)).collect();
        let engine = grown.as_ref().unwrap_or(engine);
        let descs: Vec<Descriptors> = batch.iter().map(|(_, d)| d.clone()).collect();
        let results = engine.search_descriptors(&descs, &params);
        let mut fresh: Vec<(ImageMeta, Descriptors)> = Vec::new();
        let mut fresh_engine: Option<Engine> = None;
        for ((meta, desc), hits) in batch.into_iter().zip(results) {
            let mut cands = entry_candidates(engine, &near, rule, &frames, &meta, &desc, hits);
            if let Some(mini) = &fresh_engine {
                let mini_hits = mini.search_descriptors(std::slice::from_ref(&desc), &params);
                cands.extend(candidates(rule, &frames, &meta, &mini_hits[0]));
                sort_by_confidence(&mut cands);
            }
            let registration = frames.place(&meta).registration.cloned();
            let mut row = decide(rule, meta, cands, registration);
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
            let added = engine.add(&fresh)?.1;
            let idx = added.index();
            near.add(
                idx,
                &frames,
                fresh.iter().filter_map(|(m, _)| idx.row_of(&m.id)),
            );
            grown = Some(added);
            craterdex_durable::failpoint("link-after-batch");
        }
    }
    progress.finish();
    Ok((rows, grown))
}
