//! The decision rule of `link` and `dedup`, and where it is stored.
//!
//! For a query entry, the candidates are the index's best entries by appearance (two-stage
//! late interaction). When the query and a candidate both have positions, the candidate is
//! kept only if its centre lies within `max_offset_radii` radii of the larger crater and the
//! diameter ratio is at most `max_diameter_ratio`. Of the kept candidates, the best decides:
//!
//! - `match` when its score is at least `match_score` and no candidate of another crater
//!   scores within `margin` of it;
//! - `new` when no candidate is kept or the best scores below `new_score`;
//! - `ambiguous` otherwise: a person looks at it (the review page lists these first).
//!
//! `confidence` is the calibrated probability that the best candidate is the same crater,
//! `1 / (1 + exp(-(a * score + b)))`, fitted on labelled pairs by `craterdex calibrate`.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The file a calibrated rule is kept in, inside the index directory. A rebuild of the
/// index (`index build`) replaces the directory and so drops it: new scores, new rule.
pub const RULE_FILE: &str = "link-rule.json";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkRule {
    pub match_score: f32,
    pub new_score: f32,
    pub margin: f32,
    pub max_offset_radii: f64,
    pub max_diameter_ratio: f64,
    /// Radius of the body the positions are on, in km.
    pub body_radius_km: f64,
    /// Logistic calibration of the score: `p(same crater) = sigmoid(a * score + b)`.
    pub platt_a: f64,
    pub platt_b: f64,
    /// How the rule was obtained (the calibration's summary, or "default").
    pub source: String,
}

impl Default for LinkRule {
    /// What `craterdex calibrate --index craterdex-demo/index --entries
    /// craterdex-demo/bench/splits/test.json --target-precision 0.99` gives on the demo
    /// benchmark (default recipe, 196 labelled queries): indexes built with another recipe
    /// score on another scale and should be calibrated.
    fn default() -> Self {
        LinkRule {
            match_score: 0.708,
            new_score: 0.467,
            margin: 0.0,
            max_offset_radii: 3.0,
            max_diameter_ratio: 1.5,
            body_radius_km: crate::geometry::MARS_RADIUS_KM,
            platt_a: 13.59,
            platt_b: -6.70,
            source: "default (the demo benchmark's calibration, default recipe)".into(),
        }
    }
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
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let rule: LinkRule = serde_json::from_slice(&bytes)
            .with_context(|| format!("{}: not a link rule", path.display()))?;
        rule.validate()
            .with_context(|| format!("{}: invalid link rule", path.display()))?;
        Ok(rule)
    }

    pub fn validate(&self) -> Result<()> {
        anyhow::ensure!(
            self.match_score.is_finite() && self.new_score.is_finite() && self.margin >= 0.0,
            "scores must be finite and the margin non-negative"
        );
        anyhow::ensure!(
            self.new_score <= self.match_score,
            "new_score {} above match_score {}",
            self.new_score,
            self.match_score
        );
        anyhow::ensure!(
            self.max_offset_radii > 0.0
                && self.max_diameter_ratio >= 1.0
                && self.body_radius_km > 0.0
                && self.platt_a.is_finite()
                && self.platt_b.is_finite(),
            "geometry limits must be positive, the diameter ratio at least 1"
        );
        Ok(())
    }

    /// Stores the rule beside the index's files (atomically).
    pub fn save(&self, index_dir: &Path) -> Result<()> {
        craterdex_durable::write_atomic(
            &Self::path_in(index_dir),
            &serde_json::to_vec_pretty(self)?,
        )
    }

    pub fn confidence(&self, score: f32) -> f64 {
        1.0 / (1.0 + (-(self.platt_a * score as f64 + self.platt_b)).exp())
    }

    /// Whether a candidate at this offset and diameter ratio can be the same crater.
    pub fn geometry_allows(&self, offset_radii: f64, diameter_ratio: f64) -> bool {
        offset_radii <= self.max_offset_radii && diameter_ratio <= self.max_diameter_ratio
    }
}
