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
from typing import Any

import loaderx
import numpy as np
import pytest
from loaderx import _loaderx
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

    assert main(["verify", str(dense)]) == 0
    assert capsys.readouterr().out == f"{dense}: OK (20 records, every checksum verified)\n"
    assert main(["verify", str(dense), "-q"]) == 0
    assert capsys.readouterr().out == ""


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


# -- a converter output folder, the source argument, -q, codecs --------------------------------


def hf_small(root: Path) -> Path:
    """A save_to_disk DatasetDict: train (5 records) and test (3), columns x (ragged int16)
    and label (ClassLabel -> dense int64)."""
    datasets = pytest.importorskip("datasets")
    feats = datasets.Features({"x": datasets.Sequence(datasets.Value("int16")),
                               "label": datasets.ClassLabel(names=["a", "b"])})

    def split(lo: int, hi: int) -> Any:
        return datasets.Dataset.from_dict(
            {"x": [np.arange(k, dtype=np.int16) for k in range(lo, hi)],
             "label": [k % 2 for k in range(lo, hi)]}, features=feats)
    datasets.DatasetDict({"train": split(0, 5), "test": split(5, 8)}).save_to_disk(str(root))
    return root


@pytest.fixture()
def conv(tmp_path: Path) -> Path:
    """`loaderx convert hf_small conv`: four stores, test/{label,x} and train/{label,x}."""
    src = hf_small(tmp_path / "hf_small")
    r = run("convert", str(src), str(tmp_path / "conv"), "--codec", "raw")
    assert r.returncode == 0, r.stderr
    return tmp_path / "conv"


CONV_STORES = [("test/label", 3), ("test/x", 3), ("train/label", 5), ("train/x", 5)]


def test_verify_checks_every_store_of_a_converter_output(conv: Path) -> None:
    r = run("verify", str(conv))
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout.splitlines() == [
        *(f"{name}: OK ({n} records, every checksum verified)" for name, n in CONV_STORES),
        f"{conv}: OK (4 stores, 16 records, every checksum verified)"]


def test_verify_of_a_converter_output_names_every_bad_store_and_goes_on(conv: Path) -> None:
    for name in ("test/x", "train/label"):
        data = conv / name / "data-000"
        b = bytearray(data.read_bytes())
        b[0] ^= 0xFF
        data.write_bytes(bytes(b))
    r = run("verify", str(conv))
    assert r.returncode == 1
    assert r.stdout.splitlines() == ["test/label: OK (3 records, every checksum verified)",
                                     "train/x: OK (5 records, every checksum verified)"]
    err = r.stderr.splitlines()
    assert len(err) == 3, r.stderr
    assert err[0].startswith(f"loaderx verify: CorruptStoreError: {conv}/test/x/data-000: "
                             "checksum mismatch")
    assert err[1].startswith(f"loaderx verify: CorruptStoreError: {conv}/train/label/data-000: "
                             "checksum mismatch")
    assert err[2] == f"loaderx verify: {conv}: 2 of 4 stores failed verification"


def test_bench_times_every_store_of_a_converter_output(conv: Path) -> None:
    r = run("bench", str(conv), "--batch", "2", "--plans", "2", "--seconds", "0.02", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["root"] == str(conv)
    assert [(s["store"], s["records_in_numpy"]) for s in got["stores"]] == CONV_STORES
    for s in got["stores"]:
        assert s["batch"] == 2
        assert [row["backend"] for row in s["results"]] == ["loaderx", "numpy"]
    r = run("bench", str(conv), "--batch", "2", "--plans", "2", "--seconds", "0.02")
    assert r.returncode == 0, r.stderr
    heads = [line for line in r.stdout.splitlines() if not line.startswith(" ")]
    assert [h.split(":")[0] for h in heads] == [name for name, _ in CONV_STORES]
    assert "test/x: ragged <i2 codec=raw" in heads[1]


def test_info_verify_and_bench_list_the_same_stores(conv: Path) -> None:
    info = json.loads(run("info", str(conv), "--json").stdout)
    assert [(s["path"], s["count"]) for s in info["stores"]] == CONV_STORES
    # train-dict takes one store: it says what the folder is and what to pass.
    r = run("train-dict", str(conv), str(conv.parent / "d.dict"))
    assert r.returncode == 1
    assert r.stderr == (f"loaderx train-dict: InvalidArgumentError: {conv}: a directory of 4 stores "
                        f"(a converter output), not one store; pass one of them, e.g. "
                        f"{conv}/test/label\n")


def test_a_directory_without_stores_is_not_called_corrupt(tmp_path: Path) -> None:
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    for cmd in ("info", "verify", "bench"):
        r = run(cmd, str(tmp_path / "empty"))
        assert r.returncode == 1, cmd
        assert r.stderr == (f"loaderx {cmd}: StoreNotFoundError: {tmp_path / 'empty'}: no Zrecord "
                            "store here or below (a store is a directory with a 'meta' file)\n"), cmd


def test_convert_refuses_a_missing_local_path_before_the_network(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    for source in ("nope", "./nope", "data/nope", "a/b/c", str(tmp_path / "nope"), "nope/"):
        r = subprocess.run([sys.executable, "-m", "loaderx", "convert", source, "out"],
                           capture_output=True, text=True, env=ENV, timeout=120, check=False,
                           cwd=tmp_path)
        assert r.returncode == 1, source
        assert r.stderr.startswith(f"loaderx convert: FileNotFoundError: {source}: no such "
                                   "directory"), (source, r.stderr)
        assert r.stderr.count("\n") == 1
        assert "ConnectError" not in r.stderr
    (tmp_path / "data" / "train.csv").write_text("x\n1\n")  # a file is not a Hub id either
    r = run("convert", str(tmp_path / "data" / "train.csv"), str(tmp_path / "out"))
    assert r.returncode == 1
    assert r.stderr.startswith(f"loaderx convert: NotADirectoryError: {tmp_path}/data/train.csv: "
                               "not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


def test_convert_sends_owner_name_or_hub_to_the_hub(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("datasets")
    import huggingface_hub
    from loaderx.cli import main

    snapshot = hf_small(tmp_path / "snapshot")
    asked: list[str] = []

    class FakeApi:
        def __init__(self, endpoint: str | None = None, token: str | None = None) -> None:
            pass

        def dataset_info(self, repo_id: str, revision: str) -> Any:
            asked.append(repo_id)
            return type("Info", (), {"sha": "0" * 40})()

    def fake_snapshot(repo_id: str, **kwargs: Any) -> str:
        return str(tmp_path / "files")

    files = tmp_path / "files"
    files.mkdir()
    import datasets

    datasets.load_from_disk(str(snapshot))["train"].to_parquet(str(files / "train.parquet"))
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    monkeypatch.chdir(tmp_path)
    assert main(["convert", "someone/data", "o1", "-q"]) == 0
    assert main(["convert", "mnist", "o2", "-q", "--hub"]) == 0
    assert main(["convert", "mnist", "o3", "-q"]) == 1  # a bare word: a missing local path
    (tmp_path / "someone").mkdir()  # `someone/data` now looks local: refused, unless --hub
    assert main(["convert", "someone/data", "o4", "-q"]) == 1
    assert main(["convert", "someone/data", "o5", "-q", "--hub"]) == 0
    assert asked == ["someone/data", "mnist", "someone/data"]
    with Dense.open(tmp_path / "o1" / "train" / "label") as ds:
        assert ds[:].tolist() == [0, 1, 0, 1, 0]
    assert not (tmp_path / "o3").exists() and not (tmp_path / "o4").exists()


def test_quiet_prints_nothing_on_success(tmp_path: Path, dense: Path) -> None:
    src = hf_small(tmp_path / "hf_small")
    r = run("convert", str(src), str(tmp_path / "conv"), "-q")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    for target in (dense, tmp_path / "conv"):
        r = run("verify", str(target), "-q")
        assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), target
    # Failures still say why, on stderr.
    r = run("verify", str(tmp_path / "nope"), "-q")
    assert r.returncode == 1 and r.stdout == "" and "StoreNotFoundError" in r.stderr


def test_convert_accepts_every_codec_of_the_api(tmp_path: Path) -> None:
    from typing import get_args

    from loaderx.zrecord import Codec

    src = hf_small(tmp_path / "hf_small")
    for codec in get_args(Codec):
        if codec == "zstd_dict":
            continue
        r = run("convert", str(src), str(tmp_path / codec), "--codec", codec, "-q")
        assert r.returncode == 0, (codec, r.stderr)
        with Ragged.open(tmp_path / codec / "train" / "x") as rs:
            assert rs.codec == codec
    rng = np.random.default_rng(3)
    with Ragged.create(tmp_path / "sample", np.int16, 1, codec="raw") as rs:
        rs.append([rng.integers(0, 9, 30 + k % 20).astype(np.int16) for k in range(2000)])
    r = run("train-dict", str(tmp_path / "sample"), str(tmp_path / "d.dict"), "--size", "2048")
    assert r.returncode == 0, r.stderr
    r = run("convert", str(src), str(tmp_path / "zd"), "--codec", "zstd_dict",
            "--dict", str(tmp_path / "d.dict"))
    assert r.returncode == 0, r.stderr
    with Ragged.open(tmp_path / "zd" / "train" / "x") as rs:
        assert rs.codec == "zstd_dict"
        assert [a.tolist() for a in rs[:]] == [list(range(k)) for k in range(5)]
    assert run("verify", str(tmp_path / "zd"), "-q").returncode == 0
    # The API's own checks, one line each: no dictionary, or one for another codec.
    r = run("convert", str(src), str(tmp_path / "zd2"), "--codec", "zstd_dict")
    assert r.returncode == 1
    assert r.stderr == ("loaderx convert: InvalidArgumentError: codec 'zstd_dict' needs "
                        "dict_bytes; train one with loaderx.utils.train_dict\n")
    r = run("convert", str(src), str(tmp_path / "zd3"), "--codec", "zstd",
            "--dict", str(tmp_path / "d.dict"))
    assert r.returncode == 1 and "dict_bytes is only used with codec 'zstd_dict'" in r.stderr
    assert not (tmp_path / "zd2").exists() and not (tmp_path / "zd3").exists()


def test_convert_narrows_integer_columns_unless_no_narrow(tmp_path: Path) -> None:
    src = hf_small(tmp_path / "hf_small")
    for flag, version in (((), (1, 3)), (("--no-narrow",), (1, 1))):
        out = tmp_path / f"out{len(flag)}"
        r = run("convert", str(src), str(out), "--codec", "zstd", *flag)
        assert r.returncode == 0, r.stderr
        for store, n in CONV_STORES:
            assert tuple(_loaderx.Store.open(str(out / store)).format_version) == version, store
            cls = Dense if store.endswith("label") else Ragged
            with cls.open(out / store) as s:
                assert len(s) == n
        with Ragged.open(out / "train" / "x") as rs:
            got = rs[:]
        assert [g.dtype for g in got] == [np.dtype(np.int16)] * 5
        assert [g.tolist() for g in got] == [list(range(k)) for k in range(5)]


def test_train_dict_narrows_integer_records_unless_no_narrow(tmp_path: Path) -> None:
    # Token-like int32 records (0..50000): narrowed, they are 2-byte values, so the
    # dictionary equals one trained on the uint16 records themselves.
    rng = np.random.default_rng(2)
    recs = [np.append(rng.integers(0, 50_000, 40), 40_000).astype(np.int32) for _ in range(600)]
    with Ragged.create(tmp_path / "tok", np.int32, 1, codec="raw") as rs:
        rs.append(recs)
    with Ragged.create(tmp_path / "u16", np.uint16, 1, codec="raw") as rs:
        rs.append([r.astype(np.uint16) for r in recs])
    for src, out, flag in (("tok", "n.dict", ()), ("tok", "w.dict", ("--no-narrow",)),
                           ("u16", "u.dict", ())):
        r = run("train-dict", str(tmp_path / src), str(tmp_path / out), "--size", "4096", *flag)
        assert r.returncode == 0, r.stderr
    narrowed = (tmp_path / "n.dict").read_bytes()
    assert narrowed == (tmp_path / "u.dict").read_bytes()
    assert narrowed != (tmp_path / "w.dict").read_bytes()
