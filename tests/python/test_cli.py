"""The loaderx command line, run as a subprocess (``python -m loaderx``)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import loaderx
import numpy as np
import pytest
from loaderx.zrecord import Dense, Ragged

PKG_ROOT = str(Path(loaderx.__file__).resolve().parent.parent)


ENV = dict(os.environ, PYTHONPATH=PKG_ROOT)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loaderx", *args], capture_output=True, text=True,
                          env=ENV, timeout=120, check=False)


@pytest.fixture()
def dense(tmp_path: Path) -> Path:
    """20 raw records of 64 bytes in one shard: record i is at offset 64 * i."""
    data = np.arange(20 * 64, dtype=np.uint8).reshape(20, 64)
    with Dense.create(tmp_path / "d", np.uint8, (64,), codec="raw", data_shards=1) as ds:
        ds.append(data)
    return tmp_path / "d"


def test_info_json_reports_exact_values(dense: Path) -> None:
    r = run("info", str(dense), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    stored = sum(f.stat().st_size for f in dense.iterdir())
    assert info == {"path": str(dense), "kind": "dense", "dtype": "|u1", "dtype_name": "uint8",
                    "item_shape": [64], "count": 20, "codec": "raw", "data_shards": 1,
                    "logical_bytes": 1280, "stored_bytes": stored,
                    "ratio": round(1280 / stored, 3)}


def test_info_text_for_ragged(tmp_path: Path) -> None:
    with Ragged.create(tmp_path / "r", np.int32, 2, codec="zstd") as rs:
        rs.append([np.zeros((k, 3), np.int32) for k in range(10)])
    r = run("info", str(tmp_path / "r"))
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(None, 1) for line in r.stdout.splitlines())
    assert lines["kind"] == "ragged"
    assert lines["dtype"] == "<i4 (int32)"
    assert lines["ndim"].startswith("2")
    assert lines["records"] == "10"
    assert lines["codec"] == "zstd"
    assert lines["data_shards"] == "4"
    assert lines["logical"] == f"{45 * 3 * 4} B"
    assert lines["ratio"].endswith("(logical / stored)")


def test_verify_good_store_exits_zero(dense: Path) -> None:
    r = run("verify", str(dense))
    assert r.returncode == 0, r.stderr
    assert "OK (20 records" in r.stdout


def test_verify_names_the_bad_block_and_its_records(dense: Path) -> None:
    # Format 1.1 checksums data in 64 KiB blocks (docs/format.md): verify names
    # the file, the block's bytes and the records in it.
    data = dense / "data-000"
    b = bytearray(data.read_bytes())
    b[64 * 7 + 5] ^= 0xFF
    b[64 * 12] ^= 0xFF
    data.write_bytes(bytes(b))
    r = run("verify", str(dense), "--quiet")
    assert r.returncode == 1
    assert "CorruptStoreError" in r.stderr
    assert f"data-000: checksum mismatch in bytes 0..{len(b) - 1} (records 0..19)" in r.stderr


def test_verify_truncated_index(dense: Path) -> None:
    idx = dense / "index"
    idx.write_bytes(idx.read_bytes()[:-1])
    r = run("verify", str(dense))
    assert r.returncode == 1
    assert f"{dense}/index: size" in r.stderr


def test_info_on_a_corrupt_metadata(dense: Path) -> None:
    meta = dense / "meta"
    b = bytearray(meta.read_bytes())
    b[10] ^= 1
    meta.write_bytes(bytes(b))
    r = run("info", str(dense))
    assert r.returncode == 1
    assert "metadata checksum mismatch" in r.stderr


def test_missing_store_and_usage_errors(tmp_path: Path) -> None:
    r = run("info", str(tmp_path / "nope"))
    assert r.returncode == 1 and "StoreNotFoundError" in r.stderr
    assert run().returncode == 2
    assert run("frobnicate").returncode == 2


def test_main_is_callable_in_process(dense: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from loaderx.cli import main

    assert main(["verify", str(dense), "-q"]) == 0
    assert "OK" in capsys.readouterr().out


def test_version_is_the_distribution_and_version_of_the_one_source() -> None:
    """python/loaderx/_version.py is where the name and version are written:
    the package, the CLI and pyproject.toml's metadata all read it (loaderxd:
    tests/integration/test_daemon.py)."""
    import tomllib
    from loaderx import _version

    assert loaderx.__version__ == _version.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", loaderx.__version__)
    r = run("--version")
    assert r.returncode == 0 and r.stdout == f"loaderx-engine {loaderx.__version__}\n"
    meta = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert meta["project"]["name"] == _version.DISTRIBUTION == "loaderx-engine"
    assert "version" not in meta["project"] and meta["project"]["dynamic"] == ["version"]
    assert meta["tool"]["scikit-build"]["metadata"]["version"]["input"] == "python/loaderx/_version.py"


def test_import_warns_when_upstream_loaderx_is_installed_beside_it(tmp_path: Path) -> None:
    """Both distributions install loaderx/: the second one over the first
    leaves a mix, which pip cannot prevent (docs/compat.md, "Installing")."""
    site = tmp_path / "site"
    shutil.copytree(Path(loaderx.__file__).parent, site / "loaderx",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    (site / f"loaderx_engine-{loaderx.__version__}.dist-info").mkdir()
    cmd = [sys.executable, "-W", "error::RuntimeWarning", "-c", "import loaderx"]
    env = {**os.environ, "PYTHONPATH": str(site)}
    assert subprocess.run(cmd, env=env, capture_output=True, text=True, check=False).returncode == 0
    (site / "loaderx-2.8.19.dist-info").mkdir()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    assert r.returncode == 1
    assert (f"RuntimeWarning: loaderx-engine and upstream's loaderx 2.8.19 are both installed in {site}: "
            "both install the loaderx package") in r.stderr
    assert "pip uninstall -y loaderx loaderx-engine && pip install loaderx-engine" in r.stderr


def test_a_new_store_names_its_writer_with_the_one_version(tmp_path: Path) -> None:
    import msgpack

    with Dense.create(tmp_path / "x", np.uint8, (), codec="raw") as w:
        w.append(np.arange(3, dtype=np.uint8))
    meta = next(iter(msgpack.Unpacker(io.BytesIO((tmp_path / "x" / "meta").read_bytes()), raw=False)))
    assert meta["writer"] == f"loaderx-engine {loaderx.__version__}"


def test_errors_are_one_line_unless_debug(tmp_path: Path) -> None:
    r = run("verify", str(tmp_path / "nope"))
    assert r.returncode == 1
    assert r.stderr == f"loaderx verify: StoreNotFoundError: {tmp_path / 'nope'}: no such store\n"
    for args in (("--debug", "verify", str(tmp_path / "nope")),
                 ("verify", str(tmp_path / "nope"), "--debug")):
        r = run(*args)
        assert r.returncode == 1
        assert "Traceback (most recent call last)" in r.stderr and "StoreNotFoundError" in r.stderr


def test_usage_errors_exit_2(dense: Path) -> None:
    for args in ((), ("frobnicate",), ("info",), ("bench", str(dense), "--batch", "0"),
                 ("convert", "a", "b", "--codec", "lz4")):
        r = run(*args)
        assert r.returncode == 2, args
        assert "usage: loaderx" in r.stderr


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    for k in range(30):  # a directory of stores: one line each, more than a pipe read takes
        with Dense.create(tmp_path / "root" / f"s{k:02d}", np.int16, (2,), codec="raw") as w:
            w.append(np.zeros((k + 1, 2), np.int16))
    p = subprocess.Popen([sys.executable, "-m", "loaderx", "info", str(tmp_path / "root")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # the reader is gone before the command writes a byte
    err = p.stderr.read()
    assert p.wait(timeout=120) == 141
    assert err == b""


def test_progress_bar_only_on_a_terminal(dense: Path) -> None:
    import fcntl
    import pty
    import struct
    import termios

    r = run("verify", str(dense))  # stderr is a pipe: no bar, no carriage returns anywhere
    assert r.returncode == 0 and r.stderr == "" and "\r" not in r.stdout
    master, slave = pty.openpty()
    # A new pty is 0x0; tqdm draws nothing in zero columns.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    try:
        p = subprocess.run([sys.executable, "-m", "loaderx", "verify", str(dense)],
                           stdout=subprocess.PIPE, stderr=slave, env=ENV, timeout=120, check=False)
        os.close(slave)
        tty = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other side is closed
                break
            if not chunk:
                break
            tty += chunk
    finally:
        os.close(master)
    assert p.returncode == 0
    assert b"verify" in tty and b"\r" in tty  # tqdm redraws in place on a terminal
    assert b"\r" not in p.stdout


def test_info_of_a_directory_of_stores(tmp_path: Path) -> None:
    root = tmp_path / "conv"
    with Dense.create(root / "train" / "label", np.int64, (), codec="zstd") as w:
        w.append(np.arange(7, dtype=np.int64))
    with Ragged.create(root / "train" / "tok", np.int32, 1, codec="raw") as rs:
        rs.append([np.arange(k, dtype=np.int32) for k in range(7)])
    r = run("info", str(root), "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["root"] == str(root)
    assert [(s["path"], s["kind"], s["count"]) for s in got["stores"]] == [
        ("train/label", "dense", 7), ("train/tok", "ragged", 7)]
    r = run("info", str(root))
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("train/label  dense   int64")
    assert "7 records" in lines[1] and "ndim=1" in lines[1]


def test_train_dict_writes_a_usable_dictionary(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    recs = [rng.integers(0, 50, 40 + k % 30).astype(np.int32) for k in range(3000)]
    with Ragged.create(tmp_path / "tok", np.int32, 1, codec="raw") as rs:
        rs.append(recs)
    r = run("train-dict", str(tmp_path / "tok"), str(tmp_path / "tok.dict"), "--size", "4096")
    assert r.returncode == 0, r.stderr
    d = (tmp_path / "tok.dict").read_bytes()
    assert 0 < len(d) <= 4096
    with Ragged.create(tmp_path / "z", np.int32, 1, codec="zstd_dict", dict_bytes=d) as rs:
        rs.append(recs)
    with Ragged.open(tmp_path / "z") as rs:
        assert all(np.array_equal(a, b) for a, b in zip(rs[:], recs))
    again = run("train-dict", str(tmp_path / "tok"), str(tmp_path / "tok.dict"))
    assert again.returncode == 1 and "already exists" in again.stderr
    assert (tmp_path / "tok.dict").read_bytes() == d


def test_bench_reports_both_backends(dense: Path, tmp_path: Path) -> None:
    r = run("bench", str(dense), "--batch", "8", "--plans", "3", "--seconds", "0.05", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["batch"] == 8 and got["records_in_numpy"] == 20
    assert [row["backend"] for row in got["results"]] == ["loaderx", "numpy"]
    for row in got["results"]:
        assert row["batches"] >= 3 and row["records_per_s"] == pytest.approx(
            row["batches_per_s"] * 8)
        assert row["mib_per_s"] == pytest.approx(row["batches_per_s"] * 8 * 64 / (1 << 20))
    with Ragged.create(tmp_path / "r", np.int32, 2, codec="zstd") as rs:
        rs.append([np.ones((k % 4, 3), np.int32) for k in range(50)])
    r = run("bench", str(tmp_path / "r"), "--batch", "5", "--seconds", "0.05")
    assert r.returncode == 0, r.stderr
    assert "ragged" in r.stdout and "ratio" in r.stdout


def test_convert_command(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    feats = datasets.Features({"x": datasets.Sequence(datasets.Value("int16")),
                               "label": datasets.ClassLabel(names=["a", "b"])})
    xs = [np.arange(k, dtype=np.int16) for k in range(9)]
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(
        {"x": xs, "label": [k % 2 for k in range(9)]}, features=feats)}).save_to_disk(
        str(tmp_path / "src"))
    r = run("convert", str(tmp_path / "src"), str(tmp_path / "out"), "--codec", "raw")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{tmp_path / 'out'}: 1 split(s), 9 records\n"
    assert "\r" not in r.stderr  # not a terminal: no progress bar
    with Ragged.open(tmp_path / "out" / "train" / "x") as rs:
        assert all(np.array_equal(a, b) for a, b in zip(rs[:], xs))
    with Dense.open(tmp_path / "out" / "train" / "label") as ds:
        assert ds[:].tolist() == [k % 2 for k in range(9)]
    datasets.Dataset.from_dict({"s": ["a", "b"]}).save_to_disk(str(tmp_path / "strings"))
    r = run("convert", str(tmp_path / "strings"), str(tmp_path / "out2"))
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "SchemaError: column 's'" in r.stderr
    assert not (tmp_path / "out2").exists()


def test_info_shows_store_metadata(tmp_path: Path) -> None:
    meta = {"class_names": ["cat", "dog"], "image_layout": "CHW"}
    with Dense.create(tmp_path / "m", np.int64, (), codec="raw", metadata=meta) as w:
        w.append(np.zeros(2, np.int64))
    r = run("info", str(tmp_path / "m"), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["metadata"] == meta
    r = run("info", str(tmp_path / "m"))
    assert f"metadata     {json.dumps(meta, sort_keys=True)}" in r.stdout.splitlines()
