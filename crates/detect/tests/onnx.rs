//! An ONNX detector (NCHW, as ONNX has it) imports into the same detector as the one built
//! natively from the same weights in Keras' order: a small U-Net of every supported node.

use craterdex_detect::net::Tensor;
use craterdex_detect::{import_detector, read_detector_dir, FeatureMap, Net};
use craterdex_model::onnx::build::{model, node};
use std::collections::BTreeMap;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            (((i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed.wrapping_mul(97))
                >> 9)
                % 1000) as f32
                / 1000.0
                - 0.5
        })
        .collect()
}

/// (name, out, in, kh, kw): ONNX Conv weights `[out, in, kh, kw]`.
const CONVS: [(&str, usize, usize, usize); 3] =
    [("c1", 4, 1, 3), ("c2", 8, 4, 3), ("head", 1, 8, 1)];

fn onnx_bytes(slice_end: i64) -> Vec<u8> {
    let mut floats = Vec::new();
    for (k, &(name, o, i, s)) in CONVS.iter().enumerate() {
        floats.push((
            format!("{name}.w"),
            vec![o as i64, i as i64, s as i64, s as i64],
            values(o * i * s * s, k as u32),
        ));
        floats.push((
            format!("{name}.b"),
            vec![o as i64],
            values(o, 10 + k as u32),
        ));
    }
    // ConvTranspose weights are [in, out, kh, kw]
    floats.push(("up.w".into(), vec![8, 4, 2, 2], values(8 * 4 * 4, 20)));
    floats.push(("up.b".into(), vec![4], values(4, 21)));
    let floats: Vec<(&str, Vec<i64>, Vec<f32>)> = floats
        .iter()
        .map(|(n, d, v)| (n.as_str(), d.clone(), v.clone()))
        .collect();
    let nodes = vec![
        node(
            "Conv",
            "c1",
            &["image", "c1.w", "c1.b"],
            &["c1.out"],
            &[("kernel_shape", &[3, 3]), ("pads", &[0, 0, 0, 0])],
        ),
        node("Relu", "r1", &["c1.out"], &["r1.out"], &[]),
        node(
            "MaxPool",
            "pool",
            &["r1.out"],
            &["pool.out"],
            &[("kernel_shape", &[2, 2]), ("strides", &[2, 2])],
        ),
        node(
            "Conv",
            "c2",
            &["pool.out", "c2.w", "c2.b"],
            &["c2.out"],
            &[("kernel_shape", &[3, 3])],
        ),
        node("Relu", "r2", &["c2.out"], &["r2.out"], &[]),
        node(
            "ConvTranspose",
            "up",
            &["r2.out", "up.w", "up.b"],
            &["up.out"],
            &[("kernel_shape", &[2, 2]), ("strides", &[2, 2])],
        ),
        node(
            "Slice",
            "crop",
            &["r1.out", "starts", "ends", "axes"],
            &["crop.out"],
            &[],
        ),
        node(
            "Concat",
            "cat",
            &["crop.out", "up.out"],
            &["cat.out"],
            &[("axis", &[1])],
        ),
        node("Identity", "same", &["cat.out"], &["cat.same"], &[]),
        node(
            "Conv",
            "head",
            &["cat.same", "head.w", "head.b"],
            &["head.out"],
            &[("kernel_shape", &[1, 1])],
        ),
        node("Sigmoid", "sig", &["head.out"], &["likelihood"], &[]),
    ];
    model(
        nodes,
        &floats,
        &[
            ("starts", vec![2, 2]),
            ("ends", vec![slice_end, slice_end]),
            ("axes", vec![2, 3]),
        ],
        ("image", &[0, 1, 20, 20]),
        ("likelihood", &[0, 1, 14, 14]),
    )
}

/// The same detector built natively, its weights turned into Keras' order here.
fn native() -> Net {
    let graph = craterdex_detect::testing::small_unet();
    let mut w: BTreeMap<String, Tensor> = BTreeMap::new();
    for (k, &(name, o, i, s)) in CONVS.iter().enumerate() {
        let onnx = values(o * i * s * s, k as u32);
        let at = |oo: usize, ii: usize, y: usize, x: usize| onnx[((oo * i + ii) * s + y) * s + x];
        let mut keras = Vec::new();
        for y in 0..s {
            for x in 0..s {
                for ii in 0..i {
                    for oo in 0..o {
                        keras.push(at(oo, ii, y, x));
                    }
                }
            }
        }
        // the small U-Net calls its head "out"
        let layer = if name == "head" { "out" } else { name };
        w.insert(format!("{layer}/kernel"), (vec![s, s, i, o], keras));
        w.insert(format!("{layer}/bias"), (vec![o], values(o, 10 + k as u32)));
    }
    let onnx = values(8 * 4 * 4, 20);
    let mut keras = Vec::new();
    for y in 0..2 {
        for x in 0..2 {
            for oo in 0..4 {
                for ii in 0..8 {
                    keras.push(onnx[((ii * 4 + oo) * 2 + y) * 2 + x]);
                }
            }
        }
    }
    w.insert("up/kernel".into(), (vec![2, 2, 4, 8], keras));
    w.insert("up/bias".into(), (vec![4], values(4, 21)));
    Net::new(graph, |n| w.get(n).cloned()).unwrap()
}

#[test]
fn an_onnx_unet_imports_as_the_same_detector() {
    let image = FeatureMap {
        height: 20,
        width: 20,
        channels: 1,
        data: values(400, 99).iter().map(|v| v + 0.5).collect(),
    };
    let want = native().forward(image.clone()).unwrap();
    // slice ends counted from the end (-2) and from the start (16 of 18 rows)
    for end in [-2, 16] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("small");
        let config = import_detector(
            &onnx_bytes(end),
            "small.onnx",
            "small",
            "test",
            "MIT",
            1.0,
            &d,
        )
        .unwrap();
        assert_eq!((config.tile, config.output().unwrap()), (20, (14, 3)));
        let (_, net) = read_detector_dir(&d).unwrap();
        let got = net.forward(image.clone()).unwrap();
        assert_eq!((got.height, got.width, got.channels), (14, 14, 1));
        for (g, w) in got.data.iter().zip(&want.data) {
            assert!((g - w).abs() < 1e-5, "slice end {end}: {g} vs {w}");
        }
    }
}

#[test]
fn unsupported_nodes_are_named() {
    let bytes = model(
        vec![node(
            "Conv",
            "c",
            &["image", "w"],
            &["c.out"],
            &[("kernel_shape", &[3, 3]), ("dilations", &[2, 2])],
        )],
        &[("w", vec![1, 1, 3, 3], vec![0.0; 9])],
        &[],
        ("image", &[1, 1, 16, 16]),
        ("c.out", &[1, 1, 12, 12]),
    );
    let dir = tempfile::tempdir().unwrap();
    let err = import_detector(
        &bytes,
        "d.onnx",
        "d",
        "t",
        "MIT",
        1.0,
        &dir.path().join("d"),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("d.onnx") && err.contains("node c") && err.contains("dilated"),
        "{err}"
    );
    let bytes = model(
        vec![node("Softmax", "s", &["image"], &["s.out"], &[])],
        &[],
        &[],
        ("image", &[1, 1, 16, 16]),
        ("s.out", &[1, 1, 16, 16]),
    );
    let err = import_detector(
        &bytes,
        "e.onnx",
        "e",
        "t",
        "MIT",
        1.0,
        &dir.path().join("e"),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("Softmax is not supported"), "{err}");
    let err = import_detector(
        b"not a model",
        "f.onnx",
        "f",
        "t",
        "MIT",
        1.0,
        &dir.path().join("f"),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("f.onnx"), "{err}");
}
