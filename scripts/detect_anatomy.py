"""Where a detector's errors lie on labelled NAC tiles (standard library only).

    python3 scripts/detect_anatomy.py misses DETECTIONS.csv LABEL_DIR
        `craterdex detect` rows (x, y, diameter_px, source) against LABEL_DIR/<source>.txt:
        each crater of 20 px or more not found, and each detection of 20 px or more found on
        no crater, sorted by what lies near it.
    python3 scripts/detect_anatomy.py taught [--levels-per-octave N] LABELS.txt...
        The ceiling of the reading: each pyramid level's taught map (the central half of each
        crater the level reports, 1 inside, 0 outside), read back as `detect` reads a
        likelihood (4-connected regions as circles of their area, N levels an octave, 2 by
        default, merged), scored as `eval-detect` scores.

Matching as crates/eval/src/detection.rs: centre within 0.25 D + 2 px, diameter within 1.5x,
one to one, closest first. The pyramid and merging as crates/detect/src/detect.rs; keep them
in step.
"""
import collections
import csv
import math
import sys

from crater_labels import circles

SMALLEST = 20.0
# crates/detect/src/detect.rs, MERGE_SIZE_RATIO and CONCENTRIC_SHARE
MERGE_SIZE_RATIO, CONCENTRIC_SHARE = 3.0, 0.35


def same_crater(a, b):
    """As crates/detect/src/detect.rs, same_crater."""
    larger = max(a[2], b[2])
    ratio, apart = larger / min(a[2], b[2]), math.hypot(a[0] - b[0], a[1] - b[1])
    return ((ratio < 2 and apart < 0.5 * larger)
            or (ratio < MERGE_SIZE_RATIO and apart < CONCENTRIC_SHARE * larger))


def finds(d, t):
    ratio = max(d[2], t[2]) / min(d[2], t[2])
    return math.hypot(d[0] - t[0], d[1] - t[1]) <= 0.25 * t[2] + 2 and ratio <= 1.5


def match(found, truth):
    pairs = []
    for i, d in enumerate(found):
        for j, t in enumerate(truth):
            if abs(d[0] - t[0]) < 0.4 * d[2] + 3 and finds(d, t):
                pairs.append((math.hypot(d[0] - t[0], d[1] - t[1]) / t[2], i, j))
    pairs.sort()
    of_d, of_t = [None] * len(found), [None] * len(truth)
    for _, i, j in pairs:
        if of_d[i] is None and of_t[j] is None:
            of_d[i], of_t[j] = j, i
    return of_d, of_t


def misses(det_csv, label_dir):
    found_by_source = collections.defaultdict(list)
    with open(det_csv) as f:
        for r in csv.DictReader(f):
            found_by_source[r["source"]].append(
                (float(r["x"]), float(r["y"]), float(r["diameter_px"])))
    missed, false, n = collections.Counter(), collections.Counter(), collections.Counter()
    for source, found in sorted(found_by_source.items()):
        truth = circles(f"{label_dir}/{source}.txt")
        of_d, of_t = match(found, truth)
        for j, t in enumerate(truth):
            if t[2] < SMALLEST:
                continue
            n["craters"] += 1
            if of_t[j] is not None:
                n["found"] += 1
                continue
            near = sorted((math.hypot(d[0] - t[0], d[1] - t[1]) / t[2], d) for d in found)
            centred = [(r, d) for r, d in near if r <= 0.25 + 2 / t[2]]
            if centred:
                size = centred[0][1][2] / t[2]
                missed["a detection at its centre, under 0.67x its size" if size < 1
                       else "a detection at its centre, over 1.5x its size"] += 1
            elif near and near[0][0] <= 0.6:
                size = near[0][1][2] / t[2]
                missed["detections off its centre, the nearest under half its size" if size < 0.5
                       else "detections off its centre, the nearest at least half its size"] += 1
            else:
                missed["no detection within 0.6 of its diameter"] += 1
        for i, d in enumerate(found):
            if d[2] < SMALLEST or of_d[i] is not None:
                continue
            n["false"] += 1
            near = [(math.hypot(d[0] - t[0], d[1] - t[1]) / max(d[2], t[2]), j)
                    for j, t in enumerate(truth)]
            near = [x for x in near if x[0] <= 0.3]
            if not near:
                false["on no labelled crater"] += 1
                continue
            j = min(near)[1]
            if of_t[j] is not None:
                false["on a crater another detection found"] += 1
            elif truth[j][2] < SMALLEST:
                false["on a crater under 20 px"] += 1
            else:
                false["on a crater of another size"] += 1
    print(f"craters >= {SMALLEST:g} px: {n['craters']}, found {n['found']}; "
          f"detections >= {SMALLEST:g} px on no crater: {n['false']}")
    print("craters missed, by what lies near:")
    for k, v in missed.most_common():
        print(f"  {v:5d} {k}")
    print("detections on no crater, by what lies under them:")
    for k, v in false.most_common():
        print(f"  {v:5d} {k}")


def taught_read_back(craters, width, height, share=0.5, level_max=14.0, per_octave=2):
    side, largest = min(width, height), 0.5 * min(width, height)
    scales = [1.0]
    while True:
        nxt = 0.5 ** (len(scales) / per_octave)
        if level_max / 2 / nxt > largest or side * nxt < 2 * level_max:
            break
        scales.append(nxt)
    out = []
    for k, s in enumerate(scales):
        lo = 8.0 if k == 0 else level_max / 2
        hi = math.inf if k + 1 == len(scales) else level_max
        w, h = max(1, round(width * s)), max(1, round(height * s))
        on = set()
        for x, y, d in craters:
            if not lo <= d * s < hi:
                continue
            cx, cy, r = (x + .5) * s - .5, (y + .5) * s - .5, d * s / 2 * share
            for py in range(max(0, math.floor(cy - r)), min(h - 1, math.ceil(cy + r)) + 1):
                for px in range(max(0, math.floor(cx - r)), min(w - 1, math.ceil(cx + r)) + 1):
                    if math.hypot(px - cx, py - cy) <= r:
                        on.add((px, py))
        seen = set()
        for p in sorted(on):
            if p in seen:
                continue
            seen.add(p)
            stack, region = [p], []
            while stack:
                q = stack.pop()
                region.append(q)
                for nb in ((q[0] + 1, q[1]), (q[0] - 1, q[1]), (q[0], q[1] + 1), (q[0], q[1] - 1)):
                    if nb in on and nb not in seen:
                        seen.add(nb)
                        stack.append(nb)
            n = len(region)
            d = 2 * math.sqrt(n / math.pi) / share
            if lo <= d < hi:
                cx = sum(a for a, _ in region) / n
                cy = sum(b for _, b in region) / n
                out.append(((cx + .5) / s - .5, (cy + .5) / s - .5, d / s))
    kept = []
    for d in out:  # every region scores 1: the first reading stays
        if not any(same_crater(k, d) for k in kept):
            kept.append(d)
    return [k for k in kept if 8 <= k[2] <= largest]


def taught(paths, per_octave, width=800, height=800):
    n = collections.Counter()
    bins = (("8-20", 8, 20), (">=20", 20, math.inf))
    for path in paths:
        truth = circles(path)
        found = taught_read_back(truth, width, height, per_octave=per_octave)
        of_d, of_t = match(found, truth)
        for name, lo, hi in bins:
            n[name, "craters"] += sum(lo <= t[2] < hi for t in truth)
            n[name, "found"] += sum(lo <= t[2] < hi and of_t[j] is not None
                                    for j, t in enumerate(truth))
            # a detection counts in its crater's bin, else in its own
            n[name, "detections"] += sum(
                lo <= (truth[of_d[i]][2] if of_d[i] is not None else d[2]) < hi
                for i, d in enumerate(found))
    for name, _, _ in bins:
        p = n[name, "found"] / max(1, n[name, "detections"])
        r = n[name, "found"] / max(1, n[name, "craters"])
        print(f"{name:>5} px: craters {n[name, 'craters']}, precision {p:.3f}, recall {r:.3f}, "
              f"F1 {2 * p * r / max(1e-9, p + r):.3f}")


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "misses":
        misses(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 5 and sys.argv[1:3] == ["taught", "--levels-per-octave"]:
        taught(sys.argv[4:], int(sys.argv[3]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "taught":
        taught(sys.argv[2:], 2)
    else:
        sys.exit(__doc__)
