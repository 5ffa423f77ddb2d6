//! `craterdex bench search`: latency per query for each stage, codec and mode, with the
//! reference (faiss-cpu flat IP, numpy MaxSim) timed on identical data in the same run.
//! Modules: `data` (the synthetic galleries), `reference` (the faiss/numpy runner), `timing`
//! (the shipped search timed), `table` (what is printed).

pub(super) mod data;
mod reference;
mod table;
mod timing;

use super::SearchBench;
use crate::output::Bars;
use anyhow::Result;
use craterdex_engine::{encode_all, Extractor, IndexRecipe};
use craterdex_index::ImageMeta;
use craterdex_tokens::{Descriptors, Encoder, Recipe};
use data::synthetic;
use reference::reference;
use std::collections::HashMap;
use timing::{measure, scale, Grids, Setup, WORST_CASE_TOKENS};

pub fn run(b: SearchBench) -> Result<()> {
    let work = b
        .workdir
        .clone()
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("craterdex-bench-search-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let mut rows = Vec::new();
    let mut engines = Vec::new();
    let result = (|| -> Result<()> {
        if let Some(n) = b.scale {
            return scale(&b, n, &work, &mut rows);
        }
        eprintln!(
            "synthetic gallery: {} images x {} tokens x {}-d, {} planted near-duplicate queries",
            b.gallery, b.k, b.dim, b.queries
        );
        let (gallery, queries, targets) = synthetic(b.gallery, b.queries, b.k, b.dim);
        let name = format!("synthetic-{}", b.gallery);
        let reference_map = if b.no_reference {
            HashMap::new()
        } else {
            let (engine, m) =
                reference(&work.join("ref"), &gallery, &queries, b.k, b.dim, b.single)?;
            engines.push(engine);
            m
        };
        let plain = Encoder::plain(Recipe::default());
        let setup = Setup {
            name: &name,
            k: b.k,
            single: b.single,
            reference: reference_map,
            targets: Some(&targets),
            grids: Grids::WorstCase {
                tokens: WORST_CASE_TOKENS,
                dim: b.dim,
            },
        };
        measure(
            &work, &gallery, &queries, &b.codecs, &plain, &setup, &mut rows,
        )?;
        drop(gallery);
        if let Some(m) = &b.real {
            let bench = craterdex_eval::manifest::load(m, None)?;
            let bars = Bars::new();
            let extractor = Extractor::load(&Default::default(), &bars)?;
            let gf = extractor.extract(&bench.gallery_items(), "gallery", &bars)?;
            let qf = extractor.extract(&bench.query_items(), "queries", &bars)?;
            let enc =
                IndexRecipe::default().learn_encoder(&gf, None, &[], &craterdex_engine::Silent)?;
            let gallery: Vec<(ImageMeta, Descriptors)> = bench
                .gallery_metas(&gf.ids)
                .into_iter()
                .zip(encode_all(&enc, &gf))
                .collect();
            let queries = encode_all(&enc, &qf);
            let name = format!("real-{}", gallery.len());
            let reference_map = if b.no_reference {
                HashMap::new()
            } else {
                reference(
                    &work.join("ref"),
                    &gallery,
                    &queries,
                    32,
                    enc.token_dim(gf.dim),
                    b.single,
                )?
                .1
            };
            let setup = Setup {
                name: &name,
                k: 32,
                single: b.single,
                reference: reference_map,
                targets: None,
                grids: Grids::Real {
                    queries: &qf,
                    gallery: &gf,
                },
            };
            measure(
                &work, &gallery, &queries, &b.codecs, &enc, &setup, &mut rows,
            )?;
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&work);
    result?;
    table::print(&rows, &engines);
    if let Some(j) = &b.json {
        craterdex_durable::write_atomic(j, &serde_json::to_vec_pretty(&rows)?)?;
        eprintln!("wrote {}", j.display());
    }
    Ok(())
}
