"""Fixtures for tests against a real ``loaderxd`` process on a real socket.

The binary comes from ``$LOADERXD`` (the Makefile sets it) or the newest
``build*/daemon/loaderxd`` of this checkout built for this interpreter's
machine (not the aarch64 cross build). Every daemon listens on a socket
in a fresh temporary directory and is killed at the end of its test.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from batch_compare import batch_difference

ROOT = Path(__file__).resolve().parents[2]


def assert_same_batch(a: dict, b: dict) -> None:
    """Two DataLoader batches hold the same streams, dtypes, shapes and values."""
    difference = batch_difference(a, b)
    assert difference is None, difference


def _elf_machine(path: str) -> bytes:
    """The e_machine field of an ELF file: a cross build (build-aarch64) is not this machine's."""
    with open(path, "rb") as f:
        return f.read(20)[18:20]


def loaderxd_binary() -> str:
    env = os.environ.get("LOADERXD")
    if env:
        return env
    found = [
        p
        for p in glob.glob(str(ROOT / "build*" / "daemon" / "loaderxd"))
        if os.access(p, os.X_OK) and _elf_machine(p) == _elf_machine(sys.executable)
    ]
    if not found:
        pytest.skip("loaderxd is not built (set LOADERXD or build the loaderxd target)")
    return max(found, key=os.path.getmtime)


class Daemon:
    """One loaderxd process on ``self.socket``."""

    def __init__(self, socket: Path, extra: list[str]) -> None:
        self.socket = str(socket)
        self.log = socket.with_suffix(".log")
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        cmd = [loaderxd_binary(), "--foreground", "--socket", self.socket, "--threads", "2",
               "--log-level", "warning", *self.extra]
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID")}
        # A file, not a pipe: an unread pipe would fill and block the daemon.
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stderr=log)
        deadline = time.monotonic() + 10
        from loaderx import _loaderx

        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.log.read_text(errors="replace")
                raise RuntimeError(f"loaderxd exited with {self.proc.returncode}: {err}")
            try:
                _loaderx.daemon_stats(self.socket)
                return
            except Exception:  # noqa: BLE001 - not accepting yet
                time.sleep(0.02)
        raise RuntimeError("loaderxd did not come up within 10 s")

    def stats(self) -> dict[str, int]:
        from loaderx import _loaderx

        return dict(_loaderx.daemon_stats(self.socket))

    def wait_stat(self, name: str, value: int, timeout: float = 5.0) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        while True:
            s = self.stats()
            if s[name] == value or time.monotonic() > deadline:
                return s
            time.sleep(0.02)

    def settled(self, timeout: float = 5.0, **want: int) -> dict[str, int]:
        """Asserts the counters in `want` settle at exactly those values.

        Pushes, `consumed` and `release` frames are applied asynchronously
        (and in order only with their own connection's requests), so this
        polls for at most `timeout` until every counter equals its value,
        then reads them again 60 ms later: a value the daemon only passes
        through on its way elsewhere fails. Returns the last stats.
        """
        deadline = time.monotonic() + timeout
        while True:
            s = self.stats()
            if all(s[k] == v for k, v in want.items()):
                time.sleep(0.06)
                s = self.stats()
                if all(s[k] == v for k, v in want.items()):
                    return s
            if time.monotonic() > deadline:
                got = {k: s[k] for k in want}
                raise AssertionError(f"daemon stats {got} did not settle at {want}")
            time.sleep(0.02)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=10)

    def stop(self) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=10)


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator:
    made: list[Daemon] = []

    def make(*extra: str, name: str = "d.sock") -> Daemon:
        d = Daemon(tmp_path / name, list(extra))
        made.append(d)
        return d

    yield make
    for d in made:
        d.kill()


@pytest.fixture
def daemon(daemon_factory) -> Daemon:
    return daemon_factory()


@pytest.fixture
def stores(tmp_path: Path) -> dict:
    """Two dense streams (uint8 images, int64 labels) and one ragged (int32 tokens), 200 records."""
    from loaderx.zrecord import Dense, Ragged

    rng = np.random.default_rng(0)
    n = 200
    images = rng.integers(0, 255, size=(n, 3, 8, 8), dtype=np.uint8)
    labels = np.arange(n, dtype=np.int64) * 3
    tokens = [np.full(i % 7 + 1, i, dtype=np.int32) for i in range(n)]
    with Dense.create(str(tmp_path / "images"), images.dtype, images.shape[1:], codec="zstd") as s:
        s.append(images)
    with Dense.create(str(tmp_path / "labels"), labels.dtype, (), codec="raw") as s:
        s.append(labels)
    with Ragged.create(str(tmp_path / "tokens"), np.int32, ndim=1, codec="zstd") as s:
        s.append(tokens)
    opened = {
        "image": Dense.open(str(tmp_path / "images")),
        "label": Dense.open(str(tmp_path / "labels")),
        "tokens": Ragged.open(str(tmp_path / "tokens")),
    }
    yield {"streams": opened, "images": images, "labels": labels, "tokens": tokens, "dir": tmp_path}
    for s in opened.values():
        s.close()
