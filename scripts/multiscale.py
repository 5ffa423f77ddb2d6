#!/usr/bin/env python3
"""Multi-scale extraction: do the tokens of one crop seen at two input sizes, pooled into one
set of instance tokens, beat one size? A measurement through the Python package, on any
CraterBench-R benchmark.

    python3 scripts/multiscale.py --bench mars-rot --sizes 224,322

For each size alone and for all sizes together (patch tokens and attention concatenated, so
the 32 FPS instance tokens are chosen from both grids; CLS averaged), 32 instance tokens per
image, PCA whitening learned from 64 tokens of every gallery image, exhaustive late
interaction in f32. Bytes per image and search time are those of one size; extraction costs
one forward pass per size (a 322 px pass has 529 tokens to 224's 256). Prints mAP and R@1.
Features come from the feature cache when an eval (or this script) ran at that size.
Needs `pip install ./crates/python`.
"""

import argparse

import numpy as np

import bench_features


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--sizes", default="224,322")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    per_size = {s: bench_features.load(a.bench, size=s) for s in sizes}
    g, queries = per_size[sizes[0]][:2]

    def measure(name, gf, qf):
        gw, qw = bench_features.pca_whitened_tokens(gf["patches"], qf["patches"])
        idx = bench_features.prewhitened_index(g, dict(gf, patches=gw))
        m, r1 = bench_features.ranking_metrics(idx, g, queries, dict(qf, patches=qw))
        print(f"{name:<16} {gw.shape[1]:7d} {m:8.4f} {r1:8.3f}", flush=True)

    def together(which):
        feats = [per_size[s][which] for s in sizes]
        if any(f["ids"] != feats[0]["ids"] for f in feats):
            raise SystemExit("the sizes did not read the same images")
        return {"ids": feats[0]["ids"], "cls": np.mean([f["cls"] for f in feats], axis=0),
                "patches": np.concatenate([f["patches"] for f in feats], axis=1),
                "attention": np.concatenate([f["attention"] for f in feats], axis=1)}

    print(f"{'input size':<16} {'tokens':>7} {'mAP':>8} {'R@1':>8}")
    for s in sizes:
        measure(f"{s}", per_size[s][2], per_size[s][3])
    measure("+".join(map(str, sizes)), together(2), together(3))


if __name__ == "__main__":
    main()
