"""A CraterBench-R benchmark and its features through the Python package, for the
measurement scripts beside this file (`pair_whitening.py`, `score_fusion.py`, `footprint_seeds.py`)."""

import json
import os
import tempfile

import numpy as np
import pandas as pd

import craterdex

REG = 1e-3  # whitening's regularisation, as in the index: this share of the largest eigenvalue


def manifest(bench):
    """The benchmark's splits/test.json."""
    return json.load(open(os.path.join(bench, "splits", "test.json")))


def load(bench, size=None):
    """The gallery table (id, crater_id, path), the query entries of splits/test.json, and the
    features of gallery and queries at input `size` (default: the model's; from the feature
    cache when an eval of `bench` ran at that size)."""
    m = manifest(bench)
    gallery, queries = m["gallery_images"], m["query_images"]
    g = pd.DataFrame({"id": [e["image_id"] for e in gallery], "crater_id": [e["crater_id"] for e in gallery],
                      "path": [os.path.join(bench, e["path"]) for e in gallery]})
    model = craterdex.Model.load(size=size)
    print(craterdex.cpu())
    gf = model.extract(list(g["path"]), ids=list(g["id"]))
    qf = model.extract([os.path.join(bench, q["path"]) for q in queries], ids=[q["image_id"] for q in queries])
    return g, queries, gf, qf


def l2(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def sorted_eig(c):
    w, v = np.linalg.eigh(c)
    order = np.argsort(-w)
    return w[order], v[:, order]


def pca_whitening(samples):
    mu = samples.mean(0)
    w, v = sorted_eig(np.cov((samples - mu).T))
    w = np.maximum(w, 0) + REG * w.max()
    return mu, v / np.sqrt(w)


def token_sample(patches, per_image=64, seed=0):
    """`per_image` random tokens of every image (the index's whitening learn sample)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([p[rng.choice(len(p), min(per_image, len(p)), replace=False)] for p in patches])


def pca_whitened_tokens(gallery_patches, *others):
    """Unit patch tokens whitened by PCA learned from a token sample of the gallery, gallery
    first, then each of `others`, as float32."""
    unit = [l2(p.astype(np.float64)) for p in (gallery_patches, *others)]
    mu, proj = pca_whitening(token_sample(unit[0]))
    return [l2((p - mu) @ proj).astype(np.float32) for p in unit]


def average_precision(ranked, relevant):
    hits, total = 0, 0.0
    n = sum(c in relevant for c in ranked)
    for i, c in enumerate(ranked, 1):
        if c in relevant:
            hits += 1
            total += hits / i
    return total / n


def prewhitened_index(g, gallery, seeds="fps"):
    """An f32 index of gallery features that are already whitened (a dict as `Model.extract`
    returns; the index adds no whitening and no IVF)."""
    return craterdex.Index.build(os.path.join(tempfile.mkdtemp(prefix="craterdex-measure-"), "idx"), g,
                                 features=gallery, recipe=craterdex.Recipe(codec="f32", ivf="off", whitening="none",
                                                                           seeds=seeds))


def ranking_metrics(idx, g, queries, query, mode="exhaustive"):
    """mAP and R@1 of `query` features (prepared as the index's) searched in `mode`, every
    gallery image ranked, views not grouped."""
    hits = idx.search(features=query, top_k=len(g), mode=mode, group_views=False)
    ranked = hits.sort_values(["query", "rank"]).groupby("query")["crater_id"].apply(list)
    aps = [average_precision(ranked[q["image_id"]], set(q["relevant_crater_ids"])) for q in queries]
    r1 = [ranked[q["image_id"]][0] in q["relevant_crater_ids"] for q in queries]
    return float(np.mean(aps)), float(np.mean(r1))
