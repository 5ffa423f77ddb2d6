//! A self-contained HTML report: the table, the ablation of the levers beyond the paper
//! (whitening, view grouping), mAP-vs-K, mAP-vs-bytes and mAP-vs-latency plots (inline SVG),
//! what turning the queries costs (when the run had a turned query set), the paper's
//! findings checked on this run, and example queries with their top-5 before and after
//! reranking (relevant framed green, others red). No external assets.

use crate::regime::{Family, RegimeId, Tokens, Whiten};
use crate::regimes::RegimeResult;
use crate::turned::{Turned, TurnedRow};
use base64::Engine;
use craterdex_engine::{Protocol, ProtocolInfo};
use std::collections::BTreeSet;
use std::fmt::Write;
use std::path::PathBuf;

/// A claim of the paper checked against this run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Finding {
    pub claim: String,
    pub holds: Option<bool>,
    pub detail: String,
}

/// The turned-query loss (mAP) the report marks as held: a match from another orbit should
/// cost at most this much.
const TURNED_LOSS_GOAL: f64 = 0.03;

fn get(r: &[RegimeResult], id: RegimeId) -> Option<&RegimeResult> {
    r.iter().find(|x| x.id == id)
}

/// The paper's findings, per whitening variant present in `results`. Each compares like
/// with like: the paper lists hits image by image, so only ungrouped regimes take part.
pub fn findings(results: &[RegimeResult]) -> Vec<Finding> {
    let mut out = Vec::new();
    let variants: BTreeSet<Whiten> = results.iter().map(|r| r.id.whitening).collect();
    for white in variants {
        let tag = format!(" ({})", white.label());
        let map = |id: RegimeId| get(results, id.whitened(white)).map(|r| r.summary.map);
        let ungrouped = |r: &&RegimeResult| r.id.whitening == white && !r.id.grouped;
        let best_single = results
            .iter()
            .filter(ungrouped)
            .filter(|r| r.id.family() == Family::Single)
            .max_by(|a, b| a.summary.map.total_cmp(&b.summary.map));
        let full_li = map(RegimeId::of(Tokens::Full));
        let inst = |seeds, k| RegimeId::of(Tokens::Instance { seeds, k });
        let int8 = RegimeId {
            codec: Some(craterdex_engine::Codec::Int8),
            ..RegimeId::fps(32)
        };
        let two_stage = RegimeId {
            shortlist: Some(100),
            ..RegimeId::fps(32)
        };
        let mut add = |claim: String, v: Option<(bool, String)>| {
            let (holds, detail) = match v {
                Some((h, d)) => (Some(h), d),
                None => (None, "not measured in this run".into()),
            };
            out.push(Finding {
                claim: claim + &tag,
                holds,
                detail,
            });
        };
        add(
            "full-token LI beats the best single vector".into(),
            full_li.zip(best_single).map(|(f, b)| {
                (
                    f > b.summary.map,
                    format!("full_li {f:.3} vs {} {:.3}", b.id, b.summary.map),
                )
            }),
        );
        add(
            "instance tokens beat raw selection at K=16 (some seed strategy)".into(),
            map(RegimeId::of(Tokens::Raw(16))).and_then(|raw| {
                let best = map(inst(craterdex_engine::SeedStrategy::Attention, 16))
                    .into_iter()
                    .chain(map(RegimeId::fps(16)))
                    .fold(f64::MIN, f64::max);
                (best > f64::MIN).then(|| {
                    (
                        best > raw,
                        format!("best instance {best:.3} vs raw {raw:.3}"),
                    )
                })
            }),
        );
        add(
            "instance tokens at K>=32 come within 0.01 mAP of full LI".into(),
            full_li.and_then(|f| {
                let best = results
                    .iter()
                    .filter(ungrouped)
                    .filter(|r| {
                        matches!(r.id.family(), Family::InstAttn | Family::InstFps)
                            && r.k.is_some_and(|k| k >= 32)
                    })
                    .max_by(|a, b| a.summary.map.total_cmp(&b.summary.map))?;
                Some((
                    best.summary.map >= f - 0.01,
                    format!("{} {:.3} vs full_li {f:.3}", best.id, best.summary.map),
                ))
            }),
        );
        add(
            "two-stage at S=100 recovers >= 85% of exhaustive LI mAP".into(),
            map(two_stage).zip(map(RegimeId::fps(32))).map(|(t, e)| {
                (
                    t >= 0.85 * e,
                    format!("{t:.3} / {e:.3} = {:.1}%", 100.0 * t / e.max(1e-12)),
                )
            }),
        );
        add(
            "int8 costs <= 0.005 mAP".into(),
            map(int8).zip(map(RegimeId::fps(32))).map(|(i, f)| {
                (
                    f - i <= 0.005,
                    format!("int8 {i:.3} vs f32 {f:.3} (delta {:+.4})", i - f),
                )
            }),
        );
    }
    out
}

struct Series {
    label: String,
    colour: &'static str,
    dashed: bool,
    points: Vec<(f64, f64)>,
    /// What each point is, shown on hover (the series label when empty).
    names: Vec<String>,
}

/// A line chart with a log2 or log10 x axis.
/// The least distance between two x-axis labels, in pixels.
const TICK_GAP_PX: f64 = 36.0;

fn svg_plot(title: &str, xlabel: &str, series: &[Series], log_base: f64) -> String {
    let (w, h, ml, mr, mt, mb) = (640.0, 360.0, 56.0, 170.0, 30.0, 44.0);
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .collect();
    if pts.is_empty() {
        return String::new();
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
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11"><text x="{}" y="18" font-size="13" font-weight="bold">{title}</text>"#,
        ml
    );
    let _ = write!(
        s,
        r##"<line x1="{ml}" y1="{}" x2="{}" y2="{}" stroke="#444"/><line x1="{ml}" y1="{mt}" x2="{ml}" y2="{}" stroke="#444"/>"##,
        h - mb,
        w - mr,
        h - mb,
        h - mb
    );
    for i in 0..=5 {
        let y = ymax * i as f64 / 5.0;
        let _ = write!(
            s,
            r##"<line x1="{ml}" y1="{0}" x2="{1}" y2="{0}" stroke="#ddd"/><text x="{2}" y="{3}" text-anchor="end">{y:.2}</text>"##,
            sy(y),
            w - mr,
            ml - 4.0,
            sy(y) + 4.0
        );
    }
    let mut ticks: Vec<f64> = pts.iter().map(|p| p.0).collect();
    ticks.sort_by(f64::total_cmp);
    // a label is about 30 px wide at this size: keep ticks that far apart on the page
    ticks.dedup_by(|later, kept| sx(*later) - sx(*kept) < TICK_GAP_PX);
    for t in ticks {
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            sx(t),
            h - mb + 14.0,
            if t >= 1000.0 {
                format!("{:.0}K", t / 1000.0)
            } else if t >= 10.0 {
                format!("{t:.0}")
            } else if t >= 1.0 {
                format!("{t:.1}")
            } else {
                format!("{t:.2}")
            }
        );
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{xlabel}</text><text x="14" y="{}" transform="rotate(-90 14 {})" text-anchor="middle">mAP</text>"#,
        ml + (w - ml - mr) / 2.0,
        h - 8.0,
        h / 2.0,
        h / 2.0
    );
    for (i, se) in series.iter().enumerate() {
        let path: Vec<String> = se
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let dash = if se.dashed {
            r#" stroke-dasharray="5,3""#
        } else {
            ""
        };
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{}" stroke-width="2"{dash} points="{}"/>"#,
            se.colour,
            path.join(" ")
        );
        for (i, &(x, y)) in se.points.iter().enumerate() {
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"><title>{} {x:.3}: {y:.3}</title></circle>"#,
                sx(x),
                sy(y),
                se.colour,
                esc(se.names.get(i).unwrap_or(&se.label))
            );
        }
        let ly = mt + 14.0 * i as f64 + 6.0;
        let _ = write!(
            s,
            r#"<line x1="{0}" y1="{ly}" x2="{1}" y2="{ly}" stroke="{2}" stroke-width="2"{dash}/><text x="{3}" y="{4}">{5}</text>"#,
            w - mr + 8.0,
            w - mr + 28.0,
            se.colour,
            w - mr + 32.0,
            ly + 4.0,
            se.label
        );
    }
    s.push_str("</svg>");
    s
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

fn k_series(results: &[RegimeResult]) -> Vec<Series> {
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

fn bytes_series(results: &[RegimeResult]) -> Vec<Series> {
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

/// The regimes the ablation and the cost plots compare: the paper's single vector and
/// instance tokens, the best single vector of #14, and the shipped recipe with its IVF form.
fn candidates() -> [RegimeId; 5] {
    [
        RegimeId::of(Tokens::Single(craterdex_engine::Pooling::Cls)),
        RegimeId::of(Tokens::Single(craterdex_engine::Pooling::Max)),
        RegimeId::fps(32),
        RegimeId::shipped(),
        RegimeId {
            ivf: true,
            ..RegimeId::shipped()
        },
    ]
}

/// A lever setting of the ablation: the whitening, view grouping and spatial verification
/// (of the `N` best images) it adds.
struct Lever {
    whiten: Whiten,
    grouped: bool,
    verify: Option<usize>,
    label: String,
}

/// The lever settings of the ablation, in the order they were added; spatial verification
/// where the run verified (`eval --verify N`).
fn levers(verify: Option<usize>) -> Vec<Lever> {
    let lever = |whiten, grouped, label: &str| Lever {
        whiten,
        grouped,
        verify: None,
        label: label.to_string(),
    };
    let mut out = vec![
        lever(Whiten::Off, false, "paper (no whitening)"),
        lever(Whiten::Pca, false, "+ PCA whitening"),
        lever(Whiten::Pairs, false, "+ pair whitening"),
        lever(Whiten::Pairs, true, "+ view grouping"),
    ];
    if let Some(n) = verify {
        out.push(Lever {
            verify: Some(n),
            label: format!("+ spatial verification of {n}"),
            ..lever(Whiten::Pairs, true, "")
        });
    }
    out
}

/// A table of the candidates (rows) with the levers added one at a time (columns): `cell`
/// shows a regime `find` has, `row_end` closes a row from its cells (the extra columns of
/// `extra_heads`). Empty when no candidate was run.
fn lever_table<'a, T: 'a>(
    levers: &[Lever],
    extra_heads: &str,
    find: impl Fn(RegimeId) -> Option<&'a T>,
    cell: impl Fn(&T) -> String,
    row_end: impl Fn(&[Option<&'a T>]) -> String,
) -> String {
    let mut h = String::from("<table><tr><th>regime</th>");
    for lever in levers {
        let _ = write!(h, "<th>{}</th>", esc(&lever.label));
    }
    let _ = write!(h, "{extra_heads}</tr>");
    let mut rows = 0;
    for base in candidates() {
        let cells: Vec<Option<&T>> = levers
            .iter()
            .map(|l| {
                find(RegimeId {
                    verify: l.verify,
                    ..base.whitened(l.whiten).grouped(l.grouped)
                })
            })
            .collect();
        if cells.iter().all(Option::is_none) {
            continue;
        }
        rows += 1;
        let _ = write!(h, "<tr><td>{base}</td>");
        for c in &cells {
            let _ = write!(h, "<td>{}</td>", c.map(&cell).unwrap_or_default());
        }
        let _ = write!(h, "{}</tr>", row_end(&cells));
    }
    h.push_str("</table>");
    if rows == 0 {
        return String::new();
    }
    h
}

/// Per-lever ablation: each candidate regime with the levers added one at a time (mAP, R@1),
/// and its cost.
fn ablation_table(results: &[RegimeResult]) -> String {
    lever_table(
        &levers(results.iter().find_map(|r| r.id.verify)),
        "<th>bytes/image</th><th>ms/query</th>",
        |id| get(results, id),
        |r| format!("{:.3} <small>({:.3})</small>", r.summary.map, r.summary.r1),
        |cells| {
            let last = cells.iter().rev().flatten().next();
            last.map(|r| format!("<td>{}</td><td>{:.2}</td>", r.bytes_per_image, r.query_ms))
                .unwrap_or_default()
        },
    )
}

/// The candidates with each lever on turned queries: turned mAP and the loss against the
/// same views as built, green where the loss is at most [`TURNED_LOSS_GOAL`].
fn turned_ablation_table(t: &Turned) -> String {
    lever_table(
        &levers(t.rows.iter().find_map(|r| r.regime.verify)),
        "",
        |id| t.rows.iter().find(|r| r.regime == id),
        |r: &TurnedRow| {
            format!(
                r#"{:.3} <small class="{}">({:+.3})</small>"#,
                r.map_turned,
                if r.loss() <= TURNED_LOSS_GOAL {
                    "ok"
                } else {
                    "no"
                },
                -r.loss()
            )
        },
        |_| String::new(),
    )
}

/// Every regime on the paired views, as built and turned.
fn turned_table(t: &Turned) -> String {
    let mut h = String::from("<table><tr><th>regime</th><th>mAP</th><th>turned</th><th>loss</th><th>R@1</th><th>turned</th></tr>");
    for r in &t.rows {
        let _ = write!(
            h,
            r#"<tr><td>{}</td><td>{:.3}</td><td>{:.3}</td><td class="{}">{:.3}</td><td>{:.3}</td><td>{:.3}</td></tr>"#,
            r.regime,
            r.map,
            r.map_turned,
            if r.loss() <= TURNED_LOSS_GOAL {
                "ok"
            } else {
                "no"
            },
            r.loss(),
            r.r1,
            r.r1_turned
        );
    }
    h.push_str("</table>");
    h
}

/// The candidates at each lever setting, as points (cost, mAP); `cost` says which.
fn candidate_series(results: &[RegimeResult], cost: impl Fn(&RegimeResult) -> f64) -> Vec<Series> {
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

/// Everything the report shows about the example queries.
pub struct Examples<'a> {
    pub query_paths: &'a [PathBuf],
    pub query_ids: &'a [String],
    pub gallery_paths: &'a [PathBuf],
    pub gallery_craters: &'a [String],
    pub relevance: &'a [BTreeSet<String>],
    /// Query indices to show.
    pub show: Vec<usize>,
}

fn thumb(path: &std::path::Path, frame: &str, caption: &str) -> String {
    let mime = match path
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase())
    {
        Some(e) if e == "jpg" || e == "jpeg" => "image/jpeg",
        _ => "image/png",
    };
    let src = match std::fs::read(path) {
        Ok(b) if b.len() < 2 << 20 => format!(
            "data:{mime};base64,{}",
            base64::engine::general_purpose::STANDARD.encode(b)
        ),
        _ => String::new(),
    };
    format!(
        r#"<figure style="border:4px solid {frame}"><img src="{src}" alt="{caption}"><figcaption>{caption}</figcaption></figure>"#
    )
}

/// Text for HTML content and double-quoted attribute values alike (ids and paths may hold
/// quotes; the page quotes every attribute with `"`).
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The runs a report shows: one, under the protocol it ran, and where there is one the
/// paper's regimes run again under the paper's protocol.
pub struct Runs<'a> {
    pub protocol: &'a ProtocolInfo,
    pub results: &'a [RegimeResult],
    pub paper: Option<(&'a ProtocolInfo, &'a [RegimeResult])>,
}

impl Runs<'_> {
    /// The run the paper's findings are checked on: under the paper's protocol where one
    /// ran under it.
    fn for_findings(&self) -> (&ProtocolInfo, &[RegimeResult]) {
        match self.paper {
            Some(paper) => paper,
            None => (self.protocol, self.results),
        }
    }
}

/// The protocol table at the top of the report: a column per run.
fn protocol_table(runs: &Runs) -> String {
    let mut columns = vec![("this run", runs.protocol)];
    if let Some((p, _)) = runs.paper {
        columns.push(("the paper's regimes", p));
    }
    let mut h = String::from("<table><tr><th>protocol</th>");
    for (label, _) in &columns {
        let _ = write!(h, "<th>{}</th>", esc(label));
    }
    h.push_str("</tr>");
    type Row = (&'static str, fn(&ProtocolInfo) -> String);
    let rows: [Row; 5] = [
        ("name", |p| p.name.clone()),
        ("blocks run", |p| format!("{} of {}", p.blocks, p.depth)),
        ("brightness", |p| p.brightness.to_string()),
        ("precision", |p| p.precision.to_string()),
        ("model", |p| p.model.clone()),
    ];
    for (name, value) in rows {
        let _ = write!(h, "<tr><td>{name}</td>");
        for (_, p) in &columns {
            let _ = write!(h, "<td>{}</td>", esc(&value(p)));
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
    h
}

/// The heading of the findings, saying which protocol they were checked under.
fn findings_heading(protocol: &ProtocolInfo) -> String {
    if protocol.name == Protocol::Paper.to_string() {
        return "<h2>Findings of the paper, checked under the paper's protocol</h2>".into();
    }
    format!(
        "<h2>Findings of the paper, checked here under the {} protocol</h2><p><b>Not the \
         paper's protocol</b> ({} of {} blocks, brightness {}, {} extraction, where the paper \
         runs every block on crops as stored in f32): these numbers do not reproduce the \
         paper's. <code>craterdex eval --protocol paper</code> checks them as published.</p>",
        esc(&protocol.name),
        protocol.blocks,
        protocol.depth,
        protocol.brightness,
        protocol.precision
    )
}

/// The table of every regime of a run.
fn regimes_table(results: &[RegimeResult]) -> String {
    let mut h = String::from("<table><tr><th>regime</th><th>R@1</th><th>R@5</th><th>R@10</th><th>mAP</th><th>K</th><th>bytes/image</th><th>R@S</th><th>ms/query</th></tr>");
    for r in results {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2}</td></tr>",
            r.id,
            r.summary.r1,
            r.summary.r5,
            r.summary.r10,
            r.summary.map,
            r.k.map(|k| k.to_string()).unwrap_or_default(),
            r.bytes_per_image,
            r.shortlist_recall.map(|v| format!("{v:.3}")).unwrap_or_default(),
            r.query_ms
        );
    }
    h.push_str("</table>");
    h
}

/// Renders the report. `before`/`after` name the regimes whose top-5 the examples show.
pub fn render(
    title: &str,
    intro: &str,
    run: &[(String, String)],
    runs: &Runs,
    turned: Option<&Turned>,
    ex: Option<&Examples>,
    before: RegimeId,
    after: RegimeId,
) -> String {
    let results = runs.results;
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!doctype html><html><head><meta charset="utf-8"><title>{t}</title><style>
body{{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}} table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}} td:first-child,th:first-child{{text-align:left}}
figure{{display:inline-block;margin:2px;text-align:center}} figure img{{width:96px;height:96px;image-rendering:pixelated;display:block}}
figcaption{{font-size:10px;max-width:96px;overflow:hidden}} .row{{margin:6px 0}} .lbl{{display:inline-block;width:90px;font-size:12px;vertical-align:top}}
.ok{{color:#1a7f37}} .no{{color:#c62828}} table.run{{margin-bottom:1em}} table.run th,table.run td{{text-align:left;font-weight:normal}} table.run th{{color:#555}}</style></head><body><h1>{t}</h1><p>{intro}</p>"#,
        t = esc(title),
        intro = esc(intro)
    );
    if !run.is_empty() {
        h.push_str(r#"<table class="run">"#);
        for (key, value) in run {
            let _ = write!(h, "<tr><th>{}</th><td>{}</td></tr>", esc(key), esc(value));
        }
        h.push_str("</table>");
    }
    h.push_str(&protocol_table(runs));
    let (protocol, checked) = runs.for_findings();
    h.push_str(&findings_heading(protocol));
    h.push_str("<ul>");
    for f in findings(checked) {
        let (cls, word) = match f.holds {
            Some(true) => ("ok", "holds"),
            Some(false) => ("no", "does not hold"),
            None => ("", "not measured"),
        };
        let _ = write!(
            h,
            r#"<li><span class="{cls}"><b>{word}</b></span>: {} — {}</li>"#,
            esc(&f.claim),
            esc(&f.detail)
        );
    }
    h.push_str("</ul><h2>Plots</h2>");
    h.push_str(&svg_plot(
        "mAP vs tokens per image (K)",
        "K (log scale)",
        &k_series(results),
        2.0,
    ));
    h.push_str(&svg_plot(
        "mAP vs stored bytes per image",
        "bytes per image (log scale)",
        &bytes_series(results),
        10.0,
    ));
    let ablation = ablation_table(results);
    if !ablation.is_empty() {
        h.push_str("<h2>Levers beyond the paper</h2><p>mAP (R@1) of each candidate with the levers added one at a time; whitening is learned only from gallery craters no query looks for. View grouping lists the views of one crater together, ranked by the best of them: the first hit changes only when a view that stage 1 missed scores best, and the crater's other view follows it. Bytes and milliseconds per query (one query at a time, 10 results) are those of the last column.</p>");
        h.push_str(&ablation);
        h.push_str(&svg_plot(
            "candidates: mAP vs query latency",
            "ms per query (log scale)",
            &candidate_series(results, |r| r.query_ms),
            10.0,
        ));
        h.push_str(&svg_plot(
            "candidates: mAP vs stored bytes per image",
            "bytes per image (log scale)",
            &candidate_series(results, |r| r.bytes_per_image as f64),
            10.0,
        ));
    }
    if let Some(t) = turned.filter(|t| !t.rows.is_empty()) {
        let n = t.paired_views;
        let _ = if t.split.is_empty() || t.split.contains("rotated") {
            write!(h, "<h2>Turned queries</h2><p>The same {n} query views turned by a seeded random angle, half of them mirrored (the benchmark's rotated split)")
        } else {
            write!(h, "<h2>Second query set: {}</h2><p>The same {n} query views as the second query set shows them (for scripts/relight_bench.py's benchmark: the same crops under another sun; the tables call this set turned)", esc(&t.split))
        };
        let _ = write!(h, ", searched against the same gallery and paired view by view. The first table is the lever ablation on turned queries: turned mAP, and in brackets its change from the same views as built (green: a loss of at most {TURNED_LOSS_GOAL}). How crops are oriented before the model sees them is part of the model line above.</p>");
        h.push_str(&turned_ablation_table(t));
        h.push_str("<p></p>");
        h.push_str(&turned_table(t));
    }
    let _ = write!(
        h,
        "<h2>All regimes ({} protocol)</h2>{}",
        esc(&runs.protocol.name),
        regimes_table(results)
    );
    if let Some((p, paper)) = runs.paper {
        let _ = write!(
            h,
            "<h2>The paper's regimes under the paper's protocol</h2><p>{}</p>{}",
            esc(&p.to_string()),
            regimes_table(paper)
        );
    }
    if let (Some(ex), Some(b), Some(a)) = (ex, get(results, before), get(results, after)) {
        let _ = write!(h, "<h2>Example queries</h2><p>Top-5 by <b>{}</b> (before) and <b>{}</b> (after reranking). Green: same crater; red: another crater.</p>", esc(&before.to_string()), esc(&after.to_string()));
        for &q in &ex.show {
            let _ = write!(
                h,
                r#"<div class="row"><span class="lbl">query</span>{}</div>"#,
                thumb(&ex.query_paths[q], "#555", &esc(&ex.query_ids[q]))
            );
            for (label, r) in [("before", b), ("after", a)] {
                let _ = write!(h, r#"<div class="row"><span class="lbl">{label}</span>"#);
                for &g in r.top[q].iter().take(5) {
                    let rel = ex.relevance[q].contains(&ex.gallery_craters[g]);
                    h.push_str(&thumb(
                        &ex.gallery_paths[g],
                        if rel { "#2e7d32" } else { "#c62828" },
                        &esc(&ex.gallery_craters[g]),
                    ));
                }
                h.push_str("</div>");
            }
            h.push_str("<hr>");
        }
    }
    h.push_str("</body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Summary;

    fn paper_protocol() -> ProtocolInfo {
        ProtocolInfo {
            name: "paper".into(),
            blocks: 12,
            depth: 12,
            brightness: craterdex_engine::Brightness::AsIs,
            precision: craterdex_engine::Precision::F32,
            model: "m".into(),
        }
    }

    fn r(name: &str, k: Option<usize>, map: f64) -> RegimeResult {
        RegimeResult {
            id: name.parse().unwrap(),
            summary: Summary {
                map,
                ..Default::default()
            },
            k,
            bytes_per_image: k.unwrap_or(1) * 1536,
            shortlist_recall: None,
            query_ms: 1.0,
            searched_again: None,
            searched_in_turns: None,
            searched_relit: None,
            per_query: vec![],
            top: vec![],
        }
    }

    #[test]
    fn the_ablation_adds_spatial_verification_where_the_run_verified() {
        let shipped = "two_stage_s100_k32_int8";
        let mut res = vec![
            r(shipped, Some(32), 0.5),
            r(&format!("{shipped}_pairwhite_grouped"), Some(32), 0.9),
        ];
        let table = ablation_table(&res);
        assert!(table.contains("+ view grouping") && !table.contains("verification"));
        res.push(r(
            &format!("{shipped}_pairwhite_grouped_verify10"),
            Some(32),
            0.95,
        ));
        let table = ablation_table(&res);
        assert!(table.contains("+ spatial verification of 10"), "{table}");
        assert!(table.contains("0.950"), "{table}");
    }

    #[test]
    fn findings_are_computed_from_results() {
        let res = vec![
            r("cls", None, 0.4),
            r("full_li", Some(256), 0.7),
            r("raw_attn_k16", Some(16), 0.5),
            r("inst_fps_k16", Some(16), 0.6),
            r("inst_fps_k32", Some(32), 0.68),
            // grouped lists views crater by crater: not comparable with the paper's numbers
            r("inst_fps_k32_grouped", Some(32), 0.9),
            r("cls_grouped", None, 0.95),
            r("two_stage_s100_k32", Some(32), 0.5),
            r("inst_fps_k32_int8", Some(32), 0.679),
        ];
        let f = findings(&res);
        assert_eq!(
            f.iter().map(|f| f.holds).collect::<Vec<_>>(),
            vec![Some(true), Some(true), Some(false), Some(false), Some(true)]
        );
        assert!(f[0].detail.contains("vs cls 0.400"), "{}", f[0].detail);
        assert!(
            f[2].detail.starts_with("inst_fps_k32 0.680"),
            "{}",
            f[2].detail
        );
        let (cls, two_stage) = (
            "cls".parse().unwrap(),
            "two_stage_s100_k32".parse().unwrap(),
        );
        let protocol = paper_protocol();
        let runs = Runs {
            protocol: &protocol,
            results: &res,
            paper: None,
        };
        let html = render("t", "i", &[], &runs, None, None, cls, two_stage);
        assert!(html.contains("<svg") && html.contains("does not hold"));
        assert!(html.contains("checked under the paper's protocol"));
        // beside a shipped run, the findings are the paper run's, and the page says which
        let shipped = ProtocolInfo {
            name: "shipped".into(),
            blocks: 8,
            brightness: craterdex_engine::Brightness::Standardised,
            precision: craterdex_engine::Precision::Int8,
            ..protocol.clone()
        };
        let holding: Vec<RegimeResult> = res
            .iter()
            .map(|x| {
                r(
                    &x.id.to_string(),
                    x.k,
                    if x.id == "full_li".parse().unwrap() {
                        0.99
                    } else {
                        0.5
                    },
                )
            })
            .collect();
        let both = Runs {
            protocol: &shipped,
            results: &holding,
            paper: Some((&protocol, &res)),
        };
        let html = render("t", "i", &[], &both, None, None, cls, two_stage);
        assert!(
            html.contains("checked under the paper's protocol"),
            "{html}"
        );
        assert!(html.contains("<th>the paper's regimes</th>") && html.contains("<td>8 of 12</td>"));
        let shipped_findings = findings(&holding);
        assert_ne!(
            shipped_findings.iter().map(|f| f.holds).collect::<Vec<_>>(),
            f.iter().map(|f| f.holds).collect::<Vec<_>>()
        );
        assert!(
            html.contains("full_li 0.700 vs") && !html.contains("full_li 0.990 vs"),
            "the paper run's findings: {html}"
        );
        assert!(html.contains("<h2>The paper's regimes under the paper's protocol</h2>"));
        // alone, a shipped run says plainly that its findings are not the paper's
        let alone = Runs {
            protocol: &shipped,
            results: &holding,
            paper: None,
        };
        let html = render("t", "i", &[], &alone, None, None, cls, two_stage);
        assert!(
            html.contains("<b>Not the paper's protocol</b> (8 of 12 blocks"),
            "{html}"
        );
        assert!(!html.contains("src=\"http"), "no external assets");
    }

    #[test]
    fn ids_with_quotes_and_brackets_stay_text_in_the_page() {
        let hostile = "q\"><script>alert('x')</script>&";
        let mut cls = r("cls", None, 0.4);
        let mut two = r("two_stage_s100_k32", Some(32), 0.5);
        cls.top = vec![vec![0]];
        two.top = vec![vec![0]];
        let res = vec![cls, two];
        let protocol = paper_protocol();
        let runs = Runs {
            protocol: &protocol,
            results: &res,
            paper: None,
        };
        let (paths, ids, craters) = (
            vec![PathBuf::from("/nonexistent/q.png")],
            vec![hostile.to_string()],
            vec![format!("crater {hostile}")],
        );
        let relevance = vec![BTreeSet::from([craters[0].clone()])];
        let ex = Examples {
            query_paths: &paths,
            query_ids: &ids,
            gallery_paths: &paths,
            gallery_craters: &craters,
            relevance: &relevance,
            show: vec![0],
        };
        let (a, b) = (
            "cls".parse().unwrap(),
            "two_stage_s100_k32".parse().unwrap(),
        );
        let run = [(hostile.to_string(), hostile.to_string())];
        let html = render(hostile, hostile, &run, &runs, None, Some(&ex), a, b);
        assert!(!html.contains("<script>"), "{html}");
        // every attribute the ids went into is closed where it should be
        for alt in html.split("alt=\"").skip(1) {
            let value = alt.split('"').next().unwrap();
            assert!(value.contains("&quot;&gt;&lt;script&gt;"), "{value}");
        }
        // the query, and its first hit before and after reranking
        assert_eq!(html.matches("alt=\"").count(), 3);
    }

    #[test]
    fn axis_labels_keep_their_distance() {
        // query latencies a few hundredths of a millisecond apart on a wide log axis
        let series = [Series {
            label: "a".into(),
            colour: "#000",
            dashed: false,
            points: vec![
                (0.54, 0.5),
                (0.58, 0.55),
                (0.72, 0.6),
                (3.0, 0.7),
                (40.0, 0.8),
            ],
            names: Vec::new(),
        }];
        let svg = svg_plot("t", "ms", &series, 10.0);
        let xs: Vec<f64> = svg
            .split(r#"<text x=""#)
            .skip(1)
            .filter(|t| {
                t.contains(r#"text-anchor="middle">"#) && !t.contains("mAP") && !t.contains(">ms<")
            })
            .map(|t| t.split('"').next().unwrap().parse().unwrap())
            .collect();
        assert!(xs.len() >= 3, "{svg}");
        assert!(xs.windows(2).all(|w| w[1] - w[0] >= TICK_GAP_PX), "{xs:?}");
    }
}
