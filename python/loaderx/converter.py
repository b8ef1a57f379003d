"""Offline Hugging Face conversion: a ``DatasetDict`` -> aligned Zrecord stores.

``huggingface(...)`` resolves a Hub dataset at a revision to an immutable
snapshot and loads it with 🤗 Datasets (``pip install 'loaderx[converter]'``).
``convert(dataset, root, codec=...)`` writes every split and column as its own
store under ``root/<split>/<column>``; fixed-shape columns become ``Dense``,
variable-shape ones ``Ragged``. Nothing is filtered, padded, tokenised or
reshaped; unsupported features (strings, nested dicts, audio, ...) raise
:class:`~loaderx.errors.SchemaError` naming the column before anything is
written. The result is published with one atomic rename once every column of
every split is written and the record counts of each split agree.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import InvalidArgumentError, SchemaError, StoreExistsError

if TYPE_CHECKING:
    from .zrecord import Codec

__all__ = ["column_plan", "convert", "huggingface"]

_CHUNK = 1024


def huggingface(repo: str, *, revision: str = "main", token: str | None = None,
                config: str | None = None, endpoint: str | None = None) -> Any:
    """Load ``repo`` at ``revision`` (resolved to its commit) as a ``DatasetDict``.

    ``endpoint`` selects a Hub mirror for this call only (no environment
    variables are changed for the rest of the process).
    """
    try:
        import datasets
        from huggingface_hub import HfApi
    except ImportError as e:  # pragma: no cover - depends on the extra
        raise ImportError("the converter needs `pip install 'loaderx[converter]'`") from e
    api = HfApi(endpoint=endpoint, token=token)
    sha = api.dataset_info(repo, revision=revision).sha
    old = datasets.config.HF_ENDPOINT
    try:
        if endpoint is not None:
            datasets.config.HF_ENDPOINT = endpoint
        return datasets.load_dataset(repo, config, revision=sha, token=token)
    finally:
        datasets.config.HF_ENDPOINT = old


def _feature_dtype(name: str, feature: Any) -> np.dtype:
    """NumPy dtype a column's values are stored with, or SchemaError."""
    kind = type(feature).__name__
    if kind == "ClassLabel":
        return np.dtype(np.int64)
    if kind == "Image":
        return np.dtype(np.uint8)
    if kind in ("Array2D", "Array3D", "Array4D", "Array5D"):
        return _numeric(name, feature.dtype)
    if kind == "Value":
        return _numeric(name, feature.dtype)
    if kind in ("List", "Sequence", "LargeList"):
        inner = getattr(feature, "feature", None)
        if isinstance(inner, (dict, list)):
            raise SchemaError(f"column {name!r}: nested structures are not supported")
        return _feature_dtype(name, inner)
    if isinstance(feature, list) and len(feature) == 1:
        return _feature_dtype(name, feature[0])
    raise SchemaError(f"column {name!r}: feature {kind} is not supported (numeric, ClassLabel, "
                      "Image, ArrayND and lists of those are)")


def _numeric(name: str, dtype: str) -> np.dtype:
    try:
        dt = np.dtype({"float": "float32", "double": "float64"}.get(dtype, dtype))
    except TypeError:
        raise SchemaError(f"column {name!r}: dtype {dtype!r} is not numeric") from None
    if dt.kind not in "biufc":
        raise SchemaError(f"column {name!r}: dtype {dtype!r} is not numeric")
    return dt


def _records(ds: Any, column: str, dtype: np.dtype) -> Iterator[np.ndarray]:
    view = ds.with_format("numpy", columns=[column])
    for start in range(0, len(ds), _CHUNK):
        chunk = view[start:start + _CHUNK][column]
        for value in chunk:
            arr = np.asarray(value)
            if arr.dtype == object:
                raise SchemaError(f"column {column!r}: record is not a regular array")
            yield arr.astype(dtype, order="C", copy=False)  # keeps 0-d records 0-d


def _image_shapes(ds: Any, column: str) -> Iterator[tuple[int, ...]]:
    """Shapes of an Image column from the file headers, without decoding pixels."""
    import datasets
    from PIL import Image

    raw = ds.cast_column(column, datasets.Image(decode=False))
    for start in range(0, len(ds), _CHUNK):
        for item in raw[start:start + _CHUNK][column]:
            src = io.BytesIO(item["bytes"]) if item.get("bytes") else item["path"]
            with Image.open(src) as im:
                bands = len(im.getbands())
                w, h = im.size
            yield (h, w) if bands == 1 else (h, w, bands)


def column_plan(ds: Any, column: str) -> tuple[str, np.dtype, tuple[int, ...] | int]:
    """``("dense", dtype, item_shape)`` or ``("ragged", dtype, ndim)`` for a column."""
    feature = ds.features[column]
    dtype = _feature_dtype(column, feature)
    if type(feature).__name__ == "Image":
        shapes = _image_shapes(ds, column)
    else:
        shapes = (r.shape for r in _records(ds, column, dtype))
    first: tuple[int, ...] | None = None
    fixed = True
    for shape in shapes:
        if first is None:
            first = shape
        elif len(shape) != len(first):
            raise SchemaError(f"column {column!r}: records have rank {len(first)} and {len(shape)}")
        elif shape != first:
            fixed = False
    if first is None:
        first = ()
    return ("dense", dtype, first) if fixed else ("ragged", dtype, len(first))


def convert(dataset: Mapping[str, Any], root: str | os.PathLike[str], *, codec: Codec = "zstd",
            data_shards: int = 4, dict_bytes: bytes | None = None, progress: bool = True) -> Path:
    """Write every split/column of ``dataset`` under ``root`` and publish it atomically.

    ``dataset`` is a ``DatasetDict`` (or any mapping of split name to a 🤗
    ``Dataset``). Returns the published root. ``root`` must not exist.
    """
    from .zrecord import Dense, Ragged

    root = Path(root)
    if root.exists():
        raise StoreExistsError(f"{root}: already exists (conversion writes a new root)")
    if not isinstance(dataset, Mapping) or not dataset:
        raise InvalidArgumentError("dataset must be a non-empty DatasetDict (split -> Dataset)")
    plans = {split: {col: column_plan(ds, col) for col in ds.column_names}
             for split, ds in dataset.items()}
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.converting-", dir=root.parent))
    try:
        for split, ds in dataset.items():
            counts = {}
            for col, (_kind, dtype, shape) in plans[split].items():
                path = tmp / split / col
                records = _records(ds, col, dtype)
                if progress:
                    from tqdm import tqdm
                    records = tqdm(records, total=len(ds), desc=f"{split}/{col}", unit="rec",
                                   leave=False)
                if isinstance(shape, tuple):  # "dense" plan; a "ragged" plan carries ndim
                    with Dense.create(path, dtype, shape, codec=codec, data_shards=data_shards,
                                      dict_bytes=dict_bytes) as w:
                        buf: list[np.ndarray] = []
                        for r in records:
                            buf.append(r)
                            if len(buf) == _CHUNK:
                                w.append(np.stack(buf))
                                buf.clear()
                        if buf:
                            w.append(np.stack(buf))
                        elif len(w) == 0:
                            w.append(np.empty((0, *shape), dtype))
                        counts[col] = len(w)
                else:
                    with Ragged.create(path, dtype, ndim=shape, codec=codec,
                                       data_shards=data_shards, dict_bytes=dict_bytes) as w:
                        w.append(records)
                        counts[col] = len(w)
            if len(set(counts.values())) > 1:
                raise SchemaError(f"split {split!r}: columns disagree on record count: {counts}")
        os.rename(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return root
