#!/usr/bin/env python3
"""Scores `craterdex search --manifest M --json` answers against M's relevant craters, as a
user would: the right crater first (R@1) and among the first five (R@5), overall and, where
the manifest's queries carry a sun (scripts/orbit_bench.py), by the sun's azimuth change from
the catalogue's and by its elevation.

Usage: scripts/score_search.py MANIFEST.json ANSWERS.json [--catalogue-azimuth 250]
Prints one table; --json writes the same numbers as JSON.
"""
import argparse
import json
import sys


def first_rank(results, relevant):
    """The rank of the first relevant crater among the distinct craters of `results`: a
    catalogue holding several views of one crater (several suns) answers with each, and the
    next crater, not the next view, is what a user reads second."""
    seen = []
    for hit in results:
        crater = hit.get("crater_id") or hit.get("id")
        if crater not in seen:
            seen.append(crater)
        if crater in relevant:
            return len(seen)
    return None


def azimuth_change(a, b):
    d = abs(a - b) % 360.0
    return min(d, 360.0 - d)


def score(manifest, answers, catalogue_azimuth):
    queries = {q["image_id"]: q for q in manifest["query_images"]}
    ranks = {}
    for a in answers:
        q = queries.get(a["query"])
        if q is None:
            sys.exit(f"{a['query']}: answered but not a query of the manifest")
        ranks[a["query"]] = first_rank(a["results"], set(q.get("relevant_crater_ids") or [q["crater_id"]]))
    missing = set(queries) - set(ranks)
    if missing:
        sys.exit(f"{len(missing)} of the manifest's queries have no answer (first: {sorted(missing)[0]})")

    def recall(ids, k):
        return sum(1 for i in ids if ranks[i] is not None and ranks[i] <= k) / max(len(ids), 1)

    rows = [("all", list(queries))]
    if all("sun_azimuth" in q for q in queries.values()):
        for lo, hi in ((0, 45), (45, 90), (90, 135), (135, 180.01)):
            rows.append((f"azimuth change {lo}-{min(hi, 180):.0f}", [
                i for i, q in queries.items()
                if lo <= azimuth_change(q["sun_azimuth"], catalogue_azimuth) < hi]))
        for lo, hi in ((10, 30), (30, 50), (50, 70.01)):
            rows.append((f"elevation {lo}-{min(hi, 70):.0f}", [
                i for i, q in queries.items() if lo <= q["sun_elevation"] < hi]))
    return [{"queries": name, "n": len(ids), "R@1": recall(ids, 1), "R@5": recall(ids, 5)}
            for name, ids in rows if ids]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("manifest")
    p.add_argument("answers")
    p.add_argument("--catalogue-azimuth", type=float, default=250.0)
    p.add_argument("--json", help="write the table as JSON here")
    args = p.parse_args()
    rows = score(json.load(open(args.manifest)), json.load(open(args.answers)), args.catalogue_azimuth)
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)
    print(f"{'queries':<24} {'n':>5} {'R@1':>6} {'R@5':>6}")
    for r in rows:
        print(f"{r['queries']:<24} {r['n']:>5} {r['R@1']:>6.3f} {r['R@5']:>6.3f}")


if __name__ == "__main__":
    main()
