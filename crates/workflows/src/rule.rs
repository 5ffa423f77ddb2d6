//! The decision rule of `link` and `dedup`, and where it is stored.
//!
//! For a query entry, the candidates are the index's best entries by appearance (two-stage
//! late interaction). When the query and a candidate both have positions, the candidate is
//! kept only if its centre lies within `max_offset_radii` radii of the larger crater and the
//! diameter ratio is at most `max_diameter_ratio` (the search radius). Each kept candidate
//! gets a confidence, the probability that it is the query's crater:
//!
//! - with positions on both sides, `sigmoid(b + w_s * score + w_o * offset_radii +
//!   w_r * ln(diameter_ratio))` (`geometry_weights` = [b, w_s, w_o, w_r]);
//! - otherwise `sigmoid(b + w_s * score)` (`appearance_weights` = [b, w_s]).
//!
//! The most confident candidate decides: `match` at a confidence of at least
//! `match_confidence`, `new` below `new_confidence` (or when no candidate is kept),
//! `ambiguous` between (the review page lists these first). `craterdex calibrate` fits the
//! weights by logistic regression on labelled pairs and picks the two thresholds for a
//! target precision.

use crate::error::{Error, Result};
use craterdex_errors::{ensure, IoContext, OrInvalid, ResultExt};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The file a calibrated rule is kept in, inside the index directory. A rebuild of the
/// index (`index build`) replaces the directory and so drops it: new scores, new rule.
pub const RULE_FILE: &str = "link-rule.json";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkRule {
    pub match_confidence: f64,
    pub new_confidence: f64,
    pub max_offset_radii: f64,
    pub max_diameter_ratio: f64,
    /// Radius of the body the positions are on, in km.
    pub body_radius_km: f64,
    /// [bias, score]
    pub appearance_weights: [f64; 2],
    /// [bias, score, offset in radii, ln diameter ratio]
    pub geometry_weights: [f64; 4],
    /// Limits and weights for candidates whose positions are both registered to the
    /// catalogue's frame (`crate::register`): offsets are then nearly exact.
    #[serde(default)]
    pub registered: RegisteredRule,
    /// How the rule was obtained (the calibration's summary, or "default").
    pub source: String,
}

impl Default for LinkRule {
    /// Measured, default index recipe: the thresholds and appearance weights are what
    /// `craterdex calibrate --index craterdex-demo/index --entries
    /// craterdex-demo/bench/splits/test.json` (target precision 0.99) gives on the demo
    /// benchmark; the geometry weights are `craterdex eval-link`'s calibration on the demo's
    /// Mars tile at 4 radii of georeferencing error. Indexes built with another recipe
    /// score on another scale and should be calibrated.
    fn default() -> Self {
        LinkRule {
            match_confidence: 0.418,
            new_confidence: 0.066,
            max_offset_radii: 3.0,
            max_diameter_ratio: 1.5,
            body_radius_km: crate::geometry::MARS_RADIUS_KM,
            appearance_weights: [-7.22, 11.55],
            geometry_weights: [-6.06, 18.19, -0.27, -19.46],
            registered: RegisteredRule::default(),
            source: "default (calibrated on the demo benchmark, default recipe)".into(),
        }
    }
}

/// Geometric evidence between a query and a candidate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Geometry {
    /// Centre distance in radii of the larger crater.
    pub offset_radii: f64,
    /// Larger over smaller diameter.
    pub diameter_ratio: f64,
    /// Both positions are in the catalogue's frame by registration.
    pub registered: bool,
}

/// The geometric part of the rule once both positions are registered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RegisteredRule {
    pub max_offset_radii: f64,
    pub max_diameter_ratio: f64,
    /// [bias, score, offset in radii, ln diameter ratio]
    pub weights: [f64; 4],
}

impl Default for RegisteredRule {
    /// Set by hand, not fitted, from what registration leaves (`craterdex eval-link`: a
    /// median inlier residual of 0.11 radii on the Mars tile, 0.13 on NAC): a candidate
    /// within a quarter radius and 10% in diameter is the same crater at any appearance
    /// score (confidence >= 0.9), one a radius away is not (<= 0.05 at score 0.3). The
    /// link F1 it gives is in docs/guide/workflows.md; `calibrate` refits them.
    fn default() -> Self {
        RegisteredRule {
            max_offset_radii: 1.0,
            max_diameter_ratio: 1.5,
            weights: [4.0, 4.0, -8.0, -8.0],
        }
    }
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

impl LinkRule {
    pub fn path_in(index_dir: &Path) -> PathBuf {
        index_dir.join(RULE_FILE)
    }

    /// The rule stored with the index, or the default when none was calibrated.
    pub fn for_index(index_dir: &Path) -> Result<LinkRule> {
        let p = Self::path_in(index_dir);
        if !p.exists() {
            return Ok(LinkRule::default());
        }
        Self::load(&p)
    }

    pub fn load(path: &Path) -> Result<LinkRule> {
        let bytes = std::fs::read(path).io("read", path)?;
        let rule: LinkRule = serde_json::from_slice(&bytes)
            .or_invalid_with(|| format!("{}: not a link rule", path.display()))?;
        rule.validate()
            .with_context(|| format!("{}: invalid link rule", path.display()))?;
        Ok(rule)
    }

    pub fn validate(&self) -> Result<()> {
        ensure!(
            (0.0..=1.0).contains(&self.match_confidence)
                && (0.0..=1.0).contains(&self.new_confidence),
            Error::Invalid("confidences must lie in [0, 1]".into())
        );
        ensure!(
            self.new_confidence <= self.match_confidence,
            Error::Invalid(format!(
                "new_confidence {} above match_confidence {}",
                self.new_confidence, self.match_confidence
            ))
        );
        ensure!(
            self.appearance_weights
                .iter()
                .chain(&self.geometry_weights)
                .chain(&self.registered.weights)
                .all(|w| w.is_finite()),
            Error::Invalid("weights must be finite".into())
        );
        ensure!(
            self.max_offset_radii > 0.0
                && self.max_diameter_ratio >= 1.0
                && self.registered.max_offset_radii > 0.0
                && self.registered.max_diameter_ratio >= 1.0
                && self.body_radius_km > 0.0,
            Error::Invalid(
                "geometry limits must be positive, the diameter ratio at least 1".to_string()
            )
        );
        Ok(())
    }

    /// Stores the rule beside the index's files (atomically), checked as reading it back
    /// will check it: a fit that went wrong (a weight not finite) is refused, never written.
    pub fn save(&self, index_dir: &Path) -> Result<()> {
        self.validate()
            .with_context(|| "the calibrated link rule is not usable".to_string())?;
        Ok(craterdex_durable::write_atomic(
            &Self::path_in(index_dir),
            &serde_json::to_vec_pretty(self)?,
        )?)
    }

    /// The probability that a candidate with this appearance score, and this geometric
    /// evidence when both positions are known, is the query's crater.
    pub fn confidence(&self, score: f32, geometry: Option<Geometry>) -> f64 {
        let s = score as f64;
        match geometry {
            Some(g) => {
                let w = if g.registered {
                    &self.registered.weights
                } else {
                    &self.geometry_weights
                };
                sigmoid(w[0] + w[1] * s + w[2] * g.offset_radii + w[3] * g.diameter_ratio.ln())
            }
            None => sigmoid(self.appearance_weights[0] + self.appearance_weights[1] * s),
        }
    }

    /// Whether a candidate at this offset and diameter ratio can be the same crater.
    pub fn geometry_allows(&self, g: Geometry) -> bool {
        let (offset, ratio) = if g.registered {
            (
                self.registered.max_offset_radii,
                self.registered.max_diameter_ratio,
            )
        } else {
            (self.max_offset_radii, self.max_diameter_ratio)
        };
        g.offset_radii <= offset && g.diameter_ratio <= ratio
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rule with a weight that is not finite is refused when saved, not only when read
    /// back, and the rule stored before stays.
    #[test]
    fn a_rule_that_is_not_finite_is_never_written() {
        let dir = tempfile::tempdir().unwrap();
        LinkRule::default().save(dir.path()).unwrap();
        let bad = LinkRule {
            geometry_weights: [1.0, f64::NAN, 0.0, 0.0],
            ..LinkRule::default()
        };
        let e = bad.save(dir.path()).unwrap_err().to_string();
        assert!(e.contains("weights must be finite"), "{e}");
        assert_eq!(
            LinkRule::for_index(dir.path()).unwrap(),
            LinkRule::default()
        );
    }
}
