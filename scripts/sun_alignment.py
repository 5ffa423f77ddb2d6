#!/usr/bin/env python3
"""Can a query be brought to the gallery's light by turning or relighting it? A measurement
through the Python package on a benchmark built with `craterdex bench-build --rotated-split`
or `scripts/relight_bench.py` (docs/results.md, "Another sun, another exposure": what did
not help).

    python3 scripts/sun_alignment.py --bench mars-rot [--spread 20] [--modes]
    python3 scripts/sun_alignment.py --bench relit --turned test_az180_el30.json --inverted
    SUN_AXIS=90 python3 scripts/sun_alignment.py --bench relit --turned test_az180_el30.json --relit 0.1

A map-projected gallery shares its sun: the brightness dipole of its craters (the
Gaussian-weighted first moment of brightness at the crop's centre, the engine's
`shading_angle`) points one way, or one of a few ways (`--modes`: the peaks of their
circular histogram). Each query is searched as given and, by default, turned so that its
dipole points along the gallery's mean dipole (or each mode), and mirrored then turned so
(optionally also `--spread` degrees either side); with `--inverted`, as given and with its
brightness inverted (a sun from the other side, to first order: what `--opposite-sun` does);
with `--relit EPS`, as given and relit with the sun turned 90 degrees either way under
linear Lambertian shading (the sun's axis from the dipole, or from `SUN_AXIS` in degrees,
image axes). Searched against the default index of the gallery (`--brightness`: the model's
option, default the package's; top 100, views grouped), the per-view hits fused by several rules
and each scored: mAP and R@1 over the views present in both splits (`--turned`: the split
paired with test.json by query id). Needs `pip install ./crates/python` and Pillow
(scripts/requirements-python.txt).
"""

import argparse
import json
import math
import os
import re
import tempfile

import numpy as np
import pandas as pd

import craterdex

from dipole_spread import circular_mean, dipole, grey
from turn_fusion import fused_scores, turn

def inverted_views(img, suns, spread):
    """As given, then its brightness inverted: a sun from the opposite side, to first order."""
    return [img, 255 - img]


EPS = 0.1


def relit(img, turn_deg, eps=None):
    """`img` as if its sun were turned by `turn_deg` degrees, under linear Lambertian shading
    (brightness - mean ~ slope along the sun): in Fourier space each frequency k is scaled
    by (k.s')(k.s) / ((k.s)^2 + eps |k|^2), s the sun's axis read from the dipole. 180 degrees
    is an inversion."""
    eps = EPS if eps is None else eps
    phi = math.radians(float(os.environ["SUN_AXIS"])) if "SUN_AXIS" in os.environ else dipole(img)[0]
    a = img.astype(np.float64)
    h, w = a.shape
    mean, std = a.mean(), a.std() + 1e-9
    pad = np.pad(a - mean, ((0, h), (0, w)), mode="symmetric")
    f = np.fft.fft2(pad)
    ky, kx = np.meshgrid(np.fft.fftfreq(2 * h), np.fft.fftfreq(2 * w), indexing="ij")
    sx, sy = math.cos(phi), math.sin(phi)
    t = math.radians(turn_deg)
    tx, ty = math.cos(phi + t), math.sin(phi + t)
    ks, kt, kk = kx * sx + ky * sy, kx * tx + ky * ty, kx * kx + ky * ky
    hgain = np.where(kk > 0, kt * ks / (ks * ks + eps * kk + 1e-30), 0.0)
    out = np.real(np.fft.ifft2(f * hgain))[:h, :w]
    out = out / (out.std() + 1e-9) * std + mean
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def relit_views(img, suns, spread):
    """As given, then relit with the sun turned 90 degrees either way."""
    return [img, relit(img, 90), relit(img, -90)]


def aligned_views(img, suns, spread):
    """As given, then for each of the gallery's suns turned to it and mirrored-then-turned
    (each also `spread` degrees either side)."""
    out = [img]
    offsets = [0.0] + ([math.radians(spread), -math.radians(spread)] if spread else [])
    for sun in suns:
        for base in (img, np.ascontiguousarray(img[:, ::-1])):
            phi, _ = dipole(base)
            for off in offsets:
                out.append(turn(base.astype(np.float64), sun - phi + off))
    return [np.ascontiguousarray(v) for v in out]


def sun_modes(angles, share=0.15, window=20.0, apart=60.0, most=4):
    """The headings most gallery dipoles share: peaks of their circular histogram (1-degree
    bins smoothed over +-`window`), each holding at least `share` of the dipoles within
    +-`apart` / 2, at least `apart` degrees from a stronger one; each refined to the circular
    mean of the dipoles within +-`window`."""
    deg = np.degrees(np.asarray(angles)) % 360
    hist = np.bincount(np.floor(deg).astype(int) % 360, minlength=360).astype(float)
    smooth = sum(np.roll(hist, k) for k in range(-int(window), int(window) + 1))
    modes = []
    for peak in np.argsort(-smooth, kind="stable"):
        far = all(abs((peak - m + 180) % 360 - 180) >= apart for m in modes)
        mass = sum(np.roll(hist, k)[peak] for k in range(-int(apart / 2), int(apart / 2) + 1))
        if far and mass >= share * len(deg):
            modes.append(peak)
        if len(modes) == most or smooth[peak] < share * len(deg) * (2 * window + 1) / apart / 2:
            break
    out = []
    for m in modes:
        near = [a for a in angles if abs((math.degrees(a) - m + 180) % 360 - 180) <= window]
        out.append(circular_mean(near, [1.0] * len(near))[0])
    return out


def true_turn(view_type):
    m = re.search(r"-r(\d+)(m?)$", view_type)
    return (int(m.group(1)), m.group(2) == "m") if m else (0, False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", required=True)
    ap.add_argument("--spread", type=float, default=0.0)
    ap.add_argument("--modes", action="store_true", help="the gallery's sun modes, not its mean")
    ap.add_argument("--brightness", default=craterdex.DEFAULTS["engine"]["model"]["brightness"],
                    help="the model's brightness option (the measurements in docs/results.md: as-is)")
    ap.add_argument("--inverted", action="store_true", help="the query inverted instead of turned")
    ap.add_argument("--relit", type=float, default=None, help="the query relit 90 degrees either way, eps")
    ap.add_argument("--turned", default="test_rotated.json",
                    help="the split of turned (or relit) queries, paired with test.json by id")
    a = ap.parse_args()
    split = lambda name: json.load(open(os.path.join(a.bench, "splits", name)))
    upright, turned = split("test.json"), split(a.turned)
    gallery = pd.DataFrame([dict(id=g["image_id"], path=os.path.join(a.bench, g["path"]),
                                 crater_id=g["crater_id"]) for g in upright["gallery_images"]])
    per_crater = gallery.groupby("crater_id").size().to_dict()
    dip = [dipole(grey(p)) for p in gallery["path"]]
    sun, clarity = circular_mean([d[0] for d in dip], [1.0] * len(dip))
    print(f"gallery: {len(gallery)} images, mean dipole {math.degrees(sun):.1f} deg, "
          f"resultant length {clarity:.2f}")
    suns = sun_modes([d[0] for d in dip]) if a.modes else [sun]
    dev = np.degrees(np.min([np.abs(np.angle(np.exp(1j * (np.array([d[0] for d in dip]) - s))))
                             for s in suns], axis=0))
    print(f"suns {[round(math.degrees(s), 1) for s in suns]}; gallery dipoles within "
          "10 / 20 / 45 deg of one: " + " / ".join(f"{(dev <= t).mean():.2f}" for t in (10, 20, 45)))
    model = craterdex.Model.load(brightness=a.brightness)
    index = craterdex.Index.build(tempfile.mkdtemp(), gallery, model=model)
    by_id = {q["image_id"]: q for q in upright["query_images"]}
    pair = lambda t: by_id.get(t["image_id"]) or by_id[t["image_id"][:-1]]  # relit ids, turned ids
    sets = {"upright": [pair(t) for t in turned["query_images"]], "turned": turned["query_images"]}
    make = inverted_views if a.inverted else aligned_views
    if a.relit is not None:
        global EPS
        EPS, make = a.relit, relit_views
    rules = [("as given", 0), ("max", 0), ("margin", 0.02), ("margin", 0.05), ("margin", 0.08)]
    scores = fused_scores(index, model, sets, per_crater, rules,
                          lambda q: make(grey(os.path.join(a.bench, q["path"])), suns, a.spread))
    views = len(make(np.zeros((8, 8), np.uint8), suns, a.spread))
    print(f"{a.bench} ({a.turned}), {len(sets['turned'])} paired views, {views} views per query, "
          f"spread {a.spread:g} deg (mAP / R@1)")
    for rule, p in rules:
        u, t = scores[(rule, p, "upright")], scores[(rule, p, "turned")]
        print(f"{rule:>8} {p:<5} upright {u[0]:.3f} / {u[1]:.3f}   turned {t[0]:.3f} / {t[1]:.3f}")


if __name__ == "__main__":
    main()
