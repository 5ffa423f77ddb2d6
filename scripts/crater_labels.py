"""Crater lists in pixels as the scripts read them (standard library only): pycda's
(long,lat,diameter: pixels, despite the names), the LRO NAC tiles' (ID,X,Y,W,H,C_X,CY; the
diameter the mean of W and H) or craterdex's (x,y,diameter_px, an optional id). A file that
is none of them, or a value that is not a number, exits naming the file."""
import csv
import sys


def read_labels(path):
    """[(id, x, y, diameter)]: the NAC tiles' ID or craterdex's id where the file has one,
    else the row's index, as a string."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit(f"{path}: no craters listed")
    cols = set(rows[0])
    try:
        if {"long", "lat", "diameter"} <= cols:
            return [(str(i), float(r["long"]), float(r["lat"]), float(r["diameter"]))
                    for i, r in enumerate(rows)]
        if {"x", "y", "diameter_px"} <= cols:
            return [(r.get("id") or str(i), float(r["x"]), float(r["y"]), float(r["diameter_px"]))
                    for i, r in enumerate(rows)]
        if {"C_X", "CY", "W", "H"} <= cols:
            return [(r.get("ID") or str(i), float(r["C_X"]), float(r["CY"]),
                     (float(r["W"]) + float(r["H"])) / 2) for i, r in enumerate(rows)]
    except ValueError as e:
        sys.exit(f"{path}: {e}")
    sys.exit(
        f"{path}: expected columns long,lat,diameter (pycda), ID,X,Y,W,H,C_X,CY (NAC) or "
        f"x,y,diameter_px (craterdex); found {sorted(cols)}"
    )


def circles(path):
    """[(x, y, diameter)] of `read_labels`."""
    return [(x, y, d) for _, x, y, d in read_labels(path)]
