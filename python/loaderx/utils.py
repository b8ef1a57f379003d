"""Utilities around Zrecord stores: zstd dictionary training.

A ``zstd_dict`` store compresses every record with one shared dictionary,
which pays off for many small, similar records (token sequences, image tiles).
Train it once on settled data, then pass the bytes as ``dict_bytes``::

    d = train_dict(tokens_store)             # or an ndarray, or any iterable of arrays
    with Ragged.create("t2", np.int32, 1, codec="zstd_dict", dict_bytes=d) as rs:
        rs.append(records)
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from . import _loaderx
from .errors import InvalidArgumentError, SchemaError
from .zrecord import Dense, Ragged

__all__ = ["DEFAULT_DICT_SIZE", "train_dict"]

#: Default dictionary capacity: 110 KiB, as zstd's own command line.
DEFAULT_DICT_SIZE = 110 * 1024
# Samples fed to the trainer: about 100x the dictionary (zstd's advice).
_SAMPLE_FACTOR = 100
# Rows smaller than this are grouped so each sample has ~_GROUP_BYTES.
_SMALL_ROW = 256
_GROUP_BYTES = 1024
_MIN_SAMPLES = 8


def _check_dtype(dt: np.dtype) -> None:
    """Any fixed-size dtype holds trainable bytes (structured and ``S<n>`` included)."""
    if dt.hasobject:
        raise SchemaError(f"train_dict: dtype {dt} holds Python objects, not data")
    if dt.itemsize == 0:
        raise SchemaError(f"train_dict: zero-itemsize dtype {dt!r} holds no data")

Source = np.ndarray | Dense | Ragged | Iterable[np.ndarray]


def _as_bytes(a: np.ndarray) -> np.ndarray:
    """A C-contiguous uint8 view (or copy) of an array's data."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _from_array(a: np.ndarray, budget: int) -> Iterator[np.ndarray]:
    _check_dtype(a.dtype)
    if a.ndim == 0 or a.shape[0] == 0:
        if a.size:
            yield _as_bytes(a)
        return
    row = a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))
    group = -(-_GROUP_BYTES // row) if 0 < row < _SMALL_ROW else 1
    n_groups = -(-a.shape[0] // group)
    take = min(n_groups, max(1, budget // max(1, row * group)))
    # Evenly spaced samples describe the whole array, not just its start.
    for g in np.unique(np.linspace(0, n_groups - 1, take).astype(np.int64)):
        chunk = a[int(g) * group:(int(g) + 1) * group]
        if chunk.size:
            yield _as_bytes(chunk)


def _from_store(s: Dense | Ragged, budget: int) -> Iterator[np.ndarray]:
    n = len(s)
    if n == 0:
        return
    avg = max(1, s.nbytes // n)
    take = min(n, max(1, budget // avg))
    idx = np.unique(np.linspace(0, n - 1, take).astype(np.uint64))
    for a in range(0, len(idx), 1024):
        batch = s[idx[a:a + 1024]]
        for r in batch:
            if r.size:
                yield _as_bytes(r)


def _from_iterable(it: Iterable[Any], budget: int, dtypes: set[str]) -> Iterator[np.ndarray]:
    used = 0
    for k, r in enumerate(it):
        if not isinstance(r, np.ndarray):
            raise SchemaError(f"train_dict: item {k} is a {type(r).__name__}, not a numpy.ndarray")
        _check_dtype(r.dtype)
        dtypes.add(r.dtype.str)
        if r.size:
            b = _as_bytes(r)
            yield b
            used += b.nbytes
            if used >= budget:
                return


def train_dict(source: Source, *, path: str | os.PathLike[str] | None = None,
               size: int = DEFAULT_DICT_SIZE, narrow: bool = True) -> bytes:
    """Trains a zstd dictionary for ``codec="zstd_dict"``.

    Args:
        source: an ndarray of any fixed-size dtype (structured and ``S<n>``
            included; its rows along axis 0 are the samples, tiny rows are
            grouped), an open :class:`Dense` / :class:`Ragged` store (its
            records, evenly spaced), or a finite iterable of ndarrays (one
            sample each). At most about ``100 * size`` bytes are sampled.
        path: if given, the dictionary is also written to this file.
        size: dictionary capacity in bytes (>= 256); default 110 KiB.
        narrow: samples of an integer dtype that stores narrow (2, 4 or 8
            bytes, see ``narrow`` of :meth:`Dense.create`) are narrowed as the
            store will narrow its records, so the dictionary learns the bytes
            it will compress. ``False`` for a store created with ``narrow=False``.

    Returns:
        The dictionary bytes: zstd ``ZDICT`` format (with a non-zero id) when
        zstd's trainer can learn from the sample; for a source too small or
        too uniform for it (a handful of small records), the sampled bytes
        themselves, at most ``size``, as a raw-content dictionary (which
        zstd, and every store, accepts as well).

    Raises:
        InvalidArgumentError: ``size`` is out of range or the source holds no
            bytes at all.
        SchemaError: ``source`` holds something other than fixed-size NumPy data.
    """
    if isinstance(size, (bool, np.bool_)) or not isinstance(size, (int, np.integer)):
        raise TypeError(f"size must be an int, not {type(size).__name__}")
    size = int(size)
    if size < 256:
        raise InvalidArgumentError(f"dictionary size must be >= 256 bytes, got {size}")
    budget = size * _SAMPLE_FACTOR
    dtypes: set[str] = set()
    if isinstance(source, (Dense, Ragged)):
        dtypes.add(source.dtype.str)
        if not source._is_reader:
            raise InvalidArgumentError(f"train_dict: {source.path} is a builder; close() it and "
                                       "train on the store opened with open()")
        source._live_store()  # a closed store is no source
        samples = list(_from_store(source, budget))
    elif isinstance(source, np.ndarray):
        dtypes.add(source.dtype.str)
        samples = list(_from_array(source, budget))
    elif isinstance(source, (bytes, bytearray, memoryview, str)):
        raise SchemaError(f"train_dict takes arrays or a store, not {type(source).__name__}; "
                          "convert with np.frombuffer first")
    elif isinstance(source, Iterable):
        samples = list(_from_iterable(source, budget, dtypes))
    else:
        raise SchemaError(f"train_dict takes an ndarray, a Dense/Ragged store or an iterable of "
                          f"ndarrays, not {type(source).__name__}")
    total = sum(s.nbytes for s in samples)
    if total == 0:
        raise InvalidArgumentError("too little data to train a dictionary: the source holds no bytes")
    d = None
    if len(samples) >= _MIN_SAMPLES:
        try:
            # One dtype: samples are narrowed as its stores narrow records.
            narrow_as = next(iter(dtypes)) if narrow and len(dtypes) == 1 else ""
            d = _loaderx.train_dictionary(samples, size, narrow_as)
        except InvalidArgumentError:
            d = None  # zstd could not learn from it: raw content below
    if d is None:
        d = np.concatenate(samples)[:size].tobytes()
    if path is not None:
        pathlib.Path(path).write_bytes(d)
    return d
