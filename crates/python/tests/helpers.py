"""Test data and a model that kills its worker, importable by Dask worker processes
(the tests put this folder on their PYTHONPATH)."""

import json
import os
import struct

import numpy as np

import craterdex

D, P, G = 32, 4, 4  # the Rust tests' tiny ViT: width 32, 4-pixel patches, a 4x4 grid


def tiny_checkpoint(path):
    """A one-block Meta/timm-layout ViT with pseudo-random weights, as safetensors (the
    layout of a real checkpoint, so `Model.import_file` is tested on it)."""
    shapes = [("cls_token", [1, 1, D]), ("pos_embed", [1, 1 + G * G, D]),
              ("patch_embed.proj.weight", [D, 3, P, P]), ("patch_embed.proj.bias", [D]),
              ("norm.weight", [D]), ("norm.bias", [D])]
    for n, s in [("norm1.weight", [D]), ("norm1.bias", [D]), ("attn.qkv.weight", [3 * D, D]),
                 ("attn.qkv.bias", [3 * D]), ("attn.proj.weight", [D, D]), ("attn.proj.bias", [D]),
                 ("norm2.weight", [D]), ("norm2.bias", [D]), ("mlp.fc1.weight", [2 * D, D]),
                 ("mlp.fc1.bias", [2 * D]), ("mlp.fc2.weight", [D, 2 * D]), ("mlp.fc2.bias", [D])]:
        shapes.append((f"blocks.0.{n}", s))
    rng = np.random.default_rng(12345)
    header, blobs, offset = {}, [], 0
    for name, shape in shapes:
        v = (rng.random(int(np.prod(shape)), dtype=np.float32) - 0.5)
        v = 1.0 + 0.2 * v if ("norm" in name and name.endswith("weight")) else 0.6 * v
        b = v.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    with open(os.path.join(os.path.dirname(path), "config.json"), "w") as f:
        f.write('{"num_heads": 2}')
    return path


def bright_detector(dir):
    """A craterdex detector directory whose craters are bright discs on a dark image: one
    3x3 convolution marking pixels brighter than mid-grey (craterdex_detect::testing's)."""
    import hashlib
    tensors = [("mark/bias", [1], np.array([-20.0], "<f4")),
               ("mark/kernel", [3, 3, 1, 1], np.array([0, 0, 0, 0, 40.0, 0, 0, 0, 0], "<f4"))]
    header, blobs, offset = {}, [], 0
    for name, shape, v in tensors:
        b = v.tobytes()
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    weights = struct.pack("<Q", len(h)) + h + b"".join(blobs)
    graph = {"layers": [{"name": "in", "op": "input", "channels": 1, "inputs": []},
                        {"name": "mark", "op": "conv", "filters": 1, "kernel": [3, 3], "stride": [1, 1],
                         "padding": "valid", "activation": "sigmoid", "inputs": [0]}]}
    config = {"format": "craterdex-detector-1", "name": "brightness", "source": "generated",
              "licence": "MIT", "tile": 24, "input_scale": 1 / 255, "graph": graph,
              "weights_sha256": hashlib.sha256(weights).hexdigest()}
    os.makedirs(dir, exist_ok=True)
    with open(os.path.join(dir, "weights.safetensors"), "wb") as f:
        f.write(weights)
    with open(os.path.join(dir, "detector.json"), "w") as f:
        json.dump(config, f)
    return dir


def discs(width, height, craters):
    """A dark image with bright discs (x, y, diameter)."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float64)
    a = np.full((height, width), 20, np.uint8)
    for x, y, d in craters:
        a[np.hypot(xx - x, yy - y) <= d / 2] = 230
    return a


def crater_image(seed, size=32, shift=(0, 0)):
    """A textured crop with a dark bowl; `seed` picks the crater's look, `shift` moves the
    view (a second observation of the same crater)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    fx, fy, r = rng.uniform(0.1, 0.5), rng.uniform(0.1, 0.5), rng.uniform(5, 12)
    v = 140 + 40 * np.sin((xx + shift[0]) * fx) * np.cos((yy + shift[1]) * fy)
    d = np.hypot(xx - size / 2 - shift[0], yy - size / 2 - shift[1])
    v = v - np.where(d < r, 70 * (1 - d / r), 0) + rng.normal(0, 3, v.shape)
    return np.clip(v, 0, 255).astype(np.uint8)


def disc_scene(tmp_path, model, side=420, count=24):
    """A catalogue index of crops of bright discs at places no grid repeats (all but the
    first two discs, in their image's pixels) and the discs (x, y, diameter)."""
    import pandas as pd
    rng = np.random.default_rng(7)
    craters = []
    while len(craters) < count:
        d = float(rng.uniform(12, 36))
        x, y = (float(v) for v in rng.uniform(d, side - d, 2).round())
        if all(np.hypot(x - u, y - v) > (d + e) / 2 + 10 for u, v, e in craters):
            craters.append((x, y, round(d)))
    first = discs(side, side, craters)
    os.makedirs(tmp_path / "cat")
    rows = []
    for i, (x, y, d) in enumerate(craters[2:], start=2):
        p = str(tmp_path / "cat" / f"d{i}.pgm")
        write_pgm(p, first[int(y - d):int(y + d), int(x - d):int(x + d)].copy())
        rows.append({"id": f"d{i}", "path": p, "crater_id": f"d{i}", "source": "catalogue",
                     "x": x, "y": y, "diameter_px": float(d)})
    return craterdex.Index.build(tmp_path / "idx", pd.DataFrame(rows), model=model), craters


def write_pgm(path, a):
    with open(path, "wb") as f:
        f.write(b"P5\n%d %d\n255\n" % (a.shape[1], a.shape[0]) + a.tobytes())


def catalogue(dir, craters=24, views=2):
    """Crops of `craters` craters, `views` each, as PGM files, with an entry table: ids
    c{i}v{j}, positions spread over several latitude bands, two views a little apart."""
    os.makedirs(dir, exist_ok=True)
    rows = []
    for i in range(craters):
        for j in range(views):
            rid = f"c{i:03d}v{j}"
            p = os.path.join(dir, rid + ".pgm")
            write_pgm(p, crater_image(i, shift=(j, -j)))
            rows.append({"id": rid, "path": p, "crater_id": f"c{i}", "source": f"img{j}",
                         "lat": -6.0 + (i % 12) * 1.1 + 0.02 * j, "lon": (i // 12) * 0.4,
                         "diameter_km": 20.0})
    import pandas as pd
    return pd.DataFrame(rows)


class DyingModel(craterdex.Model):
    """A model that kills the worker process using it the `die_at`-th time a task on any
    worker reaches for it (counted across processes in `counter_dir`): a worker lost in
    the middle of a job, with its task unfinished."""

    def __init__(self, model, counter_dir, die_at):
        self._real, self._spec = model._native, model._spec
        self.counter_dir, self.die_at = counter_dir, die_at

    @property
    def _native(self):
        if _in_worker() and _claim(self.counter_dir) == self.die_at:
            os._exit(17)
        return self._real

    def __reduce__(self):
        return (_rebuild, (self.counter_dir, self.die_at, tuple(sorted(self._spec.items()))))


# the test's own process; worker processes inherit the variable and have other pids
os.environ.setdefault("CRATERDEX_TEST_PID", str(os.getpid()))


def _in_worker():
    return str(os.getpid()) != os.environ["CRATERDEX_TEST_PID"]


def _claim(counter_dir):
    """The next number, atomically across processes."""
    n = 0
    while True:
        try:
            os.close(os.open(os.path.join(counter_dir, f"seen-{n}"), os.O_CREAT | os.O_EXCL))
            return n
        except FileExistsError:
            n += 1


def _rebuild(counter_dir, die_at, spec):
    return DyingModel(craterdex._load_cached(spec), counter_dir, die_at)
