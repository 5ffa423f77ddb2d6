#!/usr/bin/env python3
"""Reference timings for `craterdex bench search`: faiss-cpu (flat inner product) and numpy
(MaxSim) on the data craterdex wrote, same threads. Prints one JSON object mapping
"stage/S/mode" to {"p50_ms", "p95_ms"}.
Usage: bench_search_ref.py DIR N NQ K D THREADS SINGLE_QUERIES
DIR holds little-endian f32 files: g_single [N, D], g_tokens [N, K, D], q_single [NQ, D],
q_tokens [NQ, K, D].
"""
import json, os, sys, time
import numpy as np

d_, n, nq, k, d, threads, single = sys.argv[1], *map(int, sys.argv[2:8])
load = lambda name, *shape: np.fromfile(os.path.join(d_, name), dtype="<f4").reshape(*shape)
gs, gt, qs, qt = load("g_single", n, d), load("g_tokens", n, k, d), load("q_single", nq, d), load("q_tokens", nq, k, d)
try:
    import faiss
    faiss.omp_set_num_threads(threads)
    index = faiss.IndexFlatIP(d)
    index.add(gs)
    stage1 = lambda q, s: index.search(q, s)[1]
    engine = "faiss " + faiss.__version__
except ImportError:
    def stage1(q, s):
        sc = q @ gs.T
        return np.argpartition(-sc, s, axis=1)[:, :s]
    engine = "numpy"

def maxsim(q, cand):
    # q [K, D], cand rows -> scores: mean over query tokens of max over each candidate's tokens
    docs = gt[cand]  # [n, L, D]
    sims = q @ docs.reshape(-1, d).T  # one BLAS product: [K, n*L]
    return sims.reshape(k, len(cand), -1).max(axis=2).mean(axis=0)

def pct(ts):
    ts = np.array(ts) * 1e3
    return {"p50_ms": float(np.percentile(ts, 50)), "p95_ms": float(np.percentile(ts, 95))}

out = {"engine": engine}
stage1(qs[:1], 100)
for s in (100,):
    ts = []
    for i in range(single):
        t = time.perf_counter(); stage1(qs[i:i + 1], s); ts.append(time.perf_counter() - t)
    out[f"stage1/{s}/single"] = pct(ts)
    ts = []
    for _ in range(3):
        t = time.perf_counter(); stage1(qs, s); ts.append((time.perf_counter() - t) / nq)
    out[f"stage1/{s}/batch"] = pct(ts)
for s in (100, 500):
    ts = []
    for i in range(single):
        t = time.perf_counter()
        cand = stage1(qs[i:i + 1], s)[0]
        maxsim(qt[i], cand)
        ts.append(time.perf_counter() - t)
    out[f"two_stage/{s}/single"] = pct(ts)
ts = []
for i in range(min(3, nq)):
    t = time.perf_counter()
    for start in range(0, n, 4096):
        maxsim(qt[i], np.arange(start, min(n, start + 4096)))
    ts.append(time.perf_counter() - t)
out["exhaustive/0/single"] = pct(ts)
try:
    from threadpoolctl import threadpool_info
    out["blas"] = [f"{i.get('internal_api')} {i.get('architecture')}" for i in threadpool_info()]
except ImportError:
    pass
print(json.dumps(out))
