#!/usr/bin/env python3
"""Compares two `craterdex eval --json` results regime by regime (mAP and R@1).

Usage: scripts/compare_eval.py BASE.json OTHER.json
Prints each shared regime's mAP in both runs, the difference, and the largest |difference|.
"""
import json
import sys


def regimes(path):
    return json.load(open(path))["regimes"]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    base, other = regimes(sys.argv[1]), regimes(sys.argv[2])
    worst = 0.0
    print(f"{'regime':<32} {'mAP base':>9} {'mAP other':>9} {'diff':>8} {'R@1 base':>9} {'R@1 other':>9}")
    for name in sorted(set(base) & set(other)):
        x, y = base[name], other[name]
        diff = y["mAP"] - x["mAP"]
        worst = max(worst, abs(diff))
        print(f"{name:<32} {x['mAP']:>9.4f} {y['mAP']:>9.4f} {diff:>+8.4f} {x['R@1']:>9.3f} {y['R@1']:>9.3f}")
    print(f"largest |mAP difference|: {worst:.4f} over {len(set(base) & set(other))} regimes")


if __name__ == "__main__":
    main()
