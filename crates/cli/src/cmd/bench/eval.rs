//! `craterdex bench eval`: the time and memory of the evaluation's regimes (extraction
//! excluded) on a synthetic benchmark of any size, with a projection to the full
//! CraterBench-R (50,000 gallery and 5,000 query images).

use super::{proc_status_kb, EvalBench};
use anyhow::Result;
use craterdex_engine::{FeatureSet, ImageMeta};
use craterdex_eval::regimes::{self, EvalInput, EvalOptions};
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Instant;

/// The full CraterBench-R.
const FULL_GALLERY: f64 = 50_000.0;
const FULL_QUERIES: f64 = 5_000.0;

/// Random backbone features: two gallery views per crater, queries noisy copies of one view.
fn synthetic(gallery: usize, queries: usize, t: usize, d: usize) -> (FeatureSet, FeatureSet) {
    let image = |seed: u64| -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let cls = (0..d).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let patches = (0..t * d).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        let attention = (0..t).map(|_| rng.gen_range(0.0f32..1.0)).collect();
        (cls, patches, attention)
    };
    let build = |n: usize, make: &(dyn Fn(usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) + Sync)| {
        let imgs: Vec<_> = (0..n).into_par_iter().map(make).collect();
        let mut f = FeatureSet {
            dim: d,
            tokens: t,
            ..Default::default()
        };
        for (i, (c, p, a)) in imgs.into_iter().enumerate() {
            f.ids.push(format!("i{i}"));
            f.cls.extend(c);
            f.patches.extend(p);
            f.attention.extend(a);
        }
        f
    };
    let g = build(gallery, &|i| image(i as u64));
    let q = build(queries, &|i| {
        let (mut c, mut p, a) = image((2 * i % gallery) as u64);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(u64::MAX - i as u64);
        c.iter_mut()
            .chain(p.iter_mut())
            .for_each(|v| *v += rng.gen_range(-0.5f32..0.5));
        (c, p, a)
    });
    (g, q)
}

pub fn run(b: EvalBench) -> Result<()> {
    let (n, nq) = (b.gallery.max(4), b.queries.max(1));
    eprintln!(
        "synthetic benchmark: {n} gallery and {nq} query images x {} tokens x {}-d",
        b.tokens, b.dim
    );
    let (gallery, queries) = synthetic(n, nq, b.tokens, b.dim);
    let craters: Vec<String> = (0..n).map(|i| format!("c{}", i / 2)).collect();
    let metas: Vec<ImageMeta> = gallery
        .ids
        .iter()
        .zip(&craters)
        .map(|(id, c)| ImageMeta {
            id: id.clone(),
            crater_id: Some(c.clone()),
            ..Default::default()
        })
        .collect();
    let relevance: Vec<BTreeSet<String>> = (0..nq)
        .map(|i| BTreeSet::from([craters[2 * i % n].clone()]))
        .collect();
    let queried: BTreeSet<&String> = relevance.iter().flatten().collect();
    let input = EvalInput {
        gallery: &gallery,
        queries: &queries,
        gallery_metas: metas,
        gallery_craters: &craters,
        relevance: &relevance,
        whitening_rows: (0..n).filter(|&i| !queried.contains(&craters[i])).collect(),
        query_variants: None,
        query_toward: Vec::new(),
    };
    let opts = if b.full {
        EvalOptions::default()
    } else {
        EvalOptions::quick()
    };
    let times: Mutex<Vec<(String, Instant)>> = Mutex::new(Vec::new());
    let start = Instant::now();
    let results = regimes::run(&input, &opts, &|name| {
        times
            .lock()
            .unwrap()
            .push((name.to_string(), Instant::now()));
    })?;
    let total = start.elapsed().as_secs_f64();
    let mut marks = times.into_inner().unwrap();
    marks.push(("end".into(), Instant::now()));
    println!("{}", craterdex_kernels::level::describe());
    println!(
        "{} regimes ({}) on {n} x {nq}, {} threads: {total:.0} s in all, peak RSS {:.1} GB",
        results.len(),
        if b.full { "full set" } else { "--quick" },
        rayon::current_num_threads(),
        proc_status_kb("/proc/self/status", "VmHWM:").unwrap_or(f64::NAN) / 1024.0 / 1024.0
    );
    // exhaustive searches grow with gallery x queries, everything else with the images
    let pairs = FULL_GALLERY * FULL_QUERIES / (n * nq) as f64;
    let images = (FULL_GALLERY + FULL_QUERIES) / (n + nq) as f64;
    println!(
        "{:<34} {:>9} {:>22}",
        "regime (its search starts here)", "seconds", "projected 50,000 x 5,000"
    );
    let mut projected = 0.0;
    for (w, r) in marks.windows(2).zip(&results) {
        let secs = (w[1].1 - w[0].1).as_secs_f64();
        let exhaustive = r.id.shortlist.is_none() && r.id.family() != regimes::Family::Single;
        let p = secs * if exhaustive { pairs } else { images };
        projected += p;
        println!("{:<34} {secs:>9.1} {:>20.0} s", w[0].0, p);
    }
    println!(
        "projected for the full CraterBench-R on this machine: {:.1} h (encoding is linear in the \
         images, exhaustive late interaction quadratic); extraction not included",
        projected / 3600.0
    );
    Ok(())
}
