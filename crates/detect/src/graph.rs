//! A detector as a graph of plain layers in topological order: what a Keras or ONNX
//! convolutional detector becomes on import, and what the detector directory stores.

use crate::error::{Error, Result};
use craterdex_errors::ensure;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Padding {
    /// No padding: the output shrinks by the kernel less one.
    Valid,
    /// Zeros around the input so that the output keeps the input's size (stride 1).
    Same,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    Linear,
    Relu,
    Sigmoid,
}

impl Activation {
    pub fn apply(self, v: &mut [f32]) {
        match self {
            Activation::Linear => {}
            Activation::Relu => v.iter_mut().for_each(|x| *x = x.max(0.0)),
            Activation::Sigmoid => v.iter_mut().for_each(|x| *x = 1.0 / (1.0 + (-*x).exp())),
        }
    }
}

/// One layer's operation. Maps are height x width x channels (channels last, as Keras).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// The image: `channels` planes, values as the detector was trained on (pycda: pixel/255).
    Input { channels: usize },
    /// 2-D convolution; weights `{name}/kernel` `[kh, kw, in, filters]` and `{name}/bias`.
    Conv {
        filters: usize,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: Padding,
        activation: Activation,
    },
    /// Transposed convolution without padding; weights `{name}/kernel` `[kh, kw, filters,
    /// in]` (Keras' order) and `{name}/bias`.
    ConvTranspose {
        filters: usize,
        kernel: [usize; 2],
        stride: [usize; 2],
        activation: Activation,
    },
    /// Maximum over windows, without padding (the output rounds down).
    MaxPool {
        size: [usize; 2],
        stride: [usize; 2],
    },
    /// Drops rows and columns at the edges: `[top, bottom, left, right]`.
    Crop { edges: [usize; 4] },
    /// Channels of the inputs side by side, in the order of `inputs`.
    Concat,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Layer {
    pub name: String,
    #[serde(flatten)]
    pub op: Op,
    /// Indices of earlier layers.
    #[serde(default)]
    pub inputs: Vec<usize>,
}

/// Layers in topological order: the first is the only input, the last is the output (one
/// channel of crater likelihood per pixel).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    pub layers: Vec<Layer>,
}

/// A map's height, width and channels.
pub type Shape = [usize; 3];

impl Graph {
    /// The shape of every layer's output for an input of `height x width`; fails, naming
    /// the layer, where the shapes do not fit (a crop larger than its map, concatenated maps
    /// of different sizes, a map too small for a kernel).
    pub fn shapes(&self, height: usize, width: usize) -> Result<Vec<Shape>> {
        let shapes = self.layer_shapes(height, width)?;
        ensure!(
            shapes.last().is_some_and(|s| s[2] == 1),
            Error::Invalid("a detector's last layer must give one channel".into())
        );
        Ok(shapes)
    }

    /// [`Graph::shapes`] of a graph that need not end in the likelihood (one being built).
    pub fn layer_shapes(&self, height: usize, width: usize) -> Result<Vec<Shape>> {
        let mut shapes: Vec<Shape> = Vec::with_capacity(self.layers.len());
        for (i, layer) in self.layers.iter().enumerate() {
            ensure!(
                layer.inputs.iter().all(|&j| j < i),
                Error::Invalid(format!("layer {}: an input comes later", layer.name))
            );
            let ins: Vec<Shape> = layer.inputs.iter().map(|&j| shapes[j]).collect();
            let one = || -> Result<Shape> {
                match ins.as_slice() {
                    [s] => Ok(*s),
                    _ => Err(Error::Invalid(format!(
                        "layer {} takes one input, has {}",
                        layer.name,
                        ins.len()
                    ))),
                }
            };
            let too_small = || {
                Error::Invalid(format!(
                    "layer {}: a {height}x{width} input is too small for this detector",
                    layer.name
                ))
            };
            let shape = match &layer.op {
                Op::Input { channels } => {
                    ensure!(
                        i == 0 && ins.is_empty(),
                        Error::Invalid(format!("layer {}: the input must come first", layer.name))
                    );
                    [height, width, *channels]
                }
                Op::Conv {
                    filters,
                    kernel,
                    stride,
                    padding,
                    ..
                } => {
                    let [h, w, _] = one()?;
                    ensure!(
                        stride[0] >= 1 && stride[1] >= 1 && kernel[0] >= 1 && kernel[1] >= 1,
                        Error::Invalid(format!("layer {}: zero kernel or stride", layer.name))
                    );
                    match padding {
                        Padding::Same => [h.div_ceil(stride[0]), w.div_ceil(stride[1]), *filters],
                        Padding::Valid => {
                            ensure!(h >= kernel[0] && w >= kernel[1], too_small());
                            [
                                (h - kernel[0]) / stride[0] + 1,
                                (w - kernel[1]) / stride[1] + 1,
                                *filters,
                            ]
                        }
                    }
                }
                Op::ConvTranspose {
                    filters,
                    kernel,
                    stride,
                    ..
                } => {
                    let [h, w, _] = one()?;
                    ensure!(h >= 1 && w >= 1, too_small());
                    [
                        (h - 1) * stride[0] + kernel[0],
                        (w - 1) * stride[1] + kernel[1],
                        *filters,
                    ]
                }
                Op::MaxPool { size, stride } => {
                    let [h, w, c] = one()?;
                    ensure!(h >= size[0] && w >= size[1], too_small());
                    [
                        (h - size[0]) / stride[0] + 1,
                        (w - size[1]) / stride[1] + 1,
                        c,
                    ]
                }
                Op::Crop {
                    edges: [t, b, l, r],
                } => {
                    let [h, w, c] = one()?;
                    ensure!(h > t + b && w > l + r, too_small());
                    [h - t - b, w - l - r, c]
                }
                Op::Concat => {
                    ensure!(
                        !ins.is_empty() && ins.iter().all(|s| s[..2] == ins[0][..2]),
                        Error::Invalid(format!(
                            "layer {}: concatenated maps differ in size ({ins:?})",
                            layer.name
                        ))
                    );
                    [ins[0][0], ins[0][1], ins.iter().map(|s| s[2]).sum()]
                }
            };
            shapes.push(shape);
        }
        Ok(shapes)
    }

    /// Each layer's output channels, whatever the input's size (0 past a layer that reads a
    /// later one, which [`Graph::layer_shapes`] refuses).
    pub fn layer_channels(&self) -> Vec<usize> {
        let mut channels: Vec<usize> = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let of = |j: &usize| channels.get(*j).copied().unwrap_or(0);
            let c = match &layer.op {
                Op::Input { channels } => *channels,
                Op::Conv { filters, .. } | Op::ConvTranspose { filters, .. } => *filters,
                Op::MaxPool { .. } | Op::Crop { .. } => layer.inputs.first().map_or(0, of),
                Op::Concat => layer.inputs.iter().map(of).sum(),
            };
            channels.push(c);
        }
        channels
    }

    /// Input channels.
    pub fn channels(&self) -> usize {
        match self.layers.first().map(|l| &l.op) {
            Some(Op::Input { channels }) => *channels,
            _ => 0,
        }
    }

    /// How many layers read each layer's output.
    pub fn readers(&self) -> Vec<usize> {
        let mut readers = vec![0usize; self.layers.len()];
        for l in &self.layers {
            for &j in &l.inputs {
                readers[j] += 1;
            }
        }
        readers
    }

    /// After which layer each layer's output is no longer needed (its last reader; the
    /// output layer never).
    pub fn last_uses(&self) -> Vec<usize> {
        let mut last: Vec<usize> = (0..self.layers.len()).collect();
        for (i, l) in self.layers.iter().enumerate() {
            for &j in &l.inputs {
                last[j] = last[j].max(i);
            }
        }
        if let Some(out) = last.last_mut() {
            *out = usize::MAX;
        }
        last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_follow_the_layers_and_refuse_what_does_not_fit() {
        let g = crate::testing::small_unet();
        let s = g.shapes(20, 20).unwrap();
        assert_eq!(s[1], [18, 18, 4]);
        assert_eq!(s[2], [9, 9, 4]);
        assert_eq!(s[3], [7, 7, 8]);
        assert_eq!(s[4], [14, 14, 4]);
        assert_eq!(s[6], [14, 14, 8]);
        assert_eq!(s[7], [14, 14, 1]);
        let err = g.shapes(21, 21).unwrap_err().to_string();
        assert!(err.contains("layer cat") && err.contains("differ"), "{err}");
        let err = g.shapes(4, 4).unwrap_err().to_string();
        assert!(err.contains("too small"), "{err}");
        assert_eq!(g.last_uses()[1], 5);
        assert_eq!(g.last_uses()[7], usize::MAX);
    }

    #[test]
    fn the_graph_reads_back_from_its_json() {
        let g = crate::testing::small_unet();
        let json = serde_json::to_string(&g).unwrap();
        assert!(json.contains("\"op\":\"conv_transpose\""), "{json}");
        assert_eq!(serde_json::from_str::<Graph>(&json).unwrap(), g);
    }
}
