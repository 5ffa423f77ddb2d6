//! A detector fitted to the user's own imagery: a new head on the detector's frozen
//! layers, fitted on labelled images. The head reads the maps at the output's resolution
//! (the last layers' and the skip connection's, side by side) through a hidden 1 x 1 layer,
//! and each pixel of each pyramid level is taught what `detect` reads there: inside the
//! central disc of a crater that level reports, or not. Teaching a central disc (half the
//! diameter by default) keeps dense craters' regions apart; the detector config records
//! the share, so diameters are read back whole. Everything before the head stays as it was:
//! the fitted detector is the same graph with a few layers added.

use crate::detect::{band_rows, halo, in_margin, net_map, DetectOptions, GrayImage};
use crate::error::{Error, Result};
use crate::graph::{Activation, Graph, Op};
use crate::net::{Net, Tensor};
use crate::store::DetectorConfig;
use craterdex_errors::ensure;
use rayon::prelude::*;
use std::collections::BTreeMap;

/// An image and its labelled craters: centre x, y and diameter in its pixels.
pub struct Labelled {
    pub image: GrayImage,
    pub craters: Vec<[f64; 3]>,
}

/// How a head is fitted. The defaults live here.
#[derive(Clone, Debug, PartialEq)]
pub struct FitOptions {
    /// Share of the pixels outside every crater kept as samples (weighted back up, so the
    /// fitted likelihood stays calibrated).
    pub background_share: f64,
    /// At most this many background samples over all images and levels: the share of
    /// background pixels falls to fit (every crater pixel is kept; 160 channels of f32 per
    /// sample with pycda's U-Net).
    pub max_samples: usize,
    /// The share of each crater's diameter taught as crater (the disc around its centre):
    /// less than 1 keeps neighbouring craters' regions apart.
    pub region_share: f64,
    /// Hidden units of the head.
    pub hidden: usize,
    /// Adam steps of a batch of samples each.
    pub steps: usize,
}

impl Default for FitOptions {
    fn default() -> Self {
        Self {
            background_share: 0.25,
            max_samples: 4_000_000,
            region_share: 0.5,
            hidden: 32,
            steps: 1000,
        }
    }
}

/// A fitted head (hidden layer and output, in the features' own units) and what it was
/// fitted on.
#[derive(Clone, Debug, PartialEq)]
pub struct Head {
    /// The hidden 1 x 1 layer (ReLU): `[channels, units]` weights and a bias per unit.
    pub hidden: (Vec<f32>, Vec<f32>),
    /// The output's weight per hidden unit, and its bias.
    pub weights: Vec<f32>,
    pub bias: f32,
    /// Pixels the head was fitted on, and how many of them were inside craters.
    pub samples: usize,
    pub crater_pixels: usize,
}

/// Names of the layers a fit adds; a detector fitted before is cut back to its original
/// layers first.
const FITTED: &str = "fitted_";
const FEATURES: &str = "fitted_features";
const HIDDEN: &str = "fitted_hidden";
const HEAD: &str = "fitted_head";

/// The head's layer: the last, a 1 x 1 convolution to one sigmoid channel reading the layer
/// just before it.
fn head_layer(graph: &Graph) -> Result<usize> {
    let n = graph.layers.len();
    let last = graph
        .layers
        .last()
        .ok_or_else(|| Error::Invalid("the detector has no layers".into()))?;
    let fits = matches!(
        last.op,
        Op::Conv {
            filters: 1,
            kernel: [1, 1],
            stride: [1, 1],
            activation: Activation::Sigmoid,
            ..
        }
    ) && last.inputs == [n - 2];
    ensure!(
        fits,
        Error::Unsupported(format!(
            "only a detector whose last layer is a 1x1 convolution to one sigmoid channel, \
             reading the layer before it, can be fitted; {} is not",
            last.name
        ))
    );
    Ok(n - 1)
}

/// The detector's graph cut before its head, ending in what a fitted head reads: the
/// head's input beside every convolution and concatenation at its resolution since the
/// last upsampling (for pycda's U-Net, the last two convolutions and the skip connection's
/// concatenation of early edges and upsampled deeper maps: 160 channels instead of 32),
/// each cropped to the head's size. A detector fitted before is cut back to its original
/// layers first.
pub fn features_graph(graph: &Graph, tile: usize) -> Result<Graph> {
    let original: Vec<_> = graph
        .layers
        .iter()
        .take_while(|l| !l.name.starts_with(FITTED))
        .cloned()
        .collect();
    let mut layers = if original.len() < graph.layers.len() {
        original
    } else {
        let head = head_layer(graph)?;
        graph.layers[..head].to_vec()
    };
    let shapes = Graph {
        layers: layers.clone(),
    }
    .layer_shapes(tile, tile)?;
    let last = layers.len() - 1;
    let [h, w, _] = shapes[last];
    let from = layers
        .iter()
        .rposition(|l| matches!(l.op, Op::ConvTranspose { .. } | Op::MaxPool { .. }))
        .map_or(0, |i| i + 1);
    let mut parts = Vec::new();
    for i in from..=last {
        let [hi, wi, _] = shapes[i];
        let same_grid = hi >= h && wi >= w && (hi - h) % 2 == 0 && (wi - w) % 2 == 0;
        if !same_grid || !matches!(layers[i].op, Op::Conv { .. } | Op::Concat) {
            continue;
        }
        if (hi, wi) == (h, w) {
            parts.push(i);
            continue;
        }
        let (dy, dx) = ((hi - h) / 2, (wi - w) / 2);
        layers.push(crate::graph::Layer {
            name: format!("{FITTED}crop_{}", layers[i].name),
            op: Op::Crop {
                edges: [dy, dy, dx, dx],
            },
            inputs: vec![i],
        });
        parts.push(layers.len() - 1);
    }
    layers.push(crate::graph::Layer {
        name: FEATURES.into(),
        op: Op::Concat,
        inputs: parts,
    });
    Ok(Graph { layers })
}

/// The fitted detector: its features graph with `head` reading them, the bias moved by
/// `shift` (in logits: what moves the fitted likelihood's best threshold onto the default
/// one); its graph and the tensors it reads.
pub fn with_head(
    graph: &Graph,
    tile: usize,
    weights: &BTreeMap<String, Tensor>,
    head: &Head,
    shift: f32,
) -> Result<(Graph, BTreeMap<String, Tensor>)> {
    let mut g = features_graph(graph, tile)?;
    let conv = |filters, activation| Op::Conv {
        filters,
        kernel: [1, 1],
        stride: [1, 1],
        padding: crate::graph::Padding::Valid,
        activation,
    };
    let mut added = BTreeMap::new();
    let (w, b) = &head.hidden;
    g.layers.push(crate::graph::Layer {
        name: HIDDEN.into(),
        op: conv(b.len(), Activation::Relu),
        inputs: vec![g.layers.len() - 1],
    });
    added.insert(
        format!("{HIDDEN}/kernel"),
        (vec![1, 1, w.len() / b.len(), b.len()], w.clone()),
    );
    added.insert(format!("{HIDDEN}/bias"), (vec![b.len()], b.clone()));
    let input = g.layers.len() - 1;
    g.layers.push(crate::graph::Layer {
        name: HEAD.into(),
        op: Op::Conv {
            filters: 1,
            kernel: [1, 1],
            stride: [1, 1],
            padding: crate::graph::Padding::Valid,
            activation: Activation::Sigmoid,
        },
        inputs: vec![input],
    });
    let read: std::collections::HashSet<&str> = g.layers.iter().map(|l| l.name.as_str()).collect();
    let mut out: BTreeMap<String, Tensor> = weights
        .iter()
        .filter(|(k, _)| {
            k.rsplit_once('/')
                .is_some_and(|(layer, _)| read.contains(layer))
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.extend(added);
    out.insert(
        format!("{HEAD}/kernel"),
        (vec![1, 1, head.weights.len(), 1], head.weights.clone()),
    );
    out.insert(format!("{HEAD}/bias"), (vec![1], vec![head.bias + shift]));
    Ok((g, out))
}

/// Pixel classes of one level: what the head is taught there.
const BACKGROUND: u8 = 0;
pub(crate) const IGNORED: u8 = 1;
pub(crate) const CRATER: u8 = 2;

/// Each pixel's class on a `width x height` level at `scale` whose range of reported
/// diameters is `lo..hi`: within `region_share` of the radius of a crater of that range, a
/// crater; inside one near the
/// range's top (within a factor of 1.25) or below the range, ignored (another level or the
/// smallest-size cut answers for it); elsewhere, inside larger craters too, background.
fn classes(
    craters: &[[f64; 3]],
    scale: f64,
    (lo, hi): (f64, f64),
    region_share: f64,
    width: usize,
    height: usize,
) -> Vec<u8> {
    let mut class = vec![BACKGROUND; width * height];
    let mut paint = |c: &[f64; 3], share: f64, value: u8| {
        let (x, y, r) = (
            (c[0] + 0.5) * scale - 0.5,
            (c[1] + 0.5) * scale - 0.5,
            c[2] * scale / 2.0 * share,
        );
        let rows = ((y - r).floor().max(0.0) as usize)..=((y + r).ceil().max(0.0) as usize);
        for py in rows.filter(|&py| py < height) {
            let cols = ((x - r).floor().max(0.0) as usize)..=((x + r).ceil().max(0.0) as usize);
            for px in cols.filter(|&px| px < width) {
                if (px as f64 - x).hypot(py as f64 - y) <= r {
                    let at = &mut class[py * width + px];
                    *at = (*at).max(value);
                }
            }
        }
    };
    for c in craters {
        let d = c[2] * scale;
        if d < lo || (d >= hi && d < hi * 1.25) {
            paint(c, 1.0, IGNORED);
        }
    }
    for c in craters {
        let d = c[2] * scale;
        if d >= lo && d < hi {
            paint(c, region_share, CRATER);
        }
    }
    class
}

/// A pyramid level of a labelled image, and what each of its pixels is taught.
pub(crate) struct TaughtLevel {
    pub image_index: usize,
    pub level_index: usize,
    pub image: GrayImage,
    pub class: Vec<u8>,
}

/// Every pyramid level (as `detect` makes them with `o`) of every labelled image, each pixel's
/// class as [`classes`] says (`region_share` of each crater's diameter taught as crater).
pub(crate) fn taught_levels(
    images: &[Labelled],
    o: &DetectOptions,
    region_share: f64,
) -> Result<Vec<TaughtLevel>> {
    ensure!(
        !images.is_empty(),
        Error::Invalid("fitting a detector needs labelled images".into())
    );
    ensure!(
        region_share > 0.0 && region_share <= 1.0,
        Error::Invalid(format!(
            "the share of a crater taught as crater must lie in (0, 1], not {region_share}"
        ))
    );
    let mut levels = Vec::new();
    for (i, l) in images.iter().enumerate() {
        let side = l.image.width.min(l.image.height);
        ensure!(
            side >= 16,
            Error::Invalid(format!(
                "image {} of the fit is {}x{} pixels; the detector needs at least 16 per side",
                i + 1,
                l.image.width,
                l.image.height
            ))
        );
        let scales = o.scales(side);
        // a no-data margin filled as `detect` fills it, and taught nothing
        let (whole, margin) = l.image.margin_filled();
        for (k, &scale) in scales.iter().enumerate() {
            let image = whole.scaled(scale);
            let mut class = classes(
                &l.craters,
                scale,
                o.level_range(k, scales.len()),
                region_share,
                image.width,
                image.height,
            );
            if let Some(m) = margin.as_deref() {
                // where a level pixel's centre falls in the image
                let source = |i: usize| (i as f64 + 0.5) / scale - 0.5;
                for y in 0..image.height {
                    for x in 0..image.width {
                        if in_margin(Some(m), &l.image, source(x), source(y)) {
                            class[y * image.width + x] = IGNORED;
                        }
                    }
                }
            }
            levels.push(TaughtLevel {
                image_index: i,
                level_index: k,
                image,
                class,
            });
        }
    }
    Ok(levels)
}

/// A deterministic draw in `[0, 1)` for sample `i` of level `level` of image `image`.
pub(crate) fn draw(image: usize, level: usize, i: usize) -> f64 {
    let mut z = (image as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((level as u64) << 40)
        .wrapping_add(i as u64);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The samples the head is fitted on: features row by row, their targets and weights.
struct Samples {
    channels: usize,
    features: Vec<f32>,
    targets: Vec<f32>,
    weights: Vec<f32>,
}

/// The fitted head for the detector `config` with `weights` over `images` (pyramid and
/// tiles as `detect` makes them with `o`); `progress` is told of each tile done.
pub fn fit_head(
    config: &DetectorConfig,
    weights: &BTreeMap<String, Tensor>,
    images: &[Labelled],
    o: &DetectOptions,
    fit: &FitOptions,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<Head> {
    o.check()?;
    ensure!(
        fit.hidden > 0 && fit.steps > 0,
        Error::Invalid("a fitted head needs hidden units and at least one step".into())
    );
    let body = features_graph(&config.graph, config.tile)?;
    let channels = body.layer_shapes(config.tile, config.tile)?[body.layers.len() - 1][2];
    let net = Net::new(body, |n| weights.get(n).cloned())?;
    let pixels: usize = images
        .iter()
        .map(|l| {
            let side = l.image.width.min(l.image.height);
            o.scales(side)
                .iter()
                .map(|s| {
                    ((l.image.width as f64 * s).round() * (l.image.height as f64 * s).round())
                        as usize
                })
                .sum::<usize>()
        })
        .sum();
    let share = fit
        .background_share
        .min(fit.max_samples as f64 / pixels.max(1) as f64);
    ensure!(
        share > 0.0 && share <= 1.0,
        Error::Invalid(format!(
            "the share of background pixels must lie in (0, 1], not {share}"
        ))
    );
    let mut samples = Samples {
        channels,
        features: Vec::new(),
        targets: Vec::new(),
        weights: Vec::new(),
    };
    for TaughtLevel {
        image_index: i,
        level_index: k,
        image: level,
        class,
    } in taught_levels(images, o, fit.region_share)?
    {
        // the bands `detect` runs (halo included, so a bar counts the same tiles);
        // each pixel sampled from the band whose core holds it
        let period = config.tile_step();
        for b in 0..level.height.div_ceil(o.band_rows) {
            let (r0, r1) = band_rows(b, o.band_rows, level.height, halo(o), period);
            let core = (b * o.band_rows, ((b + 1) * o.band_rows).min(level.height));
            let map = net_map(
                &net, config, &level, r0, r1, o.max_tile, channels, false, progress,
            )?;
            let core_map = &map[(core.0 - r0) * level.width * channels..]
                [..(core.1 - core.0) * level.width * channels];
            for (p, f) in core_map.chunks_exact(channels).enumerate() {
                let at = core.0 * level.width + p;
                let (target, weight) = match class[at] {
                    CRATER => (1.0, 1.0),
                    IGNORED => continue,
                    _ if draw(i, k, at) < share => (0.0, (1.0 / share) as f32),
                    _ => continue,
                };
                samples.features.extend_from_slice(f);
                samples.targets.push(target);
                samples.weights.push(weight);
            }
        }
    }
    let crater_pixels = samples.targets.iter().filter(|&&t| t > 0.5).count();
    ensure!(
        crater_pixels > 0 && crater_pixels < samples.targets.len(),
        Error::Invalid(
            "the labelled craters cover no pixel a pyramid level reports (or every one): \
             nothing to fit"
                .into()
        )
    );
    tracing::info!(
        samples = samples.targets.len(),
        crater_pixels,
        background_share = share,
        "fitting the detector's head"
    );
    let (hidden, (weights, bias)) = mlp(&samples, fit.hidden, fit.steps);
    Ok(Head {
        hidden,
        weights,
        bias,
        samples: samples.targets.len(),
        crater_pixels,
    })
}

/// Standardisation of the samples' features: each channel's weighted mean and the inverse
/// of its standard deviation (0 for a channel that never varies: it keeps weight 0).
fn standardisation(s: &Samples) -> (Vec<f64>, Vec<f64>) {
    let c = s.channels;
    let total: f64 = s.weights.iter().map(|&w| w as f64).sum();
    let mut mean = vec![0f64; c];
    let mut var = vec![0f64; c];
    for (f, &w) in s.features.chunks_exact(c).zip(&s.weights) {
        for j in 0..c {
            mean[j] += w as f64 * f[j] as f64;
        }
    }
    mean.iter_mut().for_each(|m| *m /= total);
    for (f, &w) in s.features.chunks_exact(c).zip(&s.weights) {
        for j in 0..c {
            var[j] += w as f64 * (f[j] as f64 - mean[j]).powi(2);
        }
    }
    let scale = var
        .iter()
        .map(|v| {
            let sd = (v / total).sqrt();
            if sd > 1e-9 {
                1.0 / sd
            } else {
                0.0
            }
        })
        .collect();
    (mean, scale)
}

/// Samples per step of the head with hidden units.
const BATCH: usize = 4096;

/// A head with `units` hidden ReLU units fitted by Adam on the weighted cross-entropy,
/// `steps` batches taken in turn from the samples in a fixed shuffled order; the hidden layer's
/// `[channels, units]` weights and biases and the output's, in the features' own units.
#[allow(clippy::type_complexity)]
fn mlp(s: &Samples, units: usize, steps: usize) -> ((Vec<f32>, Vec<f32>), (Vec<f32>, f32)) {
    let c = s.channels;
    let (mean, scale) = standardisation(s);
    let (mean32, scale32): (Vec<f32>, Vec<f32>) = (
        mean.iter().map(|&m| m as f32).collect(),
        scale.iter().map(|&v| v as f32).collect(),
    );
    let n = s.targets.len();
    let total: f64 = s.weights.iter().map(|&w| w as f64).sum();
    let prior = s
        .targets
        .iter()
        .zip(&s.weights)
        .map(|(&t, &w)| (t * w) as f64)
        .sum::<f64>()
        / total;
    // parameters: hidden weights [c, units], hidden biases, output weights, output bias
    let gauss = |i: usize| {
        let (u, v) = (draw(7, 1, i).max(1e-12), draw(7, 2, i));
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    };
    let len = c * units + units + units + 1;
    let mut p = vec![0f32; len];
    let he = (2.0 / c as f32).sqrt();
    for (i, w) in p[..c * units].iter_mut().enumerate() {
        *w = he * gauss(i);
    }
    let out_w = c * units + units;
    for (i, w) in p[out_w..out_w + units].iter_mut().enumerate() {
        *w = (1.0 / units as f32).sqrt() * gauss(len + i);
    }
    p[len - 1] = (prior / (1.0 - prior)).ln() as f32;
    let (mut m1, mut m2) = (vec![0f32; len], vec![0f32; len]);
    let (lr, b1, b2, eps) = (1e-3f32, 0.9f32, 0.999f32, 1e-8f32);
    let mut order: Vec<usize> = (0..n).collect();
    // a fixed shuffle (Fisher-Yates on the deterministic draws)
    for i in (1..n).rev() {
        let j = (draw(9, 0, i) * (i + 1) as f64) as usize;
        order.swap(i, j.min(i));
    }
    let batches: Vec<&[usize]> = order.chunks(BATCH).collect();
    for t in 1..=steps as i32 {
        let batch = batches[(t as usize - 1) % batches.len()];
        let grad = batch
            .par_chunks(BATCH.div_ceil(rayon::current_num_threads().max(1)).max(1))
            .map(|part| {
                let mut g = vec![0f32; len];
                let (mut x, mut a) = (vec![0f32; c], vec![0f32; units]);
                for &i in part {
                    let row = &s.features[i * c..(i + 1) * c];
                    for j in 0..c {
                        x[j] = (row[j] - mean32[j]) * scale32[j];
                    }
                    a.copy_from_slice(&p[c * units..c * units + units]);
                    for (j, &xj) in x.iter().enumerate() {
                        let w = &p[j * units..(j + 1) * units];
                        a.iter_mut().zip(w).for_each(|(a, w)| *a += xj * w);
                    }
                    let mut z = p[len - 1];
                    for (k, &ak) in a.iter().enumerate() {
                        z += ak.max(0.0) * p[out_w + k];
                    }
                    let prob = 1.0 / (1.0 + (-z).exp());
                    let dz = s.weights[i] * (prob - s.targets[i]);
                    g[len - 1] += dz;
                    for k in 0..units {
                        if a[k] > 0.0 {
                            g[out_w + k] += dz * a[k];
                            a[k] = dz * p[out_w + k];
                        } else {
                            a[k] = 0.0;
                        }
                    }
                    for (k, &dk) in a.iter().enumerate() {
                        g[c * units + k] += dk;
                    }
                    for (j, &xj) in x.iter().enumerate() {
                        let gw = &mut g[j * units..(j + 1) * units];
                        gw.iter_mut().zip(&a).for_each(|(g, d)| *g += xj * d);
                    }
                }
                g
            })
            .reduce(
                || vec![0f32; len],
                |mut a, b| {
                    a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
                    a
                },
            );
        let weight: f32 = batch.iter().map(|&i| s.weights[i]).sum();
        let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        for k in 0..len {
            let g = grad[k] / weight;
            m1[k] = b1 * m1[k] + (1.0 - b1) * g;
            m2[k] = b2 * m2[k] + (1.0 - b2) * g * g;
            p[k] -= lr * (m1[k] / c1) / ((m2[k] / c2).sqrt() + eps);
        }
    }
    // fold the standardisation into the hidden layer
    let mut w1 = vec![0f32; c * units];
    let mut bias1: Vec<f32> = p[c * units..c * units + units].to_vec();
    for j in 0..c {
        for k in 0..units {
            let w = p[j * units + k] * scale32[j];
            w1[j * units + k] = w;
            bias1[k] -= w * mean32[j];
        }
    }
    ((w1, bias1), (p[out_w..out_w + units].to_vec(), p[len - 1]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pixels_are_taught_what_their_level_reports() {
        // a 10 px crater and a 40 px one on a level reporting 7-14 px, at scale 1
        let craters = [[20.0, 20.0, 10.0], [70.0, 60.0, 40.0]];
        let class = classes(&craters, 1.0, (7.0, 14.0), 1.0, 100, 100);
        assert_eq!(class[20 * 100 + 20], CRATER);
        assert_eq!(class[20 * 100 + 26], BACKGROUND);
        // larger craters are background: the level must not report them
        assert_eq!(class[60 * 100 + 70], BACKGROUND);
        // at half scale the 40 px crater (20 px) is still larger, at a quarter (10 px) it
        // is a crater and the 10 px one (2.5 px) is left to the level above
        let class = classes(&craters, 0.25, (7.0, 14.0), 1.0, 25, 25);
        assert_eq!(class[15 * 25 + 17], CRATER);
        assert_eq!(class[5 * 25 + 5], IGNORED);
        // near the range's top, ignored either way
        let class = classes(&[[20.0, 20.0, 15.0]], 1.0, (7.0, 14.0), 1.0, 50, 50);
        assert_eq!(class[20 * 50 + 20], IGNORED);
    }

    #[test]
    fn a_no_data_margin_is_filled_and_taught_nothing_on_every_level() {
        // a 120 px image whose left 30 columns are black (no data), a crater in the data
        let mut image = crate::testing::discs(120, 120, &[(70.0, 60.0, 10.0)]);
        for y in 0..120 {
            image.pixels[y * 120..y * 120 + 30].fill(0);
        }
        let labelled = Labelled {
            image,
            craters: vec![[70.0, 60.0, 10.0], [10.0, 60.0, 10.0]],
        };
        let o = DetectOptions::default();
        let levels = taught_levels(&[labelled], &o, 1.0).unwrap();
        assert_eq!(levels.len(), o.scales(120).len());
        for level in &levels {
            let scale = level.image.width as f64 / 120.0;
            for y in 0..level.image.height {
                for x in 0..level.image.width {
                    let (i, source_x) = (y * level.image.width + x, (x as f64 + 0.5) / scale);
                    // filled from the data's dark ground, nothing of it black
                    assert!(level.image.pixels[i] >= 10, "{scale}: ({x}, {y})");
                    if source_x < 29.0 {
                        assert_eq!(level.class[i], IGNORED, "{scale}: ({x}, {y})");
                    }
                }
            }
        }
        // the crater in the data is still taught on the first level
        assert_eq!(levels[0].class[60 * 120 + 70], CRATER);
    }

    #[test]
    fn the_hidden_layer_learns_what_no_line_separates() {
        // crater where exactly one of two channels is high (xor); a third channel never varies
        let n = 20_000;
        let mut s = Samples {
            channels: 3,
            features: Vec::new(),
            targets: Vec::new(),
            weights: Vec::new(),
        };
        for i in 0..n {
            let (a, b) = (draw(1, 0, i) as f32, draw(2, 0, i) as f32);
            s.features.extend([a, b, 3.0]);
            s.targets
                .push(if (a > 0.5) != (b > 0.5) { 1.0 } else { 0.0 });
            s.weights.push(1.0);
        }
        let ((w1, b1), (w2, b2)) = mlp(&s, 16, 3000);
        let units = b1.len();
        let predict = |x: [f32; 3]| {
            let mut z = b2;
            for k in 0..units {
                let a: f32 = b1[k] + (0..3).map(|j| x[j] * w1[j * units + k]).sum::<f32>();
                z += a.max(0.0) * w2[k];
            }
            z > 0.0
        };
        let right = (0..2000)
            .filter(|&i| {
                let (a, b) = (draw(3, 0, i) as f32, draw(4, 0, i) as f32);
                // away from the boundaries, where the answer is plain
                (a - 0.5).abs() < 0.05 || (b - 0.5).abs() < 0.05 || {
                    predict([a, b, 3.0]) == ((a > 0.5) != (b > 0.5))
                }
            })
            .count();
        assert!(right >= 1960, "{right} of 2000");
    }
}
