#!/usr/bin/env python3
"""How far a crater's shading dipole strays from its tile's sun: the cue of the search again
toward the catalogue's suns (docs/results.md, "Searched again toward the catalogue's suns
first").

    python3 scripts/dipole_spread.py BENCH      # a benchmark built by `craterdex bench-build`

Per tile (a crater id's part before its last '-'), the circular mean of its gallery crops'
dipoles (and the mean resultant length R: 1 when every dipole points one way); then the share
of upright queries whose dipole lies within 10-90 degrees of their tile's mean. The dipole is
the engine's `shading_angle` at 224 px (Gaussian-weighted first moment of brightness about its
weighted mean, sigma 0.16 half-widths). Needs numpy and pillow
(scripts/requirements-python.txt).
"""

import collections
import json
import math
import sys

import numpy as np
from PIL import Image

SIGMA = 0.16  # craterdex_model::preprocess::SHADING_SIGMA
SIZE = 224


def dipole(path):
    a = np.asarray(Image.open(path).convert("L").resize((SIZE, SIZE), Image.BICUBIC), np.float64)
    h, w = a.shape
    half = min(w, h) / 2
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    dx, dy = (x - (w - 1) / 2) / half, (y - (h - 1) / 2) / half
    wt = np.exp(-(dx * dx + dy * dy) / SIGMA**2)
    v = wt * (a - (wt * a).sum() / wt.sum())
    return math.degrees(math.atan2((v * dy).sum(), (v * dx).sum()))


def circular_mean(degrees):
    r = np.radians(degrees)
    s, c = np.sin(r).mean(), np.cos(r).mean()
    return math.degrees(math.atan2(s, c)), math.hypot(s, c)


def main():
    root = sys.argv[1]
    split = json.load(open(f"{root}/splits/test.json"))
    tile = lambda crater: crater.rsplit("-", 1)[0]
    gallery = collections.defaultdict(list)
    for im in split["gallery_images"]:
        gallery[tile(im["crater_id"])].append(dipole(f"{root}/{im['path']}"))
    suns = {}
    for t, angles in sorted(gallery.items()):
        suns[t], r = circular_mean(angles)
        print(f"{t}: {len(angles)} gallery crops, sun {suns[t]:.0f} degrees, R {r:.2f}")
    off = np.array(
        [
            abs((dipole(f"{root}/{im['path']}") - suns[tile(im["crater_id"])] + 180) % 360 - 180)
            for im in split["query_images"]
        ]
    )
    for within in (10, 15, 20, 30, 45, 90):
        print(f"queries within {within} degrees of their tile's sun: {(off <= within).mean():.2f}")


if __name__ == "__main__":
    main()
