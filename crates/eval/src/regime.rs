//! The name of an evaluation regime, typed: what it searches with (single vector, K raw or
//! instance tokens, k-means tokens, every patch token), the two-stage shortlist, the token
//! codec, IVF stage 1, the whitening and view grouping. It reads and writes the names the
//! paper's tables and the JSON outputs use (`inst_fps_k32`, `two_stage_s100_k32_int8`,
//! `max_pairwhite_grouped`, ...), so reports and the command line match on the type.

use craterdex_engine::{Codec, OppositeSun, Pooling, QueryViews, SeedStrategy};
use craterdex_errors::Invalid;
use serde::Serialize;

/// How a regime's descriptors are whitened, learned only from gallery images of craters no
/// query looks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Whiten {
    Off,
    /// PCA whitening, unsupervised: `_white`.
    Pca,
    /// Learned from the gallery's two views of each crater, blended with PCA
    /// ([`craterdex_tokens::DEFAULT_PAIR_BLEND`]; what `index build` learns): `_pairwhite`.
    Pairs,
}

impl Whiten {
    /// What the regime names end with.
    pub fn suffix(self) -> &'static str {
        match self {
            Self::Off => "",
            Self::Pca => "_white",
            Self::Pairs => "_pairwhite",
        }
    }
    pub fn label(self) -> &'static str {
        match self {
            Self::Off => "unwhitened",
            Self::Pca => "PCA-whitened",
            Self::Pairs => "pair-whitened",
        }
    }
}

/// What a regime searches with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tokens {
    /// A single vector alone (stage 1).
    Single(Pooling),
    /// The K seed tokens chosen by attention, as they are.
    Raw(usize),
    /// K instance tokens, seeded by attention or by farthest-point sampling.
    Instance { seeds: SeedStrategy, k: usize },
    /// K k-means centroids of the patch tokens.
    KMeans(usize),
    /// Every patch token.
    Full,
}

/// The regime family, for plots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    Single,
    Raw,
    InstAttn,
    InstFps,
    KMeans,
    FullLi,
    TwoStage,
    Codec,
}

/// One regime.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RegimeId {
    pub tokens: Tokens,
    /// Two-stage: the single-vector shortlist S that the tokens rerank.
    pub shortlist: Option<usize>,
    /// The token codec, when the regime names one (f32 otherwise).
    pub codec: Option<Codec>,
    /// Stage 1 through IVF lists.
    pub ivf: bool,
    pub whitening: Whiten,
    /// Hits listed crater by crater.
    pub grouped: bool,
    /// Each query searched in several views: turned and mirrored (`craterdex search
    /// --turns N`, named `_turnsN`), under the opposite sun (`--opposite-sun`, `_oppsun`).
    pub views: QueryViews,
    /// The first N hits spatially verified (`craterdex search --verify N`).
    pub verify: Option<usize>,
    /// Rechecked as `craterdex search` searches query images by default: verified, and
    /// searched again in turns and under the opposite sun where the first hit does not
    /// register (`_recheck`).
    pub recheck: bool,
}

impl RegimeId {
    /// A regime of `tokens` searched exhaustively in f32, unwhitened, image by image.
    pub fn of(tokens: Tokens) -> Self {
        Self {
            tokens,
            shortlist: None,
            codec: None,
            ivf: false,
            whitening: Whiten::Off,
            grouped: false,
            views: QueryViews::PLAIN,
            verify: None,
            recheck: false,
        }
    }

    /// K FPS instance tokens.
    pub fn fps(k: usize) -> Self {
        Self::of(Tokens::Instance {
            seeds: SeedStrategy::Fps,
            k,
        })
    }

    pub fn whitened(self, whitening: Whiten) -> Self {
        Self { whitening, ..self }
    }

    pub fn grouped(self, grouped: bool) -> Self {
        Self { grouped, ..self }
    }

    /// The shipped recipe: a CLS shortlist of 100 reranked by 32 FPS instance tokens in
    /// int8.
    pub fn shipped() -> Self {
        Self {
            shortlist: Some(100),
            codec: Some(Codec::Int8),
            ..Self::fps(32)
        }
    }

    /// Tokens per image, for the token regimes that name it.
    pub fn k(&self) -> Option<usize> {
        match self.tokens {
            Tokens::Raw(k) | Tokens::Instance { k, .. } | Tokens::KMeans(k) => Some(k),
            Tokens::Single(_) | Tokens::Full => None,
        }
    }

    pub fn family(&self) -> Family {
        match self.tokens {
            Tokens::Single(_) => Family::Single,
            Tokens::Raw(_) => Family::Raw,
            Tokens::KMeans(_) => Family::KMeans,
            Tokens::Full => Family::FullLi,
            Tokens::Instance { .. } if self.shortlist.is_some() => Family::TwoStage,
            Tokens::Instance { .. } if self.codec.is_some() => Family::Codec,
            Tokens::Instance {
                seeds: SeedStrategy::Fps,
                ..
            } => Family::InstFps,
            Tokens::Instance { .. } => Family::InstAttn,
        }
    }

    /// The same regime unwhitened and ungrouped: what a lever ablation varies.
    pub fn base(&self) -> Self {
        Self {
            whitening: Whiten::Off,
            grouped: false,
            ..*self
        }
    }
}

impl std::fmt::Display for RegimeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.shortlist, self.tokens) {
            (Some(s), _) => write!(f, "two_stage_s{s}_k{}", self.k().unwrap_or(0))?,
            (None, Tokens::Single(p)) => f.write_str(p.name())?,
            (None, Tokens::Raw(k)) => write!(f, "raw_attn_k{k}")?,
            (None, Tokens::Instance { seeds, k }) => match seeds {
                SeedStrategy::Fps => write!(f, "inst_fps_k{k}")?,
                other => write!(f, "inst_{}_k{k}", other.name())?,
            },
            (None, Tokens::KMeans(k)) => write!(f, "kmeans_k{k}")?,
            (None, Tokens::Full) => f.write_str("full_li")?,
        }
        if let Some(c) = self.codec {
            write!(f, "_{c}")?;
        }
        if self.ivf {
            f.write_str("_ivf")?;
        }
        f.write_str(self.whitening.suffix())?;
        if self.grouped {
            f.write_str("_grouped")?;
        }
        if self.views.turns > 1 {
            write!(f, "_turns{}", self.views.turns)?;
        }
        match self.views.opposite_sun {
            OppositeSun::Every => f.write_str("_oppsun")?,
            OppositeSun::Given => f.write_str("_oppgiven")?,
            OppositeSun::Off => {}
        }
        if let Some(n) = self.verify {
            write!(f, "_verify{n}")?;
        }
        if self.recheck {
            f.write_str("_recheck")?;
        }
        Ok(())
    }
}

/// Takes a trailing `suffix` off `rest` (a name is never the suffix alone): whether it was
/// there.
fn take_suffix(rest: &mut &str, suffix: &str) -> bool {
    let found = rest.ends_with(suffix) && rest.len() > suffix.len();
    if found {
        *rest = &rest[..rest.len() - suffix.len()];
    }
    found
}

/// Takes a trailing `<suffix>N` off `rest`: `Some(Some(N))`, `Some(None)` when there is none,
/// `None` when what follows the suffix is no number.
fn take_numbered(rest: &mut &str, suffix: &str) -> Option<Option<usize>> {
    match rest.rsplit_once(suffix) {
        Some((head, n)) if !head.is_empty() => {
            let n = n.parse::<usize>().ok()?;
            *rest = head;
            Some(Some(n))
        }
        _ => Some(None),
    }
}

/// `K` of a `kK` part.
fn k_of(part: &str) -> Option<usize> {
    part.strip_prefix('k')?.parse().ok()
}

impl std::str::FromStr for RegimeId {
    type Err = Invalid;
    fn from_str(name: &str) -> Result<Self, Invalid> {
        let bad = || Invalid(format!("{name:?} is not a regime name"));
        let mut rest = name;
        let recheck = take_suffix(&mut rest, "_recheck");
        let verify = take_numbered(&mut rest, "_verify").ok_or_else(bad)?;
        let opposite_sun = if take_suffix(&mut rest, "_oppsun") {
            OppositeSun::Every
        } else if take_suffix(&mut rest, "_oppgiven") {
            OppositeSun::Given
        } else {
            OppositeSun::Off
        };
        let turns = take_numbered(&mut rest, "_turns").ok_or_else(bad)?;
        let mut take = |suffix: &str| take_suffix(&mut rest, suffix);
        let grouped = take("_grouped");
        let whitening = if take("_pairwhite") {
            Whiten::Pairs
        } else if take("_white") {
            Whiten::Pca
        } else {
            Whiten::Off
        };
        let ivf = take("_ivf");
        let mut parts: Vec<&str> = rest.split('_').collect();
        // a codec closes the name where its last part parses as one (k-parts never do)
        let codec = match parts.last().map(|p| p.parse::<Codec>()) {
            Some(Ok(c)) if parts.len() > 1 => {
                parts.pop();
                Some(c)
            }
            _ => None,
        };
        let (tokens, shortlist) = match parts[..] {
            ["two", "stage", s, k] => {
                let s = s.strip_prefix('s').and_then(|s| s.parse().ok());
                let k = k_of(k).ok_or_else(bad)?;
                let tokens = Tokens::Instance {
                    seeds: SeedStrategy::Fps,
                    k,
                };
                (tokens, Some(s.ok_or_else(bad)?))
            }
            ["full", "li"] => (Tokens::Full, None),
            ["raw", "attn", k] => (Tokens::Raw(k_of(k).ok_or_else(bad)?), None),
            ["kmeans", k] => (Tokens::KMeans(k_of(k).ok_or_else(bad)?), None),
            ["inst", seeds, k] => {
                let seeds = seeds.parse::<SeedStrategy>().map_err(|_| bad())?;
                let k = k_of(k).ok_or_else(bad)?;
                (Tokens::Instance { seeds, k }, None)
            }
            [pooling] => (
                Tokens::Single(pooling.parse::<Pooling>().map_err(|_| bad())?),
                None,
            ),
            _ => return Err(bad()),
        };
        Ok(RegimeId {
            tokens,
            shortlist,
            codec,
            ivf,
            whitening,
            grouped,
            views: QueryViews {
                turns: turns.unwrap_or(1),
                opposite_sun,
                ..QueryViews::PLAIN
            },
            verify,
            recheck,
        })
    }
}

impl Serialize for RegimeId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_regime_name_reads_back_as_written() {
        for name in [
            "cls",
            "gem_white",
            "max_pairwhite_grouped",
            "raw_attn_k16",
            "inst_attn_k8_white",
            "inst_fps_k32_grouped",
            "kmeans_k16",
            "full_li_pairwhite",
            "two_stage_s100_k32",
            "two_stage_s500_k32_white_grouped",
            "inst_fps_k32_int8",
            "inst_fps_k32_pq96_white",
            "inst_fps_k32_f16",
            "two_stage_s100_k32_int8_pairwhite_grouped",
            "two_stage_s100_k32_int8_ivf_white",
            "two_stage_s100_k32_int8_pairwhite_grouped_turns12",
            "two_stage_s100_k32_int8_pairwhite_grouped_oppsun",
            "two_stage_s100_k32_int8_pairwhite_grouped_turns12_oppsun_verify20",
            "two_stage_s100_k32_int8_pairwhite_grouped_verify10",
            "two_stage_s100_k32_int8_pairwhite_verify5",
            "two_stage_s100_k32_int8_pairwhite_grouped_recheck",
            "two_stage_s100_k32_int8_pairwhite_grouped_turns12_oppgiven_verify200",
        ] {
            let id: RegimeId = name.parse().unwrap();
            assert_eq!(id.to_string(), name);
        }
        assert!("inst_fps".parse::<RegimeId>().is_err());
        assert!("two_stage_sX_k32".parse::<RegimeId>().is_err());
        assert!("zip".parse::<RegimeId>().is_err());
        assert!("cls_turnsX".parse::<RegimeId>().is_err());
        let turned: RegimeId = "two_stage_s100_k32_int8_pairwhite_grouped_turns12"
            .parse()
            .unwrap();
        assert_eq!(turned.views, QueryViews::turned(12));
        assert!(turned.grouped);
        let verified: RegimeId = "two_stage_s100_k32_int8_pairwhite_grouped_verify10"
            .parse()
            .unwrap();
        assert_eq!(
            (verified.verify, verified.views),
            (Some(10), QueryViews::PLAIN)
        );
        assert!(verified.grouped);
        assert!("cls_verifyX".parse::<RegimeId>().is_err());
        let rechecked: RegimeId = "two_stage_s100_k32_int8_pairwhite_grouped_recheck"
            .parse()
            .unwrap();
        assert!(rechecked.recheck && rechecked.grouped && rechecked.verify.is_none());
        let relit: RegimeId = "two_stage_s100_k32_int8_pairwhite_grouped_turns12_oppsun_verify20"
            .parse()
            .unwrap();
        let views = QueryViews {
            turns: 12,
            opposite_sun: OppositeSun::Every,
            ..QueryViews::PLAIN
        };
        assert_eq!((relit.views, relit.verify), (views, Some(20)));
        let again: RegimeId =
            "two_stage_s100_k32_int8_pairwhite_grouped_turns12_oppgiven_verify200"
                .parse()
                .unwrap();
        assert_eq!(
            (again.views, again.verify),
            (
                craterdex_engine::RecheckPlan::shipped().last().views,
                Some(craterdex_engine::RecheckPlan::shipped().last().verify),
            )
        );
    }

    #[test]
    fn the_fields_say_what_the_name_says() {
        let shipped: RegimeId = "two_stage_s100_k32_int8_pairwhite_grouped".parse().unwrap();
        assert_eq!(
            shipped,
            RegimeId::shipped().whitened(Whiten::Pairs).grouped(true)
        );
        assert_eq!(shipped.family(), Family::TwoStage);
        assert_eq!(shipped.base(), RegimeId::shipped());
        let codec: RegimeId = "inst_fps_k32_pq48".parse().unwrap();
        assert_eq!(codec.family(), Family::Codec);
        assert_eq!(codec.codec, Some(Codec::Pq { m: 48 }));
        assert_eq!(RegimeId::fps(16).family(), Family::InstFps);
        assert_eq!("raw_attn_k16".parse::<RegimeId>().unwrap().k(), Some(16));
    }
}
