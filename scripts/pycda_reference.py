#!/usr/bin/env python3
"""pycda's own crater detection pipeline on whole tiles: the reference `craterdex bench detect`
compares with, in the same run on the same CPU.

Runs pycda 0.1.16's CDA (U-Net detector, FastCircles extractor, 12x12 convolutional
classifier, threshold 0.5; its defaults but the U-Net) on each tile at scales 1, 1/2 and 1/3
(pycda finds craters of a few to some tens of pixels; the smaller scales bring the larger
craters into range), maps the detections back to the tile's pixels, and writes JSON:
  {"tensorflow": version, "threads": n, "tiles": [{"tile", "seconds", "detections": [[x, y, d, likelihood]]}]}
Three shims let pycda 0.1.16 (2018) run on current packages without changing it: `keras`
is tf-keras (Keras 2 reads its .h5 models), `pkg_resources` finds its models in the
unpacked sdist, and scikit-image's `measure.label(neighbors=4)` and
`morphology.watershed` take their current names.
Needs: tf-keras, scikit-image, pandas, matplotlib, pillow (scripts/requirements-pycda.txt).
Usage: python3 scripts/pycda_reference.py PYCDA_SDIST OUT_JSON TILE...
"""
import io, json, os, sys, tarfile, tempfile, time, types
import numpy as np
from PIL import Image

sdist, out, tiles = sys.argv[1], sys.argv[2], sys.argv[3:]
work = tempfile.mkdtemp(prefix="pycda-")
with tarfile.open(sdist) as tar:
    tar.extractall(work, filter="data")
root = os.path.join(work, "pycda-0.1.16")
sys.path.insert(0, root)

import tf_keras
import tensorflow as tf
tf_keras.utils.disable_interactive_logging()  # pycda predicts without verbose=0
sys.modules["keras"] = tf_keras
sys.modules["keras.models"] = tf_keras.models
pkg = types.ModuleType("pkg_resources")
pkg.resource_filename = lambda package, name: os.path.join(root, package, name)
sys.modules["pkg_resources"] = pkg
import skimage.measure, skimage.morphology, skimage.segmentation
_label = skimage.measure.label
skimage.measure.label = lambda image, neighbors=None, background=None, **kw: _label(
    image, background=background, connectivity=1 if neighbors == 4 else 2, **kw)
skimage.morphology.watershed = skimage.segmentation.watershed

import pycda
cda = pycda.CDA(detector="unet", extractor="fast_circle", classifier="convolution")
SCALES = (1.0, 1 / 2, 1 / 3)
results = []
for tile in tiles:
    image = np.array(Image.open(tile).convert("L"))
    t = time.perf_counter()
    found = []
    for s in SCALES:
        h, w = image.shape
        scaled = image if s == 1.0 else np.array(
            Image.fromarray(image).resize((round(w * s), round(h * s)), Image.BILINEAR))
        cda.predictions = []  # pycda keeps every earlier image; one at a time
        try:
            prediction = cda.get_prediction(scaled)
        except Exception as e:  # pycda's own code; name the tile and scale it failed on
            sys.exit(f"{tile}: pycda failed at scale {s:.3g}: {type(e).__name__}: {e}")
        p = prediction.proposals
        for lat, lon, d, like in zip(p["lat"], p["long"], p["diameter"], p["likelihood"]):
            if like >= 0.5:
                found.append([(lon + 0.5) / s - 0.5, (lat + 0.5) / s - 0.5, d / s, float(like)])
    results.append({"tile": tile, "seconds": time.perf_counter() - t, "detections": found})
    print(f"{tile}: {len(found)} craters in {results[-1]['seconds']:.1f}s", file=sys.stderr)
json.dump({"tensorflow": tf.__version__, "threads": os.cpu_count(), "tiles": results}, open(out, "w"))
