"""Narrowed integer records (format 1.2) read through loaderxd: the daemon's gathers
widen them exactly as an embedded loader does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import assert_same_batch
from loaderx import _loaderx
from loaderx.dataloader import DataLoader
from loaderx.zrecord import Dense, Ragged
from loaderx.zsampler import Sampler


def test_narrowed_stores_read_through_the_daemon_exactly(daemon, tmp_path: Path) -> None:
    n = 120
    # Every width, zero- and sign-extended: record i of "tok" holds values of i's class.
    scale = [0, 200, -100, 40_000, -30_000, 2**31, -(2**31) - 1, 2**40]
    tokens = [np.arange(i % 9 + 1, dtype=np.int64) + scale[i % len(scale)] for i in range(n)]
    blocks = (np.arange(n * 16, dtype=np.int64).reshape(n, 16) * 997 % 50_257).astype(np.int32)
    with Ragged.create(tmp_path / "tok", np.int64, 1, codec="zstd") as rs:
        rs.append(tokens)
    with Dense.create(tmp_path / "blk", np.int32, (16,), codec="zstd", data_shards=2) as ds:
        ds.append(blocks)
    for name in ("tok", "blk"):
        # Small records: format 1.3 (the "groups" index, bare blocks).
        assert tuple(_loaderx.Store.open(str(tmp_path / name)).format_version) == (1, 3)
    streams = {"tok": Ragged.open(tmp_path / "tok"), "blk": Dense.open(tmp_path / "blk")}
    try:
        with DataLoader(
            streams, batch_size=n, mode=Sampler.Mode.Sequential, daemon=daemon.socket
        ) as remote:
            batch = next(remote)
        np.testing.assert_array_equal(batch["blk"], blocks)
        assert batch["blk"].dtype == np.int32
        for got, want in zip(batch["tok"], tokens, strict=True):
            assert got.dtype == np.int64 and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
        with (
            DataLoader(streams, batch_size=16, seed=4, daemon=daemon.socket) as remote,
            DataLoader(streams, batch_size=16, seed=4) as local,
        ):
            for _ in range(10):
                assert_same_batch(next(remote), next(local))
    finally:
        for s in streams.values():
            s.close()
