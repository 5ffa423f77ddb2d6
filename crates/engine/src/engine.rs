//! [`Engine`]: one index, its encoder, and optionally the model that makes its queries.
//! Every front end asks it for ranked hits; none wires model, tokens and index itself.

use crate::catalogue::{placed_images, sampled_images, suns_of, Catalogue};
use crate::error::{Error, Result};
use crate::extractor::{split_fingerprint, split_reduction, BackboneRun, Extractor};
use crate::hits::{QueryHits, SearchHit};
use crate::options::SearchOptions;
use crate::progress::Progress;
use crate::recipe::encode_all;
use crate::search::{SearchAnswer, SearchInput};
use crate::views::{sun_heading_of, sun_headings, QueryViews, Suns};
use craterdex_errors::ensure;
use craterdex_index::{
    Hit, ImageMeta, Index, MergePolicy, MergeReport, PreparedMerge, SearchParams,
};
use craterdex_model::extract::FeatureSet;
use craterdex_tokens::{Descriptors, FeatureRef};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The ids and features of query images in some views ([`crate::SearchInput::Viewed`]): of
/// the queries named, or of all of them (`None`), unreadable images left out.
pub type QueryFeatures<'a> =
    dyn Fn(Option<&HashSet<String>>, QueryViews) -> Result<(Vec<String>, FeatureSet)> + 'a;

/// The catalogue's sun headings ([`sun_headings`]) from the suns' headings ([`sun_heading_of`])
/// in the images at `paths` (those unreadable left out): what [`Engine::catalogue_suns`]
/// measures on an index, and eval on a benchmark's gallery.
pub fn sun_headings_of(paths: &[PathBuf]) -> Suns {
    use rayon::prelude::*;
    let angles: Vec<f32> = paths
        .par_iter()
        .filter_map(|p| craterdex_model::preprocess::load_image(p).ok())
        .map(|im| sun_heading_of(&im))
        .collect();
    sun_headings(&angles)
}

/// An index ready to search, with the model for image queries when one is loaded.
pub struct Engine {
    index: Index,
    extractor: Option<Arc<Extractor>>,
    /// The catalogue's suns, measured on first need ([`Engine::catalogue_suns`]).
    suns: OnceLock<Suns>,
}

/// Fails unless queries from `extractor` can search `index`: the same model (when the index
/// records one) and the feature width its encoder expects.
fn check_compatible(index: &Index, extractor: &Extractor) -> Result<()> {
    let fingerprint = extractor.fingerprint();
    if let Some(built) = index.model() {
        // the same model with crops turned or lit another way: say which option makes them
        // match
        let ((model, orient, bright), (built_model, built_orient, built_bright)) =
            (split_fingerprint(&fingerprint), split_fingerprint(built));
        if model == built_model && orient != built_orient {
            return Err(Error::Orientation {
                built: built_orient,
                loaded: orient,
            });
        }
        if model == built_model && bright != built_bright {
            return Err(Error::Brightness {
                built: built_bright,
                loaded: bright,
            });
        }
        // the same model at another input size, token reduction, depth or extra sizes: say
        // which options make them match
        let (base, run) = split_reduction(model);
        let (built_base, built_run) = split_reduction(built_model);
        if base == built_base && run != built_run {
            let config = extractor.vit().config();
            let (depth, own_size) = (config.depth, config.image_size);
            let options = |run: &BackboneRun| {
                let size = match run.size {
                    "" => own_size.to_string(),
                    s => s.to_string(),
                };
                let blocks = match run.blocks {
                    "all" => depth.to_string(),
                    b => b.to_string(),
                };
                let sizes = match run.extra_sizes {
                    "" => String::new(),
                    s => format!(" --extra-sizes {s}"),
                };
                format!(
                    "--size {size} --keep-tokens {} --blocks {blocks}{sizes}",
                    run.kept
                )
            };
            return Err(Error::Invalid(format!(
                "the index was built with {}, the model runs with {}; its queries need the \
                 index's options",
                options(&built_run),
                options(&run)
            )));
        }
    }
    index.check_model(&fingerprint)?;
    let want = index.feature_dim();
    ensure!(
        extractor.dim() == want,
        Error::Invalid(format!(
            "the model gives {}-d features, the index expects {want}-d",
            extractor.dim()
        ))
    );
    Ok(())
}

impl Engine {
    /// Opens the index in `dir` (every checksum verified) for queries from `extractor`.
    pub fn open(dir: &Path, extractor: Option<Arc<Extractor>>) -> Result<Self> {
        Self::new(Index::open(dir)?, extractor)
    }

    /// An engine over an index already open (or held in memory).
    pub fn new(index: Index, extractor: Option<Arc<Extractor>>) -> Result<Self> {
        if let Some(x) = &extractor {
            check_compatible(&index, x)?;
        }
        Ok(Self {
            index,
            extractor,
            suns: OnceLock::new(),
        })
    }

    /// This engine answering image queries with `extractor` (checked against the index).
    pub fn with_extractor(self, extractor: Arc<Extractor>) -> Result<Self> {
        check_compatible(&self.index, &extractor)?;
        Ok(Self {
            extractor: Some(extractor),
            ..self
        })
    }

    pub fn index(&self) -> &Index {
        &self.index
    }
    pub fn extractor(&self) -> Option<&Arc<Extractor>> {
        self.extractor.as_ref()
    }

    pub(crate) fn extractor_or_err(&self) -> Result<&Extractor> {
        self.extractor
            .as_deref()
            .ok_or(Error::NoModel("image queries"))
    }

    /// Descriptors of features under the index's encoder.
    pub fn encode(&self, features: &FeatureSet) -> Vec<Descriptors> {
        encode_all(&self.index.encoder, features)
    }

    /// The queries of `input` searched as `options` ask ([`crate::search()`]): rechecked by
    /// default, in views, verified or plainly; the hits, the time of each phase and the stages
    /// that ran.
    pub fn search(
        &self,
        input: SearchInput,
        options: &SearchOptions,
        progress: &dyn Progress,
    ) -> Result<SearchAnswer> {
        crate::search::search(self, input, options, progress)
    }

    /// Ranked hits for each query's descriptors, as `params` ask: stage 1 and reranking
    /// alone, what the catalogue workflows and the benchmarks call.
    pub fn search_descriptors(
        &self,
        queries: &[Descriptors],
        params: &SearchParams,
    ) -> Vec<Vec<SearchHit>> {
        self.index
            .search(queries, params)
            .into_iter()
            .map(|hits| self.describe(&hits))
            .collect()
    }

    /// Extracts `(id, path)` images with the loaded model and encodes them for this index.
    /// Returns the ids that were extracted (unreadable images are skipped with a note) and
    /// their descriptors, in the same order.
    pub fn encode_images(
        &self,
        items: &[(String, PathBuf)],
        progress: &dyn Progress,
    ) -> Result<(Vec<String>, Vec<Descriptors>)> {
        let features = self
            .extractor_or_err()?
            .extract(items, "entries", progress)?;
        let descs = self.encode(&features);
        Ok((features.ids, descs))
    }

    /// Ranked hits for queries given as their `views` ([`QueryViews::images`]: the query as
    /// given first), each image by its best score over them, each view counted its
    /// [`QueryViews::margin`] lower.
    pub fn search_views(
        &self,
        queries: &[Vec<Descriptors>],
        views: QueryViews,
        params: &SearchParams,
    ) -> Vec<Vec<SearchHit>> {
        self.index
            .search_variants(queries, params, &views.margins())
            .iter()
            .map(|h| self.describe(h))
            .collect()
    }

    /// The headings of the catalogue's suns ([`sun_headings`]) from the suns' headings in
    /// [`crate::SUN_SAMPLE`] indexed images ([`crate::sun_sample`]), read where the index
    /// recorded them; measured once per engine. None where no image is readable.
    pub fn catalogue_suns(&self) -> Suns {
        *self.suns.get_or_init(|| suns_of(&[&self.index]))
    }

    /// This index's own [`crate::sun_sample`]: each image's id and the heading of its
    /// sun's heading in radians (None where its image cannot be read), what a cluster's
    /// router gathers from every shard ([`crate::suns_from_samples`]).
    pub fn sun_sample_angles(&self) -> Vec<(String, Option<f32>)> {
        use rayon::prelude::*;
        sampled_images(placed_images(&self.index))
            .par_iter()
            .map(|&(id, p)| {
                let angle = craterdex_model::preprocess::load_image(p)
                    .ok()
                    .map(|im| sun_heading_of(&im));
                (id.to_string(), angle)
            })
            .collect()
    }

    /// The descriptors of `(id, path)` images turned by `angle` radians about their centres
    /// (image axes, x right and y down), as the catalogue would see them: a registered
    /// observation's crops brought to the catalogue's orientation. Unreadable images fail.
    pub fn encode_turned(
        &self,
        items: &[(String, PathBuf)],
        angle: f32,
    ) -> Result<Vec<Descriptors>> {
        let extractor = self.extractor_or_err()?;
        let mut out = Vec::with_capacity(items.len());
        for chunk in items.chunks(64) {
            let images = chunk
                .iter()
                .map(|(_, p)| Ok(turned(&craterdex_model::preprocess::load_image(p)?, angle)))
                .collect::<Result<Vec<_>>>()?;
            let ids: Vec<String> = chunk.iter().map(|(id, _)| id.clone()).collect();
            out.extend(self.encode(&extractor.features_of_images(
                &ids,
                &images,
                &crate::Silent,
            )?));
        }
        Ok(out)
    }

    /// The descriptors of decoded images (crops cut in memory), 64 at a time, one
    /// `progress` step per image.
    pub fn encode_decoded(
        &self,
        ids: &[String],
        images: &[image::DynamicImage],
        progress: &dyn Progress,
    ) -> Result<Vec<Descriptors>> {
        let extractor = self.extractor_or_err()?;
        ensure!(
            ids.len() == images.len(),
            Error::Invalid(format!("{} ids for {} images", ids.len(), images.len()))
        );
        progress.start("encode", images.len());
        let mut out = Vec::with_capacity(images.len());
        for (ids, images) in ids.chunks(64).zip(images.chunks(64)) {
            out.extend(self.encode(&extractor.features_of_images(ids, images, &crate::Silent)?));
            progress.advance(out.len());
        }
        progress.finish();
        Ok(out)
    }

    /// The descriptors of one decoded image turned by `angle` radians about its centre, as
    /// [`Engine::encode_turned`] turns files.
    pub fn encode_image_turned(
        &self,
        image: &image::DynamicImage,
        angle: f32,
    ) -> Result<Descriptors> {
        self.encode_image(&turned(image, angle))
    }

    /// The descriptors of one decoded image (an upload) under the index's encoder.
    pub fn encode_image(&self, image: &image::DynamicImage) -> Result<Descriptors> {
        let f = self.extractor_or_err()?.features_of(image)?;
        Ok(self.index.encoder.encode(FeatureRef {
            cls: &f.cls,
            patches: &f.patches,
            attention: &f.attention,
        }))
    }

    /// Hits with their ranks and metadata.
    pub fn describe(&self, hits: &[Hit]) -> Vec<SearchHit> {
        hits.iter()
            .enumerate()
            .map(|(i, h)| {
                let m = self.index.meta(h.row);
                SearchHit {
                    rank: i + 1,
                    id: m.id.clone(),
                    crater_id: m.crater_id.clone(),
                    score: h.score,
                    stage1: h.stage1,
                    stage2: h.stage2,
                    inliers: None,
                    meta: m.clone(),
                    row: h.row,
                }
            })
            .collect()
    }

    fn dir(&self) -> Result<&Path> {
        match self.index.dir() {
            Some(d) => Ok(d),
            None => Err(Error::InMemory),
        }
    }

    /// Adds encoded images through the index's atomic path and returns the engine over the
    /// index as it now is.
    pub fn add(&self, images: &[(ImageMeta, Descriptors)]) -> Result<(usize, Engine)> {
        self.dir()?;
        let (n, index) = self.index.add_images(images)?;
        Ok((n, self.over(index)))
    }

    /// Each image's record with its descriptors, in the order of `features`; `metas` (any
    /// order) holds a record for every image.
    pub fn encode_with_metas(
        &self,
        metas: Vec<ImageMeta>,
        features: &FeatureSet,
    ) -> Result<Vec<(ImageMeta, Descriptors)>> {
        let metas = crate::inputs::metas_in_order(metas, &features.ids)?;
        Ok(metas.into_iter().zip(self.encode(features)).collect())
    }

    /// Reads `entries` with the loaded model: each readable image's record with its
    /// descriptors (unreadable images are skipped with a note). Read
    /// [`crate::plan::CHUNK_IMAGES`] at a time, so that memory holds one chunk's features.
    pub fn encode_entries(
        &self,
        entries: &crate::Entries,
        progress: &dyn Progress,
    ) -> Result<Vec<(ImageMeta, Descriptors)>> {
        self.encode_entries_in_chunks_of(entries, progress, crate::plan::CHUNK_IMAGES)
    }

    pub(crate) fn encode_entries_in_chunks_of(
        &self,
        entries: &crate::Entries,
        progress: &dyn Progress,
        chunk: usize,
    ) -> Result<Vec<(ImageMeta, Descriptors)>> {
        let extractor = self.extractor_or_err()?;
        let metas: std::collections::HashMap<&str, &ImageMeta> =
            entries.metas.iter().map(|m| (m.id.as_str(), m)).collect();
        let mut out = Vec::with_capacity(entries.items.len());
        progress.start("entries", entries.items.len());
        let continued = crate::progress::Continued::new(progress);
        for items in entries.items.chunks(chunk.max(1)) {
            let features = extractor.extract_chunk(items, "entries", &continued)?;
            continued.done_before(items.len());
            let records = features.ids.iter().filter_map(|id| metas.get(id.as_str()));
            out.extend(self.encode_with_metas(records.map(|&m| m.clone()).collect(), &features)?);
        }
        progress.finish();
        ensure!(
            !out.is_empty(),
            Error::Invalid("entries: no image could be read".into())
        );
        Ok(out)
    }

    /// Adds the features of new images; `metas` (any order) holds each one's record.
    pub fn add_features(
        &self,
        metas: Vec<ImageMeta>,
        features: &FeatureSet,
    ) -> Result<(usize, Engine)> {
        self.add(&self.encode_with_metas(metas, features)?)
    }

    /// Reads `entries` with the loaded model and adds them (unreadable images are skipped
    /// with a note).
    pub fn add_entries(
        &self,
        entries: &crate::Entries,
        progress: &dyn Progress,
    ) -> Result<(usize, Engine)> {
        self.add(&self.encode_entries(entries, progress)?)
    }

    /// Removes images by id; returns how many were present and the engine afterwards.
    pub fn remove(&self, ids: &[String]) -> Result<(usize, Engine)> {
        self.dir()?;
        let (n, index) = self.index.remove_ids(ids)?;
        Ok((n, self.over(index)))
    }

    /// Writes the next merge `policy` asks for beside the index (searches and writes go on);
    /// `None` when it asks for none, or another merger is at work and `wait` is false.
    /// [`Engine::commit_merge`] makes it visible.
    pub fn prepare_merge(&self, policy: &MergePolicy, wait: bool) -> Result<Option<PreparedMerge>> {
        self.dir()?;
        Ok(self.index.prepare_merge(policy, wait)?)
    }

    /// Makes a prepared merge visible and returns the engine over the index as it now is
    /// (`None` when the index was rebuilt meanwhile and the merge was dropped).
    pub fn commit_merge(&self, merge: PreparedMerge) -> Result<Option<Engine>> {
        Ok(if Index::commit_merge(merge)? {
            Some(self.reopened()?)
        } else {
            None
        })
    }

    /// Merges segments by `policy` until it asks for nothing more.
    pub fn merge(&self, policy: &MergePolicy) -> Result<(MergeReport, Engine)> {
        self.dir()?;
        let (report, index) = self.index.merged(policy)?;
        Ok((report, self.over(index)))
    }

    /// The index as its directory now holds it (segments already open are kept; new ones
    /// are checked for size and were checksummed as they were written).
    pub(crate) fn reopened(&self) -> Result<Engine> {
        Ok(self.over(self.index.reopened()?))
    }

    /// This engine over another state of its index.
    fn over(&self, index: Index) -> Engine {
        Engine {
            index,
            extractor: self.extractor.clone(),
            suns: OnceLock::new(),
        }
    }
}

impl Catalogue for Engine {
    fn encode(&self, features: &FeatureSet) -> Result<Vec<Descriptors>> {
        Ok(Engine::encode(self, features))
    }
    fn search_views(
        &self,
        queries: &[Vec<Descriptors>],
        views: QueryViews,
        params: &SearchParams,
    ) -> Result<Vec<Vec<SearchHit>>> {
        Ok(Engine::search_views(self, queries, views, params))
    }
    fn search_variants_verified(
        &self,
        ids: &[String],
        variants: &FeatureSet,
        views: QueryViews,
        params: &SearchParams,
        top: usize,
        progress: &dyn Progress,
    ) -> Result<Vec<QueryHits>> {
        Engine::search_variants_verified(self, ids, variants, views, params, top, progress)
    }
    fn suns(&self) -> Result<Suns> {
        Ok(self.catalogue_suns())
    }
    fn model(&self) -> Option<&Extractor> {
        self.extractor.as_deref()
    }
    fn stored(&self, id: &str) -> Result<Descriptors> {
        let row = self
            .index
            .row_of(id)
            .ok_or_else(|| Error::NoSuchImage(id.to_string()))?;
        Ok(self.index.descriptors_of(row))
    }
}

/// `image` turned by `angle` radians about its centre (image axes, x right and y down).
fn turned(image: &image::DynamicImage, angle: f32) -> image::DynamicImage {
    image::DynamicImage::ImageRgb32F(craterdex_model::preprocess::turn(&image.to_rgb32f(), angle))
}
