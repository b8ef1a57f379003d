"""loaderxd benchmark (protocol 1.4): batch hand-off latency and throughput vs the embedded loader.

Real data only: the 3x224x224 uint8 photo crops of ``bench/prepare_vision.py``
(the raw Dense store bench_loader.py builds) and the Fashion-MNIST images
(``dataset-fashion-mnist``). Three batch sizes:

* ~1 KiB  — 1 Fashion-MNIST image (784 B) per batch;
* ~1 MiB  — 7 photo crops (1.0 MiB);
* 37 MiB  — 256 photo crops (36.75 MiB).

It measures what the loaderxd speed goals name (docs/benchmarks.md,
"Goals"), one run, the machine's floor beside. The daemon pushes the next
ready batch one ahead of what the caller took (the push window of one)
while the client holds fewer than its credit (the lease cap), into the
loader's shared-memory push queue (protocol 1.4), so a batch the daemon has
ready is already there when the caller asks. Clocks are CLOCK_MONOTONIC
(system-wide, so the daemon's publish stamp in the slot and ours compare):

* **Floor** (``loaderx_handoff_bench --calibrate``, no loaderx code): a cold
  ``recvmsg`` of a frame already queued, after the same pause; beside it a
  blocked receiver's cross-process wake-up and the warm cost of each stage
  of the C++ ``NextUntil``.
* **C++ client** (``loaderx_handoff_bench``, bench/handoff_bench.cc), per
  size: a *ready* batch after a ``--pause`` sleep (cold: ``NextUntil`` ->
  holding the views; the caller holds its previous batch through the call,
  as a training loop does, and once holding nothing), the same with 3 ms of
  busy-wait after the sleep (warm: the client computes before it asks, as a
  training step does; one warm-up at every size), and the *credit* round trip (the client holds
  its whole credit, frees one batch and takes the next: release -> push ->
  holding, and from the slot's publish stamp -> holding), each with the
  call's thread CPU time.
* **Python client**, per size: ``next()`` of a ready batch after the same
  pause through loaderxd (default copy-on-write views, and
  ``shared_view=True``) against the embedded pipeline's ``next()`` of a
  ready batch; and warm at 1 KiB (0.5 ms busy-wait instead of the sleep),
  both hosts.
* **Throughput**: one client through loaderxd against the embedded
  DataLoader on 37 MiB batches (IID), ``--repeats`` rounds of ``--batches``
  each, the two hosts alternating and taking turns to go first, with
  the training process's own CPU seconds per batch (``time.process_time``:
  every thread of this process; through the daemon the gather runs in
  loaderxd).

A draw whose batch was published after the call began was not ready
(production, not hand-off): it is redrawn and counted as not ready. Before
timing, the daemon's batches are checked byte-for-byte against the embedded
loader's by both clients. Results go to docs/benchmarks.md (section
``daemon``, between its markers) and docs/bench_daemon.png; ``--quick`` is a
smoke run (few samples) that publishes nothing. A full run takes about 5
minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (
    DATA,
    REPO,
    Daemon,
    bench_binary,
    machine_line,
    markdown_table,
    run_cpp,
    update_doc_section,
)
from goals import BY_ID, Part, bullets, section_result, write_result

IMAGE_STORE = DATA / "loader" / "loaderx" / "raw" / "image"
FMNIST_NPY = DATA / "fmnist_images.npy"
FMNIST_STORE = DATA / "daemon" / "fmnist-raw"
PLOT = REPO / "docs" / "bench_daemon.png"
CASES = [("~1 KiB", "1 Fashion-MNIST image", FMNIST_STORE, 1),
         ("~1 MiB", "7 photo crops", IMAGE_STORE, 7),
         ("37 MiB", "256 photo crops", IMAGE_STORE, 256)]
LEASES = 4  # the benchmark loaders' credit
PREFETCH = 2
SEED = 7
# The warm goal (µs p50; bench/goals.py), drawn on the plot.
GOAL_CPP_WARM = BY_ID["daemon-cpp-warm"].limit


def loaderxd_binary(explicit: str | None) -> str:
    if explicit:
        return explicit
    if os.environ.get("LOADERXD"):
        return os.environ["LOADERXD"]
    found = glob.glob(str(REPO / "build*" / "daemon" / "loaderxd"))
    if not found:
        raise SystemExit("loaderxd not found: build it or pass --loaderxd")
    return max(found, key=os.path.getmtime)


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
class PyLatency:
    """Microsecond samples of the Python client for one batch size."""

    nbytes: int
    pause: float
    daemon: list[float]
    daemon_cpu: list[float]
    shared: list[float]
    shared_cpu: list[float]
    embedded: list[float]
    embedded_cpu: list[float]
    skipped: int = 0  # draws whose batch was not ready after the pause (redrawn)


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
    queued_bare: list[float]
    queued_bare_cpu: list[float]
    warm: list[float]
    warm_cpu: list[float]
    skipped: int

    @classmethod
    def run(cls, exe: str, sock: str, store: Path, batch: int, samples: int, pause: float,
            *extra: str) -> CppLatency:
        got = run_cpp(exe, "--socket", sock, "--store", store, "--batch", batch, "--samples", samples,
                      "--pause-ms", pause * 1e3, *extra)
        return cls(**{k: v for k, v in got.items() if k in cls.__dataclass_fields__})


def pct(samples: list[float], q: float) -> float:
    """The median for q = 50, else the nearest-rank q-th percentile."""
    if q == 50:
        return statistics.median(samples)
    s = sorted(samples)
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


def daemon_source(sock: str, store: Path, batch: int, shared_view: bool = False) -> Any:
    from loaderx import _loaderx

    spec = _loaderx.LoaderSpec(stores=[str(store)], batch_size=batch, mode=1, seed=SEED,
                               prefetch=PREFETCH, leases=LEASES, shared_view=shared_view)
    return _loaderx.DaemonLoader(sock, spec)


def ready_draws(src: Any, samples: int, wait: Any, out: PyLatency, wall: list[float],
                cpu: list[float]) -> None:
    """``samples`` timed ``next()`` calls of a daemon source, each after
    ``wait()``, of a batch published before the call (pushed meanwhile);
    one published during the call is redrawn (counted in ``out.skipped``).
    The previous batch is held through the call and dropped after it, as
    ``for batch in loader`` does (its release carries the take: docs/protocol.md
    "Consumed positions")."""
    held: list[Any] = []
    for _ in range(20 * samples):
        if len(wall) >= samples:
            return
        wait()
        c0, t0 = time.thread_time_ns(), time.monotonic_ns()
        _, values = src.next(None)
        arr = values[0]  # holding the array: the hand-off is complete
        t1, c1 = time.monotonic_ns(), time.thread_time_ns()
        held[:] = [arr]  # the previous batch goes now: its release carries this take
        del values, arr
        if src.last_publish_ns >= t0:
            out.skipped += 1
            continue
        wall.append((t1 - t0) / 1e3)
        cpu.append((c1 - c0) / 1e3)
    raise SystemExit("batches were rarely ready after the pause: raise --pause")


def embedded_draws(pipe: Any, samples: int, wait: Any, out: PyLatency, wall: list[float],
                   cpu: list[float]) -> None:
    """The same for the embedded pipeline: ``next(0.0)`` is None when the
    batch was not ready (redrawn)."""
    held: list[Any] = []
    for _ in range(20 * samples):
        if len(wall) >= samples:
            return
        wait()
        c0, t0 = time.thread_time_ns(), time.monotonic_ns()
        got = pipe.next(0.0)
        t1, c1 = time.monotonic_ns(), time.thread_time_ns()
        if got is None:
            out.skipped += 1
            pipe.next(None)
            continue
        held[:] = [got]  # as the daemon pass: the previous batch goes after the call
        del got
        wall.append((t1 - t0) / 1e3)
        cpu.append((c1 - c0) / 1e3)
    raise SystemExit("embedded batches were rarely ready after the pause: raise --pause")


def production_pause(src: Any, min_pause: float) -> tuple[int, float]:
    """Batch bytes and the pause for this size: at least ``min_pause`` (the
    same for every size, so a size dependence is not a difference in how
    cold the caches got), and at least three times the daemon's steady
    production time per batch (back-to-back draws, the pushed ones drained)."""
    for _ in range(LEASES + 2):
        _, values = src.next(None)
        nbytes = values[0].nbytes
        del values
    t = time.perf_counter()
    for _ in range(8):
        _, values = src.next(None)
        del values
    return nbytes, max(min_pause, 0.001 + 3 * (time.perf_counter() - t) / 8)


def embedded_pass(store: Path, batch: int, threads: int, samples: int,
                  wait: Callable[[], None], out: PyLatency) -> None:
    """The embedded pipeline's ``next()`` of a ready batch, into ``out.embedded``."""
    from loaderx import _loaderx
    from loaderx.sources import native_store as _native_store
    from loaderx.zrecord import Dense

    with Dense.open(str(store)) as s:
        pipe = _loaderx.Pipeline([_native_store("x", s)], n=len(s), batch_size=batch, mode=1, seed=SEED,
                                 rank=0, world_size=1, start_step=0, prefetch=PREFETCH,
                                 num_threads=threads)
        try:
            for _ in range(3):
                pipe.next(None)
            embedded_draws(pipe, samples, wait, out, out.embedded, out.embedded_cpu)
        finally:
            pipe.close()


def python_handoff(sock: str, store: Path, batch: int, samples: int, threads: int,
                   min_pause: float) -> PyLatency:
    def sleep() -> None:
        time.sleep(out.pause)

    src = daemon_source(sock, store, batch)
    try:
        nbytes, pause = production_pause(src, min_pause)
        out = PyLatency(nbytes, pause, [], [], [], [], [], [])
        ready_draws(src, samples, sleep, out, out.daemon, out.daemon_cpu)
    finally:
        src.close()
    src = daemon_source(sock, store, batch, shared_view=True)
    try:
        production_pause(src, min_pause)
        ready_draws(src, samples, sleep, out, out.shared, out.shared_cpu)
    finally:
        src.close()
    embedded_pass(store, batch, threads, samples, sleep, out)
    return out


def busy_wait() -> None:
    end = time.monotonic_ns() + 500_000
    while time.monotonic_ns() < end:
        pass


def python_warm(sock: str, samples: int, threads: int) -> PyLatency:
    """1 KiB ``next()`` of a ready batch with warm caches, both hosts: a 0.5 ms
    busy-wait between draws instead of a sleep, so nothing else runs on the
    client's core and evicts it: the instruction cost of the hand-off itself."""
    out = PyLatency(0, 0.0005, [], [], [], [], [], [])
    src = daemon_source(sock, FMNIST_STORE, 1)
    try:
        production_pause(src, 0.0)
        ready_draws(src, samples, busy_wait, out, out.daemon, out.daemon_cpu)
    finally:
        src.close()
    embedded_pass(FMNIST_STORE, 1, threads, samples, busy_wait, out)
    return out


def throughput(sock: str | None, batches: int) -> tuple[float, float]:
    """Batches/s and this process's CPU seconds per batch (embedded if ``sock`` is None)."""
    from loaderx.client import DaemonOptions
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Dense

    with Dense.open(str(IMAGE_STORE)) as s:
        kw = {"daemon": DaemonOptions(sock)} if sock else {}
        with DataLoader({"x": s}, batch_size=256, seed=3, **kw) as loader:
            for _ in range(5):
                next(loader)
            cpu0, t0 = time.process_time(), time.perf_counter()
            for _ in range(batches):
                next(loader)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return batches / wall, cpu / batches


Row = tuple[PyLatency, CppLatency, CppLatency]  # the C++ draws with the push queue, then on the socket


def plot(rows: list[Row], floor: float, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.6), dpi=110)
    sizes = [f"{c[0]}\n({c[1]})" for c in CASES]
    x = np.arange(len(CASES))
    # (label, side (0 Python, 1 C++), field, colour)
    series = [("Python daemon next(), ready", 0, "daemon", "#d95f02"),
              ("Python daemon, shared_view", 0, "shared", "#e6ab02"),
              ("Python embedded next(), ready", 0, "embedded", "#999999"),
              ("C++ ready, cold", 1, "queued", "#1b9e77"),
              ("C++ ready, cold, socket push", 2, "queued", "#66a61e"),
              ("C++ ready, warm", 1, "warm", "#e7298a"),
              ("C++ credit: publish -> holding", 1, "publish_to_holding", "#7570b3")]
    width = 0.8 / len(series)
    for i, (label, side, field, color) in enumerate(series):
        p50 = [pct(getattr(row[side], field), 50) for row in rows]
        p99 = [pct(getattr(row[side], field), 99) for row in rows]
        xs = x + (i - (len(series) - 1) / 2) * width
        ax.bar(xs, p50, width * 0.9, color=color, label=label)
        ax.scatter(xs, p99, color=color, marker="_", s=160, linewidths=2)
    ax.axhline(floor, color="k", lw=0.8, ls=":")
    ax.text(x[-1] + 0.45, floor * 0.97, f"floor: cold recvmsg {floor:.0f} µs", ha="right", va="top",
            fontsize=7)
    ax.axhline(GOAL_CPP_WARM, color="k", lw=0.8, ls="--")
    ax.text(x[0] - 0.45, GOAL_CPP_WARM * 1.05, f"warm goal {GOAL_CPP_WARM:.0f} µs", ha="left",
            va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(x, sizes, fontsize=8)
    ax.grid(axis="y", alpha=0.3, which="both")
    ax.set_ylabel("µs (log)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=7.5, frameon=False)
    ax.set_title("loaderxd hand-off of a ready batch (protocol 1.4 push queue), bars p50, ticks p99",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def p50_99(samples: list[float], digits: int = 0) -> str:
    return f"{pct(samples, 50):.{digits}f} / {pct(samples, 99):.{digits}f}"


@dataclass
class Measured:
    """What one run measured: the floor, the hand-off draws per size, the warm draws, the throughput
    rounds ((embedded b/s, CPU s/batch), (daemon b/s, CPU s/batch)), and the load around them."""

    calib: dict[str, Any]
    floor: float
    rows: list[Row]
    warm: Any
    runs: list[tuple[tuple[float, float], tuple[float, float]]]
    load_before: float
    load_after: float


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loaderxd")
    ap.add_argument("--handoff-bench", help="the loaderx_handoff_bench binary")
    ap.add_argument("--samples", type=int, default=150)
    ap.add_argument("--batches", type=int, default=150, help="37 MiB batches per throughput run")
    ap.add_argument("--repeats", type=int, default=7,
                    help="throughput rounds (embedded and daemon, each going first in turn)")
    ap.add_argument("--pause", type=float, default=0.08,
                    help="seconds between timed draws, the same for every size")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--gather-nice", type=int, default=0, help="loaderxd --gather-nice")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 20 samples, 10 batches, 1 round; publishes nothing")
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.samples, args.batches, args.repeats, args.no_doc = 20, 10, 1, True
    return args


def measure(args: argparse.Namespace, exe: str, cpp: str) -> Measured:
    """The floor, then every size's hand-off draws, the warm draws and the throughput rounds."""
    load_before = os.getloadavg()[0]
    calib = run_cpp(cpp, "--calibrate", "--samples", args.samples, "--pause-ms", args.pause * 1e3)
    floor = pct(calib["queued_cold_recv"], 50)
    print(f"floor: cold queued recvmsg p50 {floor:.1f} us, SEQPACKET wake-up p50"
          f" {pct(calib['wake'], 50):.1f} us", flush=True)

    rows: list[Row] = []
    runs: list[tuple[tuple[float, float], tuple[float, float]]] = []
    daemon = Daemon(exe, "--threads", str(args.threads), "--gather-nice", str(args.gather_nice))
    try:
        for size, _, store, batch in CASES:
            check_identical(daemon.sock, store, batch)
            lat = python_handoff(daemon.sock, store, batch, args.samples, args.threads, args.pause)
            c = CppLatency.run(cpp, daemon.sock, store, batch, args.samples, args.pause)
            # The same draws with batches on the socket (no push queue: protocol 1.3's path).
            c_sock = CppLatency.run(cpp, daemon.sock, store, batch, args.samples, args.pause,
                                    "--socket-push")
            rows.append((lat, c, c_sock))
            print(f"{size}: Python daemon {p50_99(lat.daemon, 1)} us (CPU {pct(lat.daemon_cpu, 50):.1f}),"
                  f" shared_view {p50_99(lat.shared, 1)}, embedded {p50_99(lat.embedded, 1)}"
                  f" (CPU {pct(lat.embedded_cpu, 50):.1f}); C++ ready cold {p50_99(c.queued, 1)}"
                  f" (CPU {pct(c.queued_cpu, 50):.1f}; socket push {p50_99(c_sock.queued, 1)}),"
                  f" warm {p50_99(c.warm, 1)}"
                  f" (CPU {pct(c.warm_cpu, 50):.1f}), credit publish->holding"
                  f" {p50_99(c.publish_to_holding, 1)}, release->holding {p50_99(c.round_trip, 1)};"
                  f" pause {lat.pause * 1e3:.0f} ms, not ready {lat.skipped} / {c.skipped}", flush=True)
        warm = python_warm(daemon.sock, args.samples, args.threads)
        print(f"warm 1 KiB (Python): daemon p50 {pct(warm.daemon, 50):.1f} us"
              f" (CPU {pct(warm.daemon_cpu, 50):.1f}), embedded {pct(warm.embedded, 50):.1f}"
              f" (CPU {pct(warm.embedded_cpu, 50):.1f})", flush=True)
        for r in range(args.repeats):
            hosts = [None, daemon.sock] if r % 2 == 0 else [daemon.sock, None]
            got = {h: throughput(h, args.batches) for h in hosts}
            runs.append((got[None], got[daemon.sock]))
            (e, ec), (d, dc) = runs[-1]
            print(f"throughput {r + 1}: embedded {e:.1f} b/s ({ec * 1e3:.2f} ms CPU/batch), daemon"
                  f" {d:.1f} ({dc * 1e3:.2f}); ratio {d / e:.2f}", flush=True)
    finally:
        daemon.close()
    load_after = os.getloadavg()[0]
    return Measured(calib, floor, rows, warm, runs, load_before, load_after)


def medians(runs: list[tuple[tuple[float, float], tuple[float, float]]]) -> tuple[float, float, float, float]:
    """Embedded b/s, daemon b/s, embedded CPU s/batch, daemon CPU s/batch: medians over the rounds."""

    def med(i: int, j: int) -> float:
        return statistics.median(run[i][j] for run in runs)

    return med(0, 0), med(1, 0), med(0, 1), med(1, 1)


def goal_result(m: Measured, machine: str) -> dict:
    """The loaderxd goals of bench/goals.py from this run's figures."""
    floor, rows, runs = m.floor, m.rows, m.runs
    e, d, ec, dc = medians(runs)
    sizes = [size for size, _, _, _ in CASES]
    ratios = [dd / ee for (ee, _), (dd, _) in runs]
    return section_result("daemon", machine, {
        "daemon-cpp-ready": [Part(s, pct(c.queued, 50), limit=floor + BY_ID["daemon-cpp-ready"].limit)
                             for s, (_, c, _) in zip(sizes, rows)],
        "daemon-cpp-warm": [Part(s, pct(c.warm, 50)) for s, (_, c, _) in zip(sizes, rows)],
        "daemon-py-next": [Part(s, pct(lat.daemon, 50) - pct(lat.embedded, 50)) for s, (lat, _, _) in zip(sizes, rows)],
        "daemon-throughput": [Part("37 MiB", d / e)],
        "daemon-cpu-share": [Part("37 MiB", dc / ec)],
    }, {"daemon-cpp-ready": f"floor {floor:.1f} µs",
        "daemon-throughput": f"median of {len(runs)} rounds, {min(ratios):.2f}x-{max(ratios):.2f}x",
        "daemon-cpu-share": f"median of {len(runs)} rounds"})



def tables(m: Measured) -> tuple[list[list[str]], list[list[str]], list[list[str]]]:
    """The rows of the C++ client, Python client and throughput tables."""
    floor, rows, runs = m.floor, m.rows, m.runs
    py_rows, cpp_rows = [], []
    for (size, what, _, _), (lat, c, c_sock) in zip(CASES, rows):
        over = pct(lat.daemon, 50) - pct(lat.embedded, 50)
        py_rows.append([f"{size} ({what})", p50_99(lat.daemon), f"{pct(lat.daemon_cpu, 50):.0f}",
                        p50_99(lat.shared), f"{pct(lat.shared_cpu, 50):.0f}",
                        p50_99(lat.embedded), f"{pct(lat.embedded_cpu, 50):.0f}", f"{over:+.0f}"])
        cpp_rows.append([size, p50_99(c.queued, 1), f"{pct(c.queued_cpu, 50):.1f}",
                         f"{pct(c.queued, 50) - floor:+.1f}", p50_99(c_sock.queued, 1),
                         f"{pct(c_sock.queued_cpu, 50):.1f}", p50_99(c.queued_bare, 1),
                         f"{pct(c.queued_bare_cpu, 50):.1f}", p50_99(c.warm, 1),
                         f"{pct(c.warm_cpu, 50):.1f}", p50_99(c.publish_to_holding, 1),
                         p50_99(c.round_trip), f"{pct(c.reply_cpu, 50):.1f}"])
    tp_rows = []
    for r, ((e, ec), (d, dc)) in enumerate(runs, 1):
        tp_rows.append([str(r), f"{e:.1f}", f"{d:.1f} ({d / e:.2f}x)", f"{ec * 1e3:.2f}",
                        f"{dc * 1e3:.3f} ({dc / ec:.1%})"])
    e, d, ec, dc = medians(runs)
    tp_rows.append(["median", f"{e:.1f}", f"{d:.1f} ({d / e:.2f}x)", f"{ec * 1e3:.2f}",
                    f"{dc * 1e3:.3f} ({dc / ec:.1%})"])
    return cpp_rows, py_rows, tp_rows


def render(args: argparse.Namespace, m: Measured, machine: str, goal_doc: dict, minutes: float) -> str:
    """The docs section of this run."""
    calib, warm, load_before, load_after = m.calib, m.warm, m.load_before, m.load_after
    cpp_rows, py_rows, tp_rows = tables(m)
    def stage(name: str) -> str:
        return f"{pct(calib[name], 50):.2f}"

    return "\n".join([
        "## loaderxd (bench/bench_daemon.py)",
        "",
        (f"One run on {machine}; 1-minute load average {load_before:.1f} before the run"
         f" and {load_after:.1f} after; {minutes:.1f} minutes. Protocol"
         " 1.4: the daemon pushes the next ready batch one ahead of what the caller took (the"
         " push window), into the loader's shared-memory push queue, while the client holds fewer"
         " than its credit, and a take while the"
         " previous batch is held is reported with that batch's release"
         f" (here {LEASES} leases, prefetch {PREFETCH}; loaderxd --threads {args.threads},"
         f" --gather-nice {args.gather_nice}). Real data: Fashion-MNIST images and 3x224x224"
         " uint8 photo crops (raw Dense stores). Daemon batches were checked byte-identical to"
         " the embedded loader's before timing, by both clients."),
        "",
        'The loaderxd speed goals (the "Goals" table at the top), from this run:',
        "",
        *bullets(goal_doc),
        "",
        (f"**Floor** of this machine, no loaderx code ({args.samples} draws, {args.pause * 1e3:.0f} ms"
         " sleep before each): a cold `recvmsg` of a 200-byte SEQPACKET frame already queued"
         f" {p50_99(calib['queued_cold_recv'], 1)} µs (p50 / p99); a receiver blocked in `recvmsg`"
         f" woken by another process {p50_99(calib['wake'], 1)} µs. Warm p50 of the stages of the"
         f" C++ `NextUntil` (µs, 20,000 calls each): `RecvFrame` of a queued `batch` frame"
         f" {stage('stage_recv')}, `DecodeMessage` {stage('stage_decode')}, `CheckSlot`"
         f" {stage('stage_check_slot')}, `SendFrame` of a `release` {stage('stage_send')}."),
        "",
        (f"**C++ client** (`bench/handoff_bench.cc`, target `loaderx_handoff_bench`), µs p50 / p99,"
         f" {args.samples} draws per cell. *ready, cold*: `Loader::NextUntil` (a shared view) → holding the batch's"
         " `Dense(0)` view, of a batch pushed while the client slept (same sleep as the floor),"
         " the caller holding its previous batch through the call as a training loop does (its"
         " take then goes with that batch's release, after the call: docs/protocol.md"
         " \"Consumed positions\"); the batch comes through the loader's push queue (protocol 1.4,"
         " docs/protocol.md \"Push queue\"); *over floor*: its p50 minus the floor's; *socket push*:"
         " the same draws with the batch as a frame on the socket (`--socket-push`, protocol 1.3's"
         " path: one `recvmsg`); *holding nothing*:"
         " the same with no other batch held (the take is reported inside `NextUntil`)."
         " *ready, warm*: as *ready, cold* with 3 ms of busy-wait after the sleep (the client"
         " computes before it asks, as a training step does). *credit*: the client"
         " holds its whole credit (nothing is pushed), frees one batch and takes the next;"
         " *publish → holding* from the later of the release and the slot's publish stamp,"
         " *release → holding* from the release. *CPU*: the call's thread CPU time (p50); wall"
         " time above it is waiting for a core."),
        "",
        markdown_table(["batch", "ready, cold", "CPU", "over floor", "socket push", "CPU",
                        "holding nothing", "CPU", "ready, warm", "CPU", "credit: publish→holding",
                        "release→holding", "CPU"],
                       cpp_rows, "lrrrrrrrrrrrr"),
        "",
        (f"**Python client**, µs p50 / p99, {args.samples} draws per cell: `next()` → holding the"
         " NumPy array, the previous batch held through the call as `for batch in loader` holds"
         " it, of a batch the daemon had pushed during the sleep (*daemon*: the default"
         " copy-on-write view, through the loader's private mappings of the ring; *shared_view*: `DaemonOptions(shared_view=True)`,"
         " the read-only ring mapping itself) against the embedded pipeline's `next()` of a batch it"
         " had ready (*embedded*); *daemon − embedded*: the p50 difference the goal bounds. Batches:"
         " ~1 KiB = 784 B, ~1 MiB = 1,053,696 B, 37 MiB = 38,535,168 B."),
        "",
        markdown_table(["batch", "daemon", "CPU", "shared_view", "CPU", "embedded", "CPU",
                        "daemon − embedded"], py_rows, "lrrrrrrr"),
        "",
        (f"Warm caches, Python, 1 KiB (0.5 ms busy-wait instead of the sleep): daemon `next()` p50"
         f" {pct(warm.daemon, 50):.1f} µs wall / {pct(warm.daemon_cpu, 50):.1f} µs CPU, embedded"
         f" {pct(warm.embedded, 50):.1f} / {pct(warm.embedded_cpu, 50):.1f} µs."),
        "",
        "![loaderx hand-off latency](bench_daemon.png)",
        "",
        (f"**Throughput**, 256 photo crops per batch (37 MiB), IID, {args.batches} batches per run,"
         " embedded and daemon alternating, each going first in turn; CPU = the training process's"
         " own CPU time per batch (through the daemon, in parentheses, as a share of the embedded"
         " loader's):"),
        "",
        markdown_table(["round", "embedded b/s", "daemon b/s", "embedded CPU ms", "daemon CPU ms"],
                       tp_rows, "lrrrr"),
    ])


def main() -> int:
    t_start = time.monotonic()
    args = parse_args()
    ensure_stores()
    exe = loaderxd_binary(args.loaderxd)
    cpp = bench_binary("loaderx_handoff_bench", args.handoff_bench)
    m = measure(args, exe, cpp)
    machine = machine_line()
    goal_doc = goal_result(m, machine)
    body = render(args, m, machine, goal_doc, (time.monotonic() - t_start) / 60)
    if not args.no_doc:
        plot(m.rows, m.floor, PLOT)
        update_doc_section("daemon", body)
        write_result(goal_doc)
    print(body)
    print(f"bench_daemon.py took {(time.monotonic() - t_start) / 60:.1f} min", flush=True)
    return 0

if __name__ == "__main__":
    sys.exit(main())
