//! Single-vector descriptors of an image, L2-normalised.

use crate::l2_normalize;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Pooling {
    /// The CLS token.
    Cls,
    /// Global average of the patch tokens.
    Gap,
    /// Generalised mean of the patch tokens. ViT activations are signed, so each value is
    /// clamped to `>= 1e-6` before the power (the usual GeM clamp): GeM pools the positive
    /// part of each dimension, and a dimension that is never positive contributes ~0.
    Gem { p: f32 },
    /// Per-dimension maximum over the patch tokens.
    Max,
}

/// The exponent of [`Pooling::Gem`] when a user names `gem`.
pub const GEM_P: f32 = 3.0;

impl Pooling {
    /// The poolings a user names.
    pub const OPTIONS: [Pooling; 4] = [
        Pooling::Cls,
        Pooling::Gap,
        Pooling::Gem { p: GEM_P },
        Pooling::Max,
    ];

    pub fn name(&self) -> &'static str {
        match self {
            Pooling::Cls => "cls",
            Pooling::Gap => "gap",
            Pooling::Gem { .. } => "gem",
            Pooling::Max => "max",
        }
    }
}

/// `gem` stands for GeM at [`GEM_P`]; another exponent is written `gem:P`.
impl std::fmt::Display for Pooling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pooling::Gem { p } if *p != GEM_P => write!(f, "gem:{p}"),
            other => f.write_str(other.name()),
        }
    }
}

impl std::str::FromStr for Pooling {
    type Err = craterdex_errors::Invalid;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(p) = s.trim().strip_prefix("gem:") {
            return match p.parse::<f32>() {
                Ok(p) if p.is_finite() && p > 0.0 => Ok(Pooling::Gem { p }),
                _ => Err(craterdex_errors::Invalid(format!(
                    "pooling {s:?}: GeM needs a positive exponent"
                ))),
            };
        }
        craterdex_errors::parse_named("pooling", s, Self::OPTIONS, &[])
    }
}

const GEM_EPS: f32 = 1e-6;

/// The pooled, L2-normalised descriptor of one image (`patches` is `[T, d]`).
pub fn pool(cls: &[f32], patches: &[f32], d: usize, kind: Pooling) -> Vec<f32> {
    let t = (patches.len() / d).max(1);
    let mut out = match kind {
        Pooling::Cls => cls.to_vec(),
        Pooling::Gap => {
            let mut acc = vec![0f32; d];
            patches
                .chunks(d)
                .for_each(|r| acc.iter_mut().zip(r).for_each(|(a, v)| *a += v));
            acc.iter_mut().for_each(|a| *a /= t as f32);
            acc
        }
        Pooling::Gem { p } => {
            let mut acc = vec![0f64; d];
            patches.chunks(d).for_each(|r| {
                acc.iter_mut()
                    .zip(r)
                    .for_each(|(a, v)| *a += (v.max(GEM_EPS) as f64).powf(p as f64))
            });
            acc.iter()
                .map(|a| (a / t as f64).powf(1.0 / p as f64) as f32)
                .collect()
        }
        Pooling::Max => {
            let mut acc = vec![f32::NEG_INFINITY; d];
            patches
                .chunks(d)
                .for_each(|r| acc.iter_mut().zip(r).for_each(|(a, v)| *a = a.max(*v)));
            acc
        }
    };
    l2_normalize(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_by_hand() {
        let cls = [3.0, 4.0];
        let patches = [1.0, -1.0, 3.0, 1.0];
        assert_eq!(pool(&cls, &patches, 2, Pooling::Cls), vec![0.6, 0.8]);
        let gap = pool(&cls, &patches, 2, Pooling::Gap); // mean (2, 0)
        assert_eq!(gap, vec![1.0, 0.0]);
        let mx = pool(&cls, &patches, 2, Pooling::Max); // (3, 1)
        assert!((mx[0] - 3.0 / 10f32.sqrt()).abs() < 1e-6);
        // GeM p=1 with a negative value clamped: dim0 mean(1,3)=2, dim1 mean(1e-6, 1)~0.5
        let gem = pool(&cls, &patches, 2, Pooling::Gem { p: 1.0 });
        let n = (4.0f32 + 0.25).sqrt();
        assert!(
            (gem[0] - 2.0 / n).abs() < 1e-5 && (gem[1] - 0.5 / n).abs() < 1e-5,
            "{gem:?}"
        );
    }

    #[test]
    fn gem_approaches_max_for_large_p() {
        let patches = [0.1, 0.9, 0.5, 0.2, 0.3, 0.4];
        let g = pool(&[0.0; 2], &patches, 2, Pooling::Gem { p: 60.0 });
        let m = pool(&[0.0; 2], &patches, 2, Pooling::Max);
        assert!(
            g.iter().zip(&m).all(|(a, b)| (a - b).abs() < 0.05),
            "{g:?} vs {m:?}"
        );
    }
}
