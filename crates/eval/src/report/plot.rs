//! The report's plots: line charts as inline SVG (log x axis, mAP up), and the series they
//! draw from a run's regimes.

use super::{candidates, get, levers};
use crate::regime::{Family, RegimeId, Whiten};
use crate::regimes::RegimeResult;
use maud::{html, Markup};

pub(super) struct Series {
    pub label: String,
    pub colour: &'static str,
    pub dashed: bool,
    pub points: Vec<(f64, f64)>,
    /// What each point is, shown on hover (the series label when empty).
    pub names: Vec<String>,
}

/// The least distance between two x-axis labels, in pixels.
pub(super) const TICK_GAP_PX: f64 = 36.0;

/// A tick label: short, with the precision its magnitude needs.
fn tick_label(t: f64) -> String {
    if t >= 1000.0 {
        format!("{:.0}K", t / 1000.0)
    } else if t >= 10.0 {
        format!("{t:.0}")
    } else if t >= 1.0 {
        format!("{t:.1}")
    } else {
        format!("{t:.2}")
    }
}

/// A line chart with a log x axis of base `log_base`; nothing when there are no points.
pub(super) fn svg_plot(title: &str, xlabel: &str, series: &[Series], log_base: f64) -> Markup {
    let (w, h, ml, mr, mt, mb) = (640.0, 360.0, 56.0, 170.0, 30.0, 44.0);
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .collect();
    if pts.is_empty() {
        return html! {};
    }
    let lx = |x: f64| x.ln() / log_base.ln();
    let (xmin, xmax) = pts.iter().fold((f64::MAX, f64::MIN), |(a, b), p| {
        (a.min(lx(p.0)), b.max(lx(p.0)))
    });
    let (xmin, xmax) = if xmax - xmin < 1e-9 {
        (xmin - 1.0, xmax + 1.0)
    } else {
        (xmin, xmax)
    };
    let ymax = (pts.iter().map(|p| p.1).fold(0.0, f64::max) * 1.1).clamp(0.05, 1.0);
    let sx = |x: f64| ml + (lx(x) - xmin) / (xmax - xmin) * (w - ml - mr);
    let sy = |y: f64| h - mb - y / ymax * (h - mt - mb);
    let mut ticks: Vec<f64> = pts.iter().map(|p| p.0).collect();
    ticks.sort_by(f64::total_cmp);
    // a label is about 30 px wide at this size: keep ticks that far apart on the page
    ticks.dedup_by(|later, kept| sx(*later) - sx(*kept) < TICK_GAP_PX);
    let grid: Vec<f64> = (0..=5).map(|i| ymax * i as f64 / 5.0).collect();
    html! {
        svg xmlns="http://www.w3.org/2000/svg" width=(w) height=(h) font-family="sans-serif" font-size="11" {
            text x=(ml) y="18" font-size="13" font-weight="bold" { (title) }
            line x1=(ml) y1=(h - mb) x2=(w - mr) y2=(h - mb) stroke="#444" {}
            line x1=(ml) y1=(mt) x2=(ml) y2=(h - mb) stroke="#444" {}
            @for y in &grid {
                line x1=(ml) y1=(sy(*y)) x2=(w - mr) y2=(sy(*y)) stroke="#ddd" {}
                text x=(ml - 4.0) y=(sy(*y) + 4.0) text-anchor="end" { (format!("{y:.2}")) }
            }
            @for t in &ticks {
                text x=(sx(*t)) y=(h - mb + 14.0) text-anchor="middle" { (tick_label(*t)) }
            }
            text x=(ml + (w - ml - mr) / 2.0) y=(h - 8.0) text-anchor="middle" { (xlabel) }
            text x="14" y=(h / 2.0) transform=(format!("rotate(-90 14 {})", h / 2.0)) text-anchor="middle" { "mAP" }
            @for (i, se) in series.iter().enumerate() {
                @let dash = se.dashed.then_some("5,3");
                @let ly = mt + 14.0 * i as f64 + 6.0;
                polyline fill="none" stroke=(se.colour) stroke-width="2" stroke-dasharray=[dash]
                    points=(se.points.iter().map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y))).collect::<Vec<_>>().join(" ")) {}
                @for (j, (x, y)) in se.points.iter().enumerate() {
                    circle cx=(format!("{:.1}", sx(*x))) cy=(format!("{:.1}", sy(*y))) r="3" fill=(se.colour) {
                        title { (se.names.get(j).unwrap_or(&se.label)) " " (format!("{x:.3}: {y:.3}")) }
                    }
                }
                line x1=(w - mr + 8.0) y1=(ly) x2=(w - mr + 28.0) y2=(ly) stroke=(se.colour) stroke-width="2" stroke-dasharray=[dash] {}
                text x=(w - mr + 32.0) y=(ly + 4.0) { (se.label) }
            }
        }
    }
}

const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f",
];

/// The whitening variants a plot draws, strongest first.
const WHITENINGS: [Whiten; 3] = [Whiten::Pairs, Whiten::Pca, Whiten::Off];

fn series_suffix(w: Whiten) -> &'static str {
    match w {
        Whiten::Off => "",
        Whiten::Pca => " white",
        Whiten::Pairs => " pair-white",
    }
}

/// mAP against K for each token family and whitening.
pub(super) fn k_series(results: &[RegimeResult]) -> Vec<Series> {
    let mut out = Vec::new();
    let fams = [
        (Family::InstFps, "inst FPS"),
        (Family::InstAttn, "inst attn"),
        (Family::Raw, "raw attn"),
        (Family::KMeans, "k-means"),
    ];
    for (fi, (fam, label)) in fams.iter().enumerate() {
        for white in WHITENINGS {
            let mut pts: Vec<(f64, f64)> = results
                .iter()
                .filter(|r| r.id.family() == *fam && r.id.whitening == white && !r.id.grouped)
                .filter_map(|r| Some((r.k? as f64, r.summary.map)))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            if !pts.is_empty() {
                out.push(Series {
                    label: format!("{label}{}", series_suffix(white)),
                    colour: COLOURS[fi],
                    dashed: white == Whiten::Off,
                    points: pts,
                    names: vec![],
                });
            }
        }
    }
    for (i, white) in WHITENINGS.iter().enumerate() {
        if let Some(f) = results
            .iter()
            .find(|r| r.id.family() == Family::FullLi && r.id.whitening == *white)
        {
            let ks: Vec<f64> = results
                .iter()
                .filter_map(|r| r.k)
                .filter(|&k| k < f.k.unwrap_or(0))
                .map(|k| k as f64)
                .collect();
            if let (Some(lo), Some(hi)) = (
                ks.iter().cloned().reduce(f64::min),
                ks.iter().cloned().reduce(f64::max),
            ) {
                out.push(Series {
                    label: format!("full LI{}", series_suffix(*white)),
                    colour: COLOURS[(5 + i) % COLOURS.len()],
                    dashed: true,
                    points: vec![(lo, f.summary.map), (hi, f.summary.map)],
                    names: vec![],
                });
            }
        }
    }
    out
}

/// mAP against stored bytes per image: instance tokens in f32 and the K=32 codecs.
pub(super) fn bytes_series(results: &[RegimeResult]) -> Vec<Series> {
    let mut out = Vec::new();
    for (i, white) in WHITENINGS.iter().enumerate() {
        let mut inst: Vec<(f64, f64)> = results
            .iter()
            .filter(|r| {
                r.id.family() == Family::InstFps && r.id.whitening == *white && !r.id.grouped
            })
            .map(|r| (r.bytes_per_image as f64, r.summary.map))
            .collect();
        inst.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut codecs: Vec<(f64, f64)> = results
            .iter()
            .filter(|r| r.id.family() == Family::Codec && r.id.whitening == *white && !r.id.grouped)
            .map(|r| (r.bytes_per_image as f64, r.summary.map))
            .collect();
        codecs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let w = series_suffix(*white);
        if !inst.is_empty() {
            out.push(Series {
                label: format!("inst FPS f32{w}"),
                colour: COLOURS[2 * i],
                dashed: *white == Whiten::Off,
                points: inst,
                names: vec![],
            });
        }
        if !codecs.is_empty() {
            out.push(Series {
                label: format!("K=32 codecs{w}"),
                colour: COLOURS[2 * i + 1],
                dashed: *white == Whiten::Off,
                points: codecs,
                names: vec![],
            });
        }
    }
    out
}

/// The candidates at each lever setting, as points (cost, mAP); `cost` says which.
pub(super) fn candidate_series(
    results: &[RegimeResult],
    cost: impl Fn(&RegimeResult) -> f64,
) -> Vec<Series> {
    let mut out = Vec::new();
    let levers = levers(results.iter().find_map(|r| r.id.verify));
    for (i, lever) in levers.iter().enumerate() {
        let mut pts: Vec<(f64, f64, String)> = candidates()
            .into_iter()
            .filter_map(|b| {
                get(
                    results,
                    RegimeId {
                        verify: lever.verify,
                        ..b.whitened(lever.whiten).grouped(lever.grouped)
                    },
                )
            })
            .map(|r| (cost(r), r.summary.map, r.id.to_string()))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        if !pts.is_empty() {
            out.push(Series {
                label: lever.label.trim_start_matches("+ ").into(),
                colour: COLOURS[i % COLOURS.len()],
                dashed: lever.whiten == Whiten::Off,
                points: pts.iter().map(|p| (p.0, p.1)).collect(),
                names: pts.into_iter().map(|p| p.2).collect(),
            });
        }
    }
    out
}
