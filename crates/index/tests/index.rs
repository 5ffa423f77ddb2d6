use craterdex_index::codec::{Codec, TokenCodec};
use craterdex_index::{ImageMeta, Index, MergePolicy};
use craterdex_index::{Mode, SearchParams};
use craterdex_tokens::{Descriptors, Encoder, Recipe};
use rand::{Rng, SeedableRng};
use std::path::Path;

const D: usize = 32;
const K: usize = 4;

fn unit(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..n * D).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    for r in v.chunks_mut(D) {
        let s = r.iter().map(|x| x * x).sum::<f32>().sqrt();
        r.iter_mut().for_each(|x| *x /= s);
    }
    v
}

fn images(n: usize, seed: u64, prefix: &str) -> Vec<(ImageMeta, Descriptors)> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let meta = ImageMeta {
                id: format!("{prefix}{i}"),
                crater_id: Some(format!("c{i}")),
                ..Default::default()
            };
            (
                meta,
                Descriptors {
                    single: unit(&mut rng, 1),
                    tokens: unit(&mut rng, K),
                },
            )
        })
        .collect()
}

/// A noisy copy of a gallery image's descriptors.
fn near_duplicate(d: &Descriptors, seed: u64) -> Descriptors {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let noisy = |v: &[f32], rng: &mut rand_chacha::ChaCha8Rng| -> Vec<f32> {
        v.iter().map(|x| x + rng.gen_range(-0.05..0.05)).collect()
    };
    Descriptors {
        single: noisy(&d.single, &mut rng),
        tokens: noisy(&d.tokens, &mut rng),
    }
}

fn build(dir: &Path, imgs: &[(ImageMeta, Descriptors)], codec: Codec) {
    let sample: Vec<f32> = imgs.iter().flat_map(|(_, d)| d.tokens.clone()).collect();
    let codec = TokenCodec::train(codec, D, &sample, 1).unwrap();
    Index::create(
        dir,
        &Encoder::plain(Recipe::default()),
        &codec,
        Some("test".into()),
        imgs,
        None,
    )
    .unwrap();
}

/// Descriptors that are not all finite are refused by name before anything is written, by
/// a build and by an add, and the index stays as it was.
#[test]
fn non_finite_descriptors_are_never_written() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let mut imgs = images(6, 7, "a");
    imgs[3].1.tokens[5] = f32::NAN;
    let sample: Vec<f32> = imgs[..3]
        .iter()
        .flat_map(|(_, d)| d.tokens.clone())
        .collect();
    let codec = TokenCodec::train(Codec::F16, D, &sample, 1).unwrap();
    let create = |imgs: &[(ImageMeta, Descriptors)]| {
        Index::create(
            &dir,
            &Encoder::plain(Recipe::default()),
            &codec,
            None,
            imgs,
            None,
        )
    };
    let e = create(&imgs).unwrap_err().to_string();
    assert!(
        e.contains("image a3: its descriptors are not all finite"),
        "{e}"
    );
    assert!(!dir.exists(), "nothing written");
    create(&imgs[..3]).unwrap();
    let mut more = images(2, 8, "b");
    more[1].1.single[0] = f32::INFINITY;
    let e = Index::add(&dir, &more).unwrap_err().to_string();
    assert!(
        e.contains("image b1: its descriptors are not all finite"),
        "{e}"
    );
    assert_eq!(Index::open(&dir).unwrap().live(), 3);
}

/// Batches past a few dozen queries take other kernels (a GEMM for f32 single vectors,
/// blocked int8 queries); each query must still get what it gets alone.
#[test]
fn large_batches_agree_with_single_queries() {
    let imgs = images(700, 1, "g");
    let targets: Vec<usize> = (0..150).map(|i| (i * 37) % 700).collect();
    let queries: Vec<Descriptors> = targets
        .iter()
        .map(|&t| near_duplicate(&imgs[t].1, t as u64))
        .collect();
    for codec in [Codec::F32, Codec::Int8] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("idx");
        build(&dir, &imgs, codec);
        let idx = Index::open(&dir).unwrap();
        let params = SearchParams {
            top_k: 10,
            mode: Mode::Stage1,
            ..Default::default()
        };
        let batch = idx.search(&queries, &params);
        for (q, &t) in targets.iter().enumerate() {
            let alone = idx.search(&queries[q..q + 1], &params);
            assert_eq!(batch[q][0].row, t, "{codec:?} query {q}");
            assert_eq!(alone[0].len(), batch[q].len());
            for (a, b) in alone[0].iter().zip(&batch[q]) {
                assert!((a.score - b.score).abs() < 1e-4, "{codec:?} query {q}");
            }
        }
    }
}

#[test]
fn planted_duplicates_rank_first_in_every_mode_and_codec() {
    let imgs = images(600, 1, "g");
    for codec in [Codec::F32, Codec::F16, Codec::Int8, Codec::Pq { m: 8 }] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("idx");
        build(&dir, &imgs, codec);
        let idx = Index::open(&dir).unwrap();
        assert_eq!(idx.live(), 600);
        let targets = [3usize, 150, 599];
        let queries: Vec<Descriptors> = targets
            .iter()
            .map(|&t| near_duplicate(&imgs[t].1, t as u64))
            .collect();
        for mode in [Mode::Stage1, Mode::TwoStage, Mode::Exhaustive] {
            let res = idx.search(
                &queries,
                &SearchParams {
                    top_k: 5,
                    shortlist: 50,
                    mode,
                    ..Default::default()
                },
            );
            for (q, &t) in targets.iter().enumerate() {
                assert_eq!(res[q][0].row, t, "{codec:?} {mode:?}");
                assert_eq!(idx.meta(res[q][0].row).id, format!("g{t}"));
                assert!(res[q].windows(2).all(|w| w[0].score >= w[1].score));
            }
            let one = idx.search(
                &queries[..1],
                &SearchParams {
                    top_k: 5,
                    shortlist: 50,
                    mode,
                    ..Default::default()
                },
            );
            let rows = |h: &[craterdex_index::Hit]| h.iter().map(|h| h.row).collect::<Vec<_>>();
            assert_eq!(
                rows(&one[0]),
                rows(&res[0]),
                "single-query path agrees with the batch path"
            );
            assert!(one[0]
                .iter()
                .zip(&res[0])
                .all(|(a, b)| (a.score - b.score).abs() < 1e-5));
        }
        assert_eq!(
            idx.token_bytes_per_image(),
            match codec {
                Codec::F32 => K * D * 4,
                Codec::F16 => K * D * 2,
                Codec::Int8 => K * D + K * 4,
                Codec::Pq { m } => K * m,
            }
        );
    }
}

#[test]
fn add_and_remove_without_rebuilding() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let first = images(50, 2, "a");
    build(&dir, &first, Codec::Int8);
    let more = images(20, 3, "b");
    assert_eq!(Index::add(&dir, &more).unwrap(), 20);
    let idx = Index::open(&dir).unwrap();
    assert_eq!((idx.live(), idx.segment_count()), (70, 2));
    let q = near_duplicate(&more[7].1, 9);
    let hit = &idx.search(std::slice::from_ref(&q), &SearchParams::default())[0][0];
    assert_eq!(idx.meta(hit.row).id, "b7");
    assert!(Index::add(&dir, &more[..1])
        .unwrap_err()
        .to_string()
        .contains("already in the index"));

    assert_eq!(
        Index::remove(&dir, &["b7".into(), "nope".into()]).unwrap(),
        1
    );
    let idx = Index::open(&dir).unwrap();
    assert_eq!(idx.live(), 69);
    for mode in [Mode::Stage1, Mode::TwoStage, Mode::Exhaustive] {
        let res = idx.search(
            std::slice::from_ref(&q),
            &SearchParams {
                top_k: 70,
                shortlist: 70,
                mode,
                ..Default::default()
            },
        );
        assert!(
            res[0].iter().all(|h| idx.meta(h.row).id != "b7"),
            "{mode:?} returned a removed image"
        );
        assert_eq!(res[0].len(), 69);
    }
}

#[test]
fn damaged_indexes_fail_to_open_naming_file_and_cause() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    build(&dir, &images(30, 4, "x"), Codec::Int8);
    let tokens = dir.join("seg-000001/tokens.bin");
    let original = std::fs::read(&tokens).unwrap();

    let mut flipped = original.clone();
    flipped[10] ^= 0xff;
    std::fs::write(&tokens, &flipped).unwrap();
    let e = format!("{:#}", Index::open(&dir).err().unwrap());
    assert!(e.contains("tokens.bin") && e.contains("checksum"), "{e}");

    std::fs::write(&tokens, &original[..original.len() - 7]).unwrap();
    let e = format!("{:#}", Index::open(&dir).err().unwrap());
    assert!(e.contains("tokens.bin") && e.contains("truncated"), "{e}");
    std::fs::write(&tokens, &original).unwrap();
    Index::open(&dir).unwrap();

    let mpath = dir.join("index.json");
    let manifest = std::fs::read_to_string(&mpath).unwrap();
    std::fs::write(
        &mpath,
        manifest.replace("\"version\": 1", "\"version\": 99"),
    )
    .unwrap();
    let e = format!("{:#}", Index::open(&dir).err().unwrap());
    assert!(e.contains("index.json") && e.contains("version 99"), "{e}");

    std::fs::write(&mpath, &manifest[..manifest.len() / 2]).unwrap();
    let e = format!("{:#}", Index::open(&dir).err().unwrap());
    assert!(e.contains("index.json") && e.contains("corrupt"), "{e}");

    // a manifest may not send the reader outside the index directory
    std::fs::write(&mpath, manifest.replace("seg-000001", "../seg-000001")).unwrap();
    let e = format!("{:#}", Index::open(&dir).err().unwrap());
    assert!(
        e.contains("index.json") && e.contains("segment name"),
        "{e}"
    );
}

/// The same images built on disk and held in memory answer every mode identically.
#[test]
fn in_memory_indexes_answer_like_written_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let imgs = images(150, 8, "m");
    let queries: Vec<Descriptors> = (0..5)
        .map(|i| near_duplicate(&imgs[i * 7].1, i as u64))
        .collect();
    for codec in [Codec::F32, Codec::Int8, Codec::Pq { m: 8 }] {
        let dir = tmp.path().join(codec.name());
        build(&dir, &imgs, codec);
        let disk = Index::open(&dir).unwrap();
        let sample: Vec<f32> = imgs.iter().flat_map(|(_, d)| d.tokens.clone()).collect();
        let memory = Index::in_memory(
            &Encoder::plain(Recipe::default()),
            &TokenCodec::train(codec, D, &sample, 1).unwrap(),
            Some("test".into()),
            &imgs,
            None,
        )
        .unwrap();
        assert_eq!(memory.dir(), None);
        assert_eq!(memory.live(), disk.live());
        for mode in [Mode::Stage1, Mode::TwoStage, Mode::Exhaustive] {
            let p = SearchParams {
                top_k: 12,
                shortlist: 20,
                mode,
                ..Default::default()
            };
            assert_eq!(
                disk.search(&queries, &p),
                memory.search(&queries, &p),
                "{codec:?} {mode:?}"
            );
        }
    }
}

/// Two-stage search reranks exactly S candidates; asking for more results than S appends
/// the rest of the stage-1 ranking, unreranked, so the whole gallery can be ranked.
#[test]
fn two_stage_results_past_the_shortlist_follow_stage_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let imgs = images(60, 9, "t");
    build(&dir, &imgs, Codec::F32);
    let idx = Index::open(&dir).unwrap();
    let q = near_duplicate(&imgs[3].1, 1);
    let stage1 = &idx.search(
        std::slice::from_ref(&q),
        &SearchParams {
            top_k: 60,
            mode: Mode::Stage1,
            ..Default::default()
        },
    )[0];
    let all = &idx.search(
        std::slice::from_ref(&q),
        &SearchParams {
            top_k: 60,
            shortlist: 10,
            mode: Mode::TwoStage,
            ..Default::default()
        },
    )[0];
    assert_eq!(all.len(), 60);
    assert!(all[..10].iter().all(|h| h.stage2.is_some()));
    assert!(all[10..].iter().all(|h| h.stage2.is_none()));
    let mut head: Vec<usize> = all[..10].iter().map(|h| h.row).collect();
    let mut want: Vec<usize> = stage1[..10].iter().map(|h| h.row).collect();
    head.sort_unstable();
    want.sort_unstable();
    assert_eq!(head, want, "the shortlist is stage 1's top 10");
    let tail: Vec<usize> = all[10..].iter().map(|h| h.row).collect();
    let want_tail: Vec<usize> = stage1[10..].iter().map(|h| h.row).collect();
    assert_eq!(tail, want_tail);
    assert!(all[..10].windows(2).all(|w| w[0].score >= w[1].score));
}

/// Run in a child process by `killed_writers_leave_the_previous_index_readable`.
#[test]
#[ignore]
fn child_writer() {
    let Ok(dir) = std::env::var("CRATERDEX_CHILD_INDEX") else {
        return;
    };
    let dir = Path::new(&dir);
    match std::env::var("CRATERDEX_CHILD_OP").as_deref() {
        Ok("add") => {
            Index::add(dir, &images(25, 8, "new")).unwrap();
        }
        Ok("remove") => {
            Index::remove(dir, &["orig7".to_string()]).unwrap();
        }
        Ok("merge") => {
            Index::merge(dir, &MergePolicy::into_one()).unwrap();
        }
        _ => build(dir, &images(40, 9, "rebuilt"), Codec::F16),
    }
}

/// Runs `child_writer` doing `op` on `dir` and checks that it was killed at `point`.
fn kill_writer_at(dir: &Path, op: &str, point: &str) {
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_writer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CRATERDEX_CHILD_INDEX", dir)
        .env("CRATERDEX_CHILD_OP", op)
        .env("CRATERDEX_FAILPOINT", point)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert!(
        !status.status.success() && stderr.contains(&format!("failpoint {point}")),
        "{op} at {point}: the writer should have been killed there: {stderr}"
    );
}

/// Every writer killed at every failpoint it passes leaves a complete index: the previous
/// one when it died before its commit point, the new one when it died after.
#[test]
fn killed_writers_leave_the_previous_index_readable() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let original = images(60, 5, "orig");
    build(&dir, &original, Codec::Int8);
    // (writer, failpoint, whether the writer had committed when it died)
    for (op, point, committed) in [
        ("add", "index-mid-segment", false),
        ("add", "index-after-segment", false),
        ("add", "durable-before-rename", false),
        ("remove", "durable-before-rename", false),
        ("build", "index-mid-segment", false),
        ("build", "index-before-swap", false),
        ("build", "durable-before-swap", false),
        ("build", "durable-after-swap", true),
    ] {
        kill_writer_at(&dir, op, point);
        let idx = Index::open(&dir)
            .unwrap_or_else(|e| panic!("{op} at {point}: index unreadable: {e:#}"));
        if committed {
            assert_eq!(idx.live(), 40, "{op} at {point}");
            assert!(idx.row_of("rebuilt3").is_some(), "{op} at {point}");
            build(&dir, &original, Codec::Int8);
            continue;
        }
        assert_eq!(idx.live(), 60, "{op} at {point}");
        assert!(idx.row_of("orig7").is_some(), "{op} at {point}");
        let q = near_duplicate(&original[42].1, 1);
        let hit = &idx.search(&[q], &SearchParams::default())[0][0];
        assert_eq!(idx.meta(hit.row).id, "orig42", "{op} at {point}");
    }
    // and later writers still succeed on top of the leftovers
    Index::add(&dir, &images(5, 6, "late")).unwrap();
    assert_eq!(Index::remove(&dir, &["orig7".to_string()]).unwrap(), 1);
    assert_eq!(Index::open(&dir).unwrap().live(), 64);
}

/// Images whose single vectors lie around `clusters` centres (IVF has structure to find).
fn clustered_images(
    n: usize,
    clusters: usize,
    seed: u64,
    prefix: &str,
) -> Vec<(ImageMeta, Descriptors)> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let centres = unit(&mut rand_chacha::ChaCha8Rng::seed_from_u64(99), clusters);
    let mut imgs = images(n, seed, prefix);
    for (i, (_, d)) in imgs.iter_mut().enumerate() {
        let c = &centres[(i % clusters) * D..(i % clusters + 1) * D];
        let mut v: Vec<f32> = c
            .iter()
            .map(|x| x + 0.15 * rng.gen_range(-1.0f32..1.0))
            .collect();
        let s = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter_mut().for_each(|x| *x /= s);
        d.single = v;
    }
    imgs
}

#[test]
fn ivf_stage1_finds_near_duplicates_and_follows_adds_and_removals() {
    use craterdex_index::ivf::Ivf;
    use craterdex_index::Stage1;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let imgs = clustered_images(3000, 30, 1, "g");
    let singles: Vec<f32> = imgs.iter().flat_map(|(_, d)| d.single.clone()).collect();
    let ivf = Ivf::train(&singles, D, 30, 0).unwrap();
    let codec = TokenCodec::train(Codec::Int8, D, &[], 0).unwrap();
    Index::create(
        &dir,
        &Encoder::plain(Recipe::default()),
        &codec,
        None,
        &imgs,
        Some((&ivf, 3)),
    )
    .unwrap();
    let idx = Index::open(&dir).unwrap();
    let (stored, nprobe) = idx.ivf().unwrap();
    assert_eq!((stored.lists(), nprobe), (30, 3));

    let picks: Vec<usize> = (0..200).map(|i| i * 13 % 3000).collect();
    let queries: Vec<Descriptors> = picks
        .iter()
        .map(|&t| near_duplicate(&imgs[t].1, t as u64))
        .collect();
    // Targets by id: an IVF segment stores its images grouped by list, not in input order.
    let targets: Vec<&str> = picks.iter().map(|&t| imgs[t].0.id.as_str()).collect();
    let found = |idx: &Index, how: Stage1, qs: &[Descriptors], ts: &[&str]| -> usize {
        let p = SearchParams {
            top_k: 1,
            mode: Mode::Stage1,
            stage1: how,
            ..Default::default()
        };
        idx.search(qs, &p)
            .iter()
            .zip(ts)
            .filter(|(h, t)| idx.meta(h[0].row).id == **t)
            .count()
    };
    assert_eq!(found(&idx, Stage1::Exact, &queries, &targets), 200);
    let approx = found(&idx, Stage1::Auto, &queries, &targets);
    assert!(approx >= 196, "IVF found {approx} of 200");
    assert_eq!(
        found(&idx, Stage1::Probe(30), &queries, &targets),
        200,
        "all lists = exact"
    );
    // Each segment is stored grouped by list.
    let lists_file = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("lists.u32"))
        .find(|p| p.exists())
        .unwrap();
    let ids: Vec<u32> = std::fs::read(lists_file)
        .unwrap()
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert!(ids.windows(2).all(|w| w[0] <= w[1]));
    // One query at a time takes the same path.
    assert_eq!(found(&idx, Stage1::Auto, &queries[..1], &targets[..1]), 1);

    // Added images are assigned to the stored centroids and found through them.
    let more = clustered_images(300, 30, 2, "n");
    Index::add(&dir, &more).unwrap();
    let idx = Index::open(&dir).unwrap();
    let q: Vec<Descriptors> = (0..30)
        .map(|i| near_duplicate(&more[i].1, 1000 + i as u64))
        .collect();
    let t: Vec<&str> = (0..30).map(|i| more[i].0.id.as_str()).collect();
    assert!(found(&idx, Stage1::Auto, &q, &t) >= 29);
    // Removed images never come back from the lists.
    Index::remove(&dir, &["n0".to_string()]).unwrap();
    let idx = Index::open(&dir).unwrap();
    let p = SearchParams {
        top_k: 5,
        mode: Mode::Stage1,
        ..Default::default()
    };
    assert!(idx.search(&q[..1], &p)[0]
        .iter()
        .all(|h| idx.meta(h.row).id != "n0"));

    // A damaged list file is caught when the index is opened.
    let seg = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("seg-"))
        .unwrap();
    let lists = seg.join("lists.u32");
    let mut b = std::fs::read(&lists).unwrap();
    b[8] ^= 0xff;
    std::fs::write(&lists, b).unwrap();
    let e = format!("{:#}", Index::open(&dir).err().unwrap());
    assert!(e.contains("lists.u32"), "{e}");
}

/// An int8 index whose token width fits the AMX tiles (64): exhaustive and reranked scores
/// computed from the codes agree with decoding + f32 MaxSim, across two segments and a removal.
#[test]
fn int8_scores_from_codes_agree_with_decoded_tokens() {
    let (d, k) = (64, 5);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(31);
    let mut unit_d = |n: usize| -> Vec<f32> {
        let mut v: Vec<f32> = (0..n * d).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        for r in v.chunks_mut(d) {
            let s = r.iter().map(|x| x * x).sum::<f32>().sqrt();
            r.iter_mut().for_each(|x| *x /= s);
        }
        v
    };
    let imgs: Vec<(ImageMeta, Descriptors)> = (0..300)
        .map(|i| {
            let meta = ImageMeta {
                id: format!("i{i}"),
                ..Default::default()
            };
            let single = unit_d(1);
            (
                meta,
                Descriptors {
                    single,
                    tokens: unit_d(k),
                },
            )
        })
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let sample: Vec<f32> = imgs.iter().flat_map(|(_, d)| d.tokens.clone()).collect();
    let codec = TokenCodec::train(Codec::Int8, d, &sample, 1).unwrap();
    let enc = Encoder::plain(Recipe::default());
    Index::create(&dir, &enc, &codec, None, &imgs[..200], None).unwrap();
    Index::add(&dir, &imgs[200..]).unwrap();
    Index::remove(&dir, &["i250".to_string()]).unwrap();
    let idx = Index::open(&dir).unwrap();
    assert!(idx.segment_count() >= 2);
    let query = Descriptors {
        single: imgs[250].1.single.clone(),
        tokens: imgs[250].1.tokens.iter().map(|x| x * 0.9).collect(),
    };
    let decoded = |row: usize| {
        let mut t = Vec::new();
        idx.decode_tokens(row, &mut t);
        craterdex_kernels::f32::maxsim(&query.tokens, &t, d)
    };
    for mode in [Mode::Exhaustive, Mode::TwoStage] {
        let hits = &idx.search(
            std::slice::from_ref(&query),
            &SearchParams {
                top_k: 20,
                shortlist: 300,
                mode,
                ..Default::default()
            },
        )[0];
        assert_eq!(hits.len(), 20, "{mode:?}");
        for h in hits {
            assert_ne!(
                idx.meta(h.row).id,
                "i250",
                "{mode:?}: a removed image came back"
            );
            let want = decoded(h.row);
            assert!(
                (h.score - want).abs() < 1.5e-2,
                "{mode:?} row {}: {} vs {want}",
                h.row,
                h.score
            );
        }
        // the best live row by decoded scores is found
        let best = idx
            .live_rows()
            .max_by(|&a, &b| decoded(a).total_cmp(&decoded(b)))
            .unwrap();
        assert!(
            (decoded(hits[0].row) - decoded(best)).abs() < 3e-2,
            "{mode:?}"
        );
    }
    // stage 1 scores from the int8 single vectors: close to f32, the same alone or in a batch
    let params = SearchParams {
        top_k: 10,
        mode: Mode::Stage1,
        ..Default::default()
    };
    let other = Descriptors {
        single: imgs[7].1.single.clone(),
        tokens: imgs[7].1.tokens.clone(),
    };
    let alone = idx.search(std::slice::from_ref(&query), &params);
    let batch = idx.search(&[query.clone(), other], &params);
    assert_eq!(alone[0], batch[0]);
    assert_eq!(idx.meta(batch[1][0].row).id, "i7");
    for h in &alone[0] {
        let exact: f32 = idx
            .single_of(h.row)
            .iter()
            .zip(&query.single)
            .map(|(a, b)| a * b)
            .sum();
        assert!(
            (h.score - exact).abs() < 1e-2,
            "row {}: {} vs {exact}",
            h.row,
            h.score
        );
    }
}

/// Images `2i` and `2i + 1` show one crater; `first` of them go into the first segment and
/// the rest are added, so some craters have a view in each segment.
fn paired_index(dir: &Path, n: usize, first: usize, codec: Codec) -> Vec<(ImageMeta, Descriptors)> {
    let mut imgs = images(n, 11, "v");
    for (i, (m, _)) in imgs.iter_mut().enumerate() {
        m.crater_id = Some(format!("c{}", i / 2));
    }
    build(dir, &imgs[..first], codec);
    Index::add(dir, &imgs[first..]).unwrap();
    imgs
}

/// The whole ranking grouped the slow way: each row keyed by its crater's best score.
fn grouped_slowly(idx: &Index, all: &[craterdex_index::Hit], k: usize) -> Vec<usize> {
    let crater = |row: usize| idx.meta(row).crater_id.clone().unwrap();
    let best = |row: usize| {
        all.iter()
            .filter(|h| crater(h.row) == crater(row))
            .map(|h| (h.score, std::cmp::Reverse(h.row)))
            .max_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .unwrap()
    };
    let mut rows: Vec<(f32, usize, f32, usize)> = all
        .iter()
        .map(|h| {
            let (s, std::cmp::Reverse(r)) = best(h.row);
            (s, r, h.score, h.row)
        })
        .collect();
    rows.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(b.2.total_cmp(&a.2))
            .then(a.3.cmp(&b.3))
    });
    rows.into_iter().take(k).map(|r| r.3).collect()
}

#[test]
fn grouped_views_follow_the_best_view_of_their_crater() {
    let n = 240;
    for codec in [Codec::F32, Codec::Int8] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("idx");
        let imgs = paired_index(&dir, n, 151, codec);
        let idx = Index::open(&dir).unwrap();
        assert_eq!(idx.segment_count(), 2);
        // row 150 is in the first segment, its other view (151) in the second
        for target in [10usize, 151, 150] {
            let q = near_duplicate(&imgs[target].1, target as u64);
            let sibling = target ^ 1;
            for mode in [Mode::Stage1, Mode::Exhaustive, Mode::TwoStage] {
                let params = |top_k: usize, group_views: bool| SearchParams {
                    top_k,
                    shortlist: 20,
                    mode,
                    group_views,
                    ..Default::default()
                };
                let q = std::slice::from_ref(&q);
                let grouped = &idx.search(q, &params(10, true))[0];
                let plain = &idx.search(q, &params(10, false))[0];
                let what = format!("{codec:?} {mode:?} target {target}");
                assert_eq!(grouped[0], plain[0], "{what}: the first hit is unchanged");
                assert_eq!(grouped[0].row, target, "{what}");
                assert_eq!(
                    grouped[1].row, sibling,
                    "{what}: the other view comes second"
                );
                assert_eq!(grouped.len(), 10);
                if mode != Mode::TwoStage {
                    // every row's score is what the ungrouped search gives it
                    let all = &idx.search(q, &params(n, false))[0];
                    for h in grouped.iter() {
                        let same = all.iter().find(|a| a.row == h.row).unwrap();
                        assert!((same.score - h.score).abs() < 1e-5, "{what}: row {}", h.row);
                    }
                    let rows: Vec<usize> = grouped.iter().map(|h| h.row).collect();
                    assert_eq!(rows, grouped_slowly(&idx, all, 10), "{what}");
                } else {
                    // the sibling was not on the shortlist: scored by late interaction alone
                    let exhaustive = &idx.search(
                        q,
                        &SearchParams {
                            mode: Mode::Exhaustive,
                            ..params(n, false)
                        },
                    )[0];
                    let li = exhaustive.iter().find(|h| h.row == sibling).unwrap().score;
                    assert!((grouped[1].score - li).abs() < 1e-5, "{what}");
                    assert!(grouped[1].stage2.is_some());
                }
                // craters are contiguous and ordered by their best view
                let crater = |h: &craterdex_index::Hit| idx.meta(h.row).crater_id.clone();
                let mut seen: Vec<Option<String>> = Vec::new();
                let mut last_best = f32::INFINITY;
                for h in grouped.iter() {
                    if seen.last() != Some(&crater(h)) {
                        assert!(!seen.contains(&crater(h)), "{what}: crater split");
                        assert!(h.score <= last_best + 1e-6, "{what}");
                        last_best = h.score;
                        seen.push(crater(h));
                    }
                }
            }
        }
        // a removed view is not brought back by its crater
        Index::remove(&dir, &["v11".into()]).unwrap();
        let idx = Index::open(&dir).unwrap();
        let q = near_duplicate(&imgs[10].1, 10);
        for mode in [Mode::Stage1, Mode::Exhaustive, Mode::TwoStage] {
            let hits = &idx.search(
                std::slice::from_ref(&q),
                &SearchParams {
                    mode,
                    ..Default::default()
                },
            )[0];
            assert_eq!(hits[0].row, 10);
            assert!(hits.iter().all(|h| h.row != 11), "{codec:?} {mode:?}");
        }
    }
}

/// Every live image's exhaustive late-interaction score for each query, by id.
fn scores_by_id(
    idx: &Index,
    queries: &[Descriptors],
) -> Vec<std::collections::BTreeMap<String, f32>> {
    let all = SearchParams {
        top_k: idx.live(),
        shortlist: idx.live(),
        mode: Mode::Exhaustive,
        ..Default::default()
    };
    idx.search(queries, &all)
        .into_iter()
        .map(|hits| {
            hits.iter()
                .map(|h| (idx.meta(h.row).id.clone(), h.score))
                .collect()
        })
        .collect()
}

/// The names in an index directory other than its top-level files.
fn segment_entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| !n.ends_with(".json") && !n.ends_with(".lock") && !n.ends_with(".f32"))
        .collect();
    names.sort();
    names
}

#[test]
fn merges_keep_every_live_image_and_purge_removed_ones() {
    for ivf in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("idx");
        let first = images(30, 21, "a");
        let sample: Vec<f32> = first.iter().flat_map(|(_, d)| d.tokens.clone()).collect();
        let codec = TokenCodec::train(Codec::Int8, D, &sample, 1).unwrap();
        let centroids = craterdex_index::ivf::Ivf {
            dim: D,
            centroids: first[..4]
                .iter()
                .flat_map(|(_, d)| d.single.clone())
                .collect(),
        };
        Index::create(
            &dir,
            &Encoder::plain(Recipe::default()),
            &codec,
            None,
            &first,
            ivf.then_some((&centroids, 2)),
        )
        .unwrap();
        let added = images(40, 22, "b");
        let policy = MergePolicy::default();
        let mut most = 0;
        for one in added.chunks(1) {
            Index::add(&dir, one).unwrap();
            Index::merge(&dir, &policy).unwrap();
            most = most.max(Index::open(&dir).unwrap().segment_count());
        }
        // the build's 30 rows and up to 7 segments on each of levels 0 and 1
        assert!(most <= 1 + 7 + 7, "ivf {ivf}: {most} segments");
        let idx = Index::open(&dir).unwrap();
        assert_eq!(idx.live(), 70, "ivf {ivf}");
        assert!(
            idx.segment_count() < 10,
            "ivf {ivf}: {}",
            idx.segment_count()
        );

        let gone: Vec<String> = ["a3", "a17", "b0", "b5", "b39"].map(String::from).to_vec();
        assert_eq!(Index::remove(&dir, &gone).unwrap(), 5);
        let queries: Vec<Descriptors> = [&first[3], &first[8], &added[5], &added[20]]
            .iter()
            .enumerate()
            .map(|(i, (_, d))| near_duplicate(d, 40 + i as u64))
            .collect();
        let before = scores_by_id(&Index::open(&dir).unwrap(), &queries);
        let report = Index::merge(&dir, &MergePolicy::into_one()).unwrap();
        assert_eq!(
            (report.rows_written, report.rows_purged),
            (65, 5),
            "ivf {ivf}"
        );
        assert_eq!(report.segments_after, 1, "ivf {ivf}");
        let idx = Index::open(&dir).unwrap();
        assert_eq!((idx.rows(), idx.live(), idx.segment_count()), (65, 65, 1));
        assert_eq!(scores_by_id(&idx, &queries), before, "ivf {ivf}");
        let hit = &idx.search(&queries[3..], &SearchParams::default())[0][0];
        assert_eq!(idx.meta(hit.row).id, "b20", "ivf {ivf}");
        assert!(idx.was_removed("b5") && idx.row_of("b5").is_none());
        assert!(
            Index::add(&dir, &added[5..6]).is_err(),
            "removed ids stay retired"
        );
        // what the merges replaced is gone from the directory
        assert_eq!(
            segment_entries(&dir).len(),
            1,
            "{:?}",
            segment_entries(&dir)
        );
        // nothing left to do
        assert_eq!(
            Index::merge(&dir, &MergePolicy::into_one()).unwrap().merges,
            0
        );
    }
}

/// A merge killed at every failpoint it passes loses no acknowledged write: the index opens
/// as before the merge (or after it, once its manifest is written), and the next merge
/// cleans up what the killed one left.
#[test]
fn killed_merges_lose_no_acknowledged_write() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    let original = images(60, 5, "orig");
    build(&dir, &original, Codec::Int8);
    let singles = images(6, 31, "s");
    for one in singles.chunks(1) {
        Index::add(&dir, one).unwrap();
    }
    Index::remove(&dir, &["orig7".to_string()]).unwrap();
    for (point, committed) in [
        ("merge-after-staging", false),
        ("index-mid-segment", false),
        ("merge-before-manifest", false),
        ("durable-before-rename", false),
        ("merge-after-manifest", true),
    ] {
        kill_writer_at(&dir, "merge", point);
        let idx = Index::open(&dir).unwrap_or_else(|e| panic!("merge at {point}: {e:#}"));
        assert_eq!(idx.live(), 65, "merge at {point}");
        assert_eq!(
            idx.segment_count(),
            if committed { 1 } else { 7 },
            "{point}"
        );
        for (m, d) in original.iter().skip(8).step_by(13).chain(&singles) {
            let hit = &idx.search(&[near_duplicate(d, 3)], &SearchParams::default())[0][0];
            assert_eq!(idx.meta(hit.row).id, m.id, "merge at {point}");
        }
        assert!(idx.row_of("orig7").is_none(), "merge at {point}");
    }
    // later writes succeed on top of the leftovers, and the next merge deletes them
    Index::add(&dir, &images(2, 32, "late")).unwrap();
    Index::merge(&dir, &MergePolicy::into_one()).unwrap();
    let idx = Index::open(&dir).unwrap();
    assert_eq!((idx.live(), idx.segment_count()), (67, 1));
    assert_eq!(
        segment_entries(&dir).len(),
        1,
        "{:?}",
        segment_entries(&dir)
    );
}

/// A split keeps every live image in exactly one shard, each crater's views together, and
/// each image's scores: the shards' hits merged are the whole index's hits.
#[test]
fn split_shards_hold_every_live_image_once_with_the_same_scores() {
    use craterdex_index::shards::{shard_of, ShardSet};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("idx");
    // two views per crater
    let mut imgs = images(90, 41, "v");
    for (i, (m, _)) in imgs.iter_mut().enumerate() {
        m.crater_id = Some(format!("c{}", i / 2));
    }
    build(&dir, &imgs, Codec::Int8);
    Index::remove(&dir, &["v10".to_string()]).unwrap();
    let whole = Index::open(&dir).unwrap();
    let queries: Vec<Descriptors> = [4, 33, 70]
        .iter()
        .map(|&i| near_duplicate(&imgs[i].1, i as u64))
        .collect();
    let want = scores_by_id(&whole, &queries);

    let out = tmp.path().join("shards");
    let set = whole.split(&out, 3, &[]).unwrap();
    assert_eq!(set, ShardSet::read(&out).unwrap());
    assert_eq!(set.shards.iter().map(|s| s.images).sum::<usize>(), 89);
    let mut merged = vec![std::collections::BTreeMap::new(); queries.len()];
    for (i, entry) in set.shards.iter().enumerate() {
        let shard = Index::open(&out.join(&entry.name)).unwrap();
        assert_eq!(shard.live(), entry.images);
        for r in shard.live_rows() {
            assert_eq!(shard_of(shard.meta(r), 3), i);
        }
        for (q, scores) in scores_by_id(&shard, &queries).into_iter().enumerate() {
            for (id, s) in scores {
                assert!(merged[q].insert(id, s).is_none(), "an image in two shards");
            }
        }
    }
    assert_eq!(merged, want);

    // a shard whose encoder differs is refused: its scores would not compare
    std::fs::write(out.join("shard-001/encoder.json"), b"{}").unwrap();
    let e = ShardSet::read(&out).unwrap_err().to_string();
    assert!(
        e.contains("shard-001/encoder.json") && e.contains("not the encoder"),
        "{e}"
    );
    // too many shards for the images: refused before anything is written
    let e = whole
        .split(&tmp.path().join("many"), 200, &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("would hold no image"), "{e}");
    assert!(!tmp.path().join("many").exists());
}
