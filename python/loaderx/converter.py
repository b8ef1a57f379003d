"""Hugging Face datasets -> aligned Zrecord stores, fully offline once the data is local.

Two calls, as in the 2.5.4 README::

    dataset = huggingface("ylecun/mnist")          # or a local path, or a loaded Dataset
    convert(dataset, "mnist", codec="zstd")        # mnist/<split>/<column>/ stores

:func:`huggingface` gives a ``DatasetDict`` from

* a Hub repository id, resolved to its commit at ``revision`` and downloaded
  with ``huggingface_hub.snapshot_download`` (``endpoint`` and ``token`` are
  passed to that call only: no environment variable and no global of
  ``datasets`` or ``huggingface_hub`` is touched), then read from the local
  snapshot;
* a local directory: a ``save_to_disk`` directory (``load_from_disk``) or a
  directory of data files (Parquet, Arrow, CSV, JSON, image folders: whatever
  ``datasets.load_dataset(path)`` reads), with no network access;
* an already loaded ``Dataset`` (becomes the only split, named after its
  ``split`` or ``"train"``) or ``DatasetDict`` (returned as is).

:func:`convert` writes one store per column: fixed-shape columns become
``Dense``, variable-shape ones ``Ragged``. Values are stored exactly (numeric
dtypes kept, ``ClassLabel`` as ``int64``); images are ``uint8`` in the layout
``image_layout`` names (``"HWC"``, the default and what the 2.5.4 wheel
writes: grayscale images are ``(H, W)``; or ``"CHW"``: grayscale ``(1, H, W)``).
Nothing is filtered, padded, tokenised or reshaped beyond that. Strings,
bytes, nested dicts, audio and other non-numeric features raise
:class:`~loaderx.errors.SchemaError` naming the column, before anything is
written, unless ``encoders={column: fn}`` turns each value into an ndarray.

Streamed datasets (``IterableDataset`` / ``IterableDatasetDict``) are read in
one pass as well; since they cannot be scanned first, a column whose feature
leaves an axis open (images, lists without a length) becomes ``Ragged``.

Memory is bounded: each split is read once, in batches of at most
``_TARGET_BATCH_BYTES`` of decoded values, and appended to every column's
builder as it goes, so a dataset larger than RAM converts. The result is
published with one atomic rename once every column of every split is written
and their record counts agree; a failure leaves nothing at ``output``.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InvalidArgumentError, SchemaError, StoreExistsError
from .zrecord import _check_codec

__all__ = ["convert", "huggingface"]

# Decoded bytes gathered before one append per column: large enough that the
# writer's parallel compression has work, small enough for any machine.
_TARGET_BATCH_BYTES = 64 << 20
# Records fetched from the dataset at a time (decoding images is per record).
_DECODE_RECORDS = 256
_LAYOUTS = ("HWC", "CHW")

Encoder = Callable[[Any], np.ndarray]


def _need_datasets() -> Any:
    try:
        import datasets
    except ImportError as e:
        raise ImportError("the converter needs `pip install 'loaderx-engine[converter]'` "
                          "(Hugging Face datasets)") from e
    return datasets


# -- huggingface() ---------------------------------------------------------------------------


def _is_save_to_disk(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (
        (path / "state.json").is_file() and (path / "dataset_info.json").is_file())


def huggingface(repo_id: Any, *, config: str | None = None, revision: str = "main",
                token: str | None = None, endpoint: str | None = None) -> Any:
    """Returns a ``DatasetDict`` for ``repo_id`` (a Hub id, a local path, or a loaded dataset).

    Args:
        repo_id: ``"owner/name"`` on the Hub; an existing local directory
            (``save_to_disk`` output or a directory of data files; a local
            directory wins over a Hub id of the same spelling); or a loaded
            ``datasets.Dataset`` / ``DatasetDict``.
        config: the configuration (subset) name, for repositories and data
            directories that have several.
        revision: Hub branch, tag or commit; resolved to its commit first so
            the snapshot is immutable. Only ``"main"`` for local data.
        token: Hub token for private or gated repositories (Hub only).
        endpoint: Hub base URL (a mirror or a private Hub), for this call only.

    Raises:
        InvalidArgumentError: Hub-only options given with local data, or a
            ``config`` for a ``save_to_disk`` directory or loaded dataset.
        NotADirectoryError: ``repo_id`` is an existing file.
        FileNotFoundError: ``repo_id`` is a path (starts with ``.``, ``/`` or
            ``~``, or is a ``PathLike``) that does not exist.
        TypeError: ``repo_id`` is neither a string, a path nor a dataset.
    """
    datasets = _need_datasets()
    if isinstance(repo_id, datasets.DatasetDict):
        _local_only(config, revision, token, endpoint, config_ok=False)
        return repo_id
    if isinstance(repo_id, datasets.Dataset):
        _local_only(config, revision, token, endpoint, config_ok=False)
        return datasets.DatasetDict({str(repo_id.split or "train"): repo_id})
    if not isinstance(repo_id, (str, os.PathLike)):
        raise TypeError("repo_id must be a Hub id, a local path or a datasets Dataset/DatasetDict, "
                        f"got {type(repo_id).__name__}")
    path = Path(repo_id)
    if path.is_dir():
        if _is_save_to_disk(path):
            _local_only(config, revision, token, endpoint, config_ok=False)
            return _as_dict(datasets, datasets.load_from_disk(str(path)))
        _local_only(config, revision, token, endpoint, config_ok=True)
        return _as_dict(datasets, datasets.load_dataset(str(path), name=config))
    if path.exists():
        raise NotADirectoryError(f"{repo_id}: not a directory (pass a save_to_disk directory or "
                                 "the directory holding the data files)")
    if isinstance(repo_id, os.PathLike) or repo_id.startswith((".", "/", "~")):
        raise FileNotFoundError(f"{repo_id}: no such directory")
    return _from_hub(datasets, repo_id, config, revision, token, endpoint)


def _local_only(config: str | None, revision: str, token: str | None, endpoint: str | None,
                *, config_ok: bool) -> None:
    if revision != "main":
        raise InvalidArgumentError(f"revision={revision!r} applies to Hub repositories only")
    if token is not None or endpoint is not None:
        raise InvalidArgumentError("token and endpoint apply to Hub repositories only")
    if config is not None and not config_ok:
        raise InvalidArgumentError("config applies to Hub repositories and data-file directories")


def _as_dict(datasets: Any, loaded: Any) -> Any:
    if isinstance(loaded, datasets.DatasetDict):
        return loaded
    return datasets.DatasetDict({str(loaded.split or "train"): loaded})


def _from_hub(datasets: Any, repo_id: str, config: str | None, revision: str,
              token: str | None, endpoint: str | None) -> Any:
    from huggingface_hub import HfApi, snapshot_download

    endpoint = endpoint.rstrip("/") if endpoint is not None else None
    sha = HfApi(endpoint=endpoint, token=token).dataset_info(repo_id, revision=revision).sha
    if not sha:
        raise InvalidArgumentError(f"the Hub did not resolve {repo_id!r} at {revision!r}")
    local = snapshot_download(repo_id, repo_type="dataset", revision=sha, token=token,
                              endpoint=endpoint)
    return _as_dict(datasets, datasets.load_dataset(local, name=config))


# -- column plans ----------------------------------------------------------------------------


@dataclass
class _Column:
    """How one column is written: its store kind, dtype, shape and how values are made."""

    name: str
    feature: Any
    kind: str = "dense"            # "dense" | "ragged"
    dtype: np.dtype = field(default_factory=lambda: np.dtype(np.uint8))
    shape: tuple[int, ...] = ()    # dense item_shape; for ragged, len() is the rank
    image: bool = False
    encoder: Encoder | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)


def _numeric(column: str, name: Any) -> np.dtype:
    try:
        dt = np.dtype({"float": "float32", "double": "float64", "half": "float16"}.get(name, name))
    except TypeError:
        raise SchemaError(f"column {column!r}: dtype {name!r} is not numeric; pass "
                          f"encoders={{{column!r}: fn}} to turn its values into arrays") from None
    if dt.kind not in "biufc" or dt.itemsize == 0:
        raise SchemaError(f"column {column!r}: dtype {name!r} is not numeric; pass "
                          f"encoders={{{column!r}: fn}} to turn its values into arrays")
    return dt


def _declared(column: str, feature: Any) -> tuple[np.dtype, tuple[int | None, ...], bool]:
    """(dtype, shape with None for varying axes, is_image) from a feature, or SchemaError."""
    kind = type(feature).__name__
    if kind == "ClassLabel":
        return np.dtype(np.int64), (), False
    if kind == "Value":
        return _numeric(column, feature.dtype), (), False
    if kind == "Image":
        return np.dtype(np.uint8), (None, None, None), True
    if kind in ("Array2D", "Array3D", "Array4D", "Array5D"):
        shape = tuple(None if d is None or int(d) < 0 else int(d) for d in feature.shape)
        return _numeric(column, feature.dtype), shape, False
    if kind in ("List", "Sequence", "LargeList") or (isinstance(feature, list) and len(feature) == 1):
        inner = feature[0] if isinstance(feature, list) else feature.feature
        if isinstance(inner, (dict, list)) and not (isinstance(inner, list) and len(inner) == 1):
            raise SchemaError(f"column {column!r}: nested structures are not supported; pass "
                              f"encoders={{{column!r}: fn}} to turn its values into arrays")
        dtype, shape, image = _declared(column, inner)
        if image:
            raise SchemaError(f"column {column!r}: lists of images are not supported; pass "
                              f"encoders={{{column!r}: fn}}")
        length = getattr(feature, "length", -1)
        first = int(length) if isinstance(length, int) and length >= 0 else None
        return dtype, (first, *shape), False
    raise SchemaError(f"column {column!r}: feature {kind} is not supported (numeric Value, "
                      "ClassLabel, Image, ArrayND and lists of those are); pass "
                      f"encoders={{{column!r}: fn}} to turn its values into arrays")


def _image_shapes(ds: Any, column: str, layout: str, mode: str | None) -> Iterator[tuple[int, ...]]:
    """Shapes of an Image column read from the file headers, without decoding pixels."""
    import datasets
    from PIL import Image

    raw = ds.cast_column(column, datasets.Image(decode=False)).select_columns([column])
    for start in range(0, len(raw), _DECODE_RECORDS):
        for item in raw[start:start + _DECODE_RECORDS][column]:
            if item is None:
                raise SchemaError(f"column {column!r}: record {start} has no image (null)")
            src = io.BytesIO(item["bytes"]) if item.get("bytes") else item["path"]
            with Image.open(src) as im:
                bands = len(Image.new(mode or im.mode, (1, 1)).getbands())
                w, h = im.size
            yield _image_shape(h, w, bands, layout)


def _image_shape(h: int, w: int, bands: int, layout: str) -> tuple[int, ...]:
    if layout == "CHW":
        return (bands, h, w)
    return (h, w) if bands == 1 else (h, w, bands)


def _plan_encoded(col: _Column, record: Any) -> _Column:
    """An encoded column's plan from its encoder's output for record 0."""
    r = _encoded(col, record, 0)
    col.dtype, col.shape = r.dtype, r.shape
    col.kind = "dense" if r.ndim == 0 else "ragged"
    return col


def _plan_declared(col: _Column, name: str, feature: Any) -> tuple[Any, ...] | None:
    """Sets the dtype and image flag from the feature. If it declares every
    axis, also the shape, and returns None (the plan is complete); otherwise
    returns the declared axes (None where an axis is open)."""
    dtype, declared, image = _declared(name, feature)
    col.dtype, col.image = dtype, image
    if all(d is not None for d in declared):
        col.shape = tuple(int(d) for d in declared)  # type: ignore[arg-type]
        return None
    return tuple(declared)


def _plan(ds: Any, name: str, layout: str, encoder: Encoder | None,
          mode: str | None) -> _Column:
    feature = ds.features[name]
    col = _Column(name, feature, encoder=encoder)
    if encoder is not None:
        if len(ds) == 0:
            raise SchemaError(f"column {name!r}: an encoded column needs at least one record")
        return _plan_encoded(col, ds[0][name])
    declared = _plan_declared(col, name, feature)
    if declared is None:
        return col
    # Some axis may vary: scan the shapes (image headers, or the decoded values).
    if col.image:
        shapes: Iterator[tuple[int, ...]] = _image_shapes(ds, name, layout, mode)
    else:
        shapes = (np.shape(v) for v in _values(ds, col, layout))
    first_shape: tuple[int, ...] | None = None
    fixed = True
    for i, shape in enumerate(shapes):
        if first_shape is None:
            first_shape = shape
        elif len(shape) != len(first_shape):
            raise SchemaError(f"column {name!r}: record 0 has rank {len(first_shape)} but record "
                              f"{i} has rank {len(shape)}"
                              + (" (set image_mode, e.g. 'RGB', to give every image the same "
                                 "channels)" if col.image else ""))
        elif shape != first_shape:
            fixed = False
    col.shape = first_shape if first_shape is not None else tuple(0 for _ in declared)
    col.kind = "dense" if fixed else "ragged"
    return col


def _encoded(col: _Column, value: Any, index: int) -> np.ndarray:
    assert col.encoder is not None
    try:
        out = col.encoder(value)
    except Exception as e:
        raise SchemaError(f"column {col.name!r}: encoder failed on record {index}: {e}") from e
    if not isinstance(out, (np.ndarray, np.generic)):
        raise SchemaError(f"column {col.name!r}: encoder returned {type(out).__name__} for record "
                          f"{index}, not an ndarray")
    out = np.asarray(out)
    if out.dtype.kind not in "biufc":
        raise SchemaError(f"column {col.name!r}: encoder returned dtype {out.dtype} for record "
                          f"{index}, not a numeric dtype")
    return out


def _values(ds: Any, col: _Column, layout: str, start: int = 0,
            stop: int | None = None) -> Iterator[np.ndarray]:
    """The column's records [start, stop) as arrays of its dtype (one batch decoded at a time)."""
    stop = len(ds) if stop is None else stop
    view = ds.select_columns([col.name])
    view = view if col.encoder is not None else view.with_format("numpy", dtype=None)
    for lo in range(start, stop, _DECODE_RECORDS):
        hi = min(stop, lo + _DECODE_RECORDS)
        for k, value in enumerate(view[lo:hi][col.name]):
            yield _record(col, value, lo + k, layout)


def _record(col: _Column, value: Any, index: int, layout: str) -> np.ndarray:
    if col.encoder is not None:
        arr = _encoded(col, value, index)
        if arr.dtype != col.dtype or arr.ndim != col.ndim:
            raise SchemaError(f"column {col.name!r}: encoder returned {arr.dtype} of rank "
                              f"{arr.ndim} for record {index}, but {col.dtype} of rank "
                              f"{col.ndim} for record 0")
        return _contiguous(arr)
    if value is None:
        raise SchemaError(f"column {col.name!r}: record {index} is null")
    arr = np.asarray(value)
    if arr.dtype == object:
        raise SchemaError(f"column {col.name!r}: record {index} is not a regular array")
    if col.image:
        if arr.ndim == 2 and layout == "CHW":
            arr = arr[None]
        elif arr.ndim == 3 and layout == "CHW":
            arr = arr.transpose(2, 0, 1)
    return _contiguous(arr.astype(col.dtype, copy=False))


def _contiguous(arr: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns a 0-d record into shape (1,).
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


# -- store metadata ---------------------------------------------------------------------------


def _column_metadata(col: _Column, layout: str) -> dict[str, Any]:
    """What a converted store records about its column (JSON-able)."""
    import datasets

    meta: dict[str, Any] = {"source": "huggingface", "column": col.name}
    try:
        meta["feature"] = datasets.Features({col.name: col.feature}).to_dict()[col.name]
    except Exception:  # noqa: BLE001, S110 - a feature without a dict form is not recorded
        pass
    if type(col.feature).__name__ == "ClassLabel":
        meta["class_names"] = list(col.feature.names)
    if col.image:
        meta["image_layout"] = layout
    if col.encoder is not None:
        meta["encoder"] = getattr(col.encoder, "__qualname__", type(col.encoder).__name__)
    return meta


def _create_store(col: _Column, path: Path, codec: str, data_shards: int,
                  dict_bytes: bytes | None, metadata: dict[str, Any], narrow: bool) -> Any:
    """Opens the builder for one column, with the column's metadata recorded in the store."""
    from .zrecord import Dense, Ragged

    kwargs: dict[str, Any] = {"codec": codec, "data_shards": data_shards,
                              "dict_bytes": dict_bytes, "metadata": metadata, "narrow": narrow}
    if col.kind == "dense":
        return Dense.create(path, col.dtype, col.shape, **kwargs)
    return Ragged.create(path, col.dtype, ndim=col.ndim, **kwargs)


# -- convert() --------------------------------------------------------------------------------


def _component(name: Any, what: str) -> str:
    if (not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name
            or "\0" in name or name.startswith(".")):
        raise InvalidArgumentError(f"{what} name {name!r} cannot be a directory name")
    return name


def _progress_bar(enabled: bool | None, total: int | None, desc: str) -> Any:
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, desc=desc, unit="rec", file=sys.stderr, leave=False)


def _batches(ds: Any, columns: list[_Column], step: int) -> Iterator[dict[str, Any]]:
    """The split's records in batches of at most `step`: {column: values}."""
    if _is_streamed(ds):
        # A streamed dataset is read once, as Python values (exact: no formatter casts).
        yield from ds.select_columns([c.name for c in columns]).iter(batch_size=step)
        return
    n = len(ds)
    view = ds.select_columns([c.name for c in columns])
    plain = [c.name for c in columns if c.encoder is None]
    view = view.with_format("numpy", dtype=None, columns=plain, output_all_columns=True)
    for lo in range(0, n, step):
        yield view[lo:min(n, lo + step)]


def _write_split(ds: Any, target: Path, columns: list[_Column], layout: str, codec: str,
                 data_shards: int, dict_bytes: bytes | None, progress: bool | None,
                 desc: str, narrow: bool) -> None:
    n = None if _is_streamed(ds) else len(ds)
    step = _decode_records(columns)
    bar = _progress_bar(progress, n, desc)
    try:
        with ExitStack() as stack:
            writers = {c.name: stack.enter_context(
                _create_store(c, target / c.name, codec, data_shards, dict_bytes,
                              _column_metadata(c, layout), narrow)) for c in columns}
            pending: dict[str, list[np.ndarray]] = {c.name: [] for c in columns}
            pending_bytes = 0
            lo = 0
            for batch in _batches(ds, columns, step):
                count = len(batch[columns[0].name]) if columns else 0
                values: Any = None
                for c in columns:
                    values = batch[c.name]
                    if (c.kind == "dense" and c.encoder is None and not c.image
                            and isinstance(values, np.ndarray) and values.dtype != object
                            and values.shape == (count, *c.shape)):
                        block = np.ascontiguousarray(values.astype(c.dtype, copy=False))
                        pending[c.name].append(block)  # the whole batch as one block
                        pending_bytes += block.nbytes
                        continue
                    for k in range(count):
                        r = _record(c, values[k], lo + k, layout)
                        if c.kind == "dense" and r.shape != c.shape:
                            raise SchemaError(f"column {c.name!r}: record {lo + k} has shape "
                                              f"{r.shape}, record 0 {c.shape}")
                        if c.kind == "ragged" and r.ndim != c.ndim:
                            raise SchemaError(f"column {c.name!r}: record {lo + k} has rank "
                                              f"{r.ndim}, record 0 {c.ndim}")
                        pending[c.name].append(r[None] if c.kind == "dense" else r)
                        pending_bytes += r.nbytes
                del batch, values  # the decoded batch is not kept while appending
                lo += count
                if pending_bytes >= _TARGET_BATCH_BYTES:
                    _flush(columns, writers, pending)
                    pending_bytes = 0
                if bar is not None:
                    bar.update(count)
            _flush(columns, writers, pending)
            counts = {name: len(w) for name, w in writers.items()}
            if len(set(counts.values())) > 1 or (n is not None and set(counts.values()) != {n}):
                raise SchemaError(f"{desc}: columns disagree on record count: {counts}")
            if lo == 0:
                raise InvalidArgumentError(f"{desc}: the dataset is empty")
    finally:
        if bar is not None:
            bar.close()


def _is_streamed(ds: Any) -> bool:
    return type(ds).__name__ == "IterableDataset"


def _plan_streamed(ds: Any, name: str, layout: str, encoder: Encoder | None,
                   first: Any) -> _Column:
    """A streamed column's plan from its feature (no scan is possible) and record 0."""
    feature = ds.features[name] if ds.features is not None else None
    col = _Column(name, feature, encoder=encoder)
    if encoder is not None or feature is None:
        if encoder is None:
            raise SchemaError(f"column {name!r}: a streamed dataset without features cannot be "
                              "planned; cast it to known features or pass an encoder")
        return _plan_encoded(col, first)
    declared = _plan_declared(col, name, feature)
    if declared is None:
        return col
    # An open axis: Ragged (a stream cannot be scanned first), rank from record 0.
    col.shape = _record(col, first, 0, layout).shape
    col.kind = "ragged"
    return col


def _decode_records(columns: list[_Column]) -> int:
    """Records decoded at once: _DECODE_RECORDS, fewer when fixed-size rows are large."""
    row = sum(c.dtype.itemsize * max(1, int(np.prod(c.shape))) for c in columns
              if c.kind == "dense")
    return max(1, min(_DECODE_RECORDS, _TARGET_BATCH_BYTES // 8 // max(1, row)))


def _flush(columns: list[_Column], writers: dict[str, Any],
           pending: dict[str, list[np.ndarray]]) -> None:
    for c in columns:
        records = pending[c.name]
        if c.kind == "dense":
            if records:
                writers[c.name].append(np.concatenate(records))  # blocks of (k, *shape)
        elif records:
            writers[c.name].append(records)
        records.clear()


def convert(dataset: Any, output: str | os.PathLike[str], *, codec: str,
            image_layout: str = "HWC", image_mode: str | None = None,
            encoders: Mapping[str, Encoder] | None = None, data_shards: int = 4,
            dict_bytes: bytes | None = None, progress: bool | None = None,
            narrow: bool = True) -> Path:
    """Writes every split and column of ``dataset`` under ``output``; returns ``output``.

    Args:
        dataset: a ``DatasetDict`` (or any mapping of split name to
            ``Dataset``): stores go to ``output/<split>/<column>``; or one
            ``Dataset``: stores go to ``output/<column>``.
        output: the root to publish; must not exist.
        codec: ``"raw"``, ``"zstd"`` or ``"zstd_dict"`` (with ``dict_bytes``).
        image_layout: ``"HWC"`` (default; grayscale ``(H, W)``) or ``"CHW"``
            (grayscale ``(1, H, W)``) for ``Image`` columns; recorded in each
            image store's metadata.
        image_mode: a PIL mode (``"RGB"``, ``"L"``, ...) every image is
            converted to first; ``None`` keeps each file's own mode (then a
            column mixing grayscale and colour images fails, naming it).
        encoders: ``{column: fn}``; ``fn(value) -> ndarray`` turns each value
            of that column (strings, bytes, dicts, anything) into a numeric
            array. Its output for record 0 fixes the dtype and rank; a 0-d
            output makes a ``Dense`` store of scalars, any other a ``Ragged``
            one.
        data_shards: data files per store (1..255).
        progress: a progress bar per split on stderr; ``None`` (default): only
            when stderr is a terminal.
        narrow: integer columns of compressed stores keep each record's values
            in the fewest bytes that hold them (format 1.2, see ``narrow`` of
            :meth:`loaderx.zrecord.Dense.create`); ``False`` writes format 1.1
            stores, which loaderx builds older than format 1.2 read.

    Raises:
        StoreExistsError: ``output`` exists.
        SchemaError: a column cannot be stored (its name is in the message);
            raised before anything is written when the feature says so.
        InvalidArgumentError: a bad codec, layout, split or column name.
    """
    datasets = _need_datasets()
    dict_bytes = _check_codec(codec, dict_bytes)  # the stores' own check, before any reading
    if image_layout not in _LAYOUTS:
        raise InvalidArgumentError(f"image_layout must be 'HWC' or 'CHW', got {image_layout!r}")
    encoders = dict(encoders or {})
    for name, fn in encoders.items():
        if not callable(fn):
            raise TypeError(f"encoders[{name!r}] must be callable, got {type(fn).__name__}")
    single = (datasets.Dataset, datasets.IterableDataset)
    if isinstance(dataset, single):
        splits: dict[str | None, Any] = {None: dataset}
    elif isinstance(dataset, Mapping):
        if not dataset:
            raise InvalidArgumentError("dataset has no splits")
        splits = {_component(k, "split"): v for k, v in dataset.items()}
    else:
        raise TypeError("dataset must be a datasets Dataset or DatasetDict (see huggingface()), "
                        f"got {type(dataset).__name__}")
    for split, ds in splits.items():
        if not isinstance(ds, single):
            raise TypeError(f"split {split!r} must be a datasets Dataset, got {type(ds).__name__}")
        for name in encoders:
            if ds.column_names is not None and name not in ds.column_names:
                raise InvalidArgumentError(f"encoders names column {name!r}, which split "
                                           f"{split!r} does not have")
    output = Path(output)
    if output.exists():
        raise StoreExistsError(f"{output}: already exists (conversion writes a new root)")

    if image_mode is not None:
        splits = {k: _cast_images(datasets, ds, image_mode, encoders) for k, ds in splits.items()}
    # Every column's plan, for every split, before anything is written.
    plans = {split: _plans(ds, image_layout, encoders, image_mode, split)
             for split, ds in splits.items()}
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.converting-", dir=output.parent))
    try:
        for split, ds in splits.items():
            target = tmp if split is None else tmp / split
            target.mkdir(exist_ok=True)
            _write_split(ds, target, plans[split], image_layout, codec, data_shards, dict_bytes,
                         progress, split or output.name, narrow)
        if output.exists():
            raise StoreExistsError(f"{output}: was created during the conversion")
        os.rename(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return output


def _plans(ds: Any, layout: str, encoders: Mapping[str, Encoder], mode: str | None,
           split: str | None) -> list[_Column]:
    if not _is_streamed(ds):
        return [_plan(ds, _component(c, "column"), layout, encoders.get(c), mode)
                for c in ds.column_names]
    first = next(iter(ds), None)  # a streamed dataset starts again at each iteration
    if first is None:
        raise InvalidArgumentError(f"split {split or 'dataset'!r} is empty")
    return [_plan_streamed(ds, _component(c, "column"), layout, encoders.get(c), first[c])
            for c in first]


def _cast_images(datasets: Any, ds: Any, mode: str, encoders: Mapping[str, Encoder]) -> Any:
    for name, feature in ds.features.items():
        if type(feature).__name__ == "Image" and name not in encoders:
            ds = ds.cast_column(name, datasets.Image(mode=mode))
    return ds
