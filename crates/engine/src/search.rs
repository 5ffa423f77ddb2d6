//! The one search: queries of any kind ([`SearchInput`]) searched in any catalogue (one
//! index, a set of shards, a cluster's shards) as [`SearchOptions`] ask, answered with the
//! hits, the time of each phase and the stages that ran ([`SearchAnswer`]). Every front end
//! makes this one call; which options a kind of query can use is decided here
//! ([`QueryKind`]).

use crate::catalogue::{encode_in_views, Catalogue};
use crate::engine::QueryFeatures;
use crate::error::{Error, Result};
use crate::hits::QueryHits;
use crate::options::{SearchLimits, SearchOptions};
use crate::progress::Progress;
use crate::recheck::{self, StageRun};
use crate::views::QueryViews;
use craterdex_errors::ensure;
use craterdex_model::extract::FeatureSet;
use serde::Serialize;
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Instant;

/// What the queries of a search are.
pub enum SearchInput<'a> {
    /// Image files, `(id, path)`, read by the catalogue's model.
    Files(&'a [(String, PathBuf)]),
    /// Decoded images (arrays from Python, an upload) named `ids`.
    Decoded {
        ids: &'a [String],
        images: &'a [image::DynamicImage],
    },
    /// Backbone features (posted, or extracted earlier), named by the set's ids.
    Features(&'a FeatureSet),
    /// An indexed image, by its stored descriptors.
    Indexed(&'a str),
    /// Queries whose ids and features in any views come from elsewhere (a cluster's router
    /// asks the replica that holds the images).
    Viewed(&'a QueryFeatures<'a>),
}

/// What a query brings, which decides the options it can use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueryKind {
    /// Pixels: every option (views need them, recheck too).
    Image,
    /// Patch tokens but no pixels: verification, no views; never rechecked.
    Features,
    /// Stored descriptors only: neither views nor verification; never rechecked.
    Indexed,
}

impl QueryKind {
    /// Whether a query of this kind can use the search option named `option` (as the
    /// service's query string spells it).
    pub fn accepts(self, option: &str) -> bool {
        match option {
            "turns" | "opposite_sun" | "recheck" | "recheck_views" => self == QueryKind::Image,
            "verify" => self != QueryKind::Indexed,
            _ => true,
        }
    }

    /// Why `options` cannot search a query of this kind, if they cannot.
    pub fn refusal(self, options: &SearchOptions) -> Option<&'static str> {
        if !self.accepts("turns") && !options.views().is_plain() {
            return Some("turns and opposite_sun need the query images");
        }
        if !self.accepts("verify") && options.verify > 0 {
            return Some("verify needs the query's patch tokens (an image or its features)");
        }
        None
    }

    /// `options` as a query of this kind is searched: recheck is for query images only.
    pub fn effective(self, options: &SearchOptions) -> SearchOptions {
        SearchOptions {
            recheck: options.recheck && self.accepts("recheck"),
            ..*options
        }
    }
}

impl SearchInput<'_> {
    pub fn kind(&self) -> QueryKind {
        match self {
            SearchInput::Files(_) | SearchInput::Decoded { .. } | SearchInput::Viewed(_) => {
                QueryKind::Image
            }
            SearchInput::Features(_) => QueryKind::Features,
            SearchInput::Indexed(_) => QueryKind::Indexed,
        }
    }
}

/// Milliseconds of each phase of a search. A rechecked search extracts again as it searches
/// again, so its extraction counts as search.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Timing {
    /// Feature extraction (the queries' forward passes), where it ran apart from the search.
    pub features_ms: Option<f64>,
    /// Encoding features into descriptors, where it ran apart from the search.
    pub encode_ms: Option<f64>,
    /// The search, verification's forward passes included.
    pub search_ms: f64,
}

/// What one search answered.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SearchAnswer {
    /// Each query's hits, in the order asked (unreadable images left out).
    pub hits: Vec<QueryHits>,
    pub timing: Timing,
    /// The stages of a rechecked search, in order, with what each decided (empty for a
    /// search that is not rechecked).
    pub stages: Vec<StageRun>,
}

impl SearchAnswer {
    /// The hits of the first query (a search of one).
    pub fn into_first(self) -> Vec<crate::SearchHit> {
        self.hits
            .into_iter()
            .next()
            .map(|q| q.results)
            .unwrap_or_default()
    }
}

/// The queries of `input` searched in `catalogue` as `options` ask: rechecked
/// ([`crate::RecheckPlan`], query images by default), in views, with the best images verified,
/// or plainly. Options the input's kind cannot use are refused ([`QueryKind::refusal`]).
pub fn search(
    catalogue: &dyn Catalogue,
    input: SearchInput,
    options: &SearchOptions,
    progress: &dyn Progress,
) -> Result<SearchAnswer> {
    let kind = input.kind();
    if let Some(why) = kind.refusal(options) {
        return Err(Error::Invalid(why.to_string()));
    }
    let options = kind.effective(options);
    let params = options.params(&SearchLimits::default())?;
    let started = Instant::now();
    if let SearchInput::Indexed(id) = input {
        let stored = catalogue.stored(id)?;
        let hits = catalogue.search_views(&[vec![stored]], QueryViews::PLAIN, &params)?;
        return Ok(SearchAnswer {
            hits: QueryHits::named(&[id.to_string()], hits),
            timing: Timing {
                search_ms: ms_since(started),
                ..Default::default()
            },
            stages: Vec::new(),
        });
    }
    if options.verify > 0 && kind == QueryKind::Features && catalogue.model().is_none() {
        return Err(Error::NoModel(
            "verify (the candidates' images run through the model)",
        ));
    }
    let files_features;
    let decoded_features;
    let given_features;
    let features: &QueryFeatures = match input {
        SearchInput::Files(items) => {
            let model = catalogue.model().ok_or(Error::NoModel("image queries"))?;
            files_features = move |only: Option<&HashSet<String>>, views: QueryViews| {
                let some: Vec<(String, PathBuf)>;
                let items = match only {
                    None => items,
                    Some(ids) => {
                        some = items
                            .iter()
                            .filter(|(id, _)| ids.contains(id))
                            .cloned()
                            .collect();
                        &some
                    }
                };
                match views.is_plain() {
                    // as given: through the feature cache
                    true => model
                        .extract(items, "queries", progress)
                        .map(|f| (f.ids.clone(), f)),
                    false => model.variant_features(items, views, progress),
                }
            };
            &files_features
        }
        SearchInput::Decoded { ids, images } => {
            ensure!(
                ids.len() == images.len(),
                Error::Invalid(format!("{} ids for {} images", ids.len(), images.len()))
            );
            let model = catalogue.model().ok_or(Error::NoModel("image queries"))?;
            decoded_features = move |only: Option<&HashSet<String>>, views: QueryViews| {
                let Some(only) = only else {
                    // every query: the images as handed over, not copied
                    let features = model.features_of_variants(ids, images, views, progress)?;
                    return Ok((ids.to_vec(), features));
                };
                let (ids, images): (Vec<String>, Vec<image::DynamicImage>) = ids
                    .iter()
                    .zip(images)
                    .filter(|(id, _)| only.contains(*id))
                    .map(|(id, im)| (id.clone(), im.clone()))
                    .unzip();
                let features = model.features_of_variants(&ids, &images, views, progress)?;
                Ok((ids, features))
            };
            &decoded_features
        }
        SearchInput::Features(set) => {
            given_features = move |only: Option<&HashSet<String>>, views: QueryViews| {
                ensure!(
                    views.is_plain(),
                    Error::Invalid("features cannot be turned or relit".into())
                );
                Ok(match only {
                    None => (set.ids.clone(), set.clone()),
                    Some(ids) => {
                        let rows: Vec<usize> = (0..set.len())
                            .filter(|&i| ids.contains(&set.ids[i]))
                            .collect();
                        let some = set.select(&rows);
                        (some.ids.clone(), some)
                    }
                })
            };
            &given_features
        }
        SearchInput::Viewed(features) => features,
        SearchInput::Indexed(_) => unreachable!("answered above"),
    };
    if options.rechecks() {
        let rechecked = recheck::run(
            catalogue,
            features,
            &params,
            options.recheck_views,
            progress,
        )?;
        return Ok(SearchAnswer {
            hits: rechecked.hits,
            timing: Timing {
                search_ms: ms_since(started),
                ..Default::default()
            },
            stages: rechecked.stages,
        });
    }
    let views = options.views();
    let (ids, features) = features(None, views)?;
    let mut timing = Timing {
        // given features are not extracted here
        features_ms: (kind != QueryKind::Features).then(|| ms_since(started)),
        ..Default::default()
    };
    let mut t = Instant::now();
    let hits = if options.verify > 0 {
        catalogue.search_variants_verified(
            &ids,
            &features,
            views,
            &params,
            options.verify,
            progress,
        )?
    } else {
        let per_query = encode_in_views(catalogue, &features, views)?;
        timing.encode_ms = Some(ms_since(t));
        t = Instant::now();
        QueryHits::named(&ids, catalogue.search_views(&per_query, views, &params)?)
    };
    timing.search_ms = ms_since(t);
    Ok(SearchAnswer {
        hits,
        timing,
        stages: Vec::new(),
    })
}

/// Query images a streamed search ([`search_streamed`]) holds at once. A query that runs
/// every stage of a rechecked search holds about 35 MB of views and patch tokens until its
/// batch is answered, so a batch stays under 0.6 GB whatever the number of queries; batches
/// of 16 keep the model's own batches (8 images) full.
pub const QUERY_BATCH: usize = 16;

/// [`search`] of query image files, [`QUERY_BATCH`] at a time, each batch's answer handed to
/// `each` before the next is read: memory stays that of one batch however many queries there
/// are. `progress` counts queries answered; the steps inside a batch are not drawn (a search
/// of one batch or less is [`search`] itself, drawn step by step).
pub fn search_streamed(
    catalogue: &dyn Catalogue,
    items: &[(String, PathBuf)],
    options: &SearchOptions,
    progress: &dyn Progress,
    each: &mut dyn FnMut(SearchAnswer) -> Result<()>,
) -> Result<()> {
    if items.len() <= QUERY_BATCH {
        return each(search(
            catalogue,
            SearchInput::Files(items),
            options,
            progress,
        )?);
    }
    let inside = crate::progress::NotesOnly::new(progress);
    progress.start("queries", items.len());
    let (mut done, mut stages) = (0, Vec::new());
    for batch in items.chunks(QUERY_BATCH) {
        crate::progress::go_on(progress)?;
        let answer = search(catalogue, SearchInput::Files(batch), options, &inside)?;
        recheck::sum_stages(&mut stages, &answer.stages);
        each(answer)?;
        done += batch.len();
        progress.advance(done);
    }
    progress.finish();
    for note in inside.cache_notes() {
        progress.note(&note);
    }
    for (n, run) in stages.iter().enumerate().skip(1) {
        if let Some(note) = recheck::stage_note(&stages[..n], run, done) {
            progress.stage_ran(&note);
        }
    }
    Ok(())
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}
