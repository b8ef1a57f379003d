"""loaderxd benchmark: batch hand-off latency and throughput vs the embedded loader.

Real data only: the 3x224x224 uint8 photo crops of ``bench/prepare_vision.py``
(the raw Dense store bench_loader.py builds) and the Fashion-MNIST images
(``dataset-fashion-mnist``). Three batch sizes:

* ~1 KiB  — 1 Fashion-MNIST image (784 B) per batch;
* ~1 MiB  — 7 photo crops (1.0 MiB);
* 37 MiB  — 256 photo crops (36.75 MiB).

Hand-off latency, per size, over ``--samples`` draws of a batch the daemon's
pipeline already has (the loader prefetches; each draw first sleeps
``--pause``, the same for every size so that no size gets colder caches;
longer if the batch takes longer to produce). Clocks are CLOCK_MONOTONIC
(system-wide, so the daemon's stamp and ours compare):

* **publish -> holding** (the goal's definition): the daemon stamps the slot
  when it publishes the batch (ring layout 1.1, ``SlotEntry::publish_ns``);
  the client reads the stamp once it holds the NumPy arrays. With today's
  request/reply protocol the daemon publishes when ``next`` arrives, so this
  is the reply leg: send, the client's wake-up, receive, decode, validation,
  views.
* **round trip**: from calling ``next()`` to holding the arrays (request leg
  + publish -> holding).
* **request_ahead**: ``next()`` -> holding when the ``batch`` message is
  already in the client's socket buffer because the previous ``next()``
  asked for it; the call also sends the request for the one after.
* **pushed**: the same, but the timed call sends nothing (the request went
  out before the pause, ``next(timeout=0)``): what a client pays once the
  daemon pushes ready batches.
* **embedded**: the in-process pipeline's ``next()`` of a batch it already
  has, after the same pause: the floor any hand-off is compared with.

The last three also report the call's thread CPU time (``time.thread_time``;
wall time above it is waiting for a core on this shared machine) and redraw
a sample whose batch was not ready after the pause (production, not
hand-off). A warm-cache figure (0.5 ms busy-wait instead of a sleep, 1 KiB)
gives the instruction cost of the hand-off itself.

The same hand-offs are measured at the C++ level by
``loaderx_handoff_bench`` (bench/handoff_bench.cc, built with the tree):
``Loader::Next()`` of the C++ client against the same daemon, store and
batch, in the regimes *reply* (request/reply, the client blocked in
recvmsg while the daemon publishes: publish -> holding), *request_ahead*
(queued, cold after the same pause), *pushed* and *warm* (queued, a busy-wait
instead of the sleep), with the call's thread CPU time; plus a calibration
of this machine's floor without any loaderx code (a forked process waking a
SEQPACKET receiver; a cold recvmsg of a queued frame) and the warm cost of
each stage of the C++ ``Next()`` (receive, decode, slot check, send).

The latency set runs once per ``--gather-nice`` value (the daemon's
``--gather-nice``: its gather threads that many nice levels below its io and
session threads; the daemon itself and the client at nice 0), which shows
what the CPU contention between the waking client and a 37 MiB gather costs.
``--spin-us`` values run the C++ client with ``Loader::set_spin_wait`` (poll
before blocking) for latency, CPU and throughput.

Throughput compares one client through the daemon (with and without
``request_ahead``) with the embedded DataLoader on the same job (37 MiB
batches, IID), ``--repeats`` rounds alternating, and reports the training
process's own CPU seconds per batch (``time.process_time``: every thread of
this process) — in daemon mode the gather runs in loaderxd instead. The C++
client's throughput with a consumer that is busy ``--work-ms`` per batch (a
training step on the CPU) compares the gather priorities and the spin.

Before timing, the daemon's batches are checked byte-for-byte against the
embedded loader's. Results go to docs/benchmarks.md (section ``daemon``) and
docs/bench_daemon.png.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import DATA, REPO, Daemon, machine_line, markdown_table, update_doc_section

IMAGE_STORE = DATA / "loader" / "loaderx" / "raw" / "image"
FMNIST_NPY = DATA / "fmnist_images.npy"
FMNIST_STORE = DATA / "daemon" / "fmnist-raw"
PLOT = REPO / "docs" / "bench_daemon.png"
CASES = [("~1 KiB", "1 Fashion-MNIST image", FMNIST_STORE, 1),
         ("~1 MiB", "7 photo crops", IMAGE_STORE, 7),
         ("37 MiB", "256 photo crops", IMAGE_STORE, 256)]


def loaderxd_binary(explicit: str | None) -> str:
    if explicit:
        return explicit
    if os.environ.get("LOADERXD"):
        return os.environ["LOADERXD"]
    found = glob.glob(str(REPO / "build*" / "daemon" / "loaderxd"))
    if not found:
        raise SystemExit("loaderxd not found: build it or pass --loaderxd")
    return max(found, key=os.path.getmtime)


def handoff_bench_binary(explicit: str | None) -> str:
    """The C++ client benchmark (CMake target ``loaderx_handoff_bench``)."""
    if explicit:
        return explicit
    found = [p for p in glob.glob(str(REPO / "build*" / "loaderx_handoff_bench")) if os.access(p, os.X_OK)]
    if not found:
        raise SystemExit("loaderx_handoff_bench not found: build it or pass --handoff-bench")
    return max(found, key=os.path.getmtime)


def run_cpp(exe: str, *args: object) -> dict[str, Any]:
    """Runs the C++ benchmark and returns its JSON object."""
    r = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=1800, check=False)
    if r.returncode != 0:
        raise SystemExit(f"{exe} failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def ensure_stores() -> None:
    from loaderx.zrecord import Dense

    if not IMAGE_STORE.exists():
        raise SystemExit(f"{IMAGE_STORE} missing: run bench/prepare_vision.py and bench_loader.py first")
    if not FMNIST_STORE.exists():
        images = np.load(FMNIST_NPY, mmap_mode="r")
        FMNIST_STORE.parent.mkdir(parents=True, exist_ok=True)
        with Dense.create(str(FMNIST_STORE), images.dtype, images.shape[1:], codec="raw") as s:
            s.append(images)


def check_identical(sock: str, store: Path, batch: int) -> None:
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Dense

    with Dense.open(str(store)) as s, DataLoader({"x": s}, batch_size=batch, seed=1, daemon=sock) as remote, \
            DataLoader({"x": s}, batch_size=batch, seed=1) as local:
        for _ in range(3):
            a, b = next(remote)["x"], next(local)["x"]
            if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(a, b):
                raise SystemExit(f"daemon batch differs from embedded for {store.name} batch {batch}")


@dataclass
class Latency:
    """Microsecond samples of one batch size."""

    nbytes: int
    pause: float
    publish_to_holding: list[float]
    round_trip: list[float]
    queued: list[float]
    queued_cpu: list[float]
    pushed: list[float]
    pushed_cpu: list[float]
    embedded: list[float]
    embedded_cpu: list[float]
    skipped: int = 0  # draws whose batch was not ready after the pause (not counted)


@dataclass
class CppLatency:
    """Microsecond samples of the C++ client (bench/handoff_bench.cc) for one size."""

    nbytes: int
    pause_ms: float
    publish_to_holding: list[float]
    round_trip: list[float]
    reply_cpu: list[float]
    queued: list[float]
    queued_cpu: list[float]
    pushed: list[float]
    pushed_cpu: list[float]
    warm: list[float]
    warm_cpu: list[float]
    pushed_warm: list[float]
    pushed_warm_cpu: list[float]
    skipped: int

    @classmethod
    def run(cls, exe: str, sock: str, store: Path, batch: int, samples: int, pause: float,
            spin_us: int = 0) -> CppLatency:
        got = run_cpp(exe, "--socket", sock, "--store", store, "--batch", batch, "--samples", samples,
                      "--pause-ms", pause * 1e3, "--spin-us", spin_us)
        return cls(**{k: v for k, v in got.items() if k in cls.__dataclass_fields__})


def pct(samples: list[float], q: float) -> float:
    """The median for q = 50, else the nearest-rank q-th percentile."""
    if q == 50:
        return statistics.median(samples)
    s = sorted(samples)
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


def _timed_ready_draw(src: Any, out: Latency, wall: list[float], cpu: list[float]) -> None:
    """One timed next() whose batch was published before the call: appends its
    wall and thread-CPU microseconds; a batch published during the call was
    not ready within the pause (production, not hand-off) and is only counted
    in ``out.skipped``."""
    c0, t0 = time.thread_time_ns(), time.monotonic_ns()
    _, values = src.next(None)
    arr = values[0]  # holding the array: the hand-off is complete
    t1, c1 = time.monotonic_ns(), time.thread_time_ns()
    del values, arr
    if src.last_publish_ns >= t0:
        out.skipped += 1
        return
    wall.append((t1 - t0) / 1e3)
    cpu.append((c1 - c0) / 1e3)



def handoff(sock: str, store: Path, batch: int, samples: int, threads: int,
            min_pause: float) -> Latency:
    from loaderx import _loaderx
    from loaderx.sources import native_store as _native_store
    from loaderx.zrecord import Dense

    src = _loaderx.DaemonLoader(sock, [str(store)], batch, 1, 7, 0, 1, 0, 2, 4, 0)
    try:
        # The daemon's steady production time per batch (back-to-back draws
        # once the prefetch is drained), so each timed draw finds its batch
        # ready after sleeping a few of those.
        for _ in range(3):
            _, values = src.next(None)
            nbytes = values[0].nbytes
            del values
        t = time.perf_counter()
        for _ in range(8):
            _, values = src.next(None)
            del values
        # One pause for every size (--pause), so that a size dependence is
        # not a difference in how cold the caches got while we slept.
        pause = max(min_pause, 0.001 + 3 * (time.perf_counter() - t) / 8)
        out = Latency(nbytes, pause, [], [], [], [], [], [], [], [])
        for _ in range(samples):  # request/reply: the client waits while the daemon publishes
            time.sleep(pause)
            t0 = time.monotonic_ns()
            _, values = src.next(None)
            arr = values[0]  # holding the array: the hand-off is complete
            t1 = time.monotonic_ns()
            stamp = src.last_publish_ns
            if not t0 <= stamp <= t1:  # batches are copy-on-write views now: writeable is expected
                raise SystemExit(f"publish stamp {stamp} outside the draw [{t0}, {t1}]")
            del values, arr
            out.round_trip.append((t1 - t0) / 1e3)
            out.publish_to_holding.append((t1 - stamp) / 1e3)
        src.request_ahead = True  # from now on each next() finds its batch queued
        src.next(None)  # its return requests the first batch ahead
        while len(out.queued) < samples:
            time.sleep(pause)
            _timed_ready_draw(src, out, out.queued, out.queued_cpu)
        # A pushed batch, simulated: the request goes out before the pause
        # (next(timeout=0) returns None at once and leaves the reply owed),
        # so the timed call only receives; unlike request_ahead it sends
        # nothing. What the client pays once the daemon pushes ready batches.
        src.request_ahead = False
        src.next(None)  # collects the batch requested ahead above
        while len(out.pushed) < samples:
            if src.next(0.0) is not None:  # answered at once: not a pushed draw
                continue
            time.sleep(pause)
            _timed_ready_draw(src, out, out.pushed, out.pushed_cpu)
    finally:
        src.close()
    with Dense.open(str(store)) as s:
        pipe = _loaderx.Pipeline([_native_store("x", s)], len(s), batch, 1, 7, 0, 1, 0, 2, threads)
        try:
            for _ in range(3):
                pipe.next(None)
            while len(out.embedded) < samples:
                time.sleep(pause)
                c0, t0 = time.thread_time_ns(), time.monotonic_ns()
                got = pipe.next(0.0)  # None: not ready within the pause, not a hand-off
                t1, c1 = time.monotonic_ns(), time.thread_time_ns()
                if got is None:
                    out.skipped += 1
                    pipe.next(None)
                    continue
                del got
                out.embedded.append((t1 - t0) / 1e3)
                out.embedded_cpu.append((c1 - c0) / 1e3)
        finally:
            pipe.close()
    return out


def hot_queued(sock: str, samples: int) -> tuple[float, float]:
    """p50 wall and thread-CPU µs of a queued 1 KiB ``next()`` with warm caches.

    Between draws the client busy-waits 0.5 ms (the reply arrives meanwhile)
    instead of sleeping, so nothing else runs on its core and evicts it: the
    instruction cost of the hand-off itself.
    """
    from loaderx import _loaderx

    src = _loaderx.DaemonLoader(sock, [str(FMNIST_STORE)], 1, 1, 7, 0, 1, 0, 2, 4, 0)
    try:
        src.request_ahead = True
        for _ in range(5):
            src.next(None)
        wall, cpu = [], []
        for _ in range(samples):
            end = time.monotonic_ns() + 500_000
            while time.monotonic_ns() < end:
                pass
            c0, t0 = time.thread_time_ns(), time.monotonic_ns()
            _, values = src.next(None)
            arr = values[0]
            t1, c1 = time.monotonic_ns(), time.thread_time_ns()
            del values, arr
            wall.append((t1 - t0) / 1e3)
            cpu.append((c1 - c0) / 1e3)
        return statistics.median(wall), statistics.median(cpu)
    finally:
        src.close()


def throughput(sock: str | None, batches: int, request_ahead: bool = False) -> tuple[float, float]:
    """Batches/s and this process's CPU seconds per batch (embedded if ``sock`` is None)."""
    from loaderx.client import DaemonOptions
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Dense

    with Dense.open(str(IMAGE_STORE)) as s:
        kw = {"daemon": DaemonOptions(sock, request_ahead=request_ahead)} if sock else {}
        with DataLoader({"x": s}, batch_size=256, seed=3, **kw) as loader:
            for _ in range(5):
                next(loader)
            cpu0, t0 = time.process_time(), time.perf_counter()
            for _ in range(batches):
                next(loader)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return batches / wall, cpu / batches


Row = tuple[Latency, CppLatency]


def plot(results: dict[int, list[Row]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4.6), dpi=110,
                             sharey=True, squeeze=False)
    axes = axes[0]
    sizes = [f"{c[0]}\n({c[1]})" for c in CASES]
    x = np.arange(len(CASES))
    # (label, side (0 Python, 1 C++), field, colour)
    series = [("Python publish -> holding", 0, "publish_to_holding", "#d95f02"),
              ("Python request_ahead (queued)", 0, "queued", "#1b9e77"),
              ("Python embedded next()", 0, "embedded", "#999999"),
              ("C++ publish -> holding", 1, "publish_to_holding", "#7570b3"),
              ("C++ request_ahead (queued, cold)", 1, "queued", "#66a61e"),
              ("C++ queued, warm", 1, "warm", "#e7298a")]
    width = 0.8 / len(series)
    for ax, (gnice, rows) in zip(axes, sorted(results.items())):
        for i, (label, side, field, color) in enumerate(series):
            p50 = [pct(getattr(row[side], field), 50) for row in rows]
            p99 = [pct(getattr(row[side], field), 99) for row in rows]
            xs = x + (i - (len(series) - 1) / 2) * width
            ax.bar(xs, p50, width * 0.9, color=color, label=label)
            ax.scatter(xs, p99, color=color, marker="_", s=160, linewidths=2)
        ax.axhline(20, color="k", lw=0.8, ls="--")
        ax.text(x[-1] + 0.45, 21, "goal p50 20 µs", ha="right", va="bottom", fontsize=7)
        ax.set_yscale("log")
        ax.set_xticks(x, sizes, fontsize=8)
        ax.set_title(f"daemon --gather-nice {gnice}", fontsize=10)
        ax.grid(axis="y", alpha=0.3, which="both")
    axes[0].set_ylabel("µs (log)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7.5, frameon=False)
    fig.suptitle("loaderxd hand-off latency, Python and C++ clients (bars p50, ticks p99)", fontsize=10)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def p50_99(samples: list[float], digits: int = 0) -> str:
    return f"{pct(samples, 50):.{digits}f} / {pct(samples, 99):.{digits}f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loaderxd")
    ap.add_argument("--handoff-bench", help="the loaderx_handoff_bench binary")
    ap.add_argument("--samples", type=int, default=150)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pause", type=float, default=0.08,
                    help="seconds between timed draws, the same for every size")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--gather-nice", type=int, nargs="+", default=[0, 5, 10],
                    help="daemon --gather-nice values for the latency set and the priority throughput")
    ap.add_argument("--default-gather-nice", type=int, default=0,
                    help="loaderxd's default --gather-nice, used for the spin and throughput runs")
    ap.add_argument("--spin-us", type=int, nargs="+", default=[0, 100, 1000],
                    help="C++ client spin waits to compare (Loader::set_spin_wait)")
    ap.add_argument("--work-ms", type=float, default=8.0,
                    help="busy time per batch of the consumer in the C++ throughput runs")
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    ensure_stores()
    load_before = os.getloadavg()[0]
    exe = loaderxd_binary(args.loaderxd)
    cpp = handoff_bench_binary(args.handoff_bench)
    default_gnice = args.default_gather_nice

    calib = run_cpp(cpp, "--calibrate", "--samples", args.samples, "--pause-ms", args.pause * 1e3)
    print(f"calibration: SEQPACKET wake-up p50 {pct(calib['wake'], 50):.1f} us, cold queued recvmsg"
          f" p50 {pct(calib['queued_cold_recv'], 50):.1f} us", flush=True)

    results: dict[int, list[Row]] = {}
    hot = (float("nan"), float("nan"))
    for gnice in args.gather_nice:
        daemon = Daemon(exe, "--threads", str(args.threads), "--gather-nice", str(gnice))
        try:
            results[gnice] = []
            for size, what, store, batch in CASES:
                check_identical(daemon.sock, store, batch)
                lat = handoff(daemon.sock, store, batch, args.samples, args.threads, args.pause)
                c = CppLatency.run(cpp, daemon.sock, store, batch, args.samples, args.pause)
                results[gnice].append((lat, c))
                print(f"gather-nice {gnice} {size}: Python publish->holding"
                      f" {p50_99(lat.publish_to_holding, 1)} us, queued {p50_99(lat.queued, 1)} (CPU"
                      f" {pct(lat.queued_cpu, 50):.1f}), embedded {p50_99(lat.embedded, 1)}; C++"
                      f" publish->holding {p50_99(c.publish_to_holding, 1)} (CPU {pct(c.reply_cpu, 50):.1f}),"
                      f" queued {p50_99(c.queued, 1)} (CPU {pct(c.queued_cpu, 50):.1f}), pushed"
                      f" {p50_99(c.pushed, 1)}, warm {p50_99(c.warm, 1)} (CPU {pct(c.warm_cpu, 50):.1f}),"
                      f" pushed warm {p50_99(c.pushed_warm, 1)} (CPU {pct(c.pushed_warm_cpu, 50):.1f});"
                      f" pause {lat.pause * 1e3:.0f} ms, not ready {lat.skipped} / {c.skipped}", flush=True)
            if gnice == default_gnice:
                hot = hot_queued(daemon.sock, args.samples)
                print(f"warm queued 1 KiB (Python): p50 {hot[0]:.1f} us wall, {hot[1]:.1f} us CPU", flush=True)
        finally:
            daemon.close()

    # The C++ client's spin wait at the default gather priority: latency of
    # the request/reply hand-off and its CPU, at the smallest and largest size.
    spin_rows = []
    daemon = Daemon(exe, "--threads", str(args.threads), "--gather-nice", str(default_gnice))
    try:
        for spin in args.spin_us:
            row = [str(spin)]
            for size, _, store, batch in (CASES[0], CASES[-1]):
                c = CppLatency.run(cpp, daemon.sock, store, batch, max(30, args.samples // 3),
                                   args.pause, spin)
                row += [p50_99(c.publish_to_holding), f"{pct(c.reply_cpu, 50):.0f}"]
            for work in (0.0, args.work_ms):
                t = run_cpp(cpp, "--socket", daemon.sock, "--store", IMAGE_STORE, "--batch", 256,
                            "--throughput", args.batches, "--work-us", work * 1e3, "--spin-us", spin)
                row += [f"{t['batches_per_s']:.1f}", f"{t['cpu_ms_per_batch']:.2f}"]
            spin_rows.append(row)
            print(f"spin {spin} us: {row[1:]}", flush=True)
    finally:
        daemon.close()

    # Gather priority against a consumer that works on the CPU: C++ client,
    # 37 MiB batches, request_ahead, no spin.
    gnice_rows = []
    for gnice in args.gather_nice:
        daemon = Daemon(exe, "--threads", str(args.threads), "--gather-nice", str(gnice))
        try:
            row = [str(gnice)]
            for work in (0.0, args.work_ms):
                t = run_cpp(cpp, "--socket", daemon.sock, "--store", IMAGE_STORE, "--batch", 256,
                            "--throughput", args.batches, "--work-us", work * 1e3)
                row += [f"{t['batches_per_s']:.1f}", f"{t['cpu_ms_per_batch']:.2f}"]
            gnice_rows.append(row)
            print(f"gather-nice {gnice} throughput: {row[1:]}", flush=True)
        finally:
            daemon.close()

    # Rounds of (embedded, daemon, daemon + request_ahead): (batches/s, CPU s/batch) each.
    runs: list[list[tuple[float, float]]] = []
    daemon = Daemon(exe, "--threads", str(args.threads), "--gather-nice", str(default_gnice))
    try:
        for r in range(args.repeats):
            runs.append([throughput(None, args.batches), throughput(daemon.sock, args.batches),
                         throughput(daemon.sock, args.batches, request_ahead=True)])
            (e, ec), (d, dc), (a, ac) = runs[-1]
            print(f"throughput {r + 1}: embedded {e:.1f} b/s ({ec * 1e3:.2f} ms CPU/batch), daemon"
                  f" {d:.1f} ({dc * 1e3:.2f}), daemon + request_ahead {a:.1f} ({ac * 1e3:.2f});"
                  f" ratios {d / e:.2f} {a / e:.2f}", flush=True)
    finally:
        daemon.close()
    load_after = os.getloadavg()[0]

    lat_rows, cpp_rows = [], []
    for gnice, rows in sorted(results.items()):
        for (size, what, _, _), (lat, c) in zip(CASES, rows):
            row = [f"{size} ({what})", str(gnice)]
            for f in ("publish_to_holding", "round_trip", "queued", "pushed", "embedded"):
                row.append(p50_99(getattr(lat, f)))
                if f in ("queued", "pushed", "embedded"):
                    row.append(f"{pct(getattr(lat, f + '_cpu'), 50):.0f}")
            row += [p50_99(c.publish_to_holding, 1), p50_99(c.queued, 1)]
            lat_rows.append(row)
            cpp_rows.append([f"{size}", str(gnice), p50_99(c.publish_to_holding, 1),
                             p50_99(c.round_trip), f"{pct(c.reply_cpu, 50):.1f}",
                             p50_99(c.queued, 1), f"{pct(c.queued_cpu, 50):.1f}",
                             p50_99(c.pushed, 1), f"{pct(c.pushed_cpu, 50):.1f}",
                             p50_99(c.warm, 1), f"{pct(c.warm_cpu, 50):.1f}",
                             p50_99(c.pushed_warm, 1), f"{pct(c.pushed_warm_cpu, 50):.1f}"])
    tp_rows = []
    for r, ((e, ec), (d, dc), (a, ac)) in enumerate(runs, 1):
        tp_rows.append([str(r), f"{e:.1f}", f"{d:.1f} ({d / e:.2f}x)", f"{a:.1f} ({a / e:.2f}x)",
                        f"{ec * 1e3:.2f}", f"{dc * 1e3:.2f}", f"{ac * 1e3:.2f}"])

    def med(i: int, j: int) -> float:
        return statistics.median(run[i][j] for run in runs)

    e, d, a = med(0, 0), med(1, 0), med(2, 0)
    tp_rows.append(["median", f"{e:.1f}", f"{d:.1f} ({d / e:.2f}x)", f"{a:.1f} ({a / e:.2f}x)",
                    f"{med(0, 1) * 1e3:.2f}", f"{med(1, 1) * 1e3:.2f}", f"{med(2, 1) * 1e3:.2f}"])

    def stage(name: str) -> str:
        return f"{pct(calib[name], 50):.2f}"

    body = "\n".join([
        "## loaderxd (bench/bench_daemon.py)",
        "",
        (f"One run on {machine_line()}; 1-minute load average {load_before:.1f} before the run"
         f" and {load_after:.1f} after (other work shares these 2 cores: tails and the throughput"
         " ratio move with it). Real data: Fashion-MNIST images and 3x224x224 uint8 photo crops"
         " (raw Dense stores). Daemon batches were checked byte-identical to the embedded"
         " loader's before timing, by both clients."),
        "",
        f"Hand-off latency in µs (p50 / p99), {args.samples} draws per cell, each of a batch",
        f"the daemon's pipeline already had, after a {args.pause * 1e3:.0f} ms sleep (the same for every",
        "size). *publish → holding*: from the daemon's publish stamp in the slot (CLOCK_MONOTONIC)",
        "to the client holding the batch (Python: the read-only NumPy view; C++: `Loader::Next()`",
        "returned a `Batch` and its `Dense(0)` view is built), the client blocked in `recvmsg`",
        "while the daemon publishes (request/reply). *round trip*: from calling `next()` to",
        "holding it. *request_ahead*: `next()` → holding when the `batch` message is already in",
        "the socket because the previous `next()` asked for it (the call also sends the request",
        "for the one after). *pushed*: the same, but the call sends nothing (the request went out",
        "before the sleep): what a client pays once the daemon pushes ready batches. *embedded*:",
        "the in-process pipeline's `next()` of a ready batch. *CPU*: that call's thread CPU time",
        "(p50); wall time above it is waiting for a core. Draws whose batch was not ready after",
        "the sleep (production, not hand-off) are redrawn for request_ahead, pushed and embedded.",
        "*gather-nice*: the daemon's `--gather-nice` (its gather threads that many nice levels",
        "below its io and session threads; daemon and client at nice 0).",
        "Batches: ~1 KiB = 784 B, ~1 MiB = 1,053,696 B, 37 MiB = 38,535,168 B.",
        "",
        markdown_table(["batch", "gather-nice", "publish→holding", "round trip", "request_ahead", "CPU",
                        "pushed", "CPU", "embedded", "CPU", "C++ publish→holding",
                        "C++ request_ahead"],
                       lat_rows, "lrrrrrrrrrrr"),
        "",
        "The C++ client (`bench/handoff_bench.cc`, target `loaderx_handoff_bench`) in detail;",
        "*warm*: request_ahead with a busy-wait instead of the sleep between draws (the core",
        "and its caches stay the client's; at least twice the batch's production time);",
        "*pushed warm*: the same for a pushed draw (nothing sent in the call): the cost of the",
        "hand-off itself — receive, decode, checks, views:",
        "",
        markdown_table(["batch", "gather-nice", "publish→holding", "round trip", "CPU",
                        "request_ahead", "CPU", "pushed", "CPU", "warm", "CPU", "pushed warm",
                        "CPU"],
                       cpp_rows, "lrrrrrrrrrrrr"),
        "",
        (f"Floor of this machine, no loaderx code ({args.samples} draws, same sleep): a forked"
         " process sending a 200-byte SEQPACKET message wakes a receiver blocked in `recv` in"
         f" {p50_99(calib['wake'], 1)} µs (p50 / p99); a cold `recv` of a frame already queued"
         f" takes {p50_99(calib['queued_cold_recv'], 1)} µs. Warm p50 of the stages of the C++"
         f" `Next()` (µs, 20,000 calls each): `SendFrame` of `next` {stage('stage_send')},"
         f" `RecvFrame` of a queued `batch` frame {stage('stage_recv')}, `DecodeMessage`"
         f" {stage('stage_decode')}, `CheckSlot` {stage('stage_check_slot')}."),
        "",
        "Warm caches, Python (1 KiB, request_ahead, 0.5 ms busy-wait instead of a sleep between draws):",
        f"queued `next()` → holding p50 {hot[0]:.1f} µs wall, {hot[1]:.1f} µs thread CPU.",
        "",
        "![loaderx hand-off latency](bench_daemon.png)",
        "",
        (f"C++ client spin wait (`Loader::set_spin_wait`, poll before blocking), daemon"
         f" --gather-nice {default_gnice}: request/reply publish → holding p50 / p99 and the"
         f" call's CPU (µs), then 37 MiB throughput with request_ahead, {args.batches} batches,"
         f" with the consumer idle and busy {args.work_ms:g} ms per batch (batches/s, the"
         " client thread's CPU ms per batch):"),
        "",
        markdown_table(["spin µs", "1 KiB p→h", "CPU", "37 MiB p→h", "CPU", "b/s idle", "CPU ms",
                        f"b/s busy {args.work_ms:g} ms", "CPU ms"], spin_rows, "rrrrrrrrr"),
        "",
        (f"Gather priority and throughput (C++ client, 37 MiB, request_ahead, {args.batches}"
         f" batches, consumer idle / busy {args.work_ms:g} ms per batch):"),
        "",
        markdown_table(["gather-nice", "b/s idle", "CPU ms", f"b/s busy {args.work_ms:g} ms", "CPU ms"],
                       gnice_rows, "rrrrr"),
        "",
        f"Throughput, 256 photo crops per batch (37 MiB), IID, {args.batches} batches per run,",
        f"embedded / daemon / daemon with `request_ahead` alternating (daemon --threads {args.threads},",
        f"--gather-nice {default_gnice}); CPU = the training process's own CPU time per batch:",
        "",
        markdown_table(["round", "embedded b/s", "daemon b/s", "daemon + request_ahead b/s",
                        "embedded CPU ms", "daemon CPU ms", "+ request_ahead CPU ms"],
                       tp_rows, "lrrrrrr"),
    ])
    if not args.no_doc:
        plot(results, PLOT)
        update_doc_section("daemon", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
