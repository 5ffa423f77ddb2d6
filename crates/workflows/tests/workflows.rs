//! link, calibrate, insert-new and dedup on synthetic catalogues whose truth is known: two
//! views of every crater in the index, noisy re-observations and unseen craters as queries.

use craterdex_engine::{Engine, Silent};
use craterdex_index::codec::{Codec, TokenCodec};
use craterdex_index::{ImageMeta, Index};
use craterdex_tokens::{Descriptors, Encoder, Recipe};
use craterdex_workflows::dedup::{frames_of_index, score_groups, DedupScore};
use craterdex_workflows::{
    calibrate, dedup, link, Decision, DedupGroup, DedupOptions, LinkOptions, LinkRule,
};
use rand::{Rng, SeedableRng};
use std::path::Path;

const D: usize = 32;
const K: usize = 4;
type Rng8 = rand_chacha::ChaCha8Rng;

fn unit(rng: &mut Rng8, n: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..n * D).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    for r in v.chunks_mut(D) {
        let s = r.iter().map(|x| x * x).sum::<f32>().sqrt();
        r.iter_mut().for_each(|x| *x /= s);
    }
    v
}

fn crater(rng: &mut Rng8) -> Descriptors {
    Descriptors {
        single: unit(rng, 1),
        tokens: unit(rng, K),
    }
}

fn noisy(d: &Descriptors, amount: f32, rng: &mut Rng8) -> Descriptors {
    let mut f = |v: &[f32]| -> Vec<f32> {
        let mut out: Vec<f32> = v
            .iter()
            .map(|x| x + rng.gen_range(-amount..amount))
            .collect();
        for r in out.chunks_mut(D) {
            let s = r.iter().map(|x| x * x).sum::<f32>().sqrt();
            r.iter_mut().for_each(|x| *x /= s);
        }
        out
    };
    Descriptors {
        single: f(&d.single),
        tokens: f(&d.tokens),
    }
}

fn meta(id: &str, crater: usize, source: &str) -> ImageMeta {
    ImageMeta {
        id: id.into(),
        crater_id: Some(format!("c{crater}")),
        source: Some(source.into()),
        // craters on a grid 0.5 degrees apart, 2 km across
        lat: Some((crater / 40) as f64 * 0.5),
        lon: Some((crater % 40) as f64 * 0.5),
        diameter_km: Some(2.0),
        ..Default::default()
    }
}

struct Catalogue {
    truth: Vec<Descriptors>,
    entries: Vec<(ImageMeta, Descriptors)>,
}

/// `n` craters, two views each (images `a` and `b` of the crater).
fn catalogue(n: usize, seed: u64) -> Catalogue {
    let mut rng = Rng8::seed_from_u64(seed);
    let truth: Vec<Descriptors> = (0..n).map(|_| crater(&mut rng)).collect();
    let mut entries = Vec::new();
    for (i, t) in truth.iter().enumerate() {
        for v in ["a", "b"] {
            entries.push((
                meta(&format!("g{i}{v}"), i, &format!("img{i}{v}")),
                noisy(t, 0.1, &mut rng),
            ));
        }
    }
    Catalogue { truth, entries }
}

fn build(dir: &Path, entries: &[(ImageMeta, Descriptors)]) -> Engine {
    let sample: Vec<f32> = entries.iter().flat_map(|(_, d)| d.tokens.clone()).collect();
    let codec = TokenCodec::train(Codec::Int8, D, &sample, 1).unwrap();
    Index::create(
        dir,
        &Encoder::plain(Recipe::default()),
        &codec,
        None,
        entries,
        None,
    )
    .unwrap();
    Engine::open(dir, None).unwrap()
}

/// Re-observations of craters `known` (noise growing with the index, so some are hard) and
/// `unseen` craters no index entry shows.
fn queries(
    cat: &Catalogue,
    known: std::ops::Range<usize>,
    unseen: usize,
    seed: u64,
) -> Vec<(ImageMeta, Descriptors)> {
    let mut rng = Rng8::seed_from_u64(seed);
    let mut out = Vec::new();
    for i in known {
        let amount = 0.1 + 0.5 * (i % 10) as f32 / 10.0;
        out.push((
            meta(&format!("q{seed}-{i}"), i, &format!("new{seed}")),
            noisy(&cat.truth[i], amount, &mut rng),
        ));
    }
    for j in 0..unseen {
        let mut m = meta(&format!("u{seed}-{j}"), 100_000 + j, &format!("new{seed}"));
        m.lat = Some(80.0);
        out.push((m, crater(&mut rng)));
    }
    out
}

fn no_geometry(mut q: Vec<(ImageMeta, Descriptors)>) -> Vec<(ImageMeta, Descriptors)> {
    for (m, _) in &mut q {
        m.lat = None;
    }
    q
}

#[test]
fn calibrated_links_are_precise_and_unseen_craters_are_new() {
    let tmp = tempfile::tempdir().unwrap();
    let cat = catalogue(200, 1);
    let engine = build(&tmp.path().join("a"), &cat.entries);
    let opts = LinkOptions::default();
    // Calibration on appearance alone (labelled re-observations of craters 0..100, 50 unseen).
    let calib = no_geometry(queries(&cat, 0..100, 50, 2));
    let (rows, grown) = link(&engine, calib, &LinkRule::default(), &opts, &Silent).unwrap();
    assert!(grown.is_none(), "nothing inserted, nothing grown");
    let c = calibrate(&rows, &LinkRule::default(), 0.99).unwrap();
    assert!(c.match_precision >= 0.99, "{c:?}");
    assert!(c.match_recall > 0.5, "{c:?}");
    assert!(c.rule.new_confidence <= c.rule.match_confidence);
    c.rule.save(engine.index().dir().unwrap()).unwrap();
    let rule = LinkRule::for_index(engine.index().dir().unwrap()).unwrap();
    assert_eq!(rule, c.rule);

    // Held-out craters 100..200 and 50 other unseen ones, with positions.
    let test = queries(&cat, 100..200, 50, 3);
    let (rows, _) = link(&engine, test, &rule, &opts, &Silent).unwrap();
    let known = &rows[..100];
    let declared: Vec<_> = known
        .iter()
        .filter(|r| r.decision == Decision::Match)
        .collect();
    let right = declared
        .iter()
        .filter(|r| r.best.as_ref().unwrap().crater_id == r.query.crater_id)
        .count();
    assert!(
        right as f64 >= 0.97 * declared.len() as f64,
        "{right}/{}",
        declared.len()
    );
    assert!(declared.len() >= 50, "{} matched", declared.len());
    // Unseen craters lie far from every catalogue entry: geometry leaves no candidate.
    assert!(rows[100..]
        .iter()
        .all(|r| r.decision == Decision::New && r.best.is_none()));
    // Geometric evidence is reported for the matched ones: the same place, the same size.
    let b = declared[0].best.as_ref().unwrap();
    assert_eq!((b.offset_radii, b.diameter_ratio), (Some(0.0), Some(1.0)));
}

#[test]
fn insert_new_grows_the_index_in_order_and_a_second_run_adds_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let cat = catalogue(50, 4);
    let dir = tmp.path().join("a");
    let engine = build(&dir, &cat.entries);
    let rule = strict_rule();
    // 20 new craters, each seen twice (the second sighting 5 entries later, so within one
    // batch and across batches), mixed with 10 re-observations of known craters.
    let mut rng = Rng8::seed_from_u64(5);
    let fresh: Vec<Descriptors> = (0..20).map(|_| crater(&mut rng)).collect();
    let mut stream = Vec::new();
    for i in 0..25 {
        if i < 20 {
            let mut m = meta(&format!("s{i}"), 1000 + i, "pass1");
            m.lat = None;
            stream.push((m, noisy(&fresh[i], 0.05, &mut rng)));
        }
        if i >= 5 {
            let mut m = meta(&format!("s{}-again", i - 5), 1000 + i - 5, "pass2");
            m.lat = None;
            stream.push((m, noisy(&fresh[i - 5], 0.05, &mut rng)));
        }
        if i % 5 == 0 {
            let mut m = meta(&format!("k{i}"), i, "pass3");
            m.lat = None;
            stream.push((m, noisy(&cat.truth[i], 0.05, &mut rng)));
        }
    }
    let opts = LinkOptions {
        insert_new: true,
        batch: 7,
        ..LinkOptions::default()
    };
    let (rows, grown) = link(&engine, stream.clone(), &rule, &opts, &Silent).unwrap();
    let engine = grown.expect("new craters were inserted");
    let inserted: Vec<&str> = rows
        .iter()
        .filter(|r| r.inserted)
        .map(|r| r.query.id.as_str())
        .collect();
    let first_sightings: Vec<String> = (0..20).map(|i| format!("s{i}")).collect();
    assert_eq!(inserted, first_sightings);
    for r in rows.iter().filter(|r| r.query.id.ends_with("-again")) {
        assert_eq!(r.decision, Decision::Match, "{}", r.query.id);
        assert_eq!(r.best.as_ref().unwrap().crater_id, r.query.crater_id);
    }
    assert_eq!(engine.index().live(), 100 + 20);
    assert_eq!(Index::open(&dir).unwrap().live(), 120);
    let (rows, grown) = link(&engine, stream, &rule, &opts, &Silent).unwrap();
    assert!(rows.iter().all(|r| !r.inserted));
    assert!(grown.is_none());
    assert_eq!(engine.index().live(), 120);
}

/// The index's dedup under [`strict_rule`], the entries' metadata and its score against
/// their crater ids.
fn dedup_scored(
    engine: &Engine,
    entries: &[(ImageMeta, Descriptors)],
) -> (LinkRule, Vec<DedupGroup>, Vec<ImageMeta>, DedupScore) {
    let rule = strict_rule();
    let opts = DedupOptions::default();
    let frames = frames_of_index(engine.index(), &rule, &opts);
    let groups = dedup(engine, &rule, &opts, &frames, &Silent).unwrap();
    let metas: Vec<ImageMeta> = entries.iter().map(|(m, _)| m.clone()).collect();
    let s = score_groups(&groups, &metas);
    (rule, groups, metas, s)
}

#[test]
fn dedup_finds_the_views_of_each_crater_and_never_merges_one_source_image() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cat = catalogue(150, 6);
    // crater 0's two views come from one image: they must stay apart
    cat.entries[1].0.source = cat.entries[0].0.source.clone();
    let engine = build(&tmp.path().join("a"), &cat.entries);
    let (rule, groups, metas, s) = dedup_scored(&engine, &cat.entries);
    assert_eq!(s.true_groups, 150);
    assert_eq!(s.pair_precision, 1.0, "{s:?}");
    assert_eq!(s.found_exactly, 149, "{s:?}");
    assert!(groups.iter().all(|g| g.members.len() == 2));
    assert!(!groups
        .iter()
        .any(|g| g.members.iter().any(|m| m.id == "g0a")));
    let dir = tmp.path().join("out");
    let map = craterdex_workflows::output::MapLayers {
        body_radius_km: rule.body_radius_km,
        rims: true,
    };
    let files = craterdex_workflows::output::write_dedup(&dir, &groups, &metas, &map).unwrap();
    assert!(files.iter().all(|f| f.exists()), "{files:?}");
    let merged = std::fs::read_to_string(dir.join("merged.csv")).unwrap();
    // 149 groups and the two unmerged views of crater 0
    assert_eq!(merged.lines().count(), 1 + 149 + 2);
    let gj: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("merged.geojson")).unwrap()).unwrap();
    assert_eq!(gj["features"].as_array().unwrap().len(), 151);
    assert_eq!(gj["features"][0]["geometry"]["type"], "Point");
    assert_eq!(gj["features"][0]["properties"]["kind"], "group");
    assert_eq!(gj["features"][150]["properties"]["kind"], "single");
    // rims: one polygon per entry with a size, on the same sphere
    let rims: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("merged_rims.geojson")).unwrap()).unwrap();
    let rims = rims["features"].as_array().unwrap();
    assert_eq!(rims.len(), 151);
    assert_eq!(rims[0]["geometry"]["type"], "Polygon");
    assert_eq!(rims[0]["properties"], gj["features"][0]["properties"]);
    // QGIS styles beside each layer, colouring by the attribute the features carry
    for (style, shape) in [("merged.qml", "marker"), ("merged_rims.qml", "fill")] {
        let qml = std::fs::read_to_string(dir.join(style)).unwrap();
        assert!(
            qml.contains(r#"type="categorizedSymbol" attr="kind""#),
            "{qml}"
        );
        assert!(qml.contains(r#"value="group""#) && qml.contains(r#"value="single""#));
        assert!(qml.contains(&format!(r#"<symbol type="{shape}""#)));
    }
}

/// Longitudes of `entries` moved 10 degrees west, so that their craters straddle the 0/360
/// seam (-10 to 9.5 degrees), written in 0-360 for the entries `in_0_360` picks and in
/// -180..180 for the others.
fn across_the_seam(
    entries: &mut [(ImageMeta, Descriptors)],
    in_0_360: impl Fn(&ImageMeta) -> bool,
) {
    for (m, _) in entries {
        let lon = m.lon.unwrap() - 10.0;
        m.lon = Some(if in_0_360(m) {
            lon.rem_euclid(360.0)
        } else {
            lon
        });
    }
}

/// Craters either side of the 0/360 seam. Each crater's two views written one in 0-360
/// longitudes and one in -180..180: dedup groups every crater's views (found by appearance,
/// measured on the sphere). An index in 0-360 and new observations in -180..180 that look
/// like no crater (random descriptors): each finds its crater by geometry alone, at the same
/// place. Before, the geometry grid keyed raw longitudes, and an observation at -0.5 never
/// met its crater at 359.5.
#[test]
fn dedup_and_link_across_the_seam_and_between_longitude_conventions() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cat = catalogue(80, 9);
    across_the_seam(&mut cat.entries, |m| m.id.ends_with('a'));
    let engine = build(&tmp.path().join("a"), &cat.entries);
    let (rule, _, _, s) = dedup_scored(&engine, &cat.entries);
    assert_eq!((s.true_groups, s.found_exactly), (80, 80), "{s:?}");
    assert_eq!(s.pair_precision, 1.0, "{s:?}");

    // an index in 0-360, and new observations of every crater in -180..180 that look like
    // no crater of it: only geometry can bring theirs as a candidate
    let mut cat = catalogue(80, 9);
    across_the_seam(&mut cat.entries, |_| true);
    let engine = build(&tmp.path().join("b"), &cat.entries);
    let mut rng = Rng8::seed_from_u64(4);
    let mut test: Vec<(ImageMeta, Descriptors)> = (0..80)
        .map(|i| (meta(&format!("q{i}"), i, "new"), crater(&mut rng)))
        .collect();
    across_the_seam(&mut test, |_| false);
    let (rows, _) = link(&engine, test, &rule, &LinkOptions::default(), &Silent).unwrap();
    let placed = rows
        .iter()
        .filter(|r| {
            r.best.as_ref().is_some_and(|b| {
                b.crater_id == r.query.crater_id && b.offset_radii.is_some_and(|o| o < 1e-6)
            })
        })
        .count();
    assert_eq!(placed, 80, "each found its crater at the same place");
}

/// Entries for the crash test: 30 unseen craters, each in the stream once.
fn growing_stream() -> Vec<(ImageMeta, Descriptors)> {
    let mut rng = Rng8::seed_from_u64(11);
    (0..30)
        .map(|i| {
            let mut m = meta(&format!("n{i}"), 5000 + i, "pass");
            m.lat = None;
            (m, crater(&mut rng))
        })
        .collect()
}

fn growing_options() -> LinkOptions {
    LinkOptions {
        insert_new: true,
        batch: 10,
        ..LinkOptions::default()
    }
}

fn strict_rule() -> LinkRule {
    LinkRule {
        // confidence 0.5 at score 0.7; 0.99 from about 0.8
        appearance_weights: [-35.0, 50.0],
        match_confidence: 0.99,
        new_confidence: 0.5,
        ..LinkRule::default()
    }
}

/// Run in a child process by `a_killed_insert_new_leaves_a_complete_index_and_resumes`.
#[test]
#[ignore]
fn child_linker() {
    let Ok(dir) = std::env::var("CRATERDEX_CHILD_INDEX") else {
        return;
    };
    let engine = Engine::open(Path::new(&dir), None).unwrap();
    link(
        &engine,
        growing_stream(),
        &strict_rule(),
        &growing_options(),
        &Silent,
    )
    .unwrap();
}

/// `link --insert-new` killed inside an add, or between two batches' commits, leaves an
/// index that opens with whole batches only; running the same link again completes it
/// without adding anything twice.
#[test]
fn a_killed_insert_new_leaves_a_complete_index_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let cat = catalogue(40, 12);
    for (point, committed_batches) in [
        ("index-mid-segment", 0),
        ("index-after-segment", 0),
        ("durable-before-rename", 0),
        ("link-after-batch", 1),
    ] {
        let dir = tmp.path().join(point);
        build(&dir, &cat.entries);
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "child_linker",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("CRATERDEX_CHILD_INDEX", &dir)
            .env("CRATERDEX_FAILPOINT", point)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(&format!("failpoint {point}")),
            "{point}: the linker should have died there: {stderr}"
        );
        let idx = Index::open(&dir).unwrap_or_else(|e| panic!("{point}: unreadable: {e:#}"));
        assert_eq!(idx.live(), 80 + 10 * committed_batches, "{point}");
        drop(idx);
        let engine = Engine::open(&dir, None).unwrap();
        let (rows, grown) = link(
            &engine,
            growing_stream(),
            &strict_rule(),
            &growing_options(),
            &Silent,
        )
        .unwrap();
        let engine = grown.unwrap_or(engine);
        assert_eq!(
            rows.iter().filter(|r| r.inserted).count(),
            30 - 10 * committed_batches,
            "{point}"
        );
        assert_eq!(engine.index().live(), 110, "{point}");
    }
}

/// Moves an entry of crater c to a crowded grid: 0.3 degrees apart, 20 km across, so each
/// crater has geometric neighbours across any 1-degree band border.
fn crowd(m: &mut ImageMeta) {
    let c: usize = m.crater_id.as_ref().unwrap()[1..].parse().unwrap();
    m.lat = Some((c / 20 % 10) as f64 * 0.3 - 1.35);
    m.lon = Some((c % 20) as f64 * 0.3);
    m.diameter_km = Some(20.0);
}

/// Entries cut into 1-degree latitude bands (and the entries without a position).
fn bands(metas: &[ImageMeta]) -> Vec<Vec<usize>> {
    let mut by_band: std::collections::BTreeMap<Option<i64>, Vec<usize>> = Default::default();
    for (i, m) in metas.iter().enumerate() {
        by_band
            .entry(m.lat.map(|l| l.floor() as i64))
            .or_default()
            .push(i);
    }
    by_band.into_values().collect()
}

#[test]
fn dedup_and_link_cut_into_bands_with_a_halo_equal_the_whole_run() {
    use craterdex_workflows::dedup::{edges, merge};
    use craterdex_workflows::{link_partition, Neighbours};
    let tmp = tempfile::tempdir().unwrap();
    let mut cat = catalogue(200, 21);
    let mut rng = Rng8::seed_from_u64(23);
    for (i, (m, d)) in cat.entries.iter_mut().enumerate() {
        crowd(m);
        if i % 2 == 1 {
            // the second view looks unrelated and lies 0.1 degrees (0.59 radii) south: only
            // geometry pairs it, across a band border for the craters at 1.05 degrees
            m.lat = m.lat.map(|l| l - 0.1);
            *d = crater(&mut rng);
        }
    }
    cat.entries[7].0.lat = None; // one entry without a position
    let engine = build(&tmp.path().join("a"), &cat.entries);
    let idx = engine.index();
    let rule = LinkRule {
        appearance_weights: [-35.0, 50.0],
        // geometry decides: 0.9 within about 0.9 radii, whatever the appearance
        geometry_weights: [4.0, 0.0, -2.0, 0.0],
        match_confidence: 0.9,
        new_confidence: 0.5,
        ..LinkRule::default()
    };
    // positions as given: this is about the halo of a cut by position (registration is
    // tested on its own)
    let opts = DedupOptions {
        top_k: 3,
        register: false,
        ..DedupOptions::default()
    };
    let link_opts = LinkOptions {
        register: false,
        ..LinkOptions::default()
    };
    let frames = craterdex_workflows::Frames::none();
    let whole = dedup(&engine, &rule, &opts, &frames, &Silent).unwrap();
    assert!(whole.len() > 150, "{} groups", whole.len());
    let metas: Vec<ImageMeta> = (0..idx.rows()).map(|r| idx.meta(r).clone()).collect();
    let (mut with_halo, mut without_halo) = (Vec::new(), Vec::new());
    let parts = bands(&metas);
    assert!(parts.len() >= 4);
    for rows in &parts {
        let core: Vec<ImageMeta> = rows.iter().map(|&r| metas[r].clone()).collect();
        let near = Neighbours::around(idx, &rule, &frames, &core);
        with_halo.extend(edges(&engine, &near, &rule, &frames, &opts, rows, &Silent));
        // the same band with the core's own rows only (no reach beyond them)
        let mut shrunk = core.clone();
        for m in &mut shrunk {
            m.diameter_km = Some(1e-9);
        }
        let near = Neighbours::around(idx, &rule, &frames, &shrunk);
        without_halo.extend(edges(&engine, &near, &rule, &frames, &opts, rows, &Silent));
    }
    with_halo.reverse(); // the order partitions finish in does not matter
    let json = |g: &Vec<craterdex_workflows::DedupGroup>| serde_json::to_string(g).unwrap();
    assert_eq!(json(&merge(idx, &with_halo).unwrap()), json(&whole));
    let lost = merge(idx, &without_halo).unwrap();
    assert!(
        lost.len() + 15 <= whole.len(),
        "without a halo {} groups, with {}",
        lost.len(),
        whole.len()
    );

    // link: another observation of every crater and of 20 unseen ones, cut into the same bands
    let mut observed = queries(&cat, 0..200, 20, 22);
    for (m, _) in observed.iter_mut().take(200) {
        crowd(m);
    }
    let obs_metas: Vec<ImageMeta> = observed.iter().map(|(m, _)| m.clone()).collect();
    let (whole_rows, _) = link(
        &Engine::open(&tmp.path().join("a"), None).unwrap(),
        observed.clone(),
        &rule,
        &link_opts,
        &Silent,
    )
    .unwrap();
    let mut cut_rows = vec![None; observed.len()];
    for rows in bands(&obs_metas) {
        let part: Vec<_> = rows.iter().map(|&r| observed[r].clone()).collect();
        let decided = link_partition(&engine, &part, &rule, &link_opts, &frames, &Silent).unwrap();
        for (r, row) in rows.into_iter().zip(decided) {
            cut_rows[r] = Some(row);
        }
    }
    let line = |r: &craterdex_workflows::LinkRow| serde_json::to_string(r).unwrap();
    for (a, b) in whole_rows.iter().zip(&cut_rows) {
        assert_eq!(line(a), line(b.as_ref().unwrap()));
    }
    let insert = LinkOptions {
        insert_new: true,
        ..LinkOptions::default()
    };
    assert!(link_partition(&engine, &observed, &rule, &insert, &frames, &Silent).is_err());
}

/// `n` craters uniform over a square of `side` px, diameters from a power law
/// `d0 * (1 - u)^exponent` with `u` uniform below `u_max` (as real size-frequency
/// distributions).
fn pixel_field(
    n: usize,
    side: f64,
    (d0, u_max, exponent): (f64, f64, f64),
    rng: &mut Rng8,
) -> Vec<(f64, f64, f64)> {
    (0..n)
        .map(|_| {
            (
                rng.gen_range(0.0..side),
                rng.gen_range(0.0..side),
                d0 * (1.0 - rng.gen_range(0.0..u_max)).powf(exponent),
            )
        })
        .collect()
}

/// An entry of crater `crater` seen by `source` at (x, y, diameter) in its pixels.
fn pixel_entry(id: String, crater: String, source: &str, (x, y, d): (f64, f64, f64)) -> ImageMeta {
    ImageMeta {
        id,
        crater_id: Some(crater),
        source: Some(source.into()),
        x: Some(x),
        y: Some(y),
        diameter_px: Some(d),
        ..Default::default()
    }
}

/// A catalogue in one pixel frame and a second observation of it turned by 120 degrees,
/// at 0.8 the resolution and shifted by 500 px, whose crater images look little alike:
/// only registration can link it.
#[test]
fn link_and_dedup_register_a_turned_shifted_observation_first() {
    use craterdex_workflows::{link_partition, register_entries, registrations, Frames};
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng8::seed_from_u64(41);
    let n = 150;
    let field = pixel_field(n, 3000.0, (12.0, 0.95, -0.6), &mut rng);
    let at = pixel_entry;
    let truth: Vec<Descriptors> = (0..n).map(|_| crater(&mut rng)).collect();
    let first: Vec<(ImageMeta, Descriptors)> = (0..n)
        .map(|i| {
            let m = at(format!("a{i}"), format!("c{i}"), "obs1", field[i]);
            (m, noisy(&truth[i], 0.1, &mut rng))
        })
        .collect();
    let (angle, scale) = (120f64.to_radians(), 0.8);
    let seen = |(x, y, d): (f64, f64, f64), rng: &mut Rng8| {
        let (u, v) = (x + rng.gen_range(-0.3..0.3), y + rng.gen_range(-0.3..0.3));
        (
            scale * (u * angle.cos() - v * angle.sin()) + 500.0,
            scale * (u * angle.sin() + v * angle.cos()) - 200.0,
            scale * d,
        )
    };
    let mut second: Vec<(ImageMeta, Descriptors)> = (0..n)
        .map(|i| {
            let m = at(
                format!("b{i}"),
                format!("c{i}"),
                "obs2",
                seen(field[i], &mut rng),
            );
            (m, noisy(&truth[i], 0.8, &mut rng))
        })
        .collect();
    for j in 0..15 {
        let spot = (rng.gen_range(0.0..3000.0), rng.gen_range(0.0..3000.0), 20.0);
        let m = at(
            format!("u{j}"),
            format!("unseen{j}"),
            "obs2",
            seen(spot, &mut rng),
        );
        second.push((m, crater(&mut rng)));
    }
    let engine = build(&tmp.path().join("a"), &first);
    let rule = LinkRule::default();
    let correct = |rows: &[craterdex_workflows::LinkRow]| {
        rows.iter()
            .filter(|r| {
                r.decision == Decision::Match
                    && r.best.as_ref().and_then(|b| b.crater_id.as_ref())
                        == r.query.crater_id.as_ref()
            })
            .count()
    };
    let (rows, _) = link(
        &engine,
        second.clone(),
        &rule,
        &LinkOptions::default(),
        &Silent,
    )
    .unwrap();
    // cut into quarters by position, each source registered once for all of them (as
    // craterdex.dask.link does): the rows of the whole run
    let metas2: Vec<ImageMeta> = second.iter().map(|(m, _)| m.clone()).collect();
    let shared = register_entries(&engine, &rule, &LinkOptions::default(), &metas2);
    let shared = Frames::of_registrations(
        shared.registrations().iter().map(|r| (**r).clone()),
        rule.body_radius_km,
    );
    let mut cut = vec![None; second.len()];
    for q in 0..4 {
        let rows_q: Vec<usize> = (0..second.len())
            .filter(|&i| {
                (second[i].0.x.unwrap() > -1100.0) as usize * 2
                    + (second[i].0.y.unwrap() > 200.0) as usize
                    == q
            })
            .collect();
        assert!(!rows_q.is_empty());
        let part: Vec<_> = rows_q.iter().map(|&i| second[i].clone()).collect();
        let decided = link_partition(
            &engine,
            &part,
            &rule,
            &LinkOptions::default(),
            &shared,
            &Silent,
        )
        .unwrap();
        for (i, row) in rows_q.into_iter().zip(decided) {
            cut[i] = Some(row);
        }
    }
    let line = |r: &craterdex_workflows::LinkRow| serde_json::to_string(r).unwrap();
    for (a, b) in rows.iter().zip(&cut) {
        assert_eq!(line(a), line(b.as_ref().unwrap()));
    }
    let regs = registrations(&rows);
    assert_eq!(regs.len(), 1);
    let r = &regs[0];
    assert!(r.registered, "{r:?}");
    assert!((r.rotation_deg.unwrap() + 120.0).abs() < 0.5, "{r:?}");
    assert!((r.scale.unwrap() - 1.25).abs() < 0.01, "{r:?}");
    // the outputs: every source's transform and the review's residual plot
    let out = tmp.path().join("out");
    let map = craterdex_workflows::output::MapLayers {
        body_radius_km: craterdex_workflows::geometry::MARS_RADIUS_KM,
        rims: false,
    };
    craterdex_workflows::output::write_links(&out, &rows, &map).unwrap();
    assert!(out.join("links.qml").exists() && !out.join("links_rims.geojson").exists());
    craterdex_workflows::output::write_registrations(&out, &regs).unwrap();
    craterdex_workflows::review::write_review(&out, &rows, 50).unwrap();
    let mut table = csv::Reader::from_path(out.join("registrations.csv")).unwrap();
    let header = table.headers().unwrap().clone();
    let row = table.records().next().unwrap().unwrap();
    let field = |name: &str| row[header.iter().position(|h| h == name).unwrap()].to_string();
    assert_eq!(field("source"), "obs2");
    assert_eq!(field("registered"), "true");
    assert!((field("rotation_deg").parse::<f64>().unwrap() + 120.0).abs() < 0.5);
    assert!(field("inliers").parse::<usize>().unwrap() >= 140, "{row:?}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("registrations.json")).unwrap()).unwrap();
    assert_eq!(json[0]["transform"]["kind"], "similarity");
    let review = std::fs::read_to_string(out.join("review.html")).unwrap();
    assert!(review.contains("1 of 1 sources registered"), "{review}");
    assert!(
        review.matches("fill-opacity").count() >= 140,
        "one dot per inlier"
    );
    let links = std::fs::read_to_string(out.join("links.csv")).unwrap();
    assert!(links
        .lines()
        .next()
        .unwrap()
        .ends_with(",source,registered"));
    assert_eq!(
        links.lines().filter(|l| l.ends_with(",obs2,true")).count(),
        165
    );
    assert!(correct(&rows) >= 145, "{} of 150 linked", correct(&rows));
    let wrong = rows
        .iter()
        .filter(|r| r.decision == Decision::Match)
        .count()
        - correct(&rows);
    assert_eq!(wrong, 0);
    let unseen_new = rows[n..]
        .iter()
        .filter(|r| r.decision == Decision::New)
        .count();
    assert_eq!(unseen_new, 15);
    let as_given = LinkOptions {
        register: false,
        ..LinkOptions::default()
    };
    let (rows, _) = link(&engine, second.clone(), &rule, &as_given, &Silent).unwrap();
    assert!(
        correct(&rows) < 30,
        "{} linked without registration",
        correct(&rows)
    );

    let both: Vec<(ImageMeta, Descriptors)> = first.iter().chain(&second).cloned().collect();
    let engine = build(&tmp.path().join("both"), &both);
    let metas: Vec<ImageMeta> = both.iter().map(|(m, _)| m.clone()).collect();
    let opts = DedupOptions::default();
    let frames = frames_of_index(engine.index(), &rule, &opts);
    let groups = dedup(&engine, &rule, &opts, &frames, &Silent).unwrap();
    let s = score_groups(&groups, &metas);
    assert!(s.found_exactly >= 145 && s.pair_precision == 1.0, "{s:?}");
    let regs = frames.registrations();
    // obs2 (more entries) is the reference, obs1 registered to it: turned back by 120
    assert_eq!(regs.len(), 1);
    assert_eq!(regs[0].source.as_deref(), Some("obs1"));
    assert!((regs[0].rotation_deg.unwrap() - 120.0).abs() < 0.5);
    let unregistered = DedupOptions {
        register: false,
        ..DedupOptions::default()
    };
    let groups = dedup(&engine, &rule, &unregistered, &Frames::none(), &Silent).unwrap();
    assert!(score_groups(&groups, &metas).found_exactly < 30);
}

/// A catalogue of many small craters and an observation at a third of its resolution that
/// detects only the large ones, turned by 70 degrees and shifted: the large craters'
/// neighbours differ between the two, so crater patterns alone do not register it; their
/// confident appearance matches seed the transform.
#[test]
fn appearance_matches_seed_a_source_patterns_alone_cannot_register() {
    use craterdex_workflows::{register_entries, register_entries_seeded, registrations};
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = Rng8::seed_from_u64(61);
    let n = 400;
    let field = pixel_field(n, 4000.0, (8.0, 0.99, -0.7), &mut rng);
    let at = pixel_entry;
    let truth: Vec<Descriptors> = (0..n).map(|_| crater(&mut rng)).collect();
    let first: Vec<(ImageMeta, Descriptors)> = (0..n)
        .map(|i| {
            let m = at(format!("a{i}"), format!("c{i}"), "survey", field[i]);
            (m, noisy(&truth[i], 0.1, &mut rng))
        })
        .collect();
    let (angle, scale) = (70f64.to_radians(), 1.0 / 3.0);
    let large: Vec<usize> = (0..n).filter(|&i| field[i].2 >= 40.0).collect();
    assert!(
        (15..60).contains(&large.len()),
        "{} large craters",
        large.len()
    );
    let second: Vec<(ImageMeta, Descriptors)> = large
        .iter()
        .map(|&i| {
            let (x, y, d) = field[i];
            let seen = (
                scale * (x * angle.cos() - y * angle.sin()) + 900.0,
                scale * (x * angle.sin() + y * angle.cos()) - 300.0,
                scale * d,
            );
            let m = at(format!("b{i}"), format!("c{i}"), "coarse", seen);
            (m, noisy(&truth[i], 0.1, &mut rng))
        })
        .collect();
    let engine = build(&tmp.path().join("a"), &first);
    let rule = LinkRule::default();
    let opts = LinkOptions::default();
    let metas: Vec<ImageMeta> = second.iter().map(|(m, _)| m.clone()).collect();
    let by_pattern = register_entries(&engine, &rule, &opts, &metas).registrations();
    assert!(!by_pattern[0].registered, "{:?}", by_pattern[0]);
    let seeded = register_entries_seeded(&engine, &rule, &opts, &second).registrations();
    let r = &seeded[0];
    assert!(r.registered, "{r:?}");
    assert!((r.rotation_deg.unwrap() + 70.0).abs() < 0.5, "{r:?}");
    assert!((r.scale.unwrap() - 3.0).abs() < 0.03, "{r:?}");
    // and link places every large crater on its own
    let (rows, _) = link(&engine, second.clone(), &rule, &opts, &Silent).unwrap();
    assert!(registrations(&rows)[0].registered);
    let right = rows
        .iter()
        .filter(|r| {
            r.decision == Decision::Match
                && r.best.as_ref().and_then(|b| b.crater_id.as_ref()) == r.query.crater_id.as_ref()
                && r.best
                    .as_ref()
                    .and_then(|b| b.offset_radii)
                    .is_some_and(|o| o < 0.3)
        })
        .count();
    assert_eq!(right, large.len());
}

/// A cluster links as one index does: each shard's evidence (its appearance hits and its
/// rows near the entry), merged, decides as the whole catalogue decides, with a shortlist
/// of at least a shard's size.
#[test]
fn link_decided_from_every_shards_evidence_equals_the_whole_index() {
    use craterdex_workflows::{link_decision, link_evidence, link_one, Frames, Neighbours};
    let tmp = tempfile::tempdir().unwrap();
    let mut cat = catalogue(150, 31);
    let mut rng = Rng8::seed_from_u64(32);
    for (i, (m, d)) in cat.entries.iter_mut().enumerate() {
        crowd(m);
        if i % 3 == 1 {
            // a view only geometry pairs with its crater
            *d = crater(&mut rng);
        }
    }
    let rule = LinkRule {
        appearance_weights: [-35.0, 50.0],
        geometry_weights: [4.0, 0.0, -2.0, 0.0],
        match_confidence: 0.9,
        new_confidence: 0.5,
        // reach far: more rows lie near each entry than are looked at
        max_offset_radii: 8.0,
        ..LinkRule::default()
    };
    let whole = build(&tmp.path().join("whole"), &cat.entries);
    rule.save(&tmp.path().join("whole")).unwrap();
    let set = tmp.path().join("set");
    let shards = whole
        .index()
        .split(&set, 3, &[craterdex_workflows::rule::RULE_FILE])
        .unwrap();
    let frames = Frames::none();
    let opts = LinkOptions {
        shortlist: 300,
        register: false,
        ..LinkOptions::default()
    };
    let engines: Vec<Engine> = shards
        .shards
        .iter()
        .map(|s| Engine::open(&set.join(&s.name), None).unwrap())
        .collect();
    for e in &engines {
        // the calibrated rule goes with every shard
        assert_eq!(LinkRule::for_index(e.index().dir().unwrap()).unwrap(), rule);
    }
    let nears: Vec<Neighbours> = engines
        .iter()
        .map(|e| Neighbours::of_index(e.index(), &rule, &frames))
        .collect();
    let whole_near = Neighbours::of_index(whole.index(), &rule, &frames);
    let mut observed = queries(&cat, 0..150, 15, 33);
    for (m, _) in observed.iter_mut().take(150) {
        crowd(m);
    }
    let line = |r: &craterdex_workflows::LinkRow| serde_json::to_string(r).unwrap();
    let (mut best_in_shard, mut differs_alone) = (vec![0; engines.len()], 0);
    for (meta, desc) in &observed {
        let one = link_one(
            &whole,
            &whole_near,
            &rule,
            &opts,
            &frames,
            meta.clone(),
            desc,
        );
        let parts: Vec<_> = engines
            .iter()
            .zip(&nears)
            .map(|(e, n)| link_evidence(e, n, &frames, &opts, meta, desc))
            .collect();
        // through JSON, as a router receives them
        let parts = serde_json::from_str(&serde_json::to_string(&parts).unwrap()).unwrap();
        let merged = link_decision(&rule, &frames, &opts, meta.clone(), parts);
        assert_eq!(line(&merged), line(&one), "{}", meta.id);
        if let Some(b) = &one.best {
            let owner = craterdex_index::shards::shard_of(&b.meta, engines.len());
            best_in_shard[owner] += 1;
        }
        let alone = link_evidence(&engines[0], &nears[0], &frames, &opts, meta, desc);
        let alone = link_decision(&rule, &frames, &opts, meta.clone(), vec![alone]);
        differs_alone += usize::from(line(&alone) != line(&one));
    }
    // the merge is what makes them equal: every shard holds best candidates, and one shard
    // alone decides otherwise for most entries
    assert!(best_in_shard.iter().all(|&n| n > 20), "{best_in_shard:?}");
    assert!(differs_alone > 80, "{differs_alone}");
}
