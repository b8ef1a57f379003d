"""Weighted mixtures (loaderx.mix) served by a real loaderxd: the same batches as the
embedded loader, in groups too, and clear errors for what the daemon cannot serve."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import assert_same_batch
from loaderx import _loaderx
from loaderx.dataloader import DataLoader
from loaderx.errors import InvalidArgumentError, SchemaError
from loaderx.mix import mix
from loaderx.zrecord import Dense, Ragged

LENGTHS = {"web": 53, "books": 19, "code": 7}
BASE = {"web": 0, "books": 1000, "code": 2000}
WEIGHTS = {"web": 0.5, "books": 0.3, "code": 0.2}


@pytest.fixture
def parts(tmp_path: Path) -> Any:
    yield from open_parts(tmp_path)


def open_parts(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Each dataset's "x" (int64 base + i) and "r" (ragged) stores, closed after the yield."""
    out = {}
    for name, n in LENGTHS.items():
        with Dense.create(tmp_path / name / "x", np.int64, (), codec="zstd") as w:
            w.append(np.arange(n, dtype=np.int64) + BASE[name])
        with Ragged.create(tmp_path / name / "r", np.int32, 1, codec="raw") as w:
            w.append([np.full(i % 4, BASE[name] + i, np.int32) for i in range(n)])
        out[name] = {"x": Dense.open(tmp_path / name / "x"), "r": Ragged.open(tmp_path / name / "r")}
    yield out
    for streams in out.values():
        for s in streams.values():
            s.close()


def mixture(parts: dict[str, Any], **kw: Any) -> Any:
    return mix({name: (parts[name], WEIGHTS[name]) for name in LENGTHS}, min_positions=1000, **kw)


def batches(loader: DataLoader, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        b = next(loader)
        out.append({k: ([np.array(r) for r in v] if isinstance(v, list) else np.array(v))
                    for k, v in b.items()})
        del b
    return out


def test_a_mixture_through_loaderxd_gives_the_embedded_batches(daemon, parts) -> None:
    m = mixture(parts)
    kw: dict[str, Any] = {"batch_size": 16, "mode": "IID", "seed": 7}
    with DataLoader(m, **kw) as embedded:
        want = batches(embedded, 25)
    with DataLoader(m, **kw, daemon=daemon.socket) as served:
        got = batches(served, 25)
    assert len(got) == 25
    for a, b in zip(got, want):
        assert_same_batch(a, b)
    # The dataset numbers say where each sample came from: every value of "x" is its
    # dataset's base plus a record index below that dataset's length.
    for b in got:
        for k, x in zip(b["dataset"], b["x"]):
            name = m.names[int(k)]
            assert BASE[name] <= int(x) < BASE[name] + LENGTHS[name]
    assert daemon.stats()["batches_served"] >= 25


def test_a_resumed_mixture_starts_at_the_embedded_step(daemon, parts) -> None:
    m = mixture(parts, source=None)
    with DataLoader(m, batch_size=8, seed=3) as embedded:
        want = batches(embedded, 12)[9:]
    with DataLoader(m, batch_size=8, seed=3, start_step=9,
                    daemon=daemon.socket) as served:
        got = batches(served, 3)
    assert list(got[0]) == ["x", "r"]
    for a, b in zip(got, want):
        assert_same_batch(a, b)


def test_two_members_of_a_broadcast_group_share_one_mixture(daemon, parts) -> None:
    from loaderx.sources import DaemonOptions

    m = mixture(parts)
    opts = DaemonOptions(path=daemon.socket, group="mixed", group_mode="broadcast")
    with DataLoader(m, batch_size=8, seed=5) as embedded:
        want = batches(embedded, 6)
    with DataLoader(m, batch_size=8, seed=5, daemon=opts) as a, \
            DataLoader(m, batch_size=8, seed=5, daemon=opts) as b:
        # In turns, as two trainer processes run: a member ahead of the other
        # by more than the live bound (--group-live-batches 2) would wait.
        got_a, got_b = [], []
        for _ in range(6):
            got_a += batches(a, 1)
            got_b += batches(b, 1)
    for x, y, w in zip(got_a, got_b, want):
        assert_same_batch(x, w)
        assert_same_batch(y, w)
    # One group gathered each step once for both members.
    assert daemon.stats()["batches_gathered"] <= 6 + 8  # + what it gathered ahead (prefetch)


def test_a_mixture_through_a_node_group_with_replicas_gives_each_rank_its_embedded_batches(
    daemon_factory, parts
) -> None:
    from loaderx.sources import DaemonOptions

    d = daemon_factory("--max-skew", "3")
    m = mixture(parts)
    kw: dict[str, Any] = {"batch_size": 4, "mode": "Cyclic", "seed": 2, "world_size": 4}
    # The node of ranks 2 and 3 of 4, each rank with two model-parallel replicas.
    opts = DaemonOptions(path=d.socket, group="node1", group_mode="shard", ranks=range(2, 4), replicas=2)
    members = [DataLoader(m, rank=2 + i // 2, daemon=opts, **kw) for i in range(4)]
    try:
        got = [[] for _ in members]
        for _ in range(5):
            for i, loader in enumerate(members):
                got[i] += batches(loader, 1)
    finally:
        for loader in members:
            loader.close()
    for i in range(4):
        with DataLoader(m, rank=2 + i // 2, **kw) as embedded:
            for a, b in zip(got[i], batches(embedded, 5)):
                assert_same_batch(a, b)


def test_what_loaderxd_cannot_serve_is_refused_by_name(daemon, parts) -> None:
    m = mixture(parts, source=None)
    nested = mix({"all": (m, 1.0), "web": (parts["web"], 1.0)}, min_positions=1000, source=None)
    with pytest.raises(TypeError, match="mixes a mixture"):
        DataLoader(nested, batch_size=4, daemon=daemon.socket)
    # Streams of two mixtures with the same counts are one mixture on the wire (each
    # mixed stream brings its own parts; the counts are shared): served exactly.
    one = mix({"web": (parts["web"], 1.0), "books": (parts["books"], 1.0)}, min_positions=1000)
    two = mix({"web": (parts["web"], 1.0), "code": (parts["code"], 1.0)}, min_positions=1000)
    assert one.counts == two.counts == (500, 500)
    both = {"x": one["x"], "y": two["x"], "k": two["dataset"]}
    with DataLoader(both, batch_size=8, seed=1) as embedded:
        want = batches(embedded, 5)
    with DataLoader(both, batch_size=8, seed=1, daemon=daemon.socket) as served:
        for a, b in zip(batches(served, 5), want):
            assert_same_batch(a, b)
    # Other counts are another index space: refused through the daemon, by name.
    three = mix({"web": (parts["web"], 1.0), "code": (parts["code"], 3.0)}, min_positions=1000)
    assert three.counts == (250, 750)
    mixed = {"x": one["x"], "y": three["x"]}
    with pytest.raises(InvalidArgumentError, match="stream 'y' belongs to another mixture"):
        DataLoader(mixed, batch_size=4, daemon=daemon.socket)
    # Embedded, the same two streams are fine (equal lengths): only the daemon path refuses.
    with DataLoader(mixed, batch_size=4) as loader:
        assert next(loader)["x"].shape == (4,)
    assert daemon.wait_stat("loaders", 0)["loaders"] == 0  # close is unanswered in 1.2


def test_the_daemon_checks_counts_and_part_schemas(daemon, parts, tmp_path: Path) -> None:
    web, books = str(parts["web"]["x"]._path), str(parts["books"]["x"]._path)

    def open_native(parts_paths: list[str], counts: list[int]) -> Any:
        spec = _loaderx.LoaderSpec(stores=["mixed"], batch_size=4, mode=1, seed=0, prefetch=2,
                                   leases=4, mix_counts=counts, mix_parts=[parts_paths])
        return _loaderx.DaemonLoader(daemon.socket, spec)

    with pytest.raises(InvalidArgumentError, match="dataset 1 has 0 positions"):
        open_native([web, books], [10, 0])
    with Dense.create(tmp_path / "f", np.float64, (), codec="raw") as w:
        w.append(np.zeros(5))
    with pytest.raises(SchemaError):
        open_native([web, str(tmp_path / "f")], [10, 10])
    with pytest.raises(InvalidArgumentError, match="has 1 parts; the mixture has 2"):
        open_native([web], [10, 10])
    # The refusals left nothing open.
    assert daemon.wait_stat("loaders", 0)["loaders"] == 0
    ok = open_native([web, books], [10, 20])
    step, batch = ok.next(10.0)
    assert step == 0 and batch[0].shape == (4,)
    ok.close()


@pytest.mark.parametrize("group_mode", ["shard", "broadcast"])
@pytest.mark.parametrize("order", ["heavier-web-first", "heavier-web-second"])
def test_a_member_with_other_mixture_weights_is_refused_naming_both_counts(
    daemon, parts, group_mode, order
) -> None:
    # The same part files with other weights are another sample order: refused
    # at open, naming the mixture's counts of both, in either join order.
    from loaderx.sources import DaemonOptions

    weights = [dict(WEIGHTS), dict(WEIGHTS, web=0.6, books=0.2)]
    if order == "heavier-web-first":
        weights.reverse()
    mixes = [mix({name: (parts[name], w[name]) for name in LENGTHS}, min_positions=1000, source=None)
             for w in weights]
    counts = [list(m["x"]._mix_counts) for m in mixes]
    assert counts[0] != counts[1]
    opts = DaemonOptions(path=daemon.socket, group="mixed", group_mode=group_mode)
    second_rank = 1 if group_mode == "shard" else 0
    needle = re.escape(f"group 'mixed': mixture counts {counts[1]} differs from the group's {counts[0]}")
    with DataLoader(mixes[0], batch_size=4, seed=5, rank=0, world_size=2, daemon=opts), \
            pytest.raises(InvalidArgumentError, match=needle):
        DataLoader(mixes[1], batch_size=4, seed=5, rank=second_rank, world_size=2, daemon=opts)
