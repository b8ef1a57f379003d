"""ragged="packed" through a real loaderxd: the embedded RaggedBatch, byte for byte, without a copy.

The daemon serves the same batch memory to both forms (a stream's ragged
records are contiguous in every batch); only the client builds the form, so
the embedded packed batch is the reference and shard-group slices, shared
views, held batches moved out of the ring and mixtures are checked against it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from loaderx.client import DaemonOptions
from loaderx.dataloader import DataLoader, RaggedBatch
from loaderx.errors import InvalidArgumentError
from loaderx.mix import mix
from loaderx.zrecord import Dense, Ragged

N = 90


def rows(i: int) -> np.ndarray:
    """float32 (i % 5, 4), empty for i % 5 == 0."""
    return (np.arange((i % 5) * 4, dtype=np.float32) + i).reshape(i % 5, 4)


def write(root: Path, offset: int = 0) -> dict[str, Any]:
    root.mkdir(parents=True, exist_ok=True)
    with Ragged.create(str(root / "tokens"), np.uint16, ndim=1, codec="zstd") as w:
        w.append([np.arange(i % 9, dtype=np.uint16) + offset + i for i in range(N)])
    with Ragged.create(str(root / "rows"), np.float32, ndim=2, codec="raw") as w:
        w.append([rows(i + offset) for i in range(N)])
    with Dense.create(str(root / "label"), np.int64, (), codec="raw") as w:
        w.append(np.arange(N, dtype=np.int64) + offset)
    return {"tokens": Ragged.open(str(root / "tokens")), "rows": Ragged.open(str(root / "rows")),
            "label": Dense.open(str(root / "label"))}


@pytest.fixture
def streams(tmp_path: Path) -> Any:
    s = write(tmp_path / "s")
    yield s
    for store in s.values():
        store.close()


def snapshot(batch: dict[str, Any]) -> dict[str, Any]:
    """Every byte and table of a packed batch, copied out of the batch memory."""
    out: dict[str, Any] = {}
    for name, v in batch.items():
        if isinstance(v, RaggedBatch):
            out[name] = (v.values.dtype.str, v.values.tobytes(), v.cu_seqlens.tolist(),
                         v.offsets.tolist(), v.shapes.tolist(), v.max_seqlen,
                         [(r.shape, r.tobytes()) for r in v])
        else:
            out[name] = (v.dtype.str, v.shape, v.tobytes())
    return out


def take(loader: DataLoader, n: int) -> list[dict[str, Any]]:
    return [snapshot(next(loader)) for _ in range(n)]


def test_packed_through_loaderxd_is_the_embedded_packed_batch(daemon, streams) -> None:
    kw: dict[str, Any] = {"batch_size": 11, "mode": "IID", "seed": 4, "ragged": "packed"}
    with DataLoader(streams, **kw) as embedded:
        want = take(embedded, 8)
    with DataLoader(streams, **kw, daemon=daemon.socket) as served:
        first = next(served)
        rb = first["rows"]
        assert isinstance(rb, RaggedBatch) and rb.values.flags.writeable  # copy-on-write view
        assert rb.values.base is first["label"].base  # one owner: the ring slot's lease
        records = rb.tolist()
        for k, r in enumerate(records):
            assert r.ctypes.data == rb.values.ctypes.data + int(rb.offsets[k]) * 4
            if r.size:
                assert np.shares_memory(r, rb.values)
        got = [snapshot(first), *take(served, 7)]
    assert got == want
    assert daemon.stats()["batches_served"] >= 8


def test_the_list_and_packed_forms_of_one_daemon_batch_agree(daemon, streams) -> None:
    kw: dict[str, Any] = {"batch_size": 9, "seed": 2, "daemon": daemon.socket}
    with DataLoader(streams, **kw) as listed, DataLoader(streams, **kw, ragged="packed") as packed:
        for _ in range(5):
            a, b = next(listed), next(packed)
            for name in ("tokens", "rows"):
                listed_records, rb = a[name], b[name]
                assert [(r.shape, r.tobytes()) for r in listed_records] == \
                    [(r.shape, r.tobytes()) for r in rb]
                assert rb.values.tobytes() == b"".join(r.tobytes() for r in listed_records)
                lengths = [len(r) for r in listed_records]
                assert rb.cu_seqlens.tolist() == np.cumsum([0, *lengths]).tolist()


def test_shared_view_packed_values_are_read_only(daemon, streams) -> None:
    opts = DaemonOptions(daemon.socket, shared_view=True)
    with DataLoader(streams, batch_size=6, seed=1, ragged="packed", daemon=opts) as loader, \
            DataLoader(streams, batch_size=6, seed=1, ragged="packed") as embedded:
        batch, want = next(loader), snapshot(next(embedded))
        rb = batch["tokens"]
        assert not rb.values.flags.writeable
        assert not any(r.flags.writeable for r in rb)
        with pytest.raises(ValueError, match="read-only"):
            rb.values[0] = 1
        assert snapshot(batch) == want


def test_shard_group_slices_pack_like_the_embedded_rank(daemon_factory, streams) -> None:
    # Rank 1's records sit in the middle of the group's batch (its offsets do
    # not start at 0); the members may differ in form, which is the client's.
    daemon = daemon_factory("--max-skew", "4")
    opts = DaemonOptions(daemon.socket, group="ddp", group_mode="shard")
    kw: dict[str, Any] = {"batch_size": 5, "seed": 6, "world_size": 2}
    with DataLoader(streams, rank=0, daemon=opts, **kw) as r0, \
            DataLoader(streams, rank=1, daemon=opts, ragged="packed", **kw) as r1, \
            DataLoader(streams, rank=0, **kw) as local0, \
            DataLoader(streams, rank=1, ragged="packed", **kw) as local1:
        for _ in range(6):
            a, want_a = next(r0), next(local0)
            assert [r.tobytes() for r in a["rows"]] == [r.tobytes() for r in want_a["rows"]]
            b, want_b = next(r1), next(local1)
            assert b["rows"].offsets[0] == 0 and b["rows"].cu_seqlens[0] == 0
            assert snapshot(b) == snapshot(want_b)


def test_held_packed_batches_moved_out_of_the_ring_keep_their_bytes(daemon, streams) -> None:
    kw: dict[str, Any] = {"batch_size": 8, "mode": "IID", "seed": 3, "ragged": "packed"}
    with DataLoader(streams, **kw) as embedded:
        want = take(embedded, 6)
    with DataLoader(streams, **kw, daemon=DaemonOptions(daemon.socket, leases=2)) as served:
        held = [next(served) for _ in range(6)]  # more than the lease cap
        addresses = [b["tokens"].values.ctypes.data for b in held]
        assert served._source.batches_moved_out >= 4
        assert [b["tokens"].values.ctypes.data for b in held] == addresses  # moved in place
        assert [snapshot(b) for b in held] == want


def test_a_mixture_through_loaderxd_packs_like_the_embedded_one(daemon, tmp_path: Path) -> None:
    a, b = write(tmp_path / "a"), write(tmp_path / "b", offset=500)
    try:
        m = mix({"a": (a, 0.7), "b": (b, 0.3)}, min_positions=500)
        kw: dict[str, Any] = {"batch_size": 12, "mode": "IID", "seed": 9, "ragged": "packed"}
        with DataLoader(m, **kw) as embedded:
            want = take(embedded, 6)
        with DataLoader(m, **kw, daemon=daemon.socket) as served:
            got = take(served, 6)
        assert got == want
        assert any(500 <= lab for s in got for lab in np.frombuffer(s["label"][2], np.int64))
        m.close()
    finally:
        for s in (*a.values(), *b.values()):
            s.close()


def test_a_bad_ragged_value_is_refused_before_connecting(streams, tmp_path: Path) -> None:
    nowhere = str(tmp_path / "no-daemon.sock")
    with pytest.raises(InvalidArgumentError, match="ragged must be 'list' or 'packed', got 'flat'"):
        DataLoader(streams, batch_size=4, ragged="flat", daemon=nowhere)
