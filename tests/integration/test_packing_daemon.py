"""Sequence packing through a real loaderxd: packed batches byte-identical to the
embedded loader's (packing runs client-side after delivery), also after a seek
and a resume on another world size, and in a shard group."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from loaderx.dataloader import DataLoader
from loaderx.packing import Packing
from loaderx.sources import DaemonOptions

KEYS = ("tokens", "label", "image", "segment_ids", "positions", "cu_seqlens")


def take(loader: DataLoader, k: int) -> list[dict[str, Any]]:
    out = []
    for _ in range(k):
        b = next(loader)
        out.append({key: (v if isinstance(v, dict) else np.array(v)) for key, v in b.items()})
        del b
    return out


def assert_same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert list(x) == list(y)
        for key in KEYS:
            assert x[key].dtype == y[key].dtype and x[key].shape == y[key].shape, key
            assert x[key].tobytes() == y[key].tobytes(), key
        assert x["pack_counts"] == y["pack_counts"]


@pytest.mark.parametrize("policy", ["concat", "best_fit"])
def test_packed_batches_through_loaderxd_equal_embedded(daemon, stores, policy: str) -> None:
    pack = Packing(seq_len=6, rows=3, docs=4, policy=policy, pad_id=-1, cu_seqlens=True)
    kw: dict[str, Any] = {"batch_size": 16, "mode": "Cyclic", "seed": 11, "pack": pack}
    with DataLoader(stores["streams"], **kw) as embedded:
        want = take(embedded, 12)
        embedded.seek(5)
        want_seek = take(embedded, 3)
    with DataLoader(
        stores["streams"], **kw, daemon=DaemonOptions(path=str(daemon.socket))
    ) as served:
        got = take(served, 12)
        served.seek(5)
        got_seek = take(served, 3)
        state = served.state_dict()
    assert_same(got, want)
    assert_same(got_seek, want_seek)
    assert want[0]["tokens"].shape == (12, 6) and want[0]["label"].shape == (16,)
    # Resume the daemon loader's state on two embedded ranks: the same global packed steps.
    with DataLoader(stores["streams"], **kw) as whole:
        whole.load_state_dict(state)
        want_next = take(whole, 3)
    halves = []
    for rank in (0, 1):
        with DataLoader(
            stores["streams"],
            **{**kw, "batch_size": 8},
            rank=rank,
            world_size=2,
            daemon=daemon.socket,
        ) as r:
            r.load_state_dict(state)
            halves.append(take(r, 3))
    for k in range(3):
        for key in ("tokens", "segment_ids", "positions", "label"):
            np.testing.assert_array_equal(
                np.concatenate([halves[0][k][key], halves[1][k][key]]), want_next[k][key]
            )


def test_a_shard_group_packs_the_global_batch_of_world_size_one(daemon, stores) -> None:
    pack = Packing(seq_len=5, rows=2, docs=2, policy="concat", cu_seqlens=True)
    kw: dict[str, Any] = {"mode": "IID", "seed": 4, "pack": pack}
    with DataLoader(stores["streams"], batch_size=8, **kw) as whole:
        want = take(whole, 6)
    opts = DaemonOptions(path=str(daemon.socket), group="ddp", group_mode="shard")
    with (
        DataLoader(stores["streams"], batch_size=4, rank=0, world_size=2, daemon=opts, **kw) as r0,
        DataLoader(stores["streams"], batch_size=4, rank=1, world_size=2, daemon=opts, **kw) as r1,
    ):
        got = [(take(r0, 1)[0], take(r1, 1)[0]) for _ in range(6)]
    for (a, b), w in zip(got, want):
        for key in ("tokens", "segment_ids", "positions", "label", "image"):
            np.testing.assert_array_equal(np.concatenate([a[key], b[key]]), w[key], err_msg=key)
        cu = [0, *a["cu_seqlens"][1:].tolist(), *(b["cu_seqlens"][1:] + 2 * 2 * 5).tolist()]
        assert cu == w["cu_seqlens"].tolist()
