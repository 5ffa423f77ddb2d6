#!/usr/bin/env python3
"""Overlapping images with no crater list, grouped: how many craters two overlapping
observations share that `craterdex dedup --image` groups, and how many of its groups across
the images join different craters.

Per tile (an image and its labelled craters in pixels, NAC or pycda format):
- image A: the tile's left 65%, as it is;
- image B: the tile's right 65% (so 30% of the tile is in both), then turned, scaled and
  relit as scripts/detect_then_link.py makes a second observation (turned up to 180
  degrees, scaled 0.75-1.3, other gamma and contrast, blurred or noised). The same pixels
  resampled: not an independent second image;
- `craterdex dedup --image a.png b.png --out dedup` with the default detector and the
  default (uncalibrated) rule: nothing here is tuned.
Scored from crops.csv and groups.csv, each crop mapped back to the tile:
- recall: of the labelled craters that both images have a crop of (the detector found them
  in both, their crop whole), the share whose two crops are in one group; all sizes, and
  those of at least 20 px;
- precision: of the pairs of crops from A and B in one group, the share whose centres lie
  within 0.25 D + 2 px of each other on the tile with diameters within 1.5x (one crater).
Needs numpy and pillow. Usage:
  CRATERDEX_BIN=... python3 scripts/dedup_images.py WORKDIR SEED TILE.png TILE.txt [TILE LABELS]...
"""
import csv, json, math, os, random, subprocess, sys
from collections import defaultdict

from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from detect_then_link import labels_of, second_observation  # noqa: E402

SHARE = 0.65


def run_tile(work, seed, tile, labels_path, exe):
    os.makedirs(work, exist_ok=True)
    rng = random.Random(seed)
    img = Image.open(tile).convert("L")
    W, H = img.size
    lab = labels_of(labels_path)
    part = round(SHARE * W)
    offset = W - part
    img.crop((0, 0, part, H)).save(f"{work}/a.png")
    b, to_window, how = second_observation(img.crop((offset, 0, W, H)), rng)
    b.save(f"{work}/b.png")
    subprocess.run([exe, "dedup", "--image", "a.png", "b.png", "--out", "dedup"], cwd=work, check=True,
                   stdout=subprocess.DEVNULL)
    on_tile = {}
    for r in csv.DictReader(open(f"{work}/dedup/crops.csv")):
        x, y, d = float(r["x"]), float(r["y"]), float(r["diameter_px"])
        if r["source"] == "b":
            x, y = to_window(x, y)
            x, d = x + offset, d / how["scale"]
        on_tile[r["id"]] = (r["source"], x, y, d)

    def crater_at(x, y, d):
        hits = [(math.hypot(x - tx, y - ty), c) for c, (tx, ty, td) in lab.items()
                if math.hypot(x - tx, y - ty) <= 0.25 * td + 2 and max(d, td) / min(d, td) <= 1.5]
        return min(hits)[1] if hits else None

    crops_of = defaultdict(dict)
    for cid, (src, x, y, d) in on_tile.items():
        c = crater_at(x, y, d)
        if c is not None:
            crops_of[c][src] = cid
    group_of = {}
    members = defaultdict(list)
    for r in csv.DictReader(open(f"{work}/dedup/groups.csv")):
        group_of[r["id"]] = r["group"]
        members[r["group"]].append(r["id"])
    both = [c for c, by in crops_of.items() if "a" in by and "b" in by]
    grouped = [c for c in both if group_of.get(crops_of[c]["a"]) is not None
               and group_of.get(crops_of[c]["a"]) == group_of.get(crops_of[c]["b"])]
    big = {c for c in both if lab[c][2] >= 20}
    right = wrong = 0
    for ids in members.values():
        for i in ids:
            for j in ids:
                (si, xi, yi, di), (sj, xj, yj, dj) = on_tile[i], on_tile[j]
                if si != "a" or sj != "b":
                    continue
                d = (di + dj) / 2
                if math.hypot(xi - xj, yi - yj) <= 0.25 * d + 2 and max(di, dj) / min(di, dj) <= 1.5:
                    right += 1
                else:
                    wrong += 1
    reg = list(csv.DictReader(open(f"{work}/dedup/registrations.csv")))
    return dict(tile=os.path.basename(tile), **how, registrations=reg, crops=len(on_tile), groups=len(members),
                shared=len(both), grouped=len(grouped), shared_20=len(big), grouped_20=len(big & set(grouped)),
                pairs_right=right, pairs_wrong=wrong)


def main():
    work, seed = sys.argv[1], int(sys.argv[2])
    pairs = list(zip(sys.argv[3::2], sys.argv[4::2]))
    exe = os.environ.get("CRATERDEX_BIN", "craterdex")
    results = []
    for i, (tile, labels) in enumerate(pairs):
        r = run_tile(f"{work}/{i:02d}", seed * 1000 + i, tile, labels, exe)
        regs = "; ".join(f"{g['source']} registered {g['registered']} ({g.get('rotation_deg', '')})" for g in r["registrations"])
        print(f"{r['tile']}: B turned {r['rotation_deg']:.0f} deg, scale {r['scale']:.2f}, {r['wear']}; {regs}; "
              f"{r['crops']} crops, {r['groups']} groups; labelled craters in both {r['shared']}: grouped {r['grouped']} "
              f"(>= 20 px: {r['shared_20']}, {r['grouped_20']}); "
              f"pairs across the images right {r['pairs_right']}, wrong {r['pairs_wrong']}", flush=True)
        results.append(r)
    right = sum(r["pairs_right"] for r in results)
    wrong = sum(r["pairs_wrong"] for r in results)
    p = right / max(right + wrong, 1)
    recall = {k: sum(r["grouped" + k] for r in results) / max(sum(r["shared" + k] for r in results), 1)
              for k in ("", "_20")}
    total = dict(precision=p, recall=recall[""], recall_20=recall["_20"],
                 shared=sum(r["shared"] for r in results), shared_20=sum(r["shared_20"] for r in results),
                 registered=sum(all(g["registered"] == "true" for g in r["registrations"]) for r in results),
                 tiles=len(results))
    print(json.dumps(total))
    json.dump(dict(tiles=results, total=total), open(f"{work}/results.json", "w"), indent=1)


if __name__ == "__main__":
    main()
