"""loaderxd benchmark: batch hand-off latency and throughput vs the embedded loader.

Real data only: the 3x224x224 uint8 photo crops of ``bench/prepare_vision.py``
(the raw Dense store bench_loader.py builds) and the Fashion-MNIST images
(``dataset-fashion-mnist``). Three batch sizes:

* ~1 KiB  — 1 Fashion-MNIST image (784 B) per batch;
* ~1 MiB  — 7 photo crops (1.0 MiB);
* 37 MiB  — 256 photo crops (36.75 MiB).

Hand-off latency is what the client pays to get a batch the daemon already
has: the batch is made ready first (the loader prefetches; we wait for it),
then ``next()`` is timed from the call to holding the NumPy arrays — one
request/reply on the socket plus building the views, no copy. p50/p99 over
``--samples`` draws.

Throughput compares one client through the daemon with the embedded
DataLoader on the same job (37 MiB batches, IID), and reports the training
process's own CPU seconds per batch (``time.process_time``: every thread of
this process) — in daemon mode the gather runs in loaderxd instead.

Before timing, the daemon's batches are checked byte-for-byte against the
embedded loader's. Results go to docs/benchmarks.md (section ``daemon``).
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import DATA, REPO, machine_line, markdown_table, update_doc_section

IMAGE_STORE = DATA / "loader" / "loaderx" / "raw" / "image"
FMNIST_NPY = DATA / "fmnist_images.npy"
FMNIST_STORE = DATA / "daemon" / "fmnist-raw"


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


def start_daemon(exe: str, sock: str, threads: int) -> subprocess.Popen:
    from loaderx import _loaderx

    proc = subprocess.Popen([exe, "--foreground", "--socket", sock, "--threads", str(threads),
                             "--log-level", "warning"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            _loaderx.daemon_stats(sock)
            return proc
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.02)
    proc.kill()
    raise SystemExit("loaderxd did not start")


def check_identical(sock: str, store: Path, batch: int) -> None:
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Dense

    with Dense.open(str(store)) as s, DataLoader({"x": s}, batch, seed=1, daemon=sock) as remote, \
            DataLoader({"x": s}, batch, seed=1) as local:
        for _ in range(3):
            a, b = next(remote)["x"], next(local)["x"]
            if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(a, b):
                raise SystemExit(f"daemon batch differs from embedded for {store.name} batch {batch}")


def handoff(sock: str, store: Path, batch: int, samples: int) -> tuple[float, float, int]:
    """p50, p99 in microseconds and the batch bytes."""
    from loaderx import _loaderx

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
        gather = (time.perf_counter() - t) / 8
        times = []
        for _ in range(samples):
            time.sleep(0.001 + 3 * gather)
            t0 = time.perf_counter_ns()
            _, values = src.next(None)
            arr = values[0]  # holding the array: the hand-off is complete
            t1 = time.perf_counter_ns()
            assert not arr.flags.writeable
            del values, arr
            times.append((t1 - t0) / 1e3)
        times.sort()
        return statistics.median(times), times[min(len(times) - 1, int(0.99 * len(times)))], nbytes
    finally:
        src.close()


def throughput(sock: str | None, batches: int) -> tuple[float, float]:
    """Batches/s and this process's CPU seconds per batch."""
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Dense

    with Dense.open(str(IMAGE_STORE)) as s:
        kw = {"daemon": sock} if sock else {}
        with DataLoader({"x": s}, 256, seed=3, **kw) as loader:
            for _ in range(5):
                next(loader)
            cpu0, t0 = time.process_time(), time.perf_counter()
            for _ in range(batches):
                next(loader)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return batches / wall, cpu / batches


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loaderxd")
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    ensure_stores()
    load_before = os.getloadavg()[0]
    exe = loaderxd_binary(args.loaderxd)
    with tempfile.TemporaryDirectory(prefix="lxbench-") as tmp:
        sock = os.path.join(tmp, "d.sock")
        proc = start_daemon(exe, sock, args.threads)
        try:
            cases = [("~1 KiB (1 Fashion-MNIST image)", FMNIST_STORE, 1),
                     ("~1 MiB (7 photo crops)", IMAGE_STORE, 7),
                     ("37 MiB (256 photo crops)", IMAGE_STORE, 256)]
            lat_rows = []
            for label, store, batch in cases:
                check_identical(sock, store, batch)
                p50, p99, nbytes = handoff(sock, store, batch, args.samples)
                lat_rows.append([label, f"{nbytes:,}", f"{p50:.1f}", f"{p99:.1f}"])
                print(f"hand-off {label}: p50 {p50:.1f} us, p99 {p99:.1f} us", flush=True)
            d_rate, d_cpu = throughput(sock, args.batches)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    e_rate, e_cpu = throughput(None, args.batches)
    print(f"throughput: daemon {d_rate:.1f} b/s ({d_cpu * 1e3:.2f} ms CPU/batch), "
          f"embedded {e_rate:.1f} b/s ({e_cpu * 1e3:.2f} ms CPU/batch)")
    body = "\n".join([
        "## loaderxd (bench/bench_daemon.py)",
        "",
        (f"One run on {machine_line()}; 1-minute load average {load_before:.1f} before the run"
         f" and {os.getloadavg()[0]:.1f} after (other work shares these cores: latency tails and"
         " the throughput ratio move with it). Real data: Fashion-MNIST images and 3x224x224 uint8"),
        "photo crops (raw Dense stores). Daemon batches were checked byte-identical to the",
        "embedded loader's before timing.",
        "",
        "Hand-off: from `next()` to holding the read-only NumPy view of a batch the daemon",
        f"already has (socket round trip + views, no copy), {args.samples} draws:",
        "",
        markdown_table(["batch", "bytes", "p50 µs", "p99 µs"], lat_rows, "lrrr"),
        "",
        f"Throughput, 256 photo crops per batch (37 MiB), IID, {args.batches} batches, daemon with",
        f"--threads {args.threads}; client CPU = this process's CPU time per batch:",
        "",
        markdown_table(
            ["mode", "batches/s", "ratio", "client CPU ms/batch"],
            [["embedded", f"{e_rate:.1f}", "1.00", f"{e_cpu * 1e3:.2f}"],
             ["daemon", f"{d_rate:.1f}", f"{d_rate / e_rate:.2f}", f"{d_cpu * 1e3:.2f}"]],
            "lrrr"),
    ])
    if not args.no_doc:
        update_doc_section("daemon", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
