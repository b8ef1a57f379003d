"""loaderxd --gather-nice: a real daemon runs its gather threads, and only
those, that many nice levels below its other threads (read from
/proc/PID/task/*/stat, as ``ps -L`` would)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import numpy as np
from conftest import loaderxd_binary
from loaderx.dataloader import DataLoader


def thread_nices(pid: int) -> dict[int, int]:
    """tid -> nice of every thread of process ``pid`` (proc(5): field 19)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # the thread just exited
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(task.name)] = int(fields[19 - 3])
    return out


def wait_for_nice_count(pid: int, nice: int, count: int, timeout: float = 5.0) -> dict[int, int]:
    deadline = time.monotonic() + timeout
    while True:
        nices = thread_nices(pid)
        if sum(n == nice for n in nices.values()) == count or time.monotonic() > deadline:
            return nices


def test_gather_threads_and_only_them_run_at_gather_nice(daemon_factory, stores) -> None:
    d = daemon_factory("--gather-nice", "7")  # the fixture passes --threads 2
    base = thread_nices(d.proc.pid)[d.proc.pid]
    images = stores["streams"]["image"]
    with DataLoader({"image": images}, batch_size=4, seed=1, daemon=d.socket) as remote, \
            DataLoader({"image": images}, batch_size=4, seed=1) as local:
        np.testing.assert_array_equal(next(remote)["image"], next(local)["image"])
        nices = wait_for_nice_count(d.proc.pid, min(base + 7, 19), 2)
    lowered = [t for t, n in nices.items() if n == min(base + 7, 19)]
    assert len(lowered) == 2, nices  # exactly the loader's 2 gather threads
    assert all(n == base for t, n in nices.items() if t not in lowered), nices
    assert nices[d.proc.pid] == base


def test_gather_nice_zero_keeps_every_thread_at_the_daemons_priority(daemon_factory, stores) -> None:
    d = daemon_factory("--gather-nice", "0")
    base = thread_nices(d.proc.pid)[d.proc.pid]
    with DataLoader({"image": stores["streams"]["image"]}, batch_size=4, seed=1, daemon=d.socket) as remote:
        next(remote)
        nices = thread_nices(d.proc.pid)
    assert len(nices) >= 4  # main, io, the session's worker, gather threads
    assert set(nices.values()) == {base}, nices


def test_invalid_gather_nice_is_refused_naming_the_flag_and_range(tmp_path) -> None:
    for bad in ("20", "-3", "high"):
        r = subprocess.run([loaderxd_binary(), "--foreground", "--socket", str(tmp_path / "x.sock"),
                            "--gather-nice", bad], capture_output=True, text=True, timeout=10, check=False)
        assert r.returncode == 2, (bad, r.stderr)
        assert "gather-nice" in r.stderr, r.stderr
    r = subprocess.run([loaderxd_binary(), "--socket", str(tmp_path / "x.sock"), "--gather-nice", "20",
                        "--check-config"], capture_output=True, text=True, timeout=10, check=False)
    assert r.returncode == 2 and "exceeds 19" in r.stderr, r.stderr
