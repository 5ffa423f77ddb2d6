#!/usr/bin/env python3
"""Extraction + encoding throughput of an index build: the single-process CLI against
craterdex.dask on a LocalCluster with 1 and 2 worker processes, on this machine, in one
run; then a projection to a cluster from the measured cost per image.

    python3 scripts/bench_dask.py --dir craterdex-demo/bench/images --bin target/release/craterdex

Prints a table (images/s, ratio to the CLI) and the projection; the feature cache is off
everywhere so that every image is extracted. Needs the `craterdex` package
(pip install ./crates/python) and dask[distributed] (scripts/requirements-python.txt).
"""

import argparse
import os
import shutil
import subprocess
import tempfile
import time

import craterdex
import craterdex.dask as cdask
import distributed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="a directory of crater crops")
    ap.add_argument("--bin", default="target/release/craterdex")
    ap.add_argument("--images", type=int, default=256, help="how many of the crops")
    ap.add_argument("--partition", type=int, default=32)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--cores", type=int, default=32)
    ap.add_argument("--target", type=int, default=1_000_000)
    a = ap.parse_args()

    entries = craterdex.entries_from_dir(a.dir).iloc[: a.images].reset_index(drop=True)
    n = len(entries)
    work = tempfile.mkdtemp(prefix="craterdex-bench-dask-")
    crops = os.path.join(work, "crops")
    os.makedirs(crops)
    for i, p in enumerate(entries["path"]):
        os.symlink(os.path.abspath(p), os.path.join(crops, f"{i:06d}{os.path.splitext(p)[1]}"))
    entries = craterdex.entries_from_dir(crops)
    cores = os.cpu_count()
    print(f"{n} crops from {a.dir}; {cores} cores; {craterdex.cpu()}")

    rows = []
    t = time.perf_counter()
    subprocess.run([a.bin, "index", "build", "--dir", crops, "--out", os.path.join(work, "cli"), "--no-cache"],
                   check=True, capture_output=True)
    cli_s = time.perf_counter() - t
    rows.append(("CLI index build (1 process, rayon on all cores)", cli_s))

    model = craterdex.Model.load(cache=False)
    phases = {}
    for workers in (1, 2):
        threads = max(1, cores // workers)
        with distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                      dashboard_address=None, host="127.0.0.1",
                                      env={"RAYON_NUM_THREADS": str(threads)}) as cluster, \
                distributed.Client(cluster) as client:
            client.run(craterdex._load_cached, tuple(sorted(model._spec.items())))  # models loaded
            t = time.perf_counter()
            timings = {}
            cdask.build_index(client, entries, os.path.join(work, f"dask{workers}"), model=model,
                              partition_size=a.partition, timings=timings)
            rows.append((f"dask, {workers} worker process(es) x {threads} threads", time.perf_counter() - t))
            phases[workers] = timings

    print(f"\n{'run':<52} {'s':>7} {'images/s':>9} {'vs CLI':>7}")
    for name, s in rows:
        print(f"{name:<52} {s:7.1f} {n / s:9.2f} {cli_s / s:7.2f}x")
    print(f"\n{'dask phases':<32} {'plan s':>7} {'parts s':>8} {'parts images/s':>15} {'vs CLI':>7} {'commit s':>9}")
    for w, t in phases.items():
        print(f"{w} worker(s){'':<22} {t['plan']:7.1f} {t['parts']:8.1f} {n / t['parts']:15.2f}"
              f" {cli_s / t['parts']:7.2f}x {t['commit']:9.2f}")
    print(f"(the plan extracts the learn sample, here all {n} images, in one task; at 1,000,000 images"
          f" it is 8,192 of them)")

    best = min(phases.values(), key=lambda t: t["parts"])
    part_core_s = best["parts"] * cores / n
    plan_s_per_image = phases[1]["plan"] / n  # one task using every core of one machine
    commit_s_per_image = best["commit"] / n
    cluster_cores = a.nodes * a.cores
    sample = min(a.target, 8192)
    plan_h = sample * plan_s_per_image * cores / a.cores / 3600
    parts_h = a.target * part_core_s / cluster_cores / 3600
    commit_h = a.target * commit_s_per_image / 3600
    print(f"\nprojection for {a.target:,} images on {a.nodes} nodes x {a.cores} cores ({cluster_cores} cores),"
          f" from this run's per-image costs, same per-core speed, linear scaling:")
    print(f"  plan:   {sample:,} sample images in one task on one {a.cores}-core node: {plan_h:.2f} h")
    print(f"  parts:  {part_core_s:.3f} core-seconds per image: {parts_h:.2f} h")
    print(f"  commit: {commit_s_per_image * 1e3:.2f} ms per image, one process: {commit_h:.2f} h"
          f" (local disk here; a shared filesystem is slower)")
    print(f"  total:  {plan_h + parts_h + commit_h:.2f} h")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
