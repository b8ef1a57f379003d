"""Shared helpers of the benchmark suite (benchmark engineer).

One place for: where prepared data lives, how a prepared workload is loaded,
timing statistics, the process-tree PSS sampler, a loaderxd on a temporary
socket, Markdown tables, bar plots and
the section-wise update of docs/benchmarks.md. Every bench_*.py imports this
module; nothing here is part of the loaderx package.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
DATA = Path(os.environ.get("LOADERX_BENCH_DATA", BENCH_DIR / "data"))
DOCS = REPO / "docs"
BENCH_DOC = DOCS / "benchmarks.md"

MiB = 1024.0 * 1024.0


def snapshot_loaderx() -> Path:
    """Copies python/loaderx (with its built extension) to bench/data/pkg/<stamp>/ and
    returns the directory to put first on sys.path / PYTHONPATH.

    Why: the shared work tree's extension module is overwritten in place by every
    rebuild, and a process that has it mapped then dies with SIGBUS. Benchmarks
    import a private, immutable copy instead.
    """
    import hashlib
    import shutil

    src = REPO / "python" / "loaderx"
    files = sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    h = hashlib.blake2b(digest_size=8)
    for p in files:
        st = p.stat()
        h.update(f"{p.relative_to(src)}:{st.st_size}:{st.st_mtime_ns};".encode())
    dest = DATA / "pkg" / h.hexdigest()
    if not (dest / "loaderx").exists():
        tmp = DATA / "pkg" / f".{h.hexdigest()}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp / "loaderx", ignore=shutil.ignore_patterns("__pycache__"))
        try:
            tmp.rename(dest)
        except OSError:  # another benchmark made the same snapshot first
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


# --------------------------------------------------------------------------
# Prepared workloads
# --------------------------------------------------------------------------

@dataclass
class DenseWorkload:
    """A fixed-shape workload: ``array`` is an ``(N, *item_shape)`` memmap."""

    name: str
    array: np.ndarray
    description: str

    @property
    def n(self) -> int:
        return int(self.array.shape[0])

    @property
    def record_bytes(self) -> int:
        return int(self.array[0].nbytes)

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)


@dataclass
class RaggedWorkload:
    """A variable-shape workload stored as flat values + offsets + shapes.

    ``values``: 1-D memmap of the dtype; ``offsets``: int64 ``(N+1,)`` element
    offsets into ``values``; ``shapes``: int64 ``(N, ndim)``. Record ``i`` is
    ``values[offsets[i]:offsets[i+1]].reshape(shapes[i])``.
    """

    name: str
    values: np.ndarray
    offsets: np.ndarray
    shapes: np.ndarray
    description: str
    _cache: dict[int, np.ndarray] = field(default_factory=dict, repr=False)
    _records: list[np.ndarray] | None = field(default=None, repr=False)

    @property
    def n(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def ndim(self) -> int:
        return int(self.shapes.shape[1])

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    @property
    def nbytes(self) -> int:
        return int(self.offsets[-1]) * self.values.dtype.itemsize

    def record(self, i: int) -> np.ndarray:
        """Record ``i`` as a read-only view of ``values`` with its exact shape."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.values[a:b].reshape(tuple(int(d) for d in self.shapes[i]))

    def records(self) -> list[np.ndarray]:
        """Every record (``record(i)``), as a list built on the first call and kept, so a
        timed write measures the writer, not the creation of one view per record
        (132,026 token views cost ~0.9 s of CPU, far more than writing them)."""
        if self._records is None:
            self._records = [self.record(i) for i in range(self.n)]
        return self._records


def load_dense(name: str, file: str, description: str) -> DenseWorkload:
    path = DATA / file
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: run the matching bench/prepare_*.py first")
    return DenseWorkload(name, np.load(path, mmap_mode="r"), description)


def load_ragged(name: str, stem: str, description: str) -> RaggedWorkload:
    base = DATA / stem
    for part in ("values", "offsets", "shapes"):
        if not (base / f"{part}.npy").exists():
            raise FileNotFoundError(f"{base}/{part}.npy missing: run the matching bench/prepare_*.py first")
    values = np.load(base / "values.npy", mmap_mode="r")
    offsets = np.load(base / "offsets.npy")
    shapes = np.load(base / "shapes.npy")
    if offsets.shape[0] != shapes.shape[0] + 1 or int(offsets[-1]) != values.shape[0]:
        raise ValueError(f"{base}: offsets/shapes/values disagree; re-run the prepare script")
    return RaggedWorkload(name, values, offsets, shapes, description)


def save_ragged(stem: str, records: Sequence[np.ndarray], dtype: np.dtype) -> Path:
    """Write records as ``DATA/stem/{values,offsets,shapes}.npy`` (atomically per dir)."""
    base = DATA / stem
    tmp = DATA / f".{stem}.tmp"
    if tmp.exists():
        for f in tmp.iterdir():
            f.unlink()
    tmp.mkdir(parents=True, exist_ok=True)
    ndim = records[0].ndim
    lengths = np.fromiter((r.size for r in records), dtype=np.int64, count=len(records))
    offsets = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    shapes = np.array([r.shape for r in records], dtype=np.int64).reshape(len(records), ndim)
    values = np.lib.format.open_memmap(tmp / "values.npy", mode="w+", dtype=dtype, shape=(int(offsets[-1]),))
    for i, r in enumerate(records):
        values[offsets[i]:offsets[i + 1]] = r.reshape(-1)
    values.flush()
    del values
    np.save(tmp / "offsets.npy", offsets)
    np.save(tmp / "shapes.npy", shapes)
    if base.exists():
        for f in base.iterdir():
            f.unlink()
        base.rmdir()
    tmp.rename(base)
    return base


def save_npy_atomic(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name("." + path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, array)
    tmp.rename(path)


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------

def bench_binary(name: str, explicit: str | None = None) -> str:
    """A C++ benchmark program of the CMake build (the newest ``build*/NAME``), or ``explicit``."""
    if explicit:
        return explicit
    found = [p for p in REPO.glob(f"build*/{name}") if os.access(p, os.X_OK)]
    if not found:
        raise SystemExit(f"{name} not found: build it (make build) or pass its path")
    return str(max(found, key=os.path.getmtime))


def run_cpp(exe: str, *args: object) -> dict[str, Any]:
    """Runs a C++ benchmark program and returns the JSON object it prints."""
    r = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=1800, check=False)
    if r.returncode != 0:
        raise SystemExit(f"{exe} failed: {r.stderr.strip()}")
    return json.loads(r.stdout)


def median_index(samples: Sequence[float]) -> int:
    """The index of the median sample (the lower one of an even count): a write and its
    ceiling are compared median to median, each with the other figures of that same run."""
    return sorted(range(len(samples)), key=lambda i: samples[i])[(len(samples) - 1) // 2]


def percentile_ms(samples_s: Sequence[float], q: float = 95.0) -> float:
    return float(np.percentile(np.asarray(samples_s), q) * 1e3)


def batch_plan(n: int, batch: int, count: int, seed: int) -> list[np.ndarray]:
    """``count`` IID batches of ``batch`` uint64 indices in ``0..n-1`` (with replacement)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n, size=batch, dtype=np.uint64) for _ in range(count)]


def du_bytes(path: Path) -> int:
    """Allocated bytes (st_blocks * 512) of a file or a directory tree."""
    if path.is_file():
        return path.stat().st_blocks * 512
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.lstat(os.path.join(root, f)).st_blocks * 512
    return total


def warm_files(path: Path) -> None:
    """Reads every file under ``path`` once so it is in the page cache.

    Why: this VM's page cache does not keep everything that was just written
    (a few GiB survive while the stores of one workload total more), so a
    backend timed late in a pass could otherwise be read from disk while
    another was read from memory.
    """
    buf = bytearray(8 << 20)
    files = [path] if path.is_file() else sorted(Path(r) / f for r, _, fs in os.walk(path) for f in fs)
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


# --------------------------------------------------------------------------
# Memory: PSS of a process tree
# --------------------------------------------------------------------------

def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids.extend(int(x) for x in f.read().split())
            except OSError:
                pass
    except OSError:
        pass
    return kids


def tree_pids(root: int) -> list[int]:
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(_children(p))
    return out


def pss_fields(pid: int) -> dict[str, int]:
    """Every ``Pss*`` field of ``pid``'s ``smaps_rollup`` in bytes ({"Pss:": ..., "Pss_Anon:": ...}),
    from one read (each read walks the process's page tables); empty if the process is gone."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss"):
                    name, value = line.split()[:2]
                    out[name] = int(value) * 1024
    except OSError:
        pass
    return out


def pss_bytes(pid: int, field: str = "Pss:") -> int:
    """One ``smaps_rollup`` field of ``pid`` in bytes ("Pss:", "Pss_Anon:", ...); 0 if gone."""
    return pss_fields(pid).get(field, 0)


def tree_pss(root: int | None = None) -> int:
    """Sum of Pss over ``root`` (default: this process) and all its descendants."""
    return sum(pss_bytes(p) for p in tree_pids(os.getpid() if root is None else root))


def rss_bytes(pid: int) -> int:
    """Resident bytes of ``pid`` from ``/proc/PID/statm`` (a counter read, no page table walk); 0 if gone."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


# How much a process's RSS may grow past its value at the last PSS reading
# before a PssSampler reads PSS again.
SAMPLER_RSS_SLACK = 1 << 20


def rss_grew(at_read: dict[int, int], now: dict[int, int], slack: int = SAMPLER_RSS_SLACK) -> bool:
    """Whether the PSS total may have grown since the reading taken at RSS ``at_read`` (pid -> bytes):
    a process is new or holds more than ``slack`` bytes beyond its RSS then. PSS is RSS with shared
    pages divided among their mappers, so it cannot grow by more than the processes' RSS does."""
    return any(pid not in at_read or rss > at_read[pid] + slack for pid, rss in now.items())


class PssSampler:
    """Samples the process-tree PSS in a thread every ``interval`` s, and once more at exit.

    Reading ``smaps_rollup`` walks every page table entry of a process: a node group's loaderxd and
    ranks map ~400 MiB of ring, and reading them every 0.1 s took 15-18 % of a core, CPU the
    measured processes lacked on a 2-core machine. So each tick reads the processes' RSS counters
    and reads PSS only when ``rss_grew`` says the total may have grown (the peak is then missed by
    at most ``SAMPLER_RSS_SLACK`` per process).

    ``peak``: peak total PSS in bytes; ``peak_anon``: peak of the anonymous
    part (Pss_Anon, i.e. excluding mapped file pages, which are clean page
    cache the kernel can drop); ``samples``: PSS readings; ``cpu_s``: the sampling thread's CPU seconds.
    """

    def __init__(self, root: int | None = None, interval: float = 0.05) -> None:
        self.root = os.getpid() if root is None else root
        self.interval = interval
        self.peak = 0
        self.peak_anon = 0
        self.cpu_s = 0.0
        self.samples = 0
        self._rss_at_read: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def trees(self) -> dict[int, list[int]]:
        """The processes sampled, by the root of their tree."""
        return {self.root: tree_pids(self.root)}

    def _read(self, force: bool) -> None:
        """Reads every process's PSS (``_sample``) if ``force`` or ``rss_grew`` says the total may have
        grown since the last reading; each tree is walked once per tick."""
        trees = self.trees()
        rss = {p: rss_bytes(p) for pids in trees.values() for p in pids}
        if force or rss_grew(self._rss_at_read, rss):
            self._sample({root: [pss_fields(p) for p in pids] for root, pids in trees.items()})
            self._rss_at_read = rss
            self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.thread_time()
            self._read(force=False)
            self.cpu_s += time.thread_time() - t0
            self._stop.wait(self.interval)

    def _sample(self, fields: dict[int, list[dict[str, int]]]) -> None:
        """Takes one reading: ``pss_fields`` of every process, by the root of its tree."""
        every = [f for per_tree in fields.values() for f in per_tree]
        self.peak = max(self.peak, sum(f.get("Pss:", 0) for f in every))
        self.peak_anon = max(self.peak_anon, sum(f.get("Pss_Anon:", 0) for f in every))

    def __enter__(self) -> PssSampler:  # noqa: PYI034 - final class
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._read(force=True)


# --------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------

class Daemon:
    """A foreground loaderxd on a temporary socket, serving when constructed.

    ``flags`` are appended to its command line (e.g. ``"--threads", "2"``);
    systemd's activation variables are dropped from its environment.
    """

    def __init__(self, exe: str, *flags: str) -> None:
        from loaderx import _loaderx

        self._tmp = tempfile.mkdtemp(prefix="lxbench-")
        self.sock = os.path.join(self._tmp, "d.sock")
        cmd = [exe, "--foreground", "--socket", self.sock, "--log-level", "warning", *flags]
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID")}
        self.proc = subprocess.Popen(cmd, env=env)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                _loaderx.daemon_stats(self.sock)
                return
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.02)
        self.close()
        raise SystemExit("loaderxd did not start")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        shutil.rmtree(self._tmp, ignore_errors=True)


def machine_line() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores ({cpu}), "
            f"{mem:.0f} GiB RAM, Linux {platform.release()}, Python {platform.python_version()}, "
            f"NumPy {np.__version__}")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str | None = None) -> str:
    """``align``: one char per column, 'l' or 'r' (default: first left, rest right)."""
    align = align or ("l" + "r" * (len(headers) - 1))
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


def bar_plot(path: Path, title: str, labels: Sequence[str], values: Sequence[float], xlabel: str,
             highlight: Callable[[str], bool] = lambda s: s.startswith("loaderx")) -> None:
    """Horizontal bar plot as a PNG; bars whose label ``highlight`` are drawn in a second colour."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 0.42 * len(labels) + 1.3), dpi=110)
    ys = np.arange(len(labels))[::-1]
    colors = ["#d95f02" if highlight(s) else "#7570b3" for s in labels]
    ax.barh(ys, values, color=colors)
    ax.set_yticks(ys, labels)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    vmax = max(values) if len(values) else 1.0
    for y, v in zip(ys, values):
        ax.text(v + vmax * 0.01, y, f"{v:,.1f}", va="center", fontsize=8)
    ax.set_xlim(0, vmax * 1.15)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


_SECTION_RE = r"(?ms)^<!-- BEGIN {key} -->\n.*?^<!-- END {key} -->\n"


def update_doc_section(key: str, body: str, doc: Path = BENCH_DOC) -> None:
    """Replace (or append) the block between ``<!-- BEGIN key -->`` and ``<!-- END key -->``.

    Only that block is touched, so sections written by other benchmarks (and by
    other people, e.g. "## Sampler") survive.
    """
    block = f"<!-- BEGIN {key} -->\n{body.rstrip()}\n<!-- END {key} -->\n"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n\n"
    pat = re.compile(_SECTION_RE.format(key=re.escape(key)))
    if pat.search(text):
        text = pat.sub(lambda _m: block, text, count=1)
    else:
        text = text.rstrip() + "\n\n" + block
    doc.write_text(text)


class Timer:
    def __enter__(self) -> Timer:  # noqa: PYI034 - final class
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.s = time.perf_counter() - self.t0
