"""The pretraining features together through the group of a multi-node, model-parallel
job: a mixture schedule, best-fit packing and skipped ranges, served by a real loaderxd
node group with tensor-parallel replicas. Every member's batches are the embedded
loader's of its data-parallel rank, byte for byte, at the same steps, and the two
replicas of a rank receive the same batches."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
from loaderx.dataloader import DataLoader
from loaderx.mix import mix
from loaderx.packing import Packing
from loaderx.sources import DaemonOptions
from loaderx.zrecord import Ragged

SCHEDULE = [(0, {"web": 0.7, "books": 0.3}), (5, {"web": 0.2, "books": 0.8})]
SKIP = [(3, 4), (8, 10)]
DELIVERED = [0, 1, 2, 4, 5, 6, 7, 10, 11, 12]
NODES, DP_PER_NODE, TP = 2, 2, 2  # node 0 of a job of 2 nodes x 2 data-parallel ranks x TP 2
BATCH = 8  # per data-parallel rank


def corpus(root: Path, name: str, base: int, n: int) -> Ragged:
    with Ragged.create(root / name, np.int32, ndim=1, codec="zstd") as w:
        w.append([np.arange(i % 11 + 1, dtype=np.int32) + base + 100 * i for i in range(n)])
    return Ragged.open(root / name)


def snapshot(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: dict(v) if isinstance(v, dict) else np.array(v) for k, v in batch.items()}


def assert_equal(a: dict[str, Any], b: dict[str, Any], where: str) -> None:
    assert list(a) == list(b), where
    for k, x in a.items():
        y = b[k]
        if isinstance(x, dict):
            assert x == y, (where, k)
        else:
            assert x.dtype == y.dtype and x.shape == y.shape, (where, k)
            assert x.tobytes() == y.tobytes(), (where, k)


def test_schedule_packing_and_skips_through_a_node_group_with_replicas(daemon, tmp_path: Path) -> None:
    stores = {"web": corpus(tmp_path, "web", 0, 61), "books": corpus(tmp_path, "books", 1_000_000, 23)}
    try:
        streams = mix({name: {"tokens": s} for name, s in stores.items()}, schedule=SCHEDULE,
                      min_positions=400)
        kw: dict[str, Any] = {"batch_size": BATCH, "mode": "IID", "seed": 5, "skip": SKIP,
                              "world_size": NODES * DP_PER_NODE,
                              "pack": Packing(seq_len=16, rows=2, docs=4, policy="best_fit", cu_seqlens=True)}
        opts = DaemonOptions(daemon.socket, group="job-node0", group_mode="shard", ranks=range(DP_PER_NODE),
                             replicas=TP, group_timeout=60)
        members = [(dp, replica) for dp in range(DP_PER_NODE) for replica in range(TP)]
        barrier = threading.Barrier(len(members), timeout=60)
        got: dict[tuple[int, int], list[tuple[int, dict[str, Any]]]] = {}
        errors: list[BaseException] = []

        def member(dp: int, replica: int) -> None:
            try:
                with DataLoader(streams, rank=dp, daemon=opts, **kw) as loader:
                    out = []
                    for _ in DELIVERED:
                        out.append((loader.step, snapshot(next(loader))))
                        barrier.wait()  # the step's collective, as in training
                    got[(dp, replica)] = out
            except BaseException as e:  # noqa: BLE001 - reported by the test
                barrier.abort()
                errors.append(e)

        threads = [threading.Thread(target=member, args=m) for m in members]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        for dp in range(DP_PER_NODE):
            with DataLoader(streams, rank=dp, **kw) as embedded:
                want = [(embedded.step, snapshot(next(embedded))) for _ in DELIVERED]
            assert [s for s, _ in want] == DELIVERED
            assert want[0][1]["tokens"].shape == (4, 16)  # 2 units of 4 documents, 2 rows each
            for replica in range(TP):
                mine = got[(dp, replica)]
                assert [s for s, _ in mine] == DELIVERED
                for (step, a), (_, b) in zip(mine, want):
                    assert_equal(a, b, f"dp rank {dp}, replica {replica}, step {step}")
        # The schedule is in force: the second segment (from step 5) draws "books"
        # (dataset 1) for most samples, the first mostly "web".
        dataset = {step: b["dataset"] for step, b in got[(0, 0)] + got[(1, 0)]}
        assert sum(int((dataset[s] == 1).sum()) for s in (0, 1, 2, 4)) < sum(
            int((dataset[s] == 1).sum()) for s in (5, 6, 7, 10))
    finally:
        for s in stores.values():
            s.close()
