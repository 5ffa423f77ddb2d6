"""craterdex.cluster on a local Ray cluster: 2 shards x 2 replicas of a generated catalogue.

Ray registers its node on the machine's own address and probes an outside one to find it,
so these tests run only inside a network namespace made for them (scripts/cluster_test.sh:
``unshare -n``, loopback up, ``CRATERDEX_NETNS=1``); everywhere else they skip, saying so.
"""

import json
import os
import threading
import time
import urllib.error
import urllib.request
import uuid

import numpy as np
import pytest

if os.environ.get("CRATERDEX_NETNS") != "1":
    pytest.skip("Ray runs only inside a network namespace made for it (scripts/cluster_test.sh)",
                allow_module_level=True)
ray = pytest.importorskip("ray")
pytest.importorskip("multipart")

import craterdex  # noqa: E402
import craterdex.cluster as cc  # noqa: E402
import helpers  # noqa: E402
from ray import serve  # noqa: E402

PORT = 8765
KEY = "cluster-test-key"
URL = f"http://127.0.0.1:{PORT}"


def request(method, path, body=None, headers=None, timeout=60):
    req = urllib.request.Request(URL + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def multipart(fields):
    boundary = uuid.uuid4().hex
    out = b""
    for name, value in fields.items():
        out += f"--{boundary}\r\n".encode()
        if isinstance(value, bytes):
            out += f'Content-Disposition: form-data; name="{name}"; filename="x.png"\r\n'.encode()
            out += b"Content-Type: application/octet-stream\r\n\r\n" + value + b"\r\n"
        else:
            out += f'Content-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
    out += f"--{boundary}--\r\n".encode()
    return out, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def search_image(path, query="top_k=5&shortlist=1000"):
    with open(path, "rb") as f:
        body, headers = multipart({"image": f.read()})
    return request("POST", f"/v1/search/image?{query}", body, headers)


def searches_during(fault, paths, searches=40):
    """`searches` image searches from a thread, `fault()` called a second after they begin:
    the complete answers, and the rest (errors, partial answers)."""
    answers, failures = [], []

    def load():
        for i in range(searches):
            status, got = search_image(paths[i % len(paths)], "top_k=3")
            (answers if status == 200 and not got["partial"] else failures).append((status, got))

    t = threading.Thread(target=load)
    t.start()
    time.sleep(1.0)
    fault()
    t.join()
    return answers, failures


@pytest.fixture(scope="module")
def cluster(tiny, crops, cli, tmp_path_factory):
    d = tmp_path_factory.mktemp("cluster")
    craterdex.Index.build(d / "whole", crops, model=tiny)
    cli("index", "split", "--index", d / "whole", "--shards", 2, "--out", d / "set")
    # this node holds both shards' files, and says so as a node of a larger cluster would
    holds = {cc.shard_resource(n): 1 for n in cc.shard_names(str(d / "set"))}
    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=8, log_to_driver=False,
             resources=holds)
    try:
        cc.serve_shards(str(d / "set"), replicas=2, model=tiny, api_key=KEY, port=PORT, replica_cpus=0.5,
                        place_by_resource=True)
        yield craterdex.Index.open(d / "whole", model=tiny), d
    finally:
        serve.shutdown()
        ray.shutdown()


def replicas_of(deployment):
    """The live replica actors of a deployment (Serve names them after it)."""
    named = ray.util.list_named_actors(all_namespaces=True)
    return [a for a in named if f"#{deployment}#" in a["name"]]


def same_hits(got, want):
    """A cluster's answer (JSON hits) and the whole index's (a DataFrame): the same images,
    scores and inliers, in the same order."""
    assert [h["id"] for h in got] == list(want["id"]), (got, want)
    np.testing.assert_allclose([h["score"] for h in got], want["score"], atol=1e-4)
    assert [h.get("inliers") for h in got] == [None if v != v else v for v in want["inliers"]]
    assert [h["rank"] for h in got] == list(range(1, len(got) + 1))


def test_the_cluster_answers_as_the_whole_index(cluster, crops, tiny):
    whole, d = cluster
    assert request("GET", "/v1/health") == (200, {"status": "ok"})
    status, ready = request("GET", "/v1/ready")
    assert status == 200 and sorted(ready["shards"]) == ["shard-000", "shard-001"], ready
    assert sum(s["images"] for s in ready["shards"].values()) == len(crops)
    # query crops as given, and turned a quarter and mirrored (another orbit)
    turned = []
    for i in range(3):
        p = str(d / f"turned{i}.pgm")
        helpers.write_pgm(p, np.ascontiguousarray(np.rot90(helpers.crater_image(i)).T[::-1]))
        turned.append(p)
    for path in list(crops["path"][:6]) + turned:
        status, got = search_image(path)
        assert status == 200 and got["partial"] is False and got["missing_shards"] == [], got
        # searched as one index searches it: rechecked by default (the best candidates of
        # all shards verified, each by the shard that holds its image; searched again where
        # the first hit does not register)
        same_hits(got["results"], whole.search(paths=[path], top_k=5, shortlist=1000))
    # in views and verified as the request asks, and as given
    for query, asked in [("turns=4&verify=5", dict(turns=4, verify=5)),
                         ("opposite_sun=true&verify=3&group_views=false", dict(opposite_sun=True, verify=3,
                                                                              group_views=False)),
                         ("turns=3", dict(turns=3, recheck=False)), ("recheck=false", dict(recheck=False))]:
        for path in [crops["path"][1], turned[0]]:
            status, got = search_image(path, f"top_k=5&shortlist=1000&{query}")
            assert status == 200, got
            same_hits(got["results"], whole.search(paths=[path], top_k=5, shortlist=1000, **asked))
    # posted features answer as the uploaded image does
    f = tiny.extract([crops["path"][0]])
    body = json.dumps({"cls": f["cls"][0].tolist(), "patches": f["patches"][0].tolist(),
                       "attention": f["attention"][0].tolist()}).encode()
    status, got = request("POST", "/v1/search/features?top_k=5&shortlist=1000", body,
                          {"Content-Type": "application/json"})
    assert status == 200, got
    plain = search_image(crops["path"][0], "top_k=5&shortlist=1000&recheck=false")[1]["results"]
    assert [h["id"] for h in got["results"]] == [h["id"] for h in plain]
    # verified as the whole index verifies posted features
    status, got = request("POST", "/v1/search/features?top_k=5&shortlist=1000&verify=3", body,
                          {"Content-Type": "application/json"})
    assert status == 200, got
    same_hits(got["results"], whole.search(features=f, top_k=5, shortlist=1000, verify=3))
    assert request("POST", "/v1/search/features", b"{not json", {"Content-Type": "application/json"})[0] == 400
    assert request("POST", "/v1/search/image?top_k=0", *multipart({"image": b"x"}))[0] == 400


def raw(path):
    with urllib.request.urlopen(URL + path, timeout=60) as r:
        return r.status, r.headers.get("content-type"), r.read()


def test_the_cluster_answers_the_rest_of_craterdex_serves_api(cluster, crops, tiny):
    whole, _ = cluster
    # the same document (less the two routes a cluster does not serve) and the same page
    status, doc = request("GET", "/v1/openapi.json")
    served = json.loads(craterdex._native.service_document_json(tiny.dim))
    assert status == 200 and set(doc["paths"]) == set(served["paths"]) - {"/v1/register", "/v1/link/image"}
    assert doc["components"] == served["components"]
    assert {"partial", "missing_shards"} <= set(doc["components"]["schemas"]["SearchResponse"]["properties"])
    status, kind, page = raw("/")
    assert status == 200 and kind.startswith("text/html") and page.decode() == craterdex._native.service_page()
    status, body = request("GET", "/v1/stats")
    assert status == 200 and body["images"] == len(crops) and body["writes_enabled"] is True, body
    # search options read by craterdex serve's reader: its limits and its refusals
    path = crops["path"][2]
    assert search_image(path, "mode=bogus")[0] == 400
    assert search_image(path, "top_k=1001")[0] == 400
    assert search_image(path, "turns=100")[0] == 400
    # views need the query image, verification its patch tokens: refused as craterdex serve refuses them
    assert search_image(path, "turns=4&recheck=true")[0] == 200
    image_params = doc["paths"]["/v1/search/image"]["post"]["parameters"]
    assert {"turns", "opposite_sun", "verify", "recheck"} <= {p["name"] for p in image_params}
    assert request("GET", f"/v1/images/{crops['id'][0]}/similar?turns=4")[0] == 400
    assert request("GET", f"/v1/images/{crops['id'][0]}/similar?verify=3")[0] == 400
    assert search_image(path, "mode=exhaustive&top_k=3")[1]["params"] == {"mode": "exhaustive", "top_k": 3,
                                                                           "shortlist": None}
    # an indexed image: its metadata, thumbnail and similar images, from whichever shard holds it
    for id_ in crops["id"][:4]:
        status, got = request("GET", f"/v1/images/{id_}")
        crater = crops.set_index("id").loc[id_, "crater_id"]
        assert status == 200 and got["id"] == id_ and got["meta"]["crater_id"] == crater, got
        status, kind, png = raw(got["thumbnail"] + "?size=32")
        assert status == 200 and kind == "image/png" and png[:4] == b"\x89PNG"
        status, similar = request("GET", f"/v1/images/{id_}/similar?top_k=4&group_views=false")
        assert status == 200 and similar["query"] == {"kind": "indexed", "id": id_}, similar
        assert similar["results"][0]["id"] == id_ and len(similar["results"]) == 4
    assert request("GET", "/v1/images/nowhere")[0] == 404
    assert request("GET", f"/v1/images/{crops['id'][0]}/thumbnail?size=8")[0] == 400
    status, err = request("GET", "/v1/no-such-route")
    assert status == 404 and "error" in err


def test_a_link_decides_as_the_whole_index(cluster, crops, tiny):
    whole, _ = cluster
    # re-observations of catalogued craters (positions a little off) and one unseen crater
    probes = [dict(crops.iloc[i][["crater_id", "source", "lat", "lon", "diameter_km"]]) for i in (0, 5, 11, 16)]
    paths = [crops["path"][i] for i in (0, 5, 11, 16)]
    for p in probes:
        p["lat"] += 0.05
    probes.append({"lat": 40.0, "lon": 40.0, "diameter_km": 20.0})
    paths.append(crops["path"][1])
    decisions = set()
    for i, (probe, path) in enumerate(zip(probes, paths)):
        entry = {**{k: str(v) for k, v in probe.items() if k != "crater_id"}, "id": f"probe-{i}"}
        with open(path, "rb") as f:
            status, got = request("POST", "/v1/link", *multipart({"image": f.read(), **entry}))
        assert status == 200, got
        f = tiny.extract([path], ids=[entry["id"]])
        record = {"id": entry["id"], "path": path, **{k: v for k, v in probe.items() if k != "crater_id"}}
        want = whole.link([record], features=f, register=False).iloc[0]
        assert got["decision"] == want["decision"], (got, want)
        assert abs(got["confidence"] - want["confidence"]) < 1e-6
        assert (got["best"] or {}).get("id") == want["match_id"]
        assert (got["second"] or {}).get("id") == want["second_id"]
        assert got["inserted"] is False and got["images"] == len(crops)
        decisions.add(got["decision"])
    assert "match" in decisions, decisions
    # inserting needs the key; a new crater goes to the shard that owns it, once
    with open(paths[-1], "rb") as f:
        body, headers = multipart({"image": f.read(), "id": "linked-new", "lat": "60.0", "lon": "60.0",
                                   "diameter_km": "20.0"})
    assert request("POST", "/v1/link?insert=true", body, headers)[0] == 401
    status, got = request("POST", "/v1/link?insert=true", body, {**headers, "X-API-Key": KEY})
    assert status == 200, got
    if got["decision"] == "new":
        assert got["inserted"] is True and got["images"] == len(crops) + 1
        status, again = request("POST", "/v1/link?insert=true", body, {**headers, "X-API-Key": KEY})
        assert again["inserted"] is False and again["images"] == len(crops) + 1, again
        assert request("GET", "/v1/images/linked-new")[0] == 200
        assert request("DELETE", "/v1/images/linked-new", headers={"X-API-Key": KEY})[0] == 200
    else:
        assert got["inserted"] is False and got["images"] == len(crops)


def test_a_killed_replica_fails_no_request(cluster, crops):
    def kill_a_replica():
        victim = replicas_of("shard-000")[0]
        ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]), no_restart=False)

    answers, failures = searches_during(kill_a_replica, list(crops["path"][:8]))
    assert failures == [] and len(answers) == 40, failures[:2]


def test_writes_go_to_the_owning_shard_and_survive_its_replicas(cluster, crops):
    _, d = cluster
    src = crops["path"][3]
    with open(src, "rb") as f:
        image = f.read()
    fields = {"image": image, "id": "added-1", "crater_id": "new-crater"}
    assert request("POST", "/v1/images", *multipart(fields))[0] == 401
    body, headers = multipart(fields)
    status, added = request("POST", "/v1/images", body, {**headers, "X-API-Key": KEY})
    assert status == 201, added
    owner = craterdex._native.shards_of(json.dumps([{"id": "added-1", "crater_id": "new-crater"}]), 2)[0]
    assert added["shard"] == f"shard-{owner:03d}"
    status, again = request("POST", "/v1/images", body, {**headers, "X-API-Key": KEY})
    assert status == 409, again
    # every replica of the owner sees it (the sibling reads what the other wrote) ...
    for _ in range(4):
        ids = [h["id"] for h in search_image(src, "top_k=10")[1]["results"]]
        assert "added-1" in ids
    # ... and so do fresh replicas after both die
    for victim in replicas_of(f"shard-{owner:03d}"):
        ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]), no_restart=False)
    deadline = time.time() + 120
    while request("GET", "/v1/ready")[0] != 200 and time.time() < deadline:
        time.sleep(1)
    ids = [h["id"] for h in search_image(src, "top_k=10")[1]["results"]]
    assert "added-1" in ids
    # "images": what the whole set holds, as craterdex serve answers for its index
    assert sum(len(craterdex.Index.open(d / "set" / f"shard-{s:03d}")) for s in (0, 1)) == added["images"]
    assert added["images"] == len(crops) + 1
    # removed through the router, from whichever shard holds it
    assert request("DELETE", "/v1/images/added-1")[0] == 401
    status, removed = request("DELETE", "/v1/images/added-1", headers={"X-API-Key": KEY})
    assert status == 200 and removed["removed"] == "added-1" and removed["images"] == len(crops), removed
    assert request("DELETE", "/v1/images/added-1", headers={"X-API-Key": KEY})[0] == 404
    for _ in range(3):
        assert "added-1" not in [h["id"] for h in search_image(src, "top_k=10")[1]["results"]]


def test_a_shard_without_a_working_replica_gives_marked_partial_answers(cluster, crops):
    _, d = cluster
    manifest = d / "set" / "shard-001" / "index.json"
    aside = d / "index.json.aside"
    os.rename(manifest, aside)
    try:
        status, got = search_image(crops["path"][0], "top_k=10")
        assert status == 200 and got["partial"] is True and got["missing_shards"] == ["shard-001"], got
        shard0 = set(craterdex.Index.open(d / "set" / "shard-000").metadata()["id"])
        assert got["results"] and {h["id"] for h in got["results"]} <= shard0
        status, ready = request("GET", "/v1/ready")
        assert status == 503 and ready["missing_shards"] == ["shard-001"]
        # a write owned by the missing shard is refused, not lost or misplaced
        ids = [f"w{i}" for i in range(20)]
        owners = craterdex._native.shards_of(json.dumps([{"id": i} for i in ids]), 2)
        orphan = ids[owners.index(1)]
        with open(crops["path"][1], "rb") as f:
            body, headers = multipart({"image": f.read(), "id": orphan})
        status, err = request("POST", "/v1/images", body, {**headers, "X-API-Key": KEY})
        assert status == 503 and "shard-001" in err["error"]["message"], err
    finally:
        os.rename(aside, manifest)
    status, got = search_image(crops["path"][0], "top_k=10")
    assert status == 200 and got["partial"] is False


def test_a_lost_node_loses_no_request(cluster, crops, tiny):
    """Last, on a cluster of its own: a head and two worker nodes (ray.cluster_utils, all on
    loopback), each shard's replicas on different workers, the router on the head; one
    worker removed while searches run: every request is answered, and all shards answer."""
    from ray.cluster_utils import Cluster

    _, d = cluster
    serve.shutdown()
    ray.shutdown()
    holds = {cc.shard_resource(n): 1 for n in cc.shard_names(str(d / "set"))}
    nodes = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "node_ip_address": "127.0.0.1", "include_dashboard": False, "resources": {"ingress": 1}})
    workers = [nodes.add_node(num_cpus=2, node_ip_address="127.0.0.1", resources=holds) for _ in range(2)]
    try:
        ray.init(address=nodes.address, log_to_driver=False)
        cc.serve_shards(str(d / "set"), port=PORT, proxy_on_every_node=False, replicas=2, model=tiny,
                        replica_cpus=0.2, place_by_resource=True, one_replica_per_node=True,
                        router_resources={"ingress": 0.01})
        answers, failures = searches_during(lambda: nodes.remove_node(workers[0]), list(crops["path"][:8]))
        assert failures == [] and len(answers) == 40, failures[:2]
        status, ready = request("GET", "/v1/ready")
        assert status == 200, ready
    finally:
        serve.shutdown()
        ray.shutdown()
        nodes.shutdown()
