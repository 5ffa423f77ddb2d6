"""craterdex.dask on a LocalCluster of two worker processes (loopback): the cluster's
results equal the single-machine ones, also when a worker is killed mid-job."""

import os

import numpy as np
import pandas as pd
import pytest

distributed = pytest.importorskip("distributed")

import craterdex
import craterdex.dask as cdask
import helpers


@pytest.fixture(scope="module")
def client(home):
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       host="127.0.0.1", dashboard_address=None)
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


def assert_same_index(a, b, ids):
    assert len(a) == len(b) == len(ids)
    da, db = a.descriptors(ids), b.descriptors(ids)
    np.testing.assert_array_equal(da["single"], db["single"])
    np.testing.assert_array_equal(da["tokens"], db["tokens"])
    ma = a.metadata().drop(columns=["path"])
    mb = b.metadata().drop(columns=["path"])
    pd.testing.assert_frame_equal(ma, mb)


def test_a_cluster_build_is_the_single_machine_build(client, tiny, tiny_dir, crops, cli, tmp_path):
    folder = os.path.dirname(crops["path"][0])
    crops.drop(columns=["path"]).to_csv(folder + ".csv", index=False)
    cli("index", "build", "--dir", folder, "--out", tmp_path / "one", "--model", tiny_dir, "--size", 16)
    one = craterdex.Index.open(tmp_path / "one")
    built = cdask.build_index(client, crops, tmp_path / "dask", model=tiny, partition_size=7)
    assert built.info()["segments"] == 7  # 48 entries in parts of 7
    assert not os.path.exists(str(tmp_path / "dask") + ".parts")
    assert_same_index(built, one, list(crops["id"]))
    # and it answers queries like the single-machine index
    q = list(crops["path"][:4])
    a = built.search(paths=q, top_k=5)
    b = craterdex.Index.open(tmp_path / "one", model=tiny).search(paths=q, top_k=5)
    pd.testing.assert_frame_equal(a.drop(columns=["path"]), b.drop(columns=["path"]))


def test_a_sharded_build_cuts_the_single_build_by_crater(client, tiny, crops, tmp_path):
    shards = cdask.build_index(client, crops, tmp_path / "sharded", model=tiny, partition_size=7, shards=3)
    whole = craterdex.Index.build(tmp_path / "one", crops, model=tiny)
    assert len(shards) == 3 and sum(len(s) for s in shards) == len(crops)
    meta = [s.metadata() for s in shards]
    ids = [set(m["id"]) for m in meta]
    assert set.union(*ids) == set(crops["id"]) and sum(len(i) for i in ids) == len(crops)
    # every view of a crater in one shard
    owner = {c: k for k, m in enumerate(meta) for c in m["crater_id"]}
    assert all(set(m["crater_id"]) == {c for c in m["crater_id"] if owner[c] == k} for k, m in enumerate(meta))
    # the same codes as the one-machine build, so the shards' hits merged are its hits
    for s in shards:
        got = s.descriptors(list(s.metadata()["id"]))
        want = whole.descriptors(list(s.metadata()["id"]))
        np.testing.assert_array_equal(got["tokens"], want["tokens"])
    q = list(crops["path"][:5])
    # image by image (views not grouped): a crater's views are listed together in grouped
    # hits, so its second view may precede a better image of the next crater, and a merge by
    # score alone would not reproduce that order
    merged = pd.concat([s.search(paths=q, top_k=len(crops), mode="exhaustive", group_views=False)
                        for s in shards])
    merged = merged.sort_values(["query", "score"], ascending=[True, False]).groupby("query").head(5)
    one = whole.search(paths=q, top_k=5, mode="exhaustive", group_views=False)
    for path in q:
        a = merged[merged["query"] == path]
        b = one[one["query"] == path]
        np.testing.assert_allclose(sorted(a["score"]), sorted(b["score"]), atol=1e-5)
        assert a["id"].iloc[0] == b["id"].iloc[0]
    with pytest.raises(craterdex.InvalidInputError, match="would hold no image"):
        cdask.build_index(client, crops.iloc[:2], tmp_path / "too-many", model=tiny, shards=40)


def test_a_killed_worker_is_retried_and_the_index_is_complete(client, tiny, crops, tmp_path):
    counter = tmp_path / "unpickled"
    counter.mkdir()
    # the 4th task to use the model (a part, after the plan and two parts) kills its
    # worker process; the nanny starts a new one and the scheduler reruns the task
    dying = helpers.DyingModel(tiny, str(counter), die_at=3)
    built = cdask.build_index(client, crops, tmp_path / "dask", model=dying, partition_size=6)
    assert len(os.listdir(counter)) > 4, "the worker was not killed"
    reference = craterdex.Index.build(tmp_path / "one", crops, model=tiny)
    assert_same_index(built, reference, list(crops["id"]))
    client.wait_for_workers(2)


def test_dedup_and_link_by_band_equal_the_single_machine_run(client, tiny, crops, tmp_path):
    idx = craterdex.Index.build(tmp_path / "all", crops, model=tiny)
    # geometry-led rule: views within about a radius pair up whatever they look like
    rule = idx.rule()
    rule.update(geometry_weights=[4.0, 0.0, -2.0, 0.0], match_confidence=0.9, new_confidence=0.5)
    whole = idx.dedup(rule=rule, top_k=3)
    assert len(whole) >= 20
    for band in (0.5, 2.0):  # narrow bands: many pairs cross a border
        cut = cdask.dedup(client, idx.path, band_degrees=band, rule=rule, top_k=3)
        pd.testing.assert_frame_equal(cut, whole)

    first = crops[crops["id"].str.endswith("v0")]
    second = crops[crops["id"].str.endswith("v1")].reset_index(drop=True)
    cat = craterdex.Index.build(tmp_path / "first", first, model=tiny)
    single = cat.link(second, rule=rule)
    clustered = cdask.link(client, cat.path, second, model=tiny, band_degrees=0.5, rule=rule)
    pd.testing.assert_frame_equal(clustered, single)
    assert (single["decision"] == "match").sum() >= 12


def test_link_images_by_task_equals_the_single_machine_call(client, tiny, tmp_path):
    idx, craters = helpers.disc_scene(tmp_path, tiny)
    # three observations of the ground, turned a quarter, a half and three quarters
    paths = []
    for k in (1, 2, 3):
        seen = craters
        for _ in range(k):
            seen = [(y, 419 - x, d) for x, y, d in seen]
        paths.append(str(tmp_path / f"turn{k}.pgm"))
        helpers.write_pgm(paths[-1], helpers.discs(420, 420, seen))
    detector = helpers.bright_detector(str(tmp_path / "bright"))
    rule = idx.rule()
    rule.update(registered=dict(max_offset_radii=1.0, max_diameter_ratio=1.5, weights=[10.0, 0.0, -20.0, -20.0]))
    single = idx.link_images(paths, detector=detector, rule=rule, progress=False)
    assert [s["image"] for s in single.attrs["images"]] == ["turn1", "turn2", "turn3"]
    assert all(s["registration"]["registered"] for s in single.attrs["images"])
    assert (single["decision"] == "match").sum() >= 3 * 18, single
    for per_task in (1, 2):
        cut = cdask.link_images(client, idx.path, paths, model=tiny, detector=detector, rule=rule,
                                images_per_task=per_task)
        pd.testing.assert_frame_equal(cut, single)
        assert cut.attrs["images"] == single.attrs["images"]
    # a repeated file stem would be numbered by its place in the whole list, which no task sees
    os.makedirs(tmp_path / "other")
    again = str(tmp_path / "other" / "turn1.pgm")
    helpers.write_pgm(again, helpers.discs(420, 420, craters))
    with pytest.raises(craterdex.InvalidInputError, match="share the name 'turn1'"):
        cdask.link_images(client, idx.path, paths + [again], model=tiny, detector=detector)


def test_link_registers_each_source_once_for_every_band(client, tiny, crops, tmp_path):
    # an irregular field (a pattern to register), the second observation turned by 30
    # degrees about its centre and shifted 0.5 degrees north: a georeferencing error of
    # several radii for every crater of the image
    rng = np.random.default_rng(5)
    field = pd.DataFrame({"crater_id": sorted(crops["crater_id"].unique())})
    field["lat"] = rng.uniform(-3.0, 3.0, len(field))
    field["lon"] = rng.uniform(0.0, 6.0, len(field))
    field["diameter_km"] = 6.0 * (1.0 - rng.uniform(0.0, 0.9, len(field))) ** -0.6
    placed = crops.drop(columns=["lat", "lon", "diameter_km"]).merge(field, on="crater_id")
    first = placed[placed["id"].str.endswith("v0")]
    second = placed[placed["id"].str.endswith("v1")].reset_index(drop=True)
    turn = np.radians(30.0)
    y, x = second["lat"].to_numpy(), second["lon"].to_numpy() - 3.0
    second["lat"] = x * np.sin(turn) + y * np.cos(turn) + 0.5
    second["lon"] = x * np.cos(turn) - y * np.sin(turn) + 3.0
    cat = craterdex.Index.build(tmp_path / "first", first, model=tiny)
    rule = cat.rule()
    rule.update(appearance_weights=[0.0, 0.0], geometry_weights=[4.0, 0.0, -2.0, 0.0])
    reg = cat.registrations(second, rule=rule)
    assert list(reg["source"]) == ["img1"] and reg["registered"][0], reg.to_dict("records")
    assert abs(abs(reg["rotation_deg"][0]) - 30.0) < 1.0
    single = cat.link(second, rule=rule)
    right = (single["decision"] == "match") & (single["match_crater_id"] == single["crater_id"])
    assert right.sum() >= 20, single
    as_given = cat.link(second, rule=rule, register=False)
    assert ((as_given["decision"] == "match") & (as_given["match_crater_id"] == as_given["crater_id"])).sum() < 10
    # bands of 0.5 degrees hold two or three craters each: too few to register on their own
    clustered = cdask.link(client, cat.path, second, model=tiny, band_degrees=0.5, rule=rule)
    pd.testing.assert_frame_equal(clustered, single)
