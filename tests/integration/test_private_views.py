"""Writable (copy-on-write) daemon batches: a write into one batch never shows in another.

The client views batches through one private mapping of the whole ring and
drops a batch's pages when its lease ends (docs/daemon.md "Performance").
Batches are 64-byte aligned in the ring, so neighbours share pages: these
tests write every byte of batches while their neighbours and the next
batches of the same slots are viewed, and check every batch's exact values.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import numpy as np
from loaderx.client import DaemonOptions
from loaderx.dataloader import DataLoader
from loaderx.zrecord import Dense
from loaderx.zsampler import Sampler

ITEM = 1500  # bytes per record: a 3-record batch spans 2 or 3 pages, sharing its end pages
BATCH = 3
N = 240


def record_values(i: int) -> np.ndarray:
    return ((np.arange(ITEM) + 7 * i) % 251).astype(np.uint8)


def make_store(tmp_path: Path) -> Dense:
    values = np.stack([record_values(i) for i in range(N)])
    with Dense.create(str(tmp_path / "rec"), values.dtype, (ITEM,), codec="raw") as s:
        s.append(values)
    return Dense.open(str(tmp_path / "rec"))


def expected(step: int) -> np.ndarray:
    first = (step * BATCH) % N
    return np.stack([record_values(first + k) for k in range(BATCH)])


def test_writes_never_reach_neighbouring_or_later_batches_of_a_slot(daemon, tmp_path: Path) -> None:
    rng = np.random.default_rng(11)
    store = make_store(tmp_path)
    opts = DaemonOptions(daemon.socket, leases=4)
    held: deque[tuple[int, np.ndarray, bool]] = deque()
    try:
        with DataLoader({"x": store}, batch_size=BATCH, mode=Sampler.Mode.Sequential,
                        daemon=opts) as loader:
            for step in range(3 * N // BATCH):  # every slot reused many times
                got = next(loader)["x"]
                assert got.flags.writeable and got.shape == (BATCH, ITEM) and got.dtype == np.uint8
                np.testing.assert_array_equal(got, expected(step), err_msg=f"step {step}")
                # Every held batch still reads what it was given plus its own writes.
                for s, arr, wrote in held:
                    want = 255 - expected(s) if wrote else expected(s)
                    np.testing.assert_array_equal(arr, want, err_msg=f"held {s}")
                # Half the batches are written (every byte, first and last
                # included); unwritten pages shared with a neighbour are kept.
                wrote = bool(rng.random() < 0.5)
                if wrote:
                    got[...] = 255 - got
                held.append((step, got, wrote))
                del got
                # Hold 0..3 batches (the credit is 4), dropped in random order.
                while len(held) > rng.integers(0, 4):
                    held.rotate(-int(rng.integers(0, len(held))))
                    held.popleft()  # its last reference: released now
    finally:
        held.clear()
        store.close()


def test_a_broadcast_peer_never_sees_a_members_write(daemon, tmp_path: Path) -> None:
    store = make_store(tmp_path)
    opts = DaemonOptions(daemon.socket, group="w", group_mode="broadcast", leases=4)
    writer = DataLoader({"x": store}, batch_size=BATCH, mode=Sampler.Mode.Sequential, daemon=opts)
    reader = DataLoader({"x": store}, batch_size=BATCH, mode=Sampler.Mode.Sequential, daemon=opts)
    try:
        previous = None
        for step in range(2 * N // BATCH):
            mine = next(writer)["x"]
            np.testing.assert_array_equal(mine, expected(step), err_msg=f"writer step {step}")
            mine[...] = 0
            theirs = next(reader)["x"]  # the same ring slot, in another mapping
            np.testing.assert_array_equal(theirs, expected(step), err_msg=f"reader step {step}")
            if previous is not None:  # the writer's neighbour batch, still held
                np.testing.assert_array_equal(previous, 0)
            previous = mine
            del theirs
    finally:
        previous = mine = None
        writer.close()
        reader.close()
        store.close()
