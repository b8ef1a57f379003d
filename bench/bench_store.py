#!/usr/bin/env python3
"""Store benchmark: random gather and write on real data (benchmark engineer).

For each workload (real photos dense/ragged, GPT-2 tokens dense/ragged,
Fashion-MNIST) every backend in backends.py writes the same records, is checked
for exact values (dtype, shape, bytes, order, duplicates) on several batches,
then serves the same IID plan of batches of 256 indices. Reported per backend:
write MiB/s (logical), gather krecords/s and MiB/s (logical), p95 batch latency,
CPU time per batch (all threads of the process: less sensitive to the shared
machine's load than wall time),
disk size, compression ratio (logical / disk) and the gather ratio to the
NumPy memmap baseline. The gather phase is timed in several passes (default
3) that each visit every backend in turn, so slow drifts of the shared machine's
load hit all backends alike; the table shows the median over passes and the
key ratios of every pass are printed so the noise is visible.

Beside every loaderx write, the machine's ceilings for the same bytes
(bench/ceilings.py, run by the C++ program bench/write_ceiling.cc): the best
plain write + fdatasync pattern for the store's bytes and, for zstd stores, the
compressor alone on all cores, each run as many times as the write; the median
write is reported as a fraction of their median runs.

Usage: bench/bench_store.py [--workloads vision-dense,...] [--backends a,b] [--no-doc]
Prepare data first: bench/prepare_vision.py, bench/prepare_tokens.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from backends import Backend, LoaderxBackend, Workload, all_backends
from benchlib import (
    DATA,
    DOCS,
    REPO,
    DenseWorkload,
    MiB,
    RaggedWorkload,
    Timer,
    bar_plot,
    batch_plan,
    du_bytes,
    load_dense,
    load_ragged,
    machine_line,
    markdown_table,
    median_index,
    snapshot_loaderx,
    update_doc_section,
    warm_files,
)
from ceilings import raw_ceiling, zstd_ceiling
from goals import Part, write_section

BATCH = 256
BASELINE = "numpy-memmap"


def fmnist_workload() -> DenseWorkload:
    path = DATA / "fmnist_images.npy"
    if not path.exists():
        from loaderx.idx import fashion_mnist
        x, _ = fashion_mnist("all")
        tmp = path.with_name(".fmnist.tmp.npy")
        np.save(tmp, x)
        tmp.rename(path)
    return load_dense("fmnist", "fmnist_images.npy",
                      "Fashion-MNIST (Debian `dataset-fashion-mnist`): 70,000 real `uint8[28,28]` images")


def labels_workload() -> DenseWorkload:
    path = DATA / "fmnist_labels.npy"
    if not path.exists():
        from loaderx.idx import fashion_mnist
        _, y = fashion_mnist("all")
        tmp = path.with_name(".fmnist_labels.tmp.npy")
        np.save(tmp, y)
        tmp.rename(path)
    return load_dense("labels", "fmnist_labels.npy",
                      "Fashion-MNIST labels: 70,000 scalar `uint8` records (`item_shape=()`)")


def memcpy_mibs(threads: int, nbytes: int = 256 << 20, repeat: int = 5) -> float:
    """The machine's copy bandwidth in MiB/s: ``threads`` threads each copying its share
    of an ``nbytes`` buffer (NumPy releases the GIL for large copies); best of ``repeat``."""
    from concurrent.futures import ThreadPoolExecutor
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    step = nbytes // threads
    parts = [(dst[k * step:(k + 1) * step], src[k * step:(k + 1) * step]) for k in range(threads)]
    best = float("inf")
    with ThreadPoolExecutor(threads) as ex:
        for _ in range(repeat):
            t0 = time.perf_counter()
            list(ex.map(lambda p: np.copyto(*p), parts))
            best = min(best, time.perf_counter() - t0)
    return step * threads / best / MiB


class _InRamReader:
    """NumPy fancy indexing of an in-memory copy of a dense workload: the random-gather
    reference (the same scattered copies as a store gather, without a file behind them).
    With ``take``, ``np.take(axis=0)``: one plain copy per record, the closest NumPy has
    to a bare copy loop; the copy is a NumPy allocation of several MiB, which NumPy puts
    on 2 MiB pages where the kernel grants them (a store's page cache is mapped in 4 KiB
    pages: one TLB miss per scattered record; docs/benchmarks.md)."""

    def __init__(self, w: DenseWorkload, take: bool = False) -> None:
        self.array = np.array(w.array)
        self.take = take

    def gather(self, idx: np.ndarray) -> np.ndarray:
        return np.take(self.array, idx, axis=0) if self.take else self.array[idx]


def workloads() -> dict[str, Callable[[], Workload]]:
    vinfo = json.loads((DATA / "vision_info.json").read_text()) if (DATA / "vision_info.json").exists() else {}
    tinfo = json.loads((DATA / "tokens_info.json").read_text()) if (DATA / "tokens_info.json").exists() else {}
    return {
        "vision-dense": lambda: load_dense(
            "vision-dense", "vision_dense.npy",
            f"{vinfo.get('records', '?')} real photos as `uint8[3,224,224]` (resize + crop, "
            f"{vinfo.get('sources', '?')} source photos)"),
        "vision-ragged": lambda: load_ragged(
            "vision-ragged", "vision_ragged",
            f"{vinfo.get('records', '?')} native-resolution `uint8[3,H,W]` photos "
            f"(H {vinfo.get('ragged_h', ['?'] * 3)[0]}..{vinfo.get('ragged_h', ['?'] * 3)[2]}, "
            f"W {vinfo.get('ragged_w', ['?'] * 3)[0]}..{vinfo.get('ragged_w', ['?'] * 3)[2]}, "
            f"longest side capped at {vinfo.get('ragged_cap', '?')})"),
        "tokens-dense": lambda: load_dense(
            "tokens-dense", "tokens_dense.npy",
            f"{tinfo.get('dense_blocks', '?')} GPT-2 token blocks `int32[512]` of linux-doc-6.1"),
        "tokens-ragged": lambda: load_ragged(
            "tokens-ragged", "tokens_ragged",
            f"{tinfo.get('ragged_records', '?')} GPT-2 token records `int32[16..512]` of linux-doc-6.1 "
            f"(median {tinfo.get('ragged_len', {}).get('median', '?')})"),
        "fmnist": fmnist_workload,
        "labels": labels_workload,
    }


# --------------------------------------------------------------------------

def truth(w: Workload, idx: np.ndarray):
    if isinstance(w, DenseWorkload):
        return w.array[idx]
    return [w.record(int(i)) for i in idx]


def check_exact(w: Workload, name: str, got, idx: np.ndarray) -> None:
    """Raises AssertionError naming the backend and first mismatching record."""
    want = truth(w, idx)
    if isinstance(w, DenseWorkload):
        if not isinstance(got, np.ndarray):
            raise AssertionError(  # noqa: TRY004 - a failed check, not a caller's type error
                f"{name}: dense gather returned {type(got).__name__}, not ndarray")
        if got.dtype != want.dtype or got.shape != want.shape:
            raise AssertionError(f"{name}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}")
        bad = np.flatnonzero((got.reshape(len(idx), -1) != want.reshape(len(idx), -1)).any(axis=1))
        if bad.size:
            raise AssertionError(f"{name}: record {idx[bad[0]]} (position {bad[0]}) differs")
        return
    if not isinstance(got, list) or len(got) != len(want):
        raise AssertionError(f"{name}: ragged gather returned {type(got).__name__} of wrong length")
    for k, (g, t) in enumerate(zip(got, want)):
        if not isinstance(g, np.ndarray) or g.dtype != t.dtype or g.shape != t.shape or not np.array_equal(g, t):
            raise AssertionError(f"{name}: record {idx[k]} (position {k}) differs "
                                 f"({getattr(g, 'dtype', type(g))}{getattr(g, 'shape', '')} vs {t.dtype}{t.shape})")


def batch_bytes(w: Workload, idx: np.ndarray) -> int:
    if isinstance(w, DenseWorkload):
        return len(idx) * w.record_bytes
    o = w.offsets
    return int((o[idx.astype(np.int64) + 1] - o[idx.astype(np.int64)]).sum()) * w.dtype.itemsize


@dataclass
class Row:
    backend: str
    write_s: float = 0.0
    write_mibs: float = 0.0
    sync_s: float = 0.0  # os.sync() right after the write: what a non-durable writer left to flush
    # write + sync seconds of every timed write; write_s / sync_s are those of the median one
    durable_s: list[float] = field(default_factory=list)
    write_cpu_s: float = 0.0  # this process's CPU time (all threads) in the median write
    publish_s: float = 0.0  # of the median write, its durable publish (loaderx: close())
    disk: int = 0
    ratio: float = 0.0
    # One entry per gather pass; empty when the backend was not measured.
    krec_s: list[float] = field(default_factory=list)
    mibs: list[float] = field(default_factory=list)
    p95_ms: list[float] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)  # process CPU time (all threads) per batch
    skipped: str = ""
    # The machine's ceilings for this write (ceilings.py; loaderx rows only, 0 = not measured):
    # the raw write + fdatasync of the store's bytes, and the compressor alone on all cores.
    raw_ceiling_s: float = 0.0
    raw_pattern: str = ""
    zstd_ceiling_s: float = 0.0
    zstd_threads: int = 0
    zstd_ceiling_cpu_s: float = 0.0  # the compressor's CPU time in its median run


def time_gather(reader, w: Workload, plan: list[np.ndarray], min_s: float, max_s: float,
                min_batches: int) -> tuple[float, float, float, int, float]:
    for idx in plan[:2]:  # warm-up (page cache, lazy index checks, thread start)
        reader.gather(idx)
    lat: list[float] = []
    recs = nbytes = 0
    t_all = time.perf_counter()
    c_all = time.process_time()
    for idx in plan[2:]:
        t0 = time.perf_counter()
        out = reader.gather(idx)
        lat.append(time.perf_counter() - t0)
        del out
        recs += len(idx)
        nbytes += batch_bytes(w, idx)
        el = time.perf_counter() - t_all
        if (el >= min_s and len(lat) >= min_batches) or el >= max_s:
            break
    cpu = time.process_time() - c_all
    total = sum(lat)
    return (recs / total / 1e3, nbytes / total / MiB, float(np.percentile(lat, 95) * 1e3), len(lat),
            cpu / len(lat) * 1e3)


@dataclass
class Timed:
    """The median of a backend's timed writes (by write + sync) and every write + sync time."""
    write_s: float
    sync_s: float
    durable_s: list[float]
    cpu_s: float  # that write's CPU time in this process: all of a loaderx write's threads
    publish_s: float  # that write's durable publish (its close()), for backends that report it


def timed_writes(be: Backend, w: Workload, path: Path, args) -> Timed:
    """Writes ``w`` to ``path`` ``args.write_repeats`` times (fewer once the writes have
    taken ``args.max_write_seconds``), each followed by a timed ``os.sync()``, and keeps
    the last store. One write is a single sample of the disk's writeback, which moved
    ratios by +-20 % between runs; the median write (by write + sync) is reported, with
    every write + sync time beside it."""
    samples: list[tuple[float, float, float, float]] = []
    spent = 0.0
    for k in range(max(1, args.write_repeats)):
        if k > 0:
            shutil.rmtree(path)
        # Untimed: what earlier steps left dirty (the previous workload's removed
        # stores, the previous repeat) is not charged to the write timed next.
        os.sync()
        c0 = time.process_time()
        with Timer() as t:
            be.write(w, path)
        cpu = time.process_time() - c0
        with Timer() as ts:
            os.sync()
        samples.append((t.s, ts.s, cpu, float(getattr(be, "publish_s", 0.0))))
        spent += t.s + ts.s
        if spent >= args.max_write_seconds:
            break
    write_s, sync_s, cpu, publish = samples[median_index([a + b for a, b, _, _ in samples])]
    return Timed(write_s, sync_s, [a + b for a, b, _, _ in samples], cpu, publish)


def _progress(it, **kw):
    """tqdm when available (the reference venv has only NumPy)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return it
    return tqdm(it, **kw)


def run_workload(w: Workload, backends: list[Backend], store_root: Path, args,
                 inram: list[float] | None = None, intake: list[float] | None = None) -> list[Row]:
    """Writes, checks and times every backend on ``w``. With ``inram`` (dense workloads),
    each gather pass also times the same plan on an in-memory NumPy copy (the random-copy
    reference) and appends its MiB/s there; with ``intake``, the same with ``np.take``."""
    kind = "dense" if isinstance(w, DenseWorkload) else "ragged"
    n_plan = args.max_batches + 2
    plan = batch_plan(w.n, BATCH, n_plan, seed=args.seed)
    checks = [plan[0], plan[1], np.array([0, w.n - 1, w.n - 1, 0, w.n // 2], dtype=np.uint64)]
    rows: dict[str, Row] = {}
    readers = {}
    paths: dict[str, Path] = {}
    wdir = store_root / w.name
    shutil.rmtree(wdir, ignore_errors=True)
    wdir.mkdir(parents=True)
    # The input in the page cache before the first write, so no backend reads it from disk.
    src_file = getattr(w.array if isinstance(w, DenseWorkload) else w.values, "filename", None)
    if src_file:
        warm_files(Path(src_file))
    if isinstance(w, RaggedWorkload):
        w.records()  # the record views, built once and untimed (every backend writes from them)
    try:
        for be in _progress(backends, desc=f"{w.name}: write + verify", unit="backend", leave=False):
            row = rows.setdefault(be.name, Row(be.name))
            if kind not in be.kinds:
                row.skipped = f"no {kind} adapter"
                continue
            why = be.available()
            if why:
                row.skipped = why
                continue
            if isinstance(be, LoaderxBackend):
                be.prepare(w)  # dictionary training is not part of the write time
            path = wdir / be.name
            t = timed_writes(be, w, path, args)
            row.write_s, row.sync_s, row.durable_s = t.write_s, t.sync_s, t.durable_s
            row.write_cpu_s, row.publish_s = t.cpu_s, t.publish_s
            row.write_mibs = w.nbytes / row.write_s / MiB
            row.disk = du_bytes(path)
            row.ratio = w.nbytes / row.disk
            if isinstance(be, LoaderxBackend) and args.ceilings:
                measure_ceilings(w, be, row, wdir)
            reader = be.open(w, path)
            for idx in checks:
                check_exact(w, be.name, reader.gather(idx), idx)
            readers[be.name] = reader
            paths[be.name] = path
        ram = _InRamReader(w) if inram is not None and isinstance(w, DenseWorkload) else None
        take = _InRamReader(w, take=True) if intake is not None and isinstance(w, DenseWorkload) else None
        if take is not None:
            for idx in checks:
                check_exact(w, "np.take", take.gather(idx), idx)
        for p in range(args.passes):
            for name, reader in _progress(readers.items(), desc=f"{w.name}: gather pass {p + 1}", unit="backend",
                                     leave=False):
                warm_files(paths[name])  # every backend starts from a warm page cache
                k, m, p95, nb, cpu = time_gather(reader, w, plan, args.min_seconds, args.max_seconds,
                                            args.min_batches)
                r = rows[name]
                r.krec_s.append(k)
                r.mibs.append(m)
                r.p95_ms.append(p95)
                r.batches.append(nb)
                r.cpu_ms.append(cpu)
            if ram is not None and inram is not None:
                inram.append(time_gather(ram, w, plan, args.min_seconds, args.max_seconds, args.min_batches)[1])
            if take is not None and intake is not None:
                intake.append(time_gather(take, w, plan, args.min_seconds, args.max_seconds, args.min_batches)[1])
    finally:
        for reader in readers.values():
            reader.close()
        if not args.keep:
            shutil.rmtree(wdir, ignore_errors=True)
    return list(rows.values())


def measure_ceilings(w: Workload, be: LoaderxBackend, row: Row, where: Path) -> None:
    """The raw ceiling of the store's bytes and, for a compressed store, the compressor's,
    each the median of as many runs as the write's (ceilings.py)."""
    runs = max(1, len(row.durable_s))
    raw = raw_ceiling(row.disk, be.data_shards, where, repeat=runs)
    row.raw_ceiling_s, row.raw_pattern = raw.seconds, raw.pattern
    if be.compressed:
        z = zstd_ceiling(w, where, be.level, be.dict_bytes, repeat=runs)
        row.zstd_ceiling_s, row.zstd_threads, row.zstd_ceiling_cpu_s = z.seconds, z.threads, z.cpu_seconds


def ceiling_fractions(w: Workload, r: Row) -> list[tuple[str, float]]:
    """(what, ceiling seconds / our write + sync seconds) for each ceiling measured beside ``r``."""
    ours = r.write_s + r.sync_s
    out = []
    if r.zstd_ceiling_s:
        out.append(("compressor alone", r.zstd_ceiling_s / ours))
        out.append(("compressor + raw write", (r.zstd_ceiling_s + r.raw_ceiling_s) / ours))
    elif r.raw_ceiling_s:
        out.append(("raw write", r.raw_ceiling_s / ours))
    return out


def ceiling_note(w: Workload, rows: list[Row]) -> str:
    """One sentence per loaderx write: its time against each ceiling of the same bytes."""
    parts = []
    for r in rows:
        if not r.raw_ceiling_s:
            continue
        ours = r.write_s + r.sync_s
        what = [f"raw write + fdatasync of its {r.disk / MiB:,.1f} MiB {r.raw_ceiling_s:.3f} s ({r.raw_pattern})"]
        if r.publish_s:
            ours_txt = f"{ours:.3f} s (of which the durable publish {r.publish_s * 1e3:.1f} ms)"
        else:
            ours_txt = f"{ours:.3f} s"
        if r.zstd_ceiling_s:
            what.insert(0, f"compressor alone {r.zstd_ceiling_s:.3f} s ({r.zstd_threads} threads)")
        fr = "; ".join(f"{f:.2f} of {name}" for name, f in ceiling_fractions(w, r))
        if r.zstd_ceiling_cpu_s and r.write_cpu_s:
            fr += (f" (CPU: ours {r.write_cpu_s:.3f} s, the compressor's {r.zstd_ceiling_cpu_s:.3f} s, "
                   f"{r.zstd_ceiling_cpu_s / r.write_cpu_s:.2f} of ours)")
        parts.append(f"{r.backend} {ours_txt} against {', '.join(what)}: {fr}")
    if not parts:
        return ""
    return ("Writes against this machine's ceilings (same bytes, same run; a fraction is ceiling time over "
            "our write + sync time, 1.00 = at the ceiling): " + "; ".join(parts) + ".")


def med(xs: list[float]) -> float:
    return float(np.median(xs))


def durable_mibs(w: Workload, r: Row) -> float:
    """Logical MiB/s of the write followed by a sync (ours fsyncs inside the write)."""
    return w.nbytes / (r.write_s + r.sync_s) / MiB


def _spread(xs: list[float]) -> str:
    """'0.21-0.25 s over 5 writes': the write + sync times of every timed write."""
    if not xs:
        return "-"
    return f"{min(xs):.2f}-{max(xs):.2f} s over {len(xs)} write{'s' if len(xs) > 1 else ''}"


def render(w: Workload, rows: list[Row], passes: int,
           memcpy: dict[int, float] | None = None, inram: float = 0.0,
           intake: float = 0.0) -> tuple[str, str]:
    base = next((r for r in rows if r.backend == BASELINE and r.mibs), None)
    done = [r for r in rows if r.mibs]
    headers = ["backend", "write MiB/s", "write+sync MiB/s", "gather krec/s", "gather MiB/s", "p95 batch", "CPU/batch", "disk MiB",
               "compression", f"gather vs {BASELINE}"]
    table = []
    for r in done:
        rel = f"{med(r.mibs) / med(base.mibs):.2f}x" if base else "n/a"
        name = f"**{r.backend}**" if r.backend.startswith("loaderx") else r.backend
        table.append([name, f"{r.write_mibs:,.0f}", f"{durable_mibs(w, r):,.0f}", f"{med(r.krec_s):,.1f}", f"{med(r.mibs):,.0f}",
                      f"{med(r.p95_ms):.2f} ms", f"{med(r.cpu_ms):.2f} ms", f"{r.disk / MiB:,.1f}", f"{r.ratio:.2f}x", rel])
    md = markdown_table(headers, table)
    skipped = [r for r in rows if not r.mibs]
    notes = []
    if skipped:
        notes.append("Not measured: " + "; ".join(f"{r.backend} ({r.skipped})" for r in skipped) + ".")
    if base and passes > 1:
        keys = [r for r in done if r.backend.startswith("loaderx")]
        if keys:
            notes.append("Key ratio, gather MiB/s vs " + BASELINE + " in each pass: " + "; ".join(
                f"{r.backend} " + " / ".join(f"{a / b:.2f}x" for a, b in zip(r.mibs, base.mibs)) for r in keys)
                + ".")
    if ceiling_note(w, done):
        notes.append(ceiling_note(w, done))
    refs = {r.backend.rsplit("-", 1)[1]: r for r in done if r.backend.startswith("reference-")}
    ours = {r.backend.split("-", 1)[1]: r for r in done if r.backend.startswith("loaderx-")}
    pairs = [(c, ours[c], refs[c]) for c in ("raw", "zstd") if c in ours and c in refs]
    if pairs:
        notes.append("loaderx vs the reference wheel (its own process, same plan; median gather MiB/s, "
                     "median write+sync MiB/s, disk bytes): " + "; ".join(
                         f"{c} {med(a.mibs) / med(b.mibs):.2f}x gather, "
                         f"{durable_mibs(w, a) / durable_mibs(w, b):.2f}x write+sync "
                         f"(ours {_spread(a.durable_s)}, wheel {_spread(b.durable_s)}), "
                         f"{a.disk / b.disk:.2f}x disk"
                         for c, a, b in pairs) + ".")
    if memcpy and isinstance(w, DenseWorkload) and "raw" in ours:
        g = med(ours["raw"].mibs)
        notes.append("Raw dense gather against the machine's memcpy bandwidth measured in this run: "
                     + "; ".join(f"{g / bw:.0%} of {n}-thread memcpy ({bw / 1024:.1f} GiB/s)"
                                 for n, bw in sorted(memcpy.items()))
                     + (f"; {g / inram:.0%} of the same batches gathered by NumPy from an in-memory "
                        f"array ({inram / 1024:.1f} GiB/s, one thread, timed in every pass: the "
                        "random-copy reference)"
                        if inram else "")
                     + (f"; {g / intake:.0%} of the same batches copied by `np.take` from that array "
                        f"({intake / 1024:.1f} GiB/s: one plain copy per record; NumPy asks for 2 MiB pages)"
                        if intake else "") + ".")
    return md, "\n\n".join(notes)


def summary(results: dict[str, tuple[Workload, list[Row]]]) -> str:
    """Per workload and codec: ours / wheel and ours / best other peer, for gather,
    write+sync and disk size (disk: lower is better, so wheel / ours)."""
    headers = ["workload", "codec", "gather / wheel", "gather / best peer", "write+sync / wheel",
               "write+sync / best peer", "write+sync / ceiling", "disk: wheel / ours", "disk: best peer / ours"]
    table = []
    for wname, (w, rows) in results.items():
        done = [r for r in rows if r.mibs]
        for c in ("raw", "zstd", "zstd_dict"):
            a = next((r for r in done if r.backend == f"loaderx-{c}"), None)
            if a is None:
                continue
            ref = next((r for r in done if r.backend.startswith("reference-") and
                        r.backend.endswith("-" + c)), None)
            peers = [r for r in done if not r.backend.startswith(("loaderx", "reference")) and
                     r.backend != BASELINE]

            def ratio(x: float, y: float) -> str:
                return f"{x / y:.2f}x" if y > 0 else "-"
            bp_g = max(peers, key=lambda r: med(r.mibs), default=None)
            bp_w = max(peers, key=lambda r: durable_mibs(w, r), default=None)
            bp_d = min(peers, key=lambda r: r.disk, default=None)
            table.append([
                wname, c,
                ratio(med(a.mibs), med(ref.mibs)) if ref else "-",
                f"{ratio(med(a.mibs), med(bp_g.mibs))} ({bp_g.backend})" if bp_g else "-",
                ratio(durable_mibs(w, a), durable_mibs(w, ref)) if ref else "-",
                f"{ratio(durable_mibs(w, a), durable_mibs(w, bp_w))} ({bp_w.backend})" if bp_w else "-",
                " / ".join(f"{f:.2f}" for _, f in ceiling_fractions(w, a)) or "-",
                ratio(ref.disk, a.disk) if ref else "-",
                f"{ratio(bp_d.disk, a.disk)} ({bp_d.backend})" if bp_d else "-",
            ])
    return markdown_table(headers, table)


# The goals' workload sets (bench/goals.py): small compressed records, token stores,
# and the dense workloads whose records are large enough to be held to memcpy.
SMALL_ZSTD = ("tokens-dense", "tokens-ragged", "fmnist")
TOKENS = ("tokens-dense", "tokens-ragged")
MEMCPY = ("vision-dense", "tokens-dense", "fmnist")


def store_goals(names: list[str], results: dict[str, tuple[Workload, list[Row]]],
                memcpy: dict[int, float]) -> dict[str, list[Part]]:
    """The store's goal figures (bench/goals.py), from the numbers its tables print: one part per
    workload (of ``names``, every workload of the suite) and codec; None where this run lacks it."""

    def row(wname: str, backend: str) -> Row | None:
        rows = results.get(wname, (None, []))[1]
        return next((r for r in rows if r.backend == backend and r.mibs), None)

    def ref(wname: str, c: str) -> Row | None:
        rows = results.get(wname, (None, []))[1]
        return next((r for r in rows if r.backend.startswith("reference-") and r.backend.endswith("-" + c)
                     and r.mibs), None)

    def ratio(a: Row | None, b: Row | None, f: Callable[[Row], float]) -> float | None:
        return f(a) / f(b) if a and b and f(b) > 0 else None

    def durable(wname: str) -> Callable[[Row], float]:
        return lambda r: durable_mibs(results[wname][0], r)

    def gather(r: Row) -> float:
        return med(r.mibs)

    def fraction(wname: str, c: str, which: str) -> float | None:
        a = row(wname, f"loaderx-{c}")
        got = dict(ceiling_fractions(results[wname][0], a)) if a else {}
        return got.get(which)

    raw_zstd = [(w, c) for w in names for c in ("raw", "zstd")]
    zstds = [(w, c) for w in names for c in ("zstd", "zstd_dict")]
    labels = row("labels", "loaderx-raw")
    return {
        "store-gather-wheel": [Part(f"{w} {c}", ratio(row(w, f"loaderx-{c}"), ref(w, c), gather))
                               for w, c in raw_zstd],
        "store-small-zstd-wheel": [Part(w, ratio(row(w, "loaderx-zstd"), ref(w, "zstd"), gather))
                                   for w in SMALL_ZSTD],
        "store-disk-wheel": [Part(f"{w} {c}", ratio(ref(w, c), row(w, f"loaderx-{c}"), lambda r: r.disk))
                             for w, c in raw_zstd],
        "store-labels-disk": [Part("labels raw", labels.disk / results["labels"][0].nbytes if labels else None)],
        "store-token-disk-parquet": [Part(f"{w} {c}", ratio(row(w, f"loaderx-{c}"), row(w, "parquet-zstd"),
                                                            lambda r: r.disk)) for w in TOKENS
                                     for c in ("zstd_dict",)],
        "store-raw-write-ceiling": [Part(w, fraction(w, "raw", "raw write") if w in results else None)
                                    for w in names],
        "store-zstd-write-ceiling": [Part(f"{w} {c}", fraction(w, c, "compressor alone") if w in results else None)
                                     for w, c in zstds],
        "store-raw-write-wheel": [Part(w, ratio(row(w, "loaderx-raw"), ref(w, "raw"), durable(w))
                                       if w in results else None) for w in names],
        "store-gather-memcpy": [Part(f"{w}, {n} thread{'s' if n > 1 else ''}",
                                     gather(a) / bw if (a := row(w, "loaderx-raw")) else None)
                                for w in MEMCPY for n, bw in sorted(memcpy.items())],
    }


def reference_rows(wname: str, args: argparse.Namespace) -> list[Row]:
    """Runs the PyPI reference loaderx (raw, zstd) on workload ``wname`` in its own
    venv (same import name as ours), with the same plan, checks and timing."""
    import os
    import subprocess
    names = ["reference-2.5.4-raw", "reference-2.5.4-zstd"]
    try:
        from refvenv import ensure
        py = ensure()["python"]
    except (OSError, subprocess.CalledProcessError, RuntimeError) as e:
        return [Row(n, skipped=f"reference venv unavailable ({e})") for n in names]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cmd = [py, str(Path(__file__).resolve()), "--ref-child", "--workloads", wname,
           "--passes", str(args.passes), "--min-seconds", str(args.min_seconds),
           "--max-seconds", str(args.max_seconds), "--min-batches", str(args.min_batches),
           "--max-batches", str(args.max_batches), "--seed", str(args.seed),
           "--write-repeats", str(args.write_repeats), "--max-write-seconds", str(args.max_write_seconds),
           "--no-ceilings"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(REPO), check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return [Row(n, skipped=f"reference run failed: {tail}") for n in names]
    return [Row(**r) for r in json.loads(proc.stdout.strip().splitlines()[-1])]


def ref_child(args: argparse.Namespace) -> int:
    import loaderx
    version = getattr(loaderx, "__version__", "2.5.4")
    bes: list[Backend] = []
    for codec in ("raw", "zstd"):
        be = LoaderxBackend(codec)
        be.name = f"reference-{version}-{codec}"
        bes.append(be)
    w = workloads()[args.workloads]()
    rows = run_workload(w, bes, DATA / "stores-ref", args)
    print(json.dumps([asdict(r) for r in rows]))
    return 0


def parse_args(names: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=",".join(names), help=f"comma list of {names}")
    ap.add_argument("--backends", default="", help="comma list of backend names (default: all)")
    ap.add_argument("--min-seconds", type=float, default=1.0, help="timed gather time per backend and pass")
    ap.add_argument("--max-seconds", type=float, default=6.0, help="stop a slow backend after this long")
    ap.add_argument("--min-batches", type=int, default=10)
    ap.add_argument("--max-batches", type=int, default=400)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--write-repeats", type=int, default=5,
                    help="timed writes per backend (the median is reported)")
    ap.add_argument("--max-write-seconds", type=float, default=8.0,
                    help="no further write repeats once a backend's writes took this long")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--keep", action="store_true", help="keep the written stores")
    ap.add_argument("--no-doc", action="store_true", help="do not update docs/benchmarks.md")
    ap.add_argument("--no-reference", action="store_true", help="skip the reference loaderx wheel")
    ap.add_argument("--no-ceilings", dest="ceilings", action="store_false",
                    help="do not measure the machine's write ceilings beside loaderx's writes")
    ap.add_argument("--ref-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    return args


def main() -> int:
    names = list(workloads())
    args = parse_args(names)
    if args.ref_child:
        return ref_child(args)

    sys.path.insert(0, str(snapshot_loaderx()))  # a private copy: rebuilds of the shared .so can't SIGBUS us
    backends = all_backends()
    if args.backends:
        want = set(args.backends.split(","))
        backends = [b for b in backends if b.name in want]
    store_root = DATA / "stores"
    results_dir = REPO / "bench" / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_line()
    print(f"# store benchmark - {machine}")
    memcpy = {1: memcpy_mibs(1), os.cpu_count() or 1: memcpy_mibs(os.cpu_count() or 1)}
    print("memcpy bandwidth: " + ", ".join(f"{n} thread(s) {bw / 1024:.1f} GiB/s" for n, bw in memcpy.items()))
    results: dict[str, tuple[Workload, list[Row]]] = {}
    for wname in args.workloads.split(","):
        w = workloads()[wname]()
        print(f"\n## {wname}: {w.description}; {w.n} records, {w.nbytes / MiB:.1f} MiB logical, "
              f"batch {BATCH}")
        inram_passes: list[float] = []
        take_passes: list[float] = []
        rows = run_workload(w, backends, store_root, args, inram_passes, take_passes)
        if not args.no_reference and (not args.backends or "reference" in args.backends):
            nl = sum(r.backend.startswith("loaderx") for r in rows)
            rows[nl:nl] = reference_rows(wname, args)
        md, notes = render(w, rows, args.passes, memcpy, med(inram_passes) if inram_passes else 0.0,
                           med(take_passes) if take_passes else 0.0)
        results[wname] = (w, rows)
        print(md)
        if notes:
            print("\n" + notes)
        (results_dir / f"store-{wname}.json").write_text(json.dumps(
            {"machine": machine, "workload": wname, "rows": [asdict(r) for r in rows]}, indent=1))
        if not args.no_doc:
            done = [r for r in rows if r.mibs]
            png = DOCS / f"bench_store_{wname.replace('-', '_')}.png"
            bar_plot(png, f"{wname}: random gather, batch {BATCH} (logical MiB/s, higher is better)",
                     [r.backend for r in done], [med(r.mibs) for r in done], "MiB/s")
            body = (f"### Store: {wname}\n\n{w.description}; {w.n:,} records, {w.nbytes / MiB:,.1f} MiB "
                    f"logical; IID batches of {BATCH}.\nRun: {machine}.\n\n{md}\n\n"
                    + (notes + "\n\n" if notes else "") + f"![{wname} gather]({png.name})\n")
            update_doc_section(f"store-{wname}", body)
    if not args.no_doc:
        write_section("store", machine, store_goals(names, results, memcpy))
    if len(results) > 1:
        table = summary(results)
        print("\n## summary\n" + table)
        if not args.no_doc:
            update_doc_section("store-summary", (
                "### Store summary\n\nRun: " + machine + ".\nPer workload and codec, loaderx against the "
                "2.5.4 wheel (its own process, same plan) and against the best other peer of that table "
                "(named). Gather: median MiB/s of random batches of 256; write+sync: logical MiB/s of "
                "the write followed by `sync` (loaderx fsyncs inside its write; the wheel does not); "
                "write+sync / ceiling: the machine's ceiling for the same bytes over our time, 1.00 = at the "
                "ceiling (raw: the best write + fdatasync pattern for the store's bytes; zstd: the compressor "
                "alone, then the compressor plus that raw write; each the median of as many runs as our "
                "write's, against our median write; bench/ceilings.py); disk: "
                "bytes of the wheel's (peer's) store over ours, so above 1x means ours is smaller.\n\n"
                + table + "\n"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
