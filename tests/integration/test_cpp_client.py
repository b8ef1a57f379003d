"""The installed C++ client: `cmake --install` + find_package(loaderx) + a real daemon.

Builds examples/cpp_client against an install prefix of this build (the way a
C++ training program would consume loaderx), then checks that it receives
from a real loaderxd exactly the batches the embedded Python DataLoader
produces for the same spec (digests of every stream's bytes, step by step).
Also checks the installed surface (docs/cpp-client.md "What is public"):
exactly the public headers are installed, each compiles on its own from the
prefix, nothing installed points into the source tree, and a program using
that API (cpp_surface/) builds from the prefix alone and works.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, loaderxd_binary
from loaderx import _loaderx
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


# The installed API (docs/cpp-client.md "What is public"). The protocol, ring,
# socket, memfd and thread-pool headers live in common/internal/ and must not
# be installed.
PUBLIC_HEADERS = {"batch_source.h", "client.h", "env.h", "fd.h", "group.h", "loader.h", "mix.h",
                  "pack.h", "platform.h", "sampler.h", "status.h", "store.h", "timeouts.h"}
INTERNAL_HEADERS = {"wire.h", "ring.h", "unix_socket.h", "memfd.h", "thread_pool.h"}


def _build_tree() -> Path:
    build = Path(loaderxd_binary()).resolve().parents[1]
    if not (build / "cmake_install.cmake").exists():
        pytest.fail(f"{build} is not a CMake build tree of this checkout")
    return build


@pytest.fixture(scope="module")
def prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`cmake --install` of this build into a staging prefix."""
    out = tmp_path_factory.mktemp("prefix")
    _run([_tool("cmake"), "--install", str(_build_tree()), "--prefix", str(out)])
    assert (out / "lib" / "cmake" / "loaderx" / "loaderxConfig.cmake").is_file()
    return out


def _build_against(prefix: Path, source: Path, out: Path) -> None:
    cmake = _tool("cmake")
    _run([cmake, "-S", str(source), "-B", str(out), "-G", "Ninja",
          f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}", f"-DCMAKE_PREFIX_PATH={prefix}"])
    _run([cmake, "--build", str(out)])


@pytest.fixture(scope="module")
def cpp_client(prefix: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cpp")
    _build_against(prefix, ROOT / "examples" / "cpp_client", out)
    return out / "loaderx_cpp_client"


def test_only_the_public_headers_are_installed(prefix: Path) -> None:
    installed = {p.relative_to(prefix / "include").as_posix() for p in (prefix / "include").rglob("*")
                 if p.is_file()}
    assert installed == {f"loaderx/{h}" for h in PUBLIC_HEADERS}
    assert not any((prefix / "include" / "loaderx" / h).exists() for h in INTERNAL_HEADERS)


def test_nothing_installed_points_into_the_source_tree(prefix: Path) -> None:
    cmake_files = list((prefix / "lib" / "cmake" / "loaderx").glob("*.cmake"))
    assert len(cmake_files) >= 3  # config, version, targets
    for f in cmake_files:
        assert str(ROOT) not in f.read_text(), f"{f.name} names the source tree"


def _cxx_compiler() -> str:
    cache = (_build_tree() / "CMakeCache.txt").read_text()
    for line in cache.splitlines():
        if line.startswith("CMAKE_CXX_COMPILER:"):
            return line.split("=", 1)[1]
    pytest.fail("no CMAKE_CXX_COMPILER in the build's CMakeCache.txt")


@pytest.mark.parametrize("header", sorted(PUBLIC_HEADERS))
def test_each_installed_header_compiles_on_its_own(prefix: Path, tmp_path: Path, header: str) -> None:
    src = tmp_path / "one.cc"
    src.write_text(f'#include "loaderx/{header}"\n#include "loaderx/{header}"\nint main() {{ return 0; }}\n')
    _run([_cxx_compiler(), "-std=c++20", "-fsyntax-only", "-Wall", "-Werror", "-I",
          str(prefix / "include"), str(src)])


def test_a_program_built_from_the_installed_prefix_alone_uses_the_public_api(
        prefix: Path, tmp_path: Path, daemon, stores) -> None:
    out = tmp_path / "surface"
    _build_against(prefix, Path(__file__).parent / "cpp_surface", out)
    commands = json.loads((out / "compile_commands.json").read_text())
    assert len(commands) == 1
    flags = shlex.split(commands[0]["command"])
    includes = [flags[i + 1] for i, f in enumerate(flags) if f in ("-I", "-isystem")]
    includes += [f[2:] for f in flags if f.startswith("-I") and len(f) > 2]
    assert includes, flags
    assert not [i for i in includes if i.startswith(str(ROOT))], includes

    r = subprocess.run([str(out / "loaderx_surface"), daemon.socket, str(stores["dir"] / "labels")],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    lines, _, document = r.stdout.partition("status:\n")
    lines = lines.splitlines()
    assert lines[:4] == ["records 200", f"hello {_loaderx.PROTOCOL_VERSION} heartbeat_ms 250", "step 0 0 3 6 9",
                         "step 1 12 15 18 21"]
    assert {x.removeprefix("counter ") for x in lines[4:]} == set(daemon.stats())
    assert all(x.startswith("counter ") for x in lines[4:])

    _, python_document = _loaderx.daemon_status(daemon.socket)
    assert set(json.loads(document)) == set(json.loads(python_document))


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
