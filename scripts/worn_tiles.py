#!/usr/bin/env python3
"""Labelled tiles worn one way at a time, as a second observation wears them: what each of
`eval-link --image`'s changes (gamma, blur, noise, scale, a turn by any angle) costs a
detector on its own, scored with `craterdex eval-detect`.

Usage: scripts/worn_tiles.py OUT TILE.png LABELS.txt [TILE.png LABELS.txt]...

Writes OUT/VARIANT/ (clean, noise4, blur085, gamma07, gamma14, scale075, scale13, rot30,
rot90) with each tile worn and its labels moved with it (NAC format: ID,X,Y,W,H,C_X,CY), and
OUT/VARIANT/args, the `--tile T --craters C ...` arguments of `craterdex eval-detect`.
Each variant is one change at the middle or an end of eval-link's range: noise of 4 levels,
a Gaussian blur of 0.85 px, gamma 0.7 and 1.4, scale 0.75 and 1.3 (bilinear), a turn by 30
degrees (bilinear, on a canvas holding the whole tile, black outside it) and by 90 (exact:
the labels' transform checked against `clean`). Needs numpy and pillow.
"""
import math
import os
import sys

import numpy as np
from PIL import Image, ImageFilter

VARIANTS = {
    "clean": {},
    "noise4": {"noise": 4.0},
    "blur085": {"blur": 0.85},
    "gamma07": {"gamma": 0.7},
    "gamma14": {"gamma": 1.4},
    "scale075": {"scale": 0.75},
    "scale13": {"scale": 1.3},
    "rot30": {"turn": 30},
    "rot90": {"turn": 90},
}


def read_labels(path):
    lines = open(path).read().splitlines()
    return lines[0], [[float(v) for v in line.split(",")] for line in lines[1:] if line.strip()]


def worn(image, rows, change, rng):
    """The tile and its label rows (ID, X, Y, W, H, C_X, CY) with one change."""
    w, h = image.size
    scale = change.get("scale", 1.0)
    if scale != 1.0:
        image = image.resize((round(w * scale), round(h * scale)), Image.BILINEAR)
        rows = [[r[0]] + [v * scale for v in r[1:]] for r in rows]
    if "turn" in change:
        angle = change["turn"]
        image = image.rotate(angle, resample=Image.BILINEAR, expand=True)
        big_w, big_h = image.size
        cos, sin = math.cos(math.radians(angle)), math.sin(math.radians(angle))
        moved = []
        for r in rows:
            # PIL turns counter-clockwise as seen, about the tile's centre (pixel centres +0.5)
            u, v = r[5] + 0.5 - w / 2, r[6] + 0.5 - h / 2
            x = cos * u + sin * v + big_w / 2 - 0.5
            y = -sin * u + cos * v + big_h / 2 - 0.5
            moved.append([r[0], x - r[3] / 2, y - r[4] / 2, r[3], r[4], x, y])
        rows = moved
    a = np.asarray(image, dtype=np.float64)
    if "gamma" in change:
        a = (a / 255.0) ** change["gamma"] * 255.0
    if "noise" in change:
        a = a + rng.normal(0.0, change["noise"], a.shape)
    image = Image.fromarray(np.clip(np.round(a), 0, 255).astype(np.uint8))
    if "blur" in change:
        image = image.filter(ImageFilter.GaussianBlur(change["blur"]))
    return image, rows


def main():
    if len(sys.argv) < 4 or len(sys.argv) % 2:
        sys.exit(__doc__)
    out, pairs = sys.argv[1], list(zip(sys.argv[2::2], sys.argv[3::2]))
    rng = np.random.default_rng(5)
    for name, change in VARIANTS.items():
        folder = os.path.join(out, name)
        os.makedirs(folder, exist_ok=True)
        args = []
        for tile, labels in pairs:
            header, rows = read_labels(labels)
            image, rows = worn(Image.open(tile).convert("L"), rows, change, rng)
            stem = os.path.splitext(os.path.basename(tile))[0]
            image_path = os.path.join(folder, stem + ".png")
            labels_path = os.path.join(folder, stem + ".txt")
            image.save(image_path)
            with open(labels_path, "w") as f:
                f.write(header + "\n")
                for r in rows:
                    f.write(",".join([str(int(r[0]))] + [f"{v:.3f}" for v in r[1:]]) + "\n")
            args += ["--tile", image_path, "--craters", labels_path]
        with open(os.path.join(folder, "args"), "w") as f:
            f.write(" ".join(args))


if __name__ == "__main__":
    main()
