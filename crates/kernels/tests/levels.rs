//! Every kernel at every level this CPU supports, against plain references: int8 results
//! bit-identical across levels, f32 results within a stated rounding bound. Shapes cross the
//! register blocks (rows of 1-3 and 6-8, query blocks of 32, dimensions that are and are not
//! multiples of 4, 32 and 64).

use craterdex_kernels::level::{self, Level};
use craterdex_kernels::{f32 as kf, int8};
use rand::{Rng, SeedableRng};

fn levels() -> Vec<Level> {
    let l = level::supported();
    eprintln!("testing kernel levels {l:?} (active {})", level::active());
    l
}

fn unit_rows(rng: &mut impl Rng, n: usize, d: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..n * d).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    for r in v.chunks_mut(d) {
        let n = r.iter().map(|x| x * x).sum::<f32>().sqrt();
        r.iter_mut().for_each(|x| *x /= n);
    }
    v
}

fn codes(rng: &mut impl Rng, n: usize) -> Vec<i8> {
    (0..n).map(|_| rng.gen_range(-127..=127)).collect()
}

/// (d, kq, kd, docs)
const SHAPES: [(usize, usize, usize, usize); 8] = [
    (384, 32, 32, 40),
    (384, 20, 7, 30),
    (64, 33, 9, 25),
    (40, 5, 17, 31),
    (128, 64, 1, 50),
    (12, 70, 3, 10),
    (8, 1, 8, 12),
    (36, 16, 2, 9),
];

#[test]
fn int8_dots_are_exact_on_every_level() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    for n in [0, 1, 3, 31, 32, 33, 63, 64, 65, 384, 1000] {
        let (a, b) = (codes(&mut rng, n), codes(&mut rng, n));
        let want: i32 = a.iter().zip(&b).map(|(&x, &y)| x as i32 * y as i32).sum();
        for l in levels() {
            assert_eq!(int8::dot_at(l, &a, &b), want, "{l} n {n}");
        }
    }
    // the extremes the sign trick must not saturate
    let a = vec![-127i8; 384];
    let b = vec![127i8; 384];
    for l in levels() {
        assert_eq!(int8::dot_at(l, &a, &b), -127 * 127 * 384, "{l}");
        assert_eq!(int8::dot_at(l, &a, &a), 127 * 127 * 384, "{l}");
    }
}

#[test]
fn int8_maxsim_is_bit_identical_across_levels_and_close_to_f32() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
    for (d, kq, kd, n) in SHAPES {
        let q = unit_rows(&mut rng, kq, d);
        let docs = unit_rows(&mut rng, n * kd, d);
        let (mut dc, mut ds) = (Vec::new(), Vec::new());
        int8::quantise_rows(&docs, d, &mut dc, &mut ds);
        // split into two runs to cover the runs API
        let cut = (n / 2) * kd;
        let runs = [(&dc[..cut * d], &ds[..cut]), (&dc[cut * d..], &ds[cut..])];
        let mut reference: Option<Vec<f32>> = None;
        for l in levels() {
            let query = int8::I8Query::with_level(&q, d, l);
            let mut out = Vec::new();
            query.maxsim(&runs, kd, &mut out);
            assert_eq!(out.len(), n, "{l}");
            match &reference {
                None => reference = Some(out),
                Some(r) => assert_eq!(
                    &out,
                    r,
                    "level {l} (runs at {}) d {d} kq {kq} kd {kd}",
                    query.level()
                ),
            }
        }
        let got = reference.unwrap();
        for (i, s) in got.iter().enumerate() {
            let exact = kf::maxsim(&q, &docs[i * kd * d..(i + 1) * kd * d], d);
            assert!((s - exact).abs() < 1.5e-2, "d {d} doc {i}: {s} vs {exact}");
        }
    }
}

#[test]
fn int8_products_are_exact_on_every_level() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    for (d, nq, n) in [
        (384, 32, 137),
        (384, 1, 70),
        (64, 3, 200),
        (40, 33, 9),
        (36, 2, 5),
    ] {
        let q = codes(&mut rng, nq * d);
        let rows = codes(&mut rng, n * d);
        let want: Vec<i32> = rows
            .chunks_exact(d)
            .flat_map(|r| {
                q.chunks_exact(d)
                    .map(|t| {
                        t.iter()
                            .zip(r)
                            .map(|(&x, &y)| x as i32 * y as i32)
                            .sum::<i32>()
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        for l in levels() {
            let query = int8::I8Query::from_codes(q.clone(), vec![1.0; nq], d, l);
            let mut out = Vec::new();
            query.products(&rows, &mut out);
            assert_eq!(out, want, "{l} d {d} nq {nq} n {n}");
        }
    }
}

#[test]
fn int8_quantiser_is_identical_across_levels() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
    let v = unit_rows(&mut rng, 50, 384);
    let mut reference = None;
    for l in levels() {
        let (mut c, mut s) = (Vec::new(), Vec::new());
        for r in v.chunks_exact(384) {
            s.push(int8::quantise_at(l, r, &mut c));
        }
        match &reference {
            None => reference = Some((c, s)),
            Some(r) => assert_eq!(r, &(c, s), "{l}"),
        }
    }
    let (c, s) = reference.unwrap();
    assert!(c.iter().all(|&x| x >= -127));
    assert!(c
        .chunks_exact(384)
        .all(|r| r.iter().any(|&x| x.abs() == 127)));
    let mut zero = Vec::new();
    assert_eq!(int8::quantise(&[0.0; 4], &mut zero), 1.0);
    assert_eq!(zero, vec![0; 4]);
    assert!(s.iter().all(|&x| x > 0.0));
}

#[test]
fn f32_maxsim_and_dots_agree_across_levels_within_rounding() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    for (d, kq, kd, n) in SHAPES {
        let q = unit_rows(&mut rng, kq, d);
        let docs = unit_rows(&mut rng, n * kd, d);
        let want: Vec<f32> = docs
            .chunks_exact(kd * d)
            .map(|doc| kf::maxsim(&q, doc, d))
            .collect();
        let rows = &docs[..(n * kd).min(77) * d];
        let want_dots: Vec<f32> = rows
            .chunks_exact(d)
            .flat_map(|r| {
                q.chunks_exact(d)
                    .map(|t| t.iter().zip(r).map(|(x, y)| (x * y) as f64).sum::<f64>() as f32)
                    .collect::<Vec<_>>()
            })
            .collect();
        for l in levels() {
            let query = kf::F32Query::with_level(&q, d, l);
            let mut out = Vec::new();
            query.maxsim(&docs, kd, &mut out);
            assert_eq!(out.len(), n);
            for (a, b) in out.iter().zip(&want) {
                assert!(
                    (a - b).abs() < 1e-5,
                    "{l} d {d} kq {kq} kd {kd}: {a} vs {b}"
                );
            }
            let mut dots = Vec::new();
            query.dots(rows, &mut dots);
            assert_eq!(dots.len(), want_dots.len());
            for (a, b) in dots.iter().zip(&want_dots) {
                assert!((a - b).abs() < 1e-5, "{l} dots d {d}: {a} vs {b}");
            }
            let m = q.len().min(docs.len());
            for (x, y) in [(&q[..d], &docs[..d]), (&q[..m], &docs[..m])] {
                let exact: f64 = x.iter().zip(y.iter()).map(|(a, b)| (a * b) as f64).sum();
                assert!((kf::dot_at(l, x, y) as f64 - exact).abs() < 1e-4, "{l} dot");
            }
        }
    }
}

#[test]
fn maps_are_applied_everywhere() {
    let mut v: Vec<f32> = (0..1001).map(|i| i as f32).collect();
    kf::map_in_place(&mut v, |x| 2.0 * x + 1.0);
    assert!(v
        .iter()
        .enumerate()
        .all(|(i, &x)| x == 2.0 * i as f32 + 1.0));
}

#[test]
fn empty_queries_and_documents_are_safe() {
    for l in levels() {
        let q = int8::I8Query::with_level(&[], 8, l);
        let mut out = Vec::new();
        q.maxsim(&[(&[0i8; 16], &[1.0, 1.0])], 1, &mut out);
        assert_eq!(out, vec![0.0, 0.0]);
        let f = kf::F32Query::with_level(&[], 8, l);
        out.clear();
        f.maxsim(&[0.0; 16], 2, &mut out);
        assert_eq!(out, vec![0.0]);
    }
}
