//! The rechecked search ([`crate::SearchOptions::recheck`], on by default for a query image)
//! as a plan held as data: its stages in order, the first included, and the rule that moves
//! a query from one to the next. This is the one description of it; the command line's
//! help, the Python docstring and the docs print [`RecheckPlan::describe`] or point here.
//!
//! 1. **as given**: the query alone, its [`FIRST_VERIFY`] best images verified spatially.
//!    A query whose verified first hit gathers fewer than [`UNSURE_SHARE`] of its patches
//!    as inliers ([`RecheckPlan::unsure`]: turned, mirrored, under another sun) goes on.
//! 2. **turned toward the catalogue's suns** (only where the catalogue has suns): the query
//!    and its mirror image turned so that the sun's heading each shows
//!    ([`crate::sun_heading_of`]) points toward each sun ([`QueryViews::toward`]),
//!    [`FIRST_VERIFY`] verified; 2 forward passes per sun.
//! 3. **relit toward the catalogue's suns** (the same): the query relit so that its sun
//!    shines from each sun's axis ([`QueryViews::relit_toward`]), [`FIRST_VERIFY`] verified.
//! 4. **in turns and under the opposite sun**: [`TURNS`] turns, each mirrored, and the query
//!    as given with its brightness inverted, [`AGAIN_VERIFY`] verified; 2 x [`TURNS`] + 1
//!    forward passes.
//!
//! Each stage after the first searches only the queries still unsure, and a new answer
//! replaces the one before where its first hit registers at least as well and with at least
//! the stage's keep share of the patches ([`RecheckPlan::registers_better`]). Where the
//! query's tokens are no square grid (an oriented or multi-scale index) nothing can be
//! verified and the search is plain. [`crate::SearchOptions::recheck_views`] bounds the
//! views a query runs through the model: the plan is cut to the stages that fit
//! ([`RecheckPlan::within`]). The constants were chosen on the NAC, Mars and relit
//! benchmarks; docs/results.md, "Rechecked by default", has the measurements and which
//! split chose each.

use crate::catalogue::{encode_in_views, Catalogue};
use crate::engine::QueryFeatures;
use crate::error::Result;
use crate::hits::{QueryHits, SearchHit};
use crate::progress::{go_on, Progress};
use crate::views::{OppositeSun, QueryViews, Suns};
use craterdex_index::SearchParams;
use craterdex_model::extract::FeatureSet;
use std::collections::{HashMap, HashSet};

/// Images (and craters, where a crater has several views: [`crate::verify::crater_candidates`])
/// verified per query as given and toward the catalogue's suns: 50, the advice for
/// queries at an unknown heading (docs/results.md, "Turned and verified"); a query brought
/// back to the catalogue's heading ranks its crater as an upright query does.
const FIRST_VERIFY: usize = 50;

/// The share of a query's patches its verified first hit must gather as inliers for the
/// answer as given to stand. Upright queries' verified first hits gathered 87-155 inliers of
/// 256 on the NAC benchmark and 96-171 on the Mars one (every one right); turned queries'
/// wrong first hits at most 62 (NAC) and 98 (Mars): 0.4 (102) searches again 1-2 upright
/// queries in 200 and every turned one answered wrong.
const UNSURE_SHARE: f32 = 0.4;

/// The share of a query's patches the new first hit of a turned search must gather to be
/// kept: right answers gathered 101 or more of 256 on both real benchmarks, wrong ones at most
/// 60 (NAC); under another sun no view registers and the answer as given, verified, was right
/// more often: 0.3 (77) keeps it.
const KEEP_SHARE: f32 = 0.3;

/// The keep share of a relit search: 0.2 (52 of 256). A relit view is a first-order picture
/// of the crater under the other sun and registers less than a turned one: under a sun turned
/// by 90 degrees the relit views' right first hits gathered 29-154 inliers and nine in ten
/// wrong ones 12-43; at [`KEEP_SHARE`] 18 right answers of 95 were lost.
const RELIT_KEEP_SHARE: f32 = 0.2;

/// Turns of the last stage: 12, every 30 degrees.
const TURNS: usize = 12;

/// Images verified by the last stage: 200. The right crater of a turned query seen through its
/// nearest turn can stand below the 50th place; 200 found it first for 173 of 174 turned NAC
/// queries where 50 found it for 168. Above a caller's own `verify` limit
/// ([`crate::MAX_VERIFY`]): only the few queries that did not register pay for it.
const AGAIN_VERIFY: usize = 200;

/// One search of a rechecked search.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Stage {
    /// What it searches, as reports name it.
    pub name: &'static str,
    /// The views of each query it searches.
    pub views: QueryViews,
    /// Images it verifies per query.
    pub verify: usize,
    /// The share of a query's patches its new first hit must gather as inliers to replace the
    /// answer before it (0 for the first stage, which replaces nothing).
    pub keep_share: f32,
}

/// What one stage of a search did ([`crate::SearchAnswer::stages`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StageRun {
    pub stage: Stage,
    /// Queries it searched.
    pub searched: usize,
    /// Of those, the queries whose answer it replaced (all of them for the first stage).
    pub kept: usize,
    /// Milliseconds it took, extraction of the views included.
    pub ms: f64,
}

/// The stages of a rechecked search of a catalogue with some suns, in order.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RecheckPlan {
    /// The share of a query's patches below which its verified first hit leaves it unsure.
    pub unsure_share: f32,
    /// The stages, the search as given first.
    pub stages: Vec<Stage>,
}

/// The search as given, each query's best images verified.
pub const AS_GIVEN: &str = "as given";
/// Turned toward the catalogue's suns.
pub const TURNED_TOWARD: &str = "turned toward the catalogue's suns";
/// Relit toward the catalogue's suns.
pub const RELIT_TOWARD: &str = "relit toward the catalogue's suns";
/// In turns and under the opposite sun.
pub const IN_TURNS: &str = "in turns and under the opposite sun";

impl RecheckPlan {
    /// The plan for a catalogue whose images are lit from `suns` (no stage toward them where
    /// there are none).
    pub fn for_suns(suns: Suns) -> Self {
        let mut stages = vec![Stage {
            name: AS_GIVEN,
            views: QueryViews::PLAIN,
            verify: FIRST_VERIFY,
            keep_share: 0.0,
        }];
        if !suns.is_empty() {
            stages.push(Stage {
                name: TURNED_TOWARD,
                views: QueryViews::toward(suns),
                verify: FIRST_VERIFY,
                keep_share: KEEP_SHARE,
            });
            stages.push(Stage {
                name: RELIT_TOWARD,
                views: QueryViews::relit_toward(suns),
                verify: FIRST_VERIFY,
                keep_share: RELIT_KEEP_SHARE,
            });
        }
        stages.push(Stage {
            name: IN_TURNS,
            views: QueryViews {
                turns: TURNS,
                opposite_sun: OppositeSun::Given,
                ..QueryViews::PLAIN
            },
            verify: AGAIN_VERIFY,
            keep_share: KEEP_SHARE,
        });
        Self {
            unsure_share: UNSURE_SHARE,
            stages,
        }
    }

    /// The plan's stages, in order, as far as their views fit in `views` per query, the
    /// query as given counted (`None`: every stage): the first stage that does not fit whole
    /// keeps the suns it has room for, the most shared first, and ends the plan. The first
    /// stage is always kept: a query is searched at least as given.
    pub fn within(mut self, views: Option<usize>) -> Self {
        let Some(budget) = views else {
            return self;
        };
        let mut left = budget.saturating_sub(self.stages[0].views.count());
        let mut kept = 1;
        for stage in &mut self.stages[1..] {
            let n = stage.views.count();
            if n <= left {
                left -= n;
                kept += 1;
                continue;
            }
            let suns = stage.views.toward;
            let per_sun = n / suns.len().max(1);
            if !suns.is_empty() && left >= per_sun {
                stage.views.toward = suns.first(left / per_sun);
                kept += 1;
            }
            break;
        }
        self.stages.truncate(kept);
        self
    }

    /// The views of a query that no stage answers, every stage run.
    pub fn views(&self) -> usize {
        self.stages.iter().map(|s| s.views.count()).sum()
    }

    /// The plan whatever the catalogue's suns: its first and last stages hold for every
    /// catalogue.
    pub fn shipped() -> Self {
        Self::for_suns(Suns::default())
    }

    /// The search as given.
    pub fn first(&self) -> &Stage {
        &self.stages[0]
    }

    /// The stages that search again, in order.
    pub fn again(&self) -> &[Stage] {
        &self.stages[1..]
    }

    /// The last stage (in turns and under the opposite sun).
    pub fn last(&self) -> &Stage {
        self.stages.last().unwrap_or(&self.stages[0])
    }

    /// The stage named `name`.
    pub fn stage(&self, name: &str) -> Option<&Stage> {
        self.stages.iter().find(|s| s.name == name)
    }

    /// Whether a query's verified `hits` leave it unsure: its first hit was verified and
    /// gathered fewer than [`RecheckPlan::unsure_share`] of the query's `patches`. A first
    /// hit that could not be verified (no image) gives no reason to search again.
    pub fn unsure(&self, hits: &[SearchHit], patches: usize) -> bool {
        hits.first()
            .and_then(|h| h.inliers)
            .is_some_and(|n| (n as f32) < self.unsure_share * patches as f32)
    }

    /// Whether a query of `patches` patches searched again by `stage` keeps its new answer
    /// `again` over `given`: the new first hit registers at least as well (as many inliers)
    /// and with at least the stage's keep share of the patches. An upright query searched
    /// again can meet a look-alike through a turned view, and a query under another sun
    /// registers in no turned view; the answer as given, verified, then stands.
    pub fn registers_better(
        stage: &Stage,
        again: &[SearchHit],
        given: &[SearchHit],
        patches: usize,
    ) -> bool {
        let inliers = |hits: &[SearchHit]| hits.first().and_then(|h| h.inliers).unwrap_or(0);
        let new = inliers(again);
        new >= inliers(given) && new as f32 >= stage.keep_share * patches as f32
    }

    /// Replaces the answers of the queries that `given` leaves [`RecheckPlan::unsure`] (of
    /// `patches` patches each) by what `search_again` answers for them where that
    /// [`RecheckPlan::registers_better`] under `stage` (by query name; a query it does not
    /// answer keeps its own). Returns how many were unsure and how many answers were
    /// replaced.
    pub fn recheck_answers(
        &self,
        stage: &Stage,
        given: &mut [QueryHits],
        patches: usize,
        search_again: &dyn Fn(&HashSet<String>) -> Result<Vec<QueryHits>>,
    ) -> Result<(usize, usize)> {
        let again: HashSet<String> = given
            .iter()
            .filter(|h| self.unsure(&h.results, patches))
            .map(|h| h.query.clone())
            .collect();
        if again.is_empty() {
            return Ok((0, 0));
        }
        let mut answers: HashMap<String, Vec<SearchHit>> = search_again(&again)?
            .into_iter()
            .map(|h| (h.query, h.results))
            .collect();
        let mut kept = 0;
        for h in given.iter_mut() {
            if let Some(r) = answers.remove(&h.query) {
                if Self::registers_better(stage, &r, &h.results, patches) {
                    h.results = r;
                    kept += 1;
                }
            }
        }
        Ok((again.len(), kept))
    }

    /// The plan in words, its numbers from its stages, those toward the catalogue's suns
    /// counted per sun: what `craterdex search --help` and the Python docstring show.
    pub fn describe() -> String {
        // one sun stands for the catalogue's: every stage is in the plan
        let plan = Self::for_suns(Suns::from_radians(&[0.0]));
        let percent = |share: f32| format!("{:.0}%", share * 100.0);
        let mut out = format!(
            "{}: each query's {} best images verified spatially; a query whose first hit \
             gathers fewer than {} of its patches as inliers (turned, mirrored, another sun) is \
             searched again",
            plan.first().name,
            plan.first().verify,
            percent(plan.unsure_share),
        );
        for s in plan.again() {
            let (when, views) = match s.views.toward.len() {
                0 => (
                    String::new(),
                    format!(
                        "{} turns each mirrored and the query with its brightness inverted: {} \
                         forward passes",
                        s.views.turns,
                        s.views.count()
                    ),
                ),
                suns => (
                    "where the catalogue's suns are known, ".to_string(),
                    format!("{} forward passes per sun", s.views.count() / suns),
                ),
            };
            out.push_str(&format!(
                "; then, {when}{} ({views}, {} verified, keeping a new first hit with at least {} \
                 of the patches)",
                s.name,
                s.verify,
                percent(s.keep_share)
            ));
        }
        out.push_str(
            "; each new answer kept only where its first hit also registers at least as well",
        );
        out
    }
}

/// What a rechecked search of a catalogue found: each query's hits and what each stage did.
pub(crate) struct Rechecked {
    pub hits: Vec<QueryHits>,
    pub stages: Vec<StageRun>,
}

/// The rechecked search in `catalogue` of the queries `features` gives (their ids and
/// features in some views), `params` as asked: as given, verified, then each stage toward the
/// catalogue's suns and the last for the queries still unsure. Where the queries' tokens are
/// no square grid nothing can be verified and the search is plain.
pub(crate) fn run(
    catalogue: &dyn Catalogue,
    features: &QueryFeatures,
    params: &SearchParams,
    most_views: Option<usize>,
    progress: &dyn Progress,
) -> Result<Rechecked> {
    let t = std::time::Instant::now();
    let (ids, plain) = features(None, QueryViews::PLAIN)?;
    let Some(side) = craterdex_tokens::verify::grid_side(plain.tokens) else {
        let per_query = encode_in_views(catalogue, &plain, QueryViews::PLAIN)?;
        let hits = catalogue.search_views(&per_query, QueryViews::PLAIN, params)?;
        return Ok(Rechecked {
            hits: QueryHits::named(&ids, hits),
            stages: Vec::new(),
        });
    };
    let search = |stage: &Stage, ids: &[String], features: &FeatureSet| {
        catalogue.search_variants_verified(
            ids,
            features,
            stage.views,
            params,
            stage.verify,
            progress,
        )
    };
    let shipped = RecheckPlan::shipped();
    let mut hits = search(shipped.first(), &ids, &plain)?;
    let mut stages = vec![StageRun {
        stage: *shipped.first(),
        searched: hits.len(),
        kept: hits.len(),
        ms: ms_since(t),
    }];
    let patches = side * side;
    if most_views.is_some_and(|v| v <= 1)
        || !hits.iter().any(|h| shipped.unsure(&h.results, patches))
    {
        return Ok(Rechecked { hits, stages });
    }
    // the stages toward the suns need the catalogue's: measured once some query needs them
    let plan = RecheckPlan::for_suns(catalogue.suns()?).within(most_views);
    for stage in plan.again() {
        go_on(progress)?;
        let t = std::time::Instant::now();
        let (searched, kept) = plan.recheck_answers(stage, &mut hits, patches, &|unsure| {
            let (ids, in_views) = features(Some(unsure), stage.views)?;
            search(stage, &ids, &in_views)
        })?;
        let run = StageRun {
            stage: *stage,
            searched,
            kept,
            ms: ms_since(t),
        };
        if let Some(note) = stage_note(&stages, &run, hits.len()) {
            progress.stage_ran(&note);
        }
        stages.push(run);
    }
    Ok(Rechecked { hits, stages })
}

/// What `run`, a stage searching again after `before` (the first stage included), did for
/// `queries` queries, in words; `None` where it searched none.
pub fn stage_note(before: &[StageRun], run: &StageRun, queries: usize) -> Option<String> {
    if run.searched == 0 {
        return None;
    }
    let before: Vec<&str> = before
        .iter()
        .skip(1)
        .filter(|s| s.searched > 0)
        .map(|s| s.stage.name)
        .collect();
    let nor = match before.as_slice() {
        [] => String::new(),
        names => format!(" nor {}", names.join(" or ")),
    };
    let suns = match run.stage.views.toward.is_empty() {
        true => String::new(),
        false => format!(" ({})", run.stage.views.toward),
    };
    Some(format!(
        "{} of {queries} queries did not register with their first hit{nor}: searched again {}{suns}",
        run.searched, run.stage.name,
    ))
}

/// The stages of a search in batches ([`crate::search_streamed`]) summed stage by stage, in
/// the order they first ran: queries searched, answers kept and time.
pub fn sum_stages(total: &mut Vec<StageRun>, batch: &[StageRun]) {
    for run in batch {
        match total.iter_mut().find(|t| t.stage == run.stage) {
            Some(t) => {
                t.searched += run.searched;
                t.kept += run.kept;
                t.ms += run.ms;
            }
            None => total.push(run.clone()),
        }
    }
}

fn ms_since(t: std::time::Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(id: &str, inliers: Option<usize>) -> SearchHit {
        SearchHit {
            rank: 1,
            inliers,
            ..SearchHit::for_test(id, None, 0.5)
        }
    }

    fn answer(query: &str, first: SearchHit) -> QueryHits {
        QueryHits {
            query: query.into(),
            results: vec![first],
        }
    }

    fn ran(stage: &Stage, searched: usize, kept: usize) -> StageRun {
        StageRun {
            stage: *stage,
            searched,
            kept,
            ms: 1.0,
        }
    }

    #[test]
    fn a_streamed_search_sums_its_batches_stages_into_one_note_each() {
        let plan = RecheckPlan::for_suns(Suns::from_radians(&[0.0]));
        let [first, turned, relit, turns] = [0, 1, 2, 3].map(|i| &plan.stages[i]);
        // a batch that registered at once, then two that searched again
        let batches = [
            vec![ran(first, 16, 16)],
            vec![
                ran(first, 16, 16),
                ran(turned, 5, 2),
                ran(relit, 3, 0),
                ran(turns, 3, 1),
            ],
            vec![
                ran(first, 4, 4),
                ran(turned, 4, 1),
                ran(relit, 0, 0),
                ran(turns, 3, 3),
            ],
        ];
        let mut total = Vec::new();
        for b in &batches {
            sum_stages(&mut total, b);
        }
        let counts: Vec<(&str, usize, usize)> = total
            .iter()
            .map(|r| (r.stage.name, r.searched, r.kept))
            .collect();
        assert_eq!(
            counts,
            [
                (AS_GIVEN, 36, 36),
                (TURNED_TOWARD, 9, 3),
                (RELIT_TOWARD, 3, 0),
                (IN_TURNS, 6, 4)
            ]
        );
        assert_eq!(total[1].ms, 2.0);
        let notes: Vec<String> = (1..total.len())
            .filter_map(|n| stage_note(&total[..n], &total[n], 36))
            .collect();
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(
            notes[0].starts_with("9 of 36 queries did not register with their first hit: "),
            "{notes:?}"
        );
        assert!(notes[2].starts_with(&format!(
            "6 of 36 queries did not register with their first hit nor {TURNED_TOWARD} or \
             {RELIT_TOWARD}: searched again {IN_TURNS}"
        )));
        // a stage that searched nothing says nothing
        assert_eq!(stage_note(&total[..1], &ran(turned, 0, 0), 36), None);
    }

    #[test]
    fn a_query_whose_first_hit_does_not_register_is_answered_again() {
        let patches = 256;
        let plan = RecheckPlan::for_suns(Suns::from_radians(&[0.0]));
        let unsure = |hits: &[SearchHit], patches| plan.unsure(hits, patches);
        let least = (UNSURE_SHARE * patches as f32).ceil() as usize;
        assert!(!unsure(&[hit("a", Some(least))], patches));
        assert!(unsure(&[hit("a", Some(least - 1))], patches));
        // nothing verified, or nothing found: no reason to search again
        assert!(!unsure(&[hit("a", None)], patches));
        assert!(!unsure(&[], patches));
        let (turned, relit) = (
            *plan.stage(IN_TURNS).unwrap(),
            *plan.stage(RELIT_TOWARD).unwrap(),
        );
        assert_eq!(
            (turned.keep_share, relit.keep_share),
            (KEEP_SHARE, RELIT_KEEP_SHARE)
        );
        let recheck_answers =
            |given: &mut [QueryHits],
             patches,
             stage: Stage,
             again: &dyn Fn(&HashSet<String>) -> Result<Vec<QueryHits>>| {
                plan.recheck_answers(&stage, given, patches, again)
                    .map(|(searched, _)| searched)
            };
        let registers_better = |again: &[SearchHit], given: &[SearchHit], patches, stage: Stage| {
            RecheckPlan::registers_better(&stage, again, given, patches)
        };
        let mut given = vec![
            answer("registers", hit("x", Some(200))),
            answer("turned", hit("wrong", Some(20))),
            answer("no image", hit("y", None)),
            answer("turned too", hit("wrong", Some(3))),
            answer("upright, unsure", hit("own", Some(60))),
            answer("relit", hit("own, verified", Some(30))),
        ];
        let asked = std::sync::Mutex::new(Vec::new());
        let again = recheck_answers(&mut given, patches, turned, &|ids| {
            let mut ids: Vec<String> = ids.iter().cloned().collect();
            ids.sort();
            asked.lock().unwrap().extend(ids.clone());
            // the second search answers three of the four (one image was unreadable): one
            // through a look-alike that registers worse than the answer as given, one better
            // than it but with too few inliers to register at all
            Ok(vec![
                answer("turned", hit("right", Some(150))),
                answer("upright, unsure", hit("look-alike", Some(40))),
                answer("relit", hit("turned look-alike", Some(50))),
            ])
        })
        .unwrap();
        assert_eq!(again, 4);
        assert_eq!(
            *asked.lock().unwrap(),
            ["relit", "turned", "turned too", "upright, unsure"]
        );
        let firsts: Vec<&str> = given.iter().map(|h| h.results[0].id.as_str()).collect();
        assert_eq!(firsts, ["x", "right", "y", "wrong", "own", "own, verified"]);
        // the new answer must register as well as the old and with its own share of inliers
        let keep = (KEEP_SHARE * patches as f32).ceil() as usize;
        let old = [hit("old", Some(10))];
        let k = turned;
        assert!(registers_better(
            &[hit("new", Some(keep))],
            &old,
            patches,
            k
        ));
        let fewer = [hit("new", Some(keep - 1))];
        assert!(!registers_better(&fewer, &old, patches, k));
        // a search with a lower share of its own keeps it
        assert!(registers_better(&fewer, &old, patches, relit));
        assert!(!registers_better(
            &[hit("new", Some(keep + 5))],
            &[hit("old", Some(keep + 6))],
            patches,
            k
        ));
        // every query registering: no second search at all
        let mut sure = vec![answer("registers", hit("x", Some(200)))];
        let none =
            recheck_answers(&mut sure, patches, turned, &|_| panic!("searched again")).unwrap();
        assert_eq!(none, 0);
    }

    #[test]
    fn the_plan_runs_toward_the_suns_only_where_there_are_suns() {
        let none = RecheckPlan::for_suns(Suns::default());
        let names: Vec<&str> = none.stages.iter().map(|s| s.name).collect();
        assert_eq!(names, [AS_GIVEN, IN_TURNS]);
        assert_eq!(none.last().views.count(), 2 * TURNS + 1);
        let two = RecheckPlan::for_suns(Suns::from_radians(&[0.0, 3.0]));
        let names: Vec<&str> = two.stages.iter().map(|s| s.name).collect();
        assert_eq!(names, [AS_GIVEN, TURNED_TOWARD, RELIT_TOWARD, IN_TURNS]);
        assert_eq!(two.stage(TURNED_TOWARD).unwrap().views.count(), 4);
        assert!(two.stage(RELIT_TOWARD).unwrap().views.relit);
        // the description carries the plan's own numbers, every stage's
        let words = RecheckPlan::describe();
        for n in [
            "50 best",
            "40%",
            "200 verified",
            "25 forward passes",
            "20%",
            "where the catalogue's suns are known, turned toward",
            "2 forward passes per sun",
        ] {
            assert!(words.contains(n), "{n} in {words}");
        }
    }

    #[test]
    fn a_bound_on_views_keeps_the_stages_that_fit_in_order() {
        let stages = |plan: &RecheckPlan| -> Vec<(&str, usize)> {
            plan.stages
                .iter()
                .map(|s| (s.name, s.views.count()))
                .collect()
        };
        let one = RecheckPlan::for_suns(Suns::from_radians(&[1.0]));
        assert_eq!(one.views(), 1 + 2 + 2 + 2 * TURNS + 1);
        assert_eq!(one.clone().within(None), one);
        let within = |plan: &RecheckPlan, n| plan.clone().within(Some(n));
        assert_eq!(stages(&within(&one, 1)), [(AS_GIVEN, 1)]);
        assert_eq!(stages(&within(&one, 0)), [(AS_GIVEN, 1)]);
        assert_eq!(
            stages(&within(&one, 3)),
            [(AS_GIVEN, 1), (TURNED_TOWARD, 2)]
        );
        assert_eq!(
            stages(&within(&one, 4)),
            [(AS_GIVEN, 1), (TURNED_TOWARD, 2)]
        );
        assert_eq!(
            stages(&within(&one, 29)),
            [(AS_GIVEN, 1), (TURNED_TOWARD, 2), (RELIT_TOWARD, 2)]
        );
        assert_eq!(within(&one, 30), one);
        // two suns: a stage that does not fit whole keeps the most shared sun, and ends it
        let two = RecheckPlan::for_suns(Suns::from_radians(&[1.0, 3.0]));
        let three = within(&two, 3);
        assert_eq!(stages(&three), [(AS_GIVEN, 1), (TURNED_TOWARD, 2)]);
        assert_eq!(three.stages[1].views.toward, Suns::from_radians(&[1.0]));
        assert_eq!(
            stages(&within(&two, 7)),
            [(AS_GIVEN, 1), (TURNED_TOWARD, 4), (RELIT_TOWARD, 2)]
        );
        // the most any plan runs, what a bound may ask for
        let most = Suns::from_radians(&[1.0, 2.0, 3.0, 4.0][..crate::MAX_SUNS]);
        assert_eq!(
            RecheckPlan::for_suns(most).views(),
            crate::MAX_RECHECK_VIEWS
        );
        // no suns: the turns fit whole or not at all
        let none = RecheckPlan::for_suns(Suns::default());
        assert_eq!(stages(&within(&none, 3)), [(AS_GIVEN, 1)]);
        assert_eq!(within(&none, 26), none);
    }
}
