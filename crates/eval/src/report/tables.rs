//! The report's tables: the protocols, every regime, the levers added one at a time, and
//! the turned queries.

use super::{candidates, get, Lever, Runs, TURNED_LOSS_GOAL};
use crate::regime::RegimeId;
use crate::regimes::RegimeResult;
use crate::turned::{Turned, TurnedRow};
use craterdex_engine::ProtocolInfo;
use maud::{html, Markup};

/// The protocol table at the top of the report: a column per run.
pub(super) fn protocol_table(runs: &Runs) -> Markup {
    let mut columns = vec![("this run", runs.protocol)];
    if let Some((p, _)) = runs.paper {
        columns.push(("the paper's regimes", p));
    }
    type Row = (&'static str, fn(&ProtocolInfo) -> String);
    let rows: [Row; 5] = [
        ("name", |p| p.name.clone()),
        ("blocks run", |p| format!("{} of {}", p.blocks, p.depth)),
        ("brightness", |p| p.brightness.to_string()),
        ("precision", |p| p.precision.to_string()),
        ("model", |p| p.model.clone()),
    ];
    html! {
        table {
            tr { th { "protocol" } @for (label, _) in &columns { th { (label) } } }
            @for (name, value) in rows {
                tr { td { (name) } @for (_, p) in &columns { td { (value(p)) } } }
            }
        }
    }
}

/// The table of every regime of a run.
pub(super) fn regimes_table(results: &[RegimeResult]) -> Markup {
    html! {
        table {
            tr {
                th { "regime" } th { "R@1" } th { "R@5" } th { "R@10" } th { "mAP" } th { "K" }
                th { "bytes/image" } th { "R@S" } th { "ms/query" }
            }
            @for r in results {
                tr {
                    td { (r.id) }
                    td { (format!("{:.3}", r.summary.r1)) }
                    td { (format!("{:.3}", r.summary.r5)) }
                    td { (format!("{:.3}", r.summary.r10)) }
                    td { (format!("{:.3}", r.summary.map)) }
                    td { @if let Some(k) = r.k { (k) } }
                    td { (r.bytes_per_image) }
                    td { @if let Some(v) = r.shortlist_recall { (format!("{v:.3}")) } }
                    td { (format!("{:.2}", r.query_ms)) }
                }
            }
        }
    }
}

/// A table of the candidates (rows) with the levers added one at a time (columns): `cell`
/// shows a regime `find` has, `row_end` closes a row from its cells (the extra columns of
/// `extra_heads`). None when no candidate was run.
fn lever_table<'a, T: 'a>(
    levers: &[Lever],
    extra_heads: Markup,
    find: impl Fn(RegimeId) -> Option<&'a T>,
    cell: impl Fn(&T) -> Markup,
    row_end: impl Fn(&[Option<&'a T>]) -> Markup,
) -> Option<Markup> {
    let rows: Vec<(RegimeId, Vec<Option<&T>>)> = candidates()
        .into_iter()
        .map(|base| {
            let cells = levers
                .iter()
                .map(|l| {
                    find(RegimeId {
                        verify: l.verify,
                        ..base.whitened(l.whiten).grouped(l.grouped)
                    })
                })
                .collect();
            (base, cells)
        })
        .filter(|(_, cells): &(RegimeId, Vec<Option<&T>>)| cells.iter().any(Option::is_some))
        .collect();
    if rows.is_empty() {
        return None;
    }
    Some(html! {
        table {
            tr { th { "regime" } @for lever in levers { th { (lever.label) } } (extra_heads) }
            @for (base, cells) in &rows {
                tr {
                    td { (base) }
                    @for c in cells { td { @if let Some(c) = c { (cell(c)) } } }
                    (row_end(cells))
                }
            }
        }
    })
}

/// Per-lever ablation: each candidate regime with the levers added one at a time (mAP, R@1),
/// and its cost.
pub(super) fn ablation_table(results: &[RegimeResult]) -> Option<Markup> {
    lever_table(
        &super::levers(results.iter().find_map(|r| r.id.verify)),
        html! { th { "bytes/image" } th { "ms/query" } },
        |id| get(results, id),
        |r| html! { (format!("{:.3}", r.summary.map)) " " small { (format!("({:.3})", r.summary.r1)) } },
        |cells| match cells.iter().rev().flatten().next() {
            Some(r) => html! { td { (r.bytes_per_image) } td { (format!("{:.2}", r.query_ms)) } },
            None => html! {},
        },
    )
}

/// Green where the turned loss is at most [`TURNED_LOSS_GOAL`], red otherwise.
fn loss_class(r: &TurnedRow) -> &'static str {
    if r.loss() <= TURNED_LOSS_GOAL {
        "ok"
    } else {
        "no"
    }
}

/// The candidates with each lever on turned queries: turned mAP and the loss against the
/// same views as built.
pub(super) fn turned_ablation_table(t: &Turned) -> Option<Markup> {
    lever_table(
        &super::levers(t.rows.iter().find_map(|r| r.regime.verify)),
        html! {},
        |id| t.rows.iter().find(|r| r.regime == id),
        |r: &TurnedRow| {
            html! {
                (format!("{:.3}", r.map_turned)) " "
                small class=(loss_class(r)) { (format!("({:+.3})", -r.loss())) }
            }
        },
        |_| html! {},
    )
}

/// Every regime on the paired views, as built and turned.
pub(super) fn turned_table(t: &Turned) -> Markup {
    html! {
        table {
            tr { th { "regime" } th { "mAP" } th { "turned" } th { "loss" } th { "R@1" } th { "turned" } }
            @for r in &t.rows {
                tr {
                    td { (r.regime) }
                    td { (format!("{:.3}", r.map)) }
                    td { (format!("{:.3}", r.map_turned)) }
                    td class=(loss_class(r)) { (format!("{:.3}", r.loss())) }
                    td { (format!("{:.3}", r.r1)) }
                    td { (format!("{:.3}", r.r1_turned)) }
                }
            }
        }
    }
}
