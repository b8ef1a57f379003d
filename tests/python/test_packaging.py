"""Installing loaderx-engine as a user would (README, "Installing").

One build of the extension in the default suite: ``pip wheel git+file://<this
repository>`` in a fresh venv, i.e. pip's own fresh clone of HEAD (no .deps/:
zstd 1.5.7 is fetched at configure time) built in pip's isolated environment.
That wheel is installed into the venv that built it (a store round trip),
then repaired by ``scripts/wheel.py`` (``make wheel``'s auditwheel step) and
installed into a bare venv whose PATH holds no compiler, where the README
example runs embedded and through the wheel's own ``loaderxd``.

The sdist is built and inspected (it carries zstd 1.5.7 and the version);
building and installing it is a second compile of several minutes, run by
``make test-install`` (``LOADERX_TEST_SDIST_BUILD=1``). HEAD is what is built:
uncommitted changes are not.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from loaderx import __version__

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# A compile of the extension takes minutes on two cores, more on a busy box.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

ROUND_TRIP = """
import sys, numpy as np, loaderx
from loaderx.zrecord import Dense, Ragged
x = np.arange(600, dtype=np.int32).reshape(100, 2, 3)
with Dense.create(sys.argv[1] + "/d", np.int32, (2, 3), codec="zstd") as w:
    w.append(x)
with Ragged.create(sys.argv[1] + "/r", np.uint8, 1, codec="zstd_dict", dict_bytes=b"loaderx" * 64) as w:
    w.append([np.full(n, n, np.uint8) for n in range(50)])
with Dense.open(sys.argv[1] + "/d") as d, Ragged.open(sys.argv[1] + "/r") as r:
    assert np.array_equal(d[[99, 0, 5]], x[[99, 0, 5]]) and d.dtype == np.int32
    assert [len(a) for a in r[[7, 0, 49]]] == [7, 0, 49] and (r[49] == 49).all()
    print(loaderx.__version__, loaderx.__file__)
"""


def _env(path: str | None = None) -> dict[str, str]:
    """The environment without this checkout on sys.path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "LOADERXD_SOCKET")}
    if path is not None:
        env["PATH"] = path
    return env


def _run(cmd: list, *, log: Path | None = None, path: str | None = None, cwd: Path | None = None,
         timeout: float = 2000) -> subprocess.CompletedProcess[str]:
    """Runs ``cmd``; with ``log``, its output goes there (a build log is long)."""
    args = [str(c) for c in cmd]
    if log is None:
        return subprocess.run(args, check=False, capture_output=True, text=True, env=_env(path), cwd=cwd, timeout=timeout)
    with open(log, "w") as f:
        r = subprocess.run(args, check=False, stdout=f, stderr=subprocess.STDOUT, text=True, env=_env(path), cwd=cwd,
                           timeout=timeout)
    r.stdout = log.read_text(errors="replace")
    return r


def _ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, f"{r.args} exited {r.returncode}:\n{r.stdout[-6000:]}\n{(r.stderr or '')[-3000:]}"
    return r.stdout


def _venv(path: Path, system_site_packages: bool = False) -> Path:
    """A fresh venv with pip (the base interpreter's, as a user gets); its bin/."""
    site = ["--system-site-packages"] if system_site_packages else []
    subprocess.run([sys.executable, "-m", "venv", *site, str(path)], check=True, timeout=300, env=_env())
    return path / "bin"


def _round_trip(bindir: Path, tmp: Path, path: str | None = None) -> None:
    out = _ok(_run([bindir / "python", "-c", ROUND_TRIP, tmp], path=path, cwd=tmp))
    version, where = out.split()
    assert version == __version__
    assert Path(where).is_relative_to(bindir.parent)  # the installed package, not the checkout


@pytest.fixture(scope="module")
def clone_wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(the venv's bin/, the wheel) from ``pip wheel git+file://ROOT``."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: no HEAD to clone")
    tmp = tmp_path_factory.mktemp("clone")
    bindir = _venv(tmp / "venv")
    log = tmp / "build.log"
    _ok(_run([bindir / "python", "-m", "pip", "wheel", "-v", "--no-deps", "-w", tmp / "wheels",
              f"git+file://{ROOT}"], log=log))
    text = log.read_text(errors="replace")
    # The clone has no .deps/: zstd 1.5.7 came from the fetch, not the system.
    assert "zstd: fetching zstd 1.5.7" in text
    assert re.search(r"zstd: vendored, \S+/_deps/zstd-1\.5\.7", text), text[-6000:]
    (wheel,) = (tmp / "wheels").glob("loaderx_engine-*.whl")
    yield bindir, wheel


def test_a_plain_clone_installs_with_pip(clone_wheel: tuple[Path, Path], tmp_path: Path) -> None:
    bindir, wheel = clone_wheel
    assert wheel.name.startswith(f"loaderx_engine-{__version__}-cp3")
    _ok(_run([bindir / "python", "-m", "pip", "install", "-q", wheel]))
    _round_trip(bindir, tmp_path)
    assert _ok(_run([bindir / "loaderx", "--version"])) == f"loaderx-engine {__version__}\n"
    assert _ok(_run([bindir / "loaderxd", "--version"])) == f"loaderxd {__version__}\n"
    show = _ok(_run([bindir / "python", "-m", "pip", "show", "loaderx-engine"]))
    assert f"\nVersion: {__version__}\n" in show
    # Upstream's distribution is a different one: nothing named `loaderx` is installed.
    assert _run([bindir / "python", "-m", "pip", "show", "loaderx"]).returncode == 1


README_CHECK = """
import os, re, sys, time
import numpy as np
from loaderx.client import connect
from loaderx.dataloader import DataLoader
from loaderx.errors import DaemonError
from loaderx.zrecord import Dense
deadline = time.monotonic() + 30
while True:  # the socket exists from bind(); wait for listen()
    try:
        daemon = connect(os.environ["LOADERXD_SOCKET"])
        break
    except DaemonError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
text = open(sys.argv[1], encoding="utf-8").read()
embedded = re.findall(r"```python\\n(.*?)```", text, flags=re.DOTALL)[0]
ns = {}
exec(compile(embedded, "README.md", "exec"), ns)
batch = ns["batch"]["x"]
assert batch.shape == (256, 28, 28) and batch.dtype == np.uint8 and ns["state"]["step"] == 1
# The README's loaderxd line (`daemon=True`: $LOADERXD_SOCKET): the same batch.
with Dense.open("demo/x") as ds, DataLoader({"x": ds}, batch_size=256, daemon=True) as loader:
    served = next(loader)["x"]
assert np.array_equal(served, batch)
print(daemon.stats()["daemon"]["pid"])
"""


def test_the_manylinux_wheel_runs_the_readme_in_a_bare_venv(clone_wheel: tuple[Path, Path],
                                                            tmp_path: Path) -> None:
    _, raw = clone_wheel
    r = _run([sys.executable, ROOT / "scripts" / "wheel.py", "--repair", raw, tmp_path / "dist"])
    wheel = Path(_ok(r).strip().splitlines()[-1])
    assert re.fullmatch(rf"loaderx_engine-{re.escape(__version__)}-cp3\d+-cp3\d+-manylinux_2_\d+_x86_64"
                        r"(\.manylinux\w+)*\.whl", wheel.name), wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert any(re.fullmatch(r"loaderx/_loaderx\.cpython-3\d+-x86_64-linux-gnu\.so", n) for n in names)
    # auditwheel grafted libxxhash and moved loaderxd next to it, behind an exec shim.
    assert any(re.fullmatch(r"loaderx_engine\.libs/libxxhash-\w+\.so[.\d]*", n) for n in names), names
    assert {"loaderx_engine.scripts/loaderxd", f"loaderx_engine-{__version__}.data/scripts/loaderxd"} <= set(names)

    _readme_in_a_bare_venv(wheel, tmp_path)


def _readme_in_a_bare_venv(wheel: Path, tmp_path: Path, offline: bool = False) -> None:
    """Installs ``wheel`` into a fresh venv with no compiler on PATH and runs the
    README example embedded and through the wheel's own ``loaderxd``. ``offline``:
    no package index; NumPy, msgpack and tqdm come from the interpreter's own
    site-packages (Debian's python3-numpy and the rest, in the arm64 root)."""
    bindir = _venv(tmp_path / "bare", system_site_packages=offline)
    path = str(bindir)  # no compiler, no /usr/bin: nothing can be built
    for tool in ("cc", "gcc", "g++", "c++", "cmake", "ninja"):
        assert shutil.which(tool, path=path) is None, tool
    index = ["--no-index"] if offline else []
    _ok(_run([bindir / "python", "-m", "pip", "install", "-q", *index, "--only-binary", ":all:", wheel],
             path=path))
    _round_trip(bindir, tmp_path, path)

    sock = tmp_path / "d.sock"
    with open(tmp_path / "loaderxd.log", "wb") as log:
        daemon = subprocess.Popen([bindir / "loaderxd", "--foreground", "--socket", sock, "--threads", "2"],
                                  env=_env(path), stderr=log)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert daemon.poll() is None, (tmp_path / "loaderxd.log").read_text()
            assert time.monotonic() < deadline, "loaderxd did not listen within 30 s"
            time.sleep(0.05)
        work = tmp_path / "work"
        work.mkdir()
        cmd = [bindir / "python", "-c", README_CHECK, README]
        r = subprocess.run([str(c) for c in cmd], check=False, capture_output=True, text=True, cwd=work, timeout=600,
                           env={**_env(path), "LOADERXD_SOCKET": str(sock)})
        assert _ok(r).strip() == str(daemon.pid)  # served by the wheel's loaderxd
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)


@pytest.mark.skipif(not os.environ.get("LOADERX_TEST_WHEEL"),
                    reason="a wheel built beforehand: `make test-wheel-aarch64` runs it (LOADERX_TEST_WHEEL)")
def test_a_built_wheel_runs_the_readme_in_a_bare_venv(tmp_path: Path) -> None:
    # LOADERX_TEST_WHEEL: a repaired wheel for this machine (the aarch64 one in the
    # arm64 root, under qemu); LOADERX_TEST_WHEEL_OFFLINE=1: no package index.
    wheel = Path(os.environ["LOADERX_TEST_WHEEL"])
    machine = os.uname().machine
    assert re.fullmatch(rf"loaderx_engine-{re.escape(__version__)}-cp{sys.version_info[0]}{sys.version_info[1]}"
                        rf"-cp\d+-manylinux_2_\d+_{machine}(\.manylinux\w+)*\.whl", wheel.name), wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    assert any(re.fullmatch(rf"loaderx/_loaderx\.cpython-3\d+-{machine}-linux-gnu\.so", n) for n in names), names
    assert "loaderx_engine.scripts/loaderxd" in names
    _readme_in_a_bare_venv(wheel, tmp_path, offline=os.environ.get("LOADERX_TEST_WHEEL_OFFLINE") == "1")


def _sdist(out: Path) -> Path:
    """`make sdist`'s command, into ``out``."""
    code = "import sys; from scikit_build_core.build import build_sdist; print(build_sdist(sys.argv[1]))"
    r = _run([sys.executable, "-c", code, out], cwd=ROOT)
    return out / _ok(r).strip().splitlines()[-1]


def test_the_sdist_carries_zstd_and_the_version(tmp_path: Path) -> None:
    if not (ROOT / ".deps" / "zstd-1.5.7" / "zstd.c").is_file():
        pytest.skip("no .deps/zstd-1.5.7 in this checkout (scripts/setup.sh unpacks it)")
    sdist = _sdist(tmp_path)
    top = f"loaderx_engine-{__version__}"
    assert sdist.name == f"{top}.tar.gz"
    with tarfile.open(sdist) as tar:
        names = set(tar.getnames())
        meta = tar.extractfile(f"{top}/PKG-INFO").read().decode()  # type: ignore[union-attr]
    for name in ("zstd.c", "zstd.h", "zdict.h", "zstd_errors.h", "LICENSE"):
        assert f"{top}/.deps/zstd-1.5.7/{name}" in names
    assert {f"{top}/python/loaderx/_version.py", f"{top}/scripts/fetch_zstd.py"} <= names
    assert not any("/build/" in n or "/.venv/" in n or n.endswith(".so") for n in names)
    assert "\nName: loaderx-engine\n" in meta and f"\nVersion: {__version__}\n" in meta


@pytest.mark.skipif(not os.environ.get("LOADERX_TEST_SDIST_BUILD"),
                    reason="a second compile: `make test-install` runs it (LOADERX_TEST_SDIST_BUILD=1)")
def test_the_sdist_installs_with_pip(tmp_path: Path) -> None:
    if not (ROOT / ".deps" / "zstd-1.5.7" / "zstd.c").is_file():
        pytest.skip("no .deps/zstd-1.5.7 in this checkout (scripts/setup.sh unpacks it)")
    sdist = _sdist(tmp_path)
    bindir = _venv(tmp_path / "venv")
    log = tmp_path / "build.log"
    _ok(_run([bindir / "python", "-m", "pip", "install", "-v", sdist], log=log))
    text = log.read_text(errors="replace")
    assert "zstd: fetching" not in text  # the sdist's own copy
    assert re.search(r"zstd: vendored, \S+/\.deps/zstd-1\.5\.7", text), text[-6000:]
    _round_trip(bindir, tmp_path)
