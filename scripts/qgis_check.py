#!/usr/bin/env python3
"""Opens craterdex's map layers in QGIS (its Python bindings, headless) as a user would:
every layer of `link`, `link --image`, `dedup` and `detect` outputs, GeoJSON (with the .qml
style beside it) and GeoPackage (styles in its layer_styles table), and checks that each is
valid, on the given body's sphere, has its features, and is drawn as styled: by category
(decision; group or single) or, for detections, with one symbol.

    python3 scripts/qgis_check.py --body Mars --radius-m 3396190 LINKS_DIR DEDUP_DIR

Run by crates/cli/tests/gis_workflow.rs where `python3-qgis` is installed."""

import argparse
import json
import os
import sys

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from qgis.core import QgsApplication, QgsRenderContext, QgsVectorLayer  # noqa: E402

# layer: (its GeoPackage, the attribute it is coloured by and the categories; None: one symbol)
LAYERS = {
    "links": ("links", "decision", {"match", "new", "ambiguous"}),
    "merged": ("merged", "kind", {"group", "single"}),
    "detections_lonlat": ("detections", None, set()),
}
# `link --image` also has catalogue craters that were not seen where they should be
IMAGE_DECISIONS = {"match", "new", "ambiguous", "unconfirmed"}


def expected_style(name, geojson):
    _, attribute, values = LAYERS[name.replace("_rims", "")]
    features = json.load(open(geojson))["features"]
    if name.startswith("links") and any("found_by" in f["properties"] for f in features):
        values = IMAGE_DECISIONS
    return attribute, values


def check(uri, name, geojson, body, radius_m, failures):
    attribute, values = expected_style(name, geojson)
    layer = QgsVectorLayer(uri, name, "ogr")
    want = len(json.load(open(geojson))["features"])
    crs = layer.crs()
    renderer = layer.renderer()
    got = {
        "valid": layer.isValid(),
        "body": crs.celestialBodyName(),
        "ellipsoid": crs.ellipsoidAcronym(),
        "features": layer.featureCount(),
        "renderer": renderer.type() if renderer else None,
        "attribute": renderer.classAttribute() if renderer and renderer.type() == "categorizedSymbol" else None,
        "categories": sorted(c.value() for c in renderer.categories()) if renderer and renderer.type() == "categorizedSymbol" else [],
    }
    expected = {
        "valid": True,
        "body": body,
        "ellipsoid": f"PARAMETER:{radius_m}:{radius_m}",
        "features": want,
        "renderer": "categorizedSymbol" if attribute else "singleSymbol",
        "attribute": attribute,
        "categories": sorted(values),
    }
    wrong = {k: (got[k], expected[k]) for k in expected if got[k] != expected[k]}
    kinds = {s.type() for s in renderer.symbols(QgsRenderContext())} if renderer else set()
    print(f"{uri}: {got['features']} features on {got['body']}, {got['renderer']} by {got['attribute']}; "
          f"authid {crs.authid() or '(none)'}; symbols {sorted(int(k) for k in kinds)}")
    if wrong:
        failures.append(f"{uri}: " + ", ".join(f"{k} is {g!r}, expected {e!r}" for k, (g, e) in wrong.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--body", required=True)
    ap.add_argument("--radius-m", type=int, required=True)
    ap.add_argument("dirs", nargs="+")
    args = ap.parse_args()
    app = QgsApplication([], False)
    app.initQgis()
    failures, seen = [], 0
    for d in args.dirs:
        for name in ("links", "links_rims", "merged", "merged_rims", "detections_lonlat"):
            geojson = os.path.join(d, name + ".geojson")
            if not os.path.exists(geojson):
                continue
            seen += 1
            check(geojson, name, geojson, args.body, args.radius_m, failures)
            package = os.path.join(d, LAYERS[name.replace("_rims", "")][0] + ".gpkg")
            if os.path.exists(package):
                check(f"{package}|layername={name}", name, geojson, args.body, args.radius_m, failures)
    app.exitQgis()
    if not seen:
        failures.append("no map layers found in " + ", ".join(args.dirs))
    for f in failures:
        print("FAILED", f, file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
