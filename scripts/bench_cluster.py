"""Latency and throughput of craterdex.cluster against one `craterdex serve`, same run.

For the index and each shard count N: the index split into N shards served on Ray Serve
(R replicas each, one encoder, the router) on this machine, and the index itself served by
`craterdex serve`; C concurrent clients post the benchmark's query features
(`/v1/search/features`, JSON) for S seconds to each in turn. Prints p50/p95 latency,
queries/s, the ratio to `craterdex serve`, the memory of each shard replica, and the
router's overhead (client latency minus the shards' own search time).

Ray must run inside a network namespace made for it (see scripts/cluster_test.sh):

    unshare -n bash -c 'ip link set lo up; RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled \
      target/ci-venv-py/bin/python scripts/bench_cluster.py --bin target/release/craterdex \
      --index craterdex-demo/index --manifest craterdex-demo/bench/splits/test.json'
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np


def post(url, body, timeout=60):
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read())
    return time.perf_counter() - t, out


def load(url, bodies, clients, seconds):
    """`clients` threads posting `bodies` in turn for `seconds`: latencies (s), answers'
    own search times (ms), errors."""
    stop = time.perf_counter() + seconds
    lat, inner, errors = [], [], [0]
    lock = threading.Lock()

    def client(k):
        i = k
        while time.perf_counter() < stop:
            try:
                dt, out = post(url, bodies[i % len(bodies)])
                with lock:
                    lat.append(dt)
                    inner.append(out["timing_ms"]["search"])
                    if out.get("partial"):
                        errors[0] += 1
            except Exception:
                with lock:
                    errors[0] += 1
            i += clients

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return np.array(lat), np.array(inner), errors[0]


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def wait_ready(url, seconds=180):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/v1/ready", timeout=5) as r:
                if r.status == 200:
                    return json.loads(r.read())
        except Exception:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} not ready after {seconds} s")


def row(name, lat, inner, errors, seconds, reference_p50=None, extra=""):
    p50, p95 = np.percentile(lat * 1e3, 50), np.percentile(lat * 1e3, 95)
    ratio = f"{p50 / reference_p50:.2f}x" if reference_p50 else "1.00x"
    overhead = p50 - np.percentile(inner, 50)
    print(f"{name:<22} {len(lat) / seconds:>8.1f} {p50:>9.2f} {p95:>9.2f} {ratio:>7} {overhead:>14.2f} {errors:>7}  {extra}",
          flush=True)
    return p50


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--index", required=True)
    p.add_argument("--manifest", required=True)
    p.add_argument("--shards", default="1,2,4")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=15)
    p.add_argument("--queries", type=int, default=32)
    p.add_argument("--model", default=None)
    a = p.parse_args()

    import craterdex
    import craterdex.cluster as cc
    import ray
    from ray import serve

    print(craterdex._native.cpu())
    model = craterdex.Model.load(a.model) if a.model else craterdex.Model.load()
    with open(a.manifest) as f:
        m = json.load(f)
    root = os.path.dirname(os.path.dirname(os.path.abspath(a.manifest)))
    paths = [os.path.join(root, q["path"]) for q in m["query_images"][: a.queries]]
    f = model.extract(paths)
    bodies = [json.dumps({"cls": f["cls"][i].tolist(), "patches": f["patches"][i].tolist(),
                          "attention": f["attention"][i].tolist()}).encode() for i in range(len(f["ids"]))]
    print(f"{len(bodies)} query feature sets of {a.manifest} ({len(bodies[0]) / 1e6:.1f} MB of JSON each), "
          f"{a.clients} clients, {a.seconds:.0f} s per server, /v1/search/features?top_k=10")
    print(f"{'server':<22} {'queries/s':>8} {'p50 ms':>9} {'p95 ms':>9} {'ratio':>7} {'overhead ms':>14} {'errors':>7}")
    work = tempfile.mkdtemp(prefix="craterdex-bench-cluster")
    server = subprocess.Popen([a.bin, "serve", "--index", a.index, "--addr", "127.0.0.1:8811", "--no-model"],
                              stderr=subprocess.DEVNULL)
    try:
        wait_ready("http://127.0.0.1:8811")
        lat, inner, err = load("http://127.0.0.1:8811/v1/search/features?top_k=10", bodies, a.clients, a.seconds)
        reference = row("craterdex serve", lat, inner, err, a.seconds, extra=f"RSS {rss_mb(server.pid):.0f} MB")
    finally:
        server.terminate()
        server.wait()
    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False)
    try:
        for n in [int(x) for x in a.shards.split(",")]:
            out = os.path.join(work, f"set{n}")
            subprocess.run([a.bin, "index", "split", "--index", a.index, "--shards", str(n), "--out", out],
                           check=True, capture_output=True)
            serve.start(http_options={"host": "127.0.0.1", "port": 8812})
            serve.run(cc.application(out, replicas=a.replicas, model=model, replica_cpus=0.01),
                      name="craterdex", route_prefix="/")
            ready = wait_ready("http://127.0.0.1:8812")
            lat, inner, err = load("http://127.0.0.1:8812/v1/search/features?top_k=10", bodies, a.clients, a.seconds)
            mem = " ".join(f"{rss_mb(s['pid']):.0f}" for s in ready["shards"].values())
            row(f"cluster, {n} shard{'s' if n > 1 else ''} x {a.replicas}", lat, inner, err, a.seconds, reference,
                extra=f"replica RSS {mem} MB")
            serve.delete("craterdex")
    finally:
        serve.shutdown()
        ray.shutdown()
    print("overhead: client latency p50 minus the p50 of the search time the answer reports (for the cluster, "
          "the router's scatter, the shards' searches and the merge); ratio: p50 against craterdex serve")


if __name__ == "__main__":
    sys.exit(main())
