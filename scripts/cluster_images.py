"""Query images searched through craterdex.cluster against one `craterdex serve`, same run.

The index is served by `craterdex serve` (with the model), then its shard set by
craterdex.cluster (one replica per shard, the encoder and the router) on this machine; each
query image of a CraterBench-R manifest is posted to each in turn, one at a time, to
`/v1/search/image` with the same options (the default: rechecked). Prints, for each server,
R@1 against the manifest's labels and the latency per query (p50, mean), then how many first
hits and what share of the top-k the two answers share, and how many cluster answers were
partial.

Ray must run inside a network namespace made for it (see scripts/cluster_test.sh):

    unshare -n bash -c 'ip link set lo up; RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled \
      target/ci-venv-py/bin/python scripts/cluster_images.py --bin target/release/craterdex \
      --index nac-idx --shards nac-set --manifest nac-rot/splits/test_rotated.json'
"""

import argparse
import json
import os
import subprocess
import time
import urllib.request
import uuid

import numpy as np

from bench_cluster import wait_ready  # scripts/ is on the path of a script run from it


def post_image(url, data, timeout=600):
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"q.png\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read())
    return time.perf_counter() - t, out


def run(url, queries, options):
    """Each query posted in turn: latencies (s) and answers."""
    lat, answers = [], []
    for q in queries:
        with open(q["file"], "rb") as f:
            dt, out = post_image(f"{url}/v1/search/image?{options}", f.read())
        lat.append(dt)
        answers.append(out)
    return np.array(lat), answers


def recall_at_1(queries, answers):
    found = [bool(a["results"]) and a["results"][0].get("crater_id") in q["relevant"] for q, a in zip(queries, answers)]
    return float(np.mean(found))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--index", required=True, help="the whole index")
    p.add_argument("--shards", required=True, help="its shard set (craterdex index split)")
    p.add_argument("--manifest", required=True, help="a CraterBench-R manifest whose query images are posted")
    p.add_argument("--queries", type=int, default=0, help="the first N queries (0: all)")
    p.add_argument("--options", default="top_k=10", help="the search's query string")
    p.add_argument("--model", default=None)
    a = p.parse_args()

    import craterdex
    import craterdex.cluster as cc
    import ray
    from ray import serve

    print(craterdex._native.cpu())
    with open(a.manifest) as f:
        m = json.load(f)
    root = os.path.dirname(os.path.dirname(os.path.abspath(a.manifest)))
    queries = [{"file": os.path.join(root, q["path"]), "relevant": set(q.get("relevant_crater_ids") or [q["crater_id"]])}
               for q in m["query_images"]]
    queries = queries[: a.queries] if a.queries else queries
    print(f"{len(queries)} query images of {a.manifest}, one at a time, /v1/search/image?{a.options}")

    args = [a.bin, "serve", "--index", a.index, "--addr", "127.0.0.1:8821"] + (["--model", a.model] if a.model else [])
    server = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    try:
        wait_ready("http://127.0.0.1:8821")
        lat_one, one = run("http://127.0.0.1:8821", queries, a.options)
    finally:
        server.terminate()
        server.wait()

    model = craterdex.Model.load(a.model) if a.model else craterdex.Model.load()
    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False)
    try:
        n = len(cc.shard_names(a.shards))
        serve.start(http_options={"host": "127.0.0.1", "port": 8822})
        serve.run(cc.application(a.shards, replicas=1, model=model, replica_cpus=0.01), name="craterdex",
                  route_prefix="/")
        wait_ready("http://127.0.0.1:8822")
        lat_set, on_set = run("http://127.0.0.1:8822", queries, a.options)
    finally:
        serve.shutdown()
        ray.shutdown()

    print(f"{'server':<26} {'R@1':>6} {'p50 ms':>9} {'mean ms':>9}")
    for name, lat, answers in [("craterdex serve", lat_one, one), (f"cluster, {n} shards x 1", lat_set, on_set)]:
        print(f"{name:<26} {recall_at_1(queries, answers):>6.3f} {np.percentile(lat * 1e3, 50):>9.1f} "
              f"{lat.mean() * 1e3:>9.1f}")
    firsts = sum(bool(x["results"]) and bool(y["results"]) and x["results"][0]["id"] == y["results"][0]["id"]
                 for x, y in zip(one, on_set))
    shared = [len({h["id"] for h in x["results"]} & {h["id"] for h in y["results"]}) / max(1, len(x["results"]))
              for x, y in zip(one, on_set)]
    same = sum([h["id"] for h in x["results"]] == [h["id"] for h in y["results"]] for x, y in zip(one, on_set))
    partial = sum(bool(y.get("partial")) for y in on_set)
    print(f"first hit the same: {firsts} / {len(queries)}; top-k lists identical: {same} / {len(queries)}; "
          f"top-k in common: {np.mean(shared):.3f}; partial cluster answers: {partial}")


if __name__ == "__main__":
    main()
