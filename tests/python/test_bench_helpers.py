"""Tests of the benchmark suite's own logic (bench/), not of loaderx speed.

They need no prepared data and no bench-only packages: they pin down the
pieces whose bugs would silently corrupt a published table - the exactness
check every backend passes before it is timed, the ragged record layout, the
token record splitter, the doc-section rewriter, the repeated timed writes and
the process-tree PSS sum.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import benchlib
from benchlib import DenseWorkload, RaggedWorkload


def _ragged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recs: list[np.ndarray]) -> RaggedWorkload:
    monkeypatch.setattr(benchlib, "DATA", tmp_path)
    benchlib.save_ragged("r", recs, recs[0].dtype)
    return benchlib.load_ragged("r", "r", "test")


def test_save_ragged_round_trips_shapes_dtype_and_values(tmp_path, monkeypatch):
    recs = [np.arange(6, dtype=np.uint8).reshape(1, 2, 3), np.zeros((1, 0, 3), np.uint8),
            np.full((1, 3, 1), 7, np.uint8)]
    w = _ragged(tmp_path, monkeypatch, recs)
    assert w.n == 3 and w.ndim == 3 and w.dtype == np.uint8
    assert list(w.offsets) == [0, 6, 6, 9]
    for i, r in enumerate(recs):
        got = w.record(i)
        assert got.shape == r.shape and got.dtype == r.dtype
        np.testing.assert_array_equal(got, r)
    assert w.nbytes == 9


def test_load_ragged_rejects_inconsistent_offsets(tmp_path, monkeypatch):
    w = _ragged(tmp_path, monkeypatch, [np.arange(4, dtype=np.int32), np.arange(2, dtype=np.int32)])
    np.save(tmp_path / "r" / "offsets.npy", np.array([0, 4, 5], dtype=np.int64))
    with pytest.raises(ValueError, match="disagree"):
        benchlib.load_ragged("r", "r", "test")
    assert w.n == 2


def test_load_dense_missing_file_names_prepare_script(tmp_path, monkeypatch):
    monkeypatch.setattr(benchlib, "DATA", tmp_path)
    with pytest.raises(FileNotFoundError, match="prepare_"):
        benchlib.load_dense("x", "nothing.npy", "")


def test_check_exact_accepts_identical_dense_and_names_first_bad_record():
    import bench_store
    arr = np.arange(5 * 4, dtype=np.int32).reshape(5, 4)
    w = DenseWorkload("d", arr, "")
    idx = np.array([4, 0, 4, 2], dtype=np.uint64)
    bench_store.check_exact(w, "ok", arr[idx].copy(), idx)
    bad = arr[idx].copy()
    bad[2, 3] += 1
    with pytest.raises(AssertionError, match=r"record 4 \(position 2\)"):
        bench_store.check_exact(w, "be", bad, idx)
    with pytest.raises(AssertionError, match="int64"):
        bench_store.check_exact(w, "be", arr[idx].astype(np.int64), idx)
    with pytest.raises(AssertionError, match="not ndarray"):
        bench_store.check_exact(w, "be", list(arr[idx]), idx)


def test_check_exact_ragged_catches_wrong_shape_and_order(tmp_path, monkeypatch):
    import bench_store
    recs = [np.arange(6, dtype=np.int32).reshape(2, 3), np.arange(3, dtype=np.int32).reshape(3, 1)]
    w = _ragged(tmp_path, monkeypatch, recs)
    idx = np.array([1, 0], dtype=np.uint64)
    bench_store.check_exact(w, "ok", [recs[1].copy(), recs[0].copy()], idx)
    with pytest.raises(AssertionError, match=r"record 1 \(position 0\)"):
        bench_store.check_exact(w, "be", [recs[0], recs[1]], idx)
    with pytest.raises(AssertionError, match=r"record 0 \(position 1\)"):
        bench_store.check_exact(w, "be", [recs[1], recs[0].reshape(3, 2)], idx)
    with pytest.raises(AssertionError, match="wrong length"):
        bench_store.check_exact(w, "be", [recs[1]], idx)


def test_batch_bytes_counts_logical_bytes_of_requested_records(tmp_path, monkeypatch):
    import bench_store
    recs = [np.zeros(3, np.int32), np.zeros(5, np.int32)]
    w = _ragged(tmp_path, monkeypatch, recs)
    assert bench_store.batch_bytes(w, np.array([1, 1, 0], dtype=np.uint64)) == (5 + 5 + 3) * 4
    d = DenseWorkload("d", np.zeros((4, 2, 2), np.float64), "")
    assert bench_store.batch_bytes(d, np.array([0, 3, 3], dtype=np.uint64)) == 3 * 32


def test_ragged_records_are_one_list_of_exact_views_built_once(tmp_path, monkeypatch):
    recs = [np.arange(4, dtype=np.int32).reshape(2, 2), np.zeros((0, 2), np.int32),
            np.full((3, 2), 9, np.int32)]
    w = _ragged(tmp_path, monkeypatch, recs)
    got = w.records()
    assert isinstance(got, list) and len(got) == 3
    assert w.records() is got  # kept: a timed write does not build the views again
    for g, r in zip(got, recs):
        assert g.shape == r.shape and g.dtype == r.dtype
        np.testing.assert_array_equal(g, r)


class _CountingWriter:
    """A backend whose every write leaves one file naming how many writes came before."""

    def __init__(self) -> None:
        self.writes = 0

    def write(self, w, path: Path) -> None:
        path.mkdir()
        (path / "data").write_bytes(b"x" * (self.writes + 1))
        self.writes += 1
        self.publish_s = self.writes / 100  # as LoaderxBackend reports its close()


def _fake_timer(monkeypatch: pytest.MonkeyPatch, durations: list[float], cpu: list[float] | None = None) -> None:
    """bench_store.Timer reports ``durations`` in turn (write, sync, write, sync, ...), and
    the process's CPU clock advances by ``cpu[k]`` over write k."""
    import bench_store
    it = iter(durations)
    clock = iter([x for c in (cpu or [0.0] * len(durations)) for x in (0.0, c)])
    monkeypatch.setattr(bench_store.time, "process_time", lambda: next(clock))

    class T:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.s = next(it)

    monkeypatch.setattr(bench_store, "Timer", T)
    monkeypatch.setattr(bench_store.os, "sync", lambda: None)


def test_timed_writes_reports_the_median_write_and_keeps_the_last_store(tmp_path, monkeypatch):
    import argparse

    import bench_store
    _fake_timer(monkeypatch, [2.0, 0.2, 3.0, 0.5, 0.1, 2.0], cpu=[3.5, 5.0, 0.25])
    be = _CountingWriter()
    path = tmp_path / "store"
    t = bench_store.timed_writes(be, None, path, argparse.Namespace(write_repeats=3, max_write_seconds=100.0))
    assert be.writes == 3
    assert t.durable_s == pytest.approx([2.2, 3.5, 2.1])
    assert (t.write_s, t.sync_s) == pytest.approx((2.0, 0.2))  # the median by write + sync (not the last)
    assert t.cpu_s == 3.5  # the CPU time of that same write
    assert t.publish_s == 0.01  # and its publish, as the backend reported it
    assert (path / "data").read_bytes() == b"xxx"  # the last write's store is kept


def test_timed_writes_stops_repeating_after_max_write_seconds(tmp_path, monkeypatch):
    import argparse

    import bench_store
    _fake_timer(monkeypatch, [5.0, 0.0, 4.0, 1.0])
    be = _CountingWriter()
    t = bench_store.timed_writes(be, None, tmp_path / "s", argparse.Namespace(write_repeats=5, max_write_seconds=8.0))
    assert be.writes == 2 and t.durable_s == pytest.approx([5.0, 5.0])
    assert (t.write_s, t.sync_s) == pytest.approx((5.0, 0.0))  # even count: the lower middle


def test_ragged_pieces_respect_bounds_and_keep_every_token_in_order():
    prepare_tokens = pytest.importorskip("prepare_tokens")
    paras = [list(range(5)), list(range(5, 9)), list(range(9, 1300)), list(range(1300, 1310))]
    pieces = prepare_tokens.ragged_pieces(paras)
    assert all(16 <= len(p) <= 512 for p in pieces)
    assert [t for p in pieces for t in p] == list(range(1310))
    # short leading paragraphs are joined, long ones split at 512
    assert pieces[0][:9] == list(range(9)) and len(pieces[0]) == 512


def test_ragged_pieces_drop_a_lone_too_short_file():
    prepare_tokens = pytest.importorskip("prepare_tokens")
    assert prepare_tokens.ragged_pieces([[1, 2, 3]]) == []


def test_update_doc_section_replaces_only_its_block(tmp_path):
    doc = tmp_path / "b.md"
    doc.write_text("# B\n\n## Sampler\nkept by someone else\n\n<!-- BEGIN x -->\nold\n<!-- END x -->\ntail\n")
    benchlib.update_doc_section("x", "new table", doc)
    benchlib.update_doc_section("y", "appended", doc)
    text = doc.read_text()
    assert "## Sampler\nkept by someone else\n" in text
    assert "<!-- BEGIN x -->\nnew table\n<!-- END x -->\ntail\n" in text
    assert "old" not in text
    assert text.endswith("<!-- BEGIN y -->\nappended\n<!-- END y -->\n")


def test_markdown_table_aligns_columns():
    md = benchlib.markdown_table(["a", "b"], [["x", 1]])
    assert md.splitlines() == ["| a | b |", "|---|---:|", "| x | 1 |"]


def test_tree_pss_includes_children():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: hold memory until the parent has measured
        os.close(w)
        buf = bytearray(64 * 1024 * 1024)
        buf[::4096] = b"x" * len(buf[::4096])
        os.read(r, 1)
        os._exit(0)
    try:
        os.close(r)
        assert pid in benchlib.tree_pids(os.getpid())
        alone = benchlib.pss_bytes(os.getpid())
        import time
        deadline = time.monotonic() + 10
        while benchlib.tree_pss() - alone < 32 * 1024 * 1024 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert benchlib.tree_pss() - alone >= 32 * 1024 * 1024
    finally:
        os.write(w, b"x")
        os.close(w)
        os.waitpid(pid, 0)


def test_pss_fields_reads_every_pss_field_at_once():
    fields = benchlib.pss_fields(os.getpid())
    assert {"Pss:", "Pss_Anon:", "Pss_File:", "Pss_Shmem:"} <= set(fields)
    assert fields["Pss:"] >= fields["Pss_Anon:"] > 0
    assert all(v % 1024 == 0 for v in fields.values())
    assert benchlib.pss_bytes(os.getpid(), "Pss_Anon:") > 0
    assert benchlib.pss_fields(2**22 + 12345) == {}  # no such process
    assert benchlib.pss_bytes(2**22 + 12345) == 0


def test_rss_grew_says_when_the_pss_total_may_have_grown():
    at_read = {1: 100 << 20, 2: 50 << 20}
    assert not benchlib.rss_grew(at_read, {1: 100 << 20, 2: 50 << 20})  # steady
    assert not benchlib.rss_grew(at_read, {1: (100 << 20) + (1 << 20), 2: 10 << 20})  # within the slack; a drop
    assert benchlib.rss_grew(at_read, {1: (100 << 20) + (1 << 20) + 1, 2: 50 << 20})  # beyond it
    assert benchlib.rss_grew(at_read, {1: 100 << 20, 2: 50 << 20, 3: 4096})  # a new process
    assert not benchlib.rss_grew(at_read, {1: 100 << 20})  # one left
    assert benchlib.rss_grew({}, {1: 0})  # the first tick reads
    assert benchlib.rss_bytes(os.getpid()) > 0
    assert benchlib.rss_bytes(2**22 + 12345) == 0


def test_pss_sampler_reads_pss_only_while_rss_grows_and_keeps_the_peak():
    import time

    with benchlib.PssSampler(interval=0.01) as s:
        time.sleep(0.3)  # steady: ~30 ticks, one reading
        steady = s.samples
        buf = bytearray(64 << 20)
        buf[::4096] = b"x" * len(buf[::4096])  # +64 MiB resident: read again
        time.sleep(0.1)
        grown = s.samples
        peak = s.peak
        del buf
        time.sleep(0.1)
    assert steady == 1
    assert grown >= 2
    assert peak >= benchlib.pss_bytes(os.getpid()) + (32 << 20)  # the peak held the buffer
    assert s.samples == grown + 1  # the exit reading only: RSS fell after the buffer went
    assert s.peak == peak and s.cpu_s > 0


# --------------------------------------------------------------------------
# Binary-column backends (Arrow IPC, Parquet) on tiny workloads: the readers
# must return exactly what check_exact accepts, across row-group boundaries,
# with duplicates and out-of-order requests.
# --------------------------------------------------------------------------

def _tiny_dense() -> DenseWorkload:
    arr = (np.arange(11 * 2 * 3, dtype=np.int32) * 7919).reshape(11, 2, 3)
    return DenseWorkload("d", arr, "")


def _tiny_ragged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RaggedWorkload:
    rng = np.random.default_rng(3)
    recs = [rng.integers(0, 2**31, size=(2, int(rng.integers(0, 5))), dtype=np.int32) for _ in range(11)]
    return _ragged(tmp_path, monkeypatch, recs)


# Row groups / record batches of 4 rows: 11 records span 3 groups, the last short.
_REQUEST = np.array([10, 0, 4, 4, 3, 10, 7, 0], dtype=np.uint64)


@pytest.mark.parametrize("codec", ["raw", "zstd"])
@pytest.mark.parametrize("kind", ["dense", "ragged"])
def test_parquet_backend_returns_exact_records_across_row_groups(tmp_path, monkeypatch, codec, kind):
    pytest.importorskip("pyarrow.parquet")
    import backends
    import bench_store
    import pyarrow.parquet as pq
    monkeypatch.setattr(backends, "PARQUET_GROUP", 4)
    w = _tiny_dense() if kind == "dense" else _tiny_ragged(tmp_path, monkeypatch)
    be = backends.ParquetBackend(codec)
    assert be.name == f"parquet-{codec}" and be.available() is None
    be.write(w, tmp_path / "pq")
    md = pq.ParquetFile(str(tmp_path / "pq" / "data.parquet")).metadata
    assert [md.row_group(g).num_rows for g in range(md.num_row_groups)] == [4, 4, 3]
    assert md.row_group(0).column(0).compression == ("UNCOMPRESSED" if codec == "raw" else "ZSTD")
    reader = be.open(w, tmp_path / "pq")
    try:
        got = reader.gather(_REQUEST)
        bench_store.check_exact(w, be.name, got, _REQUEST)
        one = reader.gather(np.array([5], dtype=np.uint64))  # a single group, a single row
        bench_store.check_exact(w, be.name, one, np.array([5], dtype=np.uint64))
    finally:
        reader.close()


def test_parquet_reader_rejects_a_file_with_the_wrong_row_count(tmp_path, monkeypatch):
    pytest.importorskip("pyarrow.parquet")
    import backends
    w = _tiny_dense()
    be = backends.ParquetBackend("raw")
    be.write(w, tmp_path / "pq")
    shorter = DenseWorkload("d", w.array[:10], "")
    with pytest.raises(ValueError, match="holds 11 rows, the workload 10"):
        be.open(shorter, tmp_path / "pq")


@pytest.mark.parametrize("kind", ["dense", "ragged"])
def test_arrow_ipc_backend_returns_exact_records_across_record_batches(tmp_path, monkeypatch, kind):
    pytest.importorskip("pyarrow")
    import backends
    import bench_store
    monkeypatch.setattr(backends, "ARROW_BATCH", 4)
    w = _tiny_dense() if kind == "dense" else _tiny_ragged(tmp_path, monkeypatch)
    for codec in ("raw", "zstd"):
        be = backends.ArrowBackend(codec)
        be.write(w, tmp_path / codec)
        reader = be.open(w, tmp_path / codec)
        try:
            bench_store.check_exact(w, be.name, reader.gather(_REQUEST), _REQUEST)
        finally:
            reader.close()


def test_store_registry_lists_parquet_after_arrow():
    import backends
    names = [b.name for b in backends.all_backends()]
    assert names.index("parquet-raw") == names.index("arrow-ipc-zstd") + 1
    assert names.index("parquet-zstd") == names.index("parquet-raw") + 1
    assert len(names) == len(set(names))


# --------------------------------------------------------------------------
# Side venvs (bench/refvenv.py) and the loader bench's write-once stores
# --------------------------------------------------------------------------

def test_side_venv_pins_the_project_versions_of_shared_dists(tmp_path):
    import refvenv
    v = refvenv.SideVenv(".venv-test", "somedist", ["somedist==1.2"], same_as_project=("numpy",))
    want_numpy = np.__version__.split("+", 1)[0]
    assert v.requirements() == ["somedist==1.2", f"numpy=={want_numpy}"]
    assert v.venv == BENCH / ".venv-test" and v.python == BENCH / ".venv-test" / "bin" / "python"
    assert v.installed_version() is None  # never created


def test_side_venv_refuses_to_pin_a_dist_the_project_lacks():
    import refvenv
    v = refvenv.SideVenv(".venv-test", "somedist", [], same_as_project=("no-such-dist-xyz",))
    with pytest.raises(refvenv.RefVenvError, match="no-such-dist-xyz is not installed in the project venv"):
        v.requirements()


def test_reference_venv_keeps_its_historical_names():
    import refvenv
    assert refvenv.VENV == BENCH / ".venv-ref" and refvenv.PIN == "loaderx==2.5.4"
    assert refvenv.MDS.venv == BENCH / ".venv-mds" and refvenv.MDS.dist == "mosaicml-streaming"


def test_write_once_publishes_by_rename_and_never_a_half_store(tmp_path):
    import bench_loader
    calls: list[Path] = []

    def write(tmp: Path) -> None:
        calls.append(tmp)
        tmp.mkdir()
        (tmp / "f").write_text("x")

    path = tmp_path / "sub" / "store"
    assert bench_loader._write_once(path, write) == path
    assert (path / "f").read_text() == "x" and calls[0] != path and not calls[0].exists()
    bench_loader._write_once(path, write)  # already there: not written again
    assert len(calls) == 1

    def broken(tmp: Path) -> None:
        tmp.mkdir()
        raise OSError("disk full")

    other = tmp_path / "other"
    with pytest.raises(OSError, match="disk full"):
        bench_loader._write_once(other, broken)
    assert not other.exists()


def test_torchvision_placeholders_satisfy_streamings_imports_and_refuse_use(monkeypatch):
    import importlib.util

    import bench_loader
    mods = bench_loader._torchvision_placeholders()
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    from torchvision.datasets import VisionDataset
    from torchvision.transforms.functional import to_tensor
    assert isinstance(VisionDataset, type)
    assert importlib.util.find_spec("torchvision").name == "torchvision"
    with pytest.raises(RuntimeError, match="torchvision is not usable here"):
        VisionDataset()
    with pytest.raises(RuntimeError, match="torchvision is not usable here"):
        to_tensor(np.zeros((2, 2, 3), np.uint8))


# --------------------------------------------------------------------------
# Loader bench: the exactness check every loader passes before it is timed,
# and the litdata peer end to end on a tiny source.
# --------------------------------------------------------------------------

def _tiny_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int = 40) -> np.ndarray:
    import bench_loader
    src = (np.arange(n * 3 * 4 * 5, dtype=np.int64) * 37 % 251).astype(np.uint8).reshape(n, 3, 4, 5)
    np.save(tmp_path / "src.npy", src)
    monkeypatch.setattr(bench_loader, "SOURCE", tmp_path / "src.npy")
    monkeypatch.setattr(bench_loader, "STORES", tmp_path / "stores")
    monkeypatch.setattr(bench_loader, "BATCH", 8)
    return src


def test_check_batch_accepts_exact_batches_and_names_the_loader_otherwise(tmp_path, monkeypatch):
    import bench_loader
    src = _tiny_source(tmp_path, monkeypatch)
    ix = np.array([3, 3, 0, 39, 7, 1, 2, 5])
    bench_loader.check_batch("ok", 0, src[ix].copy(), ix, src)
    bad = src[ix].copy()
    bad[4, 2, 3, 4] ^= 1
    with pytest.raises(SystemExit, match="peer: batch 2 differs"):
        bench_loader.check_batch("peer", 2, bad, ix, src)
    with pytest.raises(SystemExit, match=r"differs .*got int16"):
        bench_loader.check_batch("peer", 0, src[ix].astype(np.int16), ix, src)
    with pytest.raises(SystemExit, match="outside 0..39"):
        bench_loader.check_batch("peer", 0, src[ix], np.array([0, 1, 2, 3, 4, 5, 6, 40]), src)
    with pytest.raises(SystemExit, match=r"shape \(7,\)"):
        bench_loader.check_batch("peer", 0, src[ix[:7]], ix[:7], src)


def test_litdata_peer_serves_exact_shuffled_batches_without_epoch_end(tmp_path, monkeypatch):
    pytest.importorskip("litdata")
    import bench_loader
    src = _tiny_source(tmp_path, monkeypatch)
    total = 12  # > 40 / 8 batches of one pass over the records: needs the subsample repeat
    sigint = signal.getsignal(signal.SIGINT)
    it, close = bench_loader._litdata_iter(workers=0, total=total)
    # litdata's optimize() leaves a SIGINT handler that os._exit(0)s: a later
    # Ctrl-C (or a test's interrupt_main) would end pytest silently, "green".
    assert signal.getsignal(signal.SIGINT) is sigint
    seen = []
    for k in range(total):
        img, ix = next(it)
        bench_loader.check_batch("litdata", k, img, ix, src)
        seen.extend(np.asarray(ix).tolist())
    close()
    assert sorted(set(seen)) == list(range(40))  # every record served
    assert seen[:40] != list(range(40))  # shuffled
    assert (tmp_path / "stores" / "litdata" / "raw" / "index.json").exists()
    assert not list((tmp_path / "stores" / "litdata").glob(".*tmp*"))  # published by rename


def test_mosaic_peer_serves_exact_shuffled_batches_in_its_own_venv(tmp_path):
    """Runs in bench/.venv-mds (skipped where it was never created)."""
    import subprocess

    import refvenv
    if refvenv.MDS.installed_version() is None:
        pytest.skip("bench/.venv-mds not created (bench/refvenv.py mds)")
    snippet = f"""
import sys
from pathlib import Path
import numpy as np
sys.path.insert(0, {str(BENCH)!r})
import bench_loader
tmp = Path({str(tmp_path)!r})
src = (np.arange(40 * 60, dtype=np.int64) * 37 % 251).astype(np.uint8).reshape(40, 3, 4, 5)
np.save(tmp / "src.npy", src)
bench_loader.SOURCE, bench_loader.STORES, bench_loader.BATCH = tmp / "src.npy", tmp / "stores", 8
it, close = bench_loader._mosaic_iter(workers=0, total=12)
seen = []
for k in range(12):
    img, ix = next(it)
    bench_loader.check_batch("mosaic", k, img, ix, src)
    seen.extend(np.asarray(ix).tolist())
close()
assert sorted(set(seen)) == list(range(40)), sorted(set(seen))
assert seen[:40] != list(range(40))
print("ok", len(seen))
"""
    proc = subprocess.run([str(refvenv.MDS.python), "-c", snippet], capture_output=True, text=True, timeout=300,
                          cwd=str(tmp_path), check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "ok 96"


def test_loader_render_reports_streaming_peers_against_loaderx_raw():
    import bench_loader
    MiB = 1024 * 1024
    rows = [({"kind": "loaderx", "codec": "raw", "label": "loaderx raw", "model": "threads", "storage": "z"},
             {"batches_s": 40.0, "p95_ms": 70.0, "peak_pss": 400 * MiB, "peak_pss_anon": 250 * MiB}),
            ({"kind": "mosaic", "label": "mosaic-streaming 2w", "model": "2 processes (fork)", "storage": "MDS"},
             {"batches_s": 4.0, "p95_ms": 800.0, "peak_pss": 800 * MiB, "peak_pss_anon": 400 * MiB}),
            ({"kind": "litdata", "label": "litdata 2w", "model": "2 processes (fork)", "storage": "chunks"},
             {"error": "exit 1: boom"})]
    md, notes = bench_loader.render(rows, 200)
    lines = md.splitlines()
    assert lines[2].startswith("| **loaderx raw** | threads | z | 40.0 | 70.0 ms | 400 MiB | 250 MiB |")
    assert lines[3].startswith("| mosaic-streaming 2w | 2 processes (fork) | MDS | 4.0 | 800.0 ms | 800 MiB |")
    assert len(lines) == 4  # the failed row is not in the table...
    assert "loaderx raw / mosaic-streaming 2w: 10.00x batches/s, 0.50x peak PSS" in notes
    assert notes[-1] == "Not measured: litdata 2w (exit 1: boom)"  # ...but named under it


# --------------------------------------------------------------------------
# The write ceilings (bench/ceilings.py, bench/write_ceiling.cc): the zstd
# ceiling must compress exactly as a store does, or "fraction of the ceiling"
# compares different work.

def _data_bytes(store: Path) -> int:
    return sum(f.stat().st_size for f in store.glob("data-*"))


@pytest.mark.parametrize("codec", ["zstd", "zstd_dict"])
def test_zstd_ceiling_makes_the_frames_of_a_store_byte_for_byte_in_size(tmp_path, monkeypatch, codec):
    import ceilings
    from loaderx.utils import train_dict
    from loaderx.zrecord import Ragged

    rng = np.random.default_rng(3)
    recs = [np.zeros(0, np.uint8), np.arange(3, dtype=np.uint8), np.arange(7, dtype=np.uint8),
            rng.integers(0, 256, 900, dtype=np.uint8),  # incompressible: stored raw, counted raw
            *[np.repeat(rng.integers(0, 9, n // 8, dtype=np.uint8), 8) for n in range(8, 4000, 97)]]
    w = _ragged(tmp_path, monkeypatch, recs)
    dict_bytes = train_dict(recs[4:], size=1024) if codec == "zstd_dict" else None
    store = tmp_path / "store"
    with Ragged.create(str(store), np.uint8, ndim=1, codec=codec, data_shards=1, dict_bytes=dict_bytes) as rs:
        rs.append(recs)
    got = ceilings.zstd_ceiling(w, tmp_path / "work", level=3, dict_bytes=dict_bytes, repeat=1)
    assert got.out_bytes == _data_bytes(store)
    assert got.seconds > 0 and got.threads == (os.cpu_count() or 1)
    assert list((tmp_path / "work").iterdir()) == []


def test_zstd_ceiling_reads_a_dense_workload_as_one_record_per_row(tmp_path):
    import ceilings
    from loaderx.zrecord import Dense

    # 5 KiB records: above the 4 KiB mean of format 1.3's groups layout, whose bare
    # blocks keep 4 bytes fewer than the frames the ceiling makes (same compression).
    a = np.repeat(np.arange(40 * 64, dtype=np.int32).reshape(40, 64) % 17, 20, axis=1)
    w = DenseWorkload("d", a, "test")
    store = tmp_path / "store"
    with Dense.create(str(store), a.dtype, a.shape[1:], codec="zstd", data_shards=1) as ds:
        ds.append(a)
    assert ceilings.zstd_ceiling(w, tmp_path / "work", repeat=1).out_bytes == _data_bytes(store)
    # 512-byte records: the groups layout keeps each one-block frame 4 bytes shorter.
    small = np.ascontiguousarray(a[:, :128])
    with Dense.create(str(tmp_path / "small"), small.dtype, small.shape[1:], codec="zstd", data_shards=1) as ds:
        ds.append(small)
    frames = ceilings.zstd_ceiling(DenseWorkload("s", small, "test"), tmp_path / "work", repeat=1).out_bytes
    assert _data_bytes(tmp_path / "small") == frames - 4 * len(small)


def test_median_index_is_the_lower_median_of_the_samples_as_given():
    from benchlib import median_index

    assert median_index([0.3, 0.1, 0.2]) == 2
    assert median_index([0.4, 0.1, 0.3, 0.2]) == 3  # even count: the lower of the two middle ones
    assert median_index([5.0]) == 0


def test_ceilings_give_their_median_run_and_its_cpu_not_their_best(tmp_path, monkeypatch):
    # A write is reported by its median run; its ceilings must be too, or the ceiling's
    # best run is compared with a typical write (bench_store.measure_ceilings).
    import ceilings

    calls: list[tuple[object, ...]] = []

    def fake_run_cpp(exe, *args):
        calls.append(args)
        if args[0] == "zstd":
            return {"samples": [0.30, 0.10, 0.20], "cpu_samples": [0.61, 0.19, 0.42], "out_bytes": 7}
        files, chunk = args[args.index("--files") + 1], args[args.index("--chunk") + 1]
        # 1 file, 8 MiB pieces has the best single run but not the best median
        best_run = {(1, 8 << 20): [0.05, 0.9, 0.8], (1, 1 << 20): [0.5, 0.4, 0.6],
                    (3, 1 << 20): [0.3, 0.35, 0.2], (3, 8 << 20): [0.7, 0.6, 0.65]}
        return {"samples": best_run[(files, chunk)]}

    monkeypatch.setattr(ceilings, "run_cpp", fake_run_cpp)
    monkeypatch.setattr(ceilings, "bench_binary", lambda name: name)
    raw = ceilings.raw_ceiling(3 << 20, 3, tmp_path, repeat=3)
    assert (raw.seconds, raw.pattern) == (0.3, "3 files, 1 MiB pieces")
    assert all(c[c.index("--repeat") + 1] == 3 for c in calls)
    w = DenseWorkload("d", np.arange(64, dtype=np.uint8).reshape(8, 8), "test")
    z = ceilings.zstd_ceiling(w, tmp_path / "work", repeat=3)
    assert (z.seconds, z.cpu_seconds, z.out_bytes) == (0.20, 0.42, 7)
    assert calls[-1][calls[-1].index("--repeat") + 1] == 3


def test_zstd_ceiling_reports_the_cpu_of_every_run(tmp_path):
    from benchlib import bench_binary, run_cpp

    recs = tmp_path / "r.bin"
    recs.write_bytes(bytes(range(256)) * 64)
    np.array([4096 * (k + 1) for k in range(4)], dtype="<u8").tofile(tmp_path / "e.bin")
    got = run_cpp(bench_binary("loaderx_write_ceiling"), "zstd", "--records", recs,
                  "--ends", tmp_path / "e.bin", "--threads", 2, "--repeat", 4)
    assert len(got["samples"]) == len(got["cpu_samples"]) == 4
    assert got["cpu_seconds"] == got["cpu_samples"][got["samples"].index(got["seconds"])]
    assert got["records"] == 4 and got["in_bytes"] == 16384


def test_raw_ceiling_writes_through_every_pattern_and_leaves_nothing(tmp_path):
    import ceilings

    got = ceilings.raw_ceiling(3 << 20, 3, tmp_path, repeat=1)
    assert got.seconds > 0
    assert got.pattern in {f"{f} file{'s' if f > 1 else ''}, {p} MiB pieces" for f in (1, 3) for p in (1, 8)}
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("codec", ["zstd", "zstd_dict"])
def test_zstd_ceiling_narrows_integer_records_as_the_store_does(tmp_path, monkeypatch, codec):
    import ceilings
    from loaderx.utils import train_dict
    from loaderx.zrecord import Ragged

    rng = np.random.default_rng(5)
    recs = [np.zeros(0, np.int32), np.array([255, 0], np.int32), np.array([256, 3], np.int32),
            np.array([-128, 127], np.int32), np.array([-129, 5], np.int32), np.array([65535, 1], np.int32),
            np.array([-32769, 0], np.int32), np.array([2**31 - 1, 0], np.int32),
            # records of 4.4-12 KiB: a mean above the 4 KiB of format 1.3's groups layout
            # (see the dense test above)
            *[rng.integers(0, 50257, n, dtype=np.int32) for n in range(1100, 3000, 37)],
            *[rng.integers(-200, 200, n, dtype=np.int32) for n in range(1100, 1600, 53)]]
    assert [ceilings.narrowed(r).dtype.str for r in recs[1:8]] == ["|u1", "<u2", "|i1", "<i2", "<u2", "<i4", "<i4"]
    w = _ragged(tmp_path, monkeypatch, recs)
    dict_bytes = train_dict(recs[8:], size=1024) if codec == "zstd_dict" else None
    store = tmp_path / "store"
    with Ragged.create(str(store), np.int32, ndim=1, codec=codec, data_shards=1, dict_bytes=dict_bytes) as rs:
        rs.append(recs)
    got = ceilings.zstd_ceiling(w, tmp_path / "work", dict_bytes=dict_bytes, repeat=1)
    assert got.out_bytes == _data_bytes(store)
    wide = ceilings.zstd_ceiling(w, tmp_path / "work", dict_bytes=dict_bytes, repeat=1, narrow=False)
    assert wide.out_bytes > got.out_bytes


def test_ceiling_note_gives_each_write_against_its_ceilings_and_the_cpu_beside_the_compressors():
    import bench_store
    mib = 1 << 20
    raw = bench_store.Row("loaderx-raw", write_s=0.9, sync_s=0.1, disk=10 * mib, raw_ceiling_s=0.8,
                          raw_pattern="4 files, 1 MiB pieces", write_cpu_s=0.3, publish_s=0.0042)
    z = bench_store.Row("loaderx-zstd", write_s=1.5, sync_s=0.5, disk=4 * mib, raw_ceiling_s=0.2,
                        raw_pattern="1 file, 8 MiB pieces", zstd_ceiling_s=1.6, zstd_threads=2,
                        write_cpu_s=4.0, zstd_ceiling_cpu_s=3.0)
    skipped = bench_store.Row("wheel")  # no ceiling measured: left out
    assert bench_store.ceiling_note(None, [raw, z, skipped]) == (
        "Writes against this machine's ceilings (same bytes, same run; a fraction is ceiling time over "
        "our write + sync time, 1.00 = at the ceiling): loaderx-raw 1.000 s (of which the durable publish 4.2 ms) "
        "against raw write + fdatasync "
        "of its 10.0 MiB 0.800 s (4 files, 1 MiB pieces): 0.80 of raw write; loaderx-zstd 2.000 s against "
        "compressor alone 1.600 s (2 threads), raw write + fdatasync of its 4.0 MiB 0.200 s (1 file, 8 MiB "
        "pieces): 0.80 of compressor alone; 0.90 of compressor + raw write (CPU: ours 4.000 s, the "
        "compressor's 3.000 s, 0.75 of ours).")


def test_the_loaderx_backend_times_its_durable_publish(tmp_path):
    from backends import LoaderxBackend
    from loaderx.zrecord import Dense
    be = LoaderxBackend("raw")
    w = DenseWorkload("t", np.arange(12, dtype=np.uint8).reshape(6, 2), "test")
    be.write(w, tmp_path / "s")
    assert 0 < be.publish_s < 60
    with Dense.open(str(tmp_path / "s")) as d:
        np.testing.assert_array_equal(d[np.arange(6, dtype=np.uint64)], w.array)


# --------------------------------------------------------------------------
# bench/write_profile.py: perf samples grouped by what the code does.

def test_write_profile_names_the_area_of_each_sample():
    import write_profile as wp

    assert wp.area_of("_loaderx.cpython-311-x86_64-linux-gnu.so", "HUF_buildCTable_wksp", False) == "compressor"
    assert wp.area_of("loaderx_write_ceiling", "ZSTD_compressBlock_doubleFast", False) == "compressor"
    assert wp.area_of("_loaderx.cpython-311-x86_64-linux-gnu.so",
                      "loaderx::narrow::NarrowRecord(unsigned char const*)", False) == "narrowing"
    assert wp.area_of("libxxhash.so.0.8.1", "0x000000000000e535", False) == "checksums"
    assert wp.area_of("[kernel.kallsyms]", "copy_folio_from_iter_atomic", True) == "kernel"
    # the extension's name holds "python3": it is the writer, not the interpreter
    assert wp.area_of("_loaderx.cpython-311-x86_64-linux-gnu.so",
                      "loaderx::py_bind::AppendRaggedFrom", False) == "writer, other"
    assert wp.area_of("libpython3.11.so.1.0", "_PyEval_EvalFrameDefault", False) == "Python"
    assert wp.area_of("libc.so.6", "__memmove_avx512_unaligned_erms", False) == "libc (copies, allocation)"
    assert wp.area_of("libscipy_openblas64_-32a4b2a6.so", "blas_thread_server", False) == wp.OTHER
    assert wp.COLUMNS[-1] == wp.OTHER and len(set(wp.COLUMNS)) == len(wp.COLUMNS)


def test_write_profile_sums_a_perf_report_by_area(monkeypatch, tmp_path):
    import subprocess

    import write_profile as wp

    report = """# Samples: 1K of event 'cpu-clock'
#
    29.73%          2863  _loaderx.cpython-311-x86_64-linux-gnu.so  [.] HUF_buildCTable_wksp
    18.25%          1758  _loaderx.cpython-311-x86_64-linux-gnu.so  [.] ZSTD_compressBlock_doubleFast
     3.71%           610  _loaderx.cpython-311-x86_64-linux-gnu.so  [.] loaderx::narrow::NarrowRecord(unsigned char const*, unsigned long)
     1.28%           123  [kernel.kallsyms]                         [k] copy_folio_from_iter_atomic
     0.30%            38  [kernel.kallsyms]                         [k] exc_page_fault
     0.10%            17  libpython3.11.so.1.0                      [.] _PyEval_EvalFrameDefault
"""
    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=report, stderr="")

    monkeypatch.setattr(wp.subprocess, "run", fake_run)
    got = wp.perf_areas(tmp_path / "perf.data")
    assert dict(got) == {"compressor": 4621, "narrowing": 610, "kernel": 161, "Python": 17}
    assert seen[0][:3] == ["perf", "report", "-i"] and "dso,sym" in seen[0]


def test_write_profile_takes_the_compressors_times_from_its_sampled_runs_after_the_warm_up():
    import write_profile as wp

    # 1 warm-up run + 5: the median of the last 5 walls (0.30) and that run's CPU.
    printed = {"samples": [0.90, 0.40, 0.20, 0.30, 0.50, 0.10], "cpu_samples": [1.8, 0.8, 0.4, 0.6, 1.0, 0.2]}
    assert wp.sampled_median(printed, 5) == (0.30, 0.6)
    with pytest.raises(SystemExit, match="printed 2 runs, expected 6"):
        wp.sampled_median({"samples": [0.1, 0.2], "cpu_samples": [0.1, 0.2]}, 5)
