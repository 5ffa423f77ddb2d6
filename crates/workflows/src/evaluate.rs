//! How good links are against the true correspondence, and the baseline catalogue merges
//! use today (nearest centre within a tolerance and a diameter ratio).

use crate::error::Error;
use crate::geometry::{largest_diameter, Position, SpatialGrid};
use crate::link::{Decision, LinkRow};
use craterdex_errors::ensure;
use craterdex_index::ImageMeta;
use serde::Serialize;
use std::collections::BTreeSet;

/// Pair quality of `match` decisions: an entry is known when its crater is in the index;
/// a match is right when its best candidate is that crater.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LinkScore {
    pub entries: usize,
    pub known: usize,
    pub matched: usize,
    pub correct: usize,
    pub precision: f64,
    pub recall: f64,
    pub f1: f64,
    /// Why the rule could not be calibrated, when it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration_failed: Option<String>,
}

impl LinkScore {
    /// From (truth crater id, predicted crater id when matched) per entry.
    pub fn from_predictions<'a>(
        predictions: impl IntoIterator<Item = (Option<&'a str>, Option<&'a str>)>,
        known_craters: &BTreeSet<String>,
    ) -> LinkScore {
        let mut s = LinkScore::default();
        for (truth, predicted) in predictions {
            s.entries += 1;
            s.known += truth.is_some_and(|t| known_craters.contains(t)) as usize;
            if let Some(p) = predicted {
                s.matched += 1;
                s.correct += (truth == Some(p)) as usize;
            }
        }
        s.precision = if s.matched == 0 {
            1.0
        } else {
            s.correct as f64 / s.matched as f64
        };
        s.recall = if s.known == 0 {
            1.0
        } else {
            s.correct as f64 / s.known as f64
        };
        s.f1 = if s.precision + s.recall == 0.0 {
            0.0
        } else {
            2.0 * s.precision * s.recall / (s.precision + s.recall)
        };
        s
    }

    pub fn of_rows(rows: &[LinkRow], known_craters: &BTreeSet<String>) -> LinkScore {
        Self::from_predictions(
            rows.iter().map(|r| {
                let predicted = (r.decision == Decision::Match)
                    .then(|| r.best.as_ref().and_then(|b| b.crater_id.as_deref()))
                    .flatten();
                (r.query.crater_id.as_deref(), predicted)
            }),
            known_craters,
        )
    }
}

/// The geometry-only rule: for each query, the index entry with the nearest centre among
/// those within `tolerance_radii` radii of the larger crater and a diameter ratio of at
/// most `max_ratio`; None when there is none or the query has no position.
pub fn geometry_only<'a>(
    queries: &[ImageMeta],
    index: &'a [ImageMeta],
    tolerance_radii: f64,
    max_ratio: f64,
    body_radius_km: f64,
) -> Vec<Option<&'a ImageMeta>> {
    let items: Vec<(usize, Position)> = index
        .iter()
        .enumerate()
        .filter_map(|(i, m)| Some((i, Position::of(m)?)))
        .collect();
    let largest = largest_diameter(items.iter().map(|(_, p)| *p));
    let grid = SpatialGrid::of(items, tolerance_radii, max_ratio, body_radius_km, largest);
    queries
        .iter()
        .map(|q| {
            let near = grid.near(Position::of(q)?);
            near.first().map(|&(i, _, _)| &index[i])
        })
        .collect()
}

/// Area under the ROC curve of `score` separating `positives` from `negatives` (ties count
/// half): the probability that a random positive outscores a random negative.
pub fn auroc(positives: &[f64], negatives: &[f64]) -> f64 {
    if positives.is_empty() || negatives.is_empty() {
        return f64::NAN;
    }
    let mut all: Vec<(f64, bool)> = positives
        .iter()
        .map(|&s| (s, true))
        .chain(negatives.iter().map(|&s| (s, false)))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Mann-Whitney: sum of the positives' (tie-averaged) ranks
    let mut rank_sum = 0.0;
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j < all.len() && all[j].0 == all[i].0 {
            j += 1;
        }
        let mid = (i + j + 1) as f64 / 2.0;
        rank_sum += mid * all[i..j].iter().filter(|x| x.1).count() as f64;
        i = j;
    }
    let (p, n) = (positives.len() as f64, negatives.len() as f64);
    (rank_sum - p * (p + 1.0) / 2.0) / (p * n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(id: &str, crater: &str, x: f64, y: f64, d: f64) -> ImageMeta {
        ImageMeta {
            id: id.into(),
            crater_id: Some(crater.into()),
            x: Some(x),
            y: Some(y),
            diameter_px: Some(d),
            ..Default::default()
        }
    }

    #[test]
    fn geometry_only_takes_the_nearest_allowed_centre() {
        let index = vec![
            at("a", "A", 0.0, 0.0, 10.0),
            at("b", "B", 12.0, 0.0, 10.0),
            at("c", "C", 3.0, 0.0, 30.0),
            at("far", "F", 5000.0, 0.0, 10.0),
        ];
        let queries = vec![
            at("q1", "B", 8.0, 0.0, 10.0),   // b is 4 px = 0.8 radii away, a 1.6
            at("q2", "A", 1.0, 0.0, 10.0),   // c is nearer but 3x the size
            at("q3", "X", 100.0, 0.0, 10.0), // nothing within a radius
            ImageMeta::default(),
        ];
        let got: Vec<Option<&str>> = geometry_only(&queries, &index, 1.0, 1.5, 1.0)
            .into_iter()
            .map(|m| m.map(|m| m.id.as_str()))
            .collect();
        assert_eq!(got, vec![Some("b"), Some("a"), None, None]);
    }

    #[test]
    fn scores_and_auroc() {
        let known: BTreeSet<String> = ["A", "B"].map(String::from).into();
        let s = LinkScore::from_predictions(
            [
                (Some("A"), Some("A")),
                (Some("B"), Some("A")),
                (Some("N"), None),
                (Some("N2"), Some("B")),
            ],
            &known,
        );
        assert_eq!((s.known, s.matched, s.correct), (2, 3, 1));
        assert!((s.precision - 1.0 / 3.0).abs() < 1e-12 && (s.recall - 0.5).abs() < 1e-12);
        assert_eq!(auroc(&[3.0, 4.0], &[1.0, 2.0]), 1.0);
        assert_eq!(auroc(&[1.0], &[1.0]), 0.5);
        assert!((auroc(&[1.0, 3.0], &[2.0]) - 0.5).abs() < 1e-12);
    }
}

/// One error level of the link benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct LevelReport {
    /// Georeferencing error in median crater radii.
    pub georef_error: f64,
    /// The search radius the unregistered rule used (radii of the larger crater).
    pub search_radius: f64,
    /// The rule calibrated without registration.
    pub calibrated_rule: crate::LinkRule,
    /// The default rule with registration, not calibrated: what a user gets.
    pub default_rule: LinkScore,
    /// Registration, then the rule calibrated on the other half.
    pub registered_calibrated: LinkScore,
    /// Registration, then the nearest registered centre within 1 radius (no appearance).
    pub registration_only: LinkScore,
    /// Without registration, the rule calibrated on the other half (the method shipped
    /// before registration).
    pub unregistered_calibrated: LinkScore,
    pub appearance_only: LinkScore,
    /// Nearest centre within 1 radius, diameter ratio <= 1.5.
    pub geometry_only: LinkScore,
    /// Nearest centre within the search radius, diameter ratio <= 1.5.
    pub geometry_only_wide: LinkScore,
    /// Both observations in one index, the default rule with registration.
    pub dedup: crate::dedup::DedupScore,
    /// The same without registration, the calibrated rule.
    pub dedup_unregistered: crate::dedup::DedupScore,
    pub registration: RegistrationSummary,
}

/// How registering the scored half's sources went at one error level.
#[derive(Clone, Debug, Serialize)]
pub struct RegistrationSummary {
    pub sources: usize,
    pub registered: usize,
    /// Median over sources of the median inlier residual, in radii.
    pub median_residual_radii: f64,
    pub inliers: usize,
    /// Slowest source's registration time, and its entry count.
    pub slowest_ms: f64,
    pub slowest_entries: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct OpenSetReport {
    pub entries: usize,
    pub known: usize,
    /// Share of entries whose known/new decision is right (`new` vs anything else).
    pub known_new_accuracy: f64,
    /// AUROC of the new-crater score (one minus the best candidate's confidence; no
    /// candidate left by geometry counts as certainly new).
    pub new_auroc: f64,
    /// Known entries whose best candidate is their crater.
    pub top1_known: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct LinkBenchReport {
    pub first_entries: usize,
    pub second_entries: usize,
    pub target_precision: f64,
    pub levels: Vec<LevelReport>,
    /// The default rule with registration.
    pub open_set: OpenSetReport,
    /// The smallest error level's calibrated rule without registration.
    pub open_set_unregistered: OpenSetReport,
}

/// What the link benchmark is given: the first observation's features and metadata (the
/// catalogue) and the second observation's features with its metadata at each
/// georeferencing error level.
pub struct LinkBenchInput<'a> {
    pub first: &'a craterdex_engine::FeatureSet,
    pub first_metas: Vec<ImageMeta>,
    pub second: &'a craterdex_engine::FeatureSet,
    pub second_metas: Vec<(f64, Vec<ImageMeta>)>,
    /// The model, so that registered observations' crops are compared turned to the
    /// catalogue's orientation (entries name their image files).
    pub extractor: Option<std::sync::Arc<craterdex_engine::Extractor>>,
}

/// FNV-1a of a crater id: a split that does not depend on order.
fn crater_hash(m: &ImageMeta) -> u64 {
    m.crater_id
        .as_deref()
        .unwrap_or(&m.id)
        .bytes()
        .fold(0xcbf29ce484222325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100000001b3)
        })
}

fn without_positions(entries: &[(ImageMeta, craterdex_tokens::Descriptors)]) -> Entries {
    entries
        .iter()
        .map(|(m, d)| {
            let m = ImageMeta {
                x: None,
                y: None,
                diameter_px: None,
                lat: None,
                lon: None,
                diameter_km: None,
                ..m.clone()
            };
            (m, d.clone())
        })
        .collect()
}

type Entries = Vec<(ImageMeta, craterdex_tokens::Descriptors)>;

/// Calibrates on `calib` (labelled), then links `test` with the calibrated rule.
fn calibrate_then_link(
    engine: &craterdex_engine::Engine,
    calib: Entries,
    test: Entries,
    base: &crate::LinkRule,
    target: f64,
    known: &BTreeSet<String>,
    register: bool,
) -> crate::Result<(crate::LinkRule, LinkScore, Vec<LinkRow>)> {
    let opts = crate::LinkOptions {
        register,
        ..Default::default()
    };
    let silent = craterdex_engine::Silent;
    let (rows, _) = crate::link(engine, calib, base, &opts, &silent)?;
    // a benchmark reports a calibration that cannot be made rather than stopping
    let (rule, note) = match crate::calibrate(&rows, base, target) {
        Ok(c) => (c.rule, None),
        Err(e) => (
            base.clone(),
            Some(format!("{e:#}; the default rule was used")),
        ),
    };
    let (rows, _) = crate::link(engine, test, &rule, &opts, &silent)?;
    let mut score = LinkScore::of_rows(&rows, known);
    score.calibration_failed = note;
    Ok((rule, score, rows))
}

/// Links the second observation to the first at every error level: the rule calibrated
/// on half of the craters (split by crater id), scored on the other half, against
/// appearance alone and geometry alone; dedup of both observations in one index; and an
/// open-set stream against an index holding half of the craters. With `review_dir`, the
/// review page of the last level's scored half goes there.
pub fn link_benchmark(
    input: LinkBenchInput,
    recipe: &craterdex_engine::IndexRecipe,
    target_precision: f64,
    review_dir: Option<&std::path::Path>,
    progress: &dyn craterdex_engine::Progress,
) -> crate::Result<LinkBenchReport> {
    use crate::dedup::frames_of_index;
    use crate::{dedup, link, DedupOptions, Frames, LinkOptions, LinkRule};
    use craterdex_engine::{encode_all, Engine, Silent};
    ensure!(
        !input.second_metas.is_empty(),
        Error::Invalid("no georeferencing error level".into())
    );
    let encoder = recipe.learn_encoder(input.first, None, &[], progress)?;
    let first_descs = encode_all(&encoder, input.first);
    let second_descs = encode_all(&encoder, input.second);
    let dim = input.first.dim;
    let catalogue = |metas: Vec<ImageMeta>, descs: Vec<craterdex_tokens::Descriptors>| {
        recipe
            .index_from_descriptors(&encoder, dim, descs, metas, None)
            .and_then(|i| Engine::new(i, input.extractor.clone()))
    };
    let engine = catalogue(input.first_metas.clone(), first_descs.clone())?;
    let opts = LinkOptions::default();
    let known: BTreeSet<String> = input
        .first_metas
        .iter()
        .filter_map(|m| m.crater_id.clone())
        .collect();
    let mut levels = Vec::new();
    let mut small_rule = None;
    progress.start("link benchmark", input.second_metas.len() + 1);
    for (li, (error, metas)) in input.second_metas.iter().enumerate() {
        let entries: Vec<(ImageMeta, craterdex_tokens::Descriptors)> = metas
            .iter()
            .cloned()
            .zip(second_descs.iter().cloned())
            .collect();
        let (calib, test): (Vec<_>, Vec<_>) = entries
            .iter()
            .cloned()
            .partition(|(m, _)| crater_hash(m).is_multiple_of(2));
        let search_radius = 2.0 * error + 1.0;
        let base = LinkRule {
            max_offset_radii: search_radius,
            ..LinkRule::default()
        };
        let (rule, unregistered, _) = calibrate_then_link(
            &engine,
            calib.clone(),
            test.clone(),
            &base,
            target_precision,
            &known,
            false,
        )?;
        let (_, registered_calibrated, _) = calibrate_then_link(
            &engine,
            calib.clone(),
            test.clone(),
            &base,
            target_precision,
            &known,
            true,
        )?;
        let default_rule = LinkRule::default();
        let (rows, _) = link(&engine, test.clone(), &default_rule, &opts, &Silent)?;
        let default_score = LinkScore::of_rows(&rows, &known);
        if let Some(dir) = review_dir {
            // the last (largest) error level's decisions are the ones worth a look
            crate::review::write_review(dir, &rows, 300)?;
        }
        let (_, appearance, _) = calibrate_then_link(
            &engine,
            without_positions(&calib),
            without_positions(&test),
            &base,
            target_precision,
            &known,
            false,
        )?;
        let test_metas: Vec<ImageMeta> = test.iter().map(|(m, _)| m.clone()).collect();
        let geometry = |queries: &[ImageMeta], tolerance: f64| {
            let found = geometry_only(queries, &input.first_metas, tolerance, 1.5, 1.0);
            LinkScore::from_predictions(
                queries.iter().zip(found).map(|(q, m)| {
                    (
                        q.crater_id.as_deref(),
                        m.and_then(|m| m.crater_id.as_deref()),
                    )
                }),
                &known,
            )
        };
        let (frames, summary) = timed_registration(engine.index(), &test_metas);
        let placed: Vec<ImageMeta> = test_metas
            .iter()
            .map(|m| frames.place(m).meta.into_owned())
            .collect();
        let both = catalogue(
            input.first_metas.iter().chain(metas).cloned().collect(),
            first_descs.iter().chain(&second_descs).cloned().collect(),
        )?;
        let dedup_frames = frames_of_index(both.index(), &default_rule, &DedupOptions::default());
        let groups = dedup(
            &both,
            &default_rule,
            &DedupOptions::default(),
            &dedup_frames,
            &Silent,
        )?;
        let unregistered_groups = dedup(
            &both,
            &rule,
            &DedupOptions {
                register: false,
                ..Default::default()
            },
            &Frames::none(),
            &Silent,
        )?;
        let all_metas: Vec<ImageMeta> = input.first_metas.iter().chain(metas).cloned().collect();
        if li == 0 {
            small_rule = Some(rule.clone());
        }
        levels.push(LevelReport {
            georef_error: *error,
            search_radius,
            calibrated_rule: rule,
            default_rule: default_score,
            registered_calibrated,
            registration_only: geometry(&placed, 1.0),
            unregistered_calibrated: unregistered,
            appearance_only: appearance,
            geometry_only: geometry(&test_metas, 1.0),
            geometry_only_wide: geometry(&test_metas, search_radius),
            dedup: crate::dedup::score_groups(&groups, &all_metas),
            dedup_unregistered: crate::dedup::score_groups(&unregistered_groups, &all_metas),
            registration: summary,
        });
        progress.advance(li + 1);
    }
    // open set: an index of half the craters; the test half of the second observation
    // (smallest error) streams in, half of it known
    let rule = small_rule.expect("one level at least");
    let opts = LinkOptions::default();
    let half: Vec<usize> = (0..input.first_metas.len())
        .filter(|&i| (crater_hash(&input.first_metas[i]) >> 1).is_multiple_of(2))
        .collect();
    let half_known: BTreeSet<String> = half
        .iter()
        .filter_map(|&i| input.first_metas[i].crater_id.clone())
        .collect();
    let half_engine = catalogue(
        half.iter().map(|&i| input.first_metas[i].clone()).collect(),
        half.iter().map(|&i| first_descs[i].clone()).collect(),
    )?;
    let stream: Vec<(ImageMeta, craterdex_tokens::Descriptors)> = input.second_metas[0]
        .1
        .iter()
        .cloned()
        .zip(second_descs.iter().cloned())
        .filter(|(m, _)| crater_hash(m) % 2 == 1)
        .collect();
    let unregistered_opts = LinkOptions {
        register: false,
        ..Default::default()
    };
    let (rows, _) = link(
        &half_engine,
        stream.clone(),
        &LinkRule::default(),
        &opts,
        &Silent,
    )?;
    let open_set = open_set_report(&rows, &half_known);
    let (rows, _) = link(&half_engine, stream, &rule, &unregistered_opts, &Silent)?;
    let open_set_unregistered = open_set_report(&rows, &half_known);
    progress.finish();
    Ok(LinkBenchReport {
        first_entries: input.first_metas.len(),
        second_entries: input.second.len(),
        target_precision,
        levels,
        open_set,
        open_set_unregistered,
    })
}

/// Known/new accuracy, the AUROC of "new" by one minus the best candidate's confidence,
/// and top-1 on the known entries.
fn open_set_report(rows: &[LinkRow], known: &BTreeSet<String>) -> OpenSetReport {
    let is_known = |r: &LinkRow| {
        r.query
            .crater_id
            .as_ref()
            .is_some_and(|c| known.contains(c))
    };
    let new_score = |r: &LinkRow| 1.0 - r.best.as_ref().map_or(0.0, |b| b.confidence);
    let (mut pos, mut neg) = (Vec::new(), Vec::new());
    let (mut right, mut top1, mut n_known) = (0usize, 0usize, 0usize);
    for r in rows {
        let known_here = is_known(r);
        right += ((r.decision == Decision::New) != known_here) as usize;
        if known_here {
            n_known += 1;
            neg.push(new_score(r));
            top1 += (r.best.as_ref().and_then(|b| b.crater_id.as_ref())
                == r.query.crater_id.as_ref()) as usize;
        } else {
            pos.push(new_score(r));
        }
    }
    OpenSetReport {
        entries: rows.len(),
        known: n_known,
        known_new_accuracy: right as f64 / rows.len().max(1) as f64,
        new_auroc: auroc(&pos, &neg),
        top1_known: top1 as f64 / n_known.max(1) as f64,
    }
}

/// The registration of `entries`' sources to `index` as linking does it, timed per source.
fn timed_registration(
    index: &craterdex_index::Index,
    entries: &[ImageMeta],
) -> (crate::Frames, RegistrationSummary) {
    use crate::register::{Frames, RegisterOptions};
    let body = crate::LinkRule::default().body_radius_km;
    let mut sources: Vec<Option<String>> = entries.iter().map(|m| m.source.clone()).collect();
    sources.sort();
    sources.dedup();
    let (mut slowest_ms, mut slowest_entries) = (0.0, 0);
    let mut frames = Frames::none();
    for s in &sources {
        let part: Vec<ImageMeta> = entries.iter().filter(|m| &m.source == s).cloned().collect();
        let t = std::time::Instant::now();
        let one = Frames::of_entries(index, &part, &RegisterOptions::default(), body);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if ms > slowest_ms {
            (slowest_ms, slowest_entries) = (ms, part.len());
        }
        frames.extend(one);
    }
    let regs = frames.registrations();
    let mut residuals: Vec<f64> = regs
        .iter()
        .filter(|r| r.registered)
        .filter_map(|r| r.residual_radii)
        .collect();
    residuals.sort_by(f64::total_cmp);
    let summary = RegistrationSummary {
        sources: regs.len(),
        registered: regs.iter().filter(|r| r.registered).count(),
        median_residual_radii: residuals
            .get(residuals.len() / 2)
            .copied()
            .unwrap_or(f64::NAN),
        inliers: regs
            .iter()
            .filter(|r| r.registered)
            .map(|r| r.inliers)
            .sum(),
        slowest_ms,
        slowest_entries,
    };
    (frames, summary)
}
