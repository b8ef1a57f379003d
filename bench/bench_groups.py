"""loaderxd groups with processes: 4 trainers over one store of real photos.

The card's promise measured the way it is used: ``--trainers`` (4) separate
trainer processes each draw ``--steps`` batches of ``--batch`` (256)
``uint8[3,224,224]`` photo crops (``bench/prepare_vision.py``'s
``vision_dense.npy``), from a raw and from a zstd store, in three set-ups:

(a) ``embedded``: every trainer runs its own embedded ``DataLoader`` (each
    gathers and decodes every batch itself);
(b) ``broadcast``: every trainer is a member of one loaderxd broadcast group
    (each batch gathered once, mapped by all four);
(c) ``torch``: every trainer runs a ``torch.utils.data.DataLoader`` with
    ``--torch-workers`` (2) forked workers over a map-style dataset reading
    the same store record by record (default collate).

Before timing, each trainer checks its first batch against the expected one
(the embedded loader's batch of that step for (a)/(b); the stacked records of
the torch sampler's first indices for (c)), then waits until all are ready.
Each trainer "consumes" a batch by reading one byte of every 4 KiB page (so
every page of a mapped batch is really touched) and reports its batches/s and
the CPU seconds of its process tree (torch workers included). The parent
samples the PSS (``/proc/PID/smaps_rollup``) of every process involved —
trainers, their workers, loaderxd — every 0.1 s while their RSS grows
(benchlib.PssSampler) and once at the end, and reports the peak of the
total, plus loaderxd's CPU seconds.

Goals (issue 12): (b) total PSS <= 1.3x one embedded trainer's PSS, and (b)
per-trainer batches/s >= 2x (a)'s with zstd.

``--quick`` is a smoke run (tiny batch and step count; synthetic data if the
photos are not prepared); it never writes docs. A real run writes the table
into docs/benchmarks.md (section "groups-processes") and the plot to
docs/bench_groups.png. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (
    DATA,
    DOCS,
    Daemon,
    PssSampler,
    machine_line,
    markdown_table,
    pss_bytes,
    tree_pids,
    update_doc_section,
)
from goals import Part, write_section

SOURCE = DATA / "vision_dense.npy"
SEED = 7
CHECK_STEPS = 16  # expected first-batch hashes provided per step (a late group joiner starts later)
SETUPS = ("embedded", "broadcast", "torch")
CODECS = ("raw", "zstd")


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (0 if gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> float:
    return sum(cpu_seconds(p) for p in tree_pids(root))


def digest(x: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()


def touch(x: np.ndarray) -> int:
    """One byte of every 4 KiB page: every page of the batch is really read."""
    flat = x.reshape(-1)
    return int(flat[::4096].sum())


# ==========================================================================
# Trainer process: build the loader, check, say ready, wait for go, time.
# ==========================================================================

class TorchStore:
    """Map-style dataset over a loaderx store, opened lazily in each worker."""

    def __init__(self, path: str) -> None:
        from loaderx.zrecord import Dense

        self.path = path
        with Dense.open(path) as s:
            self.n = len(s)
        self._store: Any = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import torch

        if self._store is None:
            from loaderx.zrecord import Dense

            self._store = Dense.open(self.path)
        return torch.from_numpy(np.asarray(self._store[int(i)]))


def torch_loader(store: str, batch: int, workers: int) -> Any:
    import torch
    from torch.utils.data import DataLoader as TorchLoader
    from torch.utils.data import RandomSampler

    g = torch.Generator()
    g.manual_seed(SEED)
    ds = TorchStore(store)
    return TorchLoader(ds, batch_size=batch, sampler=RandomSampler(ds, generator=g), num_workers=workers,
                       drop_last=True, persistent_workers=workers > 0,
                       multiprocessing_context="fork" if workers > 0 else None)


def torch_draw(store: str, batch: int, workers: int) -> Callable[[], np.ndarray]:
    """Batches of a torch DataLoader over ``store``, epoch after epoch, as a training loop draws them."""
    tl = torch_loader(store, batch, workers)
    it = iter(tl)

    def draw() -> np.ndarray:
        nonlocal it
        try:
            return next(it).numpy()
        except StopIteration:
            it = iter(tl)
            return next(it).numpy()
    return draw


def loaderxd_path(explicit: str | None) -> str:
    """The loaderxd to benchmark: ``explicit``, else $LOADERXD, else the build tree's."""
    return explicit or os.environ.get("LOADERXD") or str(Path(__file__).resolve().parents[1] / "build" / "daemon" / "loaderxd")


def trainer(args: argparse.Namespace) -> int:
    if args.setup in ("idle", "idle-torch"):  # baselines: the same imports, no loader
        import loaderx.client  # noqa: F401

        if args.setup == "idle-torch":
            import torch  # noqa: F401

        print(json.dumps({"ready": os.getpid()}), flush=True)
        sys.stdin.readline()
        return 0
    expected = json.loads(Path(args.expected).read_text())
    if args.setup == "torch":
        draw, close, first_step = torch_draw(args.store, args.batch, args.torch_workers), lambda: None, 0
    else:
        from loaderx.client import DaemonOptions
        from loaderx.dataloader import DataLoader
        from loaderx.zrecord import Dense

        store = Dense.open(args.store)
        daemon = None if args.setup == "embedded" else DaemonOptions(args.socket, group="bench",
                                                                     group_mode="broadcast")
        loader = DataLoader({"image": store}, batch_size=args.batch, seed=SEED, daemon=daemon)
        first_step = loader.step

        def draw() -> np.ndarray:
            return next(loader)["image"]

        def close() -> None:
            loader.close()
            store.close()
    first = draw()
    if first_step >= len(expected) or digest(first) != expected[first_step]:
        print(json.dumps({"error": f"first batch (step {first_step}) differs from the expected one"}), flush=True)
        return 1
    del first
    return timed_draws(draw, args.steps, close)


def timed_draws(draw: Callable[[], np.ndarray], steps: int, close: Callable[[], None]) -> int:
    """A trainer process's timed part: says it is ready, waits for "go", draws and touches
    ``steps`` batches, reports its batches/s, CPU and when it started and ended (``time.monotonic``),
    waits until the parent has sampled."""
    print(json.dumps({"ready": os.getpid()}), flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    cpu0 = tree_cpu(os.getpid())
    start = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the machine
    t0 = time.perf_counter()
    sink = 0
    for _ in range(steps):
        b = draw()
        sink += touch(b)
        del b
    wall = time.perf_counter() - t0
    end = time.monotonic()
    cpu = tree_cpu(os.getpid()) - cpu0
    print(json.dumps({"batches_per_s": steps / wall, "cpu_s": cpu, "wall_s": wall, "sink": sink,
                      "start": start, "end": end}), flush=True)
    sys.stdin.readline()  # the parent samples PSS until everyone is done
    close()
    return 0


# ==========================================================================
# Parent: stores, expected batches, one run per (codec, setup).
# ==========================================================================

def source_array(quick: bool, records: int) -> tuple[np.ndarray, str]:
    if SOURCE.exists():
        src = np.load(SOURCE, mmap_mode="r")
        return (src[:records] if quick else src), "real photo crops (bench/prepare_vision.py)"
    if not quick:
        raise SystemExit(f"{SOURCE} missing: run bench/prepare_vision.py first")
    print(f"warning: {SOURCE} missing, smoke run on synthetic data (nothing is published)", file=sys.stderr)
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(records, 3, 224, 224), dtype=np.uint8), "synthetic (smoke run)"


def build_store(root: Path, src: np.ndarray, codec: str) -> Path:
    from loaderx.zrecord import Dense

    path = root / codec / "image"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with Dense.create(str(path), src.dtype, src.shape[1:], codec=codec) as ds:
            for i in range(0, len(src), 512):
                ds.append(np.ascontiguousarray(src[i:i + 512]))
    return path


def expected_hashes(store: Path, batch: int, setup: str, workers: int) -> list[str]:
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Dense

    if setup == "torch":
        import torch
        from torch.utils.data import RandomSampler

        g = torch.Generator()
        g.manual_seed(SEED)
        with Dense.open(str(store)) as s:
            order = list(RandomSampler(range(len(s)), generator=g))[:batch]
            return [digest(np.stack([np.asarray(s[int(i)]) for i in order]))]
    with Dense.open(str(store)) as s, DataLoader({"image": s}, batch_size=batch, seed=SEED) as local:
        return [digest(next(local)["image"]) for _ in range(CHECK_STEPS)]


def run_setup(args: argparse.Namespace, setup: str, store: Path, expected: Path,
              daemon: Daemon | None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--trainer", "--setup", setup, "--store", str(store), "--expected",
           str(expected), "--batch", str(args.batch), "--steps", str(args.steps),
           "--torch-workers", str(args.torch_workers)]
    if daemon is not None:
        cmd += ["--socket", daemon.sock]
    results, sampler, daemon_cpu = run_trainers(setup, [cmd] * args.trainers, daemon)
    rates = [r["batches_per_s"] for r in results]
    return {"rate_mean": float(np.mean(rates)), "rate_min": float(min(rates)),
            "pss_mib": sampler.peak / 2**20, "max_trainer_pss_mib": sampler.max_root / 2**20,
            "shmem_mib": sampler.peak_shmem / 2**20, "file_mib": sampler.peak_file / 2**20,
            "cpu_s": sum(r["cpu_s"] for r in results) + daemon_cpu, "daemon_cpu_s": daemon_cpu,
            "wall_s": max(r["wall_s"] for r in results)}


def run_trainers(setup: str, cmds: list[list[str]], daemon: Daemon | None
                 ) -> tuple[list[dict[str, Any]], _TreeSampler, float]:
    """Starts one trainer process per command, waits until all are ready, lets them run
    while sampling the PSS of them all (and loaderxd's), and returns their reports, the
    sampler and loaderxd's CPU seconds over the run."""
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for cmd in cmds]
    try:
        for p in procs:
            assert p.stdout is not None
            line = json.loads(p.stdout.readline() or '{"error": "trainer exited"}')
            if "ready" not in line:
                raise SystemExit(f"{setup}: {line.get('error')}")
        sampler = _TreeSampler([p.pid for p in procs], [daemon.proc.pid] if daemon else [])
        daemon_cpu0 = cpu_seconds(daemon.proc.pid) if daemon else 0.0
        with sampler:
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            results = []
            for p in procs:
                assert p.stdout is not None
                results.append(json.loads(p.stdout.readline()))
        daemon_cpu = (cpu_seconds(daemon.proc.pid) - daemon_cpu0) if daemon else 0.0
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("done\n")
            p.stdin.flush()
        for p in procs:
            if p.wait(timeout=120) != 0:
                raise SystemExit(f"{setup}: a trainer failed")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return results, sampler, daemon_cpu


class _TreeSampler(PssSampler):
    """PssSampler over several process trees; also the peak of the largest trainer tree."""

    def __init__(self, trainers: list[int], others: list[int]) -> None:
        super().__init__(root=os.getpid(), interval=0.1)
        self.trainers = trainers
        self.others = others
        self.max_root = 0
        self.peak_shmem = 0
        self.peak_file = 0

    def trees(self) -> dict[int, list[int]]:
        return {r: tree_pids(r) for r in (*self.trainers, *self.others)}

    def _sample(self, fields: dict[int, list[dict[str, int]]]) -> None:
        def total(roots: list[int], field: str = "Pss:") -> int:
            return sum(f.get(field, 0) for r in roots for f in fields[r])

        trees = [total([r]) for r in self.trainers]
        rest = total(self.others)
        self.max_root = max([self.max_root, *trees])
        if sum(trees) + rest > self.peak:
            self.peak = sum(trees) + rest
            # What the peak is made of: shared memory (loaderxd's rings, the
            # batches members map) and mapped files (the stores' page cache,
            # counted once in total however many processes map it; libraries).
            every = [*self.trainers, *self.others]
            self.peak_shmem = total(every, "Pss_Shmem:")
            self.peak_file = total(every, "Pss_File:")


def idle_pss(setup: str) -> int:
    """PSS of one bare trainer process of ``setup``: its imports (NumPy, loaderx; torch for
    the torch set-up) but no loader."""
    kind = "idle-torch" if setup == "torch" else "idle"
    p = subprocess.Popen([sys.executable, __file__, "--trainer", "--setup", kind], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdin is not None
    p.stdout.readline()
    time.sleep(0.2)
    pss = pss_bytes(p.pid)
    p.stdin.write("\n")
    p.stdin.close()
    p.wait(timeout=30)
    return pss


def plot(path: Path, results: dict[tuple[str, str], dict[str, Any]], trainers: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), dpi=110)
    x = np.arange(len(CODECS))
    width = 0.26
    colors = {"embedded": "#7570b3", "broadcast": "#d95f02", "torch": "#1b9e77"}
    for k, setup in enumerate(SETUPS):
        rate = [results[(c, setup)]["rate_mean"] for c in CODECS]
        pss = [results[(c, setup)]["pss_mib"] for c in CODECS]
        axes[0].bar(x + (k - 1) * width, rate, width, label=setup, color=colors[setup])
        axes[1].bar(x + (k - 1) * width, pss, width, label=setup, color=colors[setup])
    for ax, title in zip(axes, ("batches/s per trainer", f"total PSS of all {trainers} trainers + loaderxd, MiB")):
        ax.set_xticks(x, CODECS)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def groups_goals(results: dict[tuple[str, str], dict[str, float]], codecs: list[str]) -> dict[str, list[Part]]:
    """The groups' goal figures (bench/goals.py): (b)'s total PSS over one embedded trainer's, per codec."""

    def pss(c: str) -> float | None:
        a, b = results.get((c, "embedded")), results.get((c, "broadcast"))
        return b["pss_mib"] / a["max_trainer_pss_mib"] if c in codecs and a and b else None

    return {"groups-broadcast-pss": [Part(c, pss(c)) for c in CODECS]}


def run_inputs(args: argparse.Namespace, prefix: str) -> tuple[str, list[str], np.ndarray, str, Path]:
    """The loaderxd binary, the codecs, the source records (and what they are) and the stores' root of
    a run; ``--quick`` makes it a smoke run: batch 16, 5 steps, 512 records in a temporary root."""
    if args.quick:
        args.batch, args.steps, args.no_doc = 16, 5, True
    exe = loaderxd_path(args.loaderxd)
    codecs = [c for c in args.codecs.split(",") if c]
    src, what = source_array(args.quick, 512)
    root = Path(tempfile.mkdtemp(prefix=prefix)) if args.quick else DATA / "groups"
    return exe, codecs, src, what, root


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trainer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--setup", choices=(*SETUPS, "idle", "idle-torch"), help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--expected", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--loaderxd", help="the loaderxd binary (default: $LOADERXD or build/daemon/loaderxd)")
    ap.add_argument("--trainers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--torch-workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="loaderxd --threads (default: all cores)")
    ap.add_argument("--daemon-args", default="",
                    help='more loaderxd flags for (b), e.g. "--group-prefetch 0" (default: its defaults)')
    ap.add_argument("--codecs", default=",".join(CODECS))
    ap.add_argument("--setups", default=",".join(SETUPS),
                    help="comma-separated subset of embedded,broadcast,torch (a subset never writes docs)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: batch 16, 5 steps, 512 records; never writes docs")
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    return args


def render(args: argparse.Namespace, results: dict[tuple[str, str], dict[str, Any]], codecs: list[str],
           setups: list[str], what: str, records: int, machine: str) -> str:
    """The docs section of this run: the table and the goal lines."""
    base = {s: idle_pss(s) / 2**20 for s in setups}
    rows = []
    for codec in codecs:
        for setup in setups:
            r = results[(codec, setup)]
            rows.append([codec, setup, f"{r['rate_mean']:.1f}", f"{r['rate_min']:.1f}", f"{r['pss_mib']:.0f}",
                         f"{r['pss_mib'] - args.trainers * base[setup]:.0f}", f"{r['shmem_mib']:.0f}",
                         f"{r['file_mib']:.0f}", f"{r['cpu_s']:.1f}",
                         f"{r['daemon_cpu_s']:.1f}"])
    table = markdown_table(["codec", "set-up", "batches/s per trainer (mean)", "slowest trainer",
                            "total PSS MiB", f"minus {args.trainers} bare trainer processes, MiB",
                            "of which shared memory, MiB", "of which mapped files, MiB", "total CPU s",
                            "of which loaderxd"], rows, align="llrrrrrrrr")
    goals = []
    for codec in codecs:
        if ("embedded" not in setups or "broadcast" not in setups):
            break
        a, b = results[(codec, "embedded")], results[(codec, "broadcast")]
        one = a["max_trainer_pss_mib"]
        bare = base["broadcast"]
        loaders = b["pss_mib"] - args.trainers * bare
        line = (f"{codec}: (b) total PSS {b['pss_mib']:.0f} MiB = {b['pss_mib'] / one:.2f}x one embedded "
                f"trainer's {one:.0f} MiB (goal <= 1.3x); without the {args.trainers} bare trainer processes "
                f"({bare:.0f} MiB each: interpreter, NumPy and loaderx imported, no loader) it is "
                f"{loaders:.0f} MiB = {loaders / max(one - bare, 1e-9):.2f}x one embedded loader's "
                f"{one - bare:.0f} MiB.")
        if codec == "zstd":
            line += (f" (b) per-trainer {b['rate_mean']:.1f} batches/s = {b['rate_mean'] / a['rate_mean']:.2f}x "
                     f"(a)'s {a['rate_mean']:.1f} with zstd (goal >= 2x).")
        goals.append(line)
    return (
        "### loaderxd groups with processes\n\n"
        f"{machine}\n\n"
        f"`bench/bench_groups.py`: {args.trainers} trainer processes each draw {args.steps} IID batches of "
        f"{args.batch} uint8[3,224,224] images ({what}, {records} records), touching every page; (a) "
        f"embedded loaders, (b) members of one loaderxd broadcast group, (c) torch DataLoaders with "
        f"{args.torch_workers} forked workers each. Every trainer's first batch is checked first. PSS: peak "
        "of the total over all trainers, their workers and loaderxd, and what it is made of at that moment: "
        "shared memory (loaderxd's group ring; torch's worker tensors) and mapped files (libraries and store "
        "pages read through the mapping, counted once in total however many processes map them; records of "
        "64 KiB and more are read with pread, so the stores' page cache is not in PSS in any set-up); CPU: all "
        f"of them. loaderxd flags: {' '.join(args.daemon_args.split()) or 'its defaults (--group-prefetch 1, --group-live-batches 2)'}. "
        "One run; load average "
        f"{os.getloadavg()[0]:.1f} at the end.\n\n{table}\n\n" + "\n".join(goals) + "\n\n"
        "![batches/s and PSS](bench_groups.png)\n"
    )


def main() -> int:
    args = parse_args()
    if args.trainer:
        return trainer(args)
    exe, codecs, src, what, root = run_inputs(args, "lxgroups-stores-")
    setups = [s for s in SETUPS if s in args.setups.split(",")]
    if setups != list(SETUPS):
        args.no_doc = True  # the published table has every set-up
    results: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        for codec in codecs:
            store = build_store(root, src, codec)
            for setup in setups:
                with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                    json.dump(expected_hashes(store, args.batch, setup, args.torch_workers), f)
                flags = [*(["--threads", str(args.threads)] if args.threads else []), *args.daemon_args.split()]
                daemon = Daemon(exe, *flags) if setup == "broadcast" else None
                try:
                    r = run_setup(args, setup, store, Path(f.name), daemon)
                finally:
                    if daemon:
                        daemon.close()
                    os.unlink(f.name)
                results[(codec, setup)] = r
                print(codec, setup, json.dumps({k: round(v, 3) for k, v in r.items()}), flush=True)
    finally:
        if args.quick:
            shutil.rmtree(root, ignore_errors=True)
    machine = machine_line()
    body = render(args, results, codecs, setups, what, len(src), machine)
    print(body)
    if not args.no_doc:
        plot(DOCS / "bench_groups.png", results, args.trainers)
        update_doc_section("groups-processes", body, DOCS / "benchmarks.md")
        write_section("groups", machine, groups_goals(results, codecs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
