"""loaderxd under systemd's two interfaces, driven by hand: socket activation
(LISTEN_FDS) and sd_notify (NOTIFY_SOCKET), without needing systemd itself."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, loaderxd_binary

# Execs loaderxd with `fd` as its fd 3 (SD_LISTEN_FDS_START) and LISTEN_PID
# set to its own pid, as systemd does.
_EXEC_AS_ACTIVATED = (
    "import os, sys\n"
    "os.dup2(int(sys.argv[1]), 3)\n"
    "os.environ['LISTEN_PID'] = str(os.getpid())\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def activated(fd: int, *args: str) -> list[str]:
    return [sys.executable, "-c", _EXEC_AS_ACTIVATED, str(fd), loaderxd_binary(), *args]


def test_socket_activation_and_notify_ready_watchdog_stopping(tmp_path: Path, stores) -> None:
    from loaderx import _loaderx
    from loaderx.dataloader import DataLoader

    sock_path = str(tmp_path / "activated.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(sock_path)
    listener.listen(16)
    notify_path = str(tmp_path / "notify")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(notify_path)
    notify.settimeout(10)

    env = {k: v for k, v in os.environ.items() if not k.startswith("LISTEN_")}
    env.update(NOTIFY_SOCKET=notify_path, LISTEN_FDS="1", WATCHDOG_USEC="200000")
    # LISTEN_PID must be the daemon's own pid: the shell execs into it.
    proc = subprocess.Popen(
        activated(listener.fileno(), "--socket", sock_path + "-unused", "--log-level", "warning"),
        env=env, pass_fds=(listener.fileno(),))
    try:
        ready = notify.recv(4096).decode()
        assert "READY=1" in ready and "STATUS=serving" in ready
        assert notify.recv(4096).decode() == "WATCHDOG=1"  # every WATCHDOG_USEC / 2
        assert _loaderx.daemon_stats(sock_path)["sessions"] == 1  # served on OUR socket
        assert not os.path.exists(sock_path + "-unused")
        with DataLoader(stores["streams"], batch_size=4, daemon=sock_path) as loader:
            assert next(loader)["label"].shape == (4,)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        msgs = []
        while True:
            m = notify.recv(4096).decode()
            msgs.append(m)
            if m == "STOPPING=1":
                break
        # The socket belongs to systemd (here: the test): the daemon leaves it.
        assert os.path.exists(sock_path)
    finally:
        if proc.poll() is None:
            proc.kill()
        listener.close()
        notify.close()


def test_activation_with_a_wrong_socket_type_is_refused(tmp_path: Path) -> None:
    stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stream.bind(str(tmp_path / "stream.sock"))
    stream.listen(1)
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    env["LISTEN_FDS"] = "1"
    r = subprocess.run(activated(stream.fileno(), "--foreground", "--socket", "/nonexistent/x"),
                       env=env, pass_fds=(stream.fileno(),), check=False, capture_output=True, timeout=10)
    assert r.returncode == 1
    assert b"ListenSequentialPacket" in r.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_units_verify_cleanly(tmp_path: Path) -> None:
    for name in ("loaderxd.service", "loaderxd.socket"):
        text = (ROOT / "systemd" / name).read_text().replace("/usr/bin/loaderxd", loaderxd_binary())
        (tmp_path / name).write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", "loaderxd.socket", "loaderxd.service"],
                       cwd=tmp_path, check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stderr
