//! Backbone features of one image posted to a service (the HTTP API, a cluster's router): a
//! safetensors body as `craterdex extract` writes it, or JSON; checked against the index's
//! feature width. Malformed JSON is [`Error::Invalid`]; content that is well-formed but
//! cannot be features (a binary body that is no safetensors file, a tensor missing or of
//! another dtype, the wrong widths, non-finite values) is [`Error::Unusable`].

use crate::error::{Error, Result};
use crate::extract::{FeatureSet, FEATURE_DTYPES};
use crate::layouts;
use serde::Deserialize;

/// Numbers given as a flat list `[T*D]` or as nested lists `[T][D]`, read straight into one
/// vector (an untagged enum would buffer the whole document first: 3x slower).
struct FlatFloats(Vec<f32>);

impl<'de> Deserialize<'de> for FlatFloats {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Outer;
        struct Row<'a>(&'a mut Vec<f32>);
        impl<'de> serde::de::DeserializeSeed<'de> for Row<'_> {
            type Value = ();
            fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
                d.deserialize_any(self)
            }
        }
        impl<'de> serde::de::Visitor<'de> for Row<'_> {
            type Value = ();
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number or a list of numbers")
            }
            fn visit_f64<E>(self, v: f64) -> Result<(), E> {
                self.0.push(v as f32);
                Ok(())
            }
            fn visit_i64<E>(self, v: i64) -> Result<(), E> {
                self.0.push(v as f32);
                Ok(())
            }
            fn visit_u64<E>(self, v: u64) -> Result<(), E> {
                self.0.push(v as f32);
                Ok(())
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
                while let Some(v) = seq.next_element::<f32>()? {
                    self.0.push(v);
                }
                Ok(())
            }
        }
        impl<'de> serde::de::Visitor<'de> for Outer {
            type Value = Vec<f32>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of numbers or of lists of numbers")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Vec<f32>, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while seq.next_element_seed(Row(&mut out))?.is_some() {}
                Ok(out)
            }
        }
        d.deserialize_seq(Outer).map(FlatFloats)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FeaturesBody {
    cls: Vec<f32>,
    patches: FlatFloats,
    attention: Vec<f32>,
}

/// `(cls, patches, attention)` from a JSON document or a safetensors file (the features
/// format of `craterdex extract`, one image: `cls` `[D]` or `[1, D]`, `patch_tokens` `[T, D]`
/// or `[1, T, D]` in f32 or f16, `attention` `[T]` or `[1, T]`).
pub fn parse_features(body: &[u8], content_type: &str) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
    // A binary body is well-formed whatever its bytes, so what cannot be read from it is
    // unusable content, as with an undecodable image.
    let unusable = Error::Unusable;
    let declared_binary = content_type.starts_with("application/octet-stream");
    if content_type.starts_with("application/json") || body.first() == Some(&b'{') {
        let b: FeaturesBody = serde_json::from_slice(body).map_err(|e| {
            let m = format!("bad features JSON: {e}");
            // malformed JSON is a bad request; a body declared binary that merely starts
            // like JSON is unusable content
            if declared_binary {
                unusable(m)
            } else {
                Error::Invalid(m)
            }
        })?;
        return Ok((b.cls, b.patches.0, b.attention));
    }
    let st = safetensors::SafeTensors::deserialize(body).map_err(|e| {
        unusable(format!(
            "the body is neither features JSON nor a safetensors file: {e}"
        ))
    })?;
    let read = |name: &str| -> Result<Vec<f32>> {
        let t = st
            .tensor(name)
            .map_err(|_| unusable(format!("the safetensors body has no tensor {name:?}")))?;
        layouts::tensor_floats_of(&t, FEATURE_DTYPES).ok_or_else(|| {
            unusable(format!(
                "{name}: dtype {:?}, expected F32 or F16",
                t.dtype()
            ))
        })
    };
    Ok((read("cls")?, read("patch_tokens")?, read("attention")?))
}

/// The features of one image, checked against the index's feature width.
pub fn check_features(
    (cls, patches, attention): (Vec<f32>, Vec<f32>, Vec<f32>),
    dim: usize,
) -> Result<FeatureSet> {
    let bad = |m: String| Err(Error::Unusable(m));
    if cls.len() != dim {
        return bad(format!(
            "cls has {} values, the index expects {dim}",
            cls.len()
        ));
    }
    if patches.is_empty() || patches.len() % dim != 0 {
        return bad(format!(
            "patches has {} values, not a positive multiple of {dim}",
            patches.len()
        ));
    }
    let t = patches.len() / dim;
    if attention.len() != t {
        return bad(format!(
            "attention has {} values for {t} patch tokens",
            attention.len()
        ));
    }
    if !cls
        .iter()
        .chain(&patches)
        .chain(&attention)
        .all(|x| x.is_finite())
    {
        return bad("features contain NaN or infinite values".into());
    }
    Ok(FeatureSet {
        ids: vec!["query".into()],
        dim,
        tokens: t,
        cls,
        patches,
        attention,
    })
}
