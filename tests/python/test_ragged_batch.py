"""DataLoader(..., ragged="packed"): one RaggedBatch per ragged stream instead of a list.

The expected values are gathered by hand (the sampler's indices read from
the stores, one record at a time), never taken from the packed form itself.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import loaderx
import numpy as np
import pytest
from loaderx.dataloader import DataLoader, RaggedBatch
from loaderx.errors import ArgumentTypeError, InvalidArgumentError, RecordIndexError
from loaderx.mix import mix
from loaderx.zrecord import Dense, Ragged
from loaderx.zsampler import Sampler

N = 61


def tok(i: int) -> np.ndarray:
    """int32 1-D tokens, i % 7 of them (0: empty)."""
    return np.arange(i % 7, dtype=np.int32) + 100 * i


def small(i: int) -> np.ndarray:
    """uint8 1-D, (3 * i) % 5 long."""
    return np.full((3 * i) % 5, i % 251, dtype=np.uint8)


def rows(i: int) -> np.ndarray:
    """float64 (i % 4, 3): rows of a fixed width, varying count (0: empty)."""
    return (np.arange((i % 4) * 3, dtype=np.float64) * 0.25 + i).reshape(i % 4, 3)


def cube(i: int) -> np.ndarray:
    """float16 (i % 3, i % 2 + 1, 2): every dimension varies."""
    n = (i % 3) * (i % 2 + 1) * 2
    return (np.arange(n, dtype=np.float16) + i % 50).reshape(i % 3, i % 2 + 1, 2)


def wide(i: int) -> np.ndarray:
    """int64 1-D, i % 3 long."""
    return np.arange(i % 3, dtype=np.int64) - 7 * i


RAGGED = {"tok": (tok, np.int32, 1), "small": (small, np.uint8, 1), "rows": (rows, np.float64, 2),
          "cube": (cube, np.float16, 3), "wide": (wide, np.int64, 1)}


def write_stores(root: Path, n: int = N, offset: int = 0) -> dict[str, Path]:
    paths = {name: root / name for name in (*RAGGED, "label")}
    for name, (make, dtype, ndim) in RAGGED.items():
        with Ragged.create(str(paths[name]), dtype, ndim=ndim, codec="zstd") as rs:
            rs.append([make(i + offset) for i in range(n)])
    with Dense.create(str(paths["label"]), np.int64, (), codec="raw") as ds:
        ds.append(np.arange(offset, offset + n, dtype=np.int64))
    return paths


def open_all(paths: dict[str, Path]) -> dict[str, Any]:
    return {name: (Dense if name == "label" else Ragged).open(str(p)) for name, p in paths.items()}


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_stores(tmp_path_factory.mktemp("ragged"))


@pytest.fixture
def stores(paths: dict[str, Path]) -> Any:
    s = open_all(paths)
    yield s
    for store in s.values():
        store.close()


def by_hand(step: int, batch_size: int, seed: int = 42, mode: Any = Sampler.Mode.Cyclic,
            n: int = N, offset: int = 0) -> tuple[np.ndarray, dict[str, list[np.ndarray]]]:
    """The step's labels and ragged records, from the sampler and the record makers."""
    idx = np.array(Sampler(n, batch_size, mode, seed).peek(step), copy=True)
    return (np.arange(offset, offset + n, dtype=np.int64)[idx],
            {name: [make(int(i) + offset) for i in idx] for name, (make, _, _) in RAGGED.items()})


def assert_packed(rb: Any, want: list[np.ndarray], dtype: Any, ndim: int) -> None:
    """rb holds exactly the records `want`, in every one of its forms."""
    assert type(rb) is RaggedBatch
    b = len(want)
    assert len(rb) == b
    lengths = [r.shape[0] for r in want]
    sizes = [r.size for r in want]
    assert rb.values.dtype == np.dtype(dtype) and rb.values.ndim == 1
    assert rb.values.tobytes() == b"".join(r.tobytes() for r in want)
    assert rb.cu_seqlens.dtype == np.int32 and rb.cu_seqlens.shape == (b + 1,)
    assert rb.cu_seqlens.tolist() == [sum(lengths[:k]) for k in range(b + 1)]
    assert rb.offsets.dtype == np.int64
    assert rb.offsets.tolist() == [sum(sizes[:k]) for k in range(b + 1)]
    assert rb.shapes.dtype == np.int64 and rb.shapes.shape == (b, ndim)
    assert [tuple(s) for s in rb.shapes.tolist()] == [r.shape for r in want]
    assert rb.max_seqlen == max(lengths)
    for form in (rb.tolist(), list(rb), [rb[k] for k in range(b)], [rb[k - b] for k in range(b)]):
        assert len(form) == b
        for got, w in zip(form, want):
            assert type(got) is np.ndarray
            assert got.dtype == w.dtype and got.shape == w.shape
            assert got.tobytes() == w.tobytes()


def test_packed_batches_hold_exactly_the_records(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=9, seed=5, ragged="packed") as loader:
        for step in range(8):  # past one Cyclic epoch of 61 // 9 steps
            batch = next(loader)
            labels, want = by_hand(step, 9, seed=5)
            assert list(batch) == list(stores)
            assert isinstance(batch["label"], np.ndarray)  # dense streams do not change
            assert batch["label"].tolist() == labels.tolist()
            for name, (_, dtype, ndim) in RAGGED.items():
                assert_packed(batch[name], want[name], dtype, ndim)


def test_packed_equals_the_list_form(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=7, mode="IID", seed=3) as listed, \
            DataLoader(stores, batch_size=7, mode="IID", seed=3, ragged="packed") as packed:
        for _ in range(5):
            a, b = next(listed), next(packed)
            assert a["label"].tobytes() == b["label"].tobytes()
            for name, (_, dtype, ndim) in RAGGED.items():
                assert isinstance(a[name], list)
                assert_packed(b[name], a[name], dtype, ndim)


def test_list_is_the_default_and_can_be_named(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=4, seed=1) as default, \
            DataLoader(stores, batch_size=4, seed=1, ragged="list") as named:
        a, b = next(default), next(named)
    for name in RAGGED:
        assert isinstance(a[name], list) and isinstance(b[name], list)
        assert [r.tobytes() for r in a[name]] == [r.tobytes() for r in b[name]]


def test_a_batch_of_empty_records(tmp_path: Path) -> None:
    with Ragged.create(str(tmp_path / "e"), np.int32, ndim=2, codec="raw") as rs:
        rs.append([np.zeros((0, 5), np.int32)] * 6)
    with Ragged.open(str(tmp_path / "e")) as e, \
            DataLoader({"e": e}, batch_size=4, mode="Sequential", ragged="packed") as loader:
        rb = next(loader)["e"]
        assert rb.values.shape == (0,) and rb.values.dtype == np.int32
        assert rb.cu_seqlens.tolist() == [0] * 5 and rb.offsets.tolist() == [0] * 5
        assert rb.shapes.tolist() == [[0, 5]] * 4
        assert rb.max_seqlen == 0
        assert [r.shape for r in rb] == [(0, 5)] * 4


def test_values_view_the_batch_memory_without_a_copy(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=12, seed=2, ragged="packed") as loader:
        batch = next(loader)
    rb = batch["tok"]
    assert rb.values.flags.writeable  # as the list form's arrays, embedded
    base = batch["label"].base
    assert rb.values.base is base  # one owner for every array of the batch
    addr = rb.values.ctypes.data
    item = rb.values.itemsize
    records = rb.tolist()
    for k, r in enumerate(records):
        assert r.base is base and r.flags.writeable
        assert r.ctypes.data == addr + int(rb.offsets[k]) * item
        if r.size:
            assert np.shares_memory(r, rb.values)
    nonempty = [r for r in records if r.size]
    assert not any(np.shares_memory(a, b) for a, b in itertools.pairwise(nonempty))
    # Records are contiguous: each starts where the one before ends.
    assert rb.values.size == sum(r.size for r in records)
    # A write through values is seen by the record views, and the other way.
    k = next(k for k, r in enumerate(records) if r.size)
    rb.values[rb.offsets[k]] = -5
    assert rb[k][0] == -5 and records[k][0] == -5
    records[k][0] = 77
    assert rb.values[rb.offsets[k]] == 77
    del batch, records
    assert rb.values.size == int(rb.offsets[-1])  # the RaggedBatch keeps the memory alive


def test_the_tables_are_read_only_and_record_views_ignore_them(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=6, seed=2, ragged="packed") as loader:
        rb = next(loader)["rows"]
    want = [r.copy() for r in rb]
    for table in (rb.cu_seqlens, rb.offsets, rb.shapes):
        assert not table.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            table[0] = 3
    assert [r.tobytes() for r in rb] == [w.tobytes() for w in want]


def test_record_index_errors(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=5, seed=2, ragged="packed") as loader:
        rb = next(loader)["tok"]
    for bad in (5, -6, 2**40):
        with pytest.raises(RecordIndexError, match=f"record {bad} out of range for a batch of 5"):
            rb[bad]
    with pytest.raises(TypeError):
        rb[1.0]  # type: ignore[index]
    assert rb[np.int64(4)].tobytes() == rb[-1].tobytes()
    assert repr(rb) == f"RaggedBatch(5 records, dtype=int32, ndim=1, rows={int(rb.cu_seqlens[-1])})"


def test_more_rows_than_int32_counts_fail_that_step_only(tmp_path: Path) -> None:
    # Records of shape (2**30, 0) hold no bytes, so two of them make a batch of
    # 2**31 rows without any memory.
    huge = np.zeros((2**30, 0), np.uint8)
    small = [np.zeros((5, 0), np.uint8), np.zeros((3, 0), np.uint8)]
    with Ragged.create(str(tmp_path / "z"), np.uint8, ndim=2, codec="raw") as w:
        w.append([huge, huge, *small])
    with Ragged.open(str(tmp_path / "z")) as z, \
            DataLoader({"z": z}, batch_size=2, mode="Sequential", ragged="packed") as loader:
        too_many = r"the batch of step 0 has more than 2\*\*31-1 rows in .*z.*use ragged='list'"
        with pytest.raises(loaderx.errors.ResourceExhausted, match=too_many):
            next(loader)
        assert loader.step == 1
        rb = next(loader)["z"]
        assert rb.cu_seqlens.tolist() == [0, 5, 8] and rb.shapes.tolist() == [[5, 0], [3, 0]]
        assert rb.values.shape == (0,) and [r.shape for r in rb] == [(5, 0), (3, 0)]
    with Ragged.open(str(tmp_path / "z")) as z, \
            DataLoader({"z": z}, batch_size=2, mode="Sequential") as listed:
        # The list form has no such limit.
        assert [r.shape for r in next(listed)["z"]] == [(2**30, 0)] * 2


def test_dense_only_streams_are_unchanged(stores: dict[str, Any]) -> None:
    with DataLoader({"label": stores["label"]}, batch_size=4, mode="Sequential",
                    ragged="packed") as loader:
        assert next(loader)["label"].tolist() == [0, 1, 2, 3]


def test_a_transform_receives_the_packed_batch(stores: dict[str, Any]) -> None:
    def transform(batch: dict[str, Any]) -> tuple[bytes, list[int], bool]:
        rb = batch["tok"]
        return rb.values.tobytes(), rb.cu_seqlens.tolist(), isinstance(rb, RaggedBatch)

    with DataLoader(stores, batch_size=8, seed=4, transform=transform, transform_threads=3,
                    ragged="packed") as loader:
        for step in range(6):
            values, cu, is_packed = next(loader)
            want = by_hand(step, 8, seed=4)[1]["tok"]
            assert is_packed
            assert values == b"".join(r.tobytes() for r in want)
            assert cu == np.concatenate([[0], np.cumsum([len(r) for r in want])]).tolist()


def test_state_dict_and_resume_are_those_of_the_list_form(stores: dict[str, Any]) -> None:
    with DataLoader(stores, batch_size=6, seed=8, ragged="packed") as packed, \
            DataLoader(stores, batch_size=6, seed=8) as listed:
        for _ in range(4):
            next(packed), next(listed)
        state = packed.state_dict()
        assert state == listed.state_dict()
        assert "ragged" not in state
        following = [next(packed)["tok"].values.tobytes() for _ in range(3)]
    with DataLoader(stores, batch_size=6, seed=8, ragged="packed") as resumed:
        resumed.load_state_dict(state)
        assert resumed.step == 4
        assert [next(resumed)["tok"].values.tobytes() for _ in range(3)] == following
    with DataLoader(stores, batch_size=6, seed=8) as resumed_as_list:
        resumed_as_list.load_state_dict(state)
        got = [b"".join(r.tobytes() for r in next(resumed_as_list)["tok"]) for _ in range(3)]
        assert got == following


def test_a_mixture_packs_its_ragged_streams(tmp_path: Path) -> None:
    a = open_all(write_stores(tmp_path / "a", n=23))
    b = open_all(write_stores(tmp_path / "b", n=17, offset=1000))
    try:
        mixed = mix({"a": (a, 0.6), "b": (b, 0.4)}, min_positions=64)
        with DataLoader(mixed, batch_size=10, seed=3, mode="IID") as listed, \
                DataLoader(mixed, batch_size=10, seed=3, mode="IID", ragged="packed") as packed:
            for _ in range(4):
                x, y = next(listed), next(packed)
                assert x["dataset"].tolist() == y["dataset"].tolist()
                assert x["label"].tolist() == y["label"].tolist()
                for name, (make, dtype, ndim) in RAGGED.items():
                    # The list form is checked against the parts elsewhere; here by hand too.
                    want = [make(int(lab)) for lab in y["label"]]
                    assert [r.tobytes() for r in x[name]] == [r.tobytes() for r in want]
                    assert_packed(y[name], want, dtype, ndim)
        mixed.close()
    finally:
        for s in (*a.values(), *b.values()):
            s.close()


@pytest.mark.parametrize("bad", ["pack", "", "LIST", "packed "])
def test_a_bad_ragged_value_is_a_value_error_naming_it(stores: dict[str, Any], bad: str) -> None:
    message = f"ragged must be 'list' or 'packed', got '{bad}'"
    with pytest.raises(InvalidArgumentError, match=message):
        DataLoader(stores, batch_size=4, ragged=bad)


@pytest.mark.parametrize("bad", [None, 1, b"packed"])
def test_a_ragged_value_of_another_type_is_a_type_error(stores: dict[str, Any], bad: Any) -> None:
    message = f"ragged must be 'list' or 'packed', got {type(bad).__name__}"
    with pytest.raises(ArgumentTypeError, match=message):
        DataLoader(stores, batch_size=4, ragged=bad)


def test_ragged_batch_is_a_top_level_name() -> None:
    assert loaderx.RaggedBatch is RaggedBatch is loaderx._loaderx.RaggedBatch
    assert "RaggedBatch" in loaderx.__all__
    with pytest.raises(TypeError):
        RaggedBatch()  # made only by a loader


# -- loaderx.torch -----------------------------------------------------------------


def test_to_torch_gives_tensor_views_of_the_packed_batch(stores: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    from loaderx.torch import RaggedTensors, to_torch

    with DataLoader(stores, batch_size=8, seed=6, ragged="packed") as loader:
        batch = next(loader)
    tensors = to_torch(batch)
    assert isinstance(tensors["label"], torch.Tensor)
    for name, (_, _, ndim) in RAGGED.items():
        rb, t = batch[name], tensors[name]
        assert isinstance(t, RaggedTensors)
        assert t.values.data_ptr() == rb.values.ctypes.data  # no copy
        assert t.values.numpy().tobytes() == rb.values.tobytes()
        assert t.cu_seqlens.dtype == torch.int32
        assert t.cu_seqlens.tolist() == rb.cu_seqlens.tolist()
        assert t.offsets.dtype == torch.int64 and t.offsets.tolist() == rb.offsets.tolist()
        assert t.shapes.dtype == torch.int64 and t.shapes.tolist() == rb.shapes.tolist()
        assert t.max_seqlen == rb.max_seqlen and len(t) == len(rb)
        for k, (got, want) in enumerate(zip(t.tolist(), rb.tolist())):
            assert tuple(got.shape) == want.shape and got.ndim == ndim
            assert got.numpy().tobytes() == want.tobytes()
            assert t[k - len(t)].numpy().tobytes() == want.tobytes()
            if want.size:
                assert got.data_ptr() == want.ctypes.data
        with pytest.raises(IndexError):
            t[len(t)]
    # A write through the tensor lands in the batch.
    t = tensors["tok"]
    k = next(k for k in range(len(t)) if t[k].numel())
    t[k][0] = -3
    assert batch["tok"][k][0] == -3


def test_device_transform_and_stateful_loader_with_packed_batches(stores: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    from loaderx.torch import RaggedTensors, StatefulLoader, device_transform

    with DataLoader(stores, batch_size=8, seed=6, transform=device_transform("cpu"),
                    ragged="packed") as moved:
        got = next(moved)
    want = by_hand(0, 8, seed=6)[1]
    for name in RAGGED:
        t = got[name]
        assert isinstance(t, RaggedTensors) and t.values.device == torch.device("cpu")
        assert [r.numpy().tobytes() for r in t] == [w.tobytes() for w in want[name]]
    loader = StatefulLoader(DataLoader(stores, batch_size=8, seed=6, ragged="packed"))
    with loader:
        for step in range(3):
            t = next(loader)["rows"]
            assert isinstance(t, RaggedTensors)
            want = by_hand(step, 8, seed=6)[1]["rows"]
            assert [r.numpy().tobytes() for r in t] == [w.tobytes() for w in want]
        state = loader.state_dict()
    with StatefulLoader(DataLoader(stores, batch_size=8, seed=6, ragged="packed")) as again:
        again.load_state_dict(state)
        t = next(again)["tok"]
        want = by_hand(3, 8, seed=6)[1]["tok"]
        assert [r.numpy().tobytes() for r in t] == [w.tobytes() for w in want]
