"""loaderxd's log on a real daemon: joins, leaves and their causes, refusals,
stalls once per state, quiet stats polls, a clean shutdown, --log-file,
--pid-file and a detached daemon that leaves the terminal alone
(docs/daemon.md, "Logging").
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import loaderxd_binary
from loaderx import _loaderx
from loaderx.client import DaemonOptions
from loaderx.dataloader import DataLoader
from loaderx.errors import GroupTimeoutError


def lines(path: Path) -> list[str]:
    """The log's lines without the timestamp and pid prefix."""
    out = []
    for line in path.read_text().splitlines():
        m = re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z loaderxd\[\d+\]: (.*)", line)
        assert m, f"unprefixed log line {line!r}"
        out.append(m.group(1))
    return out


def wait_for_line(path: Path, pattern: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        found = [x for x in lines(path) if re.search(pattern, x)]
        if found:
            return found[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no log line matches {pattern!r}:\n" + "\n".join(lines(path)))
        time.sleep(0.05)


@pytest.fixture
def logged(daemon_factory, tmp_path: Path):
    def make(*extra: str):
        log = tmp_path / "loaderxd.log"
        d = daemon_factory("--log-level", "info", "--log-file", str(log), *extra)
        return d, log

    return make


def test_stats_polls_are_quiet_and_a_clean_close_says_so(logged, stores) -> None:
    daemon, log = logged()
    before = lines(log)
    assert len(before) == 1 and re.fullmatch(
        r"info: serving on .*d\.sock \(protocol " + re.escape(_loaderx.PROTOCOL_VERSION) + r", pid \d+\)",
        before[0])
    for _ in range(20):
        _loaderx.daemon_stats(daemon.socket)
        _loaderx.daemon_status(daemon.socket)
    assert lines(log) == before  # no hello / hang-up pair per poll, at info or debug
    with DataLoader(stores["streams"], batch_size=4, daemon=daemon.socket) as loader:
        next(loader)
        next(loader)
    wait_for_line(log, "closed at step 2")
    new = lines(log)[1:]
    assert re.fullmatch(rf"info: session \d+ \(pid {os.getpid()}, uid {os.getuid()}\) opened a loader over "
                        r"3 stream\(s\), n=200 batch=4 at step 0 ring=\d+B slots=\d+", new[0]), new
    # Holding no batch, the client closes its loader by closing the connection.
    assert re.fullmatch(rf"info: session \d+ \(pid {os.getpid()}, uid {os.getuid()}\) closed at step 2: "
                        rf"closed its connection \(process {os.getpid()} is still running\)", new[1]), new
    assert len(new) == 2
    # Holding a batch, it sends `close` (the session lives on until the batch is freed).
    with DataLoader(stores["streams"], batch_size=4, daemon=daemon.socket) as loader:
        kept = next(loader)
    wait_for_line(log, "closed at step 1")
    assert re.fullmatch(r"info: session \d+ \(pid \d+, uid \d+\) closed at step 1: closed its loader",
                        lines(log)[-1])
    del kept


MEMBER = textwrap.dedent(
    """
    import os, sys, time
    from loaderx.zrecord import Dense
    from loaderx.dataloader import DataLoader
    from loaderx.client import DaemonOptions
    s = {"image": Dense.open(sys.argv[2])}
    # A credit of 1, held: nothing is pushed beyond the one batch taken.
    opts = DaemonOptions(sys.argv[1], group="sweep", group_mode="broadcast", leases=1)
    loader = DataLoader(s, batch_size=4, daemon=opts)
    kept = next(loader)
    print("ready", flush=True)
    if sys.argv[3] == "exit":
        os._exit(3)  # no close, no cleanup
    time.sleep(60)
    """
)


@pytest.mark.parametrize(("how", "cause"), [
    ("kill", "was killed by signal 9 (SIGKILL)"),
    ("exit", "exited with status 3"),
])
def test_a_member_that_hangs_up_without_close_is_logged_with_its_fate(logged, stores, how, cause) -> None:
    daemon, log = logged()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", MEMBER, daemon.socket, str(stores["dir"] / "images"), how],
                            stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    if how == "kill":
        proc.kill()
    # Reaped only once the daemon has logged: the exit status of a reaped
    # process is gone from /proc ("has exited"), which a busy daemon may read
    # after the wait.
    line = wait_for_line(log, "left group")
    proc.wait(timeout=30)
    assert line == (f"info: session {line.split()[2]} (pid {proc.pid}, uid {os.getuid()}) left group 'sweep' "
                    f"at step 1: hung up without closing its loader: process {proc.pid} {cause}")
    assert wait_for_line(log, "closed: its last member") == \
        "info: group 'sweep' closed: its last member left (1 batches gathered)"


def test_refusals_are_logged_with_their_reason(logged, stores) -> None:
    daemon, log = logged()
    s = stores["streams"]
    opts = DaemonOptions(daemon.socket, group="ddp")
    with DataLoader(s, batch_size=4, rank=0, world_size=2, daemon=opts), pytest.raises(ValueError):
        DataLoader(s, batch_size=8, rank=1, world_size=2, daemon=opts)
    line = wait_for_line(log, "refused")
    assert re.fullmatch(rf"info: session \d+ \(pid {os.getpid()}, uid {os.getuid()}\): open refused: "
                        r"InvalidArgument: group 'ddp': batch_size 8 differs from the group's 4 .*", line), line


def test_a_stall_is_logged_once_per_state_and_its_end_once(logged, stores) -> None:
    daemon, log = logged("--max-skew", "0")
    s = stores["streams"]
    opts = DaemonOptions(daemon.socket, group="ddp", group_timeout=0.4)
    with DataLoader(s, batch_size=4, rank=0, world_size=2, daemon=opts) as r0:
        next(r0)
        for _ in range(3):  # three timeouts, one state: rank 1 (not joined) at step 0
            with pytest.raises(GroupTimeoutError):
                next(r0)
        with DataLoader(s, batch_size=4, rank=1, world_size=2, daemon=opts) as r1:
            next(r1)
            next(r0)
        wait_for_line(log, "goes on")
    got = lines(log)
    stalls = [x for x in got if "waits for" in x]
    assert len(stalls) == 1, got
    assert re.fullmatch(r"info: group 'ddp' waits for rank 1 \(not joined\) at step 0 since \d+\.\d s", stalls[0])
    timeouts = [x for x in got if "next refused: Timeout" in x]
    assert len(timeouts) == 3 and all(x.startswith("warning: session ") for x in timeouts)
    ends = [x for x in got if "goes on" in x]
    assert len(ends) == 1
    assert re.fullmatch(r"info: group 'ddp' goes on: it waited \d+\.\d s for rank 1 \(not joined\) at step 0", ends[0])


def test_a_clean_shutdown_reads_as_one(logged, stores) -> None:
    daemon, log = logged()
    loader = DataLoader(stores["streams"], batch_size=4, daemon=daemon.socket)
    next(loader)
    assert daemon.stop() == 0
    got = lines(log)
    assert got[-1] == "info: stopped cleanly"
    term = got.index("info: SIGTERM received: shutting down")
    assert re.fullmatch(r"info: session \d+ \(pid \d+, uid \d+\) closed at step 1: loaderxd is shutting down",
                        got[term + 1]), got
    assert not [x for x in got if x.startswith(("warning:", "error:"))], got
    loader.close()


def test_a_detached_daemon_leaves_the_terminal_and_keeps_a_pid_file(tmp_path: Path) -> None:
    sock, log, pid_file = tmp_path / "d.sock", tmp_path / "d.log", tmp_path / "d.pid"
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID")}
    cmd = [loaderxd_binary(), "--socket", str(sock), "--log-file", str(log), "--pid-file", str(pid_file)]
    # Pipes as the "terminal": if the daemon kept any of them open,
    # communicate() would wait for it and time out.
    start = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.PIPE, env=env)
    out, err = start.communicate(timeout=20)
    assert (start.returncode, out, err) == (0, b"", b"")
    pid = int(pid_file.read_text())
    try:
        assert b"loaderxd" in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert lines(log)[0] == f"info: serving on {sock} (protocol {_loaderx.PROTOCOL_VERSION}, pid {pid})"
        second = subprocess.run(check=False, args=[*cmd[:2], str(tmp_path / "e.sock"), *cmd[3:]], capture_output=True,
                                text=True, timeout=20, env=env)
        assert second.returncode == 1
        assert second.stderr == f"loaderxd: error: AlreadyExists: {pid_file}: pid file is locked by a running " \
                                f"loaderxd (pid {pid})\n"
    finally:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_file.exists()
    assert lines(log)[-1] == "info: stopped cleanly"


def test_bad_log_and_pid_paths_are_reported_on_the_terminal(tmp_path: Path) -> None:
    for flag in ("--log-file", "--pid-file"):
        r = subprocess.run(check=False, args=[loaderxd_binary(), "--socket", str(tmp_path / "d.sock"), flag,
                            str(tmp_path / "missing" / "x")], capture_output=True, text=True, timeout=20)
        assert r.returncode == 1
        assert f"{tmp_path}/missing/x: cannot open" in r.stderr and "No such file or directory" in r.stderr
