"""Serving a set of shard indexes on Ray Serve (``pip install 'craterdex[cluster]'``).

A catalogue too large for one machine is cut into shard indexes (``craterdex index split
--shards N`` or ``craterdex.dask.build_index(..., shards=N)``). This module serves such a
set with Ray Serve, an existing distributed engine: Ray gives the replicas, restarts them
when they die, routes calls to live ones and runs the HTTP ingress; craterdex's own engine
answers inside every shard replica. The application:

* one deployment per shard, ``R`` replicas each (:class:`ShardReplica`: the shard's index
  with the model, which reads its own candidates' images when a search verifies them);
* an encoder deployment (:class:`Encoder`) that runs the model on query images;
* a router (:class:`Router`, the HTTP ingress) that searches a query image as one index
  searches it, in the engine's own order (rechecked by default: as given with the best
  candidates verified, then, where the first hit does not register, turned toward the
  catalogue's suns and in turns and under the opposite sun; or in the views and with the
  verification the request asks for; ``QueryEncoder.search_cluster_json`` drives it and calls
  back here): it encodes each view once with the set's shared encoder, scatters the
  descriptors to every shard, sends the best candidates of all shards back to the shards
  that hold them to be verified, retries a failed call once (Ray routes the retry to a live
  replica), merges the lists (as ``craterdex search --shards`` merges them: by score, views
  of one crater together), and routes an added image to the shard that owns its crater.

The router answers ``craterdex serve``'s API with the same request forms, response fields,
OpenAPI document and web page: it reads forms, search options and feature bodies with
``craterdex serve``'s own readers (craterdex-api, through ``_native``). Search
(by image, by features, ``/v1/images/{id}/similar``), ``/v1/link`` (every shard's evidence
decided as one index decides; ``insert=true`` adds a new crater to its shard), image
metadata and thumbnails, ``/v1/stats``, ``/v1/health``, ``/v1/ready``, and writes
(``POST /v1/images``, ``DELETE /v1/images/{id}``, with the API key). Not ``/v1/register``:
a source's registration lives in one server's memory. When every replica of a shard fails,
a search answers the other shards' hits with ``partial: true`` and the missing shards named,
never a silently short list; an add to that shard, and any link, answers 503.

Start it against a running Ray cluster (``ray start --head``; on other nodes ``ray start
--address HEAD:6379``)::

    craterdex-cluster serve --shards SET --replicas 2 --model PATH --port 8000

(``python -m craterdex.cluster`` is the same command.)
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

from . import Index, Model, _native

try:
    from fastapi import FastAPI, Request
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from ray import serve
except ImportError as e:  # pragma: no cover - said once, clearly
    raise ImportError("craterdex.cluster needs Ray Serve: pip install 'craterdex[cluster]'") from e

__all__ = ["ShardReplica", "Encoder", "Router", "application", "serve_shards", "shard_names", "shard_resource"]


def shard_names(shards_dir: str) -> List[str]:
    """The shard directories of a set, in order, from its ``shards.json``."""
    with open(os.path.join(shards_dir, "shards.json")) as f:
        return [s["name"] for s in json.load(f)["shards"]]


class ShardReplica:
    """One replica of one shard: its index with the model (queries come as descriptors from
    the router; the model reads the shard's own candidates when a search verifies them).
    Images added through the cluster are kept beside the shard (``SHARD.uploads``), as
    ``craterdex serve`` keeps them beside its index."""

    def __init__(self, shard_dir: str, model: Optional[Model] = None):
        self.shard_dir = shard_dir
        self.upload_dir = shard_dir.rstrip(os.sep) + ".uploads"
        self.index = Index.open(shard_dir, model=model)

    def search(self, ids: List[str], single: np.ndarray, tokens: np.ndarray, options_json: str) -> str:
        """Hits of each query's descriptors (JSON, as ``Index.search`` finds them), with what
        the shard's other replicas wrote."""
        self.index.refresh()
        return self.index._native.search_descriptors_json(ids, single, tokens, options_json)

    def search_views(self, single: np.ndarray, tokens: np.ndarray, views_json: str, params_json: str) -> str:
        """Hits (JSON, per query) of queries given as the descriptors of their views, each
        query's views in a row: a round of the engine's search over the cluster."""
        self.index.refresh()
        return self.index._native.search_views_json(single, tokens, views_json, params_json)

    def verify_chosen(self, ids: List[str], features: Dict[str, Any], views_json: str, params_json: str,
                      top: int, chosen_json: str) -> str:
        """This shard's verified hits (JSON, per query): the candidates the router chose
        here (``chosen_json``) verified against the queries' views (``features``) with the
        candidates' images, which this shard's node holds."""
        self.index.refresh()
        named = (list(features["ids"]), features["cls"], features["patches"], features["attention"])
        return self.index._native.verify_chosen_json(ids, named, views_json, params_json, top, chosen_json)

    def views_per_crater(self) -> str:
        """The most views of one crater this shard holds (JSON): how deep a verified search
        lists its candidates."""
        self.index.refresh()
        return json.dumps(self.index._native.views_per_crater())

    def sun_sample(self) -> str:
        """The ids of this shard's sample of images for the catalogue's suns and their
        shading dipoles' headings (JSON)."""
        self.index.refresh()
        return self.index._native.sun_sample_json()

    def link_evidence(self, meta_json: str, single: np.ndarray, tokens: np.ndarray) -> str:
        """What this shard knows of an entry to link (JSON): its appearance hits and its rows
        near the entry's position (``_native.link_decision_json`` merges every shard's)."""
        self.index.refresh()
        return self.index._native.link_evidence_json(meta_json, single, tokens)

    def add(self, records_json: str, ids: List[str], cls: np.ndarray, patches: np.ndarray,
            attention: np.ndarray, image: Optional[bytes] = None) -> int:
        """Adds images (their records and features; ``image``: the one image's file, kept
        for thumbnails); returns the shard's image count."""
        records = json.loads(records_json)
        if image is not None:
            records[0]["path"] = _native.store_upload(self.upload_dir, image)
        self.index.add(records, features={"ids": ids, "cls": cls, "patches": patches, "attention": attention})
        return len(self.index)

    def remove(self, ids: List[str]) -> Tuple[int, int]:
        """Removes images by id; returns how many were here and the shard's image count."""
        n = self.index.remove(ids)
        return n, len(self.index)

    def meta(self, id_: str) -> Optional[str]:
        """The metadata of image ``id_`` (JSON) when this shard holds it."""
        self.index.refresh()
        return self.index._native.meta_json(id_)

    def descriptors(self, id_: str) -> Optional[Dict[str, Any]]:
        """The stored descriptors of image ``id_`` when this shard holds it."""
        self.index.refresh()
        if self.index._native.meta_json(id_) is None:
            return None
        return self.index._native.descriptors([id_])

    def thumbnail(self, id_: str, size: int) -> Optional[Dict[str, Any]]:
        """A PNG thumbnail of image ``id_`` (``{"png": ...}``, or ``{"status", "message"}``
        when it cannot be made) when this shard holds it (its file is on this shard's
        node)."""
        self.index.refresh()
        meta = self.index._native.meta_json(id_)
        if meta is None:
            return None
        path = json.loads(meta).get("path")
        if not path:
            return {"status": 404, "message": f"no image file is recorded for {id_!r}"}
        try:
            return {"png": _native.thumbnail_png(path, id_, size)}
        except _native.ApiRefusal as e:
            return {"status": e.args[0], "message": e.args[1]}

    def info(self) -> str:
        self.index.refresh()
        return self.index._native.info_json()

    def ready(self) -> Dict[str, Any]:
        self.index.refresh()
        return {"images": len(self.index), "pid": os.getpid()}


class Encoder:
    """Runs the model: features of uploaded images, once per image for all shards."""

    def __init__(self, model: Model):
        self.model = model

    def extract(self, images: List[bytes]) -> Dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="craterdex-upload") as d:
            return self.model.extract(_written(images, d), ids=[str(i) for i in range(len(images))])

    def variant_features(self, images: List[bytes], ids: List[str], views_json: str
                         ) -> Tuple[List[str], Dict[str, Any]]:
        """The ids of the images read and their features in the views ``views_json`` names
        (each image's views in a row)."""
        with tempfile.TemporaryDirectory(prefix="craterdex-upload") as d:
            return self.model._native.variant_features(ids, _written(images, d), views_json)

    def ready(self) -> Dict[str, Any]:
        return {"model": self.model.fingerprint}


def _written(images: List[bytes], directory: str) -> List[str]:
    """Uploaded images written to files in ``directory`` (the model reads files)."""
    paths = []
    for i, data in enumerate(images):
        p = os.path.join(directory, f"{i}")
        with open(p, "wb") as f:
            f.write(data)
        paths.append(p)
    return paths


def _error(status: int, message: str) -> JSONResponse:
    """An error as ``craterdex serve`` writes it."""
    return JSONResponse({"error": {"status": status, "message": message}}, status_code=status)


class _Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(status, message)
        self.status, self.message = status, message


def _native_call(f: Any, *args: Any) -> Any:
    """A call into the engine's reader of a request part; its refusal as ``craterdex
    serve`` answers it."""
    try:
        return f(*args)
    except _native.ApiRefusal as e:
        raise _Refused(*e.args)


def _search_options(request: Request, query: str, max_query_views: Optional[int] = None) -> Dict[str, Any]:
    """The query string's search options for a search by ``query`` (``image``, ``features``
    or ``indexed``), read, checked and refused as ``craterdex serve`` does (the engine's rule
    of what each kind of query can use; ``max_query_views`` as ``--max-query-views``)."""
    return json.loads(_native_call(_native.search_options_json, request.url.query, query, max_query_views))


def _ms(seconds: float) -> float:
    return round(seconds * 1e6) / 1e3


def _thumbnail_url(id_: str) -> str:
    from urllib.parse import quote

    return "/v1/images/" + quote(id_, safe="-_.~") + "/thumbnail"


async def _read_entry(request: Request) -> Tuple[bytes, Dict[str, Any]]:
    """An entry form (``image`` and metadata fields) read as ``craterdex serve`` reads it:
    the image's bytes and the entry's metadata, its id made from the bytes when not given."""
    form = await request.form()
    data, fields = None, {}
    for name, value in form.multi_items():
        if hasattr(value, "read") and (name == "image" or data is None):
            data = await value.read()
        else:
            fields[name] = value if isinstance(value, str) else (await value.read()).decode(errors="replace")
    if data is None:
        raise _Refused(400, "multipart form without an `image` file part")
    meta = json.loads(_native_call(_native.entry_meta_json, fields))
    if not meta.get("id"):
        meta["id"] = _native.upload_id(data)
    return data, meta


class _ShardCalls:
    """The router's calls to its shards as the engine asks for them
    (``QueryEncoder.search_cluster_json``, on a worker thread): each runs on the router's event
    loop and answers per shard a JSON string, or None where the shard failed (named in
    ``missing``). A round no shard answers is refused (503)."""

    def __init__(self, router: "Router", loop: asyncio.AbstractEventLoop, features: Any):
        self.router, self.loop, self.features_of = router, loop, features
        self.missing: set = set()

    def _wait(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def _answers(self, answers: List[Any], missing: List[str]) -> List[Optional[str]]:
        self.missing.update(missing)
        if len(missing) == len(answers):
            raise _Refused(503, f"no shard answered ({', '.join(missing)})")
        return [None if isinstance(a, BaseException) else a for a in answers]

    def features(self, only: Optional[List[str]], views_json: str) -> Tuple[List[str], Dict[str, Any]]:
        return self._wait(self.features_of(only, views_json))

    def search_views(self, single: np.ndarray, tokens: np.ndarray, views_json: str, params_json: str
                     ) -> List[Optional[str]]:
        return self._answers(*self._wait(self.router._everywhere("search_views", single, tokens, views_json,
                                                                 params_json)))

    def verify_chosen(self, ids: List[str], features: Dict[str, Any], views_json: str, params_json: str, top: int,
                      chosen: List[str]) -> List[Optional[str]]:
        args = [(ids, features, views_json, params_json, top, c) for c in chosen]
        return self._answers(*self._wait(self.router._each("verify_chosen", args)))

    def views_per_crater(self) -> List[Optional[str]]:
        # asked every time: an add can give a crater another view
        return self._answers(*self._wait(self.router._everywhere("views_per_crater")))

    def sun_samples(self) -> List[Optional[str]]:
        if self.router.sun_samples is None:
            answers = self._answers(*self._wait(self.router._everywhere("sun_sample")))
            if all(a is not None for a in answers):
                self.router.sun_samples = answers  # measured once, as one index measures its suns
            return answers
        return self.router.sun_samples


# Routes of craterdex serve the cluster does not answer: sources are registered per server,
# and a whole image is detected and linked by one server holding the whole catalogue.
_NOT_ON_A_CLUSTER = ("/v1/register", "/v1/link/image")

# Ray Serve takes the router's class as it is defined: what it calls is defined above it.
app = FastAPI(title="craterdex cluster", docs_url=None, redoc_url=None, openapi_url=None)


@app.exception_handler(404)
async def _not_found(request: Request, exc: Exception) -> JSONResponse:
    return _error(404, "no such endpoint; see /v1/openapi.json")


@app.exception_handler(405)
async def _not_allowed(request: Request, exc: Exception) -> JSONResponse:
    return _error(405, f"{request.method} is not allowed here; see /v1/openapi.json")


@serve.deployment
@serve.ingress(app)
class Router:
    """The HTTP ingress: scatters queries to every shard and merges their hits; answers
    ``craterdex serve``'s API with its readers, document and page."""

    def __init__(self, shards: List[Any], names: List[str], encoder: Any, dim: int, encoder_json: bytes,
                 rule_json: str, api_key: Optional[str] = None, call_timeout_s: float = 30.0,
                 max_query_views: Optional[int] = None):
        self.shards, self.names, self.encoder, self.dim = shards, names, encoder, dim
        # the shards' shared encoder: each query is encoded once, here, and its descriptors
        # (K tokens) go to every shard rather than its features (every patch token)
        self.query_encoder = _native.QueryEncoder(encoder_json)
        # each shard's sample for the catalogue's suns, once every shard has answered
        self.sun_samples: Optional[List[Optional[str]]] = None
        self.rule_json = rule_json
        self.rule_source = json.loads(rule_json).get("source", "default")
        self.api_key = api_key
        self.call_timeout_s = call_timeout_s
        # the most views of one query image a request may run (craterdex serve --max-query-views)
        self.max_query_views = max_query_views
        self.counters = {"searches": 0, "image_searches": 0, "added": 0, "removed": 0, "client_errors": 0}
        # links that insert are decided and written one at a time (craterdex serve does so
        # under its writer), so two links of one new crater do not both add it
        self.link_writes = asyncio.Lock()
        doc = json.loads(_native.service_document_json(dim, max_query_views))
        for path in _NOT_ON_A_CLUSTER:
            doc["paths"].pop(path, None)
        self.document = doc

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

    async def _everywhere(self, method: str, *args) -> Tuple[List[Any], List[str]]:
        """``method`` on every shard: the answers (an exception where a shard failed) and the
        shards that failed."""
        answers = await asyncio.gather(*(self._call(s, method, *args) for s in self.shards), return_exceptions=True)
        return answers, [n for n, a in zip(self.names, answers) if isinstance(a, BaseException)]

    async def _owner_answer(self, method: str, id_: str, *args) -> Any:
        """The answer of the shard that holds image ``id_`` (asked of every shard: only the
        crater id, which a path does not carry, names the owner); 404, or 503 when a shard
        that might hold it did not answer."""
        answers, missing = await self._everywhere(method, id_, *args)
        for a in answers:
            if a is not None and not isinstance(a, BaseException):
                return a
        if missing:
            raise _Refused(503, f"image {id_!r} not found in the shards that answered; {', '.join(missing)} did not")
        raise _Refused(404, f"no image {id_!r} in the index")

    def _encode(self, features: Dict[str, Any]) -> Dict[str, Any]:
        try:
            return self.query_encoder.encode(list(features["ids"]), features["cls"], features["patches"],
                                             features["attention"])
        except Exception as e:  # features of another width than the set's encoder
            raise _Refused(422, str(e))

    async def _extract(self, data: bytes) -> Dict[str, Any]:
        """The features of one uploaded image (the encoder deployment runs the model)."""
        try:
            features = await self._call(self.encoder, "extract", [data])
        except Exception as e:
            raise _Refused(422, f"unreadable image: {str(e).splitlines()[0]}")
        if len(features["ids"]) == 0:
            raise _Refused(422, "unreadable image")
        return features

    async def _each(self, method: str, args_per_shard: List[Tuple[Any, ...]]) -> Tuple[List[Any], List[str]]:
        """``method`` on every shard with that shard's arguments: the answers (an exception
        where a shard failed) and the shards that failed."""
        answers = await asyncio.gather(*(self._call(s, method, *a) for s, a in zip(self.shards, args_per_shard)),
                                       return_exceptions=True)
        return answers, [n for n, a in zip(self.names, answers) if isinstance(a, BaseException)]

    async def _search_as_engine(self, features: Any, opts: Dict[str, Any]) -> Tuple[List[Dict], List[str]]:
        """The hits of one query over the shards, searched in the engine's order as
        ``opts`` ask (``QueryEncoder.search_cluster_json``, run on a worker thread that calls
        back into this loop); ``features(only, views_json)`` is a coroutine giving the
        query's ids and features in some views. The shards that did not answer a round."""
        self.counters["searches"] += 1
        calls = _ShardCalls(self, asyncio.get_running_loop(), features)
        text = await asyncio.to_thread(self.query_encoder.search_cluster_json, self.dim, calls, json.dumps(opts))
        answers = json.loads(text)
        return (answers[0]["results"] if answers else []), sorted(calls.missing)

    async def _search(self, ids: List[str], desc: Dict[str, Any], opts: Dict[str, Any]
                      ) -> Tuple[List[List[Dict]], List[str]]:
        self.counters["searches"] += 1
        answers, missing = await self._everywhere("search", ids, desc["single"], desc["tokens"], json.dumps(opts))
        lists = [json.loads(a) for a in answers if not isinstance(a, BaseException)]
        if not lists:
            raise _Refused(503, f"no shard answered ({', '.join(missing)})")
        merged = []
        for q in range(len(ids)):
            per_shard = json.dumps([shard[q]["results"] for shard in lists])
            merged.append(json.loads(_native.merge_hits_json(per_shard, opts["top_k"], bool(opts["group_views"]))))
        return merged, missing

    async def _extract_views(self, data: bytes, views_json: str) -> Tuple[List[str], Dict[str, Any]]:
        """The features of one uploaded image in some views (the encoder deployment runs
        the model), under the query's name."""
        try:
            return await self._call(self.encoder, "variant_features", [data], ["query"], views_json)
        except Exception as e:
            raise _Refused(422, f"unreadable image: {str(e).splitlines()[0]}")

    def _response(self, hits: List[Dict], opts: Dict[str, Any], query: Dict[str, Any], timing: Dict[str, float],
                  missing: List[str]) -> JSONResponse:
        for h in hits:
            h["thumbnail"] = _thumbnail_url(h["id"])
            h.get("meta", {}).pop("path", None)  # the shards' file paths stay on the cluster
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

    def _refusal(self, r: _Refused) -> JSONResponse:
        if 400 <= r.status < 500:
            self.counters["client_errors"] += 1
        return _error(r.status, r.message)

    @app.get("/")
    async def page(self) -> HTMLResponse:
        return HTMLResponse(_native.service_page(), headers=dict(_native.service_page_headers()))

    @app.get("/v1/openapi.json")
    async def openapi(self) -> JSONResponse:
        return JSONResponse(self.document)

    @app.get("/v1/health")
    async def health(self) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/v1/ready")
    async def ready(self) -> JSONResponse:
        answers, missing = await self._everywhere("ready")
        shards = {n: (None if isinstance(a, BaseException) else a) for n, a in zip(self.names, answers)}
        body = {"ready": not missing, "shards": shards, "missing_shards": missing}
        return JSONResponse(body, status_code=503 if missing else 200)

    @app.get("/v1/stats")
    async def stats(self) -> JSONResponse:
        """``craterdex serve``'s statistics over the set: images, removed images and segments
        summed over the shards that answered, the rest as every shard records it."""
        answers, missing = await self._everywhere("info")
        infos = [json.loads(a) for a in answers if not isinstance(a, BaseException)]
        if not infos:
            return self._refusal(_Refused(503, f"no shard answered ({', '.join(missing)})"))
        body = dict(infos[0])
        for key in ("images", "removed", "segments"):
            body[key] = sum(i[key] for i in infos)
        body["image_search"] = True
        body["writes_enabled"] = self.api_key is not None
        body["requests"] = dict(self.counters)
        body["missing_shards"] = missing
        return JSONResponse(body)

    @app.post("/v1/search/image")
    async def search_image(self, request: Request) -> JSONResponse:
        """A query image searched as one index searches it (rechecked by default); the
        model's passes over the query and the candidates count as search time, as
        ``craterdex serve`` counts them for a rechecked search."""
        try:
            opts = _search_options(request, "image", self.max_query_views)
            form = await request.form()
            upload = form.get("image")
            if upload is None or not hasattr(upload, "read"):
                raise _Refused(400, "multipart form without an `image` file part")
            data = await upload.read()
            width, height = _native_call(_native.image_size, data)
            self.counters["image_searches"] += 1
            t0 = time.perf_counter()
            hits, missing = await self._search_as_engine(lambda only, views: self._extract_views(data, views), opts)
            timing = {"search": _ms(time.perf_counter() - t0)}
        except _Refused as r:
            return self._refusal(r)
        query = {"kind": "image", "width": width, "height": height, "bytes": len(data)}
        return self._response(hits, opts, query, timing, missing)

    @app.post("/v1/search/features")
    async def search_features(self, request: Request) -> JSONResponse:
        try:
            opts = _search_options(request, "features", self.max_query_views)
            posted = _native.posted_features(await request.body(), request.headers.get("content-type", ""),
                                             self.dim)
            if "error" in posted:
                raise _Refused(400 if posted["error"] == "malformed" else 422, posted["message"])
            self._encode(posted)  # refused (422) here where the width is not the set's

            async def as_posted(only: Any, views: str) -> Tuple[List[str], Dict[str, Any]]:
                return list(posted["ids"]), posted

            t0 = time.perf_counter()
            hits, missing = await self._search_as_engine(as_posted, opts)
            timing = {"search": _ms(time.perf_counter() - t0)}
        except _Refused as r:
            return self._refusal(r)
        return self._response(hits, opts, {"kind": "features"}, timing, missing)

    @app.get("/v1/images/{image_id:path}/similar")
    async def search_similar(self, image_id: str, request: Request) -> JSONResponse:
        try:
            opts = _search_options(request, "indexed", self.max_query_views)
            t0 = time.perf_counter()
            desc = await self._owner_answer("descriptors", image_id)
            hits, missing = await self._search([image_id], desc, opts)
            t1 = time.perf_counter()
        except _Refused as r:
            return self._refusal(r)
        return self._response(hits[0], opts, {"kind": "indexed", "id": image_id}, {"search": _ms(t1 - t0)}, missing)

    @app.get("/v1/images/{image_id:path}/thumbnail")
    async def thumbnail(self, image_id: str, request: Request) -> Response:
        try:
            size = request.query_params.get("size", "160")
            if not size.isdigit() or not (16 <= int(size) <= 512):
                raise _Refused(400, "size must be between 16 and 512")
            thumb = await self._owner_answer("thumbnail", image_id, int(size))
            if "png" not in thumb:
                raise _Refused(thumb["status"], thumb["message"])
            png = thumb["png"]
        except _Refused as r:
            return self._refusal(r)
        return Response(png, media_type="image/png", headers={"cache-control": "max-age=3600"})

    @app.get("/v1/images/{image_id:path}")
    async def image_meta(self, image_id: str) -> JSONResponse:
        try:
            meta = json.loads(await self._owner_answer("meta", image_id))
        except _Refused as r:
            return self._refusal(r)
        meta.pop("path", None)
        return JSONResponse({"id": image_id, "meta": meta, "thumbnail": _thumbnail_url(image_id)})

    async def _add(self, data: bytes, meta: Dict[str, Any], features: Dict[str, Any]) -> Tuple[int, str]:
        """Adds an entry to the shard that owns its crater; returns the set's image count
        and the shard's name. 409 when the id is taken, 503 when the shard has no working
        replica."""
        records = json.dumps([meta])
        owner = _native.shards_of(records, len(self.shards))[0]
        try:
            await self._call(self.shards[owner], "add", records, [meta["id"]], features["cls"],
                             features["patches"], features["attention"], data)
        except Exception as e:
            text = str(e)
            if "already in the index" in text or "were removed earlier" in text:
                raise _Refused(409, f"image id {meta['id']!r} is already in the index")
            raise _Refused(503, f"shard {self.names[owner]} has no live replica: {text.splitlines()[0]}")
        self.counters["added"] += 1
        return await self._images(), self.names[owner]

    async def _images(self) -> int:
        answers, _ = await self._everywhere("ready")
        return sum(a["images"] for a in answers if not isinstance(a, BaseException))

    @app.post("/v1/images")
    async def add_image(self, request: Request) -> JSONResponse:
        try:
            self._authorize(request)
            data, meta = await _read_entry(request)
            features = await self._extract(data)
            images, shard = await self._add(data, meta, features)
        except _Refused as r:
            return self._refusal(r)
        return JSONResponse({"id": meta["id"], "images": images, "shard": shard,
                             "thumbnail": _thumbnail_url(meta["id"])}, status_code=201)

    @app.post("/v1/link")
    async def link(self, request: Request) -> JSONResponse:
        """Links an uploaded crater image to the catalogue: every shard's evidence (its
        appearance hits and its rows near the entry) decided as one index decides it; with
        ``insert=true`` (API key) a new crater is added to the shard that owns it. A link
        needs every shard (a missing one could hold the match): 503 otherwise."""
        try:
            insert = request.query_params.get("insert", "false").lower()
            if insert not in ("true", "false"):
                raise _Refused(400, "insert must be true or false")
            insert = insert == "true"
            if insert:
                self._authorize(request)
            data, meta = await _read_entry(request)
            features = await self._extract(data)
            desc = self._encode(features)
            meta_json = json.dumps([meta])

            async def decide() -> Dict[str, Any]:
                answers, missing = await self._everywhere("link_evidence", meta_json, desc["single"], desc["tokens"])
                if missing:
                    raise _Refused(503, f"a link needs every shard; {', '.join(missing)} did not answer")
                evidence = "[" + ",".join(answers) + "]"
                return json.loads(_native.link_decision_json(self.rule_json, meta_json, evidence, "{}"))

            if not insert:
                row, images = await decide(), await self._images()
            else:
                async with self.link_writes:
                    row = await decide()
                    images = await self._images()
                    if row["decision"] == "new":
                        try:
                            images, _ = await self._add(data, meta, features)
                            row["inserted"] = True
                        except _Refused as r:
                            if r.status != 409:
                                raise
        except _Refused as r:
            return self._refusal(r)
        row["query"].pop("path", None)
        for key in ("best", "second"):
            if row.get(key):
                row[key]["thumbnail"] = _thumbnail_url(row[key]["id"])
        body = {"query": row["query"], "decision": row["decision"], "confidence": row["confidence"],
                "best": row.get("best"), "second": row.get("second"), "inserted": row["inserted"],
                "images": images, "rule": self.rule_source, "registered": False, "registration": None}
        return JSONResponse(body)

    @app.delete("/v1/images/{image_id:path}")
    async def remove_image(self, image_id: str, request: Request) -> JSONResponse:
        """Removes an image: asked of every shard, since only the crater id, which the
        request does not carry, names the owner."""
        try:
            self._authorize(request)
            answers, missing = await self._everywhere("remove", [image_id])
            done = [a for a in answers if not isinstance(a, BaseException)]
            if not any(n for n, _ in done):
                if missing:
                    raise _Refused(503, f"image {image_id!r} not found in the shards that answered; "
                                        f"{', '.join(missing)} did not")
                raise _Refused(404, f"no image {image_id!r} in the index")
        except _Refused as r:
            return self._refusal(r)
        self.counters["removed"] += 1
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
                one_replica_per_node: bool = False, router_resources: Optional[Dict[str, float]] = None,
                max_query_views: Optional[int] = None) -> Any:
    """The Ray Serve application over the shard set in ``shards_dir``: ``replicas`` replicas
    per shard, one encoder, one router. Every node that runs a shard's replica must see its
    files at that path; with ``place_by_resource``, a shard's replicas run only on nodes that
    declare its :func:`shard_resource` (the nodes that hold its files). With
    ``one_replica_per_node`` a shard's replicas run on different nodes (a lost node takes at
    most one of them). ``router_resources``: custom resources the router needs (to keep it on
    the ingress node). ``max_query_views``: the most views of one query image a request may run
    through the model, as ``craterdex serve --max-query-views`` bounds them (None: no bound)."""
    if max_query_views is not None and max_query_views < 1:
        raise ValueError(f"max_query_views must be at least 1, the query as given, not {max_query_views}")
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
                         ray_actor_options=placement(n), **spread).bind(os.path.join(shards_dir, n), model)
        for i, n in enumerate(names)
    ]
    encoder = serve.deployment(Encoder, name="encoder", ray_actor_options={"num_cpus": replica_cpus}).bind(model)
    with open(os.path.join(shards_dir, names[0], "encoder.json"), "rb") as f:
        encoder_json = f.read()
    # every shard keeps a copy of the index's calibrated link rule (craterdex index split)
    rule_json = _native.link_rule_json(os.path.join(shards_dir, names[0]))
    router = {"num_cpus": 0.1, **({"resources": router_resources} if router_resources else {})}
    return Router.options(ray_actor_options=router).bind(shard_apps, names, encoder, model.dim, encoder_json,
                                                         rule_json, api_key,
                                                         max_query_views=max_query_views)


def serve_shards(shards_dir: str, *, host: str = "127.0.0.1", port: int = 8000, proxy_on_every_node: bool = True,
                 blocking: bool = False, **options: Any) -> None:
    """Runs :func:`application` (``options`` are its keyword arguments) on the Ray cluster
    this process is connected to (``ray.init`` first, or it starts a local one) with HTTP on
    ``host:port``, on every node (behind a load balancer) or on the head only."""
    serve.start(http_options={"host": host, "port": port},
                proxy_location="EveryNode" if proxy_on_every_node else "HeadOnly")
    serve.run(application(shards_dir, **options), name="craterdex", route_prefix="/", blocking=blocking)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="craterdex-cluster",
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
    s.add_argument("--max-query-views", type=int, default=None,
                   help="the most views of one query image a request runs through the model "
                        "(craterdex serve --max-query-views; default: no bound)")
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
                 one_replica_per_node=a.one_replica_per_node, max_query_views=a.max_query_views)


if __name__ == "__main__":
    main()
