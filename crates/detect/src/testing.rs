//! A detector whose answer is known, for the tests of this and other crates: one 3x3
//! convolution that marks pixels brighter than mid-grey, so bright discs drawn on a dark
//! image are its craters.

use crate::graph::{Activation, Graph, Layer, Op, Padding};
use crate::net::{Net, Tensor};
use crate::store::{DetectorConfig, FORMAT};
use std::collections::BTreeMap;

/// The detector's config (tiles of `tile` pixels) and weights.
pub fn brightness_detector(tile: usize) -> (DetectorConfig, BTreeMap<String, Tensor>) {
    let graph = Graph {
        layers: vec![
            Layer {
                name: "in".into(),
                op: Op::Input { channels: 1 },
                inputs: vec![],
            },
            Layer {
                name: "mark".into(),
                op: Op::Conv {
                    filters: 1,
                    kernel: [3, 3],
                    stride: [1, 1],
                    padding: Padding::Valid,
                    activation: Activation::Sigmoid,
                },
                inputs: vec![0],
            },
        ],
    };
    let mut kernel = vec![0f32; 9];
    kernel[4] = 40.0;
    let weights = [
        ("mark/kernel".to_string(), (vec![3, 3, 1, 1], kernel)),
        ("mark/bias".to_string(), (vec![1], vec![-20.0])),
    ]
    .into_iter()
    .collect();
    let config = DetectorConfig {
        format: FORMAT.into(),
        name: "brightness".into(),
        source: "generated".into(),
        licence: "MIT".into(),
        tile,
        input_scale: 1.0 / 255.0,
        graph,
        region_share: 1.0,
        diameter_scale: 1.0,
        diameter_scale_per_octave: 1.0,
        weights_sha256: String::new(),
    };
    (config, weights)
}

/// [`brightness_detector`] ready to run.
pub fn brightness_net(tile: usize) -> (DetectorConfig, Net) {
    let (config, weights) = brightness_detector(tile);
    let net = Net::new(config.graph.clone(), |n| weights.get(n).cloned())
        .expect("the generated weights fit the graph");
    (config, net)
}

/// A dark `width x height` image with bright discs `(x, y, diameter)`.
pub fn discs(width: usize, height: usize, discs: &[(f64, f64, f64)]) -> crate::GrayImage {
    let mut pixels = vec![20u8; width * height];
    for &(cx, cy, d) in discs {
        for y in 0..height {
            for x in 0..width {
                if (x as f64 - cx).hypot(y as f64 - cy) <= d / 2.0 {
                    pixels[y * width + x] = 230;
                }
            }
        }
    }
    crate::GrayImage {
        width,
        height,
        pixels,
    }
}

/// Sixteen discs of 8-13 px on a jittered 4 x 4 grid of a 160 px image, the jitter and the
/// sizes set by `seed`: scenes to fit a head on and to score it on.
pub fn disc_grid(seed: usize) -> Vec<(f64, f64, f64)> {
    (0..16)
        .map(|i| {
            let jitter = ((i * 7 + seed * 3) % 5) as f64 - 2.0;
            (
                24.0 + 36.0 * (i % 4) as f64 + jitter,
                24.0 + 36.0 * (i / 4) as f64 - jitter,
                8.0 + ((i + seed) % 6) as f64,
            )
        })
        .collect()
}

pub(crate) fn layer(name: &str, op: Op, inputs: &[usize]) -> Layer {
    Layer {
        name: name.into(),
        op,
        inputs: inputs.to_vec(),
    }
}

/// A valid 3x3 convolution of `filters` outputs with a ReLU.
pub(crate) fn relu_conv3(filters: usize) -> Op {
    Op::Conv {
        filters,
        kernel: [3, 3],
        stride: [1, 1],
        padding: Padding::Valid,
        activation: Activation::Relu,
    }
}

/// A small U-Net of every layer kind (valid 3x3 convolutions, pooling, a transposed
/// convolution, a crop, a concatenation, a 1x1 sigmoid head): its 20 px input gives 14 px.
pub fn small_unet() -> Graph {
    let conv = relu_conv3;
    Graph {
        layers: vec![
            layer("in", Op::Input { channels: 1 }, &[]),
            layer("c1", conv(4), &[0]),
            layer(
                "p",
                Op::MaxPool {
                    size: [2, 2],
                    stride: [2, 2],
                },
                &[1],
            ),
            layer("c2", conv(8), &[2]),
            layer(
                "up",
                Op::ConvTranspose {
                    filters: 4,
                    kernel: [2, 2],
                    stride: [2, 2],
                    activation: Activation::Linear,
                },
                &[3],
            ),
            layer(
                "crop",
                Op::Crop {
                    edges: [2, 2, 2, 2],
                },
                &[1],
            ),
            layer("cat", Op::Concat, &[5, 4]),
            layer(
                "out",
                Op::Conv {
                    filters: 1,
                    kernel: [1, 1],
                    stride: [1, 1],
                    padding: Padding::Valid,
                    activation: Activation::Sigmoid,
                },
                &[6],
            ),
        ],
    }
}

/// [`small_unet`] with fixed pseudo-random weights as a detector of 20 px tiles: features
/// of no particular meaning for a fitted head to read.
pub fn small_unet_detector() -> (DetectorConfig, BTreeMap<String, Tensor>) {
    let values = |n: usize, seed: u64| -> Vec<f32> {
        (0..n as u64)
            .map(|i| {
                let z =
                    (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed.wrapping_mul(0xBF58_476D);
                ((z >> 40) % 1000) as f32 / 1000.0 - 0.5
            })
            .collect()
    };
    let shapes: [(&str, Vec<usize>); 4] = [
        ("c1", vec![3, 3, 1, 4]),
        ("c2", vec![3, 3, 4, 8]),
        ("up", vec![2, 2, 4, 8]),
        ("out", vec![1, 1, 8, 1]),
    ];
    let mut weights = BTreeMap::new();
    for (k, (name, shape)) in shapes.into_iter().enumerate() {
        let filters = if name == "up" { shape[2] } else { shape[3] };
        let n = shape.iter().product();
        weights.insert(
            format!("{name}/kernel"),
            (shape, values(n, 2 * k as u64 + 1)),
        );
        weights.insert(
            format!("{name}/bias"),
            (vec![filters], values(filters, 2 * k as u64 + 2)),
        );
    }
    let config = DetectorConfig {
        format: FORMAT.into(),
        name: "small-unet".into(),
        source: "generated".into(),
        licence: "MIT".into(),
        tile: 20,
        input_scale: 1.0 / 255.0,
        graph: small_unet(),
        region_share: 1.0,
        diameter_scale: 1.0,
        diameter_scale_per_octave: 1.0,
        weights_sha256: String::new(),
    };
    (config, weights)
}
