//! The detector directory: `detector.json` (what the detector is, where it came from, its
//! graph) beside `weights.safetensors` (its tensors by `{layer}/kernel` and `{layer}/bias`).
//! Written whole into a sibling directory and renamed into place, so a crash leaves the
//! previous detector readable.

use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::net::{Net, Tensor};
use craterdex_errors::{ensure, IoContext, OrInvalid};
use craterdex_model::store::sha256_hex;
use safetensors::tensor::{Dtype, TensorView};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

pub const CONFIG_FILE: &str = "detector.json";
pub const WEIGHTS_FILE: &str = "weights.safetensors";
pub const FORMAT: &str = "craterdex-detector-1";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DetectorConfig {
    pub format: String,
    pub name: String,
    /// Where the weights came from (`pypi:pycda==0.1.16/pycda/models/unet.h5`, a file).
    pub source: String,
    pub licence: String,
    /// Side of the square tile the detector takes (its crops and concatenations fit no
    /// other size).
    pub tile: usize,
    /// Pixel values are multiplied by this before the first layer (pycda: 8-bit / 255).
    pub input_scale: f32,
    pub graph: Graph,
    /// The share of a crater's diameter that its region of likelihood spans: 1 for
    /// detectors trained on whole discs (pycda's), less for heads fitted on shrunk discs,
    /// which keep neighbouring craters apart (`detect fit`).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub region_share: f64,
    /// What each diameter read (the region's, over `region_share`) is multiplied by: a
    /// fitted detector's regions of likelihood tend to spread past the rims it was taught,
    /// so `detect fit` measures on its labelled images the scale that reads their diameters
    /// best (1 where nothing was measured: pycda's U-Net, an imported file).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub diameter_scale: f64,
    /// What each diameter read is multiplied by once more for each halving down the
    /// pyramid (measured by `detect fit` with `diameter_scale`; 1 where nothing was).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub diameter_scale_per_octave: f64,
    /// sha256 of `weights.safetensors`.
    pub weights_sha256: String,
}

/// The default of the factors a config leaves out when they change nothing: a whole disc's
/// region share, a diameter scale of 1.
fn one() -> f64 {
    1.0
}

fn is_one(factor: &f64) -> bool {
    *factor == 1.0
}

/// The diameter scales a config may hold: a scale outside it would say that the detector
/// reads craters at under half or over twice their size, which no fit should keep.
pub const DIAMETER_SCALES: std::ops::RangeInclusive<f64> = 0.5..=2.0;

/// The scales an octave a config may hold: beyond them the smallest levels (ten octaves
/// down) would read craters at a tenth of their size or ten times it.
pub const DIAMETER_SCALES_PER_OCTAVE: std::ops::RangeInclusive<f64> = 0.8..=1.25;

impl DetectorConfig {
    /// What makes a config usable: an output centred in the tile, a region share in
    /// (0, 1] (a share of 0 would make every diameter infinite, above 1 shrink them) and a
    /// diameter scale in [`DIAMETER_SCALES`] and one an octave in
    /// [`DIAMETER_SCALES_PER_OCTAVE`].
    fn check(&self) -> Result<()> {
        self.output()?;
        ensure!(
            self.region_share > 0.0 && self.region_share <= 1.0,
            Error::Invalid(format!(
                "region_share must lie in (0, 1], not {}",
                self.region_share
            ))
        );
        for (name, value, range) in [
            ("diameter_scale", self.diameter_scale, DIAMETER_SCALES),
            (
                "diameter_scale_per_octave",
                self.diameter_scale_per_octave,
                DIAMETER_SCALES_PER_OCTAVE,
            ),
        ] {
            ensure!(
                range.contains(&value),
                Error::Invalid(format!(
                    "{name} must lie in [{}, {}], not {value}",
                    range.start(),
                    range.end()
                ))
            );
        }
        Ok(())
    }

    /// What `detect` multiplies the diameters it reads by.
    pub fn diameter_scales(&self) -> crate::DiameterScales {
        crate::DiameterScales {
            full_size: self.diameter_scale,
            per_octave: self.diameter_scale_per_octave,
        }
    }

    /// The output side for a tile and the border lost on each side (valid convolutions).
    pub fn output(&self) -> Result<(usize, usize)> {
        let shapes = self.graph.shapes(self.tile, self.tile)?;
        let out = shapes.last().expect("shapes of a checked graph")[0];
        ensure!(
            out > 0 && (self.tile - out).is_multiple_of(2),
            Error::Invalid(format!(
                "detector {}: its {out}-pixel output is not centred in its {}-pixel tile",
                self.name, self.tile
            ))
        );
        Ok((out, (self.tile - out) / 2))
    }

    /// How much larger than its own tile the detector runs: the smallest step by which a
    /// side may grow (valid convolutions, crops and concatenations fit every side whose
    /// poolings divide evenly: 8 px for pycda's U-Net), or 0 where only its own tile fits.
    pub fn tile_step(&self) -> usize {
        let out = |side: usize| -> Option<usize> {
            self.graph
                .shapes(side, side)
                .ok()
                .and_then(|s| s.last().map(|l| l[0]))
        };
        let Some(own) = out(self.tile) else { return 0 };
        (1..=64)
            .find(|&step| {
                out(self.tile + step) == Some(own + step)
                    && out(self.tile + 2 * step) == Some(own + 2 * step)
            })
            .unwrap_or(0)
    }

    /// The tile side (input, output) along an axis of `extent` pixels: as few tiles as
    /// tiles of at most `max_tile` allow, each no larger than that number needs (a
    /// detector's border is context every tile pays for, so larger tiles waste less), and
    /// for an extent under the detector's own output, the smallest tile that covers it (a
    /// small pyramid level in a 256-pixel tile was mostly mirrored border). Sides differ by
    /// whole steps, so every tile's outputs lie on the same grid of its poolings and read
    /// the same context: the likelihood does not depend on the tile.
    pub fn tile_for(&self, extent: usize, max_tile: usize) -> Result<(usize, usize)> {
        let (out, _) = self.output()?;
        let step = self.tile_step();
        if step == 0 {
            return Ok((self.tile, out));
        }
        if extent < out {
            let shrink = (out - extent) / step * step;
            let (tile, smaller) = (self.tile - shrink, out - shrink);
            let fits = self.graph.shapes(tile, tile).ok();
            if fits.and_then(|s| s.last().map(|l| l[0])) == Some(smaller) {
                return Ok((tile, smaller));
            }
            return Ok((self.tile, out));
        }
        if max_tile <= self.tile {
            return Ok((self.tile, out));
        }
        let largest = self.tile + (max_tile - self.tile) / step * step;
        let largest_out = out + (largest - self.tile);
        let tiles = extent.div_ceil(largest_out).max(1);
        let need = extent.div_ceil(tiles);
        let grow = need.saturating_sub(out).div_ceil(step) * step;
        Ok((self.tile + grow, out + grow))
    }
}

fn to_safetensors(weights: &BTreeMap<String, Tensor>) -> Result<Vec<u8>> {
    let views: Vec<(String, TensorView)> = weights
        .iter()
        .map(|(name, (shape, data))| {
            let view = TensorView::new(Dtype::F32, shape.clone(), bytemuck::cast_slice(data))?;
            Ok((name.clone(), view))
        })
        .collect::<Result<_>>()?;
    Ok(safetensors::serialize(views, &None)?)
}

/// Writes a detector directory at `dir` (replacing one there only once the new one is
/// whole); the config's checksum is filled in.
pub fn write_detector_dir(
    dir: &Path,
    mut config: DetectorConfig,
    weights: &BTreeMap<String, Tensor>,
) -> Result<DetectorConfig> {
    config.check()?;
    let bytes = to_safetensors(weights)?;
    // the weights must make a detector before they are stored
    Net::new(config.graph.clone(), |n| weights.get(n).cloned())?;
    config.weights_sha256 = sha256_hex(&bytes);
    let parent = dir
        .parent()
        .or_invalid("a detector directory needs a parent")?;
    std::fs::create_dir_all(parent).io("create", parent)?;
    let tmp = craterdex_durable::tempdir_beside(dir)?;
    let w = tmp.join(WEIGHTS_FILE);
    std::fs::write(&w, &bytes).io("write", &w)?;
    let c = tmp.join(CONFIG_FILE);
    let json = serde_json::to_vec_pretty(&config).map_err(|e| Error::Invalid(e.to_string()))?;
    std::fs::write(&c, json).io("write", &c)?;
    craterdex_durable::replace_dir(&tmp, dir)?;
    Ok(config)
}

/// Reads a detector directory, checks its weights against the config's checksum and packs
/// them.
pub fn read_detector_dir(dir: &Path) -> Result<(DetectorConfig, Net)> {
    let (config, weights) = read_detector_weights(dir)?;
    let wpath = dir.join(WEIGHTS_FILE);
    let net = Net::new(config.graph.clone(), |name| weights.get(name).cloned())
        .map_err(|e| Error::Corrupt(format!("{}: {e}", wpath.display())))?;
    Ok((config, net))
}

/// A detector directory's config and its tensors as stored, checked against the config's
/// checksum: what a detector made from another one (`detect fit`) starts from.
pub fn read_detector_weights(dir: &Path) -> Result<(DetectorConfig, BTreeMap<String, Tensor>)> {
    let cpath = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&cpath).io("read", &cpath)?;
    let config: DetectorConfig = serde_json::from_str(&text).map_err(|e| {
        Error::Invalid(format!(
            "{} is not a craterdex detector config: {e}",
            cpath.display()
        ))
    })?;
    ensure!(
        config.format == FORMAT,
        Error::Unsupported(format!(
            "{}: format {} (this craterdex reads {FORMAT})",
            cpath.display(),
            config.format
        ))
    );
    config
        .check()
        .map_err(|e| Error::Invalid(format!("{}: {e}", cpath.display())))?;
    let wpath = dir.join(WEIGHTS_FILE);
    let bytes = std::fs::read(&wpath).io("read", &wpath)?;
    let got = sha256_hex(&bytes);
    ensure!(
        got == config.weights_sha256,
        Error::Corrupt(format!(
            "{}: sha256 {got} does not match the config's {}; import or fetch the detector again",
            wpath.display(),
            config.weights_sha256
        ))
    );
    let tensors = safetensors::SafeTensors::deserialize(&bytes)?;
    let mut weights = BTreeMap::new();
    for (name, t) in tensors.tensors() {
        ensure!(
            t.dtype() == Dtype::F32,
            Error::Corrupt(format!(
                "{}: tensor {name} is {:?}, not f32",
                wpath.display(),
                t.dtype()
            ))
        );
        let data = t
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("chunks of 4")))
            .collect();
        weights.insert(name, (t.shape().to_vec(), data));
    }
    Ok((config, weights))
}

/// A detector as read from another format: its graph, its tensors (Keras' order), and the
/// side of its square input where the model fixes one.
pub struct ImportedDetector {
    pub graph: Graph,
    pub weights: BTreeMap<String, Tensor>,
    pub tile: Option<usize>,
}

/// Imports a Keras `.h5` or an `.onnx` detector (told by its bytes) as the detector
/// directory `dir`; `what` names the file in messages. Pixels are multiplied by
/// `input_scale` before the first layer (pycda's models: 1/255).
pub fn import_detector(
    bytes: &[u8],
    what: &str,
    name: &str,
    source: &str,
    licence: &str,
    input_scale: f32,
    dir: &Path,
) -> Result<DetectorConfig> {
    const HDF5: &[u8] = b"\x89HDF\r\n\x1a\n";
    let read = if bytes.starts_with(HDF5) {
        crate::keras::read_keras_h5(bytes, what)?
    } else {
        crate::onnx::read_onnx(bytes, what)?
    };
    let tile = read
        .tile
        .filter(|&t| t > 0)
        .ok_or_else(|| Error::Invalid(format!("{what}: the input has no fixed square size")))?;
    let config = DetectorConfig {
        format: FORMAT.into(),
        name: name.into(),
        source: source.into(),
        licence: licence.into(),
        tile,
        input_scale,
        graph: read.graph,
        region_share: 1.0,
        diameter_scale: 1.0,
        diameter_scale_per_octave: 1.0,
        weights_sha256: String::new(),
    };
    write_detector_dir(dir, config, &read.weights)
        .map_err(|e| craterdex_errors::Prefix::prefixed(e, what))
}
