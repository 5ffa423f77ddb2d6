#!/usr/bin/env python3
"""A labelled tile cut in two halves, one to fit (or tune) a detector on and the other to
report it on: a body with a single labelled tile (pycda's Mars tile) still gets a split where
nothing is chosen on the craters that report the result.

Usage: scripts/split_tile.py OUT TILE LABELS

Writes OUT/<stem>_top.png and OUT/<stem>_bottom.png (the rows above and below the middle) with
OUT/<stem>_top.csv and OUT/<stem>_bottom.csv (x,y,diameter_px: the crater lists `craterdex
eval-detect` and `detect fit` read), each half's labels those centred in it, moved to its
rows. A crater cut by the middle is listed in the half that holds its centre. LABELS is
pycda's (long,lat,diameter: pixels), the LRO NAC tiles' (ID,X,Y,W,H,C_X,CY) or craterdex's
(x,y,diameter_px). Needs pillow.
"""
import csv
import os
import sys

from PIL import Image

from crater_labels import circles


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    out, tile, labels = sys.argv[1:]
    try:
        image = Image.open(tile).convert("L")
    except OSError as e:
        sys.exit(f"{tile}: not an image: {e}")
    width, height = image.size
    middle = height // 2
    craters = circles(labels)
    stem = os.path.splitext(os.path.basename(tile))[0]
    os.makedirs(out, exist_ok=True)
    for name, (top, bottom) in {"top": (0, middle), "bottom": (middle, height)}.items():
        image.crop((0, top, width, bottom)).save(os.path.join(out, f"{stem}_{name}.png"))
        with open(os.path.join(out, f"{stem}_{name}.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["x", "y", "diameter_px"])
            kept = [(x, y - top, d) for x, y, d in craters if top <= y < bottom]
            for x, y, d in kept:
                w.writerow([f"{x:.2f}", f"{y:.2f}", f"{d:.2f}"])
        print(f"{name}: rows {top}-{bottom}, {len(kept)} craters")


if __name__ == "__main__":
    main()
