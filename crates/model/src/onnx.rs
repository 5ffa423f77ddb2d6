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
}

#[derive(Clone, PartialEq, Message)]
struct TensorProto {
    #[prost(int64, repeated, tag = "1")]
    dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    data_type: i32,
    #[prost(float, repeated, tag = "4")]
    float_data: Vec<f32>,
    #[prost(string, tag = "8")]
    name: String,
    #[prost(bytes = "vec", tag = "9")]
    raw_data: Vec<u8>,
    #[prost(int32, tag = "14")]
    data_location: i32,
}

const ONNX_FLOAT: i32 = 1;
const ONNX_FLOAT16: i32 = 10;

/// A float tensor read from an ONNX initializer.
#[derive(Debug, Clone)]
pub struct OnnxTensor {
    pub dims: Vec<usize>,
    pub data: Vec<f32>,
}

/// The float initializers (by name) and the nodes of an ONNX graph.
pub struct OnnxGraph {
    pub initializers: HashMap<String, OnnxTensor>,
    pub nodes: Vec<NodeProto>,
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
                _ => continue, // shape constants and the like are not weights
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
            nodes: graph.node,
        })
    }

    /// The node with exactly this name.
    pub fn node(&self, name: &str) -> Option<&NodeProto> {
        self.nodes.iter().find(|n| n.name == name)
    }
}
