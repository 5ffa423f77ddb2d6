//! `craterdex.Index`: an index on disk, shared by the calls of one Python session through one
//! engine handle (reads take a snapshot; writes go through the index's atomic path and swap
//! the engine in whole).

use crate::convert::{
    array_image, features_from_numpy, metas_from_json, named_features, options_from_json, to_json,
    FeatureArrays, NamedFeatures,
};
use crate::failure::{invalid, no_model, Fallible, OrPy};
use crate::model::PyModel;
use crate::progress::PyProgress;
use craterdex_engine::{
    search_streamed, Engine, Entries, FeatureSet, ImageMeta, LearnFrom, MergePolicy, RecipeOptions,
    SearchInput, SearchOptions, SharedEngine,
};
use craterdex_workflows::{DedupOptions, Frames, LinkOptions, LinkRule, Neighbours};
use numpy::{IntoPyArray, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

#[pyclass(name = "Index", module = "craterdex._native", frozen)]
pub struct PyIndex {
    dir: PathBuf,
    engine: SharedEngine,
    /// The grid of the rows' positions a link looks up, made once per engine version.
    neighbours: Mutex<Option<(Weak<Engine>, Arc<Neighbours>)>>,
}

impl PyIndex {
    fn new(dir: PathBuf, engine: Engine) -> Self {
        let engine = SharedEngine::new(engine);
        // as the service does: the segments of many small adds are merged in the background
        engine.merge_in_background(MergePolicy::default());
        Self {
            dir,
            engine,
            neighbours: Mutex::new(None),
        }
    }

    /// The positions grid of `engine`'s rows under `rule`, made once per engine version.
    fn neighbours_of(&self, engine: &Arc<Engine>, rule: &LinkRule) -> Arc<Neighbours> {
        let mut cache = self.neighbours.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((made_for, near)) = cache.as_ref() {
            if made_for.upgrade().is_some_and(|e| Arc::ptr_eq(&e, engine)) {
                return near.clone();
            }
        }
        let near = Arc::new(Neighbours::of_index(engine.index(), rule, &Frames::none()));
        *cache = Some((Arc::downgrade(engine), near.clone()));
        near
    }

    /// The features of entries: posted, or read from their `path` with the index's model.
    fn entry_features(
        &self,
        py: Python<'_>,
        metas: &[ImageMeta],
        features: Option<NamedFeatures<'_>>,
        what: &str,
        progress: &PyProgress,
    ) -> Fallible<FeatureSet> {
        if let Some(f) = features {
            return named_features(f);
        }
        let x = self.engine.snapshot().extractor().cloned();
        let x = x.ok_or_else(|| no_model(what))?;
        let items = Entries::from_metas(metas.to_vec())?.items;
        Ok(py.detach(move || x.extract(&items, "entries", progress))?)
    }

    fn rule(&self, json: Option<&str>) -> Fallible<LinkRule> {
        match json {
            Some(j) => options_from_json("link rule", j),
            None => Ok(LinkRule::for_index(&self.dir)?),
        }
    }
}

#[pymethods]
impl PyIndex {
    /// Builds an index at `out` from `meta_json` records (with `path`, or with `features`).
    #[staticmethod]
    #[pyo3(signature = (out, meta_json, model=None, features=None, recipe_json="{}", progress=None))]
    fn build(
        py: Python<'_>,
        out: PathBuf,
        meta_json: &str,
        model: Option<&PyModel>,
        features: Option<NamedFeatures<'_>>,
        recipe_json: &str,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let progress = PyProgress::new(progress);
        let options: RecipeOptions = options_from_json("recipe", recipe_json).py_err()?;
        let recipe = options.recipe().py_err()?;
        let metas = metas_from_json(meta_json).py_err()?;
        let extractor = model.map(|m| m.extractor.clone());
        let dir = out.clone();
        let engine = match features {
            Some(f) => {
                let feats = named_features(f).py_err()?;
                py.detach(move || {
                    Engine::build_from_features(
                        &dir,
                        &feats,
                        metas,
                        &LearnFrom::Sample,
                        &recipe,
                        extractor,
                        &progress,
                    )
                })
            }
            None => {
                let x = extractor
                    .ok_or_else(|| invalid("give a model to read the images, or features"))
                    .py_err()?;
                let entries = Entries::from_metas(metas).py_err()?;
                py.detach(move || Engine::build(&dir, &entries, &recipe, x, &progress))
            }
        }
        .py_err()?;
        Ok(Self::new(out, engine))
    }

    #[staticmethod]
    #[pyo3(signature = (path, model=None))]
    fn open(py: Python<'_>, path: PathBuf, model: Option<&PyModel>) -> PyResult<Self> {
        let x = model.map(|m| m.extractor.clone());
        let p = path.clone();
        let engine = py.detach(move || Engine::open(&p, x)).py_err()?;
        Ok(Self::new(path, engine))
    }

    #[getter]
    fn path(&self) -> String {
        self.dir.display().to_string()
    }

    fn __len__(&self) -> usize {
        self.engine.snapshot().index().live()
    }

    /// Searches with descriptors (`single` `[N, Ds]`, `tokens` `[N, K, Dt]`, as a
    /// `QueryEncoder` made them); results as JSON, as `search_json` gives them.
    #[pyo3(signature = (ids, single, tokens, options_json="{}"))]
    fn search_descriptors_json(
        &self,
        py: Python<'_>,
        ids: Vec<String>,
        single: numpy::PyReadonlyArray2<f32>,
        tokens: numpy::PyReadonlyArray3<f32>,
        options_json: &str,
    ) -> PyResult<String> {
        let options: SearchOptions = options_from_json("search options", options_json).py_err()?;
        let params = options.params(&Default::default()).py_err()?;
        let engine = self.engine.snapshot();
        let descs = crate::convert::descriptors_from_numpy(&ids, single, tokens, engine.index())
            .py_err()?;
        let hits = py.detach(|| engine.search_descriptors(&descs, &params));
        to_json(&craterdex_engine::QueryHits::named(&ids, hits)).py_err()
    }

    /// Hits (JSON, per query) of queries given as the descriptors of their views, as a
    /// cluster's router sends them to a shard (`craterdex.cluster`): `single` `[N * V,
    /// Ds]`, `tokens` `[N * V, K, Dt]`, `views_json` and `params_json` as the engine
    /// serialises them.
    fn search_views_json(
        &self,
        py: Python<'_>,
        single: numpy::PyReadonlyArray2<f32>,
        tokens: numpy::PyReadonlyArray3<f32>,
        views_json: &str,
        params_json: &str,
    ) -> PyResult<String> {
        let engine = self.engine.snapshot();
        crate::cluster::shard::search_views(py, &engine, single, tokens, views_json, params_json)
    }

    /// This index's verified hits (JSON, per query) as one shard of a cluster whose router
    /// chose every shard's candidates (`chosen_json`: per query, the ids of this shard's),
    /// the queries given as the features of their views (needs the model).
    #[allow(clippy::too_many_arguments)]
    fn verify_chosen_json(
        &self,
        py: Python<'_>,
        ids: Vec<String>,
        features: NamedFeatures<'_>,
        views_json: &str,
        params_json: &str,
        top: usize,
        chosen_json: &str,
    ) -> PyResult<String> {
        let variants = named_features(features).py_err()?;
        let engine = self.engine.snapshot();
        crate::cluster::shard::verify_chosen(
            py,
            &engine,
            ids,
            variants,
            views_json,
            params_json,
            top,
            chosen_json,
        )
    }

    /// The most views of one crater in this index (images sharing a crater id).
    fn views_per_crater(&self, py: Python<'_>) -> usize {
        let engine = self.engine.snapshot();
        py.detach(|| engine.views_per_crater())
    }

    /// The ids of this index's sample of images for the catalogue's suns and their shading
    /// dipoles' headings (JSON `[[id, radians or null], ...]`).
    fn sun_sample_json(&self, py: Python<'_>) -> PyResult<String> {
        let engine = self.engine.snapshot();
        to_json(&py.detach(|| engine.sun_sample_angles())).py_err()
    }

    /// This index's evidence (JSON) for linking one entry (`meta_json`, one record; its
    /// descriptors `single` `[1, Ds]`, `tokens` `[1, K, Dt]`): its appearance hits and the
    /// rows near the entry's position, as `link_decision_json` takes them from every shard.
    #[pyo3(signature = (meta_json, single, tokens, options_json="{}"))]
    fn link_evidence_json(
        &self,
        py: Python<'_>,
        meta_json: &str,
        single: numpy::PyReadonlyArray2<f32>,
        tokens: numpy::PyReadonlyArray3<f32>,
        options_json: &str,
    ) -> PyResult<String> {
        let meta = crate::service::one_meta(meta_json)?;
        let opts: LinkOptions = options_from_json("link options", options_json).py_err()?;
        let rule = self.rule(None).py_err()?;
        let engine = self.engine.snapshot();
        let desc = crate::convert::descriptors_from_numpy(
            std::slice::from_ref(&meta.id),
            single,
            tokens,
            engine.index(),
        )
        .py_err()?
        .pop()
        .ok_or_else(|| invalid("give the descriptors of one entry"))
        .py_err()?;
        let evidence = py.detach(|| {
            let near = self.neighbours_of(&engine, &rule);
            craterdex_workflows::link_evidence(&engine, &near, &Frames::none(), &opts, &meta, &desc)
        });
        to_json(&evidence).py_err()
    }

    /// The metadata of the live image `id` (JSON), or None.
    fn meta_json(&self, id: &str) -> PyResult<Option<String>> {
        let e = self.engine.snapshot();
        let idx = e.index();
        idx.row_of(id)
            .map(|r| to_json(idx.meta(r)).py_err())
            .transpose()
    }

    /// Takes up what other processes wrote to the index since it was opened; returns
    /// whether there was something.
    fn refresh(&self, py: Python<'_>) -> PyResult<bool> {
        py.detach(|| self.engine.refresh()).py_err()
    }

    /// What the index holds, as `craterdex index info` prints it (JSON).
    fn info_json(&self) -> PyResult<String> {
        to_json(&self.engine.snapshot().info()).py_err()
    }

    /// Every live image's metadata, as JSON records.
    fn metadata_json(&self) -> PyResult<String> {
        let e = self.engine.snapshot();
        let idx = e.index();
        let metas: Vec<&ImageMeta> = idx.live_rows().map(|r| idx.meta(r)).collect();
        to_json(&metas).py_err()
    }

    /// The stored descriptors of indexed images: single vectors `[N, Ds]` and decoded
    /// instance tokens `[N, K, Dt]`.
    fn descriptors<'py>(&self, py: Python<'py>, ids: Vec<String>) -> PyResult<Bound<'py, PyDict>> {
        let e = self.engine.snapshot();
        let idx = e.index();
        let (k, dt, ds) = (idx.tokens_per_image(), idx.token_dim(), idx.single_dim());
        let mut single = Vec::with_capacity(ids.len() * ds);
        let mut tokens = vec![0f32; ids.len() * k * dt];
        for (i, id) in ids.iter().enumerate() {
            let row = idx
                .row_of(id)
                .ok_or_else(|| craterdex_engine::Error::NoSuchImage(id.clone()))
                .py_err()?;
            single.extend_from_slice(idx.single_of(row));
            idx.decode_tokens_into(row, &mut tokens[i * k * dt..(i + 1) * k * dt]);
        }
        let out = PyDict::new(py);
        out.set_item("single", single.into_pyarray(py).reshape([ids.len(), ds])?)?;
        out.set_item(
            "tokens",
            tokens.into_pyarray(py).reshape([ids.len(), k, dt])?,
        )?;
        Ok(out)
    }

    /// Searches with images (numpy arrays or paths) or features, as `options_json` (a
    /// `SearchOptions`) says; results as JSON (`[{"query": ..., "results": [hit, ...]}, ...]`).
    #[pyo3(signature = (ids, images=None, paths=None, features=None, options_json="{}", progress=None))]
    #[allow(clippy::too_many_arguments)]
    fn search_json(
        &self,
        py: Python<'_>,
        ids: Vec<String>,
        images: Option<Vec<Bound<'_, PyAny>>>,
        paths: Option<Vec<PathBuf>>,
        features: Option<FeatureArrays<'_>>,
        options_json: &str,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<String> {
        let progress = PyProgress::new(progress);
        let options: SearchOptions = options_from_json("search options", options_json).py_err()?;
        let engine = self.engine.snapshot();
        let answer = match (images, paths, features) {
            (None, None, Some((cls, patches, attention))) => {
                let features = features_from_numpy(ids, cls, patches, attention).py_err()?;
                py.detach(|| engine.search(SearchInput::Features(&features), &options, &progress))
                    .map(|a| a.hits)
            }
            (Some(arrays), None, None) => {
                let images = arrays
                    .iter()
                    .enumerate()
                    .map(|(i, a)| array_image(a, i))
                    .collect::<Fallible<Vec<_>>>()
                    .py_err()?;
                py.detach(|| {
                    let input = SearchInput::Decoded {
                        ids: &ids,
                        images: &images,
                    };
                    engine.search(input, &options, &progress)
                })
                .map(|a| a.hits)
            }
            (None, Some(paths), None) => {
                let items: Vec<(String, PathBuf)> = ids.into_iter().zip(paths).collect();
                // image files are read a batch at a time: memory does not grow with the
                // number of queries (only their hits are kept)
                py.detach(|| {
                    let mut hits = Vec::with_capacity(items.len());
                    search_streamed(&*engine, &items, &options, &progress, &mut |a| {
                        hits.extend(a.hits);
                        Ok(())
                    })
                    .map(|()| hits)
                })
            }
            _ => return Err(invalid("give images (numpy arrays), paths or features")).py_err(),
        };
        to_json(&answer.py_err()?).py_err()
    }

    /// Adds images from `meta_json` records (with `path`, or with `features`); returns how
    /// many were added.
    #[pyo3(signature = (meta_json, features=None, progress=None))]
    fn add(
        &self,
        py: Python<'_>,
        meta_json: &str,
        features: Option<NamedFeatures<'_>>,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<usize> {
        let metas = metas_from_json(meta_json).py_err()?;
        let feats = self
            .entry_features(
                py,
                &metas,
                features,
                "adding images",
                &PyProgress::new(progress),
            )
            .py_err()?;
        py.detach(|| {
            self.engine.write(|e| {
                let (n, grown) = e.add_features(metas, &feats)?;
                Ok::<_, craterdex_engine::Error>((n, Some(grown)))
            })
        })
        .py_err()
    }

    /// Merges segments now (by the default policy, or every segment into one); returns the
    /// report as JSON.
    #[pyo3(signature = (into_one=false))]
    fn merge_json(&self, py: Python<'_>, into_one: bool) -> PyResult<String> {
        let policy = if into_one {
            MergePolicy::into_one()
        } else {
            MergePolicy::default()
        };
        let report = py.detach(|| self.engine.merge(&policy)).py_err()?;
        to_json(&report).py_err()
    }

    /// Removes images by id; returns how many were present.
    fn remove(&self, py: Python<'_>, ids: Vec<String>) -> PyResult<usize> {
        py.detach(|| {
            self.engine.write(|e| {
                let (n, shrunk) = e.remove(&ids)?;
                Ok::<_, craterdex_engine::Error>((n, Some(shrunk)))
            })
        })
        .py_err()
    }

    /// Each source's registration (JSON) of link entries (`meta_json` records) to this
    /// index, as `link` finds it first; `dedup=True`: of this index's sources to each other,
    /// as `dedup` does. Positions only: no image is read.
    #[pyo3(signature = (meta_json=None, rule_json=None, options_json="{}", dedup=false))]
    fn registrations_json(
        &self,
        py: Python<'_>,
        meta_json: Option<&str>,
        rule_json: Option<&str>,
        options_json: &str,
        dedup: bool,
    ) -> PyResult<String> {
        let rule = self.rule(rule_json).py_err()?;
        let engine = self.engine.snapshot();
        let frames = if dedup {
            let opts: DedupOptions = options_from_json("dedup options", options_json).py_err()?;
            py.detach(|| craterdex_workflows::dedup::frames_of_index(engine.index(), &rule, &opts))
        } else {
            let opts: LinkOptions = options_from_json("link options", options_json).py_err()?;
            let metas = metas_from_json(meta_json.unwrap_or("[]")).py_err()?;
            py.detach(|| craterdex_workflows::register_entries(&engine, &rule, &opts, &metas))
        };
        let regs = frames.registrations();
        to_json(&regs.iter().map(|r| &**r).collect::<Vec<_>>()).py_err()
    }

    /// Links entries (`meta_json` records with `path`, or `features`) to this index, as
    /// `options_json` (a `LinkOptions`) says; rows as JSON. `partition`: one part of a set cut
    /// by position (no insertion; see `craterdex.dask.link`), its sources placed by
    /// `registrations_json` (of the whole set) when given.
    #[pyo3(signature = (meta_json, features=None, rule_json=None, options_json="{}", partition=false, registrations_json=None, progress=None))]
    #[allow(clippy::too_many_arguments)]
    fn link_json(
        &self,
        py: Python<'_>,
        meta_json: &str,
        features: Option<NamedFeatures<'_>>,
        rule_json: Option<&str>,
        options_json: &str,
        partition: bool,
        registrations_json: Option<&str>,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<String> {
        let progress = PyProgress::new(progress);
        let metas = metas_from_json(meta_json).py_err()?;
        let rule = self.rule(rule_json).py_err()?;
        let opts: LinkOptions = options_from_json("link options", options_json).py_err()?;
        let shared = registrations_json
            .map(|j| frames_from_json(j, &rule))
            .transpose()
            .py_err()?;
        let feats = self
            .entry_features(py, &metas, features, "linking images", &progress)
            .py_err()?;
        let rows = py
            .detach(|| -> Fallible<_> {
                if partition || !opts.insert_new {
                    let engine = self.engine.snapshot();
                    let entries = engine.encode_with_metas(metas, &feats)?;
                    return Ok(if partition {
                        let frames = match shared {
                            Some(f) => f,
                            None => {
                                let metas: Vec<ImageMeta> =
                                    entries.iter().map(|(m, _)| m.clone()).collect();
                                craterdex_workflows::register_entries(&engine, &rule, &opts, &metas)
                            }
                        };
                        craterdex_workflows::link_partition(
                            &engine, &entries, &rule, &opts, &frames, &progress,
                        )?
                    } else {
                        craterdex_workflows::link(&engine, entries, &rule, &opts, &progress)?.0
                    });
                }
                Ok(self.engine.write(|engine| {
                    let entries = engine.encode_with_metas(metas, &feats)?;
                    craterdex_workflows::link(engine, entries, &rule, &opts, &progress)
                })?)
            })
            .py_err()?;
        to_json(&rows).py_err()
    }

    /// Whole images linked to this index as `craterdex link --image` links them: each image's
    /// craters found by `detector` (a detector directory, a name under
    /// $CRATERDEX_HOME/detectors, or `pycda-unet`, fetched on first use), the image registered
    /// by their pattern, the catalogue's craters looked for in place, and everything linked.
    /// JSON: `{"images": [summary...], "craters": [row...]}`.
    #[pyo3(signature = (paths, detector, rule_json=None, options_json="{}", look_in_place=true, context=2.0, progress=None, detector_precision=None))]
    #[allow(clippy::too_many_arguments)]
    fn link_images_json(
        &self,
        py: Python<'_>,
        paths: Vec<PathBuf>,
        detector: &str,
        rule_json: Option<&str>,
        options_json: &str,
        look_in_place: bool,
        context: f64,
        progress: Option<Py<PyAny>>,
        detector_precision: Option<&str>,
    ) -> PyResult<String> {
        let progress = PyProgress::new(progress);
        let rule = self.rule(rule_json).py_err()?;
        let opts: LinkOptions = options_from_json("link options", options_json).py_err()?;
        let precision: craterdex_model::Precision = match detector_precision {
            Some(p) => p
                .parse()
                .map_err(|e: craterdex_errors::Invalid| invalid(e.0))
                .py_err()?,
            None => craterdex_detect::default_precision(),
        };
        let dir = py
            .detach(|| craterdex_fetch::detector_dir(detector, 1.0 / 255.0))
            .py_err()?;
        let engine = self.engine.snapshot();
        if engine.extractor().is_none() {
            return Err(no_model("linking whole images").into());
        }
        let json = py
            .detach(|| -> Fallible<String> {
                let (config, net) = craterdex_detect::read_detector_dir(&dir)?;
                let net = net.with_precision(precision)?;
                let names = craterdex_workflows::output::source_names(&paths);
                let mut read = Vec::with_capacity(paths.len());
                for p in &paths {
                    let image = craterdex_detect::GrayImage::open(p)?;
                    let found = craterdex_detect::detect(
                        &net,
                        &config,
                        &image,
                        &craterdex_detect::DetectOptions::default(),
                        &|_| (),
                    )?;
                    read.push((image, found));
                }
                let observed: Vec<craterdex_workflows::ObservedImage> = read
                    .iter()
                    .zip(names)
                    .map(
                        |((image, found), source)| craterdex_workflows::ObservedImage {
                            source,
                            image,
                            detections: found.clone(),
                        },
                    )
                    .collect();
                let o = craterdex_workflows::ImageLinkOptions {
                    look_in_place,
                    context,
                    ..Default::default()
                };
                let links = craterdex_workflows::link_images(
                    &engine, &observed, &rule, &opts, &o, &progress,
                )?;
                use craterdex_workflows::output::{ImageCraterRecord, IMAGE_LINK_HEADER};
                let craters: Vec<ImageCraterRecord> =
                    links.craters.iter().map(ImageCraterRecord::of).collect();
                to_json(&serde_json::json!({
                    "images": links.images,
                    "columns": IMAGE_LINK_HEADER,
                    "craters": craters,
                }))
            })
            .py_err()?;
        Ok(json)
    }

    /// Groups of entries of one crater (JSON), over all live entries, or the dedup edges of
    /// the entries `ids` only (one partition; see `craterdex.dask.dedup`), the index's sources
    /// placed by `registrations_json` (`registrations_json(dedup=True)`) when given.
    #[pyo3(signature = (rule_json=None, options_json="{}", ids=None, registrations_json=None, progress=None))]
    fn dedup_json(
        &self,
        py: Python<'_>,
        rule_json: Option<&str>,
        options_json: &str,
        ids: Option<Vec<String>>,
        registrations_json: Option<&str>,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<String> {
        let progress = PyProgress::new(progress);
        let rule = self.rule(rule_json).py_err()?;
        let opts: DedupOptions = options_from_json("dedup options", options_json).py_err()?;
        let shared = registrations_json
            .map(|j| frames_from_json(j, &rule))
            .transpose()
            .py_err()?;
        let engine = self.engine.snapshot();
        py.detach(|| -> Fallible<String> {
            let frames = match shared {
                Some(f) => f,
                None => craterdex_workflows::dedup::frames_of_index(engine.index(), &rule, &opts),
            };
            let Some(ids) = ids else {
                return to_json(&craterdex_workflows::dedup(
                    &engine, &rule, &opts, &frames, &progress,
                )?);
            };
            // every partition places the whole index's sources alike (registered once and
            // shared, or alike again here) and turns their crops alike, so the edges are
            // those of one run
            let upright = craterdex_workflows::dedup::upright_engine(&engine, &frames, &progress)?;
            let searched = upright.as_ref().unwrap_or(&engine);
            let idx = searched.index();
            let rows = ids
                .iter()
                .map(|id| {
                    idx.row_of(id)
                        .ok_or_else(|| craterdex_engine::Error::NoSuchImage(id.clone()).into())
                })
                .collect::<Fallible<Vec<usize>>>()?;
            let core: Vec<ImageMeta> = rows.iter().map(|&r| idx.meta(r).clone()).collect();
            let near = craterdex_workflows::Neighbours::around(idx, &rule, &frames, &core);
            let edges = craterdex_workflows::dedup::edges(
                searched, &near, &rule, &frames, &opts, &rows, &progress,
            );
            to_json(&edges)
        })
        .py_err()
    }

    /// The groups that dedup edges of every live entry (JSON, from partitions) make.
    fn dedup_merge_json(&self, py: Python<'_>, edges_json: &str) -> PyResult<String> {
        let edges: Vec<craterdex_workflows::Edge> =
            options_from_json("dedup edges", edges_json).py_err()?;
        let engine = self.engine.snapshot();
        let groups = py
            .detach(|| craterdex_workflows::dedup::merge(engine.index(), &edges))
            .py_err()?;
        to_json(&groups).py_err()
    }

    /// The decision rule this index uses (its calibrated `link-rule.json`, else the
    /// default), as JSON.
    fn rule_json(&self) -> PyResult<String> {
        to_json(&self.rule(None).py_err()?).py_err()
    }
}

/// Frames from `registrations_json` (each source's registration, as `registrations_json`
/// returns them).
fn frames_from_json(json: &str, rule: &LinkRule) -> Fallible<craterdex_workflows::Frames> {
    let regs: Vec<craterdex_workflows::SourceRegistration> =
        options_from_json("registrations", json)?;
    Ok(craterdex_workflows::Frames::of_registrations(
        regs,
        rule.body_radius_km,
    ))
}
