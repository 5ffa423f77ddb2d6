#!/usr/bin/env python3
"""Does searching with the eight turns and mirror images of a query (the dihedral group
of the square, exact pixel operations) and keeping each gallery image's best score undo
what turning a query costs? A measurement through the Python package, on a benchmark built
with `craterdex bench-build --rotated-split`.

    python3 scripts/rotation_fusion.py --bench mars-rot

Prints mAP and R@1 of exhaustive whitened late interaction (32 FPS instance tokens, f32,
whitening learned from every gallery image) for the queries as built and turned, each
searched as is and with max fusion over the 4 or 8 variants, paired over the views present
in both splits, and the query-side cost (forward passes and searches per query).
Needs `pip install ./crates/python` and Pillow (scripts/requirements-python.txt).
"""

import argparse
import json
import os
import tempfile
import time

import numpy as np
import pandas as pd
from PIL import Image

import craterdex


def load(bench, split):
    m = json.load(open(os.path.join(bench, "splits", split)))
    return m["gallery_images"], m["query_images"]


def gray(path):
    return np.asarray(Image.open(path).convert("L"))


def variants(a, n):
    out = [np.rot90(a, k) for k in range(4)][: min(n, 4)]
    if n == 8:
        out += [np.rot90(np.fliplr(a), k) for k in range(4)]
    return [np.ascontiguousarray(v) for v in out]


def average_precision(ranked_craters, relevant):
    hits, total = 0, 0.0
    n_rel = sum(1 for c in ranked_craters if c in relevant)
    if n_rel == 0:
        return None, False
    for i, c in enumerate(ranked_craters, 1):
        if c in relevant:
            hits += 1
            total += hits / i
    return total / n_rel, ranked_craters[0] in relevant


def run(index, craters_of, model, bench, queries, n_variants):
    """AP and top-1 per query id with max fusion over `n_variants` (1: the query as is)."""
    out = {}
    feats_s = search_s = 0.0
    for q in queries:
        img = gray(os.path.join(bench, q["path"]))
        t = time.perf_counter()
        f = model.extract(variants(img, n_variants))
        feats_s += time.perf_counter() - t
        t = time.perf_counter()
        hits = index.search(features=f, top_k=len(craters_of), mode="exhaustive", group_views=False)
        search_s += time.perf_counter() - t
        best = hits.groupby("id")["score"].max().sort_values(ascending=False, kind="stable")
        craters = list(craters_of.loc[best.index])
        out[q["image_id"]] = average_precision(craters, set(q["relevant_crater_ids"]))
    return out, feats_s / len(queries), search_s / len(queries)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True)
    a = ap.parse_args()
    gallery, upright = load(a.bench, "test.json")
    _, turned = load(a.bench, "test_rotated.json")
    pairs = {t["image_id"][:-1] for t in turned}
    upright = [q for q in upright if q["image_id"] in pairs]
    model = craterdex.Model.load()
    print(craterdex.cpu())
    g = pd.DataFrame({"id": [e["image_id"] for e in gallery], "crater_id": [e["crater_id"] for e in gallery],
                      "path": [os.path.join(a.bench, e["path"]) for e in gallery]})
    feats = model.extract(list(g["path"]), ids=list(g["id"]))
    work = tempfile.mkdtemp(prefix="craterdex-rotation-")
    index = craterdex.Index.build(os.path.join(work, "idx"), g, features=feats,
                                  recipe=craterdex.Recipe(codec="f32", ivf="off"))
    craters_of = g.set_index("id")["crater_id"]
    print(f"{len(g)} gallery images; {len(upright)} query views present both as built and turned")
    print(f"{'queries':<10} {'variants':>8} {'mAP':>7} {'R@1':>6} {'extract ms/query':>17} {'search ms/query':>16}")
    for name, qs in (("as built", upright), ("turned", turned)):
        for n in (1, 4, 8):
            res, fe, se = run(index, craters_of, model, a.bench, qs, n)
            aps = [v[0] for v in res.values() if v[0] is not None]
            r1 = np.mean([v[1] for v in res.values() if v[0] is not None])
            print(f"{name:<10} {n:>8} {np.mean(aps):7.4f} {r1:6.3f} {fe * 1e3:17.1f} {se * 1e3:16.1f}")


if __name__ == "__main__":
    main()
