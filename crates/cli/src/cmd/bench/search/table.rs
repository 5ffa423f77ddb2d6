//! The benchmark's table: one row per gallery, stage, codec and mode, and the view-grouping
//! ratios set against the ungrouped runs.

use super::timing::memory_read_gbps;
use serde::Serialize;

#[derive(Serialize)]
pub struct Row {
    pub gallery: String,
    pub stage: String,
    #[serde(rename = "S")]
    pub s: Option<usize>,
    #[serde(rename = "K")]
    pub k: usize,
    pub codec: String,
    pub mode: String,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub reference_p50_ms: Option<f64>,
    pub recall_at_1: Option<f64>,
    /// Share of queries whose target is in the stage-1 shortlist.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shortlist_recall: Option<f64>,
    /// Index bytes one query reads (single vectors scanned, token codes scored).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mb_read_per_query: Option<f64>,
    /// Multiply-accumulates one query needs (stage 1 dot products plus MaxSim).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gmac_per_query: Option<f64>,
}

/// The stage name of grouped two-stage rows (the `search` default); the other rows list
/// image by image, as the reference does.
pub(super) const GROUPED_STAGE: &str = "two_stage_grouped";

/// What a stage costs against another: `stage` over `against` p50 (S 100, one query at a
/// time: `mode` "single", or "same loop" for rows timed side by side), per gallery and codec.
pub(super) fn stage_ratios(rows: &[Row], stage: &str, against: &str, mode: &str) -> Vec<String> {
    let p50 = |r: &Row, stage: &str| {
        rows.iter()
            .find(|o| {
                o.gallery == r.gallery
                    && o.codec == r.codec
                    && o.mode == mode
                    && o.s == Some(100)
                    && o.stage == stage
            })
            .map(|o| o.p50_ms)
    };
    rows.iter()
        .filter(|r| r.stage == stage && r.mode == mode)
        .filter_map(|r| {
            let base = p50(r, against)?;
            Some(format!(
                "{} {}: {stage} {:.3} ms / {against} {:.3} ms = {:.2}x",
                r.gallery,
                r.codec,
                r.p50_ms,
                base,
                r.p50_ms / base
            ))
        })
        .collect()
}

/// Prints the run: the CPU and its kernel level, the reference engines, the memory
/// bandwidth, one line per row, and the view-grouping ratios.
pub(super) fn print(rows: &[Row], engines: &[String]) {
    println!("{}", craterdex_kernels::level::describe());
    let reference = match engines.first() {
        None => "none".to_string(),
        Some(e) if e.starts_with("faiss") => {
            format!("{} IndexFlatIP (stage 1) and numpy (MaxSim)", engines.join(", "))
        }
        Some(_) => format!(
            "{} for stage 1 AND MaxSim: faiss-cpu could not be imported, so stage 1 fell back to numpy",
            engines.join(", ")
        ),
    };
    println!(
        "threads {}; reference: {reference}",
        rayon::current_num_threads()
    );
    let gbps = memory_read_gbps();
    println!(
        "memory read bandwidth, all threads streaming: {gbps:.1} GB/s. MB/q: index bytes one \
         query reads; mem ms: that at this bandwidth (a floor only for codes not already in the \
         last-level cache); GMAC/s: multiply-accumulates done per second at p50, to set \
         against the kernel level's peak"
    );
    println!(
        "{:<18} {:<27} {:>4} {:>3} {:<6} {:<9} {:>9} {:>9} {:>9} {:>7} {:>5} {:>5} {:>7} {:>7} {:>7}",
        "gallery",
        "stage",
        "S",
        "K",
        "codec",
        "mode",
        "p50 ms",
        "p95 ms",
        "ref p50",
        "ref/us",
        "R@1",
        "R@S",
        "MB/q",
        "mem ms",
        "GMAC/s"
    );
    for r in rows {
        let f = |v: Option<f64>| v.map(|x| format!("{x:.3}")).unwrap_or_else(|| "-".into());
        println!(
            "{:<18} {:<27} {:>4} {:>3} {:<6} {:<9} {:>9.3} {:>9.3} {:>9} {:>7} {:>5} {:>5} {:>7} {:>7} {:>7}",
            r.gallery,
            r.stage,
            r.s.map(|s| s.to_string()).unwrap_or_else(|| "-".into()),
            r.k,
            r.codec,
            r.mode,
            r.p50_ms,
            r.p95_ms,
            f(r.reference_p50_ms),
            r.reference_p50_ms
                .map(|x| format!("{:.1}x", x / r.p50_ms))
                .unwrap_or_else(|| "-".into()),
            r.recall_at_1
                .map(|x| format!("{x:.2}"))
                .unwrap_or_else(|| "-".into()),
            r.shortlist_recall
                .map(|x| format!("{x:.2}"))
                .unwrap_or_else(|| "-".into()),
            r.mb_read_per_query
                .map(|mb| format!("{mb:.1}"))
                .unwrap_or_else(|| "-".into()),
            r.mb_read_per_query
                .map(|mb| format!("{:.3}", mb / gbps))
                .unwrap_or_else(|| "-".into()),
            r.gmac_per_query
                .map(|g| format!("{:.1}", g / r.p50_ms * 1e3))
                .unwrap_or_else(|| "-".into())
        );
    }
    for (title, ratios) in [
        (
            "view grouping (two-stage S 100, single query p50):".to_string(),
            stage_ratios(rows, GROUPED_STAGE, "two_stage", "single"),
        ),
        (
            format!(
                "spatial verification of the {} best images, as a query image's default search \
                 does before deciding to search again (grouped two-stage, S 100 plain and {} \
                 verified, one query at a time, the same loop):",
                super::timing::verified(),
                craterdex_engine::VERIFY_SHORTLIST
            ),
            stage_ratios(
                rows,
                &super::timing::verified_stage(),
                GROUPED_STAGE,
                "same loop",
            ),
        ),
    ] {
        if !ratios.is_empty() {
            println!("{title}");
            for r in ratios {
                println!("  {r}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(gallery: &str, stage: &str, codec: &str, mode: &str, p50_ms: f64) -> Row {
        Row {
            gallery: gallery.into(),
            stage: stage.into(),
            s: Some(100),
            k: 32,
            codec: codec.into(),
            mode: mode.into(),
            p50_ms,
            p95_ms: p50_ms,
            reference_p50_ms: None,
            recall_at_1: None,
            shortlist_recall: None,
            mb_read_per_query: None,
            gmac_per_query: None,
        }
    }

    #[test]
    fn grouping_is_set_against_the_ungrouped_run_of_its_own_gallery_and_codec() {
        let rows = vec![
            row("a", "two_stage", "int8", "single", 2.0),
            row("a", "two_stage", "int8", "batch", 1.0),
            row("a", "two_stage", "f16", "single", 8.0),
            row("b", "two_stage", "int8", "single", 10.0),
            row("a", GROUPED_STAGE, "int8", "single", 3.0),
            row("a", GROUPED_STAGE, "int8", "batch", 9.0),
            row("b", GROUPED_STAGE, "int8", "single", 12.0),
            row("c", GROUPED_STAGE, "int8", "single", 1.0),
        ];
        assert_eq!(
            stage_ratios(&rows, GROUPED_STAGE, "two_stage", "single"),
            vec![
                "a int8: two_stage_grouped 3.000 ms / two_stage 2.000 ms = 1.50x",
                "b int8: two_stage_grouped 12.000 ms / two_stage 10.000 ms = 1.20x",
            ]
        );
    }
}
