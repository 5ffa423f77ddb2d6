//! ONNX detectors as a [`Graph`] and its tensors: any fully convolutional model of the
//! layers craterdex runs (Conv, ConvTranspose, MaxPool, Concat over channels, Slice over
//! rows and columns for cropping, Relu and Sigmoid after a convolution, Identity), NCHW as
//! ONNX has it, one image channel in, one likelihood channel out.

use crate::error::{Error, Result};
use crate::graph::{Activation, Graph, Layer, Op, Padding};
use crate::net::Tensor;
use crate::store::ImportedDetector;
use craterdex_errors::{ensure, OrInvalid};
use craterdex_model::onnx::{NodeProto, OnnxGraph};
use std::collections::{BTreeMap, HashMap};

fn ints(node: &NodeProto, name: &str) -> Option<Vec<i64>> {
    node.attribute(name).map(|a| a.ints.clone())
}

fn pair(node: &NodeProto, name: &str, default: [usize; 2]) -> Result<[usize; 2]> {
    match ints(node, name).as_deref() {
        None | Some([]) => Ok(default),
        Some([a, b]) if *a > 0 && *b > 0 => Ok([*a as usize, *b as usize]),
        Some(v) => Err(Error::Unsupported(format!(
            "node {}: {name} {v:?} (2-D, positive)",
            node.name
        ))),
    }
}

fn unsupported(node: &NodeProto, what: &str) -> Error {
    Error::Unsupported(format!("node {} ({}): {what}", node.name, node.op_type))
}

/// Reads the detector in an ONNX file's bytes; `what` names the file in messages.
pub fn read_onnx(bytes: &[u8], what: &str) -> Result<ImportedDetector> {
    let g = OnnxGraph::decode(bytes).map_err(|e| Error::Invalid(format!("{what}: {e}")))?;
    convert(&g).map_err(|e| craterdex_errors::Prefix::prefixed(e, what))
}

fn convert(g: &OnnxGraph) -> Result<ImportedDetector> {
    let input = g
        .inputs
        .iter()
        .find(|i| !g.initializers.contains_key(&i.name) && !g.integers.contains_key(&i.name))
        .or_invalid("the graph has no image input")?;
    let dims = input.dims();
    let channels = dims.get(1).copied().flatten().filter(|_| dims.len() == 4);
    let channels = channels
        .or_invalid_with(|| format!("input {} is not NCHW with known channels", input.name))?;
    let tile = match (dims[2], dims[3]) {
        (Some(h), Some(w)) if h == w => Some(h),
        _ => None,
    };
    let mut layers = vec![Layer {
        name: input.name.clone(),
        op: Op::Input { channels },
        inputs: vec![],
    }];
    let mut weights: BTreeMap<String, Tensor> = BTreeMap::new();
    // tensor name -> the layer that makes it
    let mut made: HashMap<String, usize> = HashMap::from([(input.name.clone(), 0)]);
    let mut readers: HashMap<&str, usize> = HashMap::new();
    for n in &g.nodes {
        for i in &n.input {
            *readers.entry(i.as_str()).or_default() += 1;
        }
    }
    let layer_of = |made: &HashMap<String, usize>, n: &NodeProto, k: usize| -> Result<usize> {
        let name = n
            .input
            .get(k)
            .or_invalid_with(|| format!("node {} lacks input {k}", n.name))?;
        made.get(name)
            .copied()
            .or_invalid_with(|| {
                format!("node {}: input {name} is made by no supported node", n.name)
            })
            .map_err(Error::from)
    };
    for n in &g.nodes {
        let out = n
            .output
            .first()
            .or_invalid_with(|| format!("node {} has no output", n.name))?
            .clone();
        let name = if n.name.is_empty() {
            out.clone()
        } else {
            n.name.clone()
        };
        let op = match n.op_type.as_str() {
            "Identity" => {
                let from = layer_of(&made, n, 0)?;
                made.insert(out, from);
                continue;
            }
            "Relu" | "Sigmoid" => {
                let from = layer_of(&made, n, 0)?;
                let fused = match &mut layers[from].op {
                    Op::Conv { activation, .. } | Op::ConvTranspose { activation, .. }
                        if *activation == Activation::Linear
                            && readers.get(n.input[0].as_str()) == Some(&1) =>
                    {
                        *activation = if n.op_type == "Relu" {
                            Activation::Relu
                        } else {
                            Activation::Sigmoid
                        };
                        true
                    }
                    _ => false,
                };
                ensure!(
                    fused,
                    unsupported(
                        n,
                        "only directly after a convolution that nothing else reads"
                    )
                );
                made.insert(out, from);
                continue;
            }
            "Conv" | "ConvTranspose" => {
                let w_name = n
                    .input
                    .get(1)
                    .or_invalid_with(|| format!("node {} has no weight", n.name))?;
                let w = g.initializers.get(w_name).or_invalid_with(|| {
                    format!("node {}: weight {w_name} is not a constant", n.name)
                })?;
                ensure!(w.dims.len() == 4, unsupported(n, "only 2-D convolutions"));
                ensure!(
                    n.attribute("group").is_none_or(|a| a.i == 1)
                        && ints(n, "dilations").is_none_or(|d| d.iter().all(|&x| x == 1)),
                    unsupported(n, "grouped or dilated convolutions")
                );
                let transpose = n.op_type == "ConvTranspose";
                // Conv: [out, in, kh, kw]; ConvTranspose: [in, out, kh, kw]
                let (o, i) = if transpose {
                    (w.dims[1], w.dims[0])
                } else {
                    (w.dims[0], w.dims[1])
                };
                let (kh, kw) = (w.dims[2], w.dims[3]);
                let kernel = pair(n, "kernel_shape", [kh, kw])?;
                ensure!(
                    kernel == [kh, kw],
                    unsupported(n, "kernel_shape differs from the weight's")
                );
                let stride = pair(n, "strides", [1, 1])?;
                let pads = ints(n, "pads").unwrap_or_default();
                let auto = n
                    .attribute("auto_pad")
                    .map(|a| String::from_utf8_lossy(&a.s).into_owned())
                    .unwrap_or_default();
                let zero_pads = pads.iter().all(|&p| p == 0);
                let bias = match n.input.get(2).filter(|b| !b.is_empty()) {
                    Some(b) => g
                        .initializers
                        .get(b)
                        .or_invalid_with(|| format!("node {}: bias {b} is not a constant", n.name))?
                        .data
                        .clone(),
                    None => vec![0.0; o],
                };
                ensure!(
                    bias.len() == o,
                    Error::Invalid(format!(
                        "node {}: {} biases for {o} outputs",
                        n.name,
                        bias.len()
                    ))
                );
                // Keras' order, which the net takes: [kh, kw, in, out]; transposed [kh, kw, out, in]
                let mut k = vec![0f32; w.data.len()];
                for a in 0..w.dims[0] {
                    for b in 0..w.dims[1] {
                        for y in 0..kh {
                            for x in 0..kw {
                                let v = w.data[((a * w.dims[1] + b) * kh + y) * kw + x];
                                k[((y * kw + x) * w.dims[1] + b) * w.dims[0] + a] = v;
                            }
                        }
                    }
                }
                let shape = if transpose {
                    vec![kh, kw, o, i]
                } else {
                    vec![kh, kw, i, o]
                };
                weights.insert(format!("{name}/kernel"), (shape, k));
                weights.insert(format!("{name}/bias"), (vec![o], bias));
                if transpose {
                    ensure!(
                        zero_pads
                            && ints(n, "output_padding").is_none_or(|p| p.iter().all(|&x| x == 0))
                            && (auto.is_empty() || auto == "NOTSET" || auto == "VALID"),
                        unsupported(n, "padded transposed convolutions")
                    );
                    Op::ConvTranspose {
                        filters: o,
                        kernel,
                        stride,
                        activation: Activation::Linear,
                    }
                } else {
                    let same_pads = stride == [1, 1]
                        && kh % 2 == 1
                        && kw % 2 == 1
                        && pads
                            == [
                                (kh / 2) as i64,
                                (kw / 2) as i64,
                                (kh / 2) as i64,
                                (kw / 2) as i64,
                            ];
                    let padding = if (zero_pads && (auto.is_empty() || auto == "NOTSET"))
                        || auto == "VALID"
                    {
                        Padding::Valid
                    } else if same_pads || auto.starts_with("SAME") {
                        Padding::Same
                    } else {
                        return Err(unsupported(n, &format!("pads {pads:?}")));
                    };
                    Op::Conv {
                        filters: o,
                        kernel,
                        stride,
                        padding,
                        activation: Activation::Linear,
                    }
                }
            }
            "MaxPool" => {
                ensure!(
                    ints(n, "pads").is_none_or(|p| p.iter().all(|&x| x == 0)),
                    unsupported(n, "padded pooling")
                );
                let size = pair(n, "kernel_shape", [0, 0])?;
                Op::MaxPool {
                    size,
                    stride: pair(n, "strides", [1, 1])?,
                }
            }
            "Concat" => {
                let axis = n.attribute("axis").map_or(1, |a| a.i);
                ensure!(
                    axis == 1 || axis == -3,
                    unsupported(n, "concatenation other than over channels")
                );
                Op::Concat
            }
            "Slice" => {
                let from = layer_of(&made, n, 0)?;
                let constant = |k: usize| -> Option<&Vec<i64>> {
                    n.input.get(k).and_then(|i| g.integers.get(i))
                };
                let (starts, ends) = constant(1)
                    .zip(constant(2))
                    .ok_or_else(|| unsupported(n, "bounds that are not constants"))?;
                let axes = constant(3)
                    .cloned()
                    .unwrap_or_else(|| (0..starts.len() as i64).collect());
                ensure!(
                    constant(4).is_none_or(|s| s.iter().all(|&x| x == 1)),
                    unsupported(n, "steps other than 1")
                );
                // sizes of the map sliced, where the bounds count from its start
                let shape = tile.and_then(|t| {
                    let partial = Graph {
                        layers: layers[..=from].to_vec(),
                    };
                    partial.layer_shapes(t, t).ok().map(|s| s[from])
                });
                let mut edges = [0usize; 4];
                for ((&axis, &start), &end) in axes.iter().zip(starts).zip(ends) {
                    let axis = if axis < 0 { axis + 4 } else { axis };
                    ensure!(
                        axis == 2 || axis == 3,
                        unsupported(n, "slices of other than rows and columns")
                    );
                    let a = (axis - 2) as usize;
                    ensure!(start >= 0, unsupported(n, "negative starts"));
                    edges[a * 2] = start as usize;
                    edges[a * 2 + 1] = if end < 0 {
                        (-end) as usize
                    } else if end >= i32::MAX as i64 {
                        0
                    } else {
                        let size = shape.or_invalid_with(|| {
                            format!(
                                "node {}: a slice to {end} needs the input's fixed size",
                                n.name
                            )
                        })?[a];
                        size.checked_sub(end as usize).or_invalid_with(|| {
                            format!("node {}: slice end {end} past the map", n.name)
                        })?
                    };
                }
                Op::Crop { edges }
            }
            other => return Err(unsupported(n, &format!("op {other} is not supported"))),
        };
        let inputs = match op {
            Op::Concat => (0..n.input.len())
                .map(|k| layer_of(&made, n, k))
                .collect::<Result<Vec<_>>>()?,
            _ => vec![layer_of(&made, n, 0)?],
        };
        made.insert(out, layers.len());
        layers.push(Layer { name, op, inputs });
    }
    let output = g.outputs.first().or_invalid("the graph has no output")?;
    let last = made
        .get(&output.name)
        .copied()
        .or_invalid_with(|| format!("output {} is made by no supported node", output.name))?;
    ensure!(
        last + 1 == layers.len(),
        Error::Unsupported(format!("output {} is not the last layer's", output.name))
    );
    Ok(ImportedDetector {
        graph: Graph { layers },
        weights,
        tile,
    })
}
