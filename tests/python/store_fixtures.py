"""The stores checked in under tests/data/zrecord-1.0/ and the records they hold.

They were written by the format 1.0 writer (loaderx before the 1.1 format change) with
``python tests/python/store_fixtures.py tests/data/zrecord-1.0``; the current code must
keep reading them exactly (tests/python/test_store_compat.py). Re-running the script now
writes format 1.1 stores of the same content, which the same test also reads.
"""

from __future__ import annotations

import os
import sys

import numpy as np
from loaderx.zrecord import Codec


def _photo(i: int) -> np.ndarray:
    return ((np.arange(3 * 8 * 8, dtype=np.uint32) // 16 + i) % 251).astype(np.uint8).reshape(3, 8, 8)


def _tokens(i: int) -> np.ndarray:
    n = 1 + (i * 37) % 90
    return ((np.arange(n, dtype=np.int64) * 31 + i) % 1000).astype(np.int32)


def _block(i: int) -> np.ndarray:
    return ((np.arange(16, dtype=np.int64) * 37 + i * 11) % 700 - (i % 3) * 200).astype(np.int32)


def _grid(i: int) -> np.ndarray:
    h, w = 1 + i % 5, 1 + (i * 3) % 4
    return (np.arange(h * w, dtype=np.float32) + i).reshape(h, w)


def dense_records(name: str) -> np.ndarray:
    """Every record of the dense fixture ``name``, stacked."""
    if name == "labels_raw":
        return (np.arange(5000, dtype=np.int64) * 7 % 10).astype(np.uint8)
    if name in ("photo_raw", "photo_zstd", "photo_dict"):
        return np.stack([_photo(i) for i in range(60)])
    if name == "floats_zstd":
        return np.stack([np.full(33, i, np.float64) + np.arange(33) for i in range(300)])
    if name == "blocks_zstd":
        return np.stack([_block(i) for i in range(400)])
    if name == "blocks_dict":
        return np.stack([_block(i) for i in range(400)]).astype(np.int64)
    raise KeyError(name)


def ragged_records(name: str) -> list[np.ndarray]:
    """Every record of the ragged fixture ``name``, in order."""
    if name in ("tokens_raw", "tokens_zstd"):
        return [_tokens(i) for i in range(200)] + [np.zeros(0, np.int32)]
    if name == "grid_zstd":
        return [_grid(i) for i in range(50)]
    raise KeyError(name)


# name -> (kind, codec, data_shards)
FIXTURES: dict[str, tuple[str, Codec, int]] = {
    "labels_raw": ("dense", "raw", 2),
    "photo_raw": ("dense", "raw", 3),
    "photo_zstd": ("dense", "zstd", 2),
    "photo_dict": ("dense", "zstd_dict", 1),
    "floats_zstd": ("dense", "zstd", 4),
    "tokens_raw": ("ragged", "raw", 2),
    "tokens_zstd": ("ragged", "zstd", 3),
    "grid_zstd": ("ragged", "zstd", 1),
}

# Integer stores of compressed codecs, written by the format 1.1 writer (before
# on-disk integer narrowing, format 1.2) into tests/data/zrecord-1.1/ with
# ``python tests/python/store_fixtures.py --v11 tests/data/zrecord-1.1``; their
# values would be narrowed by the current writer.
FIXTURES_1_1: dict[str, tuple[str, Codec, int]] = {
    "tokens_zstd": ("ragged", "zstd", 3),
    "blocks_zstd": ("dense", "zstd", 2),
    "blocks_dict": ("dense", "zstd_dict", 1),
}


# tests/data/zrecord-1.2/ holds FIXTURES_1_1 as the format 1.2 writer narrowed them
# (the 8-byte "ends" index), written with
# ``python tests/python/store_fixtures.py --v12 tests/data/zrecord-1.2`` by that writer;
# the current one writes the same content as format 1.3 ("groups" index).


def write_all(root: str, fixtures: dict[str, tuple[str, Codec, int]] = FIXTURES,
              narrow: bool = False) -> None:
    """Writes ``fixtures`` under ``root``: format 1.1 stores, or with ``narrow`` the
    narrowed stores the current writer makes by default (format 1.3 for these)."""
    from loaderx.utils import train_dict
    from loaderx.zrecord import Dense, Ragged

    for name, (kind, codec, shards) in fixtures.items():
        path = os.path.join(root, name)
        if kind == "dense":
            recs = dense_records(name)
            d = train_dict(recs, size=1024, narrow=narrow) if codec == "zstd_dict" else None
            with Dense.create(path, recs.dtype, recs.shape[1:], codec=codec,
                              data_shards=shards, dict_bytes=d, narrow=narrow) as ds:
                # Two appends: a run boundary that is not a chunk boundary.
                ds.append(recs[: len(recs) // 3])
                ds.append(recs[len(recs) // 3:])
        else:
            rr = ragged_records(name)
            with Ragged.create(path, rr[0].dtype, rr[0].ndim, codec=codec, data_shards=shards,
                               narrow=narrow) as rs:
                rs.append(rr[:7])
                rs.append(rr[7:])


if __name__ == "__main__":
    if sys.argv[1] == "--v11":
        write_all(sys.argv[2], FIXTURES_1_1)
    elif sys.argv[1] == "--v12":
        write_all(sys.argv[2], FIXTURES_1_1, narrow=True)
    else:
        write_all(sys.argv[1])
