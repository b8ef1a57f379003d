"""Zrecord stores: typed, immutable, ordered record sequences on disk.

:class:`Dense` stores one fixed-shape array per record; :class:`Ragged` stores
arrays of one dtype and rank whose every axis may vary. Both are built with
``create`` (an append-only builder that ``close`` publishes atomically) and read
with ``open``::

    with Dense.create("data", np.float32, (2, 4), codec="zstd") as ds:
        ds.append(np.zeros((8, 2, 4), np.float32))
    with Dense.open("data") as ds:
        ds[0]           # ndarray (2, 4): the record itself
        ds[0, 5, 2]     # ndarray (3, 2, 4), requested order kept
        ds[1:3]         # ndarray (2, 2, 4)

Indices are sequence positions ``0..len-1``: a negative or too large index
raises :class:`~loaderx.errors.RecordIndexError` (an ``IndexError``). A
selection is an int, a slice, a range, a list or tuple of ints, an integer
array of any rank (flattened), or a 1-D boolean mask of length ``len(store)``;
an empty selection of any dtype is an empty batch. A bool, a float or a string
raises :class:`~loaderx.errors.InvalidIndexError` (an ``IndexError`` and a
``TypeError``). The on-disk format is docs/format.md; what differs from the
2.5.4 wheel is docs/compat.md.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Iterable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from . import _loaderx

if TYPE_CHECKING:
    from typing_extensions import Self

from ._codecs import CODECS, Codec
from .errors import (
    ArgumentTypeError,
    InvalidArgumentError,
    InvalidIndexError,
    RecordIndexError,
    SchemaError,
    StateError,
    StoreNotFoundError,
    UnavailableError,
    ZrecordError,
)

__all__ = ["Codec", "Dense", "Ragged", "ZrecordError"]

_CODECS: tuple[str, ...] = CODECS
# Input handed to the native writer per call: bounds the memory append uses
# (a 20 GB memmap is streamed through in slices of this size).
_APPEND_CHUNK_BYTES = 64 << 20
# Records taken from the iterable, checked, then written per native call: at
# most this many records or bytes of them (the bytes bound what a generator's
# records hold alive; the writer cuts the call into pipelined chunks).
_RAGGED_BATCH_RECORDS = 65536
_RAGGED_BATCH_BYTES = 64 << 20
# Records gathered per step of iteration.
_ITER_BATCH = 1024
_ALLOWED_KINDS = "biufcmMSUV"
# NumPy 2's dimension limit; a dense batch adds one axis to item_shape.
_MAX_NDIM = 64
_TOKEN = object()  # guards the private constructor

PathLike = str | os.PathLike[str]
Index = int | np.integer | slice | range | Sequence[int] | np.ndarray


def _check_dtype(dtype: Any) -> np.dtype:
    """Returns ``dtype`` as a NumPy dtype if Zrecord can store it, else raises SchemaError.

    ``None`` is float64, as for NumPy. Fixed-width bytes (``S<n>``), text
    (``U<n>``), unstructured void (``V<n>``) and either byte order are stored
    as they are and come back with the same dtype.
    """
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise SchemaError(f"not a NumPy dtype: {dtype!r}") from e
    if dt.fields is not None:
        raise SchemaError(f"structured dtype {dt} is not supported; store each field as its own stream")
    if dt.subdtype is not None:
        raise SchemaError(f"subarray dtype {dt} is not supported; put the subarray in item_shape")
    if dt.hasobject:
        raise SchemaError(f"object dtype {dt} is not supported (it holds pointers, not data)")
    if dt.metadata is not None:
        raise SchemaError(f"metadata-bearing dtype {dt!r} is not supported")
    if dt.itemsize == 0:
        raise SchemaError(f"zero-itemsize dtype {dt!r} is not supported")
    if dt.kind not in _ALLOWED_KINDS:  # pragma: no cover - NumPy has no other fixed-size kind
        raise SchemaError(f"dtype {dt.str} (kind {dt.kind!r}) is not supported")
    return dt


def _check_codec(codec: Any, dict_bytes: Any) -> bytes | None:
    if not isinstance(codec, str) or codec not in _CODECS:
        raise InvalidArgumentError(f"unknown codec {codec!r} (expected one of "
                                   f"{', '.join(map(repr, _CODECS))})")
    if dict_bytes is None:
        if codec == "zstd_dict":
            raise InvalidArgumentError(
                "codec 'zstd_dict' needs dict_bytes; train one with loaderx.utils.train_dict")
        return None
    if not isinstance(dict_bytes, (bytes, bytearray, memoryview)):
        raise TypeError(f"dict_bytes must be bytes, not {type(dict_bytes).__name__}")
    if codec != "zstd_dict":
        raise InvalidArgumentError(f"dict_bytes is only used with codec 'zstd_dict', not {codec!r}")
    data = bytes(dict_bytes)
    if not data:
        raise InvalidArgumentError("dict_bytes is empty")
    return data


def _check_shards(data_shards: Any) -> int:
    if isinstance(data_shards, (bool, np.bool_)) or not isinstance(data_shards, (int, np.integer)):
        raise ArgumentTypeError(f"data_shards must be an int, not {type(data_shards).__name__}")
    if not 1 <= int(data_shards) <= 255:
        raise InvalidArgumentError(f"data_shards must be in 1..255, got {int(data_shards)}")
    return int(data_shards)


_MAX_METADATA_BYTES = 512 << 10  # format.h kMaxUserMetadataBytes


def _check_metadata(metadata: Any) -> str:
    """Returns ``metadata`` as compact JSON text ('' for None), or raises.

    JSON values only: dicts with str keys, lists/tuples (read back as lists),
    str, int, float (finite), bool, None. Anything else raises.
    """
    if metadata is None:
        return ""
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict of JSON values, not {type(metadata).__name__}")

    def check_keys(v: Any, where: str) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                if not isinstance(k, str):
                    raise InvalidArgumentError(
                        f"metadata is not JSON-serialisable: key {k!r} at {where} is not a str")
                check_keys(x, f"{where}[{k!r}]")
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                check_keys(x, f"{where}[{i}]")

    check_keys(metadata, "metadata")
    try:
        text = json.dumps(metadata, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"metadata is not JSON-serialisable: {e}") from e
    if len(text.encode()) > _MAX_METADATA_BYTES:
        raise InvalidArgumentError(
            f"metadata is {len(text.encode())} bytes as JSON; at most {_MAX_METADATA_BYTES} are kept")
    return text


_U64 = np.dtype(np.uint64)  # the native-order descriptor NumPy hands out for uint64 arrays


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _index_type_error(key: Any) -> NoReturn:
    raise InvalidIndexError(
        "record indices must be integers, slices, sequences / arrays of integers or a boolean "
        f"mask, not {type(key).__name__}"
        + (f" ({key!r})" if isinstance(key, (float, bool, np.floating, np.bool_)) else ""))


def _as_index_array(key: Sequence[Any]) -> np.ndarray:
    """A list or tuple of indices (nested: any rank) as an ndarray."""
    bools = [isinstance(x, (bool, np.bool_)) for x in key]
    if any(bools) and not all(bools):  # a mask is all bools; True is no record number
        _index_type_error(key[bools.index(True)])
    for x in key:
        if isinstance(x, (float, np.floating, str, bytes)) or x is None:
            _index_type_error(x)
    try:
        arr = np.asarray(key)
    except (ValueError, OverflowError) as e:
        raise InvalidArgumentError(f"record indices do not form a regular array: {e}") from None
    if arr.dtype == object:  # ints beyond 64 bits, or a mixture
        if all(_is_int(x) for x in key):
            raise InvalidIndexError(f"record index {max(key)} does not fit in 64 bits")
        _index_type_error(key)
    return arr


class _Stream:
    """What Dense and Ragged share: the builder/reader lifecycle and indexing."""

    _KIND: str = ""

    def __init__(self, token: object = None, path: str = "", writer: Any = None, store: Any = None,
                 dtype: np.dtype | None = None, codec: str = "", data_shards: int = 0,
                 item_shape: tuple[int, ...] = (), ndim: int = 0, metadata: str = "") -> None:
        if token is not _TOKEN:
            raise TypeError(f"use {type(self).__name__}.create(...) or {type(self).__name__}.open(...)")
        self._path = path
        self._writer = writer
        self._native = store          # the _loaderx.Store; None once closed or for builders
        # Its batch gather (gather_dense / gather_ragged) bound once: the uint64 fast
        # path of __getitem__ calls it without a getattr; None exactly when _native is.
        self._gather = getattr(store, self._GATHER) if store is not None else None
        self._is_reader = store is not None
        self._failed = False
        if store is not None:
            dtype = np.dtype(store.dtype)
            codec = store.codec
            data_shards = store.data_shards
            item_shape = tuple(int(d) for d in store.item_shape)
            ndim = int(store.ndim)
            self._len = len(store)
            self._nbytes = int(store.nbytes)
            self._stored_bytes = int(store.stored_bytes)
            meta_obj = store.metadata
            metadata = json.dumps(meta_obj) if meta_obj is not None else ""
        self._metadata_text = metadata
        assert dtype is not None
        self._dtype = dtype
        self._codec = codec
        self._data_shards = data_shards
        self._item_shape = item_shape
        self._ndim = ndim

    # -- schema -----------------------------------------------------------
    @property
    def path(self) -> pathlib.Path:
        """The store directory."""
        return pathlib.Path(self._path)

    @property
    def dtype(self) -> np.dtype:
        """The dtype of every record (little-endian)."""
        return self._dtype

    @property
    def ndim(self) -> int:
        """The rank of every record."""
        return self._ndim

    @property
    def codec(self) -> str:
        """``"raw"``, ``"zstd"`` or ``"zstd_dict"``."""
        return self._codec

    @property
    def data_shards(self) -> int:
        """Number of data files (1..255)."""
        return self._data_shards

    @property
    def metadata(self) -> dict[str, Any]:
        """The ``metadata`` dict given to ``create`` (a fresh copy each time;
        tuples read back as lists); ``{}`` if none was given, and for stores
        written before format 1.1."""
        return json.loads(self._metadata_text) if self._metadata_text else {}

    @property
    def nbytes(self) -> int:
        """Logical (decoded) bytes of all records."""
        if self._is_reader:
            return self._nbytes
        raise UnavailableError(f"{self._path}: nbytes is known once the store is published and opened")

    @property
    def stored_bytes(self) -> int:
        """Bytes of every file of the store on disk (reader only)."""
        if self._is_reader:
            return self._stored_bytes
        raise UnavailableError(f"{self._path}: stored_bytes is known once the store is opened")

    def has_dict(self) -> bool:
        """True if the store compresses with a zstd dictionary (codec ``"zstd_dict"``)."""
        return self._codec == "zstd_dict"

    def __len__(self) -> int:
        if self._is_reader:
            return self._len
        return len(self._writer) if self._writer is not None else 0

    def __repr__(self) -> str:
        mode = "reader" if self._is_reader else "builder"
        state = " closed" if (self._native is None and self._writer is None) else ""
        return (f"<{type(self).__name__} {mode}{state} {self._path!r} n={len(self)} "
                f"dtype={self._dtype.str} {self._shape_repr()} codec={self._codec}>")

    def _shape_repr(self) -> str:
        raise NotImplementedError

    # -- lifecycle --------------------------------------------------------
    def close(self) -> None:
        """Builder: publish the store atomically. Reader: release it. Idempotent."""
        if self._is_reader:
            self._native = None
            self._gather = None
            return
        w, self._writer = self._writer, None
        if w is None:
            return
        if self._failed:
            w.abort()
            raise StateError(f"{self._path}: an append failed part-way; the store was discarded")
        try:
            w.publish()
        except BaseException:
            w.abort()
            raise

    def _discard(self) -> None:
        w, self._writer = self._writer, None
        if w is not None:
            w.abort()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None and not self._is_reader:
            self._discard()  # nothing appears at path
            return
        self.close()

    def _live_writer(self) -> Any:
        if self._is_reader:
            raise StateError(f"{self._path}: opened for reading; a reader cannot be appended to")
        if self._writer is None:
            raise StateError(f"{self._path}: builder is closed; nothing can be appended")
        if self._failed:
            raise StateError(f"{self._path}: an append failed part-way; the builder is unusable")
        return self._writer

    def _live_store(self) -> Any:
        if not self._is_reader:
            raise StateError(f"{self._path}: a builder cannot be read; close() it and open() the store")
        if self._native is None:
            raise StateError(f"{self._path}: store is closed")
        return self._native

    # -- reading ----------------------------------------------------------
    def _resolve(self, key: Any) -> int | np.ndarray:
        """A scalar index as int, any other selection as a uint64 index array."""
        n = len(self)
        if _is_int(key):
            i = int(key)
            if i >= 1 << 64:
                raise InvalidIndexError(f"record index {i} does not fit in 64 bits ({self._path})")
            if not 0 <= i < n:
                raise RecordIndexError(f"record index {i} out of range 0..{n - 1} ({self._path})"
                                       if n else f"record index {i}: store {self._path} is empty")
            return i
        if isinstance(key, slice):
            return np.arange(*key.indices(n), dtype=np.uint64)
        if isinstance(key, range):
            key = np.arange(key.start, key.stop, key.step, dtype=np.int64)
        elif isinstance(key, (tuple, list)):
            if not key:
                return np.empty(0, dtype=np.uint64)
            key = _as_index_array(key)
        if isinstance(key, np.ndarray):
            if key.dtype == np.bool_:
                if key.ndim != 1 or key.size != n:
                    raise InvalidIndexError(
                        f"a boolean mask must be 1-D of length {n} (len of {self._path}), "
                        f"got shape {key.shape}")
                return np.flatnonzero(key).astype(np.uint64)
            if key.size == 0:
                return np.empty(0, dtype=np.uint64)
            if key.dtype.kind not in "iu":
                _index_type_error(key.dtype.type(0) if key.dtype.kind == "f" else key)
            return self._check_array(key.reshape(-1))
        _index_type_error(key)

    # Name of the native batch gather ("gather_dense" / "gather_ragged").
    _GATHER = ""

    def _get(self, key: Any) -> Any:
        """One record for a scalar key, else the kind's batch (shared by Dense and Ragged)."""
        # Fast path (also inlined in Dense/Ragged.__getitem__): a 1-D uint64 index array
        # (what samplers and the loader pass) needs no conversion and no sign check; the
        # engine range-checks it.
        g = self._gather
        if type(key) is np.ndarray and key.dtype is _U64 and key.ndim == 1 and g is not None:
            return g(key)
        s = self._live_store()
        if type(key) is int and 0 <= key < self._len:  # fast path: one record
            return s.read(key)
        sel = self._resolve(key)
        if isinstance(sel, int):
            return s.read(sel)
        return getattr(s, self._GATHER)(sel)

    def _get_batch(self, keys: Any) -> Any:
        """The kind's batch for any selection; a scalar is a batch of one."""
        g = self._gather
        if type(keys) is np.ndarray and keys.dtype is _U64 and keys.ndim == 1 and g is not None:
            return g(keys)  # as in _get
        s = self._live_store()
        sel = self._resolve(keys)
        if isinstance(sel, int):
            sel = np.array([sel], dtype=np.uint64)
        return getattr(s, self._GATHER)(sel)

    def _iter(self) -> Iterator[np.ndarray]:
        s = self._live_store()
        gather = getattr(s, self._GATHER)
        n = len(self)
        for a in range(0, n, _ITER_BATCH):
            yield from gather(np.arange(a, min(n, a + _ITER_BATCH), dtype=np.uint64))

    def _check_array(self, arr: np.ndarray) -> np.ndarray:
        """Rejects negative indices; the engine range-checks the rest (IndexError)."""
        if arr.size == 0:
            return arr.astype(np.uint64)
        if arr.dtype.kind == "i":
            lo = int(arr.min())
            if lo < 0:
                raise RecordIndexError(f"record index {lo} is negative; indices must be in "
                                       f"0..{len(self) - 1} ({self._path})")
            if arr.dtype.itemsize == 8:
                return arr.view(np.uint64)  # non-negative int64: same bits, no copy
        return arr.astype(np.uint64, copy=False)

    def verify(self, progress: Any = None) -> None:
        """Checks every checksum of the store (metadata, index, shapes, dictionary, each record).

        Args:
            progress: optional ``callable(done, total)`` called now and then.

        Raises:
            CorruptStoreError: naming the file, or the first bad record.
        """
        self._live_store().verify(progress)


class Dense(_Stream):
    """A store of fixed-shape records: every record is an ndarray of ``item_shape``.

    Reads: ``ds[i]`` -> ndarray ``item_shape``; ``ds[i, j]``, ``ds[[...]]``,
    ``ds[np.array(...)]``, ``ds[a:b]`` -> one ndarray ``(B, *item_shape)``.
    """

    _KIND = "dense"

    @classmethod
    def create(cls, path: PathLike, dtype: Any, item_shape: Any, *, codec: Codec,
               data_shards: int = 4, dict_bytes: bytes | None = None,
               metadata: dict[str, Any] | None = None, narrow: bool = True) -> Dense:
        """Starts building a new store at ``path`` (which must not exist).

        Args:
            path: the new store directory; missing parents are created.
            dtype: record dtype (fixed itemsize, little-endian; no structured,
                subarray, object or metadata-bearing dtypes).
            item_shape: shape of each record, e.g. ``(28, 28)``; ``()`` for scalars.
            codec: ``"raw"``, ``"zstd"`` (level 3) or ``"zstd_dict"``.
            data_shards: number of data files written in parallel, 1..255.
            dict_bytes: the zstd dictionary for ``"zstd_dict"`` (see
                :func:`loaderx.utils.train_dict`).
            metadata: a dict of JSON values kept in the store (checksummed with
                its metadata) and returned by ``.metadata``; at most 512 KiB as JSON.
            narrow: with ``"zstd"`` / ``"zstd_dict"`` and an integer dtype of 2, 4
                or 8 bytes, store each record's values in the fewest bytes (1, 2
                or 4) that hold them all; reads widen them back, so nothing
                changes for readers but the size (format 1.2; 1.3, with a 4-byte
                index entry, for records of up to 4 KiB on average). ``False`` writes
                every value at full width, format 1.1, which loaderx builds
                older than format 1.2 read too.

        Returns:
            An append-only builder; ``close()`` (or leaving ``with``) publishes.
        """
        dt = _check_dtype(dtype)
        shape = _check_item_shape(item_shape)
        d = _check_codec(codec, dict_bytes)
        shards = _check_shards(data_shards)
        p = os.fspath(path)
        meta = _check_metadata(metadata)
        _take_empty_dir(p)
        w = _loaderx.StoreWriter(p, "dense", dt.str, list(shape), len(shape), codec, shards, d,
                                 metadata=meta, narrow=narrow)
        return cls(_TOKEN, p, writer=w, dtype=dt, codec=codec, data_shards=shards,
                   item_shape=shape, ndim=len(shape), metadata=meta)

    @classmethod
    def open(cls, path: PathLike) -> Dense:
        """Opens a published dense store read-only (O(1): nothing is scanned)."""
        p = os.fspath(path)
        s = _open_native(p)
        if s.kind != "dense":
            raise SchemaError(f"{p} is a {s.kind} store; open it with Ragged.open")
        return cls(_TOKEN, p, store=s)

    @property
    def item_shape(self) -> tuple[int, ...]:
        """Shape of every record."""
        return self._item_shape

    def _shape_repr(self) -> str:
        return f"item_shape={self._item_shape}"

    def append(self, data: np.ndarray) -> None:
        """Appends ``data.shape[0]`` records from an ndarray (or np.memmap).

        Args:
            data: ndarray of shape ``(n, *item_shape)`` and exactly the store's
                dtype (no casting). It is streamed in bounded slices, so a memmap
                larger than RAM is never loaded whole.
        """
        w = self._live_writer()
        if isinstance(data, np.ndarray) and data.ndim == 0 and not self._item_shape:
            data = data.reshape(1)  # one scalar record
        if not isinstance(data, np.ndarray):
            raise SchemaError(
                f"Dense.append takes a numpy.ndarray of shape (n, *{self._item_shape}), not "
                f"{type(data).__name__}; convert with np.asarray / np.frombuffer first")
        if data.dtype != self._dtype or data.dtype.str != self._dtype.str:
            raise SchemaError(f"{self._path}: data dtype {data.dtype.str} does not match the "
                              f"store dtype {self._dtype.str} (no implicit casting)")
        if data.ndim != 1 + len(self._item_shape) or tuple(data.shape[1:]) != self._item_shape:
            raise SchemaError(f"{self._path}: data shape {data.shape} is not (n, *item_shape) "
                              f"with item_shape {self._item_shape}")
        n = int(data.shape[0])
        item = max(1, self._dtype.itemsize * int(np.prod(self._item_shape, dtype=np.int64)))
        rows = max(1, _APPEND_CHUNK_BYTES // item)
        try:
            for a in range(0, n, rows):
                chunk = np.ascontiguousarray(data[a:a + rows])
                w.append_dense(chunk, chunk.shape[0])
        except BaseException:
            self._failed = True
            raise

    _GATHER = "gather_dense"

    def __getitem__(self, key: Index) -> Any:
        """One record for an int (a NumPy scalar if ``item_shape == ()``, as
        ``arr[i]`` is), else one ``(B, *item_shape)`` ndarray."""
        g = self._gather  # _get's fast path, without its call (~0.2 us of a ~25 us batch)
        if type(key) is np.ndarray and key.dtype is _U64 and key.ndim == 1 and g is not None:
            return g(key)
        r = self._get(key)
        if not self._item_shape and _is_int(key):
            return r[()]
        return r

    def __getitems__(self, keys: Index) -> np.ndarray:
        """Any selection as one ``(B, *item_shape)`` ndarray (an int is a batch of one).

        The batched-fetch hook of ``torch.utils.data.DataLoader``.
        """
        return self._get_batch(keys)

    def __iter__(self) -> Iterator[np.ndarray]:
        return self._iter()


class Ragged(_Stream):
    """A store of variable-shape records of one dtype and rank ``ndim``.

    Reads: ``rs[i]`` -> ndarray of the record's own shape; any multi-record
    selection -> ``list`` of such ndarrays, in the requested order.
    """

    _KIND = "ragged"

    @classmethod
    def create(cls, path: PathLike, dtype: Any, ndim: int, *, codec: Codec,
               data_shards: int = 4, dict_bytes: bytes | None = None,
               metadata: dict[str, Any] | None = None, narrow: bool = True) -> Ragged:
        """Starts building a new ragged store at ``path`` (which must not exist).

        Args:
            path: the new store directory; missing parents are created.
            dtype: dtype of every record (see :meth:`Dense.create`).
            ndim: rank of every record, >= 1 (scalars: use Dense with ``item_shape=()``).
            codec, data_shards, dict_bytes, metadata, narrow: as for :meth:`Dense.create`.
        """
        dt = _check_dtype(dtype)
        if not _is_int(ndim):
            raise SchemaError(f"ndim must be an int, not {type(ndim).__name__}")
        if not 1 <= int(ndim) <= _MAX_NDIM:
            raise InvalidArgumentError(
                f"ndim must be in 1..{_MAX_NDIM}, got {int(ndim)} (scalar records: use Dense with "
                "item_shape=())")
        d = _check_codec(codec, dict_bytes)
        shards = _check_shards(data_shards)
        p = os.fspath(path)
        meta = _check_metadata(metadata)
        _take_empty_dir(p)
        w = _loaderx.StoreWriter(p, "ragged", dt.str, [], int(ndim), codec, shards, d, metadata=meta,
                                 narrow=narrow)
        return cls(_TOKEN, p, writer=w, dtype=dt, codec=codec, data_shards=shards, ndim=int(ndim),
                   metadata=meta)

    @classmethod
    def open(cls, path: PathLike) -> Ragged:
        """Opens a published ragged store read-only (O(1): nothing is scanned)."""
        p = os.fspath(path)
        s = _open_native(p)
        if s.kind != "ragged":
            raise SchemaError(f"{p} is a {s.kind} store; open it with Dense.open")
        return cls(_TOKEN, p, store=s)

    def _shape_repr(self) -> str:
        return f"ndim={self._ndim}"

    def append(self, records: Iterable[np.ndarray]) -> None:
        """Appends every array of a finite iterable, in order.

        Args:
            records: iterable of ndarrays, each of exactly the store's dtype and
                ``ndim`` (any shape, zero-length axes included). Consumed in
                bounded batches.

        If a record is rejected after earlier batches of the same call were
        written, the builder becomes unusable and the store is discarded.
        """
        w = self._live_writer()
        if isinstance(records, (bytes, bytearray, memoryview, str)) or not isinstance(records, Iterable):
            raise SchemaError(f"Ragged.append takes an iterable of numpy.ndarray records, not "
                              f"{type(records).__name__}; convert with np.asarray / np.frombuffer first")
        before = len(w)
        k0 = 0
        it = iter(records)
        try:
            while True:
                n, bad = w.append_ragged_from(it, self._dtype, self._ndim, _RAGGED_BATCH_RECORDS,
                                              _RAGGED_BATCH_BYTES)
                if bad is not None:
                    self._check_record(k0 + n, bad)
                    raise SchemaError(f"record {k0 + n} was rejected")  # pragma: no cover
                if n == 0:
                    return
                k0 += n
        except BaseException:
            if len(w) > before:  # part of this call was written: no consistent store
                self._failed = True
            raise

    def _check_record(self, k: int, r: Any) -> None:
        """Raises SchemaError saying why record ``k`` cannot be appended."""
        if not isinstance(r, np.ndarray):
            raise SchemaError(f"record {k} is a {type(r).__name__}, not a numpy.ndarray; "
                              "convert with np.asarray / np.frombuffer first")
        if r.dtype != self._dtype or r.dtype.str != self._dtype.str:
            raise SchemaError(f"record {k}: dtype {r.dtype.str} does not match the store "
                              f"dtype {self._dtype.str} (no implicit casting)")
        if r.ndim != self._ndim:
            raise SchemaError(f"record {k}: ndim {r.ndim} (shape {r.shape}) does not match "
                              f"the store ndim {self._ndim}")

    _GATHER = "gather_ragged"

    def __getitem__(self, key: Index) -> np.ndarray | list[np.ndarray]:
        g = self._gather  # as in Dense.__getitem__
        if type(key) is np.ndarray and key.dtype is _U64 and key.ndim == 1 and g is not None:
            return g(key)
        return self._get(key)

    def __getitems__(self, keys: Index) -> list[np.ndarray]:
        """Any selection as a list of records (an int is a list of one).

        The batched-fetch hook of ``torch.utils.data.DataLoader``.
        """
        return self._get_batch(keys)

    def __iter__(self) -> Iterator[np.ndarray]:
        return self._iter()


def _check_item_shape(item_shape: Any) -> tuple[int, ...]:
    if _is_int(item_shape):
        item_shape = (item_shape,)
    try:
        dims = tuple(item_shape)
    except TypeError:
        raise SchemaError(f"item_shape must be a tuple of ints, not {type(item_shape).__name__}") from None
    for d in dims:
        if not _is_int(d):
            raise SchemaError(f"item_shape must be a tuple of ints, got {item_shape!r}")
        if int(d) < 0:
            raise InvalidArgumentError(f"item_shape dimensions must be >= 0, got {item_shape!r}")
    if len(dims) >= _MAX_NDIM:
        raise InvalidArgumentError(f"item_shape has {len(dims)} dimensions (at most {_MAX_NDIM - 1}: "
                                   f"a batch adds one and NumPy allows {_MAX_NDIM})")
    return tuple(int(d) for d in dims)


def _take_empty_dir(path: str) -> None:
    """Lets ``create`` build at an existing empty directory (as the 2.5.4 wheel does).

    The directory is removed so the native writer can publish there with its
    usual no-replace rename; anything else at ``path`` is left for the writer
    to refuse (``StoreExistsError``).
    """
    try:
        if not os.path.islink(path) and os.path.isdir(path) and not os.listdir(path):
            os.rmdir(path)
    except OSError:
        pass  # not ours to remove: the writer names the problem


def _open_native(path: str) -> Any:
    """The native store at ``path``; an empty directory is ``StoreNotFoundError``."""
    try:
        empty = not os.path.islink(path) and os.path.isdir(path) and not os.listdir(path)
    except OSError:
        empty = False
    if empty:
        raise StoreNotFoundError(f"{path}: empty directory, no Zrecord store there")
    return _loaderx.Store.open(path)
