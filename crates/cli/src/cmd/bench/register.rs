//! `craterdex bench register`: the time to register a second observation of a real crater
//! list to it, with the default hypothesis budget against every pair (the exhaustive
//! reference) in the same run, and whether each found the transform.

use super::{percentile, RegisterBench};
use anyhow::Result;
use craterdex_workflows::register::{observe, register, Crater, RegisterOptions, Transform};
use std::time::Instant;

/// The observations timed per crater list: (rotation degrees, scale to the catalogue).
const VIEWS: [(f64, f64); 4] = [(0.0, 1.0), (37.0, 0.8), (-150.0, 1.3), (179.0, 0.7)];

fn milliseconds(repeats: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..repeats.max(1))
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    percentile(&t, 0.5)
}

pub fn run(b: RegisterBench) -> Result<()> {
    println!("{}", craterdex_kernels::level::describe());
    println!("registration is scalar f64 on one thread (no SIMD kernel level applies)");
    println!(
        "{:<36} {:>5} {:>6} {:>6} {:>9} {:>10} {:>6} {:>8} {:>9}",
        "crater list",
        "rot",
        "source",
        "cat",
        "default",
        "reference",
        "ratio",
        "rot err",
        "reference"
    );
    let fast = RegisterOptions::default();
    let exhaustive = RegisterOptions {
        max_hypotheses: 0,
        ..RegisterOptions::default()
    };
    let mut ratios = Vec::new();
    let mut worst_default: f64 = 0.0;
    for path in &b.craters {
        let cat: Vec<Crater> = craterdex_eval::catalogue::read_pixel_catalogue(path)?
            .into_iter()
            .filter(|c| c.diameter >= b.min_diameter)
            .map(|c| Crater {
                x: c.x,
                y: c.y,
                d: c.diameter,
            })
            .collect();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        for (k, &(deg, scale)) in VIEWS.iter().enumerate() {
            let t = Transform::similarity(scale, deg.to_radians(), 140.0, -60.0);
            let (src, _) = observe(&cat, &t, 0.1, 0.1, k as u64 + 1);
            let error = |o: &RegisterOptions| match register(&src, &cat, o) {
                Ok(f) => format!("{:.2}", (f.transform.rotation_deg() - deg).abs()),
                Err(e) => format!("no: {}", e.reason.chars().take(24).collect::<String>()),
            };
            let ms = milliseconds(b.repeats, || {
                let _ = register(&src, &cat, &fast);
            });
            let (ref_ms, ref_err) = if b.no_reference {
                (f64::NAN, "-".to_string())
            } else {
                let ms = milliseconds(b.repeats, || {
                    let _ = register(&src, &cat, &exhaustive);
                });
                (ms, error(&exhaustive))
            };
            worst_default = worst_default.max(ms);
            if ref_ms.is_finite() {
                ratios.push(ms / ref_ms);
            }
            println!(
                "{:<36} {:>5.0} {:>6} {:>6} {:>7.1}ms {:>8.1}ms {:>6.3} {:>8} {:>9}",
                name,
                deg,
                src.len(),
                cat.len(),
                ms,
                ref_ms,
                ms / ref_ms,
                error(&fast),
                ref_err
            );
        }
    }
    if !ratios.is_empty() {
        let geo = (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp();
        println!(
            "default / reference time: geometric mean {geo:.3} over {} observations",
            ratios.len()
        );
    }
    println!("slowest default registration: {worst_default:.1} ms");
    Ok(())
}
