"""Mixture schedules (loaderx.mix, schedule=) served by a real loaderxd: the embedded batches
step for step across segment boundaries, appending through a solo loader, groups that agree
on the schedule, and refusals naming what differs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_same_batch
from loaderx import _loaderx
from loaderx.dataloader import DataLoader
from loaderx.errors import InvalidArgumentError
from loaderx.mix import mix
from loaderx.sources import DaemonOptions
from test_mix_daemon import LENGTHS, batches, open_parts

SCHEDULE = [(0, {"web": 0.5, "books": 0.3, "code": 0.2}),
            (4, {"books": 0.6, "code": 0.4}),
            (9, {"web": 0.9, "code": 0.1})]


@pytest.fixture
def parts(tmp_path: Path) -> Any:
    yield from open_parts(tmp_path)


def scheduled(parts: dict[str, Any], schedule: Any = SCHEDULE, **kw: Any) -> Any:
    return mix({name: parts[name] for name in LENGTHS}, schedule=schedule, min_positions=500,
               **kw)


def test_the_protocol_minor_carries_schedules() -> None:
    major, minor = (int(x) for x in _loaderx.PROTOCOL_VERSION.split("."))
    assert major == 1 and minor >= 6


@pytest.mark.parametrize("mode", ["IID", "Cyclic"])
def test_a_schedule_through_loaderxd_gives_the_embedded_batches(daemon, parts, mode) -> None:
    m = scheduled(parts)
    kw: dict[str, Any] = {"batch_size": 16, "mode": mode, "seed": 7}
    with DataLoader(m, **kw) as embedded:
        want = batches(embedded, 14)
    with DataLoader(m, **kw, daemon=daemon.socket) as served:
        got = batches(served, 14)
        served.seek(3)  # seek back across two boundaries
        again = batches(served, 8)
    assert len(got) == 14
    for a, b in zip(got, want):
        assert_same_batch(a, b)
    for a, b in zip(again, want[3:11]):
        assert_same_batch(a, b)
    # segment 1 has no "web" (dataset 0), segment 2 no "books" (dataset 1)
    assert all(0 not in b["dataset"].tolist() for b in got[4:9])
    assert all(1 not in b["dataset"].tolist() for b in got[9:])


def test_appending_through_a_solo_loaderxd_loader_matches_the_embedded_schedule(
        daemon, parts) -> None:
    kw: dict[str, Any] = {"batch_size": 8, "mode": "Cyclic", "seed": 2}
    with DataLoader(scheduled(parts), **kw) as embedded:
        want = batches(embedded, 12)
    with DataLoader(scheduled(parts, SCHEDULE[:1]), **kw, daemon=daemon.socket) as served:
        got = batches(served, 3)
        served.append_mix(4, SCHEDULE[1][1])
        got += batches(served, 2)
        served.append_mix(9, SCHEDULE[2][1])
        got += batches(served, 7)
        state = served.state_dict()
    for a, b in zip(got, want):
        assert_same_batch(a, b)
    assert state["mix_schedule"] == [[s, {n: w.get(n, 0.0) for n in LENGTHS}] for s, w in SCHEDULE]
    # Resumed on two ranks through the daemon from a loader of the first segment only.
    halves = [DataLoader(scheduled(parts, SCHEDULE[:1]), batch_size=4, mode="Cyclic", seed=2,
                         rank=r, world_size=2, daemon=daemon.socket) for r in range(2)]
    try:
        for h in halves:
            h.load_state_dict({**state, "step": 2})
        for step in range(2, 12):
            got_halves = [batches(h, 1)[0] for h in halves]
            xs = [int(x) for g in got_halves for x in g["x"]]
            assert xs == [int(x) for x in want[step]["x"]], step
    finally:
        for h in halves:
            h.close()


def test_group_members_must_agree_on_the_schedule(daemon, parts) -> None:
    opts = DaemonOptions(path=daemon.socket, group="sched", group_mode="shard")
    m = scheduled(parts, source=None)
    later = scheduled(parts, [SCHEDULE[0], (5, SCHEDULE[1][1]), SCHEDULE[2]], source=None)
    assert later["x"]._mix_counts == m["x"]._mix_counts  # same counts, other starts
    with DataLoader(m, batch_size=4, seed=5, rank=0, world_size=2, daemon=opts) as first:
        with pytest.raises(InvalidArgumentError, match=re.escape(
                "group 'sched': mixture schedule segments [step 0: ")):
            DataLoader(later, batch_size=4, seed=5, rank=1, world_size=2, daemon=opts)
        with pytest.raises(InvalidArgumentError, match="mixture counts"):
            DataLoader(scheduled(parts, SCHEDULE[:2], source=None), batch_size=4, seed=5,
                       rank=1, world_size=2, daemon=opts)
        with DataLoader(m, batch_size=4, seed=5, rank=1, world_size=2, daemon=opts) as second:
            a, b = batches(first, 1)[0], batches(second, 1)[0]
            with DataLoader(m, batch_size=8, seed=5) as embedded:
                want = batches(embedded, 1)[0]
            assert [int(x) for x in [*a["x"], *b["x"]]] == [int(x) for x in want["x"]]
            with pytest.raises(InvalidArgumentError, match="member of loaderxd group 'sched'"):
                first.append_mix(20, {"web": 1.0})
            assert first.mixture is m


def test_a_daemon_older_than_schedules_is_refused_by_name(parts, tmp_path) -> None:
    # A listener that answers hello as a 1.5 daemon (the last minor without schedules,
    # which came with 1.6) would, then records whatever else arrives: the client must
    # refuse before it sends an open.
    import socket
    import threading

    import msgpack
    from loaderx.errors import ProtocolError

    major = int(_loaderx.PROTOCOL_VERSION.split(".")[0])
    path = str(tmp_path / "old.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(path)
    server.listen(1)
    received: list[dict[str, Any]] = []

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            hello = msgpack.unpackb(conn.recv(65536))
            received.append(hello)
            conn.send(msgpack.packb({"t": "hello_ok", "major": major, "minor": 5,
                                     "daemon_version": "old", "incarnation": 1, "session": 1}))
            conn.settimeout(5)
            try:
                while data := conn.recv(65536):
                    received.append(msgpack.unpackb(data))
            except (TimeoutError, OSError):
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pytest.raises(ProtocolError, match=re.escape(
                "loaderxd speaks protocol 1.5; a mixture schedule of more than one segment "
                "needs 1.6 (upgrade loaderxd, or load the mixture embedded)")):
            DataLoader(scheduled(parts), batch_size=4, seed=1, daemon=path)
        t.join(10)
        assert [m["t"] for m in received] == ["hello"]  # no open reached the old daemon
    finally:
        server.close()
