"""loaderx.zrecord: Dense and Ragged builders and readers, indexing, errors."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loaderx import _loaderx, errors
from loaderx.zrecord import Dense, Ragged

CODECS = ["raw", "zstd", "zstd_dict"]


@pytest.fixture(scope="module")
def dict_bytes() -> bytes:
    from loaderx.utils import train_dict

    rng = np.random.default_rng(1)
    return train_dict(rng.integers(0, 30, (3000, 48), dtype=np.int32), size=4096)


def _kw(codec: str, d: bytes) -> dict:
    return {"codec": codec, "dict_bytes": d if codec == "zstd_dict" else None}


def _dense(path: Path, data: np.ndarray, codec: str = "zstd", **kw) -> Dense:
    with Dense.create(path, data.dtype, data.shape[1:], codec=codec, **kw) as ds:
        ds.append(data)
    return Dense.open(path)


def _no_store_left(parent: Path) -> bool:
    return list(parent.iterdir()) == []


# -- round trips -----------------------------------------------------------------

DTYPES = ["?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16",
          "M8[ns]", "M8[D]", "m8[us]", "m8[s]"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("codec", CODECS)
def test_dense_round_trips_every_dtype(tmp_path: Path, dtype: str, codec: str, dict_bytes: bytes) -> None:
    rng = np.random.default_rng(0)
    data = rng.integers(0, 100, (50, 3, 2)).astype(dtype)
    with Dense.create(tmp_path / "s", dtype, (3, 2), **_kw(codec, dict_bytes)) as ds:
        ds.append(data)
        assert len(ds) == 50
    with Dense.open(tmp_path / "s") as ds:
        assert ds.dtype == np.dtype(dtype) and ds.item_shape == (3, 2) and ds.codec == codec
        assert len(ds) == 50 and ds.nbytes == data.nbytes and ds.data_shards == 4
        out = ds[:]
        assert out.dtype == data.dtype and out.shape == data.shape
        np.testing.assert_array_equal(out, data)
        ds.verify()


@pytest.mark.parametrize("shape", [(), (5,), (2, 3), (2, 1, 3), (1, 2, 1, 2)])
def test_dense_ranks_zero_to_four(tmp_path: Path, shape: tuple) -> None:
    data = np.arange(7 * int(np.prod(shape)), dtype=np.float64).reshape((7, *shape))
    ds = _dense(tmp_path / "s", data)
    assert ds[3].shape == shape
    np.testing.assert_array_equal(ds[3], data[3])
    np.testing.assert_array_equal(ds[[6, 0]], data[[6, 0]])


@pytest.mark.parametrize("shards", [1, 2, 255])
def test_data_shards_edges(tmp_path: Path, shards: int) -> None:
    data = np.arange(10 * 64, dtype=np.uint16).reshape(10, 64)
    ds = _dense(tmp_path / "s", data, data_shards=shards)
    assert ds.data_shards == shards
    assert len([p for p in os.listdir(tmp_path / "s") if p.startswith("data-")]) == shards
    np.testing.assert_array_equal(ds[:], data)


def test_empty_and_single_record_stores(tmp_path: Path) -> None:
    e = _dense(tmp_path / "e", np.zeros((0, 3), np.int8))
    assert len(e) == 0 and e[:].shape == (0, 3) and list(e) == []
    one = _dense(tmp_path / "one", np.array([[1, 2, 3]], np.int8))
    np.testing.assert_array_equal(one[0], [1, 2, 3])
    with pytest.raises(errors.RecordIndexError):
        e[0]


def test_dense_append_continues_the_sequence(tmp_path: Path) -> None:
    a = np.arange(12, dtype=np.int32).reshape(4, 3)
    with Dense.create(tmp_path / "s", np.int32, (3,), codec="raw") as ds:
        ds.append(a[:1])
        ds.append(a[1:])
        ds.append(a[:0])
        assert len(ds) == 4
    np.testing.assert_array_equal(Dense.open(tmp_path / "s")[:], a)


def test_dense_append_accepts_memmap_and_non_contiguous(tmp_path: Path) -> None:
    src = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.uint8, shape=(100, 8, 8))
    src[:] = np.arange(100, dtype=np.uint8)[:, None, None]
    src.flush()
    mm = np.load(tmp_path / "x.npy", mmap_mode="r")
    np.testing.assert_array_equal(_dense(tmp_path / "a", mm)[:], mm)
    strided = np.arange(200 * 8 * 8, dtype=np.uint8).reshape(200, 8, 8)[::2]
    np.testing.assert_array_equal(_dense(tmp_path / "b", strided)[:], strided)


def test_ragged_round_trip_exact_shapes(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    recs = [rng.standard_normal((int(a), int(b))).astype(np.float32)
            for a, b in rng.integers(0, 6, (100, 2))]
    recs[5] = np.zeros((0, 4), np.float32)  # a zero-length axis
    with Ragged.create(tmp_path / "r", np.float32, ndim=2, codec="zstd") as rs:
        rs.append(iter(recs))   # any iterable
        assert len(rs) == 100
    with Ragged.open(tmp_path / "r") as rs:
        assert rs.ndim == 2 and rs.dtype == np.float32 and len(rs) == 100
        assert rs[5].shape == (0, 4)
        got = rs[[9, 5, 9]]
        assert isinstance(got, list) and [g.shape for g in got] == [recs[9].shape, (0, 4), recs[9].shape]
        for g, r in zip(rs, recs):
            assert g.dtype == np.float32 and g.shape == r.shape
            np.testing.assert_array_equal(g, r)
        assert rs[:] == [] or len(rs[:]) == 100
        assert rs.nbytes == sum(r.nbytes for r in recs)
        rs.verify()


def test_ragged_views_outlive_the_store(tmp_path: Path) -> None:
    recs = [np.arange(n, dtype=np.int64) for n in (3, 4)]
    with Ragged.create(tmp_path / "r", np.int64, 1, codec="raw") as rs:
        rs.append(recs)
    rs = Ragged.open(tmp_path / "r")
    got = rs[[1, 0]]
    rs.close()
    del rs
    assert [g.tolist() for g in got] == [[0, 1, 2, 3], [0, 1, 2]]


# -- indexing ---------------------------------------------------------------------

@pytest.fixture()
def ds(tmp_path: Path) -> Dense:
    data = np.arange(10 * 2, dtype=np.int16).reshape(10, 2)
    return _dense(tmp_path / "s", data)


def test_scalar_reads_return_the_record_itself(ds: Dense) -> None:
    assert ds[3].shape == (2,) and ds[3].tolist() == [6, 7]
    assert ds[np.int64(3)].tolist() == [6, 7]
    assert ds[np.uint8(3)].tolist() == [6, 7]
    assert ds[np.array(3)].tolist() == [[6, 7]]  # a 0-d array selects a batch of one (2.5.4)


@pytest.mark.parametrize("idt", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                 np.uint32, np.uint64])
def test_gather_any_integer_array_keeps_order_and_duplicates(ds: Dense, idt: type) -> None:
    out = ds[np.array([9, 0, 9, 4], dtype=idt)]
    assert out.shape == (4, 2) and out[:, 0].tolist() == [18, 0, 18, 8]


def test_gather_tuple_and_list(ds: Dense) -> None:
    assert ds[0, 5, 2][:, 0].tolist() == [0, 10, 4]
    assert ds[[5]].shape == (1, 2)
    assert ds[[]].shape == (0, 2)
    assert ds[(3,)].shape == (1, 2)
    assert ds[range(4, 1, -1)][:, 0].tolist() == [8, 6, 4]


@pytest.mark.parametrize("key,expect", [(slice(2, 5), [2, 3, 4]), (slice(None, None, -1), list(range(9, -1, -1))),
                                        (slice(None), list(range(10))), (slice(-3, None), [7, 8, 9]),
                                        (slice(8, 100), [8, 9]), (slice(5, 2), []), (slice(1, 8, 3), [1, 4, 7])])
def test_slices_follow_python_rules(ds: Dense, key: slice, expect: list) -> None:
    out = ds[key]
    assert out.shape == (len(expect), 2)
    assert (out[:, 0] // 2).tolist() == expect


@pytest.mark.parametrize("key", [-1, 10, 2**70, [0, -1], [10], np.array([3, 10]), np.array([-2]),
                                 (1, 10)])
def test_out_of_range_indices_raise_index_error(ds: Dense, key: object) -> None:
    with pytest.raises(IndexError) as ei:
        ds[key]
    assert isinstance(ei.value, errors.RecordIndexError)
    assert "index" in str(ei.value)


@pytest.mark.parametrize("key", [1.0, True, np.float32(1), np.bool_(False), [1.0], [True, 1],
                                 np.array([1.0]), np.array([True, False]), "1", None, {1: 2}])
def test_float_bool_and_other_indices_raise_type_error(ds: Dense, key: object) -> None:
    with pytest.raises(TypeError):
        ds[key]


@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_uint64_index_vectors_take_the_same_checks_as_any_index(tmp_path: Path, codec: str) -> None:
    # A 1-D uint64 ndarray goes straight to the engine (the samplers' form): same
    # values, order, duplicates, strides, range check and state errors as any index.
    data = np.arange(10 * 3, dtype=np.int32).reshape(10, 3)
    d = _dense(tmp_path / "d", data, codec=codec)
    with Ragged.create(tmp_path / "r", np.int32, 1, codec=codec) as rb:
        rb.append([np.arange(k, dtype=np.int32) + 100 * k for k in range(10)])
    r = Ragged.open(tmp_path / "r")
    idx = np.array([7, 0, 7, 9, 2], dtype=np.uint64)
    for key in (idx, np.array([9, 1, 9, 4, 3, 0], dtype=np.uint64)[::2]):
        want = [int(k) for k in key]
        got = d[key]
        assert got.dtype == np.int32 and got.shape == (len(want), 3)
        assert got.tolist() == data[want].tolist()
        assert d.__getitems__(key).tolist() == data[want].tolist()
        rs = r[key]
        assert [x.tolist() for x in rs] == [(np.arange(k) + 100 * k).tolist() for k in want]
        assert all(x.dtype == np.int32 for x in rs)
        assert [x.tolist() for x in r.__getitems__(key)] == [x.tolist() for x in rs]
    assert d[np.empty(0, np.uint64)].shape == (0, 3) and r[np.empty(0, np.uint64)] == []
    for store in (d, r):
        with pytest.raises(errors.RecordIndexError, match="10"):
            store[np.array([3, 10], dtype=np.uint64)]
        with pytest.raises(errors.RecordIndexError):
            store.__getitems__(np.array([2**63], dtype=np.uint64))
        store.close()
        with pytest.raises(errors.StateError, match="closed"):
            store[idx]
        with pytest.raises(errors.StateError, match="closed"):
            store.__getitems__(idx)
    b = Dense.create(tmp_path / "b", np.int32, (3,), codec=codec)
    b.append(data)
    with pytest.raises(errors.StateError, match="builder cannot be read"):
        b[idx]
    with pytest.raises(errors.StateError, match="builder cannot be read"):
        b.__getitems__(idx)
    b.close()


def test_two_dimensional_index_arrays_are_flattened(ds: Dense) -> None:
    assert ds[np.array([[0, 1], [4, 3]])].tolist() == ds[[0, 1, 4, 3]].tolist()
    with pytest.raises(errors.InvalidArgumentError, match="regular array"):
        ds[[[0, 1], [2]]]


def test_iteration_yields_each_record(ds: Dense) -> None:
    recs = list(ds)
    assert len(recs) == 10 and all(r.shape == (2,) for r in recs)
    assert recs[9].tolist() == [18, 19]


def test_concurrent_gathers_from_threads(tmp_path: Path) -> None:
    data = np.random.default_rng(3).integers(0, 255, (500, 32), dtype=np.uint8)
    ds = _dense(tmp_path / "s", data)
    bad: list[int] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(50):
            idx = rng.integers(0, 500, 64)
            if not np.array_equal(ds[idx], data[idx]):
                bad.append(seed)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads) and bad == []


# Gathers of >= 4 MiB come from a reuse cache of freed buffers (not NumPy's
# allocator): a live batch must never be handed out again, a reused buffer
# must hold exactly the new records, and batches must outlive their store.

def _big_dense(tmp_path: Path, codec: str) -> tuple[Dense, np.ndarray]:
    data = np.random.default_rng(4).integers(0, 255, (64, 3, 96, 96), dtype=np.uint8)  # 27 KiB/record
    return _dense(tmp_path / "big", data, codec), data


@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_large_gathers_never_share_memory_with_live_batches(tmp_path: Path, codec: str) -> None:
    ds, data = _big_dense(tmp_path, codec)
    rng = np.random.default_rng(5)
    live: list[tuple[np.ndarray, np.ndarray]] = []
    for step in range(12):
        idx = rng.integers(0, 64, 256)  # 256 x 27 KiB = 6.8 MiB
        got = ds[idx]
        assert got.shape == (256, 3, 96, 96) and got.dtype == np.uint8
        assert got.flags.c_contiguous and got.flags.writeable
        assert all(not np.shares_memory(got, old) for old, _ in live)
        live.append((got, idx))
        if step % 3 == 2:  # free some batches so their buffers get reused
            del live[0], got
    for got, idx in live:
        np.testing.assert_array_equal(got, data[idx])


def test_reused_buffer_holds_only_the_new_batch(tmp_path: Path) -> None:
    ds, data = _big_dense(tmp_path, "raw")
    first = ds[np.zeros(256, dtype=np.int64)]
    first[:] = 7  # scribble on a batch, then give its buffer back
    del first
    for _ in range(3):
        idx = np.arange(256) % 64
        np.testing.assert_array_equal(ds[idx], data[idx])


def test_large_dense_batch_outlives_the_store(tmp_path: Path) -> None:
    ds, data = _big_dense(tmp_path, "zstd")
    idx = np.arange(255, -1, -1) % 64
    got = ds[idx]
    ds.close()
    del ds
    np.testing.assert_array_equal(got, data[idx])


def test_large_ragged_batch_outlives_the_store(tmp_path: Path) -> None:
    recs = [np.full((n, 1000), n, dtype=np.int64) for n in range(1, 130)]  # 8.3 MiB in all
    with Ragged.create(tmp_path / "r", np.int64, 2, codec="raw") as rs:
        rs.append(recs)
    rs = Ragged.open(tmp_path / "r")
    got = rs[list(range(128, -1, -1))]
    rs.close()
    del rs
    assert [g.shape for g in got] == [(n, 1000) for n in range(129, 0, -1)]
    assert all(np.array_equal(g, recs[n - 1]) for g, n in zip(got, range(129, 0, -1)))


# -- lifecycle ----------------------------------------------------------------------

def test_uint64_index_arrays_take_the_fast_path_until_close(tmp_path: Path) -> None:
    """A 1-D uint64 index array goes straight to the engine (Dense and Ragged
    __getitem__, __getitems__): exact values, the engine's IndexError, and once
    the store is closed (or for a builder) the same StateError as any key."""
    data = np.arange(40 * 6, dtype=np.uint16).reshape(40, 2, 3)
    recs = [np.arange(n, dtype=np.int32) for n in range(1, 41)]
    with Dense.create(tmp_path / "d", data.dtype, (2, 3), codec="raw") as b:
        b.append(data)
        with pytest.raises(errors.StateError, match="builder cannot be read"):
            b[np.array([0], np.uint64)]
    with Ragged.create(tmp_path / "r", np.int32, 1, codec="raw") as rb:
        rb.append(recs)
    ds, rs = Dense.open(tmp_path / "d"), Ragged.open(tmp_path / "r")
    idx = np.array([39, 0, 7, 7], np.uint64)
    np.testing.assert_array_equal(ds[idx], data[idx.astype(np.int64)])
    np.testing.assert_array_equal(ds.__getitems__(idx), data[idx.astype(np.int64)])
    assert [r.tolist() for r in rs[idx]] == [recs[i].tolist() for i in (39, 0, 7, 7)]
    assert [r.tolist() for r in rs.__getitems__(idx)] == [recs[i].tolist() for i in (39, 0, 7, 7)]
    with pytest.raises(IndexError, match="record index 40 out of range"):
        ds[np.array([1, 40], np.uint64)]
    with pytest.raises(IndexError, match="record index 40 out of range"):
        rs[np.array([1, 40], np.uint64)]
    ds.close()
    rs.close()
    for s in (ds, rs):
        with pytest.raises(errors.StateError, match="store is closed"):
            s[idx]
        with pytest.raises(errors.StateError, match="store is closed"):
            s.__getitems__(idx)


def test_exception_inside_with_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), Dense.create(tmp_path / "s", np.uint8, (4,), codec="zstd") as ds:
        ds.append(np.zeros((10, 4), np.uint8))
        raise RuntimeError("boom")
    assert _no_store_left(tmp_path)


def test_unclosed_builder_is_discarded_when_collected(tmp_path: Path) -> None:
    ds = Dense.create(tmp_path / "s", np.uint8, (4,), codec="raw")
    ds.append(np.zeros((3, 4), np.uint8))
    del ds
    import gc

    gc.collect()
    assert _no_store_left(tmp_path)


def test_parent_directories_are_created(tmp_path: Path) -> None:
    with Dense.create(tmp_path / "a" / "b" / "x", np.uint8, (), codec="raw") as ds:
        ds.append(np.arange(3, dtype=np.uint8))
    assert Dense.open(tmp_path / "a" / "b" / "x")[:].tolist() == [0, 1, 2]


def test_existing_path_raises_and_is_untouched(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "keep").write_text("x")
    with pytest.raises(errors.StoreExistsError):
        Dense.create(tmp_path / "s", np.uint8, (), codec="raw")
    with pytest.raises(FileExistsError):
        Ragged.create(tmp_path / "s", np.uint8, 1, codec="raw")
    assert os.listdir(tmp_path / "s") == ["keep"]
    assert sorted(os.listdir(tmp_path)) == ["s"]


def test_reading_a_builder_and_appending_to_a_reader(tmp_path: Path) -> None:
    ds = Dense.create(tmp_path / "s", np.uint8, (2,), codec="raw")
    ds.append(np.zeros((2, 2), np.uint8))
    with pytest.raises(errors.StateError, match="builder cannot be read"):
        ds[0]
    with pytest.raises(errors.StateError):
        list(ds)
    ds.close()
    with pytest.raises(errors.StateError, match="closed"):
        ds.append(np.zeros((2, 2), np.uint8))
    r = Dense.open(tmp_path / "s")
    with pytest.raises(errors.StateError, match="reader cannot be appended"):
        r.append(np.zeros((2, 2), np.uint8))
    r.close()
    with pytest.raises(errors.StateError, match="closed"):
        r[0]
    r.close()  # idempotent


def test_open_missing_path(tmp_path: Path) -> None:
    with pytest.raises(errors.StoreNotFoundError):
        Dense.open(tmp_path / "nope")


def test_open_wrong_kind_raises_schema_error(tmp_path: Path) -> None:
    _dense(tmp_path / "d", np.zeros((2, 2), np.uint8))
    with Ragged.create(tmp_path / "r", np.uint8, 1, codec="raw") as rs:
        rs.append([np.zeros(3, np.uint8)])
    with pytest.raises(errors.SchemaError, match="Dense.open"):
        Ragged.open(tmp_path / "d")
    with pytest.raises(errors.SchemaError, match="Ragged.open"):
        Dense.open(tmp_path / "r")


def test_constructor_is_private() -> None:
    with pytest.raises(TypeError, match="create"):
        Dense("x")  # type: ignore[arg-type]


# -- bad input: clear error, no store left --------------------------------------------

BAD_DTYPES = [
    (np.dtype([("a", "i4"), ("b", "f4")]), "structured"),
    (np.dtype(("i4", (2,))), "subarray"),
    (np.dtype(object), "object"),
    (np.dtype("i4", metadata={"k": 1}), "metadata"),
    (np.dtype("V0"), "zero-itemsize"),
    (np.dtype("S0"), "zero-itemsize"),
]


@pytest.mark.parametrize("dtype,what", BAD_DTYPES, ids=[w + str(i) for i, (_, w) in enumerate(BAD_DTYPES)])
def test_unsupported_dtypes(tmp_path: Path, dtype: np.dtype, what: str) -> None:
    with pytest.raises(errors.SchemaError, match=what):
        Dense.create(tmp_path / "s", dtype, (2,), codec="raw")
    with pytest.raises(errors.SchemaError, match=what):
        Ragged.create(tmp_path / "r", dtype, 1, codec="raw")
    assert _no_store_left(tmp_path)


@pytest.mark.parametrize("dtype", [">i4", ">f8", ">M8[ms]", "S7", "U3", ">U2", "V5", None])
@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_flexible_and_big_endian_dtypes_round_trip(tmp_path: Path, dtype: str | None, codec: str) -> None:
    dt = np.dtype(dtype)
    raw = np.random.default_rng(3).integers(0, 255, 6 * 2 * dt.itemsize, dtype=np.uint8)
    if dt.kind == "U":  # valid code points only
        data = np.array([["ab", "c"], ["", "xyz"[: dt.itemsize // 4]]] * 3, dtype=dt)
    else:
        data = raw.view(dt).reshape(6, 2)
    with Dense.create(tmp_path / "d", dtype, (2,), codec=codec) as ds:
        ds.append(data)
    with Ragged.create(tmp_path / "r", dtype, 1, codec=codec) as rs:
        rs.append(list(data))
    with Dense.open(tmp_path / "d") as ds, Ragged.open(tmp_path / "r") as rs:
        assert ds.dtype == dt and ds.dtype.str == dt.str
        got = ds[:]
        assert got.dtype.str == dt.str and got.tobytes() == data.tobytes()
        assert ds[3].dtype.str == dt.str and ds[3].tobytes() == data[3].tobytes()
        assert all(r.dtype.str == dt.str and r.tobytes() == d.tobytes() for r, d in zip(rs[:], data))


@pytest.mark.skipif(
    np.lib.NumpyVersion(np.__version__) < "2.0.0",
    reason="the 64-dimension limit is NumPy 2's: NumPy 1.x arrays have at most 32",
)
def test_dims_up_to_numpy_limit(tmp_path: Path) -> None:
    with Dense.create(tmp_path / "d", np.uint8, (1,) * 63, codec="raw") as ds:
        ds.append(np.ones((2,) + (1,) * 63, np.uint8))
    with Dense.open(tmp_path / "d") as ds:
        assert ds[:].shape == (2,) + (1,) * 63
    with pytest.raises(ValueError, match="63"):
        Dense.create(tmp_path / "e", np.uint8, (1,) * 64, codec="raw")
    with Ragged.create(tmp_path / "r", np.uint8, 64, codec="raw") as rs:
        rs.append([np.ones((1,) * 64, np.uint8)])
    with Ragged.open(tmp_path / "r") as rs:
        assert rs[0].shape == (1,) * 64
    with pytest.raises(ValueError, match="1..64"):
        Ragged.create(tmp_path / "q", np.uint8, 65, codec="raw")


def test_raw_content_dictionary_bytes(tmp_path: Path) -> None:
    data = np.tile(np.frombuffer(b"hello world, ", np.uint8), (50, 4))
    with Dense.create(tmp_path / "d", np.uint8, data.shape[1:], codec="zstd_dict",
                      dict_bytes=b"hello world, ") as ds:
        assert ds.has_dict()
        ds.append(data)
    with Dense.open(tmp_path / "d") as ds:
        assert ds.has_dict() and ds.codec == "zstd_dict"
        assert np.array_equal(ds[:], data)


def test_create_at_an_existing_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with Dense.create(tmp_path / "d", np.int8, (), codec="raw") as ds:
        ds.append(np.array(5, np.int8))  # a 0-d array is one scalar record
        ds.append(np.arange(2, dtype=np.int8))
    with Dense.open(tmp_path / "d") as ds:
        assert ds[:].tolist() == [5, 0, 1]
        assert type(ds[0]) is np.int8 and ds[0] == 5  # a scalar, as arr[i]
        assert ds.path == tmp_path / "d"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_bytes(b"")
    with pytest.raises(errors.StoreExistsError) as e:
        Dense.create(tmp_path / "full", np.int8, (), codec="raw")
    assert isinstance(e.value, errors.ZrecordError) and isinstance(e.value, RuntimeError)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty directory"):
        Dense.open(tmp_path / "empty")


def test_index_forms(tmp_path: Path) -> None:
    data = np.arange(12, dtype=np.int32).reshape(6, 2)
    with Dense.create(tmp_path / "d", np.int32, (2,), codec="raw") as ds:
        ds.append(data)
    with Dense.open(tmp_path / "d") as ds:
        mask = np.array([True, False, True, False, False, True])
        assert ds[mask].tolist() == data[mask].tolist()
        assert ds[mask.tolist()].tolist() == data[mask].tolist()
        assert ds[np.array([[0, 1], [5, 4]])].tolist() == data[[0, 1, 5, 4]].tolist()
        assert ds[[[0, 1], [5, 4]]].tolist() == data[[0, 1, 5, 4]].tolist()
        assert ds[np.array(3)].shape == (1, 2)  # a 0-d array selects a batch of one
        for empty in ([], (), np.array([], np.float32), np.zeros((0, 3), np.int8)):
            assert ds[empty].shape == (0, 2)
        assert ds.__getitems__([2, 0]).tolist() == data[[2, 0]].tolist()
        assert ds.__getitems__(1).shape == (1, 2)
        for bad in (True, np.bool_(False), mask[:3], np.ones((6, 1), bool), [True, False]):
            with pytest.raises(IndexError):
                ds[bad]
        for bad in (1.0, np.float32(2), "a", None, np.array([1.0]), [0, 1.5]):
            with pytest.raises(TypeError):
                ds[bad]


@pytest.mark.parametrize("data,exc,match", [
    ([[1, 2], [3, 4]], errors.SchemaError, "numpy.ndarray"),
    (b"\x00\x01\x02\x03", errors.SchemaError, "numpy.ndarray"),
    (np.zeros((3, 3), np.int32), errors.SchemaError, "shape"),
    (np.zeros((3,), np.int32), errors.SchemaError, "shape"),
    (np.zeros((3, 2), np.int64), errors.SchemaError, "dtype"),
    (np.zeros((3, 2), ">i4"), errors.SchemaError, "dtype"),
])
def test_dense_append_rejects_bad_data(tmp_path: Path, data: object, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match), Dense.create(tmp_path / "s", np.int32, (2,), codec="zstd") as ds:
        ds.append(data)  # type: ignore[arg-type]
    assert _no_store_left(tmp_path)


def test_dense_append_error_keeps_builder_usable(tmp_path: Path) -> None:
    with Dense.create(tmp_path / "s", np.int32, (2,), codec="zstd") as ds:
        with pytest.raises(errors.SchemaError):
            ds.append(np.zeros((3, 2), np.float32))
        ds.append(np.ones((3, 2), np.int32))
    assert Dense.open(tmp_path / "s")[:].sum() == 6


@pytest.mark.parametrize("records,match", [
    ([[1, 2, 3]], "numpy.ndarray"),
    (b"abc", "iterable of numpy.ndarray"),
    ([np.zeros(3, np.int64)], "dtype"),
    ([np.zeros((2, 2), np.int32)], "ndim"),
    ([np.zeros(2, np.int32), np.zeros(2, np.float32)], "record 1"),
    (5, "iterable"),
])
def test_ragged_append_rejects_bad_records(tmp_path: Path, records: object, match: str) -> None:
    with pytest.raises(errors.SchemaError, match=match), Ragged.create(tmp_path / "r", np.int32, 1, codec="zstd") as rs:
        rs.append(records)  # type: ignore[arg-type]
    assert _no_store_left(tmp_path)


def test_ragged_failure_after_a_written_batch_poisons_the_builder(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import loaderx.zrecord as z

    monkeypatch.setattr(z, "_RAGGED_BATCH_RECORDS", 2)
    rs = Ragged.create(tmp_path / "r", np.int32, 1, codec="raw")
    with pytest.raises(errors.SchemaError, match="record 3"):
        rs.append([np.zeros(1, np.int32)] * 3 + ["bad"])  # type: ignore[list-item]
    with pytest.raises(errors.StateError):
        rs.append([np.zeros(1, np.int32)])
    with pytest.raises(errors.StateError, match="discarded"):
        rs.close()
    assert _no_store_left(tmp_path)


def test_ragged_append_takes_records_in_batches_bounded_by_bytes_and_by_count(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import loaderx.zrecord as z

    # 40-byte records: a batch closes once it holds 100 bytes (3 records) or 5 records.
    monkeypatch.setattr(z, "_RAGGED_BATCH_BYTES", 100)
    monkeypatch.setattr(z, "_RAGGED_BATCH_RECORDS", 5)
    seen: list[int] = []  # records in the store when record k is taken from the iterable
    with Ragged.create(tmp_path / "r", np.int32, 1, codec="zstd") as rs:

        def records() -> Iterator[np.ndarray]:
            for k in range(8):
                seen.append(len(rs))
                yield np.arange(10 * k, 10 * k + 10, dtype=np.int32)

        rs.append(records())
    assert seen == [0, 0, 0, 3, 3, 3, 6, 6]
    with Ragged.open(tmp_path / "r") as r:
        assert [a.tolist() for a in r[np.arange(8, dtype=np.uint64)]] == [
            list(range(10 * k, 10 * k + 10)) for k in range(8)]
    monkeypatch.setattr(z, "_RAGGED_BATCH_BYTES", 1 << 20)
    seen.clear()
    with Ragged.create(tmp_path / "s", np.int32, 1, codec="raw") as rs:
        rs.append(records())
    assert seen == [0, 0, 0, 0, 0, 5, 5, 5]


def test_an_error_of_the_iterable_appends_nothing_of_its_batch(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import loaderx.zrecord as z

    monkeypatch.setattr(z, "_RAGGED_BATCH_RECORDS", 2)
    rs = Ragged.create(tmp_path / "r", np.int32, 1, codec="zstd")

    def records() -> Iterator[np.ndarray]:
        yield from (np.full(3, k, np.int32) for k in range(3))
        raise OSError("source went away")

    with pytest.raises(OSError, match="source went away"):
        rs.append(records())
    assert len(rs) == 2  # the first batch; record 2 was taken with the error, not written
    with pytest.raises(errors.StateError, match="discarded"):
        rs.close()
    assert _no_store_left(tmp_path)


def test_append_ragged_from_refuses_empty_bounds(tmp_path: Path) -> None:
    w = _loaderx.StoreWriter(str(tmp_path / "r"), "ragged", "<i4", [], 1, "raw", 1, None)
    for bounds in ((0, 1), (1, 0)):
        with pytest.raises(errors.InvalidArgumentError, match="max_records and max_bytes must be > 0"):
            w.append_ragged_from(iter([]), np.dtype(np.int32), 1, *bounds)
    w.abort()


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"codec": "zstdd"}, errors.InvalidArgumentError, "unknown codec"),
    ({"codec": None}, errors.InvalidArgumentError, "unknown codec"),
    ({"codec": "zstd_dict"}, errors.InvalidArgumentError, "needs dict_bytes"),
    ({"codec": "zstd_dict", "dict_bytes": b""}, errors.InvalidArgumentError, "empty"),
    ({"codec": "zstd_dict", "dict_bytes": b"\x37\xa4\x30\xec" + b"not a dictionary header" * 10},
     errors.InvalidArgumentError, "could not be loaded"),
    ({"codec": "zstd", "dict_bytes": b"x"}, errors.InvalidArgumentError, "only used with"),
    ({"codec": "zstd", "data_shards": 0}, errors.InvalidArgumentError, "1..255"),
    ({"codec": "zstd", "data_shards": 256}, errors.InvalidArgumentError, "1..255"),
    ({"codec": "zstd", "data_shards": 2.0}, TypeError, "int"),
])
def test_bad_create_arguments(tmp_path: Path, kwargs: dict, exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        Dense.create(tmp_path / "s", np.uint8, (2,), **kwargs)
    with pytest.raises(exc, match=match):
        Ragged.create(tmp_path / "r", np.uint8, 1, **kwargs)
    assert _no_store_left(tmp_path)


def test_codec_is_required(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="codec"):
        Dense.create(tmp_path / "s", np.uint8, (2,))  # type: ignore[call-arg]


@pytest.mark.parametrize("item_shape,exc", [((-1,), errors.InvalidArgumentError), ((2.0,), TypeError),
                                            ("ab", TypeError), ((1,) * 64, errors.InvalidArgumentError)])
def test_bad_item_shape(tmp_path: Path, item_shape: object, exc: type) -> None:
    with pytest.raises(exc):
        Dense.create(tmp_path / "s", np.uint8, item_shape, codec="raw")
    assert _no_store_left(tmp_path)


@pytest.mark.parametrize("ndim,exc", [(0, errors.InvalidArgumentError), (65, errors.InvalidArgumentError),
                                      (1.0, TypeError), (None, TypeError)])
def test_bad_ragged_ndim(tmp_path: Path, ndim: object, exc: type) -> None:
    with pytest.raises(exc):
        Ragged.create(tmp_path / "r", np.uint8, ndim, codec="raw")  # type: ignore[arg-type]
    assert _no_store_left(tmp_path)


# -- properties ---------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), max_size=30),
       codec=st.sampled_from(["raw", "zstd"]), shards=st.integers(1, 5))
def test_ragged_round_trip_property(tmp_path_factory: pytest.TempPathFactory, lengths: list[int],
                                    codec: str, shards: int) -> None:
    path = tmp_path_factory.mktemp("h") / "r"
    recs = [np.arange(n, dtype=np.int16) * (i + 1) for i, n in enumerate(lengths)]
    with Ragged.create(path, np.int16, 1, codec=codec, data_shards=shards) as rs:
        rs.append(recs)
    with Ragged.open(path) as rs:
        assert len(rs) == len(recs)
        got = rs[:]
        assert [g.tolist() for g in got] == [r.tolist() for r in recs]
        if recs:
            idx = list(range(len(recs)))[::-1] * 2
            assert [g.tolist() for g in rs[idx]] == [recs[i].tolist() for i in idx]


def _mem_available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@pytest.mark.slow
@pytest.mark.skipif(_mem_available() < (10 << 30), reason="needs ~5 GiB of free RAM for the read")
def test_record_larger_than_4_gib_round_trips_from_a_sparse_memmap(tmp_path: Path) -> None:
    n = (4 << 30) + 16
    mm = np.memmap(tmp_path / "big.bin", mode="w+", dtype=np.uint8, shape=(1, n))  # sparse file
    mm[0, :4] = [1, 2, 3, 4]
    mm[0, -4:] = [5, 6, 7, 8]
    mm.flush()
    with Dense.create(tmp_path / "s", np.uint8, (n,), codec="zstd", data_shards=2) as ds:
        ds.append(mm)
    del mm
    os.remove(tmp_path / "big.bin")
    with Dense.open(tmp_path / "s") as ds:
        assert ds.nbytes == n and ds.stored_bytes < (1 << 20)
        rec = ds[0]
        assert rec.shape == (n,) and rec.dtype == np.uint8
        assert rec[:4].tolist() == [1, 2, 3, 4] and rec[-4:].tolist() == [5, 6, 7, 8]
        assert int(np.count_nonzero(rec)) == 8
        del rec
        ds.verify()


def test_verify_reports_progress_and_propagates_callback_errors(tmp_path: Path) -> None:
    ds = _dense(tmp_path / "s", np.zeros((3000, 4), np.uint8), codec="raw")
    calls: list[tuple[int, int]] = []
    ds.verify(lambda done, total: calls.append((done, total)))
    assert calls[0] == (0, 3000) and calls[-1] == (3000, 3000)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)

    def stop(done: int, total: int) -> None:
        if done:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ds.verify(stop)
    ds.verify()  # still usable
