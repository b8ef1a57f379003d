"""The loaderx command line, run as a subprocess (``python -m loaderx``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import loaderx
import numpy as np
import pytest
from loaderx.zrecord import Dense, Ragged

PKG_ROOT = str(Path(loaderx.__file__).resolve().parent.parent)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=PKG_ROOT)
    return subprocess.run([sys.executable, "-m", "loaderx", *args], capture_output=True, text=True,
                          env=env, timeout=120, check=False)


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


def test_verify_names_the_first_bad_record(dense: Path) -> None:
    data = dense / "data-000"
    b = bytearray(data.read_bytes())
    b[64 * 7 + 5] ^= 0xFF
    b[64 * 12] ^= 0xFF
    data.write_bytes(bytes(b))
    r = run("verify", str(dense), "--quiet")
    assert r.returncode == 1
    assert "CorruptStoreError" in r.stderr
    assert "record 7 (data-000): checksum mismatch" in r.stderr


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
