//! Building an index from entries: the one sequence `index build`, the demo, Python's
//! `Index.build` and the service's tests share (features, metadata in their order, the
//! images whitening and codec learn from, the encoder, the index written, the engine open).

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::extractor::Extractor;
use crate::inputs::metas_in_order;
use crate::plan::{learn_positions, learn_rows, write_in_chunks, CHUNK_IMAGES};
use crate::progress::Progress;
use crate::recipe::IndexRecipe;
use craterdex_index::ImageMeta;
use craterdex_model::extract::FeatureSet;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Which images a new index's whitening and codec learn from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LearnFrom {
    /// Every image up to [`crate::LEARN_SAMPLE_IMAGES`], a seeded sample of that many
    /// beyond (the sample a build in parts learns from too).
    #[default]
    Sample,
    /// These images only: a benchmark's gallery images of craters that no query looks for,
    /// so that searching its queries measures what evaluation reports.
    Ids(HashSet<String>),
}

/// The images of a new index: `(id, path)` to read with the model, with the metadata of each
/// (any order; every extracted id needs its record).
#[derive(Clone, Debug, Default)]
pub struct Entries {
    pub items: Vec<(String, PathBuf)>,
    pub metas: Vec<ImageMeta>,
    pub learn: LearnFrom,
}

impl Entries {
    /// Entries whose metadata name their image files (`path`).
    pub fn from_metas(metas: Vec<ImageMeta>) -> Result<Self> {
        let items = metas
            .iter()
            .map(|m| match &m.path {
                Some(p) => Ok((m.id.clone(), PathBuf::from(p))),
                None => Err(Error::Invalid(format!(
                    "entry {:?} has no path: give its image file or its features",
                    m.id
                ))),
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            items,
            metas,
            learn: LearnFrom::Sample,
        })
    }
}

impl Engine {
    /// Reads `entries` with `extractor` and builds their index at `dir` (replacing any
    /// index there once the new one is complete); returns the engine over it, ready for
    /// image queries.
    pub fn build(
        dir: &Path,
        entries: &Entries,
        recipe: &IndexRecipe,
        extractor: Arc<Extractor>,
        progress: &dyn Progress,
    ) -> Result<Engine> {
        Self::build_in_chunks_of(dir, entries, recipe, extractor, progress, CHUNK_IMAGES)
    }

    /// [`Engine::build`], reading `chunk` images at a time where whitening learns from
    /// fewer than all of them.
    pub(crate) fn build_in_chunks_of(
        dir: &Path,
        entries: &Entries,
        recipe: &IndexRecipe,
        extractor: Arc<Extractor>,
        progress: &dyn Progress,
        chunk: usize,
    ) -> Result<Engine> {
        let ids: Vec<String> = entries.items.iter().map(|(id, _)| id.clone()).collect();
        let sample = learn_positions(&ids, &entries.learn, recipe.seed);
        if ids.len() > chunk && sample.len() < ids.len() {
            let mut extract = |positions: &[usize], what: &str, progress: &dyn Progress| {
                let items: Vec<(String, PathBuf)> = positions
                    .iter()
                    .map(|&p| entries.items[p].clone())
                    .collect();
                extractor.extract_chunk(&items, what, progress)
            };
            write_in_chunks(
                recipe,
                dir,
                &ids,
                entries.metas.clone(),
                &sample,
                chunk,
                Some(extractor.fingerprint()),
                &mut extract,
                progress,
            )?;
            return Engine::open(dir, Some(extractor));
        }
        let features = extractor.extract(&entries.items, "images", progress)?;
        Self::build_from(
            dir,
            &features,
            entries.metas.clone(),
            &ids,
            &entries.learn,
            recipe,
            Some(extractor),
            progress,
        )
    }

    /// Builds the index of features already extracted (by `extractor`'s model when given,
    /// which the index then records) with their metadata (any order).
    pub fn build_from_features(
        dir: &Path,
        features: &FeatureSet,
        metas: Vec<ImageMeta>,
        learn: &LearnFrom,
        recipe: &IndexRecipe,
        extractor: Option<Arc<Extractor>>,
        progress: &dyn Progress,
    ) -> Result<Engine> {
        let inputs = features.ids.clone();
        Self::build_from(
            dir, features, metas, &inputs, learn, recipe, extractor, progress,
        )
    }

    fn build_from(
        dir: &Path,
        features: &FeatureSet,
        metas: Vec<ImageMeta>,
        inputs: &[String],
        learn: &LearnFrom,
        recipe: &IndexRecipe,
        extractor: Option<Arc<Extractor>>,
        progress: &dyn Progress,
    ) -> Result<Engine> {
        let metas = metas_in_order(metas, &features.ids)?;
        let rows = match learn {
            LearnFrom::Sample => learn_rows(inputs, &features.ids, recipe.seed),
            LearnFrom::Ids(ids) => Some(
                (0..features.len())
                    .filter(|&r| ids.contains(&features.ids[r]))
                    .collect(),
            ),
        };
        if let Some(rows) = &rows {
            progress.note(&format!(
                "whitening and codec learned from {} of {} images",
                rows.len(),
                features.len()
            ));
        }
        let encoder = recipe.learn_encoder(features, rows.as_deref(), &metas, progress)?;
        let model = extractor.as_ref().map(|x| x.fingerprint());
        recipe.write_index(
            dir,
            &encoder,
            features,
            metas,
            model,
            rows.as_deref(),
            progress,
        )?;
        Engine::open(dir, extractor)
    }
}
