#!/usr/bin/env python3
"""Detect, then link, on real tiles seen a second time: how many catalogue craters
`craterdex link --image` finds and links to the right entry, and how many craters missing
from the catalogue it reports `new`.

Per tile (an image and its labelled craters in pixels, NAC or pycda format):
- the catalogue: a crop (side 2 diameters) of every labelled crater of at least 16 px whose
  crop fits in the tile, except a held-out share of those of at least 20 px (chosen at
  random: the craters missing from the catalogue), with its position (cat/, cat.csv);
  indexed with `craterdex index build`;
- the second observation: the whole tile turned by a random angle (up to 180 degrees either
  way), scaled 0.75-1.3, with another gamma and contrast, then blurred or noised, on a
  canvas holding all of it (black outside the tile), with no crater list. The same pixels
  as the catalogue's crops, resampled: not an independent second image (no other sun, no
  other noise of the sensor);
- `craterdex link --index cat-index --image new.png --out links`.
Scored against the labels, each row of links.csv mapped back to the tile (the rule of
craterdex_eval::detection: centre within 0.25 D + 2 px, diameter within 1.5x):
- catalogue craters >= 20 px: a `match` row is right when its catalogue crater is the
  labelled crater at its position; precision over match rows of those craters, recall over
  the craters;
- held-out craters >= 20 px: reported `new` when a `new` row is at its position.
Needs numpy and pillow. Usage:
  CRATERDEX_BIN=... python3 scripts/detect_then_link.py WORKDIR SEED TILE.png TILE.txt [TILE LABELS]...
Extra craterdex options (a detector, thresholds) go in CRATERDEX_LINK_ARGS.
"""
import csv, json, math, os, random, shlex, subprocess, sys
import numpy as np
from PIL import Image, ImageFilter

from crater_labels import read_labels

HELD_OUT = 0.2


def labels_of(path):
    return {"c" + i: (x, y, d) for i, x, y, d in read_labels(path)}


def second_observation(img, rng):
    """The tile turned, scaled and relit; returns the image and new->tile mapping."""
    W, H = img.size
    theta = math.radians(rng.uniform(-180, 180))
    s = rng.uniform(0.75, 1.3)
    c, n = math.cos(theta), math.sin(theta)
    # tile -> new: p' = s R (p - c0) + c1
    corners = [(-W / 2, -H / 2), (W / 2, -H / 2), (-W / 2, H / 2), (W / 2, H / 2)]
    xs = [s * (c * x - n * y) for x, y in corners]
    ys = [s * (n * x + c * y) for x, y in corners]
    W2, H2 = int(math.ceil(max(xs) - min(xs))), int(math.ceil(max(ys) - min(ys)))
    c0, c1 = (W / 2, H / 2), (W2 / 2, H2 / 2)

    def to_tile(x, y):
        dx, dy = (x - c1[0]) / s, (y - c1[1]) / s
        return c0[0] + c * dx + n * dy, c0[1] - n * dx + c * dy

    a, d_ = c / s, -n / s
    b, e = n / s, c / s
    coeffs = (a, b, c0[0] - a * c1[0] - b * c1[1], d_, e, c0[1] - d_ * c1[0] - e * c1[1])
    new = img.transform((W2, H2), Image.AFFINE, coeffs, resample=Image.BILINEAR)
    arr = np.asarray(new, dtype=np.float32) / 255.0
    inside = np.asarray(img.point(lambda v: 255).transform((W2, H2), Image.AFFINE, coeffs)) > 0
    gamma, contrast = rng.uniform(0.7, 1.4), rng.uniform(0.8, 1.2)
    arr = np.clip((arr ** gamma - 0.5) * contrast + 0.5, 0, 1)
    out = Image.fromarray((arr * 255).round().astype(np.uint8))
    if rng.random() < 0.5:
        out, wear = out.filter(ImageFilter.GaussianBlur(rng.uniform(0.5, 1.2))), "blur"
    else:
        noise = np.random.default_rng(rng.randrange(1 << 30)).normal(0, rng.uniform(2, 6), arr.shape)
        out, wear = Image.fromarray(np.clip(np.asarray(out) + noise, 0, 255).round().astype(np.uint8)), "noise"
    out = Image.fromarray(np.where(inside, np.asarray(out), 0).astype(np.uint8))
    return out, to_tile, dict(rotation_deg=math.degrees(theta), scale=s, gamma=gamma, contrast=contrast, wear=wear)


def run_tile(work, seed, tile, labels_path, exe, extra):
    os.makedirs(f"{work}/cat", exist_ok=True)
    rng = random.Random(seed)
    img = Image.open(tile).convert("L")
    W, H = img.size
    lab = labels_of(labels_path)
    fits = [k for k, (x, y, d) in lab.items() if d >= 16 and x - d >= 0 and y - d >= 0 and x + d <= W - 1 and y + d <= H - 1]
    big = sorted(k for k in fits if lab[k][2] >= 20)
    held = set(rng.sample(big, round(HELD_OUT * len(big))))
    rows = ["id,crater_id,source,x,y,diameter_px"]
    catalogue = [k for k in fits if k not in held]
    for k in catalogue:
        x, y, d = lab[k]
        img.crop((round(x - d), round(y - d), round(x + d), round(y + d))).save(f"{work}/cat/{k}.png")
        rows.append(f"{k},{k},catalogue,{x:.2f},{y:.2f},{d:.2f}")
    open(f"{work}/cat.csv", "w").write("\n".join(rows) + "\n")
    new, to_tile, how = second_observation(img, rng)
    new.save(f"{work}/new.png")
    run = lambda *a: subprocess.run([exe, *a], cwd=work, check=True, stdout=subprocess.DEVNULL)
    run("index", "build", "--dir", "cat", "--out", "cat-index")
    run("link", "--index", "cat-index", "--image", "new.png", "--out", "links", *extra)
    links = list(csv.DictReader(open(f"{work}/links/links.csv")))
    image_row = next(csv.DictReader(open(f"{work}/links/images.csv")))

    def truth(r):
        x, y = to_tile(float(r["x"]), float(r["y"]))
        d = float(r["diameter_px"]) / how["scale"]
        hits = [(math.hypot(x - tx, y - ty), c) for c, (tx, ty, td) in lab.items()
                if math.hypot(x - tx, y - ty) <= 0.25 * td + 2 and max(d, td) / min(d, td) <= 1.5]
        return min(hits)[1] if hits else None

    cat20 = {k for k in catalogue if lab[k][2] >= 20}
    right, wrong = set(), 0
    for r in links:
        if r["decision"] == "match" and r["catalogue_crater_id"] in cat20:
            if truth(r) == r["catalogue_crater_id"]:
                right.add(r["catalogue_crater_id"])
            else:
                wrong += 1
    n_right_rows = sum(1 for r in links if r["decision"] == "match" and r["catalogue_crater_id"] in cat20 and truth(r) == r["catalogue_crater_id"])
    new_rows = [r for r in links if r["decision"] == "new"]
    new_found = {truth(r) for r in new_rows} & held
    held_detected = {truth(r) for r in links if r["found_by"] == "detector"} & held
    false_new = sum(1 for r in new_rows if truth(r) in set(catalogue))
    by_detector = {r["catalogue_crater_id"] for r in links if r["decision"] == "match" and r["found_by"] == "detector"} & right
    return dict(
        tile=os.path.basename(tile), **how, registered=image_row["registered"] == "true",
        registered_rotation=image_row["rotation_deg"], catalogue_20=len(cat20), right_rows=n_right_rows,
        wrong_rows=wrong, linked_right=len(right), linked_right_by_detector=len(by_detector),
        held_out_20=len(held), held_detected=len(held_detected), new_found=len(new_found), new_rows=len(new_rows), new_rows_on_catalogue=false_new,
        detections=int(image_row["detections"]), looked_for=int(image_row["looked_for"]))


def main():
    work, seed = sys.argv[1], int(sys.argv[2])
    pairs = list(zip(sys.argv[3::2], sys.argv[4::2]))
    exe = os.environ.get("CRATERDEX_BIN", "craterdex")
    extra = shlex.split(os.environ.get("CRATERDEX_LINK_ARGS", ""))
    results = []
    for i, (tile, labels) in enumerate(pairs):
        r = run_tile(f"{work}/{i:02d}", seed * 1000 + i, tile, labels, exe, extra)
        p = r["right_rows"] / max(r["right_rows"] + r["wrong_rows"], 1)
        rc = r["linked_right"] / max(r["catalogue_20"], 1)
        print(f"{r['tile']}: turned {r['rotation_deg']:.0f} deg, scale {r['scale']:.2f}, {r['wear']}; registered {r['registered']} "
              f"({r['registered_rotation']}); catalogue >= 20 px {r['catalogue_20']}: linked right {r['linked_right']} "
              f"({r['linked_right_by_detector']} by detection), wrong rows {r['wrong_rows']}: P {p:.3f} R {rc:.3f}; "
              f"held out {r['held_out_20']}: detected {r['held_detected']}, reported new {r['new_found']} (new rows {r['new_rows']}, "
              f"{r['new_rows_on_catalogue']} on catalogue craters)", flush=True)
        results.append(r)
    right = sum(r["right_rows"] for r in results)
    wrong = sum(r["wrong_rows"] for r in results)
    p = right / max(right + wrong, 1)
    rc = sum(r["linked_right"] for r in results) / max(sum(r["catalogue_20"] for r in results), 1)
    nr = sum(r["new_found"] for r in results) / max(sum(r["held_out_20"] for r in results), 1)
    total = dict(precision=p, recall=rc, f1=2 * p * rc / max(p + rc, 1e-9), new_recall=nr,
                 registered=sum(r["registered"] for r in results), tiles=len(results))
    print(json.dumps(total))
    json.dump(dict(tiles=results, total=total), open(f"{work}/results.json", "w"), indent=1)


if __name__ == "__main__":
    main()
