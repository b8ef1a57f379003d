#!/usr/bin/env python3
# Owner: benchmark engineer (end-to-end loader benchmark, issue #4). The loader
# engineer owns python/loaderx/dataloader.py, not this file.
"""End-to-end loader benchmark on real photos (issue #4).

Workload: the 2,500 ``uint8[3,224,224]`` real-photo records of
bench/prepare_vision.py, batch 256 (36.8 MiB), IID (torch: random with
replacement; grain: its shuffled endless sampler). Every loader carries a
second stream with each record's index so its batches can be checked against
the source array; the first ``CHECK`` batches of every loader are compared
exactly (dtype, shape, bytes) before anything is timed, then ``WARMUP``
batches are discarded and ``BATCHES`` (200) are timed.

Loaders (each run in its own fresh process; its whole process tree's PSS,
the sum of Pss in /proc/<pid>/smaps_rollup over the process and all its
descendants, is sampled every 50 ms by this parent while the tree's RSS grows:
benchlib.PssSampler):

* ``loaderx``: this project's DataLoader over Zrecord Dense stores (raw, zstd);
* ``reference``: the PyPI ``loaderx==2.5.4`` wheel in bench/.venv-ref (made by
  bench/refvenv.py), over its own stores (raw, zstd);
* ``torch``: torch.utils.data.DataLoader, fork and spawn, 2 and 4 workers,
  over a NumPy memmap dataset with ``__getitems__`` (one fancy-index read per
  batch);
* ``grain``: grain.python.DataLoader over ArrayRecord (raw, zstd), 2 workers.
* ``mosaic``: mosaicml-streaming's ``StreamingDataset`` over MDS shards of the same
  records (local directory, no remote), in a torch DataLoader with 2 workers; it
  runs in bench/.venv-mds (see bench/refvenv.py for why it has its own venv);
* ``litdata``: ``litdata.optimize`` chunks of the same records read by
  ``litdata.StreamingDataset`` + ``StreamingDataLoader``, 2 workers, local only.

Usage: bench/bench_loader.py [--only loaderx,torch,...] [--batches 200] [--no-doc]
                              [--compare LABEL=PKGDIR ...] [--threads N] [--prefetch N]

``--compare before=bench/data/pkg/<dir>`` adds loaderx rows run with another
build of the package (a directory holding ``loaderx/`` with its extension), so
a change is measured before/after in the same run, minutes apart under the same
machine load. ``--threads``/``--prefetch`` set the loaderx rows' DataLoader
arguments (default: the DataLoader's defaults).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from benchlib import (
    DATA,
    DOCS,
    REPO,
    MiB,
    PssSampler,
    bar_plot,
    machine_line,
    markdown_table,
    snapshot_loaderx,
    update_doc_section,
)
from goals import Part, write_section

BATCH = 256
CHECK = 3
WARMUP = 10
SOURCE = DATA / "vision_dense.npy"
STORES = DATA / "loader"


# ==========================================================================
# Child side: build one loader, check, warm up, time. Prints one JSON line.
# ==========================================================================

def _loaderx_iter(codec: str, threads: int | None,
                  prefetch: int | None = None) -> tuple[Iterator[tuple[Any, Any]], Any]:
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Dense
    root = STORES / ("ref" if _is_reference() else "loaderx") / codec
    img, idx = _loaderx_stores(root, codec)
    streams = {"image": Dense.open(str(img)), "index": Dense.open(str(idx))}
    kw: dict[str, int] = {}
    if threads is not None:
        kw["num_threads"] = threads
    if prefetch is not None:
        kw["prefetch"] = prefetch
    loader = DataLoader(streams, batch_size=BATCH, **kw)

    def gen():
        while True:
            b = next(loader)
            yield b["image"], b["index"]

    def close():
        loader.close()
        for s in streams.values():
            s.close()
    return gen(), close


def _is_reference() -> bool:
    import loaderx
    return ".venv-ref" in Path(loaderx.__file__).resolve().parts


def _loaderx_stores(root: Path, codec: str) -> tuple[Path, Path]:
    """Writes (once) the image and index stores with whichever loaderx is imported."""
    from loaderx.zrecord import Dense
    img, idx = root / "image", root / "index"
    if not (img.exists() and idx.exists()):
        import shutil
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        src = np.load(SOURCE, mmap_mode="r")
        with Dense.create(str(img), src.dtype, src.shape[1:], codec=codec) as ds:
            ds.append(src)
        with Dense.create(str(idx), np.dtype(np.int64), (), codec=codec) as ds:
            ds.append(np.arange(src.shape[0], dtype=np.int64))
    return img, idx


class MemmapDataset:
    """Map-style dataset over the .npy memmap; ``__getitems__`` reads a whole batch."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.n = int(np.load(path, mmap_mode="r").shape[0])
        self.mm: np.ndarray | None = None  # opened lazily in each worker

    def __len__(self) -> int:
        return self.n

    def _arr(self) -> np.ndarray:
        if self.mm is None:
            self.mm = np.load(self.path, mmap_mode="r")
        return self.mm

    def __getitem__(self, i: int):
        import torch
        return torch.from_numpy(np.array(self._arr()[i])), i

    def __getitems__(self, indices: list[int]):
        import torch
        ix = np.asarray(indices, dtype=np.int64)
        return torch.from_numpy(self._arr()[ix]), torch.from_numpy(ix)


def identity_collate(batch: Any) -> Any:
    return batch


def _torch_iter(ctx: str, workers: int) -> tuple[Iterator[tuple[Any, Any]], Any]:
    import torch
    from torch.utils.data import DataLoader, RandomSampler
    ds = MemmapDataset(str(SOURCE))
    g = torch.Generator()
    g.manual_seed(42)
    sampler = RandomSampler(ds, replacement=True, num_samples=10**9, generator=g)
    # A duck-typed map-style dataset (torch only needs __len__/__getitem(s)__).
    dl: Any = DataLoader(cast(Any, ds), batch_size=BATCH, sampler=sampler, num_workers=workers, collate_fn=identity_collate,
                    multiprocessing_context=ctx if workers else None, persistent_workers=bool(workers),
                    drop_last=True)
    it = iter(dl)

    def gen():
        while True:
            x, ix = next(it)
            yield x.numpy(), ix.numpy()

    # No explicit shutdown: torch's private _shutdown_workers() aborts spawn
    # workers (SIGABRT at exit); the workers end with this child process.
    return gen(), lambda: None


def _grain_records(codec: str) -> Path:
    """Writes (once) an ArrayRecord file of ``int64 index | image bytes`` records."""
    from array_record.python.array_record_module import ArrayRecordWriter
    path = STORES / "grain" / f"{codec}.array_record"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        src = np.load(SOURCE, mmap_mode="r")
        tmp = path.with_suffix(".tmp")
        wr = ArrayRecordWriter(str(tmp), "group_size:1," + ("uncompressed" if codec == "raw" else "zstd:3"))
        for i in range(src.shape[0]):
            wr.write(np.int64(i).tobytes() + np.ascontiguousarray(src[i]).tobytes())
        wr.close()
        tmp.rename(path)
    return path


def _grain_iter(codec: str, workers: int) -> tuple[Iterator[tuple[Any, Any]], Any]:
    import grain.python as gp
    from absl import flags

    # grain reads absl flags (worker profiling, traceback filtering) and raises
    # UnparsedFlagAccessError unless they were parsed, as absl.app.run would.
    if not flags.FLAGS.is_parsed():
        flags.FLAGS(sys.argv[:1])

    shape = np.load(SOURCE, mmap_mode="r").shape[1:]

    class Parse(gp.MapTransform):
        def map(self, rec: bytes) -> dict[str, np.ndarray]:
            return {"index": np.frombuffer(rec, dtype=np.int64, count=1)[0],
                    "image": np.frombuffer(rec, dtype=np.uint8, offset=8).reshape(shape)}

    src = gp.ArrayRecordDataSource(str(_grain_records(codec)))
    dl = gp.DataLoader(data_source=src,
                       sampler=gp.IndexSampler(len(src), shuffle=True, seed=42, num_epochs=None),
                       operations=[Parse(), gp.Batch(BATCH, drop_remainder=True)], worker_count=workers)
    it = iter(dl)

    def gen():
        while True:
            b = next(it)
            yield b["image"], b["index"]

    return gen(), lambda: None


def _write_once(path: Path, write: Any) -> Path:
    """Calls ``write(tmp)`` to build ``path`` in a sibling temporary directory and
    renames it into place, so a killed run never leaves a half-written store."""
    import shutil
    if not path.exists():
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        tmp.rename(path)
    return path


def _torchvision_placeholders() -> dict[str, Any]:
    """Modules standing in for a torchvision that cannot load: they provide just
    ``torchvision.datasets.VisionDataset`` and
    ``torchvision.transforms.functional.to_tensor`` (both raise when used), each
    with a module spec (``importlib.util.find_spec`` needs one)."""
    import importlib.machinery
    import types

    def unavailable(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("torchvision is not usable here (CUDA build next to a CPU torch)")

    names = ("torchvision", "torchvision.datasets", "torchvision.transforms", "torchvision.transforms.functional")
    mods: dict[str, Any] = {n: types.ModuleType(n) for n in names}
    for name, mod in mods.items():
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    mods["torchvision.datasets"].VisionDataset = type("VisionDataset", (), {"__init__": unavailable})
    mods["torchvision.transforms.functional"].to_tensor = unavailable
    mods["torchvision"].datasets = mods["torchvision.datasets"]
    mods["torchvision"].transforms = mods["torchvision.transforms"]
    mods["torchvision.transforms"].functional = mods["torchvision.transforms.functional"]
    return mods


def _streaming() -> Any:
    """The mosaicml-streaming package, importable on a CPU-only torch.

    ``import streaming`` imports its torchvision-based dataset classes
    (``streaming.vision``: ``VisionDataset`` and ``to_tensor``). PyPI only has
    CUDA builds of torchvision, whose native ops fail to load next to this
    machine's CPU torch wheel (``libc10_cuda.so`` missing), so the import
    fails. The benchmark uses none of those classes: when torchvision does not
    import, :func:`_torchvision_placeholders` stand in for it.
    ``StreamingDataset`` and ``MDSWriter`` never touch torchvision.
    """
    try:
        import torchvision  # noqa: F401 - a working install is used as is
    except (ImportError, OSError, RuntimeError):
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]  # the half-imported package
        sys.modules.update(_torchvision_placeholders())
    import streaming
    return streaming


def _write_mds(out: Path) -> None:
    """MDS shards (uncompressed, 64 MiB) of ``{"image": uint8[3,224,224], "index": int64}``."""
    MDSWriter = _streaming().MDSWriter
    src = np.load(SOURCE, mmap_mode="r")
    cols = {"image": "ndarray:uint8:" + ",".join(str(d) for d in src.shape[1:]), "index": "int64"}
    with MDSWriter(out=str(out), columns=cols, compression=None, size_limit=1 << 26) as w:
        for i in range(src.shape[0]):
            w.write({"image": np.ascontiguousarray(src[i]), "index": np.int64(i)})


def _mosaic_iter(workers: int, total: int) -> tuple[Iterator[tuple[Any, Any]], Any]:
    import torch
    StreamingDataset = _streaming().StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    clean_stale_shared_memory()  # a killed earlier run may have left its /dev/shm state behind
    # One epoch long enough for every batch drawn (epoch_size > n: each sample
    # is drawn several times, shuffled), so no epoch boundary (worker restart)
    # falls inside the timed batches; the others run endless samplers too.
    ds = StreamingDataset(local=str(_write_once(STORES / "mds" / "raw", _write_mds)), remote=None,
                          shuffle=True, shuffle_seed=42, batch_size=BATCH, epoch_size=(total + 8) * BATCH)
    it = iter(torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=workers, drop_last=True))

    def gen():
        while True:
            b = next(it)
            yield b["image"].numpy(), b["index"].numpy()

    return gen(), lambda: None


_LITDATA_SRC: dict[str, np.ndarray] = {}  # source path -> memmap, per process


def _litdata_record(source: str, i: int) -> dict[str, Any]:
    """``litdata.optimize``'s per-input function: record ``i`` of the ``.npy`` at
    ``source`` and its index. The path is an argument, not a module global: the
    optimizer's worker processes import this module afresh."""
    src = _LITDATA_SRC.get(source)
    if src is None:
        src = _LITDATA_SRC[source] = np.load(source, mmap_mode="r")
    return {"index": int(i), "image": np.array(src[i])}


def _litdata() -> Any:
    """The litdata module, imported with its PyPI "newer version?" query (made
    by every StreamingDataset) switched off: the benchmark is local only."""
    os.environ["LITDATA_DISABLE_VERSION_CHECK"] = "1"  # read once, when litdata is imported
    import litdata
    return litdata


def _write_litdata(out: Path) -> None:
    ld = _litdata()
    n = int(np.load(SOURCE, mmap_mode="r").shape[0])
    # optimize() installs a process-wide SIGINT handler that calls
    # os._exit(0) and never removes it: a later Ctrl-C would end this
    # process silently with status 0. Put the caller's handler back.
    sigint = signal.getsignal(signal.SIGINT)
    try:
        ld.optimize(fn=functools.partial(_litdata_record, str(SOURCE)), inputs=list(range(n)),
                    output_dir=str(out), chunk_bytes="64MB", num_workers=1, verbose=False)
    finally:
        signal.signal(signal.SIGINT, sigint)


def _litdata_iter(workers: int, total: int) -> tuple[Iterator[tuple[Any, Any]], Any]:
    import math
    ld = _litdata()
    n = int(np.load(SOURCE, mmap_mode="r").shape[0])
    # subsample=k (k >= 1) repeats the dataset k times in one shuffled epoch:
    # enough for every batch drawn, so no epoch boundary is timed.
    # batch_decode=0 decodes each item alone: "auto" picks a 256-row decode
    # window for NumPy payloads, which under shuffling decoded ~52 records
    # (7.7 MiB) per record used here, about 3x slower.
    ds = ld.StreamingDataset(str(_write_once(STORES / "litdata" / "raw", _write_litdata)), shuffle=True, seed=42,
                             drop_last=True, subsample=float(math.ceil((total + 8) * BATCH / n)), batch_decode=0)
    it = iter(ld.StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers, drop_last=True))

    def gen():
        while True:
            b = next(it)
            yield b["image"].numpy(), b["index"].numpy()

    return gen(), lambda: None


def check_batch(label: str, k: int, img: Any, ix: Any, truth: np.ndarray) -> None:
    """Raises SystemExit naming loader ``label`` unless its batch ``k`` (images
    ``img``, record indices ``ix``; NumPy arrays or torch tensors) is exactly
    ``truth[ix]``: dtype, shape ``(BATCH, *record shape)`` and every byte."""
    img, ix = np.asarray(img), np.asarray(ix).astype(np.int64)
    if ix.shape != (BATCH,) or ix.min(initial=0) < 0 or ix.max(initial=0) >= truth.shape[0]:
        raise SystemExit(f"{label}: batch {k} has record indices of shape {ix.shape} outside 0..{truth.shape[0] - 1}")
    want = truth[ix]
    if img.dtype != want.dtype or img.shape != (BATCH, *truth.shape[1:]) or not np.array_equal(img, want):
        raise SystemExit(f"{label}: batch {k} differs from the source records (got {img.dtype}{img.shape})")


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    kind = cfg["kind"]
    t_open = time.perf_counter()
    if kind in ("loaderx", "reference"):
        it, close = _loaderx_iter(cfg["codec"], cfg.get("threads"), cfg.get("prefetch"))
    elif kind == "torch":
        it, close = _torch_iter(cfg["ctx"], cfg["workers"])
    elif kind == "grain":
        it, close = _grain_iter(cfg["codec"], cfg["workers"])
    elif kind == "mosaic":
        it, close = _mosaic_iter(cfg["workers"], CHECK + WARMUP + cfg["batches"])
    elif kind == "litdata":
        it, close = _litdata_iter(cfg["workers"], CHECK + WARMUP + cfg["batches"])
    else:
        raise SystemExit(f"unknown loader kind {kind}")
    truth = np.load(SOURCE, mmap_mode="r")
    for k in range(CHECK):
        check_batch(cfg["label"], k, *next(it), truth)
    first = time.perf_counter() - t_open
    for _ in range(WARMUP):
        next(it)
    lat = []
    t0 = time.perf_counter()
    for _ in range(cfg["batches"]):
        t = time.perf_counter()
        next(it)
        lat.append(time.perf_counter() - t)
    total = time.perf_counter() - t0
    close()
    return {"batches_s": cfg["batches"] / total, "p95_ms": float(np.percentile(lat, 95) * 1e3),
            "mean_ms": float(np.mean(lat) * 1e3), "startup_s": first}


# ==========================================================================
# Parent side
# ==========================================================================

def configs(only: set[str] | None, batches: int, compare: list[tuple[str, str]] | None = None,
            threads: int | None = None, prefetch: int | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for codec in ("raw", "zstd"):
        out.append({"kind": "loaderx", "codec": codec, "label": f"loaderx {codec}", "model": "threads",
                    "storage": f"zrecord {codec}"})
        for label, pkg in compare or []:
            out.append({"kind": "loaderx", "codec": codec, "label": f"loaderx {codec} ({label})",
                        "model": "threads", "storage": f"zrecord {codec}", "pkg": pkg})
    for c in out:
        if threads is not None:
            c["threads"] = threads
        if prefetch is not None:
            c["prefetch"] = prefetch
    for codec in ("raw", "zstd"):
        out.append({"kind": "reference", "codec": codec, "label": f"reference 2.5.4 {codec}",
                    "model": "threads", "storage": f"zrecord {codec} (2.5.4)"})
    for ctx in ("fork", "spawn"):
        for w in (2, 4):
            out.append({"kind": "torch", "ctx": ctx, "workers": w, "label": f"torch {ctx} {w}w",
                        "model": f"{w} processes ({ctx})", "storage": "npy memmap"})
    for codec in ("raw", "zstd"):
        out.append({"kind": "grain", "codec": codec, "workers": 2, "label": f"grain {codec} 2w",
                    "model": "2 processes", "storage": f"ArrayRecord {codec}"})
    out.append({"kind": "mosaic", "workers": 2, "label": "mosaic-streaming 2w", "model": "2 processes (fork)",
                "storage": "MDS shards raw"})
    out.append({"kind": "litdata", "workers": 2, "label": "litdata 2w", "model": "2 processes (fork)",
                "storage": "litdata chunks raw"})
    for c in out:
        c["batches"] = batches
    return [c for c in out if only is None or c["kind"] in only]


def run_one(cfg: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    if cfg["kind"] == "reference":
        try:
            from refvenv import ensure
            info = ensure()
        except (OSError, subprocess.CalledProcessError, RuntimeError) as e:
            # No reference wheel installable here: report it, don't fail the table.
            return {"error": f"reference venv unavailable ({e})"}
        if info["version"] != "2.5.4":
            cfg["label"] = cfg["label"].replace("2.5.4", info["version"])
        py = info["python"]
        env.pop("PYTHONPATH", None)  # the reference package has the same import name
    elif cfg["kind"] == "mosaic":
        try:
            from refvenv import MDS
            py = MDS.ensure()["python"]
        except (OSError, subprocess.CalledProcessError, RuntimeError) as e:
            return {"error": f"mosaicml-streaming venv unavailable ({e})"}
        env.pop("PYTHONPATH", None)  # its own venv; it needs no loaderx
    else:
        py = sys.executable
        pkg = cfg.get("pkg") or str(snapshot_loaderx())
        env["PYTHONPATH"] = pkg + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([py, str(Path(__file__).resolve()), "--child", json.dumps(cfg)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO))
    with PssSampler(proc.pid, interval=0.05) as pss:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            return {"error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        # The exception's own line: the last one that names an error class
        # (grain appends a notice about its traceback filtering after it).
        lines = err.strip().splitlines() or ["?"]
        tail = next((ln.strip() for ln in reversed(lines)
                     if re.match(r"^\s*[\w.]*(Error|Exception|Exit|Interrupt)\b", ln)), lines[-1])
        return {"error": f"exit {proc.returncode}: {tail}"}
    res = json.loads(out.strip().splitlines()[-1])
    res["peak_pss"] = pss.peak
    res["peak_pss_anon"] = pss.peak_anon
    return res


def render(rows: list[tuple[dict, dict]], batches: int) -> tuple[str, list[str]]:
    ref = {c["label"]: r for c, r in rows if "error" not in r}
    base = ref.get("torch fork 4w")
    headers = ["loader", "model", "storage", "batches/s", "p95 batch", "peak PSS (tree)",
               "peak anon PSS", "speed vs torch fork 4w", "PSS vs torch fork 4w"]
    table = []
    for c, r in rows:
        if "error" in r:
            continue
        name = f"**{c['label']}**" if c["kind"] == "loaderx" else c["label"]
        table.append([name, c["model"], c["storage"], f"{r['batches_s']:.1f}", f"{r['p95_ms']:.1f} ms",
                      f"{r['peak_pss'] / MiB:,.0f} MiB", f"{r.get('peak_pss_anon', 0) / MiB:,.0f} MiB",
                      f"{r['batches_s'] / base['batches_s']:.2f}x" if base else "n/a",
                      f"{r['peak_pss'] / base['peak_pss']:.2f}x" if base else "n/a"])
    notes = []
    for codec in ("raw", "zstd"):
        a, b = ref.get(f"loaderx {codec}"), ref.get(f"reference 2.5.4 {codec}")
        if a and b:
            notes.append(f"loaderx {codec} / reference 2.5.4 {codec}: {a['batches_s'] / b['batches_s']:.2f}x "
                         f"batches/s, {a['peak_pss'] / b['peak_pss']:.2f}x peak PSS")
        if a and base:
            notes.append(f"loaderx {codec} / torch fork 4w: {a['batches_s'] / base['batches_s']:.2f}x batches/s, "
                         f"{a['peak_pss'] / base['peak_pss']:.2f}x peak PSS")
    for c, r in rows:
        if c["kind"] == "loaderx" and "pkg" in c and "error" not in r:
            a = ref.get(f"loaderx {c['codec']}")
            if a:
                notes.append(f"loaderx {c['codec']} / {c['label']}: {a['batches_s'] / r['batches_s']:.2f}x "
                             f"batches/s, {a['peak_pss'] / r['peak_pss']:.2f}x peak PSS")
    raw = ref.get("loaderx raw")
    for c, r in rows:  # the streaming peers (mosaicml-streaming, litdata)
        if c["kind"] in ("mosaic", "litdata") and raw and "error" not in r:
            notes.append(f"loaderx raw / {c['label']}: {raw['batches_s'] / r['batches_s']:.2f}x batches/s, "
                         f"{raw['peak_pss'] / r['peak_pss']:.2f}x peak PSS")
    skipped = [f"{c['label']} ({r['error']})" for c, r in rows if "error" in r]
    if skipped:
        notes.append("Not measured: " + "; ".join(skipped))
    return markdown_table(headers, table, "lllrrrrrr"), notes


def loader_goals(rows: list[tuple[dict, dict]]) -> dict[str, list[Part]]:
    """The loader's goal figures (bench/goals.py), from the rows of its table (first runs only)."""
    ref = {c["label"]: r for c, r in rows if "error" not in r}
    torch4 = ref.get("torch fork 4w")

    def ratio(a: str, b: dict | None, key: str) -> float | None:
        return ref[a][key] / b[key] if a in ref and b else None

    return {
        "loader-wheel": [Part(c, ratio(f"loaderx {c}", ref.get(f"reference 2.5.4 {c}"), "batches_s"))
                         for c in ("raw", "zstd")],
        "loader-torch": [Part("raw", ratio("loaderx raw", torch4, "batches_s"))],
        "loader-pss-torch": [Part(c, ratio(f"loaderx {c}", torch4, "peak_pss")) for c in ("raw", "zstd")],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--only", default="",
                    help="comma list of loader kinds: loaderx,reference,torch,grain,mosaic,litdata")
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--repeat-key", type=int, default=2,
                    help="run loaderx raw and torch fork 4w this many times (key ratio)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--compare", action="append", default=[], metavar="LABEL=PKGDIR",
                    help="also run the loaderx rows with the package in PKGDIR (holding loaderx/)")
    ap.add_argument("--threads", type=int, default=None, help="loaderx num_threads (default: DataLoader's)")
    ap.add_argument("--prefetch", type=int, default=None, help="loaderx prefetch (default: DataLoader's)")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0

    if not SOURCE.exists():
        raise SystemExit(f"{SOURCE} missing: run bench/prepare_vision.py first")
    only = set(args.only.split(",")) if args.only else None
    compare = []
    for spec in args.compare:
        label, _, pkg = spec.partition("=")
        if not pkg or not (Path(pkg) / "loaderx").is_dir():
            raise SystemExit(f"--compare {spec}: expected LABEL=DIR with DIR/loaderx")
        compare.append((label, str(Path(pkg).resolve())))
    cfgs = configs(only, args.batches, compare, args.threads, args.prefetch)
    machine = machine_line()
    print(f"# loader benchmark - {machine}")
    print(f"# batch {BATCH} x uint8[3,224,224] = {BATCH * 3 * 224 * 224 / MiB:.1f} MiB, "
          f"{CHECK} checked + {WARMUP} warm-up + {args.batches} timed batches")
    rows: list[tuple[dict, dict]] = []
    for c in cfgs:
        r = run_one(c, args.timeout)
        rows.append((c, r))
        if "error" in r:
            print(f"{c['label']:<24} ERROR {r['error']}", flush=True)
        else:
            print(f"{c['label']:<24} {r['batches_s']:7.1f} batches/s  p95 {r['p95_ms']:6.1f} ms  "
                  f"peak PSS {r['peak_pss'] / MiB:7.0f} MiB", flush=True)
    repeats = []
    for k in range(1, args.repeat_key):
        for c in cfgs:
            if c["label"] in ("loaderx raw", "torch fork 4w"):
                r = run_one(c, args.timeout)
                repeats.append((c, r))
                if "error" not in r:
                    print(f"{c['label']:<24} {r['batches_s']:7.1f} batches/s  (repeat {k})", flush=True)
    md, notes = render(rows, args.batches)
    rep = {c["label"]: r for c, r in repeats if "error" not in r}
    if "loaderx raw" in rep and "torch fork 4w" in rep:
        notes.append(f"repeat run: loaderx raw / torch fork 4w = "
                     f"{rep['loaderx raw']['batches_s'] / rep['torch fork 4w']['batches_s']:.2f}x batches/s")
    print()
    print(md)
    print("\n".join("- " + n for n in notes))
    results = REPO / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / "loader.json").write_text(json.dumps(
        {"machine": machine, "rows": [{"cfg": c, "res": r} for c, r in rows + repeats]}, indent=1))
    if not args.no_doc and not only and not compare and args.threads is None and args.prefetch is None:
        ok = [(c, r) for c, r in rows if "error" not in r]
        png = DOCS / "bench_loader.png"
        bar_plot(png, f"End-to-end loader, batch {BATCH} x uint8[3,224,224] (batches/s, higher is better)",
                 [c["label"] for c, _ in ok], [r["batches_s"] for _, r in ok], "batches/s")
        body = (f"### End-to-end loader\n\nRun: {machine}.\nBatch {BATCH} of `uint8[3,224,224]` real-photo "
                f"records ({BATCH * 3 * 224 * 224 / MiB:.1f} MiB), {args.batches} timed batches after "
                f"{CHECK} checked and {WARMUP} warm-up batches; each loader in a fresh process; peak PSS is "
                f"the sum over the process tree, sampled every 50 ms while its RSS grows; anon PSS leaves out mapped file pages "
                f"(clean page cache, e.g. a memory-mapped store).\n\n{md}\n\n"
                + "\n".join("- " + n for n in notes) + f"\n\n![loader batches/s]({png.name})\n")
        update_doc_section("loader", body)
        write_section("loader", machine, loader_goals(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
