"""loaderx.utils.train_dict: sources, sizes and errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from loaderx import errors
from loaderx.utils import DEFAULT_DICT_SIZE, train_dict
from loaderx.zrecord import Dense, Ragged


def _tokens(n: int = 3000, seed: int = 0) -> list[np.ndarray]:
    """Small, similar int32 records, the case zstd_dict is for."""
    rng = np.random.default_rng(seed)
    vocab = rng.integers(0, 50000, 64, dtype=np.int32)
    return [vocab[rng.integers(0, 64, int(k))] for k in rng.integers(8, 64, n)]


def _dict_id(d: bytes) -> int:
    assert d[:4] == b"\x37\xa4\x30\xec"  # ZDICT magic
    return int.from_bytes(d[4:8], "little")


def test_train_from_ndarray() -> None:
    arr = np.stack([np.resize(t, 48) for t in _tokens(2000)])
    d = train_dict(arr, size=8192)
    assert isinstance(d, bytes) and 256 < len(d) <= 8192 and _dict_id(d) != 0


def test_train_from_iterable_and_generator() -> None:
    d = train_dict(iter(_tokens()), size=4096)
    assert len(d) <= 4096 and _dict_id(d) != 0


def test_train_from_open_stores(tmp_path: Path) -> None:
    recs = _tokens()
    with Ragged.create(tmp_path / "r", np.int32, 1, codec="zstd") as rs:
        rs.append(recs)
    with Dense.create(tmp_path / "d", np.int32, (8,), codec="raw") as ds:
        ds.append(np.stack([t[:8] for t in recs]))
    with Ragged.open(tmp_path / "r") as rs:
        assert _dict_id(train_dict(rs, size=4096)) != 0
    with Dense.open(tmp_path / "d") as ds:
        assert _dict_id(train_dict(ds, size=4096)) != 0


def test_default_size_is_110_kib() -> None:
    assert DEFAULT_DICT_SIZE == 110 * 1024
    d = train_dict(iter(_tokens(20000)))
    assert len(d) <= DEFAULT_DICT_SIZE


def test_dictionary_beats_plain_zstd_on_small_records(tmp_path: Path) -> None:
    recs = _tokens(5000, seed=1)
    d = train_dict(recs, size=16384)
    sizes = {}
    for codec in ("zstd", "zstd_dict"):
        kw = {"dict_bytes": d} if codec == "zstd_dict" else {}
        with Ragged.create(tmp_path / codec, np.int32, 1, codec=codec, **kw) as rs:
            rs.append(recs)
        with Ragged.open(tmp_path / codec) as rs:
            assert all(np.array_equal(a, b) for a, b in zip(rs, recs))
            sizes[codec] = rs.stored_bytes
    assert sizes["zstd_dict"] < sizes["zstd"]


def test_a_handful_of_small_records_gives_a_raw_content_dictionary(tmp_path: Path) -> None:
    recs = [np.arange(5, dtype=np.int32)] * 3
    d = train_dict(recs, path=tmp_path / "d.bin")
    assert d == np.concatenate(recs).tobytes()  # the sample itself: zstd's raw-content form
    assert (tmp_path / "d.bin").read_bytes() == d
    with Ragged.create(tmp_path / "r", np.int32, 1, codec="zstd_dict", dict_bytes=d) as rs:
        rs.append(recs)
    with Ragged.open(tmp_path / "r") as rs:
        assert all(np.array_equal(a, b) for a, b in zip(rs, recs))


def test_path_writes_the_dictionary(tmp_path: Path) -> None:
    d = train_dict(_tokens(), path=str(tmp_path / "dict"), size=4096)
    assert _dict_id(d) != 0
    assert (tmp_path / "dict").read_bytes() == d


@pytest.mark.parametrize("source", [np.array([b"abc", b"de", b"fghij"] * 400, dtype="S5"),
                                    np.zeros(2000, dtype=[("a", "<i4"), ("b", "<f4")])])
def test_bytes_and_structured_arrays_are_sources(source: np.ndarray) -> None:
    d = train_dict(source, size=1024)
    assert len(d) > 0


def test_an_empty_source_raises() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="too little data"):
        train_dict(np.zeros((0, 4), np.int32))
    with pytest.raises(errors.InvalidArgumentError, match="too little data"):
        train_dict([np.zeros(0, np.uint8)] * 100)  # empty records are no samples


@pytest.mark.parametrize("size,exc", [(100, errors.InvalidArgumentError), (0, errors.InvalidArgumentError),
                                      (1.5, TypeError), (True, TypeError)])
def test_bad_size(size: object, exc: type) -> None:
    with pytest.raises(exc):
        train_dict(_tokens(), size=size)  # type: ignore[arg-type]


@pytest.mark.parametrize("source", [b"abc" * 1000, "text", 42, [[1, 2, 3]] * 20,
                                    np.zeros((20, 2), dtype=object)])
def test_bad_sources(source: object) -> None:
    with pytest.raises(errors.SchemaError):
        train_dict(source)  # type: ignore[arg-type]


def test_builder_is_not_a_source(tmp_path: Path) -> None:
    b = Dense.create(tmp_path / "s", np.int32, (2,), codec="raw")
    with pytest.raises(errors.InvalidArgumentError, match="builder"):
        train_dict(b)
    b.close()


def test_the_extension_exports_no_zstd_symbol() -> None:
    """The zstd built into the module (CMakeLists.txt, LOADERX_VENDORED_ZSTD) is
    hidden: another zstd in the process (a library's own) neither binds to it
    nor replaces it."""
    import ctypes

    from loaderx import _loaderx

    lib = ctypes.CDLL(_loaderx.__file__)
    for name in ("ZSTD_versionNumber", "ZSTD_compress", "ZSTD_decompressDCtx", "ZDICT_trainFromBuffer"):
        assert not hasattr(lib, name), name
    assert hasattr(lib, "PyInit__loaderx")  # the lookup itself works
