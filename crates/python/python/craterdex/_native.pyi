"""Type stubs of craterdex's native module (PyO3). The pure-Python package (``craterdex``)
is the public face; these describe what it calls. Checked against the built module by
``python -m mypy.stubtest craterdex._native`` in CI. Options, metadata and results cross
as JSON text; features and descriptors as float32 numpy arrays."""

import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt
from typing import final

_Path = Union[str, "os.PathLike[str]"]
_F32 = npt.NDArray[np.float32]
#: ``callback(event, *args)``: "start" (what, total), "advance" (done), "finish",
#: "note" (message), "skipped" (path, reason); craterdex._progress.Reporter is one.
_Progress = Optional[Callable[..., Any]]
#: (ids, cls [N, D], patches [N, T, D], attention [N, T])
_NamedFeatures = Tuple[Sequence[str], _F32, _F32, _F32]
_FeatureArrays = Tuple[_F32, _F32, _F32]

__all__ = [
    "ApiRefusal",
    "Index",
    "Model",
    "QueryEncoder",
    "__version__",
    "commit_parts",
    "commit_shards",
    "cpu",
    "defaults_json",
    "recheck_plan_json",
    "entry_meta_json",
    "evaluate_json",
    "image_size",
    "learn_sample",
    "link_decision_json",
    "link_rule_json",
    "make_plan",
    "merge_hits_json",
    "posted_features",
    "read_meta_csv_json",
    "search_options_json",
    "service_document_json",
    "service_page",
    "service_page_headers",
    "shards_of",
    "store_upload",
    "thumbnail_png",
    "upload_id",
    "write_part",
]

__version__: str

class ApiRefusal(Exception):
    """A request refused as ``craterdex serve`` refuses it: args (status, message)."""

@final
class Model:
    @staticmethod
    def load(options_json: str, progress: _Progress = None) -> Model: ...
    @staticmethod
    def import_file(path: _Path, name: str) -> str: ...
    @property
    def dim(self) -> int: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def protocol_json(self) -> str: ...
    def extract(
        self,
        ids: Sequence[str],
        images: Optional[Sequence[npt.NDArray[Any]]] = None,
        paths: Optional[Sequence[_Path]] = None,
        progress: _Progress = None,
    ) -> Dict[str, Any]: ...
    def variant_features(
        self, ids: Sequence[str], paths: Sequence[_Path], views_json: str
    ) -> Tuple[List[str], Dict[str, Any]]: ...

@final
class Index:
    @staticmethod
    def build(
        out: _Path,
        meta_json: str,
        model: Optional[Model] = None,
        features: Optional[_NamedFeatures] = None,
        recipe_json: str = "{}",
        progress: _Progress = None,
    ) -> Index: ...
    @staticmethod
    def open(path: _Path, model: Optional[Model] = None) -> Index: ...
    @property
    def path(self) -> str: ...
    def __len__(self) -> int: ...
    def add(
        self, meta_json: str, features: Optional[_NamedFeatures] = None, progress: _Progress = None
    ) -> int: ...
    def remove(self, ids: Sequence[str]) -> int: ...
    def refresh(self) -> bool: ...
    def merge_json(self, into_one: bool = False) -> str: ...
    def info_json(self) -> str: ...
    def metadata_json(self) -> str: ...
    def meta_json(self, id: str) -> Optional[str]: ...
    def descriptors(self, ids: Sequence[str]) -> Dict[str, _F32]: ...
    def rule_json(self) -> str: ...
    def search_json(
        self,
        ids: Sequence[str],
        images: Optional[Sequence[npt.NDArray[Any]]] = None,
        paths: Optional[Sequence[_Path]] = None,
        features: Optional[_FeatureArrays] = None,
        options_json: str = "{}",
        progress: _Progress = None,
    ) -> str: ...
    def search_descriptors_json(
        self, ids: Sequence[str], single: _F32, tokens: _F32, options_json: str = "{}"
    ) -> str: ...
    def search_views_json(self, single: _F32, tokens: _F32, views_json: str, params_json: str) -> str: ...
    def verify_chosen_json(
        self,
        ids: Sequence[str],
        features: _NamedFeatures,
        views_json: str,
        params_json: str,
        top: int,
        chosen_json: str,
    ) -> str: ...
    def views_per_crater(self) -> int: ...
    def sun_sample_json(self) -> str: ...
    def link_json(
        self,
        meta_json: str,
        features: Optional[_NamedFeatures] = None,
        rule_json: Optional[str] = None,
        options_json: str = "{}",
        partition: bool = False,
        registrations_json: Optional[str] = None,
        progress: _Progress = None,
    ) -> str: ...
    def link_images_json(
        self,
        paths: Sequence[_Path],
        detector: str,
        rule_json: Optional[str] = None,
        options_json: str = "{}",
        look_in_place: bool = True,
        context: float = 2.0,
        progress: _Progress = None,
        detector_precision: Optional[str] = None,
    ) -> str: ...
    def link_evidence_json(self, meta_json: str, single: _F32, tokens: _F32, options_json: str = "{}") -> str: ...
    def registrations_json(
        self,
        meta_json: Optional[str] = None,
        rule_json: Optional[str] = None,
        options_json: str = "{}",
        dedup: bool = False,
    ) -> str: ...
    def dedup_json(
        self,
        rule_json: Optional[str] = None,
        options_json: str = "{}",
        ids: Optional[Sequence[str]] = None,
        registrations_json: Optional[str] = None,
        progress: _Progress = None,
    ) -> str: ...
    def dedup_merge_json(self, edges_json: str) -> str: ...

@final
class QueryEncoder:
    def __new__(cls, encoder_json: bytes) -> QueryEncoder: ...
    def encode(self, ids: Sequence[str], cls: _F32, patches: _F32, attention: _F32) -> Dict[str, Any]: ...
    def search_cluster_json(self, feature_dim: int, calls: Any, options_json: str) -> str: ...

def cpu() -> str: ...
def defaults_json() -> str: ...
def recheck_plan_json() -> str: ...
def evaluate_json(
    manifest: _Path, model: Model, quick: bool = True, root: Optional[_Path] = None, progress: _Progress = None
) -> str: ...
def read_meta_csv_json(path: _Path) -> str: ...
def learn_sample(n: int, seed: int = 0) -> List[int]: ...
def make_plan(plan_path: _Path, meta_json: str, model: Model, recipe_json: str = "{}") -> int: ...
def write_part(plan_path: _Path, part_dir: _Path, meta_json: str, model: Model) -> int: ...
def commit_parts(plan_path: _Path, out: _Path, parts: Sequence[_Path]) -> int: ...
def commit_shards(plan_path: _Path, out: _Path, parts_by_shard: Sequence[Sequence[_Path]]) -> str: ...
def shards_of(meta_json: str, shards: int) -> List[int]: ...
def merge_hits_json(lists_json: str, top_k: int, group_views: bool) -> str: ...
def posted_features(body: bytes, content_type: str, dim: int) -> Dict[str, Any]: ...
def entry_meta_json(fields: Dict[str, str]) -> str: ...
def upload_id(bytes: bytes) -> str: ...
def image_size(bytes: bytes) -> Tuple[int, int]: ...
def search_options_json(query: str, kind: str = ..., max_query_views: Optional[int] = None) -> str: ...
def store_upload(dir: _Path, bytes: bytes) -> str: ...
def thumbnail_png(path: _Path, id: str, size: int) -> bytes: ...
def service_document_json(feature_dim: Optional[int] = None, max_query_views: Optional[int] = None) -> str: ...
def service_page() -> str: ...
def service_page_headers() -> List[Tuple[str, str]]: ...
def link_rule_json(index_dir: _Path) -> str: ...
def link_decision_json(rule_json: str, meta_json: str, evidence_json: str, options_json: str) -> str: ...
