"""The Python API against the CLI: same pipeline, same numbers, same errors."""

import json
import os
import threading

import numpy as np
import pandas as pd
import pytest
from PIL import Image

import craterdex
from craterdex import CraterdexError
import helpers


def test_extract_from_arrays_and_files_agree(tiny, tmp_path):
    a = helpers.crater_image(1)
    p = tmp_path / "a.pgm"
    helpers.write_pgm(p, a)
    fa = tiny.extract([a], ids=["x"])
    fp = tiny.extract([p], ids=["x"])
    assert fa["ids"] == ["x"]
    assert fa["cls"].shape == (1, helpers.D)
    assert fa["patches"].shape == (1, helpers.G * helpers.G, helpers.D)
    assert fa["attention"].shape == (1, helpers.G * helpers.G)
    assert fa["cls"].dtype == np.float32
    np.testing.assert_array_equal(fa["patches"], fp["patches"])
    # arrays come back as views of the engine's buffers, not copies
    assert not fa["patches"].flags["OWNDATA"]
    stacked = tiny.extract(np.stack([a, helpers.crater_image(2)]))
    assert stacked["ids"] == ["0", "1"] and stacked["cls"].shape == (2, helpers.D)
    np.testing.assert_array_equal(stacked["cls"][0], fa["cls"][0])
    wide = tiny.extract([a.astype(np.uint16) * 257])
    assert np.isfinite(wide["cls"]).all()
    rgb = tiny.extract([np.repeat(a[:, :, None], 3, axis=2)])
    assert rgb["cls"].shape == (1, helpers.D)


def test_bad_input_raises_the_cli_message_as_the_class_of_its_kind(tiny, tiny_dir, cli, tmp_path):
    with pytest.raises(craterdex.NotFoundError) as e:
        craterdex.Index.open(tmp_path / "missing")
    assert isinstance(e.value, CraterdexError) and isinstance(e.value, LookupError)
    assert e.value.kind == "not_found"
    r = cli("index", "info", "--index", tmp_path / "missing", ok=False)
    assert r.returncode == 4, "the CLI's exit code for not found"
    assert r.stderr.strip() == f"error: {e.value}"
    with pytest.raises(craterdex.InvalidInputError, match=r"\[H, W\]"):
        tiny.extract([np.zeros((4, 4, 2), dtype=np.uint8)])
    with pytest.raises(ValueError, match="64 times"):
        tiny.extract([np.zeros((1, 200), dtype=np.uint8)])
    with pytest.raises(craterdex.InvalidInputError, match="uint8 or uint16"):
        tiny.extract([np.zeros((8, 8), dtype=np.float32)])
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(craterdex.InvalidInputError, match="no image could be read"), \
            pytest.warns(craterdex.SkippedImageWarning, match="bad.png: not an image"):
        tiny.extract([bad])
    with pytest.raises(craterdex.InvalidInputError, match="unknown resize mode"):
        craterdex.Model.load(tiny_dir, resize="bogus")
    with pytest.raises(craterdex.InvalidInputError, match="unknown codec"):
        craterdex.Index.build(tmp_path / "r", [{"id": "a", "path": str(bad)}], model=tiny,
                              recipe=craterdex.Recipe(codec="zip"))


def test_a_routers_bound_on_a_querys_views_is_craterdex_serves():
    """The cluster's router reads search options with craterdex serve's reader, bounded as
    ``craterdex serve --max-query-views`` bounds them."""
    read = lambda query, bound=None: json.loads(craterdex._native.search_options_json(query, "image", bound))
    assert read("")["recheck_views"] is None and read("turns=3")["turns"] == 3
    assert read("", 3)["recheck_views"] == 3 and read("recheck_views=2", 3)["recheck_views"] == 2
    for query, bound in [("turns=2", 3), ("opposite_sun=true", 1), ("recheck_views=4", 3)]:
        with pytest.raises(craterdex._native.ApiRefusal) as refusal:
            read(query, bound)
        status, message = refusal.value.args
        assert status == 400 and "max_query_views" in message, message
    doc = lambda bound: json.loads(craterdex._native.service_document_json(384, bound))
    maximum = lambda d: next(p["schema"].get("maximum") for p in d["paths"]["/v1/search/image"]["post"]["parameters"]
                             if p["name"] == "recheck_views")
    assert maximum(doc(None)) == 34 and maximum(doc(3)) == 3
    cluster = pytest.importorskip("craterdex.cluster", exc_type=ImportError)  # needs Ray Serve
    with pytest.raises(ValueError, match="max_query_views must be at least 1"):
        cluster.application("/nonexistent", max_query_views=0)


def test_options_are_the_engines_own_with_its_defaults_and_bounds(tiny, crops, tmp_path):
    import inspect

    # the signatures carry the engine's defaults
    search = inspect.signature(craterdex.Index.search).parameters
    assert search["top_k"].default == craterdex.DEFAULTS["engine"]["search"]["top_k"] == 10
    assert search["mode"].default == "two-stage"
    assert craterdex.Recipe().whitening == "pairs" and craterdex.Recipe().codec == "int8"
    assert inspect.signature(craterdex.Model.load).parameters["orient"].default == "as-is"
    idx = craterdex.Index.build(tmp_path / "i", crops.iloc[:8], model=tiny)
    # one bound check, one message, as the CLI and the service give it
    with pytest.raises(craterdex.InvalidInputError, match="top_k must be between 1 and"):
        idx.search(paths=[crops["path"][0]], top_k=0)
    with pytest.raises(craterdex.InvalidInputError, match="unknown mode"):
        idx.search(paths=[crops["path"][0]], mode="sideways")
    assert search["recheck_views"].default is None
    with pytest.raises(craterdex.InvalidInputError, match="recheck_views must be at least 1"):
        idx.search(paths=[crops["path"][0]], recheck_views=0)
    info = idx.info()
    assert info["codec"] == "int8" and info["images"] == 8 and info["image_search"] is True


def test_build_and_search_give_what_the_cli_gives(tiny, tiny_dir, cli, crops, tmp_path):
    folder = os.path.dirname(crops["path"][0])
    crops.drop(columns=["path"]).to_csv(folder + ".csv", index=False)
    cli("index", "build", "--dir", folder, "--out", tmp_path / "cli", "--model", tiny_dir, "--size", 16)
    built = craterdex.Index.build(tmp_path / "py", crops, model=tiny)
    by_cli = craterdex.Index.open(tmp_path / "cli", model=tiny)
    assert len(built) == len(by_cli) == len(crops)
    ids = list(crops["id"])
    a, b = built.descriptors(ids), by_cli.descriptors(ids)
    np.testing.assert_array_equal(a["single"], b["single"])
    np.testing.assert_array_equal(a["tokens"], b["tokens"])
    pd.testing.assert_frame_equal(built.metadata().drop(columns=["path"]), by_cli.metadata().drop(columns=["path"]))
    assert built.info()["token_bytes_per_image"] == by_cli.info()["token_bytes_per_image"]

    queries = list(crops["path"][:5])
    hits = built.search(paths=queries, top_k=5)
    r = cli("search", "--index", tmp_path / "cli", "--model", tiny_dir, "--size", 16, "--json", "--top", 5, *queries)
    want = [(q["query"], h["id"], h["score"]) for q in json.loads(r.stdout) for h in q["results"]]
    got = list(zip(hits["query"], hits["id"], hits["score"]))
    # the same hits in the same order; scores to float rounding (batches of another size
    # sum in another order)
    assert [w[:2] for w in want] == [g[:2] for g in got]
    np.testing.assert_allclose([g[2] for g in got], [w[2] for w in want], rtol=0, atol=1e-4)
    assert list(hits.columns[:7]) == ["query", "rank", "id", "crater_id", "score", "stage1", "stage2"]
    # each crop finds itself first
    firsts = hits[hits["rank"] == 1]
    assert [os.path.basename(p)[:-4] for p in firsts["query"]] == list(firsts["id"])


def test_add_remove_and_feature_searches(tiny, crops, tmp_path):
    idx = craterdex.Index.build(tmp_path / "i", crops.iloc[:30], model=tiny)
    assert idx.add(crops.iloc[30:]) == len(crops) - 30
    assert len(idx) == len(crops)
    with pytest.raises(craterdex.ConflictError, match="already in the index"):
        idx.add(crops.iloc[:1])
    assert idx.remove(["c000v0", "no-such-id"]) == 1
    assert len(idx) == len(crops) - 1
    hits = idx.search(paths=[crops["path"][0]], top_k=3)
    assert "c000v0" not in set(hits["id"])
    # merging into one segment purges the removed image and keeps the rest findable
    report = idx.merge(into_one=True)
    assert (report["segments_after"], report["rows_purged"]) == (1, 1)
    assert report["rows_written"] == len(crops) - 1
    assert idx.info()["segments"] == 1 and len(idx) == len(crops) - 1
    assert idx.search(paths=[crops["path"][1]], top_k=1)["id"][0] == crops["id"][1]
    reopened = craterdex.Index.open(tmp_path / "i")
    assert len(reopened) == len(crops) - 1
    with pytest.raises(craterdex.UnsupportedError, match="no model is loaded"):
        reopened.search(paths=[crops["path"][0]])

    f = tiny.extract(list(crops["path"][:6]), ids=list(crops["id"][:6]))
    fidx = craterdex.Index.build(tmp_path / "f", crops.iloc[:6], features=f, recipe=craterdex.Recipe(whitening="none", codec="f32"))
    self_hits = fidx.search(features=f, top_k=1, mode="exhaustive")
    assert list(self_hits["id"]) == list(crops["id"][:6])
    named = fidx.search(features=f, ids=[f"q{i}" for i in range(6)], top_k=1, mode="exhaustive")
    assert list(named["query"]) == [f"q{i}" for i in range(6)]
    with pytest.raises(craterdex.InvalidInputError, match="2 ids for features of 6 images"):
        fidx.search(features=f, ids=["q0", "q1"])
    arrays = [helpers.crater_image(i) for i in range(3)]
    by_array = idx.search(arrays, ids=["a", "b", "c"], top_k=2)
    assert list(by_array["query"].unique()) == ["a", "b", "c"]


def test_a_turned_search_finds_crops_seen_turned_and_mirrored(tiny, crops, tmp_path):
    recipe = craterdex.Recipe(codec="f32")
    idx = craterdex.Index.build(tmp_path / "i", crops.iloc[:12], model=tiny, recipe=recipe)
    assert craterdex.DEFAULTS["engine"]["search"]["turns"] == 1  # a plain search by default
    for i in range(3):
        turned = np.ascontiguousarray(np.fliplr(np.rot90(np.asarray(Image.open(crops["path"][i])))))
        by_array = idx.search([turned], ids=["t"], top_k=1, mode="exhaustive", group_views=False, turns=4)
        path = tmp_path / f"t{i}.png"
        Image.fromarray(turned).save(path)
        by_path = idx.search(paths=[path], top_k=1, mode="exhaustive", group_views=False, turns=4)
        for hits in (by_array, by_path):
            assert hits["id"][0] == crops["id"][i]
            # found through the variant that undoes the turn, counted 0.05 lower
            assert abs(hits["score"][0] - (hits["stage2"][0] - 0.05)) < 1e-4
    f = tiny.extract([crops["path"][0]])
    with pytest.raises(craterdex.InvalidInputError, match="turns and opposite_sun need the query images"):
        idx.search(features=f, turns=2)


def test_a_search_under_the_opposite_sun_finds_crops_lit_from_the_other_side(tiny, crops, tmp_path):
    recipe = craterdex.Recipe(codec="f32")
    idx = craterdex.Index.build(tmp_path / "i", crops.iloc[:12], model=tiny, recipe=recipe)
    assert craterdex.DEFAULTS["engine"]["search"]["opposite_sun"] is False
    for i in range(3):
        relit = 255 - np.asarray(Image.open(crops["path"][i]).convert("L"))
        by_array = idx.search([relit], ids=["r"], top_k=1, mode="exhaustive", group_views=False,
                              opposite_sun=True)
        path = tmp_path / f"r{i}.png"
        Image.fromarray(relit).save(path)
        by_path = idx.search(paths=[path], top_k=1, mode="exhaustive", group_views=False, opposite_sun=True)
        for hits in (by_array, by_path):
            assert hits["id"][0] == crops["id"][i]
            # found through the inverted view, counted 0.05 lower
            assert abs(hits["score"][0] - (hits["stage2"][0] - 0.05)) < 1e-4
    f = tiny.extract([crops["path"][0]])
    with pytest.raises(craterdex.InvalidInputError, match="opposite_sun need the query images"):
        idx.search(features=f, opposite_sun=True)


def test_a_verified_search_counts_inliers_and_finds_the_image_itself(tiny, crops, tmp_path):
    idx = craterdex.Index.build(tmp_path / "i", crops.iloc[:12], model=tiny)
    # what a cluster's shards tell its router, so that it lists candidates as deep as one index
    most = crops.iloc[:12]["crater_id"].value_counts().max()
    assert most > 1 and idx._native.views_per_crater() == most
    search_defaults = craterdex.DEFAULTS["engine"]["search"]
    assert search_defaults["verify"] == 0 and search_defaults["recheck"]
    path = crops["path"][0]
    assert idx.search(paths=[path], top_k=3, recheck=False)["inliers"].isna().all()
    f = tiny.extract([path])
    patches = f["patches"].shape[1]
    # by default a query image is rechecked: its best images verified, the image itself first
    # with every patch in place (so not searched again); posted features are searched as given
    rechecked = idx.search(paths=[path], top_k=3)
    assert rechecked["id"][0] == crops["id"][0] and rechecked["inliers"][0] == patches
    assert idx.search(features=f, top_k=3)["inliers"].isna().all()
    array = np.asarray(Image.open(path))
    for hits in (idx.search(paths=[path], top_k=3, verify=3),
                 idx.search([array], ids=["a"], top_k=3, verify=3),
                 idx.search(features=f, top_k=3, verify=3)):
        # the image itself: every patch corresponds in place
        assert hits["id"][0] == crops["id"][0]
        assert hits["inliers"][0] == patches
        assert 1 <= hits["inliers"].notna().sum() <= 3
    # turned and mirrored, at 4 turns: verified against the view that undoes it
    turned = np.ascontiguousarray(np.fliplr(np.rot90(array)))
    both = idx.search([turned], ids=["t"], top_k=3, verify=3, turns=4)
    assert both["id"][0] == crops["id"][0] and both["inliers"][0] == patches


def test_link_and_dedup_return_tables(tiny, crops, tmp_path):
    first = crops[crops["id"].str.endswith("v0")]
    second = crops[crops["id"].str.endswith("v1")]
    idx = craterdex.Index.build(tmp_path / "i", first, model=tiny)
    links = idx.link(second)
    assert len(links) == len(second)
    assert set(links["decision"]) <= {"match", "new", "ambiguous"}
    assert {"id", "decision", "confidence", "match_id", "offset_radii"} <= set(links.columns)
    # the geometry puts each second view on its crater's first view
    matched = links[links["decision"] == "match"]
    assert (matched["match_crater_id"] == matched["crater_id"]).all()
    whole = craterdex.Index.build(tmp_path / "all", crops, model=tiny)
    groups = whole.dedup()
    assert len(groups) > 0
    assert (groups.groupby("group")["survivor"].sum() == 1).all()
    assert {"group", "id", "survivor", "crater_id"} <= set(groups.columns)

    # growing the catalogue: a rule that calls everything new inserts every entry once
    rule = idx.rule()
    rule.update(appearance_weights=[-20.0, 0.0], geometry_weights=[-20.0, 0.0, 0.0, 0.0])
    grown = idx.link(second, rule=rule, insert_new=True)
    assert (grown["decision"] == "new").all() and grown["inserted"].all()
    assert len(idx) == len(first) + len(second)
    assert not idx.link(second, rule=rule, insert_new=True)["inserted"].any()
    assert len(craterdex.Index.open(tmp_path / "i")) == len(first) + len(second)
    assert idx.search(paths=[second["path"].iloc[3]], top_k=1)["id"].tolist() == [second["id"].iloc[3]]


def test_link_images_detects_registers_and_links_whole_images(tiny, tmp_path):
    idx, craters = helpers.disc_scene(tmp_path, tiny)
    # the second observation: turned a quarter, (x, y) -> (y, 419 - x), with no crater list
    turned = [(y, 419 - x, d) for x, y, d in craters]
    helpers.write_pgm(str(tmp_path / "second.pgm"), helpers.discs(420, 420, turned))
    detector = helpers.bright_detector(str(tmp_path / "bright"))
    # the tiny model's scores mean nothing: decide by registered geometry alone
    rule = idx.rule()
    rule.update(registered=dict(max_offset_radii=1.0, max_diameter_ratio=1.5, weights=[10.0, 0.0, -20.0, -20.0]))
    links = idx.link_images([tmp_path / "second.pgm"], detector=detector, rule=rule, progress=False)
    assert list(links.columns)[:6] == ["image", "id", "x", "y", "diameter_px", "found_by"]
    [summary] = links.attrs["images"]
    assert summary["registration"]["registered"] and abs(abs(summary["registration"]["rotation_deg"]) - 90) < 1
    for i, (x, y, d) in enumerate(turned):
        here = links[np.hypot(links["x"] - x, links["y"] - y) <= 0.25 * d + 2]
        assert len(here) == 1, (i, links)
        row = here.iloc[0]
        if i < 2:
            assert row["decision"] == "new", row
        elif row["found_by"] == "detector":
            assert (row["decision"], row["catalogue_crater_id"]) == ("match", f"d{i}"), row
        else:
            assert row["catalogue_crater_id"] == f"d{i}" and row["decision"] in ("match", "unconfirmed"), row
    with pytest.raises(craterdex.InvalidInputError, match="no detector"):
        idx.link_images([tmp_path / "second.pgm"], detector="nowhere", progress=False)
    # the detector in int8 finds what it finds in f32 (the default is this CPU's fastest); an
    # arithmetic it does not have is refused by name
    for precision in ("int8", "f32"):
        other = idx.link_images([tmp_path / "second.pgm"], detector=detector, detector_precision=precision,
                                rule=rule, progress=False)
        assert sorted(zip(other["x"].round(), other["y"].round())) == sorted(zip(links["x"].round(), links["y"].round()))
    with pytest.raises(craterdex.InvalidInputError, match="precision"):
        idx.link_images([tmp_path / "second.pgm"], detector=detector, detector_precision="f16", progress=False)


def test_the_gil_is_released_during_extraction(tiny):
    images = [helpers.crater_image(i % 50) for i in range(3000)]
    done = threading.Event()
    counted = [0]

    def count():
        while not done.is_set():
            counted[0] += 1

    t = threading.Thread(target=count)
    t.start()
    try:
        before = counted[0]
        tiny.extract(images)
        during = counted[0] - before
    finally:
        done.set()
        t.join()
    # a held GIL would stop the counting thread for the whole extraction
    assert during > 10_000, during


def test_evaluate_gives_the_cli_numbers(tiny_dir, cli, tmp_path):
    tile = helpers.crater_image(7, size=200)
    yy, xx = np.mgrid[0:200, 0:200]
    rows = ["long,lat,diameter"]
    for i in range(12):
        cx, cy, d = 30 + (i % 4) * 45, 40 + (i // 4) * 60, 14 + (i % 5) * 2
        tile = np.where(np.hypot(xx - cx, yy - cy) < d / 2, np.clip(tile.astype(int) - 60 - 5 * i, 0, 255), tile).astype(np.uint8)
        rows.append(f"{cx},{cy},{d}")
    helpers.write_pgm(tmp_path / "tile.pgm", tile)
    (tmp_path / "tile.csv").write_text("\n".join(rows) + "\n")
    cli("bench-build", "--tile", tmp_path / "tile.pgm", "--craters", tmp_path / "tile.csv", "--out", tmp_path / "bench",
        "--query-craters", 4, "--min-diameter", 10)
    manifest = tmp_path / "bench" / "splits" / "test.json"
    cli("eval", "--manifest", manifest, "--quick", "--json", tmp_path / "r.json", "--model", tiny_dir, "--size", 16)
    want = json.loads((tmp_path / "r.json").read_text())["regimes"]
    got = craterdex.evaluate(manifest, model=craterdex.Model.load(tiny_dir, size=16), quick=True)["regimes"]
    assert set(got) == set(want)
    for name in want:
        assert got[name]["mAP"] == pytest.approx(want[name]["mAP"], abs=1e-9), name
    # under the paper's protocol, as `eval --protocol paper`, and recorded alike
    cli("eval", "--manifest", manifest, "--quick", "--json", tmp_path / "p.json", "--model", tiny_dir,
        "--protocol", "paper")
    want = json.loads((tmp_path / "p.json").read_text())
    model = craterdex.Model.load(tiny_dir, protocol="paper")
    assert model.protocol["name"] == "paper" and model.protocol["precision"] == "f32"
    got = craterdex.evaluate(manifest, model=model, quick=True)
    assert got["protocol"] == want["protocol"] == model.protocol
    for name in want["regimes"]:
        assert got["regimes"][name]["mAP"] == pytest.approx(want["regimes"][name]["mAP"], abs=1e-9), name
    with pytest.raises(craterdex.InvalidInputError, match="protocol sets the backbone"):
        craterdex.Model.load(tiny_dir, protocol="paper", size=16)


def test_entries_from_dir_reads_a_robbins_catalogue_as_the_cli_does(tmp_path):
    crops = tmp_path / "crops"
    crops.mkdir()
    for cid in ("02-000001", "02-000002"):
        helpers.write_pgm(crops / f"{cid}.pgm", helpers.crater_image(3, size=32))
    (tmp_path / "crops.csv").write_text(
        "CRATER_ID,LAT_CIRC_IMG,LON_CIRC_IMG,DIAM_CIRC_IMG,DEPTH_RIMFLOOR_TOPOG\n"
        "02-000001,-12.5,350.25,3.2,0.1\n02-000002,40.0,-10.5,1.1,0.05\n")
    df = craterdex.entries_from_dir(crops).set_index("id")
    assert df.loc["02-000001", "crater_id"] == "02-000001"
    assert (df.loc["02-000001", "lat"], df.loc["02-000001", "lon"], df.loc["02-000001", "diameter_km"]) == (-12.5, 350.25, 3.2)
    assert df.loc["02-000002", "lon"] == -10.5
    (tmp_path / "crops.csv").write_text("name,lat\nx,1\n")
    with pytest.raises(craterdex.InvalidInputError, match="no `id` column"):
        craterdex.entries_from_dir(crops)


def test_the_recheck_plan_is_the_engines_own():
    plan = craterdex.recheck_plan()
    names = [s["name"] for s in plan["stages"]]
    assert names == ["as given", "in turns and under the opposite sun"], names
    first, last = plan["stages"][0], plan["stages"][-1]
    assert first["verify"] == 50 and last["verify"] == 200 and last["views"]["turns"] == 12
    assert 0 < plan["unsure_share"] < 1
    assert "40%" in plan["description"] and "200 verified" in plan["description"]
