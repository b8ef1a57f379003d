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
from conftest import loaderxd_binary

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
        assert _loaderx.daemon_stats(sock_path)["sessions"] == 0  # served on OUR socket
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


def _install(tmp_path: Path) -> Path:
    """`cmake --install` of the build tree that made loaderxd, into a prefix of its own."""
    build = Path(loaderxd_binary()).resolve().parents[1]
    if not (build / "cmake_install.cmake").exists():
        pytest.skip(f"{build} is not a CMake build tree")
    cmake = shutil.which("cmake", path=str(Path(sys.executable).parent)) or shutil.which("cmake")
    assert cmake, "cmake not found"
    prefix = tmp_path / "usr"
    subprocess.run([cmake, "--install", str(build), "--prefix", str(prefix)], check=True,
                   capture_output=True, timeout=120)
    return prefix


def _verify(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    r = subprocess.run(["systemd-analyze", *args], cwd=cwd, check=False, capture_output=True,
                       text=True, timeout=60, env=env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), r.stdout + r.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_installed_units_verify_cleanly_and_name_what_was_installed(tmp_path: Path) -> None:
    prefix = _install(tmp_path)
    system, user = prefix / "lib/systemd/system", prefix / "lib/systemd/user"
    for unit in (system / "loaderxd.service", system / "loaderxd.socket",
                 user / "loaderxd-user.service", user / "loaderxd-user.socket"):
        text = unit.read_text()
        assert "@LOADERX" not in text, unit
        docs = [ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith("Documentation=")]
        assert docs == [f"file://{prefix}/share/doc/loaderx/daemon.md"], unit
        assert (prefix / "share/doc/loaderx/daemon.md").is_file()
        for line in text.splitlines():
            if line.startswith(("ExecStart=", "ExecStartPre=")):
                exe = line.split("=", 1)[1].split()[0]
                assert exe == str(prefix / "bin/loaderxd") and os.access(exe, os.X_OK), line
    service = (system / "loaderxd.service").read_text()
    assert "MemoryHigh=" in service and "MemoryMax=" in service
    assert (prefix / "lib/tmpfiles.d/loaderx.conf").is_file()
    assert (prefix / "lib/sysusers.d/loaderx.conf").is_file()
    _verify(["verify", "loaderxd.socket", "loaderxd.service"], cwd=system)
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    _verify(["--user", "verify", "loaderxd-user.socket", "loaderxd-user.service"], cwd=user,
            env=dict(os.environ, XDG_RUNTIME_DIR=str(runtime)))
