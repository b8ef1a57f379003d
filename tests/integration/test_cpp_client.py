"""The installed C++ client: `cmake --install` + find_package(loaderx) + a real daemon.

Builds examples/cpp_client against an install prefix of this build (the way a
C++ training program would consume loaderx), then checks that it receives
from a real loaderxd exactly the batches the embedded Python DataLoader
produces for the same spec (digests of every stream's bytes, step by step).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, loaderxd_binary
from loaderx.dataloader import DataLoader


def _tool(name: str) -> str:
    venv = Path(sys.executable).parent / name
    found = str(venv) if venv.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is needed to build the C++ example (scripts/setup.sh installs it)")
    return found


def _run(cmd: list[str]) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


@pytest.fixture(scope="module")
def cpp_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = Path(loaderxd_binary()).resolve().parents[1]
    if not (build / "cmake_install.cmake").exists():
        pytest.fail(f"{build} is not a CMake build tree of this checkout")
    tmp = tmp_path_factory.mktemp("cpp")
    prefix, out = tmp / "prefix", tmp / "build"
    cmake = _tool("cmake")
    _run([cmake, "--install", str(build), "--prefix", str(prefix)])
    assert (prefix / "lib" / "cmake" / "loaderx" / "loaderxConfig.cmake").is_file()
    assert (prefix / "include" / "loaderx" / "client.h").is_file()
    _run([cmake, "-S", str(ROOT / "examples" / "cpp_client"), "-B", str(out), "-G", "Ninja",
          f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}", f"-DCMAKE_PREFIX_PATH={prefix}"])
    _run([cmake, "--build", str(out)])
    return out / "loaderx_cpp_client"


def _fnv1a(chunks: list[np.ndarray]) -> str:
    h = 0xCBF29CE484222325
    for c in chunks:
        for b in np.ascontiguousarray(c).tobytes():
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def test_installed_cpp_client_gets_the_embedded_batches(cpp_client: Path, daemon, stores) -> None:
    d = stores["dir"]
    paths = [str(d / "images"), str(d / "labels"), str(d / "tokens")]
    r = subprocess.run([str(cpp_client), daemon.socket, "16", "5", "--mode", "cyclic", "--seed", "3",
                        "--start", "2", *paths], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    got = r.stdout.splitlines()
    expected = []
    with DataLoader(stores["streams"], batch_size=16, mode="Cyclic", seed=3, start_step=2) as loader:
        for step in range(2, 7):
            batch = next(loader)
            for j, name in enumerate(["image", "label", "tokens"]):
                value = batch[name]
                chunks = list(value) if isinstance(value, list) else [value]
                expected.append(f"step {step} {j} {_fnv1a(chunks)}")
    assert got == expected


def test_cpp_client_names_a_missing_daemon(cpp_client: Path, tmp_path: Path, stores) -> None:
    sock = tmp_path / "nobody.sock"
    r = subprocess.run([str(cpp_client), str(sock), "4", "1", str(stores["dir"] / "labels")],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1
    assert f"{sock}: no socket here" in r.stderr


def test_cpp_client_refuses_a_bad_mode(cpp_client: Path, stores) -> None:
    r = subprocess.run([str(cpp_client), "/nonexistent", "4", "1", "--mode", "zigzag", "x"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2 and "unknown mode zigzag" in r.stderr
