"""A CraterBench-R benchmark and its features through the Python package, for the
measurement scripts beside this file (`pair_whitening.py`, `score_fusion.py`, `footprint_seeds.py`)."""

import json
import os

import pandas as pd

import craterdex


def manifest(bench):
    """The benchmark's splits/test.json."""
    return json.load(open(os.path.join(bench, "splits", "test.json")))


def load(bench):
    """The gallery table (id, crater_id, path), the query entries of splits/test.json, and the
    features of gallery and queries (from the feature cache when an eval of `bench` ran)."""
    m = manifest(bench)
    gallery, queries = m["gallery_images"], m["query_images"]
    g = pd.DataFrame({"id": [e["image_id"] for e in gallery], "crater_id": [e["crater_id"] for e in gallery],
                      "path": [os.path.join(bench, e["path"]) for e in gallery]})
    model = craterdex.Model.load()
    print(craterdex.cpu())
    gf = model.extract(list(g["path"]), ids=list(g["id"]))
    qf = model.extract([os.path.join(bench, q["path"]) for q in queries], ids=[q["image_id"] for q in queries])
    return g, queries, gf, qf
