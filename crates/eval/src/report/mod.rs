//! A self-contained HTML report: the table, the ablation of the levers beyond the paper
//! (whitening, view grouping), mAP-vs-K, mAP-vs-bytes and mAP-vs-latency plots (inline SVG),
//! what turning the queries costs (when the run had a turned query set), the paper's
//! findings checked on this run, and example queries with their top-5 before and after
//! reranking (relevant framed green, others red). No external assets.
//!
//! Every page is a maud template: what is interpolated is escaped unless marked otherwise,
//! so ids and paths holding `"<>&'` stay text.

use crate::regime::{Family, RegimeId, Tokens, Whiten};
use crate::regimes::RegimeResult;
use crate::turned::Turned;
use craterdex_engine::{Protocol, ProtocolInfo};
use maud::{html, Markup, PreEscaped, DOCTYPE};
use std::collections::BTreeSet;
use std::path::PathBuf;

mod plot;
mod tables;

use plot::{bytes_series, candidate_series, k_series, svg_plot};
use tables::{ablation_table, protocol_table, regimes_table, turned_ablation_table, turned_table};

/// A claim of the paper checked against this run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Finding {
    pub claim: String,
    pub holds: Option<bool>,
    pub detail: String,
}

/// The turned-query loss (mAP) the report marks as held: a match from another orbit should
/// cost at most this much.
pub(super) const TURNED_LOSS_GOAL: f64 = 0.03;

pub(super) fn get(r: &[RegimeResult], id: RegimeId) -> Option<&RegimeResult> {
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

/// The regimes the ablation and the cost plots compare: the paper's single vector and
/// instance tokens, the best single vector of #14, and the shipped recipe with its IVF form.
pub(super) fn candidates() -> [RegimeId; 5] {
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
pub(super) struct Lever {
    whiten: Whiten,
    grouped: bool,
    verify: Option<usize>,
    label: String,
}

/// The lever settings of the ablation, in the order they were added; spatial verification
/// where the run verified (`eval --verify N`).
pub(super) fn levers(verify: Option<usize>) -> Vec<Lever> {
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

/// One image of the examples, framed in `frame`, with `caption` under it.
fn thumb(path: &std::path::Path, frame: &str, caption: &str) -> Markup {
    html! {
        figure style={ "border:4px solid " (frame) } {
            img src=(craterdex_engine::data_uri(path).unwrap_or_default()) alt=(caption);
            figcaption { (caption) }
        }
    }
}

/// The heading of the findings, saying which protocol they were checked under.
fn findings_heading(protocol: &ProtocolInfo) -> Markup {
    if protocol.name == Protocol::Paper.to_string() {
        return html! { h2 { "Findings of the paper, checked under the paper's protocol" } };
    }
    html! {
        h2 { "Findings of the paper, checked here under the " (protocol.name) " protocol" }
        p {
            b { "Not the paper's protocol" }
            " (" (protocol.blocks) " of " (protocol.depth) " blocks, brightness "
            (protocol.brightness) ", " (protocol.precision) " extraction, where the paper runs \
            every block on crops as stored in f32): these numbers do not reproduce the paper's. "
            code { "craterdex eval --protocol paper" } " checks them as published."
        }
    }
}

const STYLE: &str = "body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222} \
table{border-collapse:collapse;font-size:13px} \
td,th{border:1px solid #ccc;padding:2px 8px;text-align:right} td:first-child,th:first-child{text-align:left} \
figure{display:inline-block;margin:2px;text-align:center} figure img{width:96px;height:96px;image-rendering:pixelated;display:block} \
figcaption{font-size:10px;max-width:96px;overflow:hidden} .row{margin:6px 0} .lbl{display:inline-block;width:90px;font-size:12px;vertical-align:top} \
.ok{color:#1a7f37} .no{color:#c62828} table.run{margin-bottom:1em} table.run th,table.run td{text-align:left;font-weight:normal} table.run th{color:#555}";

/// The findings as a list: whether each holds, the claim and what was measured.
fn findings_list(checked: &[RegimeResult]) -> Markup {
    html! {
        ul {
            @for f in findings(checked) {
                @let (cls, word) = match f.holds {
                    Some(true) => ("ok", "holds"),
                    Some(false) => ("no", "does not hold"),
                    None => ("", "not measured"),
                };
                li { span class=(cls) { b { (word) } } ": " (f.claim) " — " (f.detail) }
            }
        }
    }
}

/// The section on the second query set (turned or relit), when the run had one.
fn turned_section(t: &Turned) -> Markup {
    let n = t.paired_views;
    html! {
        @if t.split.is_empty() || t.split.contains("rotated") {
            h2 { "Turned queries" }
        } @else {
            h2 { "Second query set: " (t.split) }
        }
        p {
            @if t.split.is_empty() || t.split.contains("rotated") {
                "The same " (n) " query views turned by a seeded random angle, half of them \
                mirrored (the benchmark's rotated split)"
            } @else {
                "The same " (n) " query views as the second query set shows them (for \
                scripts/relight_bench.py's benchmark: the same crops under another sun; the \
                tables call this set turned)"
            }
            ", searched against the same gallery and paired view by view. The first table is \
            the lever ablation on turned queries: turned mAP, and in brackets its change from \
            the same views as built (green: a loss of at most " (TURNED_LOSS_GOAL) "). How \
            crops are oriented before the model sees them is part of the model line above."
        }
        @if let Some(table) = turned_ablation_table(t) { (table) p {} }
        (turned_table(t))
    }
}

/// The example queries: each with its top 5 before and after reranking.
fn examples_section(ex: &Examples, before: &RegimeResult, after: &RegimeResult) -> Markup {
    html! {
        h2 { "Example queries" }
        p {
            "Top-5 by " b { (before.id) } " (before) and " b { (after.id) } " (after reranking). \
            Green: same crater; red: another crater."
        }
        @for &q in &ex.show {
            div class="row" { span class="lbl" { "query" } (thumb(&ex.query_paths[q], "#555", &ex.query_ids[q])) }
            @for (label, r) in [("before", before), ("after", after)] {
                div class="row" {
                    span class="lbl" { (label) }
                    @for &g in r.top[q].iter().take(5) {
                        @let relevant = ex.relevance[q].contains(&ex.gallery_craters[g]);
                        (thumb(&ex.gallery_paths[g], if relevant { "#2e7d32" } else { "#c62828" }, &ex.gallery_craters[g]))
                    }
                }
            }
            hr;
        }
    }
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
    let (protocol, checked) = runs.for_findings();
    let ablation = ablation_table(results);
    let page = html! {
        (DOCTYPE)
        html {
            head { meta charset="utf-8"; title { (title) } style { (PreEscaped(STYLE)) } }
            body {
                h1 { (title) }
                p { (intro) }
                @if !run.is_empty() {
                    table class="run" { @for (key, value) in run { tr { th { (key) } td { (value) } } } }
                }
                (protocol_table(runs))
                (findings_heading(protocol))
                (findings_list(checked))
                h2 { "Plots" }
                (svg_plot("mAP vs tokens per image (K)", "K (log scale)", &k_series(results), 2.0))
                (svg_plot("mAP vs stored bytes per image", "bytes per image (log scale)", &bytes_series(results), 10.0))
                @if let Some(ablation) = ablation {
                    h2 { "Levers beyond the paper" }
                    p {
                        "mAP (R@1) of each candidate with the levers added one at a time; \
                        whitening is learned only from gallery craters no query looks for. \
                        View grouping lists the views of one crater together, ranked by the best of \
                        them: the first hit changes only when a view that stage 1 missed scores \
                        best, and the crater's other view follows it. Bytes and milliseconds per \
                        query (one query at a time, 10 results) are those of the last column."
                    }
                    (ablation)
                    (svg_plot("candidates: mAP vs query latency", "ms per query (log scale)", &candidate_series(results, |r| r.query_ms), 10.0))
                    (svg_plot("candidates: mAP vs stored bytes per image", "bytes per image (log scale)", &candidate_series(results, |r| r.bytes_per_image as f64), 10.0))
                }
                @if let Some(t) = turned.filter(|t| !t.rows.is_empty()) { (turned_section(t)) }
                h2 { "All regimes (" (runs.protocol.name) " protocol)" }
                (regimes_table(results))
                @if let Some((p, paper)) = runs.paper {
                    h2 { "The paper's regimes under the paper's protocol" }
                    p { (p) }
                    (regimes_table(paper))
                }
                @if let (Some(ex), Some(b), Some(a)) = (ex, get(results, before), get(results, after)) {
                    (examples_section(ex, b, a))
                }
            }
        }
    };
    page.into_string() + "\n"
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
        let table = ablation_table(&res)
            .map(Markup::into_string)
            .unwrap_or_default();
        assert!(table.contains("+ view grouping") && !table.contains("verification"));
        res.push(r(
            &format!("{shipped}_pairwhite_grouped_verify10"),
            Some(32),
            0.95,
        ));
        let table = ablation_table(&res)
            .map(Markup::into_string)
            .unwrap_or_default();
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
        let protocol = ProtocolInfo {
            name: hostile.into(),
            model: hostile.into(),
            ..paper_protocol()
        };
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
        let page = craterdex_testkit::parsed_page(&html);
        assert!(page.texts("script").is_empty());
        assert_eq!(page.texts("head title"), vec![hostile]);
        assert_eq!(page.texts("h1"), vec![hostile]);
        assert_eq!(page.texts("table.run th"), vec![hostile]);
        // the query, and its first hit before and after reranking: each id whole in its
        // attribute and its caption
        let alts = page.attributes("figure img", "alt");
        let crater = format!("crater {hostile}");
        assert_eq!(alts, vec![hostile, crater.as_str(), crater.as_str()]);
        assert_eq!(
            page.texts("figcaption"),
            vec![hostile, crater.as_str(), crater.as_str()]
        );
        // the protocol's name and model in the protocol table and the headings
        let cells = page.texts("table td");
        assert!(
            cells.iter().filter(|c| *c == hostile).count() >= 2,
            "{cells:?}"
        );
    }

    #[test]
    fn axis_labels_keep_their_distance() {
        // query latencies a few hundredths of a millisecond apart on a wide log axis
        let series = [plot::Series {
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
        let svg = svg_plot("t", "ms", &series, 10.0).into_string();
        let xs: Vec<f64> = svg
            .split(r#"<text x=""#)
            .skip(1)
            .filter(|t| {
                t.contains(r#"text-anchor="middle">"#) && !t.contains("mAP") && !t.contains(">ms<")
            })
            .map(|t| t.split('"').next().unwrap().parse().unwrap())
            .collect();
        assert!(xs.len() >= 3, "{svg}");
        assert!(
            xs.windows(2).all(|w| w[1] - w[0] >= plot::TICK_GAP_PX),
            "{xs:?}"
        );
    }
}
