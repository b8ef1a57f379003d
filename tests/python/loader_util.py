"""Shared fixtures of the DataLoader tests: small stores with known contents.

Test modules import ``paths_fixture`` and ``stores_fixture`` to get the
``paths`` (module scope: the store directories) and ``stores`` (opened for
one test, closed after it) fixtures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from loaderx.zrecord import Dense, Ragged
from loaderx.zsampler import Sampler

N = 103  # not a multiple of any batch size used, so Cyclic drops a remainder


def ragged_record(i: int) -> np.ndarray:
    """Record i of the 'tok' stream: int32 (i % 5, 2) with values from i (i % 5 == 0: empty)."""
    return (np.arange((i % 5) * 2, dtype=np.int32) + 1000 * i).reshape(i % 5, 2)


def make_stores(root: Path, n: int = N, codec: str = "zstd") -> dict[str, Path]:
    """Writes 'img' float32 (n, 2, 3), 'label' int64 (n,), 'tok' ragged int32 ndim 2."""
    img = (np.arange(n * 6, dtype=np.float32) * 0.5).reshape(n, 2, 3)
    label = np.arange(n, dtype=np.int64) * 3 - 7
    paths = {"img": root / "img", "label": root / "label", "tok": root / "tok"}
    with Dense.create(str(paths["img"]), img.dtype, img.shape[1:], codec=codec) as ds:
        ds.append(img)
    with Dense.create(str(paths["label"]), label.dtype, (), codec=codec) as ds:
        ds.append(label)
    with Ragged.create(str(paths["tok"]), np.int32, ndim=2, codec=codec) as rs:
        rs.append([ragged_record(i) for i in range(n)])
    return paths


def open_stores(paths: dict[str, Path]) -> dict[str, Any]:
    return {
        "img": Dense.open(str(paths["img"])),
        "label": Dense.open(str(paths["label"])),
        "tok": Ragged.open(str(paths["tok"])),
    }


def expected_batch(
    stores: dict[str, Any],
    step: int,
    batch_size: int,
    mode: Any = Sampler.Mode.Cyclic,  # the DataLoader default
    seed: int = 42,
    rank: int = 0,
    world_size: int = 1,
) -> dict[str, Any]:
    """The batch of `step` gathered by hand: the sampler's indices, read via the stores."""
    n = len(next(iter(stores.values())))
    sampler = Sampler(n, batch_size, mode, seed, rank=rank, world_size=world_size)
    idx = np.array(sampler.peek(step), copy=True)
    return {
        name: [store[int(i)] for i in idx] if isinstance(store, Ragged) else store[idx]
        for name, store in stores.items()
    }


def assert_batch_equal(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert list(got) == list(want)
    for name, w in want.items():
        g = got[name]
        if isinstance(w, list):
            assert isinstance(g, list) and len(g) == len(w), name
            for a, b in zip(g, w):
                assert a.dtype == b.dtype and a.shape == b.shape, name
                np.testing.assert_array_equal(a, b)
        else:
            assert isinstance(g, np.ndarray), name
            assert g.dtype == w.dtype and g.shape == w.shape, name
            assert g.tobytes() == w.tobytes(), name


def fingerprint(batch: dict[str, Any]) -> bytes:
    """Every byte and shape of a raw batch, for cross-process comparisons."""
    parts: list[bytes] = []
    for name, value in batch.items():
        parts.append(name.encode())
        values = value if isinstance(value, list) else [value]
        for v in values:
            parts.append(repr((v.dtype.str, v.shape)).encode())
            parts.append(v.tobytes())
    return b"|".join(parts)


@pytest.fixture(scope="module", name="paths")
def paths_fixture(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The stores of make_stores, written once per test module."""
    return make_stores(tmp_path_factory.mktemp("stores"))


@pytest.fixture(name="stores")
def stores_fixture(paths: dict[str, Path]) -> Any:
    """The stores opened for one test and closed after it."""
    s = open_stores(paths)
    yield s
    for store in s.values():
        store.close()
