#!/usr/bin/env python3
"""Does whitening learned from the catalogue's own matching pairs beat PCA whitening? A
measurement through the Python package, on any CraterBench-R benchmark.

    python3 scripts/pair_whitening.py --bench mars-rot --alphas 0.5,0.65

The gallery holds two views (2x and 3x context) of every crater: two pictures of one
instance, a matching pair for free. Only craters that no query looks for are used, so no
query crater's label is. Token pairs are the mutual nearest patch tokens of the two views;
CLS pairs are the two views' CLS tokens. Pair whitening (Radenovic et al., learned
whitening) whitens by the covariance of matching-pair differences, then rotates by PCA in
that space; ``alpha`` blends the pair covariance with the total covariance (1: pair only,
0: PCA whitening), both scaled to unit trace. Regularisation as in the index (1e-3 of the
largest eigenvalue).

Prints mAP of exhaustive late interaction (32 FPS instance tokens, f32) and of the CLS
single vector, for no whitening, PCA whitening (the index's, learned here from the same 64
tokens per gallery image) and pair whitening at each alpha. Features come from the feature
cache when an eval of the same benchmark ran before. Needs `pip install ./crates/python`.
"""

import argparse

import numpy as np

import bench_features
from bench_features import REG, l2, pca_whitening, sorted_eig


def pair_whitening(samples, a, b, alpha):
    mu = samples.mean(0)
    pairs = np.cov((a - b).T)
    total = np.cov((samples - mu).T)
    c = alpha * pairs / np.trace(pairs) + (1 - alpha) * total / np.trace(total)
    w, v = np.linalg.eigh(c)
    w = np.maximum(w, 0) + REG * w.max()
    to_white = v @ np.diag(w ** -0.5) @ v.T
    _, rot = sorted_eig(np.cov(((samples - mu) @ to_white).T))
    return mu, to_white @ rot


def mutual_nearest(a, b):
    s = a @ b.T
    ab, ba = s.argmax(1), s.argmax(0)
    i = np.nonzero(ba[ab] == np.arange(len(a)))[0]
    return i, ab[i]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--alphas", default="1.0,0.65,0.5,0.35")
    a = ap.parse_args()
    g, queries, gf, qf = bench_features.load(a.bench)
    gp, qp = l2(gf["patches"].astype(np.float64)), l2(qf["patches"].astype(np.float64))
    gc, qc = l2(gf["cls"].astype(np.float64)), l2(qf["cls"].astype(np.float64))
    d = gc.shape[1]
    token_samples = bench_features.token_sample(gp)

    queried = {c for q in queries for c in q["relevant_crater_ids"]}
    views = g[~g["crater_id"].isin(queried)].groupby("crater_id").groups  # labels of g: its rows
    ta, tb, ca, cb = [], [], [], []
    for rows in views.values():
        if len(rows) < 2:
            continue
        i, j = int(rows[0]), int(rows[1])
        ii, jj = mutual_nearest(gp[i], gp[j])
        ta.append(gp[i][ii])
        tb.append(gp[j][jj])
        ca.append(gc[i])
        cb.append(gc[j])
    ta, tb, ca, cb = np.concatenate(ta), np.concatenate(tb), np.array(ca), np.array(cb)
    print(f"{len(g)} gallery images, {len(queries)} queries; {len(views)} craters no query looks for, "
          f"{len(ca)} of them with two views: {len(ta)} mutual-nearest token pairs")

    def measure(name, token_w, cls_w):
        (tmu, tproj), (cmu, cproj) = token_w, cls_w
        feats = lambda ids, c, p, att: {"ids": ids, "cls": l2((c - cmu) @ cproj).astype(np.float32),
                                        "patches": l2((p - tmu) @ tproj).astype(np.float32), "attention": att}
        wg = feats(list(g["id"]), gc, gp, gf["attention"])
        wq = feats([q["image_id"] for q in queries], qc, qp, qf["attention"])
        idx = bench_features.prewhitened_index(g, wg)
        out = [bench_features.ranking_metrics(idx, g, queries, wq, mode)[0] for mode in ("exhaustive", "stage1")]
        print(f"{name:<22} {out[0]:10.4f} {out[1]:10.4f}", flush=True)

    print(f"{'whitening':<22} {'LI mAP':>10} {'CLS mAP':>10}")
    plain = (np.zeros(d), np.eye(d))
    measure("none", plain, plain)
    measure("PCA", pca_whitening(token_samples), pca_whitening(gc))
    for alpha in [float(x) for x in a.alphas.split(",")]:
        measure(f"pairs, alpha {alpha}", pair_whitening(token_samples, ta, tb, alpha),
                pair_whitening(gc, ca, cb, alpha))


if __name__ == "__main__":
    main()
