//! Keras HDF5 detectors (`model.save("x.h5")`, Keras 2: a functional `Model` whose
//! `model_config` attribute is JSON and whose weights sit under `/model_weights/<layer>/`)
//! as a [`Graph`] and its tensors: pycda's U-Net and models built like it.

use crate::error::{Error, Result};
use crate::graph::{Activation, Graph, Layer, Op, Padding};
use crate::store::ImportedDetector;
use craterdex_errors::{ensure, OrInvalid};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};

/// Reads the graph and weights of the Keras model in `bytes`; `what` names the file in
/// messages.
pub fn read_keras_h5(bytes: &[u8], what: &str) -> Result<ImportedDetector> {
    let unreadable = |e: hdf5_reader::error::Error| {
        Error::Invalid(format!("{what}: not a readable HDF5 file: {e}"))
    };
    let file = hdf5_reader::Hdf5File::from_bytes(bytes).map_err(unreadable)?;
    let config = file
        .root_group()
        .and_then(|g| g.attribute("model_config"))
        .and_then(|a| a.read_string())
        .map_err(|e| Error::Invalid(format!("{what}: no Keras model_config attribute ({e})")))?;
    let config: Value =
        serde_json::from_str(&config).or_invalid_with(|| format!("{what}: model_config"))?;
    let graph = graph_of(&config).map_err(|e| Error::Invalid(format!("{what}: {e}")))?;
    let mut weights = BTreeMap::new();
    for layer in &graph.layers {
        if !matches!(layer.op, Op::Conv { .. } | Op::ConvTranspose { .. }) {
            continue;
        }
        for part in ["kernel", "bias"] {
            let path = format!("/model_weights/{0}/{0}/{part}:0", layer.name);
            let array = file
                .dataset(&path)
                .and_then(|d| d.read_array::<f32>())
                .map_err(|e| Error::Invalid(format!("{what}: weight {path}: {e}")))?;
            let shape = array.shape().to_vec();
            let data = array.iter().copied().collect();
            weights.insert(format!("{}/{part}", layer.name), (shape, data));
        }
    }
    let shape = &config["config"]["layers"][0]["config"]["batch_input_shape"];
    let tile = (shape[1] == shape[2])
        .then(|| shape[1].as_u64())
        .flatten()
        .map(|t| t as usize);
    Ok(ImportedDetector {
        graph,
        weights,
        tile,
    })
}

/// `config[key]` as two whole numbers.
fn pair(config: &Value, key: &str) -> Result<[usize; 2]> {
    two(&config[key], key)
}

fn two(v: &Value, key: &str) -> Result<[usize; 2]> {
    let a = v
        .as_array()
        .filter(|a| a.len() == 2)
        .or_invalid_with(|| format!("{key} is not a pair: {v}"))?;
    let n = |x: &Value| {
        x.as_u64()
            .map(|x| x as usize)
            .or_invalid_with(|| format!("{key}: {x}"))
    };
    Ok([n(&a[0])?, n(&a[1])?])
}

fn activation(v: &Value) -> Result<Activation> {
    match v["activation"].as_str().unwrap_or("linear") {
        "linear" => Ok(Activation::Linear),
        "relu" => Ok(Activation::Relu),
        "sigmoid" => Ok(Activation::Sigmoid),
        other => Err(Error::Unsupported(format!(
            "activation {other} is not supported"
        ))),
    }
}

fn check_plain(name: &str, c: &Value) -> Result<()> {
    ensure!(
        c["data_format"].as_str().unwrap_or("channels_last") == "channels_last",
        Error::Unsupported(format!(
            "layer {name}: only channels_last models are supported"
        ))
    );
    if c.get("dilation_rate").is_some() {
        ensure!(
            pair(c, "dilation_rate")? == [1, 1],
            Error::Unsupported(format!(
                "layer {name}: dilated convolutions are not supported"
            ))
        );
    }
    ensure!(
        c["use_bias"].as_bool().unwrap_or(true),
        Error::Unsupported(format!(
            "layer {name}: convolutions without bias are not supported"
        ))
    );
    Ok(())
}

/// The layers of a Keras functional model's config, in its order (Keras writes them
/// topologically).
fn graph_of(config: &Value) -> Result<Graph> {
    let layers = config["config"]["layers"]
        .as_array()
        .or_invalid("model_config has no layers")?;
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::with_capacity(layers.len());
    for l in layers {
        let name = l["name"]
            .as_str()
            .or_invalid("a layer without a name")?
            .to_string();
        let class = l["class_name"].as_str().unwrap_or_default();
        let c = &l["config"];
        let mut inputs = Vec::new();
        // [[["conv2d_1", 0, 0, {}], ...]]: one call of the layer, its inputs by name
        if let Some(nodes) = l["inbound_nodes"].as_array() {
            ensure!(
                nodes.len() <= 1,
                Error::Unsupported(format!("layer {name} is called more than once"))
            );
            for node in nodes
                .iter()
                .flat_map(|n| n.as_array().into_iter().flatten())
            {
                let from = node[0]
                    .as_str()
                    .or_invalid_with(|| format!("layer {name}: an input without a name"))?;
                let &j = index.get(from).or_invalid_with(|| {
                    format!("layer {name}: input {from} comes later or not at all")
                })?;
                inputs.push(j);
            }
        }
        let op = match class {
            "InputLayer" => {
                let shape = c["batch_input_shape"].as_array().or_invalid("an input without a shape")?;
                let channels = shape.last().and_then(Value::as_u64).or_invalid("an input without channels")?;
                Op::Input { channels: channels as usize }
            }
            "Conv2D" => {
                check_plain(&name, c)?;
                let padding = match c["padding"].as_str().unwrap_or("valid") {
                    "valid" => Padding::Valid,
                    "same" => Padding::Same,
                    p => return Err(Error::Unsupported(format!("layer {name}: padding {p}"))),
                };
                Op::Conv {
                    filters: c["filters"].as_u64().or_invalid_with(|| format!("layer {name}: filters"))? as usize,
                    kernel: pair(c, "kernel_size")?,
                    stride: pair(c, "strides")?,
                    padding,
                    activation: activation(c)?,
                }
            }
            "Conv2DTranspose" => {
                check_plain(&name, c)?;
                ensure!(
                    c["padding"].as_str().unwrap_or("valid") == "valid"
                        && c["output_padding"].is_null(),
                    Error::Unsupported(format!("layer {name}: only unpadded transposed convolutions are supported"))
                );
                Op::ConvTranspose {
                    filters: c["filters"].as_u64().or_invalid_with(|| format!("layer {name}: filters"))? as usize,
                    kernel: pair(c, "kernel_size")?,
                    stride: pair(c, "strides")?,
                    activation: activation(c)?,
                }
            }
            "MaxPooling2D" => {
                ensure!(
                    c["padding"].as_str().unwrap_or("valid") == "valid",
                    Error::Unsupported(format!("layer {name}: only unpadded pooling is supported"))
                );
                let size = pair(c, "pool_size")?;
                let stride = if c["strides"].is_null() { size } else { pair(c, "strides")? };
                Op::MaxPool { size, stride }
            }
            "Cropping2D" => {
                let edges = match c["cropping"].as_array().map(Vec::as_slice) {
                    Some([tb, lr]) if tb.is_array() => {
                        let ([t, b], [l, r]) = (two(tb, "cropping")?, two(lr, "cropping")?);
                        [t, b, l, r]
                    }
                    _ => {
                        let [h, w] = pair(c, "cropping")?;
                        [h, h, w, w]
                    }
                };
                Op::Crop { edges }
            }
            "Concatenate" => {
                let axis = c["axis"].as_i64().unwrap_or(-1);
                ensure!(
                    axis == -1 || axis == 3,
                    Error::Unsupported(format!("layer {name}: only channels are concatenated"))
                );
                Op::Concat
            }
            other => {
                return Err(Error::Unsupported(format!(
                    "layer {name}: Keras layer {other} is not supported (Conv2D, Conv2DTranspose, MaxPooling2D, Cropping2D, Concatenate are)"
                )))
            }
        };
        index.insert(name.clone(), out.len());
        out.push(Layer { name, op, inputs });
    }
    Ok(Graph { layers: out })
}
