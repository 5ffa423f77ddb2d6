"""Whole-catalogue batch jobs on a Dask cluster (``distributed.Client``).

Every task calls the same engine functions as the single-machine commands; this module
only cuts the work into tasks and joins their results:

* :func:`build_index` -- the encoder's whitening and the codec are learned once from the
  sample ``index build`` learns from (a task on one worker), sent to every worker as a
  plan file; each partition of entries is extracted, encoded and written as one part
  (segment) in ``OUT.parts/``; the parts are then committed, in entry order, into one
  index through the index's atomic path. Same ids, same codes as ``craterdex index build``.
* :func:`link` and :func:`dedup` -- the catalogue cut into latitude bands; each band's
  task sees the index rows within reach of its entries (the halo), so no pair across a
  band border is missed; each source image is registered to the catalogue once, before the
  tasks (positions only, milliseconds), and every task places its entries by that shared
  transform; so the result is the single-machine result.
* :func:`link_images` -- whole new images (detect, then link): each image is its own
  source, registered and looked in on its own, so images are cut into tasks of a few
  images each; the rows are :meth:`craterdex.Index.link_images`'s, in image order.

A task whose worker dies is run again by Dask; a part written twice is replaced whole,
and the commit checks every part's checksums, so the index is complete and correct.
Workers need the index, the parts directory and the images on a filesystem they share
(NFS, Lustre, GPFS on an HPC cluster), and the same model (a path they all see, or the
default model, which each worker fetches into its ``$CRATERDEX_HOME``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
import pandas as pd

from . import (_DEDUP, _LINK, InvalidInputError, Index, Model, Recipe, _groups_frame, _link_frame, _native,
               _records)

__all__ = ["build_index", "link", "link_images", "dedup", "bands"]


def _chunks(n: int, size: int) -> List[range]:
    return [range(i, min(i + size, n)) for i in range(0, n, size)]


def _plan_task(plan_path: str, records: str, model: Model, recipe_json: str) -> str:
    _native.make_plan(plan_path, records, model._native, recipe_json)
    return plan_path


def _part_task(plan_path: str, part_dir: str, records: str, model: Model) -> int:
    return _native.write_part(plan_path, part_dir, records, model._native)


def build_index(
    client,
    entries: pd.DataFrame,
    out: str,
    *,
    model: Optional[Model] = None,
    partition_size: int = 2000,
    recipe: Optional[Recipe] = None,
    keep_parts: bool = False,
    timings: Optional[Dict[str, float]] = None,
    shards: Optional[int] = None,
) -> Union[Index, List[Index]]:
    """Builds the index of ``entries`` (``id``, ``path`` and metadata columns, in the
    order rows should have) at ``out`` on the cluster behind ``client``.

    ``recipe``: a :class:`craterdex.Recipe` (default: the shipped one). Returns the opened
    index. The parts are written to ``OUT.parts/`` (removed after the commit unless
    ``keep_parts``). ``timings``, when given, receives the seconds of each phase: ``plan``
    (the learn sample extracted and learned from, in one task), ``parts`` and ``commit``.

    ``shards=N`` writes ``N`` shard indexes ``OUT/shard-NNN`` and ``OUT/shards.json``
    instead, as ``craterdex index split`` cuts an index (every view of a crater in one
    shard, one encoder and codec learned once for all) and returns them opened, in order."""
    if len(entries) == 0:
        raise InvalidInputError("cannot build an index from zero images")
    model = model or Model.load()
    out = os.path.abspath(os.fspath(out))
    staging = out.rstrip("/") + ".parts"
    os.makedirs(staging, exist_ok=True)
    recipe = recipe or Recipe()
    sample = _native.learn_sample(len(entries), recipe.seed)
    plan_path = os.path.join(staging, "plan.json")
    started = time.perf_counter()
    plan = client.submit(_plan_task, plan_path, _records(entries.iloc[sample]), model, recipe.to_json(),
                         pure=False, retries=3)
    # rows of each shard, in entry order (one shard: every row)
    if shards is None:
        groups = [np.arange(len(entries))]
    else:
        owner = np.asarray(_native.shards_of(_records(entries), int(shards)))
        groups = [np.flatnonzero(owner == s) for s in range(int(shards))]
        empty = [s for s, g in enumerate(groups) if len(g) == 0]
        if empty:
            raise InvalidInputError(
                f"shard {empty[0]} of {shards} would hold no image ({len(entries)} entries); use fewer shards")
    parts: List[List[str]] = []
    futures = []
    for s, rows_of_shard in enumerate(groups):
        parts.append([])
        for i, rows in enumerate(_chunks(len(rows_of_shard), max(1, partition_size))):
            name = f"part-{i:06d}" if shards is None else f"shard-{s:03d}-part-{i:06d}"
            part_dir = os.path.join(staging, name)
            parts[-1].append(part_dir)
            chunk = entries.iloc[rows_of_shard[rows.start:rows.stop]]
            futures.append(client.submit(_part_task, plan, part_dir, _records(chunk), model,
                                         pure=False, retries=3))
    plan.result()
    planned = time.perf_counter()
    client.gather(futures)
    written = time.perf_counter()
    if shards is None:
        _native.commit_parts(plan_path, out, parts[0])
    else:
        _native.commit_shards(plan_path, out, parts)
    if timings is not None:
        timings.update(plan=planned - started, parts=written - planned, commit=time.perf_counter() - written)
    if not keep_parts:
        shutil.rmtree(staging, ignore_errors=True)
    if shards is None:
        return Index.open(out, model=model)
    return [Index.open(os.path.join(out, f"shard-{s:03d}"), model=model) for s in range(int(shards))]


def bands(entries: pd.DataFrame, band_degrees: float = 2.0, *, unpositioned_size: int = 5000) -> List[np.ndarray]:
    """Row positions of ``entries`` cut into latitude bands of ``band_degrees`` (frame
    positions by ``y``, in pixels: bands of ``band_degrees`` x 100 px); entries without a
    position come in chunks of ``unpositioned_size``."""
    lat = entries["lat"].to_numpy(dtype=float) if "lat" in entries else np.full(len(entries), np.nan)
    y = entries["y"].to_numpy(dtype=float) if "y" in entries else np.full(len(entries), np.nan)
    body = ~np.isnan(lat)
    frame = ~body & ~np.isnan(y)
    out: List[np.ndarray] = []
    for mask, values, width in ((body, lat, band_degrees), (frame, y, band_degrees * 100.0)):
        rows = np.flatnonzero(mask)
        keys = np.floor(values[rows] / width)
        for key in np.unique(keys):
            out.append(rows[keys == key])
    rest = np.flatnonzero(~body & ~frame)
    out.extend(rest[r.start:r.stop] for r in _chunks(len(rest), unpositioned_size))
    return out


def _dedup_task(index_path: str, ids: List[str], rule: Optional[str], options: str, registrations: str) -> str:
    return _native.Index.open(index_path).dedup_json(rule_json=rule, options_json=options, ids=ids,
                                                     registrations_json=registrations)


def dedup(client, index_path: str, *, band_degrees: float = 2.0, rule: Optional[Dict[str, Any]] = None,
          top_k: int = _DEDUP["top_k"], shortlist: int = _DEDUP["shortlist"],
          register: bool = _DEDUP["register"]) -> pd.DataFrame:
    """``craterdex dedup`` of the index at ``index_path``, one task per latitude band; the
    index's sources are registered to each other once, here, and every task places them
    alike, so the groups are those of :meth:`craterdex.Index.dedup` on one machine."""
    index = _native.Index.open(os.fspath(index_path))
    meta = pd.DataFrame(json.loads(index.metadata_json()))
    rule_json = None if rule is None else json.dumps(rule)
    options = json.dumps(dict(top_k=top_k, shortlist=shortlist, register=register))
    registrations = index.registrations_json(rule_json=rule_json, options_json=options, dedup=True)
    futures = [client.submit(_dedup_task, index.path, meta["id"].iloc[rows].tolist(), rule_json, options,
                             registrations, pure=False, retries=3)
               for rows in bands(meta, band_degrees)]
    edges: List[Dict[str, Any]] = []
    for text in client.gather(futures):
        edges.extend(json.loads(text))
    return _groups_frame(index.dedup_merge_json(json.dumps(edges)))


def _link_task(index_path: str, records: str, model: Model, rule: Optional[str], options: str,
               registrations: str) -> str:
    idx = _native.Index.open(index_path, model=model._native)
    return idx.link_json(records, rule_json=rule, options_json=options, partition=True,
                         registrations_json=registrations)


def link(client, index_path: str, entries: pd.DataFrame, *, model: Optional[Model] = None,
         band_degrees: float = 2.0, rule: Optional[Dict[str, Any]] = None, top_k: int = _LINK["top_k"],
         shortlist: int = _LINK["shortlist"], register: bool = _LINK["register"]) -> pd.DataFrame:
    """``craterdex link`` of ``entries`` (``id``, ``path``, positions) against the index
    at ``index_path``, one task per latitude band (images extracted on the workers). Each
    source of the entries is registered to the catalogue once, here (positions only), and
    the transform is shared by every band's task. Rows come in the order of ``entries`` and
    equal :meth:`craterdex.Index.link`'s without ``insert_new`` (inserting is one writer's
    job: add the ``new`` rows afterwards)."""
    model = model or Model.load()
    rule_json = None if rule is None else json.dumps(rule)
    parts = bands(entries, band_degrees)
    options = json.dumps(dict(top_k=top_k, shortlist=shortlist, register=register))
    index = _native.Index.open(os.fspath(index_path))
    registrations = index.registrations_json(_records(entries), rule_json=rule_json, options_json=options)
    futures = [client.submit(_link_task, os.fspath(index_path), _records(entries.iloc[rows]), model, rule_json,
                             options, registrations, pure=False, retries=3)
               for rows in parts]
    by_id: Dict[str, Dict[str, Any]] = {}
    for text in client.gather(futures):
        for r in json.loads(text):
            by_id[r["query"]["id"]] = r
    ordered = [by_id[str(i)] for i in entries["id"] if str(i) in by_id]
    return _link_frame(json.dumps(ordered))


def _link_images_task(index_path: str, paths: List[str], model: Model, detector: str, detector_precision: Optional[str],
                      rule: Optional[str], options: str, look_in_place: bool, context: float) -> str:
    idx = _native.Index.open(index_path, model=model._native)
    return idx.link_images_json(paths, detector, rule_json=rule, options_json=options,
                                look_in_place=look_in_place, context=context,
                                detector_precision=detector_precision)


def link_images(client, index_path: str, images: Sequence[Union[str, "os.PathLike[str]"]], *,
                model: Optional[Model] = None, detector: str = "pycda-unet", detector_precision: Optional[str] = None,
                images_per_task: int = 1,
                rule: Optional[Dict[str, Any]] = None, top_k: int = _LINK["top_k"],
                shortlist: int = _LINK["shortlist"], register: bool = _LINK["register"],
                look_in_place: bool = True, context: float = 2.0) -> pd.DataFrame:
    """:meth:`craterdex.Index.link_images` of many whole images against the index at
    ``index_path``, ``images_per_task`` images to a task (each worker detects, registers and
    links its images; the detector, like the model, must be one every worker reaches: a
    shared directory, or ``pycda-unet``, which each worker fetches). Rows and
    ``.attrs["images"]`` come in the order of ``images`` and equal the single-machine
    call's. Each image's rows are named by its file stem, so stems must differ (the
    single-machine call numbers repeated stems by their place in the whole list, which no
    task sees)."""
    if not images:
        raise InvalidInputError("no images to link")
    if images_per_task < 1:
        raise InvalidInputError(f"images_per_task must be at least 1, not {images_per_task}")
    paths = [os.fspath(p) for p in images]
    stems: Dict[str, str] = {}
    for p in paths:
        stem = os.path.splitext(os.path.basename(p))[0]
        if stem in stems:
            raise InvalidInputError(f"{stems[stem]} and {p} share the name {stem!r}: rename one, "
                                    "or link them with Index.link_images")
        stems[stem] = p
    model = model or Model.load()
    options = json.dumps(dict(top_k=top_k, shortlist=shortlist, insert_new=False, register=register))
    rule_json = None if rule is None else json.dumps(rule)
    futures = [client.submit(_link_images_task, os.fspath(index_path), paths[start:start + images_per_task], model,
                             detector, detector_precision, rule_json, options, look_in_place, context,
                             pure=False, retries=3)
               for start in range(0, len(paths), images_per_task)]
    columns, craters, summaries = None, [], []
    for text in client.gather(futures):
        out = json.loads(text)
        columns = out["columns"]
        craters.extend(out["craters"])
        summaries.extend(out["images"])
    frame = pd.DataFrame(craters, columns=columns)
    frame.attrs["images"] = summaries
    return frame
