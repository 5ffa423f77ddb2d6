#!/usr/bin/env python3
"""Detect, then link, on a real NAC tile seen again turned: how many catalogue craters the
two commands find and link to the right entry.

The catalogue: a crop (side 2 diameters) of every labelled crater of at least 16 px of the
tile that fits inside it, with its position (cat/ and cat.csv), indexed. The new observation:
the same tile turned 90 degrees (exactly, the same pixels: a re-crop of the catalogue's own
image, not a second observation), with no crater list. Then
  craterdex detect new.png --out found --crops
  craterdex link --index cat-index --entries found/crops --out links
and each `match` is checked against the labels (the detection's centre turned back; the
rule of craterdex_eval::detection: centre within 0.25 D + 2 px, diameter within 1.5x).
Needs numpy and pillow. Usage: CRATERDEX_BIN=... python3 scripts/detect_then_link.py TILE.png TILE.txt WORKDIR
"""
import csv, os, subprocess, sys
import numpy as np
from PIL import Image

tile, labels, work = sys.argv[1:4]
exe = os.environ.get("CRATERDEX_BIN", "craterdex")
os.makedirs(f"{work}/cat", exist_ok=True)
img = Image.open(tile).convert("L")
W, H = img.size
lab = {}
for r in csv.DictReader(open(labels)):
    lab["c" + r["ID"]] = (float(r["C_X"]), float(r["CY"]), (float(r["W"]) + float(r["H"])) / 2)
rows = ["id,crater_id,source,x,y,diameter_px"]
for cid, (x, y, d) in lab.items():
    if d < 16 or x - d < 0 or y - d < 0 or x + d > W - 1 or y + d > H - 1:
        continue
    img.crop((round(x - d), round(y - d), round(x + d), round(y + d))).save(f"{work}/cat/{cid}.png")
    rows.append(f"{cid},{cid},first,{x:.2f},{y:.2f},{d:.2f}")
open(f"{work}/cat.csv", "w").write("\n".join(rows) + "\n")
img.transpose(Image.ROTATE_90).save(f"{work}/new.png")  # new (x', y') is old (W - 1 - y', x')
run = lambda *a: subprocess.run([exe, *a], cwd=work, check=True)
run("index", "build", "--dir", "cat", "--out", "cat-index")
run("detect", "new.png", "--out", "found", "--crops")
run("link", "--index", "cat-index", "--entries", "found/crops", "--out", "links")

cat = {r["id"]: lab[r["id"]] for r in csv.DictReader(open(f"{work}/cat.csv"))}
det = {r["id"]: tuple(float(r[k]) for k in ("x", "y", "diameter_px")) for r in csv.DictReader(open(f"{work}/found/crops.csv"))}
links = list(csv.DictReader(open(f"{work}/links/links.csv")))

def truth(q):
    x2, y2, d = det[q]
    x, y = W - 1 - y2, x2
    hits = [(np.hypot(x - tx, y - ty), c) for c, (tx, ty, td) in lab.items()
            if np.hypot(x - tx, y - ty) <= 0.25 * td + 2 and max(d, td) / min(d, td) <= 1.5]
    return min(hits)[1] if hits else None

matches = [r for r in links if r["decision"] == "match"]
for lo in (16, 20):
    big = {c for c, v in cat.items() if v[2] >= lo}
    right = {r["best_crater_id"] for r in matches if r["best_crater_id"] in big and truth(r["query"]) == r["best_crater_id"]}
    wrong = [r for r in matches if r["best_crater_id"] in big and truth(r["query"]) != r["best_crater_id"]]
    detected = {truth(q) for q in det} & big
    p = len(right) / max(len(right) + len(wrong), 1)
    rc = len(right) / len(big)
    print(f"catalogue craters >= {lo} px: {len(big)}; linked right {len(right)}, wrong {len(wrong)}: "
          f"precision {p:.3f}, recall {rc:.3f}, F1 {2 * p * rc / max(p + rc, 1e-9):.3f}; "
          f"detected at all {len(detected)} (the recall the detector allows: {len(detected) / len(big):.3f})")
new = [r for r in links if r["decision"] == "new"]
print(f"decided new: {len(new)}, of which outside the catalogue: {sum(1 for r in new if truth(r['query']) not in cat)}; "
      f"ambiguous: {sum(1 for r in links if r['decision'] == 'ambiguous')}")
