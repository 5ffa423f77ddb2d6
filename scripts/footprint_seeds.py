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
import re

import numpy as np

import bench_features


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
    gw, qw = bench_features.pca_whitened_tokens(gf["patches"], qf["patches"])
    t = gw.shape[1]
    gdist = np.array([distance_in_radii(t, c) for c in gctx])
    qdist = np.array([distance_in_radii(t, c) for c in qctx])
    print(f"{len(g)} gallery images, {len(queries)} queries, {t} patch tokens each")

    def measure(name, seeds, gatt, qatt):
        gallery = dict(gf, patches=gw, attention=gatt.astype(np.float32))
        query = dict(qf, patches=qw, attention=qatt.astype(np.float32))
        m, r1 = bench_features.ranking_metrics(bench_features.prewhitened_index(g, gallery, seeds), g, queries, query)
        print(f"{name:<24} {m:8.4f} {r1:8.3f}", flush=True)

    print(f"{'seeds':<24} {'mAP':>8} {'R@1':>8}")
    measure("fps", "fps", gf["attention"], qf["attention"])
    measure("attn", "attn", gf["attention"], qf["attention"])
    for f in [float(x) for x in a.footprints.split(",")]:
        inside = lambda att, dist: att * np.where(dist <= f, 1.0, 1e-3)
        measure(f"attn x footprint {f}", "attn", inside(gf["attention"], gdist), inside(qf["attention"], qdist))
    measure("central", "attn", 1.0 / (1.0 + gdist), 1.0 / (1.0 + qdist))


if __name__ == "__main__":
    main()
