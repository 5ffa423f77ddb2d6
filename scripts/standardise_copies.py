#!/usr/bin/env python3
"""Copies of a benchmark's images with their brightness standardised, for choosing the
spread of `--brightness standardised` (docs/results.md, "Another sun, another exposure").

    python3 scripts/standardise_copies.py mars-rot mars-rot-s32 32
    craterdex eval --manifest mars-rot-s32/splits/test.json --quick --brightness as-is

Every PNG under BENCH is written to OUT shifted and scaled so that its brightness has mean 128
and standard deviation SPREAD (of 255), clamped to 0-255; the other files (manifests,
metadata) are copied as they are, so the copy evaluates like the original. The statistics are
over the stored crop and the gain is not limited, unlike the engine's, which standardises the
crop at the model's input size and raises its contrast at most 8 times. Needs numpy and
Pillow (scripts/requirements-python.txt).
"""
import os
import shutil
import sys

import numpy as np
from PIL import Image


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, dst, spread = sys.argv[1], sys.argv[2], float(sys.argv[3])
    for root, _, files in os.walk(src):
        rel = os.path.relpath(root, src)
        os.makedirs(os.path.join(dst, rel), exist_ok=True)
        for f in files:
            s, d = os.path.join(root, f), os.path.join(dst, rel, f)
            if f.endswith(".png"):
                a = np.asarray(Image.open(s).convert("L"), np.float64)
                a = 128 + spread * (a - a.mean()) / (a.std() + 1e-6)
                Image.fromarray(np.clip(np.rint(a), 0, 255).astype(np.uint8)).save(d)
            else:
                shutil.copy(s, d)


if __name__ == "__main__":
    main()
