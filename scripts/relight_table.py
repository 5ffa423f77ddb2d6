#!/usr/bin/env python3
"""What each change of sun costs, from `craterdex eval --json` runs on the relit benchmark.

Usage: scripts/relight_table.py BENCH REGIME LABEL=PREFIX [LABEL=PREFIX ...]

BENCH is scripts/relight_bench.py's output (its metadata/relight.json names the suns);
each PREFIX names the runs of one recipe: PREFIX<sun>.json for every sun other than the
reference, e.g. `craterdex eval --manifest BENCH/splits/test.json --rotated
BENCH/splits/test_az270_el30.json --quick --json runs/default_az270_el30.json` gives
default_=runs/default_. Prints, per recipe and sun, REGIME's R@1 and mAP under the reference
sun and under the other sun (paired view by view) and the loss, as a Markdown table.
"""
import json
import pathlib
import sys


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    bench, regime = pathlib.Path(sys.argv[1]), sys.argv[2]
    recipes = [a.split("=", 1) for a in sys.argv[3:]]
    meta = json.loads((bench / "metadata" / "relight.json").read_text())
    suns = [s for s in meta["suns"] if s["split"] != "test"]
    ref = meta["reference_sun"]
    print(f"Reference sun: azimuth {ref['azimuth']:.0f}, elevation {ref['elevation']:.0f} degrees; "
          f"{meta['craters']} craters; regime {regime}\n")
    print("| recipe | azimuth change | elevation | R@1 same sun | R@1 | R@1 loss | mAP same sun | mAP | mAP loss |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, prefix in recipes:
        for s in sorted(suns, key=lambda s: (s["elevation"] != ref["elevation"], s["elevation"], s["azimuth_change"])):
            path = pathlib.Path(f"{prefix}{s['split'].removeprefix('test_')}.json")
            if not path.exists():
                print(f"| {label} | {s['azimuth_change']:.0f} | {s['elevation']:.0f} | (no {path}) |||||")
                continue
            rows = {r["regime"]: r for r in json.loads(path.read_text())["turned_paired"]["rows"]}
            r = rows[regime]
            print(f"| {label} | {s['azimuth_change']:.0f} | {s['elevation']:.0f} | {r['R@1']:.3f} | {r['R@1_turned']:.3f} | "
                  f"{r['R@1'] - r['R@1_turned']:+.3f} | {r['map']:.3f} | {r['map_turned']:.3f} | {r['map'] - r['map_turned']:+.3f} |")


if __name__ == "__main__":
    main()
