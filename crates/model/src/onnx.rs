//! Reads the initializers and node wiring of an ONNX file.
//!
//! Only the protobuf fields we need are declared; prost skips the rest, so no protoc and no
//! full ONNX schema are required.

use crate::error::{Error, Result};
use craterdex_errors::{IoContext, OrInvalid, ResultExt};
use prost::Message;
use std::collections::HashMap;
use std::path::Path;

#[derive(Clone, PartialEq, Message)]
struct ModelProto {
    #[prost(message, optional, tag = "7")]
    graph: Option<GraphProto>,
}

#[derive(Clone, PartialEq, Message)]
struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    node: Vec<NodeProto>,
    #[prost(message, repeated, tag = "5")]
    initializer: Vec<TensorProto>,
    #[prost(message, repeated, tag = "11")]
    input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    output: Vec<ValueInfoProto>,
}

/// A graph input or output: its name and, for tensors, its shape.
#[derive(Clone, PartialEq, Message)]
pub struct ValueInfoProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    r#type: Option<TypeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct TypeProto {
    #[prost(message, optional, tag = "1")]
    tensor_type: Option<TensorTypeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct TensorTypeProto {
    #[prost(message, optional, tag = "2")]
    shape: Option<ShapeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct ShapeProto {
    #[prost(message, repeated, tag = "1")]
    dim: Vec<DimensionProto>,
}

#[derive(Clone, PartialEq, Message)]
struct DimensionProto {
    #[prost(int64, optional, tag = "1")]
    dim_value: Option<i64>,
}

impl ValueInfoProto {
    /// The tensor's dimensions, `None` where one is symbolic (a batch size).
    pub fn dims(&self) -> Vec<Option<usize>> {
        self.r#type
            .as_ref()
            .and_then(|t| t.tensor_type.as_ref())
            .and_then(|t| t.shape.as_ref())
            .map(|s| {
                s.dim
                    .iter()
                    .map(|d| d.dim_value.filter(|&v| v > 0).map(|v| v as usize))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A node attribute: the ones convolutional detectors use (integers and lists of them).
#[derive(Clone, PartialEq, Message)]
pub struct AttributeProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(float, tag = "2")]
    pub f: f32,
    #[prost(int64, tag = "3")]
    pub i: i64,
    #[prost(bytes = "vec", tag = "4")]
    pub s: Vec<u8>,
    #[prost(int64, repeated, tag = "8")]
    pub ints: Vec<i64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(string, tag = "4")]
    pub op_type: String,
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
}

impl NodeProto {
    pub fn attribute(&self, name: &str) -> Option<&AttributeProto> {
        self.attribute.iter().find(|a| a.name == name)
    }
}

#[derive(Clone, PartialEq, Message)]
struct TensorProto {
    #[prost(int64, repeated, tag = "1")]
    dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    data_type: i32,
    #[prost(float, repeated, tag = "4")]
    float_data: Vec<f32>,
    #[prost(int64, repeated, tag = "7")]
    int64_data: Vec<i64>,
    #[prost(string, tag = "8")]
    name: String,
    #[prost(bytes = "vec", tag = "9")]
    raw_data: Vec<u8>,
    #[prost(int32, tag = "14")]
    data_location: i32,
}

const ONNX_FLOAT: i32 = 1;
const ONNX_FLOAT16: i32 = 10;
const ONNX_INT64: i32 = 7;

/// A float tensor read from an ONNX initializer.
#[derive(Debug, Clone)]
pub struct OnnxTensor {
    pub dims: Vec<usize>,
    pub data: Vec<f32>,
}

/// The float initializers (by name), the integer ones (shape constants, slice bounds), the
/// nodes, and the inputs and outputs of an ONNX graph.
pub struct OnnxGraph {
    pub initializers: HashMap<String, OnnxTensor>,
    pub integers: HashMap<String, Vec<i64>>,
    pub nodes: Vec<NodeProto>,
    pub inputs: Vec<ValueInfoProto>,
    pub outputs: Vec<ValueInfoProto>,
}

impl OnnxGraph {
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).io("read", path)?;
        Self::decode(&bytes)
            .with_context(|| format!("{} is not a readable ONNX model", path.display()))
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let model = ModelProto::decode(bytes).or_invalid("protobuf decoding failed")?;
        let Some(graph) = model.graph else {
            return Err(Error::Invalid("the model has no graph".into()));
        };
        let mut initializers = HashMap::new();
        let mut integers = HashMap::new();
        for t in graph.initializer {
            if t.data_location == 1 {
                return Err(Error::Invalid(format!(
                    "initializer {} uses external data, which is not supported",
                    t.name
                )));
            }
            let dims: Vec<usize> = t.dims.iter().map(|&d| d.max(0) as usize).collect();
            let data = match t.data_type {
                ONNX_FLOAT if !t.raw_data.is_empty() => t
                    .raw_data
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                ONNX_FLOAT => t.float_data,
                ONNX_FLOAT16 => t
                    .raw_data
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                ONNX_INT64 => {
                    let values = if t.raw_data.is_empty() {
                        t.int64_data
                    } else {
                        t.raw_data
                            .chunks_exact(8)
                            .map(|c| i64::from_le_bytes(c.try_into().expect("chunks of 8")))
                            .collect()
                    };
                    integers.insert(t.name, values);
                    continue;
                }
                _ => continue, // other constants are not weights
            };
            let expected: usize = dims.iter().product();
            if data.len() != expected {
                return Err(Error::Invalid(format!(
                    "initializer {} holds {} values for shape {:?}",
                    t.name,
                    data.len(),
                    dims
                )));
            }
            initializers.insert(t.name, OnnxTensor { dims, data });
        }
        Ok(Self {
            initializers,
            integers,
            nodes: graph.node,
            inputs: graph.input,
            outputs: graph.output,
        })
    }

    /// The node with exactly this name.
    pub fn node(&self, name: &str) -> Option<&NodeProto> {
        self.nodes.iter().find(|n| n.name == name)
    }
}

/// ONNX files built in code, for the tests of this and other crates.
#[cfg(feature = "testing")]
pub mod build {
    use super::*;

    /// A node: `op` from `inputs` to `outputs`, with integer-list attributes.
    pub fn node(
        op: &str,
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        ints: &[(&str, &[i64])],
    ) -> NodeProto {
        NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            name: name.into(),
            op_type: op.into(),
            attribute: ints
                .iter()
                .map(|(n, v)| AttributeProto {
                    name: n.to_string(),
                    ints: v.to_vec(),
                    i: v.first().copied().unwrap_or(0),
                    ..Default::default()
                })
                .collect(),
        }
    }

    fn value(name: &str, dims: &[i64]) -> ValueInfoProto {
        ValueInfoProto {
            name: name.into(),
            r#type: Some(TypeProto {
                tensor_type: Some(TensorTypeProto {
                    shape: Some(ShapeProto {
                        dim: dims
                            .iter()
                            .map(|&d| DimensionProto {
                                dim_value: (d > 0).then_some(d),
                            })
                            .collect(),
                    }),
                }),
            }),
        }
    }

    /// The bytes of a model of `nodes`, float initializers, int64 initializers, one input
    /// and one output with their dimensions (0: symbolic).
    pub fn model(
        nodes: Vec<NodeProto>,
        floats: &[(&str, Vec<i64>, Vec<f32>)],
        ints: &[(&str, Vec<i64>)],
        input: (&str, &[i64]),
        output: (&str, &[i64]),
    ) -> Vec<u8> {
        let mut initializer: Vec<TensorProto> = floats
            .iter()
            .map(|(n, dims, data)| TensorProto {
                dims: dims.clone(),
                data_type: ONNX_FLOAT,
                float_data: data.clone(),
                name: n.to_string(),
                ..Default::default()
            })
            .collect();
        initializer.extend(ints.iter().map(|(n, v)| TensorProto {
            dims: vec![v.len() as i64],
            data_type: ONNX_INT64,
            int64_data: v.clone(),
            name: n.to_string(),
            ..Default::default()
        }));
        ModelProto {
            graph: Some(GraphProto {
                node: nodes,
                initializer,
                input: vec![value(input.0, input.1)],
                output: vec![value(output.0, output.1)],
            }),
        }
        .encode_to_vec()
    }
}
