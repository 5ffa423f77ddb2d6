#!/usr/bin/env python3
"""Does spatial verification of the best images find the right crater first more often, and
how should inliers weigh? An exploration through the Python package on a CraterBench-R
benchmark (docs/results.md, "Spatial verification of the best images"); the engine's own
(`craterdex search --verify`, `craterdex eval --verify`) is measured by eval.

    python3 scripts/spatial_verification.py --bench mars-rot [--top 10] [--dim 64] [--tau 1.5]

The default index of the gallery ranks every query (views not grouped). Then, for each query
and each of its first `top` candidates, as instance-level retrieval verifies landmarks:

1. correspondences: the patch tokens of both images (unit length, PCA-whitened with a token
   sample of the gallery, the first `dim` components kept, unit length again; `--plain`: unit
   length only) matched as
   mutual nearest neighbours by cosine;
2. a similarity transform (rotation, scale in [0.5, 2], shift) on the patch grid, fitted by
   trying every pair of correspondences as the minimal sample (at most 2,000 pairs, drawn
   with a fixed seed); a correspondence is an inlier when the transform puts it within `tau`
   patches of its match;
3. rerank the `top` candidates by late-interaction score + lambda * max(0, inliers - floor)
   (the rest of the ranking stays as it was), for several lambda and floors (`craterdex
   search --verify` uses lambda 0.01 and a floor of a fifth of the patches, 51 of 256).

Prints, per split (the benchmark's upright test.json and, where present, test_rotated.json
searched once as given), mAP and R@1 with views grouped crater by crater (as `craterdex
search` lists them) and not grouped, and the mean inliers of right and wrong candidates.
Needs `pip install ./crates/python`.
"""

import argparse
import json
import os
import tempfile
import time

import numpy as np
import pandas as pd

import bench_features
import craterdex

# (lambda, floor): score + lambda * max(0, inliers - floor); the engine's is (0.01, 0.2 x patches)
WEIGHINGS = [(0.0, 0), (0.002, 0), (0.005, 0), (0.01, 0), (0.02, 0), (0.05, 0),
             (0.01, 30), (0.01, 45), (0.01, 51), (0.01, 60), (0.01, 80)]
MAX_PAIRS = 2000
SCALES = (0.5, 2.0)


def grid_positions(tokens):
    """Patch centres of a square grid of `tokens`, as complex numbers x + iy in patches."""
    side = int(round(np.sqrt(tokens)))
    y, x = np.divmod(np.arange(tokens), side)
    return x + 1j * y


def inliers(query, candidate, grid, tau, rng):
    """Mutual-NN correspondences between two token grids and the most inliers any similarity
    transform from two of them explains."""
    sim = query @ candidate.T
    to_c, to_q = sim.argmax(1), sim.argmax(0)
    mutual = np.nonzero(to_q[to_c] == np.arange(len(to_c)))[0]
    if len(mutual) < 2:
        return 0
    src, dst = grid[mutual], grid[to_c[mutual]]
    i, j = np.triu_indices(len(mutual), 1)
    if len(i) > MAX_PAIRS:
        pick = rng.choice(len(i), MAX_PAIRS, replace=False)
        i, j = i[pick], j[pick]
    # z -> a z + b through two correspondences: a turns and scales, b shifts
    a = (dst[j] - dst[i]) / (src[j] - src[i])
    keep = (np.abs(a) > SCALES[0]) & (np.abs(a) < SCALES[1])
    a, i = a[keep], i[keep]
    if len(a) == 0:
        return 1
    b = dst[i] - a * src[i]
    err = np.abs(a[:, None] * src[None, :] + b[:, None] - dst[None, :])
    return int((err < tau).sum(1).max())


def metrics(ranked_craters, relevant):
    grouped = list(dict.fromkeys(ranked_craters))
    return (bench_features.average_precision(grouped, relevant), grouped[0] in relevant,
            bench_features.average_precision(ranked_craters, relevant), ranked_craters[0] in relevant)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--top", type=int, default=10, help="candidates verified per query")
    ap.add_argument("--dim", type=int, default=0, help="PCA components kept (0: all)")
    ap.add_argument("--tau", type=float, default=1.5, help="inlier distance, patches")
    ap.add_argument("--plain", action="store_true", help="unit patch tokens, no PCA whitening")
    a = ap.parse_args()

    g, _, gf, _ = bench_features.load(a.bench)
    model = craterdex.Model.load()
    splits = {}
    for name, file in [("upright", "test.json"), ("turned", "test_rotated.json")]:
        path = os.path.join(a.bench, "splits", file)
        if os.path.exists(path):
            qs = json.load(open(path))["query_images"]
            splits[name] = (qs, model.extract([os.path.join(a.bench, q["path"]) for q in qs],
                                              ids=[q["image_id"] for q in qs]))
    index = craterdex.Index.build(os.path.join(tempfile.mkdtemp(prefix="craterdex-verify-"), "idx"), g,
                                  features=gf)
    patches = [gf["patches"], *(f["patches"] for _, f in splits.values())]
    if a.plain:
        whitened = [bench_features.l2(p).astype(np.float32) for p in patches]
    else:
        whitened = bench_features.pca_whitened_tokens(*patches)
    if a.dim:
        whitened = [bench_features.l2(w[..., :a.dim]).astype(np.float32) for w in whitened]
    gallery_tokens = dict(zip(gf["ids"], whitened[0]))
    grid = grid_positions(whitened[0].shape[1])
    crater_of = dict(zip(g["id"], g["crater_id"]))
    rng = np.random.default_rng(0)
    print(f"{a.bench}: top {a.top}, {whitened[0].shape[2]} dims{' (plain)' if a.plain else ''}, tau {a.tau} patches")
    for n, (name, (qs, qf)) in enumerate(splits.items()):
        query_tokens = dict(zip(qf["ids"], whitened[1 + n]))
        hits = index.search(features=qf, top_k=len(g), group_views=False).sort_values(["query", "rank"])
        t0 = time.perf_counter()
        verified = {}
        for qid, h in hits.groupby("query"):
            ids, scores = list(h["id"]), list(h["score"])
            counts = [inliers(query_tokens[qid], gallery_tokens[c], grid, a.tau, rng) for c in ids[:a.top]]
            verified[qid] = (ids, scores, counts)
        ms = 1e3 * (time.perf_counter() - t0) / len(qs)
        print(f"\n{name}: {len(qs)} queries, verification {ms:.1f} ms per query (numpy)")
        print(f"{'lambda':>8} {'floor':>5} {'mAP':>8} {'R@1':>7} {'mAP ungr':>9} {'R@1 ungr':>9}")
        for lam, floor in WEIGHINGS:
            rows = []
            for q in qs:
                ids, scores, counts = verified[q["image_id"]]
                head = sorted(range(len(counts)), key=lambda k: -(scores[k] + lam * max(0, counts[k] - floor)))
                order = [ids[k] for k in head] + ids[len(counts):]
                rows.append(metrics([crater_of[i] for i in order], set(q["relevant_crater_ids"])))
            m = np.mean(rows, axis=0)
            print(f"{lam:8.3f} {floor:5d} {m[0]:8.4f} {m[1]:7.3f} {m[2]:9.4f} {m[3]:9.3f}")
        right = [c for q in qs for i, c in zip(verified[q["image_id"]][0], verified[q["image_id"]][2])
                 if crater_of[i] in q["relevant_crater_ids"]]
        wrong = [c for q in qs for i, c in zip(verified[q["image_id"]][0], verified[q["image_id"]][2])
                 if crater_of[i] not in q["relevant_crater_ids"]]
        print(f"inliers: right candidates {np.mean(right):.1f} (n {len(right)}), "
              f"wrong {np.mean(wrong):.1f} (n {len(wrong)})")


if __name__ == "__main__":
    main()
