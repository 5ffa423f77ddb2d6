"""Serving a set of shard indexes on Ray Serve (``pip install 'craterdex[cluster]'``).

A catalogue too large for one machine is cut into shard indexes (``craterdex index split
--shards N`` or ``craterdex.dask.build_index(..., shards=N)``). This module serves such a
set with Ray Serve, an existing distributed engine: Ray gives the replicas, restarts them
when they die, routes calls to live ones and runs the HTTP ingress; craterdex's own engine
answers inside every shard replica. The application:

* one deployment per shard, ``R`` replicas each (:class:`ShardReplica`: the shard's index,
  opened without a model, searched by descriptors);
* an encoder deployment (:class:`Encoder`) that runs the model once per query image;
* a router (:class:`Router`, the HTTP ingress) that encodes a query once with the set's
  shared encoder, scatters its descriptors to every shard, retries a failed call once (Ray
  routes the retry to a live replica), merges the lists (``craterdex search --shards``
  merges them the same way: by score, views of one crater together), and routes an added
  image to the shard that owns its crater.

The router answers ``craterdex serve``'s routes ``/v1/health``, ``/v1/ready``,
``/v1/search/image``, ``/v1/search/features`` (a features JSON document or a safetensors
body, read by the engine's own reader) and ``/v1/images`` (POST, with the API key) with the
same request forms and response fields. When every replica of a shard fails, a
search answers the other shards' hits with ``partial: true`` and the missing shards named,
never a silently short list; an add to that shard answers 503.

Start it against a running Ray cluster (``ray start --head``; on other nodes ``ray start
--address HEAD:6379``)::

    python -m craterdex.cluster serve --shards SET --replicas 2 --model PATH --port 8000
"""


import argparse
import asyncio
import hmac
import json
import os
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _SEARCH, Index, Model, _native

try:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
    from ray import serve
except ImportError as e:  # pragma: no cover - said once, clearly
    raise ImportError("craterdex.cluster needs Ray Serve: pip install 'craterdex[cluster]'") from e

__all__ = ["ShardReplica", "Encoder", "Router", "application", "serve_shards", "shard_names", "shard_resource"]


def shard_names(shards_dir: str) -> List[str]:
    """The shard directories of a set, in order, from its ``shards.json``."""
    with open(os.path.join(shards_dir, "shards.json")) as f:
        return [s["name"] for s in json.load(f)["shards"]]


class ShardReplica:
    """One replica of one shard: its index, opened without a model (queries come as
    features from the encoder)."""

    def __init__(self, shard_dir: str):
        self.shard_dir = shard_dir
        self.index = Index.open(shard_dir)

    def search(self, ids: List[str], single: np.ndarray, tokens: np.ndarray, options_json: str) -> str:
        """Hits of each query's descriptors (JSON, as ``Index.search`` finds them), with what
        the shard's other replicas wrote."""
        self.index.refresh()
        return self.index._native.search_descriptors_json(ids, single, tokens, options_json)

    def add(self, records_json: str, ids: List[str], cls: np.ndarray, patches: np.ndarray,
            attention: np.ndarray) -> int:
        """Adds images (their records and features); returns the shard's image count."""
        self.index.add(json.loads(records_json), features={"ids": ids, "cls": cls, "patches": patches,
                                                           "attention": attention})
        return len(self.index)

    def remove(self, ids: List[str]) -> Tuple[int, int]:
        """Removes images by id; returns how many were here and the shard's image count."""
        n = self.index.remove(ids)
        return n, len(self.index)

    def ready(self) -> Dict[str, Any]:
        self.index.refresh()
        return {"images": len(self.index), "pid": os.getpid()}


class Encoder:
    """Runs the model: features of uploaded images, once per image for all shards."""

    def __init__(self, model: Model):
        self.model = model

    def extract(self, images: List[bytes]) -> Dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="craterdex-upload") as d:
            paths = []
            for i, data in enumerate(images):
                p = os.path.join(d, f"{i}")
                with open(p, "wb") as f:
                    f.write(data)
                paths.append(p)
            return self.model.extract(paths, ids=[str(i) for i in range(len(images))])

    def ready(self) -> Dict[str, Any]:
        return {"model": self.model.fingerprint}


def _error(status: int, message: str) -> JSONResponse:
    """An error as ``craterdex serve`` writes it."""
    return JSONResponse({"error": {"status": status, "message": message}}, status_code=status)


class _Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _search_options(request: Request) -> Dict[str, Any]:
    q = request.query_params
    opts = dict(_SEARCH)
    try:
        for key, kind in (("top_k", int), ("shortlist", int), ("nprobe", int)):
            if key in q:
                opts[key] = kind(q[key])
    except ValueError as e:
        raise _Refused(400, f"query parameter: {e}")
    if "mode" in q:
        opts["mode"] = q["mode"]
    if "group_views" in q:
        opts["group_views"] = q["group_views"].lower() in ("1", "true", "yes")
    for key in ("top_k", "shortlist"):
        if opts.get(key) is not None and not (1 <= opts[key] <= 10_000):
            raise _Refused(400, f"{key} must be between 1 and 10000")
    return opts


def _ms(seconds: float) -> float:
    return round(seconds * 1e6) / 1e3


def _quote(id_: str) -> str:
    from urllib.parse import quote

    return quote(id_, safe="-_.~")


# Ray Serve takes the router's class as it is defined: what it calls is defined above it.
app = FastAPI(title="craterdex cluster", description="craterdex serve's API over a set of shard indexes")


@serve.deployment
@serve.ingress(app)
class Router:
    """The HTTP ingress: scatters queries to every shard and merges their hits."""

    def __init__(self, shards: List[Any], names: List[str], encoder: Any, dim: int, encoder_json: bytes,
                 api_key: Optional[str] = None, call_timeout_s: float = 30.0):
        self.shards, self.names, self.encoder, self.dim = shards, names, encoder, dim
        # the shards' shared encoder: each query is encoded once, here, and its descriptors
        # (K tokens) go to every shard rather than its features (every patch token)
        self.query_encoder = _native.QueryEncoder(encoder_json)
        self.api_key = api_key
        self.call_timeout_s = call_timeout_s

    async def _call(self, handle: Any, method: str, *args) -> Any:
        """A call to one replica of a deployment, retried once (Ray routes the retry to a
        live replica) before it counts as failed."""
        last: Optional[BaseException] = None
        for _ in range(2):
            try:
                return await asyncio.wait_for(getattr(handle, method).remote(*args), self.call_timeout_s)
            except Exception as e:  # a dead replica, a timeout, the shard's own error
                last = e
        raise last  # type: ignore[misc]

    async def _search(self, features: Dict[str, Any], opts: Dict[str, Any]) -> Tuple[List[Dict], List[str]]:
        ids = list(features["ids"])
        try:
            desc = self.query_encoder.encode(ids, features["cls"], features["patches"], features["attention"])
        except Exception as e:  # features of another width than the set's encoder
            raise _Refused(422, str(e))
        args = (ids, desc["single"], desc["tokens"], json.dumps(opts))
        answers = await asyncio.gather(*(self._call(s, "search", *args) for s in self.shards),
                                       return_exceptions=True)
        missing = [n for n, a in zip(self.names, answers) if isinstance(a, BaseException)]
        lists = [json.loads(a) for a in answers if not isinstance(a, BaseException)]
        if not lists:
            raise _Refused(503, f"no shard answered ({', '.join(missing)})")
        merged = []
        for q in range(len(ids)):
            per_shard = json.dumps([shard[q]["results"] for shard in lists])
            merged.append(json.loads(_native.merge_hits_json(per_shard, opts["top_k"], bool(opts["group_views"]))))
        return merged, missing

    def _response(self, hits: List[Dict], opts: Dict[str, Any], query: Dict[str, Any], timing: Dict[str, float],
                  missing: List[str]) -> JSONResponse:
        for h in hits:
            h["thumbnail"] = "/v1/images/" + _quote(h["id"]) + "/thumbnail"
        body = {
            "query": query,
            "params": {"mode": opts["mode"], "top_k": opts["top_k"],
                       "shortlist": opts["shortlist"] if opts["mode"] == "two-stage" else None},
            "timing_ms": timing,
            "results": hits,
            "partial": bool(missing),
            "missing_shards": missing,
        }
        return JSONResponse(body)

    @app.get("/v1/health")
    async def health(self) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/v1/ready")
    async def ready(self) -> JSONResponse:
        answers = await asyncio.gather(*(self._call(s, "ready") for s in self.shards), return_exceptions=True)
        shards = {n: (None if isinstance(a, BaseException) else a) for n, a in zip(self.names, answers)}
        missing = [n for n, a in shards.items() if a is None]
        body = {"ready": not missing, "shards": shards, "missing_shards": missing}
        return JSONResponse(body, status_code=503 if missing else 200)

    @app.post("/v1/search/image")
    async def search_image(self, request: Request) -> JSONResponse:
        try:
            opts = _search_options(request)
            form = await request.form()
            upload = form.get("image")
            if upload is None or not hasattr(upload, "read"):
                raise _Refused(400, "multipart field `image` is missing")
            data = await upload.read()
            t0 = time.perf_counter()
            try:
                features = await self._call(self.encoder, "extract", [data])
            except Exception as e:
                raise _Refused(422, f"unreadable image: {e}")
            if len(features["ids"]) == 0:
                raise _Refused(422, "unreadable image")
            t1 = time.perf_counter()
            hits, missing = await self._search(features, opts)
            t2 = time.perf_counter()
        except _Refused as r:
            return _error(r.status, r.message)
        return self._response(hits[0], opts, {"kind": "image", "bytes": len(data)},
                              {"features": _ms(t1 - t0), "search": _ms(t2 - t1)}, missing)

    @app.post("/v1/search/features")
    async def search_features(self, request: Request) -> JSONResponse:
        try:
            opts = _search_options(request)
            posted = _native.posted_features(await request.body(), request.headers.get("content-type", ""),
                                             self.dim)
            if "error" in posted:
                raise _Refused(400 if posted["error"] == "malformed" else 422, posted["message"])
            t0 = time.perf_counter()
            hits, missing = await self._search(posted, opts)
            t1 = time.perf_counter()
        except _Refused as r:
            return _error(r.status, r.message)
        return self._response(hits[0], opts, {"kind": "features"}, {"search": _ms(t1 - t0)}, missing)

    @app.post("/v1/images")
    async def add_image(self, request: Request) -> JSONResponse:
        try:
            self._authorize(request)
            form = await request.form()
            upload = form.get("image")
            if upload is None or not hasattr(upload, "read"):
                raise _Refused(400, "multipart field `image` is missing")
            data = await upload.read()
            record = {k: v for k, v in form.items() if k != "image" and isinstance(v, str) and v != ""}
            if "id" not in record:
                raise _Refused(400, "field `id` is required on a cluster (it chooses the shard)")
            records = json.dumps([record])
            owner = _native.shards_of(records, len(self.shards))[0]
            features = await self._call(self.encoder, "extract", [data])
            if len(features["ids"]) == 0:
                raise _Refused(422, "unreadable image")
            ids = [record["id"]]
            try:
                images = await self._call(self.shards[owner], "add", records, ids, features["cls"],
                                          features["patches"], features["attention"])
            except Exception as e:
                text = str(e)
                if "already in the index" in text or "were removed earlier" in text:
                    raise _Refused(409, f"image id {record['id']!r} is already in the index")
                raise _Refused(503, f"shard {self.names[owner]} has no live replica: {text.splitlines()[0]}")
        except _Refused as r:
            return _error(r.status, r.message)
        return JSONResponse({"id": record["id"], "images": images, "shard": self.names[owner],
                             "thumbnail": "/v1/images/" + _quote(record["id"]) + "/thumbnail"}, status_code=201)

    @app.delete("/v1/images/{image_id:path}")
    async def remove_image(self, image_id: str, request: Request) -> JSONResponse:
        """Removes an image: asked of every shard, since only the crater id, which the
        request does not carry, names the owner."""
        try:
            self._authorize(request)
            answers = await asyncio.gather(*(self._call(s, "remove", [image_id]) for s in self.shards),
                                           return_exceptions=True)
            missing = [n for n, a in zip(self.names, answers) if isinstance(a, BaseException)]
            done = [a for a in answers if not isinstance(a, BaseException)]
            if not any(n for n, _ in done):
                if missing:
                    raise _Refused(503, f"image {image_id!r} not found in the shards that answered; "
                                        f"{', '.join(missing)} did not")
                raise _Refused(404, f"no image {image_id!r} in the index")
        except _Refused as r:
            return _error(r.status, r.message)
        return JSONResponse({"removed": image_id, "images": sum(n for _, n in done)})

    def _authorize(self, request: Request) -> None:
        if self.api_key is None:
            raise _Refused(403, "writes are disabled: the cluster runs without an API key")
        given = request.headers.get("x-api-key") or request.headers.get("authorization", "").removeprefix("Bearer ")
        if not given:
            raise _Refused(401, "this route needs the API key (X-API-Key or Authorization: Bearer)")
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            raise _Refused(403, "wrong API key")


def shard_resource(name: str) -> str:
    """The Ray resource a node declares to hold shard ``name``'s files (``ray start
    --resources '{"craterdex-shard-000": 1}'``)."""
    return f"craterdex-{name}"


def application(shards_dir: str, *, replicas: int = 2, model: Optional[Model] = None,
                api_key: Optional[str] = None, replica_cpus: float = 1.0, place_by_resource: bool = False,
                one_replica_per_node: bool = False, router_resources: Optional[Dict[str, float]] = None) -> Any:
    """The Ray Serve application over the shard set in ``shards_dir``: ``replicas`` replicas
    per shard, one encoder, one router. Every node that runs a shard's replica must see its
    files at that path; with ``place_by_resource``, a shard's replicas run only on nodes that
    declare its :func:`shard_resource` (the nodes that hold its files). With
    ``one_replica_per_node`` a shard's replicas run on different nodes (a lost node takes at
    most one of them). ``router_resources``: custom resources the router needs (to keep it on
    the ingress node)."""
    shards_dir = os.path.abspath(shards_dir)
    names = shard_names(shards_dir)
    model = model or Model.load()

    def placement(name: str) -> Dict[str, Any]:
        options: Dict[str, Any] = {"num_cpus": replica_cpus}
        if place_by_resource:
            options["resources"] = {shard_resource(name): 0.001}
        return options

    spread = {"max_replicas_per_node": 1} if one_replica_per_node else {}
    shard_apps = [
        serve.deployment(ShardReplica, name=f"shard-{i:03d}", num_replicas=replicas,
                         ray_actor_options=placement(n), **spread).bind(os.path.join(shards_dir, n))
        for i, n in enumerate(names)
    ]
    encoder = serve.deployment(Encoder, name="encoder", ray_actor_options={"num_cpus": replica_cpus}).bind(model)
    with open(os.path.join(shards_dir, names[0], "encoder.json"), "rb") as f:
        encoder_json = f.read()
    router = {"num_cpus": 0.1, **({"resources": router_resources} if router_resources else {})}
    return Router.options(ray_actor_options=router).bind(shard_apps, names, encoder, model.dim, encoder_json, api_key)


def serve_shards(shards_dir: str, *, host: str = "127.0.0.1", port: int = 8000, proxy_on_every_node: bool = True,
                 blocking: bool = False, **options: Any) -> None:
    """Runs :func:`application` (``options`` are its keyword arguments) on the Ray cluster
    this process is connected to (``ray.init`` first, or it starts a local one) with HTTP on
    ``host:port``, on every node (behind a load balancer) or on the head only."""
    serve.start(http_options={"host": host, "port": port},
                proxy_location="EveryNode" if proxy_on_every_node else "HeadOnly")
    serve.run(application(shards_dir, **options), name="craterdex", route_prefix="/", blocking=blocking)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m craterdex.cluster",
                                description="Serve a set of shard indexes on a running Ray cluster.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="deploy the shards, the encoder and the router, and serve HTTP")
    s.add_argument("--shards", required=True, help="a shard set (craterdex index split --out)")
    s.add_argument("--replicas", type=int, default=2)
    s.add_argument("--model", default=None, help="model directory (default: the default model)")
    s.add_argument("--address", default="auto", help="Ray cluster address (default: the running one)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key-file", default=None, help="file with the key for writes (default: $CRATERDEX_API_KEY)")
    s.add_argument("--replica-cpus", type=float, default=1.0)
    s.add_argument("--place-by-resource", action="store_true",
                   help="run a shard's replicas only on nodes started with its resource, "
                        "--resources '{\"craterdex-shard-000\": 1}' (the nodes holding its files)")
    s.add_argument("--one-replica-per-node", action="store_true",
                   help="run a shard's replicas on different nodes (a lost node takes at most one)")
    a = p.parse_args(argv)
    import ray

    ray.init(address=a.address)
    key = open(a.api_key_file).read().strip() if a.api_key_file else os.environ.get("CRATERDEX_API_KEY") or None
    model = Model.load(a.model) if a.model else Model.load()
    serve_shards(a.shards, host=a.host, port=a.port, blocking=True, replicas=a.replicas, model=model, api_key=key,
                 replica_cpus=a.replica_cpus, place_by_resource=a.place_by_resource,
                 one_replica_per_node=a.one_replica_per_node)


if __name__ == "__main__":
    main()
