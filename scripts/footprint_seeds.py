#!/usr/bin/env python3
"""Background suppression in the spirit of detect-to-retrieve: does choosing the instance
tokens' seeds on the crater itself beat choosing them over the whole crop? A measurement
through the Python package, on any CraterBench-R benchmark.

    python3 scripts/footprint_seeds.py --bench mars-rot

A catalogue crop knows where its crater is: at the centre, with a diameter of 1/context of
the crop's side (gallery views 2x and 3x, queries as their ``view_type`` says, e.g. q2.41x).
No identity label is used. Variants, all 32 instance tokens per image, PCA whitening learned
from 64 tokens of every gallery image, exhaustive late interaction in f32:

- fps: farthest-point seeds (the default recipe's);
- attn: the 32 tokens with the highest CLS attention;
- attn x footprint f: attention kept inside a disc of f crater radii around the centre and
  scaled by 1e-3 outside it, so seeds come from the crater while it has 32 tokens;
- central: the 32 tokens nearest the centre, whatever the crater's size.

Every token is still assigned to its nearest seed: only where the seeds lie changes. Prints
mAP and R@1. Features come from the feature cache when an eval of the benchmark ran before.
Needs `pip install ./crates/python`.
"""

import argparse
import os
import re
import tempfile

import numpy as np

import bench_features
import craterdex
from pair_whitening import average_precision, l2, pca_whitening


def context(view_type):
    m = re.fullmatch(r"q?([0-9.]+)x", view_type)
    if not m:
        raise SystemExit(f"view_type {view_type!r} does not say the crop's context (e.g. 2x, q2.41x)")
    return float(m.group(1))


def distance_in_radii(tokens, ctx):
    """Each patch's distance from the crop's centre in crater radii (a square patch grid)."""
    side = int(round(np.sqrt(tokens)))
    if side * side != tokens:
        raise SystemExit(f"{tokens} patch tokens are not a square grid")
    centres = (np.arange(side) + 0.5) / side - 0.5
    y, x = np.meshgrid(centres, centres, indexing="ij")
    radius = 0.5 / ctx  # the crater's radius as a fraction of the crop's side
    return (np.hypot(x, y) / radius).reshape(-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--footprints", default="1.0,1.5,2.0")
    a = ap.parse_args()
    g, queries, gf, qf = bench_features.load(a.bench)
    view_of = {e["image_id"]: e["view_type"] for e in bench_features.manifest(a.bench)["gallery_images"]}
    gctx = np.array([context(view_of[i]) for i in gf["ids"]])
    qctx = np.array([context(q["view_type"]) for q in queries])
    gp, qp = l2(gf["patches"].astype(np.float64)), l2(qf["patches"].astype(np.float64))
    t = gp.shape[1]
    gdist = np.array([distance_in_radii(t, c) for c in gctx])
    qdist = np.array([distance_in_radii(t, c) for c in qctx])
    rng = np.random.default_rng(0)
    mu, proj = pca_whitening(np.concatenate([p[rng.choice(len(p), min(64, len(p)), replace=False)] for p in gp]))
    gw = l2((gp - mu) @ proj).astype(np.float32)
    qw = l2((qp - mu) @ proj).astype(np.float32)
    print(f"{len(g)} gallery images, {len(queries)} queries, {t} patch tokens each")

    def measure(name, seeds, gatt, qatt):
        def feats(ids, cls, patches, att):
            return {"ids": ids, "cls": cls, "patches": patches, "attention": att.astype(np.float32)}
        idx = craterdex.Index.build(os.path.join(tempfile.mkdtemp(prefix="craterdex-footprint-"), "idx"), g,
                                    features=feats(list(gf["ids"]), gf["cls"], gw, gatt),
                                    recipe=craterdex.Recipe(codec="f32", ivf="off", whiten=False, seeds=seeds))
        wq = feats([q["image_id"] for q in queries], qf["cls"], qw, qatt)
        hits = idx.search(features=wq, top_k=len(g), mode="exhaustive", group_views=False)
        ranked = hits.sort_values(["query", "rank"]).groupby("query")["crater_id"].apply(list)
        aps = [average_precision(ranked[q["image_id"]], set(q["relevant_crater_ids"])) for q in queries]
        r1 = [ranked[q["image_id"]][0] in q["relevant_crater_ids"] for q in queries]
        print(f"{name:<24} {np.mean(aps):8.4f} {np.mean(r1):8.3f}", flush=True)

    print(f"{'seeds':<24} {'mAP':>8} {'R@1':>8}")
    measure("fps", "fps", gf["attention"], qf["attention"])
    measure("attn", "attn", gf["attention"], qf["attention"])
    for f in [float(x) for x in a.footprints.split(",")]:
        inside = lambda att, dist: att * np.where(dist <= f, 1.0, 1e-3)
        measure(f"attn x footprint {f}", "attn", inside(gf["attention"], gdist), inside(qf["attention"], qdist))
    measure("central", "attn", 1.0 / (1.0 + gdist), 1.0 / (1.0 + qdist))


if __name__ == "__main__":
    main()
