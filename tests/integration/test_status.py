"""``loaderx status`` and ``connect(path).stats()`` on a real loaderxd with a
known set of groups, members and loaders (docs/daemon.md, "Status"), and
what one uid sees of another's.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, Daemon
from loaderx import __version__, _loaderx, connect
from loaderx.client import DaemonOptions
from loaderx.dataloader import DataLoader
from loaderx.zrecord import Dense

UID = os.getuid()
PID = os.getpid()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(check=False, args=[sys.executable, "-m", "loaderx", *args], capture_output=True, text=True,
                          timeout=60, env=env)


@pytest.fixture
def busy(daemon_factory, stores):
    """A daemon with: shard group 'ddp' (world 2, only rank 0, 3 steps taken),
    broadcast group 'sweep' (2 members at steps 2 and 1) and one solo loader
    (4 steps taken)."""
    daemon = daemon_factory("--max-skew", "2", "--group-timeout", "30", "--memory-limit", "1G",
                            "--sessions-per-uid", "20", "--max-leases", "32", "--max-prefetch", "16")
    s = stores["streams"]
    r0 = DataLoader(s, batch_size=4, seed=1, rank=0, world_size=2,
                    daemon=DaemonOptions(daemon.socket, group="ddp", group_mode="shard"))
    sweep = DaemonOptions(daemon.socket, group="sweep", group_mode="broadcast", group_timeout=7.5)
    a = DataLoader(s, batch_size=8, seed=2, daemon=sweep)
    b = DataLoader(s, batch_size=8, seed=2, daemon=sweep)
    solo = DataLoader(s, batch_size=16, prefetch=2, daemon=daemon.socket)
    for _ in range(3):
        next(r0)
    next(a), next(a), next(b)
    for _ in range(4):
        next(solo)
    yield daemon, {"r0": r0, "a": a, "b": b, "solo": solo}
    for x in (r0, a, b, solo):
        x.close()


def test_stats_lists_the_daemon_groups_members_loaders_and_uids(busy) -> None:
    daemon, loaders = busy
    c = connect(daemon.socket)
    # Settled: connections of earlier polls end asynchronously, and each
    # member is pushed its window (one batch ahead of what it took, within
    # max-skew of its peers) after its last next(). The values the push rule
    # settles at: ddp's rank 0 took 3 and may not be pushed step 3 (rank 1 is
    # at 0, max-skew 2): 3 gathered. sweep: a took 2 and is pushed step 2,
    # b took 1 and is pushed step 1: steps 0..2, 3 gathered. solo took 4 and
    # is pushed step 4: 5 gathered.
    # Live ring slots: ddp holds 0..2 for rank 1 and its pipeline has made
    # step 3 (prefetch 1; shard groups have no live bound): 4. sweep holds
    # 1..2 and is at its live bound of 2 (--group-live-batches), so its
    # pipeline has not started step 3: 2.
    settled = {"ddp": 3, "sweep": 3}
    live = {"ddp": 4, "sweep": 2}
    deadline = time.monotonic() + 10
    while True:
        s = c.stats()
        gathered = {g["name"]: g["batches_gathered"] for g in s["named_groups"]}
        lives = {g["name"]: g["live_slots"] for g in s["named_groups"]}
        solo_gathered = [x["batches_gathered"] for x in s["solo_loaders"]]
        if (s["sessions"] == 4 and gathered == settled and lives == live and solo_gathered == [5]) or \
                time.monotonic() > deadline:
            break
        time.sleep(0.02)
    time.sleep(0.06)  # a value only passing through would move on: read again
    s = c.stats()
    # The counters are unchanged (ints at the top level): 4 loaders; this poll is not counted.
    assert (s["sessions"], s["loaders"], s["groups"], s["group_members"]) == (4, 4, 2, 3)
    d = s["daemon"]
    assert d["pid"] == daemon.proc.pid and d["version"] == __version__ and d["protocol"] == _loaderx.PROTOCOL_VERSION
    assert 0 < d["uptime_s"] < 600 and d["socket"] == daemon.socket
    assert d["viewer_uid"] == UID and d["sees_all_uids"] is True
    assert d["limits"] == {"memory_limit": 1 << 30, "memory_per_uid": 1 << 30, "sessions_per_uid": 20,
                           "max_leases": 32, "max_prefetch": 16, "max_skew": 2, "group_prefetch": 1,
                           "group_live_batches": 2, "group_timeout_s": 30.0, "threads": 2}
    ddp, sweep = s["named_groups"]
    sessions = {m["session"] for g in (ddp, sweep) for m in g["members"]}
    assert len(sessions) == 3
    [m0] = ddp["members"]
    assert {k: v for k, v in m0.items() if k != "session"} == {
        "pid": PID, "uid": UID, "rank": 0, "replica": 0, "cursor": 3, "batches_served": 3,
        "group_timeout_s": 30.0}
    assert {k: v for k, v in ddp.items() if k not in ("members", "ring_bytes", "slots")} == {
        "name": "ddp", "uid": UID, "mode": "shard", "batch_size": 4, "world_size": 2,
        "rank_cursors": [3, 0],  # rank 1 never joined: its cursor is the start step
        "ranks_first": 0, "ranks_count": 2, "replicas": 1,  # every rank, one member each
        "oldest_held": 0, "newest_held": 2, "next_gather": 3,  # held for rank 1
        "waiting": None, "live_slots": 4, "max_live": 0, "batches_gathered": 3, "batches_served": 3}
    assert ddp["ring_bytes"] == loaders["r0"]._source._native.ring_bytes
    assert [(m["pid"], m["rank"], m["cursor"], m["batches_served"], m["group_timeout_s"])
            for m in sweep["members"]] == [(PID, None, 2, 2, 7.5), (PID, None, 1, 1, 7.5)]
    assert {k: v for k, v in sweep.items() if k not in ("members", "ring_bytes", "slots")} == {
        "name": "sweep", "uid": UID, "mode": "broadcast", "batch_size": 8, "world_size": 1,
        "rank_cursors": None, "oldest_held": 1, "newest_held": 2, "next_gather": 3, "waiting": None,
        "live_slots": 2, "max_live": 2, "batches_gathered": 3, "batches_served": 3}
    [solo] = s["solo_loaders"]
    assert solo["pid"] == PID and solo["uid"] == UID and solo["batch_size"] == 16 and solo["cursor"] == 4
    assert solo["session"] not in sessions and solo["max_live"] == 0  # solo loaders: no live bound
    assert (solo["batches_served"], solo["batches_gathered"], solo["next_gather"]) == (4, 5, 5)
    assert (solo["oldest_held"], solo["newest_held"]) == (4, 4)  # pushed to its member, not taken
    assert solo["ring_bytes"] == loaders["solo"]._source._native.ring_bytes
    assert s["uids"] == [{"uid": UID, "sessions": 4, "ring_bytes": s["ring_bytes"]}]
    assert s["ring_bytes"] == ddp["ring_bytes"] + sweep["ring_bytes"] + solo["ring_bytes"]
    assert s["truncated"] is False


def test_a_waiting_group_says_for_which_rank_at_which_step_since_when(busy, stores) -> None:
    daemon, loaders = busy
    r0 = loaders["r0"]
    got: list = []
    t = threading.Thread(target=lambda: got.append(next(r0)["label"].copy()))
    t.start()  # step 3 > rank 1's 0 + max-skew 2: waits for rank 1
    deadline = time.monotonic() + 10
    while True:
        ddp = connect(daemon.socket).stats()["named_groups"][0]
        if ddp["waiting"] is not None and ddp["waiting"]["since_s"] >= 0.3:
            break
        assert time.monotonic() < deadline, ddp
        time.sleep(0.05)
    assert set(ddp["waiting"]) == {"ranks", "step", "since_s"}
    assert ddp["waiting"]["ranks"] == [1] and ddp["waiting"]["step"] == 0
    text = run_cli("status", "--socket", daemon.socket)
    assert text.returncode == 0, text.stderr
    assert f"group 'ddp' (shard, uid {UID}, batch 4 x world 2): holds steps 0..2, next gather 3" in text.stdout
    assert f"  rank 0: step 3, pid {PID} uid {UID} session " in text.stdout
    assert "  rank 1: step 0, no member" in text.stdout
    assert "  waits for rank 1 at step 0 since " in text.stdout
    with DataLoader(stores["streams"], batch_size=4, seed=1, rank=1, world_size=2,
                    daemon=DaemonOptions(daemon.socket, group="ddp")) as r1:
        next(r1)
        t.join(timeout=30)
        assert len(got) == 1
        ddp = connect(daemon.socket).stats()["named_groups"][0]
        assert ddp["waiting"] is None and ddp["rank_cursors"] == [4, 1]
        assert sorted(m["rank"] for m in ddp["members"]) == [0, 1]


def test_status_cli_json_watch_and_errors(busy, tmp_path: Path) -> None:
    daemon, _ = busy
    r = run_cli("status", "--socket", daemon.socket, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [g["name"] for g in doc["named_groups"]] == ["ddp", "sweep"] and doc["loaders"] == 4
    assert r.stdout.count("\n") > 10  # indented
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    watch = subprocess.Popen([sys.executable, "-m", "loaderx", "status", "--socket", daemon.socket, "--json",
                              "--watch", "0.2"], stdout=subprocess.PIPE, text=True, env=env)
    assert watch.stdout is not None
    first = json.loads(watch.stdout.readline())
    second = json.loads(watch.stdout.readline())
    assert second["daemon"]["uptime_s"] > first["daemon"]["uptime_s"]
    watch.send_signal(2)  # Ctrl-C ends a watch normally
    assert watch.wait(timeout=10) == 0
    missing = run_cli("status", "--socket", str(tmp_path / "none.sock"))
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.startswith("loaderx status: DaemonError: ") and missing.stderr.count("\n") == 1
    bad = run_cli("status", "--watch", "0")
    assert bad.returncode == 2 and "must be in 0.1..3600 seconds" in bad.stderr


# Runs as uid nobody: opens a solo loader of its own, prints stats().
OTHER_USER = textwrap.dedent(
    """
    import json, os, sys
    import loaderx.client
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Dense
    uid, gid, sock, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.setgroups([]); os.setgid(gid); os.setuid(uid)
    with DataLoader({"x": Dense.open(store)}, batch_size=2, daemon=sock) as mine:
        next(mine)
        print(json.dumps(loaderx.client.connect(sock).stats()), flush=True)
        sys.stdin.readline()  # keeps its loader open until root has looked
    """
)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second uid")
def test_a_plain_user_sees_only_their_own_groups_loaders_and_usage() -> None:
    nobody = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="lxstatus-"))
    try:
        os.chmod(base, 0o755)
        store = base / "x"
        with Dense.create(str(store), np.uint8, (4,), codec="raw") as w:
            w.append(np.arange(40, dtype=np.uint8).reshape(10, 4))
        os.chmod(store, 0o755)
        for f in store.iterdir():
            os.chmod(f, 0o644)
        daemon = Daemon(base / "d.sock", ["--socket-mode", "0666"])
        try:
            with DataLoader({"x": Dense.open(str(store))}, batch_size=2,
                            daemon=DaemonOptions(daemon.socket, group="secret-run", group_mode="broadcast")) as root_loader:
                next(root_loader)
                env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
                other = subprocess.Popen([sys.executable, "-c", OTHER_USER, str(nobody.pw_uid),
                                          str(nobody.pw_gid), daemon.socket, str(store)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True, env=env, cwd="/")
                assert other.stdout is not None and other.stdin is not None
                line = other.stdout.readline()
                theirs = json.loads(line)
                # Daemon-wide totals are public; the lists hold only nobody's own.
                assert theirs["loaders"] == 2 and theirs["groups"] == 1
                assert theirs["daemon"]["viewer_uid"] == nobody.pw_uid
                assert theirs["daemon"]["sees_all_uids"] is False
                assert theirs["named_groups"] == []
                assert [(x["uid"], x["cursor"]) for x in theirs["solo_loaders"]] == [(nobody.pw_uid, 1)]
                assert [u["uid"] for u in theirs["uids"]] == [nobody.pw_uid]
                assert "secret-run" not in line
                mine = connect(daemon.socket).stats()  # root sees every uid's
                other.stdin.write("\n")
                other.stdin.close()
                assert other.wait(timeout=30) == 0
                assert mine["daemon"]["sees_all_uids"] is True
                assert [g["name"] for g in mine["named_groups"]] == ["secret-run"]
                assert [x["uid"] for x in mine["solo_loaders"]] == [nobody.pw_uid]
                assert sorted(u["uid"] for u in mine["uids"]) == [0, nobody.pw_uid]
        finally:
            daemon.kill()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_status_totals_leave_out_the_asking_connection(daemon_factory, stores) -> None:
    daemon = daemon_factory()
    for _ in range(5):  # every run: `connect()` checks the socket, then asks (two connections)
        r = run_cli("status", "--socket", daemon.socket, "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert (doc["sessions"], doc["uid_sessions"], doc["uids"]) == (0, 0, [])
    text = run_cli("status", "--socket", daemon.socket).stdout.splitlines()
    assert text[2].startswith("totals: 0 sessions, 0 loaders, 0 groups (0 members)")
    # connect()'s check hangs up just before the poll connects: a hung-up connection
    # stops counting at once, so no poll meets the previous one (1.5% did otherwise).
    polls = [connect(daemon.socket).stats()["sessions"] for _ in range(1000)]
    assert polls == [0] * 1000
    with DataLoader(stores["streams"], batch_size=4, daemon=daemon.socket) as loader:
        next(loader)
        doc = json.loads(run_cli("status", "--socket", daemon.socket, "--json").stdout)
        assert (doc["sessions"], doc["uid_sessions"], doc["loaders"]) == (1, 1, 1)
        assert [(u["uid"], u["sessions"]) for u in doc["uids"]] == [(UID, 1)]
        assert connect(daemon.socket).stats()["sessions"] == 1
