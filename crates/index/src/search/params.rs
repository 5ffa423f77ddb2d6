//! What a search is asked (mode, stage 1, shortlist, k) and what it answers (hits).

use crate::topk::Scored;
use serde::Serialize;

/// How a search ranks: `two-stage`, `stage1` or `exhaustive`.
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
    strum::IntoStaticStr,
    serde_with::SerializeDisplay,
    serde_with::DeserializeFromStr,
)]
#[strum(serialize_all = "kebab-case")]
pub enum Mode {
    /// Single-vector search only.
    Stage1,
    /// Shortlist then rerank.
    #[default]
    TwoStage,
    /// MaxSim against every image.
    Exhaustive,
}

/// How stage 1 finds its shortlist.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum Stage1 {
    /// IVF with the index's default `nprobe` when the index has IVF lists, exact otherwise.
    #[default]
    Auto,
    /// Every single vector.
    Exact,
    /// `n` IVF lists (exact when the index has none).
    Probe(usize),
}

impl Stage1 {
    /// From an `nprobe` option: none is `Auto`, 0 is `Exact`.
    pub fn from_nprobe(nprobe: Option<usize>) -> Self {
        match nprobe {
            None => Stage1::Auto,
            Some(0) => Stage1::Exact,
            Some(n) => Stage1::Probe(n),
        }
    }
}

/// What one search asks (serialised as a cluster's router sends it to a shard).
#[derive(Clone, Copy, Debug, Serialize, serde::Deserialize)]
pub struct SearchParams {
    /// Results per query.
    pub top_k: usize,
    /// Shortlist size S (two-stage only): the S best by stage 1 are reranked by late
    /// interaction; results past S (when `top_k > S`) follow in stage-1 order.
    pub shortlist: usize,
    pub mode: Mode,
    pub stage1: Stage1,
    /// Lists results crater by crater: a hit ranks by the best score among the indexed views
    /// of its crater (images sharing a `crater_id`), and a crater's views follow one another,
    /// best first. Views of listed craters that the search did not reach (not on the
    /// shortlist, or past `top_k`) are scored as the mode scores (two-stage: late
    /// interaction) and listed with them; such a view can come first when it scores best.
    /// Every hit keeps its own score.
    pub group_views: bool,
}

impl std::str::FromStr for Mode {
    type Err = craterdex_errors::Invalid;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        use strum::IntoEnumIterator;
        let aliases = [
            ("two_stage", Mode::TwoStage),
            ("single", Mode::Stage1),
            ("li", Mode::Exhaustive),
        ];
        craterdex_errors::parse_named("mode", s, Mode::iter(), &aliases)
    }
}

impl Mode {
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// The schema of a mode: one of its spellings.
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for Mode {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use strum::VariantNames;
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::Type::String)
            .enum_values(Some(Mode::VARIANTS.iter().copied()))
            .default(Some(Mode::default().name().into()))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for Mode {}

impl Default for SearchParams {
    fn default() -> Self {
        Self {
            top_k: 10,
            shortlist: 100,
            mode: Mode::TwoStage,
            stage1: Stage1::Auto,
            group_views: true,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Hit {
    pub row: usize,
    /// The score the ranking used.
    pub score: f32,
    pub stage1: Option<f32>,
    pub stage2: Option<f32>,
}

/// A hit of a one-stage search: the score is stage 1's or stage 2's, by `mode`.
#[inline]
pub(super) fn one_stage_hit(row: usize, score: f32, mode: Mode) -> Hit {
    let stage1 = mode == Mode::Stage1;
    Hit {
        row,
        score,
        stage1: stage1.then_some(score),
        stage2: (!stage1).then_some(score),
    }
}

/// Results of a one-stage search.
pub(super) fn hits_of(lists: Vec<Vec<Scored>>, mode: Mode) -> Vec<Vec<Hit>> {
    lists
        .into_iter()
        .map(|l| {
            l.into_iter()
                .map(|s| one_stage_hit(s.row, s.score, mode))
                .collect()
        })
        .collect()
}
