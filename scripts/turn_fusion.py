#!/usr/bin/env python3
"""How should the views of a turned search be fused? A measurement through the Python
package on a benchmark built with `craterdex bench-build --rotated-split` (docs/results.md,
"Queries at an unknown heading").

    python3 scripts/turn_fusion.py --bench mars-rot [--turns 12]

Every query (the upright split and the turned one) is searched as given, mirrored, and both
turned by every `turns`-th of a circle (reflected at the edges, as the engine turns), with
the default index of the gallery (top 100, views grouped); the per-view hits are then fused
by several rules and each is scored: mAP and R@1 over the views present in both splits.
Needs `pip install ./crates/python` and Pillow (scripts/requirements-python.txt).
"""

import argparse
import json
import math
import os
import tempfile

import numpy as np
import pandas as pd
from PIL import Image

import craterdex


def turn(img, angle):
    """`img` turned by `angle` radians about its centre, bilinear, reflected at the edges."""
    h, w = img.shape
    cx, cy = (w - 1) / 2, (h - 1) / 2
    s, c = math.sin(-angle), math.cos(-angle)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    dx, dy = x - cx, y - cy

    def reflect(v, n):
        p = 2 * (n - 1)
        v = np.mod(v, p)
        return np.where(v > n - 1, p - v, v)

    sx, sy = reflect(cx + c * dx - s * dy, w), reflect(cy + s * dx + c * dy, h)
    x0, y0 = np.floor(sx).astype(int), np.floor(sy).astype(int)
    x1, y1 = np.minimum(x0 + 1, w - 1), np.minimum(y0 + 1, h - 1)
    fx, fy = sx - x0, sy - y0
    top = img[y0, x0] * (1 - fx) + img[y0, x1] * fx
    bottom = img[y1, x0] * (1 - fx) + img[y1, x1] * fx
    return np.clip(np.rint(top * (1 - fy) + bottom * fy), 0, 255).astype(np.uint8)


def views(path, turns):
    """The engine's order: as given, mirrored, then each turn and its mirror image."""
    img = np.asarray(Image.open(path).convert("L"), np.float64)
    out = []
    for t in range(turns):
        a = img.astype(np.uint8) if t == 0 else turn(img, 2 * math.pi * t / turns)
        out += [np.ascontiguousarray(a), np.ascontiguousarray(a[:, ::-1])]
    return out


def ap_r1(craters, relevant, n_relevant):
    hits, total = 0, 0.0
    for i, c in enumerate(craters, 1):
        if c in relevant:
            hits += 1
            total += hits / i
    return total / max(n_relevant, 1), bool(craters) and craters[0] in relevant


def fused(hits, rule, p):
    """Crater-ordered ids of one query's per-view hits under a fusion rule."""
    first = hits[hits.view == 0]
    if rule == "as given" or (rule == "gate" and first.score.max() >= p):
        best = first[["id", "crater_id", "score"]]
    else:
        hits = hits.copy()
        if rule == "margin":
            hits.loc[hits.view != 0, "score"] -= p
        best = hits.groupby(["id", "crater_id"])["score"].max().reset_index()
    crater_best = best.groupby("crater_id")["score"].max()
    best = best.assign(cs=best["crater_id"].map(crater_best))
    return best.sort_values(["cs", "score"], ascending=False)["crater_id"].tolist()


def fused_scores(index, model, sets, per_crater, rules, views_of):
    """mAP and R@1 by (rule, p, set name): every query of each set of `sets` searched in the
    views `views_of(query)` gives (`<id>#<view>`, top 100), its per-view hits fused by each
    (rule, p) of `rules` and ranked against its relevant craters."""
    scores = {}
    for name, queries in sets.items():
        arrays, ids = [], []
        for q in queries:
            for v, img in enumerate(views_of(q)):
                arrays.append(img)
                ids.append(f"{q['image_id']}#{v}")
        hits = index.search(features=model.extract(arrays, ids=ids), top_k=100)
        hits["q"] = hits["query"].str.rsplit("#", n=1).str[0]
        hits["view"] = hits["query"].str.rsplit("#", n=1).str[1].astype(int)
        per_query = dict(tuple(hits.groupby("q")))
        for rule, p in rules:
            results = []
            for q in queries:
                relevant = set(q["relevant_crater_ids"])
                n = sum(per_crater.get(c, 0) for c in relevant)
                results.append(ap_r1(fused(per_query[q["image_id"]], rule, p), relevant, n))
            scores[(rule, p, name)] = (np.mean([r[0] for r in results]), np.mean([r[1] for r in results]))
    return scores


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", required=True)
    ap.add_argument("--turns", type=int, default=12)
    a = ap.parse_args()
    split = lambda name: json.load(open(os.path.join(a.bench, "splits", name)))
    upright, turned = split("test.json"), split("test_rotated.json")
    gallery = pd.DataFrame([dict(id=g["image_id"], path=os.path.join(a.bench, g["path"]),
                                 crater_id=g["crater_id"]) for g in upright["gallery_images"]])
    per_crater = gallery.groupby("crater_id").size().to_dict()
    model = craterdex.Model.load()
    index = craterdex.Index.build(tempfile.mkdtemp(), gallery, model=model)
    by_id = {q["image_id"]: q for q in upright["query_images"]}
    sets = {"upright": [by_id[t["image_id"][:-1]] for t in turned["query_images"]],
            "turned": turned["query_images"]}
    rules = [("as given", 0), ("max", 0), ("margin", 0.02), ("margin", 0.05), ("gate", 0.5)]
    scores = fused_scores(index, model, sets, per_crater, rules,
                          lambda q: views(os.path.join(a.bench, q["path"]), a.turns))
    print(f"{a.bench}, {len(sets['turned'])} paired views, {2 * a.turns} views per query (mAP / R@1)")
    for rule, p in rules:
        u, t = scores[(rule, p, "upright")], scores[(rule, p, "turned")]
        print(f"{rule:>8} {p:<5} upright {u[0]:.3f} / {u[1]:.3f}   turned {t[0]:.3f} / {t[1]:.3f}")


if __name__ == "__main__":
    main()
