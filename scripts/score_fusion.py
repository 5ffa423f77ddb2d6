#!/usr/bin/env python3
"""Levers measured on the scores of the shipped index, before any was built into search:
view grouping (what `search` now does by default), mean fusion of a crater's views, and
alpha query expansion. A measurement through the Python package, on any CraterBench-R
benchmark.

    python3 scripts/score_fusion.py --bench mars-rot

Builds the default index of the gallery (pair whitening learned from every gallery crater's
two views, int8 tokens, no IVF), scores every query against every gallery image (exhaustive
late interaction, and the single vector), and the gallery against itself (for query
expansion). Then, on those score matrices:

- grouping: a gallery image ranks by the best score among its crater's views (its crater id
  in the catalogue), ties broken by its own score;
- mean fusion: (own + beta * mean of the crater's other views) / (1 + beta);
- alpha QE: the query's scores plus those of its k best gallery images, weighted by
  score^alpha.

Prints mAP, R@1, R@5 and R@10 (relevance: the query's relevant crater ids). Uses no query
label. Features come from the feature cache when an eval of the benchmark ran before. Needs
`pip install ./crates/python`.
"""

import argparse
import os
import tempfile

import numpy as np

import bench_features
import craterdex


def score_matrix(idx, feats, gallery_pos, mode):
    hits = idx.search(features=feats, top_k=len(gallery_pos), mode=mode, group_views=False)
    qpos = {q: n for n, q in enumerate(feats["ids"])}
    s = np.full((len(qpos), len(gallery_pos)), -np.inf)
    s[hits["query"].map(qpos).values, hits["id"].map(gallery_pos).values] = hits["score"].values
    return s


def metrics(scores, relevant, tie=None):
    aps, r1, r5, r10 = [], [], [], []
    for q, (s, r) in enumerate(zip(scores, relevant)):
        order = np.lexsort((-tie[q], -s)) if tie is not None else np.argsort(-s, kind="stable")
        rr = r[order]
        hits = np.cumsum(rr)
        aps.append((hits[rr] / (np.nonzero(rr)[0] + 1)).sum() / rr.sum())
        r1.append(rr[0])
        r5.append(rr[:5].any())
        r10.append(rr[:10].any())
    return "  ".join(f"{np.mean(x):.3f}" for x in (aps, r1, r5, r10))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True)
    a = ap.parse_args()
    g, queries, gf, qf = bench_features.load(a.bench)
    idx = craterdex.Index.build(os.path.join(tempfile.mkdtemp(prefix="craterdex-fusion-"), "idx"), g, features=gf,
                                recipe=craterdex.Recipe(ivf="off"))
    pos = {i: n for n, i in enumerate(g["id"])}
    craters = g["crater_id"].to_numpy()
    relevant = np.array([[c in set(q["relevant_crater_ids"]) for c in craters] for q in queries])
    same = craters[:, None] == craters[None, :]
    np.fill_diagonal(same, False)
    others = same.sum(1)

    def grouped(s):
        out = s.copy()
        for i in np.nonzero(others)[0]:
            out[:, i] = np.maximum(s[:, i], s[:, same[i]].max(1))
        return out

    def mean_fused(s, beta):
        mean = (s @ same.T) / np.maximum(others, 1)
        return np.where(others > 0, (s + beta * mean) / (1 + beta), s)

    def expanded(s, sg, k, alpha):
        out = s.copy()
        for q in range(len(s)):
            top = np.argsort(-s[q])[:k]
            w = np.maximum(s[q, top], 0) ** alpha
            out[q] = (s[q] + (w[:, None] * sg[top]).sum(0)) / (1 + w.sum())
        return out

    print(f"{'':<34} mAP    R@1    R@5    R@10")
    for name, mode in (("late interaction (exhaustive)", "exhaustive"), ("single vector (CLS)", "stage1")):
        s = score_matrix(idx, qf, pos, mode)
        sg = score_matrix(idx, gf, pos, mode)
        print(f"{name}")
        print(f"  {'as ranked':<32} {metrics(s, relevant)}")
        print(f"  {'grouped by crater':<32} {metrics(grouped(s), relevant, s)}")
        for beta in (0.5, 1.0):
            print(f"  {f'mean fusion, beta {beta}':<32} {metrics(mean_fused(s, beta), relevant)}")
        for k, alpha in ((1, 0), (1, 3), (2, 3), (3, 3)):
            print(f"  {f'alpha QE, k {k}, alpha {alpha}':<32} {metrics(expanded(s, sg, k, alpha), relevant)}")


if __name__ == "__main__":
    main()
