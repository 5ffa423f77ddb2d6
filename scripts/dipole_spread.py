#!/usr/bin/env python3
"""How far a crater's shading dipole strays from its tile's sun: the cue of the search again
toward the catalogue's suns (docs/results.md, "Searched again toward the catalogue's suns
first"). Also the home of the dipole that scripts/sun_alignment.py measures with.

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


def dipole(img):
    """The engine's shading angle (radians, x right, y down) of a grey crop at model size,
    and the dipole's length over the weighted brightness spread (how clear it is)."""
    a = np.asarray(Image.fromarray(img).resize((SIZE, SIZE), Image.BICUBIC), np.float64) / 255
    h, w = a.shape
    half = min(w, h) / 2
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    dx, dy = (x - (w - 1) / 2) / half, (y - (h - 1) / 2) / half
    wt = np.exp(-(dx * dx + dy * dy) / SIGMA**2)
    v = wt * (a - (wt * a).sum() / wt.sum())
    mx, my = (v * dx).sum(), (v * dy).sum()
    spread = math.sqrt((wt * (a - (wt * a).sum() / wt.sum()) ** 2).sum() / wt.sum()) + 1e-9
    return math.atan2(my, mx), math.hypot(mx, my) / spread / wt.sum() * 100


def grey(path):
    return np.asarray(Image.open(path).convert("L"), np.uint8)


def circular_mean(angles, weights):
    z = (np.asarray(weights) * np.exp(1j * np.asarray(angles))).sum() / np.sum(weights)
    return float(np.angle(z)), float(abs(z))


def main():
    root = sys.argv[1]
    split = json.load(open(f"{root}/splits/test.json"))
    tile = lambda crater: crater.rsplit("-", 1)[0]
    angle = lambda im: dipole(grey(f"{root}/{im['path']}"))[0]
    gallery = collections.defaultdict(list)
    for im in split["gallery_images"]:
        gallery[tile(im["crater_id"])].append(angle(im))
    suns = {}
    for t, angles in sorted(gallery.items()):
        suns[t], r = circular_mean(angles, [1.0] * len(angles))
        print(f"{t}: {len(angles)} gallery crops, sun {math.degrees(suns[t]):.0f} degrees, R {r:.2f}")
    off = np.array(
        [
            abs(math.degrees((angle(im) - suns[tile(im["crater_id"])] + math.pi) % math.tau - math.pi))
            for im in split["query_images"]
        ]
    )
    for within in (10, 15, 20, 30, 45, 90):
        print(f"queries within {within} degrees of their tile's sun: {(off <= within).mean():.2f}")


if __name__ == "__main__":
    main()
