"""Stores of every format version read back exactly: the checked-in 1.0 stores
(tests/data/zrecord-1.0, written by the 1.0 writer) and the same content written
now (format 1.1); plus the sizes format 1.1 promises (docs/format.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from loaderx import _loaderx
from loaderx.zrecord import Codec, Dense, Ragged

sys.path.insert(0, os.path.dirname(__file__))
from store_fixtures import FIXTURES, dense_records, ragged_records, write_all

V10 = Path(__file__).resolve().parent.parent / "data" / "zrecord-1.0"


@pytest.fixture(scope="module")
def v11(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("v11")
    write_all(str(root))
    return root


def check_store(path: Path, name: str, version: tuple[int, int]) -> None:
    kind, codec, shards = FIXTURES[name]
    assert tuple(_loaderx.Store.open(str(path)).format_version) == version
    if kind == "dense":
        want = dense_records(name)
        with Dense.open(path) as ds:
            assert (ds.codec, ds.data_shards, len(ds)) == (codec, shards, len(want))
            assert ds.dtype == want.dtype and ds.item_shape == want.shape[1:]
            got = ds[0:len(ds)]
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
            order = np.random.default_rng(3).permutation(len(want))
            np.testing.assert_array_equal(ds[order], want[order])
            np.testing.assert_array_equal(ds[len(want) - 1], want[-1])
            assert ds.metadata == {}
            ds.verify()
    else:
        want_r = ragged_records(name)
        with Ragged.open(path) as rs:
            assert (rs.codec, rs.data_shards, len(rs)) == (codec, shards, len(want_r))
            rorder = [int(k) for k in np.random.default_rng(4).permutation(len(want_r))]
            for k, got_r in zip(rorder, rs[rorder], strict=True):
                assert got_r.dtype == want_r[k].dtype and got_r.shape == want_r[k].shape
                np.testing.assert_array_equal(got_r, want_r[k])
            assert rs.metadata == {}
            rs.verify()


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_format_1_0_store_reads_exactly(name: str) -> None:
    check_store(V10 / name, name, (1, 0))


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_format_1_1_store_of_the_same_content_reads_exactly(v11: Path, name: str) -> None:
    check_store(v11 / name, name, (1, 1))


def test_format_1_1_is_never_larger_than_1_0(v11: Path) -> None:
    for name in FIXTURES:
        new = sum(f.stat().st_size for f in (v11 / name).iterdir())
        old = sum(f.stat().st_size for f in (V10 / name).iterdir())
        assert new < old, name


def test_dense_raw_scalars_cost_n_itemsize_plus_one_percent_plus_a_constant(tmp_path: Path) -> None:
    n = 70_000
    labels = (np.arange(n) % 10).astype(np.uint8)
    with Dense.create(tmp_path / "l", np.uint8, (), codec="raw") as ds:
        ds.append(labels)
    with Dense.open(tmp_path / "l") as ds:
        data = sum(os.path.getsize(tmp_path / "l" / f"data-00{s}") for s in range(4))
        assert data == n
        assert ds.stored_bytes <= n * 1.01 + 4096
        np.testing.assert_array_equal(ds[0:n], labels)
    assert not (tmp_path / "l" / "shapes").exists()


@pytest.mark.parametrize("codec", ["zstd", "zstd_dict"])
def test_dense_compressed_costs_at_most_8_bytes_per_record_beyond_payload(
        tmp_path: Path, codec: Codec) -> None:
    from loaderx.utils import train_dict

    n = 20_000
    rng = np.random.default_rng(1)
    recs = rng.integers(0, 4, size=(n, 64), dtype=np.uint8)
    d = train_dict(recs, size=2048) if codec == "zstd_dict" else None
    with Dense.create(tmp_path / "d", np.uint8, (64,), codec=codec, dict_bytes=d) as ds:
        ds.append(recs)
    payload = sum(os.path.getsize(tmp_path / "d" / f"data-00{s}") for s in range(4))
    with Dense.open(tmp_path / "d") as ds:
        overhead = ds.stored_bytes - payload - (len(d) if d else 0)
        assert overhead <= 8 * n + 4096, overhead
        np.testing.assert_array_equal(ds[0:n], recs)


@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_ragged_rank1_costs_at_most_8_bytes_per_record_beyond_payload(
        tmp_path: Path, codec: Codec) -> None:
    rng = np.random.default_rng(2)
    recs = [rng.integers(0, 50, size=int(k), dtype=np.int32) for k in rng.integers(0, 40, 10_000)]
    with Ragged.create(tmp_path / "r", np.int32, 1, codec=codec) as rs:
        rs.append(recs)
    payload = sum(os.path.getsize(tmp_path / "r" / f"data-00{s}") for s in range(4))
    with Ragged.open(tmp_path / "r") as rs:
        assert rs.stored_bytes - payload <= 8 * len(recs) + 4096
        for a, b in zip(rs[0:len(recs)], recs, strict=True):
            assert a.shape == b.shape
            np.testing.assert_array_equal(a, b)


# -- user metadata -------------------------------------------------------------------

META = {"source": "fashion-mnist", "rev": 3, "mean": [0.286, 0.1], "nested": {"ok": True, "none": None},
        "text": "\u00e9t\u00e9"}


@pytest.mark.parametrize("kind", ["dense", "ragged"])
def test_metadata_round_trips_and_is_checksummed(tmp_path: Path, kind: str) -> None:
    p = tmp_path / "s"
    if kind == "dense":
        with Dense.create(p, np.int16, (2,), codec="zstd", metadata=META) as ds:
            assert ds.metadata == META
            ds.append(np.ones((3, 2), np.int16))
        opened: Dense | Ragged = Dense.open(p)
    else:
        with Ragged.create(p, np.int16, 1, codec="raw", metadata=META) as rs:
            rs.append([np.ones(2, np.int16)])
        opened = Ragged.open(p)
    with opened as s:
        assert s.metadata == META
        s.metadata["rev"] = 4  # a copy: the store's metadata is unchanged
        assert s.metadata["rev"] == 3
    meta = bytearray((p / "meta").read_bytes())
    at = meta.find(b"fashion-mnist")
    assert at > 0
    meta[at] ^= 0x20
    (p / "meta").write_bytes(bytes(meta))
    from loaderx.errors import CorruptStoreError
    with pytest.raises(CorruptStoreError, match="metadata checksum mismatch"):
        Dense.open(p) if kind == "dense" else Ragged.open(p)


def test_no_metadata_reads_as_empty_dict(tmp_path: Path) -> None:
    with Dense.create(tmp_path / "s", np.uint8, (), codec="raw") as ds:
        assert ds.metadata == {}
    with Dense.open(tmp_path / "s") as ds:
        assert ds.metadata == {}
    assert _loaderx.Store.open(str(tmp_path / "s")).metadata is None  # what `loaderx info` shows


def test_tuples_read_back_as_lists(tmp_path: Path) -> None:
    with Dense.create(tmp_path / "s", np.uint8, (), codec="raw",
                      metadata={"shape": (64, 64), "t": [(1, "a")]}):
        pass
    with Dense.open(tmp_path / "s") as ds:
        assert ds.metadata == {"shape": [64, 64], "t": [[1, "a"]]}


@pytest.mark.parametrize("bad, cls, needle", [
    ([1, 2], TypeError, "metadata must be a dict"),
    ("{}", TypeError, "metadata must be a dict"),
    ({"a": object()}, ValueError, "not JSON-serialisable"),
    ({"a": float("nan")}, ValueError, "not JSON-serialisable"),
    ({"a": b"bytes"}, ValueError, "not JSON-serialisable"),
    ({1: "x"}, ValueError, "key 1 at metadata is not a str"),
    ({"a": [{"b": {2.5: 1}}]}, ValueError, r"key 2.5 at metadata\['a'\]\[0\]\['b'\] is not a str"),
    ({"a": np.int64(3)}, ValueError, "not JSON-serialisable"),
    ({"a": "x" * (600 << 10)}, ValueError, "at most 524288"),
])
def test_bad_metadata_is_refused_and_nothing_is_created(tmp_path: Path, bad: object, cls: type,
                                                        needle: str) -> None:
    with pytest.raises(cls, match=needle):
        Dense.create(tmp_path / "s", np.uint8, (), codec="raw", metadata=bad)  # type: ignore[arg-type]
    with pytest.raises(cls, match=needle):
        Ragged.create(tmp_path / "r", np.uint8, 1, codec="raw", metadata=bad)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
