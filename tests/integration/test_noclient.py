"""The extension built without the loaderxd client (``-DLOADERX_PYTHON_CLIENT=OFF``).

That is the build macOS and Windows get (loaderxd and its client are
Linux-only); ``make test-noclient`` (scripts/test_noclient.sh) makes it on
Linux in ``build-noclient`` and runs this file with ``LOADERX_NOCLIENT_PKG``
naming the package directory that holds it. Without that variable the tests
skip: the build is a second compile of the extension (docs/platforms.md,
"The extension without the client").

The no-client module runs in a subprocess (this process has imported the
full build from ``python/``), against a real loaderxd that answers, and its
undefined symbols are read with ``nm``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PKG = os.environ.get("LOADERX_NOCLIENT_PKG")
pytestmark = pytest.mark.skipif(
    not PKG, reason="needs the no-client build: `make test-noclient` (LOADERX_NOCLIENT_PKG)"
)

# The daemon transport's and the client's Linux calls (common/src/memfd.cc,
# unix_socket.cc, push_queue.cc, client/src): none may be linked in.
TRANSPORT_CALLS = {
    "memfd_create",
    "socket",
    "socketpair",
    "setsockopt",
    "getsockopt",
    "sendmsg",
    "sendmmsg",
    "recvmsg",
    "recvmmsg",
    "connect",
    "bind",
    "listen",
    "accept",
    "accept4",
    "shutdown",
    "send",
    "recv",
    "pthread_atfork",
}
# The Linux calls the embedded engine keeps, each with a macOS and a Windows
# counterpart (docs/platforms.md, "The embedded engine beyond Linux"):
# exactly these of the Linux-only or Linux-flavoured calls remain in the
# Linux no-client build.
ENGINE_LINUX_CALLS = {
    "renameat2",  # publish (Env)
    "sync_file_range",  # writeback hint (Env)
    "fdatasync",  # Env
    "flock",  # the writer's temporary directory
    "madvise",  # MADV_HUGEPAGE on mappings and batch buffers
    "gettid",  # gather_nice: the gather thread's own nice value
    "getpriority",
    "setpriority",
}
LINUX_ONLY = ENGINE_LINUX_CALLS | {
    "sched_setaffinity",
    "sched_getaffinity",
    "epoll_create1",
    "eventfd",
}

CHECK = r"""
import sys, warnings
import numpy as np
from loaderx import _loaderx
from loaderx.dataloader import DataLoader
from loaderx.errors import DaemonError
from loaderx.zrecord import Dense
from loaderx.zsampler import Sampler

pkg, work, sock = sys.argv[1:4]
assert _loaderx.__file__.startswith(pkg + "/loaderx/"), _loaderx.__file__
assert _loaderx.HAVE_DAEMON_CLIENT is False
for name in ("DaemonLoader", "LoaderSpec", "daemon_stats", "daemon_status"):
    assert not hasattr(_loaderx, name), name

x = np.arange(50 * 3, dtype=np.int32).reshape(50, 3)
with Dense.create(work + "/x", np.int32, (3,), codec="zstd") as w:
    w.append(x)
with Dense.open(work + "/x") as ds:
    # Embedded: sequential steps are consecutive slices; resuming gives step 2.
    with DataLoader({"x": ds}, batch_size=8, mode=Sampler.Mode.Sequential) as loader:
        first, second = next(loader)["x"], next(loader)["x"]
        state = loader.state_dict()
    assert first.dtype == np.int32 and first.shape == (8, 3)
    assert np.array_equal(first, x[0:8]) and np.array_equal(second, x[8:16])
    with DataLoader({"x": ds}, batch_size=8, mode=Sampler.Mode.Sequential) as loader:
        loader.load_state_dict(state)
        assert np.array_equal(next(loader)["x"], x[16:24])

    # daemon= with a loaderxd answering on sock: refused, naming the build and platform.
    for choice in (sock, True):
        try:
            DataLoader({"x": ds}, batch_size=8, daemon=choice)
        except DaemonError as e:
            assert isinstance(e, ConnectionError)
            assert "no loaderxd client" in str(e) and "this is linux" in str(e), str(e)
            assert "daemon=None" in str(e), str(e)
        else:
            raise AssertionError(f"daemon={choice!r} did not raise")

    # daemon="auto": one RuntimeWarning, then the embedded loader's batches.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = DataLoader({"x": ds}, batch_size=8, seed=3, daemon="auto")
    assert [type(w.message) for w in caught] == [RuntimeWarning], caught
    assert "no loaderxd client" in str(caught[0].message)
    idx = np.array(Sampler(50, 8, Sampler.Mode.Cyclic, 3).peek(0), copy=True)
    with loader:
        assert np.array_equal(next(loader)["x"], x[idx])
print("ok")
"""


def _module(pkg: Path) -> Path:
    (so,) = (pkg / "loaderx").glob("_loaderx.cpython-*.so")
    return so


def _undefined(so: Path) -> set[str]:
    """The dynamic symbols ``so`` needs from other objects, without versions."""
    nm = shutil.which("nm")
    assert nm, "nm (binutils) is needed"
    out = subprocess.run(
        [nm, "-D", "--undefined-only", str(so)], check=True, capture_output=True, text=True
    ).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def test_the_module_links_no_transport_call() -> None:
    assert PKG
    undefined = _undefined(_module(Path(PKG)))
    assert undefined & TRANSPORT_CALLS == set()
    assert undefined & LINUX_ONLY == ENGINE_LINUX_CALLS
    assert "memfd_create" not in undefined and "renameat2" in undefined
    # The same reading of the full build (the module this process imported) finds the client's calls.
    from loaderx import _loaderx

    if _loaderx.HAVE_DAEMON_CLIENT:
        assert {"connect", "recvmsg", "sendmsg", "socket"} <= _undefined(Path(_loaderx.__file__))


def test_import_round_trip_daemon_refused_and_auto_falls_back(daemon, tmp_path: Path) -> None:
    assert PKG
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LOADERXD_SOCKET")}
    env["PYTHONPATH"] = PKG
    env["LOADERXD_SOCKET"] = daemon.socket
    r = subprocess.run(
        [sys.executable, "-c", CHECK, PKG, str(tmp_path), daemon.socket],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 0 and r.stdout == "ok\n", r.stdout + r.stderr
    assert daemon.stats()["loaders"] == 0  # nothing reached the daemon
