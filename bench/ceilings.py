"""The machine's ceilings for a store write, measured beside each write (bench_store.py).

Two limits, each run by ``loaderx_write_ceiling`` (bench/write_ceiling.cc: no
loaderx code on the path) on the same bytes as the store write it is reported
beside:

* **raw**: the store's bytes written with the best sequential ``pwrite`` +
  ``fdatasync`` pattern found on this machine: one file, or as many files as
  the store's ``data_shards`` written by one thread each, in pieces of 1 or
  8 MiB; of those four patterns the one of the shortest median run.
  This is the page cache's copy plus the device's writeback: no writer of
  these bytes can be durable sooner.
* **zstd**: the compressor alone: every record compressed as its own frame
  with the store's frame parameters and level (or dictionary), in a tight loop
  on all cores, no I/O; integer records narrowed first as the store narrows
  them (format 1.2), outside the timed loop. bench_store.py also reports it plus the raw ceiling of
  the compressed store's bytes (compress, then write: the best a writer that
  does not overlap the two can do).

Each ceiling runs as many times as the write it is compared with
(bench_store.py's ``--write-repeats``) and gives its median run, as the write
does: a ceiling's best run against the write's median run would charge the
write with the run-to-run spread of this machine (10-15 % on the
compressor's runs here).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from benchlib import DenseWorkload, RaggedWorkload, bench_binary, median_index, run_cpp

PIECES = (1 << 20, 8 << 20)


@dataclass
class RawCeiling:
    seconds: float  # the median run of the best pattern
    pattern: str  # e.g. "4 files, 8 MiB pieces"


@dataclass
class ZstdCeiling:
    seconds: float  # the compressor alone, all cores: its median run
    out_bytes: int  # the frames' bytes (records that would not shrink count raw)
    threads: int
    cpu_seconds: float  # CPU time of every compressing thread in that run


def raw_ceiling(nbytes: int, shards: int, where: Path, repeat: int = 3) -> RawCeiling:
    """The write + fdatasync of ``nbytes`` on the file system of ``where``: the median of
    ``repeat`` runs of the pattern whose median is the shortest."""
    exe = bench_binary("loaderx_write_ceiling")
    best: RawCeiling | None = None
    where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=where, prefix=".ceiling-") as d:
        for files in sorted({1, max(1, shards)}):
            for piece in PIECES:
                got = run_cpp(exe, "raw", "--dir", d, "--bytes", max(1, nbytes), "--files", files,
                              "--chunk", piece, "--repeat", repeat)
                median = got["samples"][median_index(got["samples"])]
                if best is None or median < best.seconds:
                    best = RawCeiling(median, f"{files} file{'s' if files > 1 else ''}, "
                                                      f"{piece >> 20} MiB pieces")
    assert best is not None
    return best


def narrowed(rec: np.ndarray) -> np.ndarray:
    """The values a store of format 1.2 compresses for ``rec`` (docs/format.md, "Narrowing"):
    a record of a 2-, 4- or 8-byte integer dtype in the smallest width w in {1, 2, 4} bytes
    (w < itemsize) that holds every value, unsigned if none is negative; else ``rec``."""
    dt = rec.dtype
    if dt.kind not in "iu" or dt.itemsize not in (2, 4, 8) or rec.size == 0:
        return rec
    lo, hi = int(rec.min()), int(rec.max())
    for w in (1, 2, 4):
        if w >= dt.itemsize:
            break
        if lo >= 0 and hi < 1 << (8 * w):
            return rec.astype(f"<u{w}")
        if -(1 << (8 * w - 1)) <= lo and hi < 1 << (8 * w - 1):
            return rec.astype(f"<i{w}")
    return rec


def _record_files(w: DenseWorkload | RaggedWorkload, d: Path, narrow: bool) -> tuple[Path, Path]:
    """The workload's records back to back (narrowed as the store narrows them when
    ``narrow``) and their uint64 end offsets, as the tool reads them."""
    records, ends = d / "records.bin", d / "ends.bin"
    n = w.n
    dtype = w.array.dtype if isinstance(w, DenseWorkload) else w.dtype
    if not (narrow and dtype.kind in "iu" and dtype.itemsize in (2, 4, 8)):
        # Nothing narrows: the records' bytes as they are, in big pieces.
        if isinstance(w, DenseWorkload):
            step = max(1, (64 << 20) // max(1, w.record_bytes))
            with open(records, "wb") as f:
                f.writelines(np.ascontiguousarray(w.array[a:a + step]).tobytes() for a in range(0, n, step))
            e = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(w.record_bytes)
        else:
            with open(records, "wb") as f:
                f.write(np.ascontiguousarray(w.values[: int(w.offsets[-1])]).tobytes())
            e = w.offsets[1:].astype(np.uint64) * np.uint64(w.dtype.itemsize)
    else:
        e = np.empty(n, dtype=np.uint64)
        at = 0
        with open(records, "wb") as f:
            for k in range(n):
                r = w.array[k] if isinstance(w, DenseWorkload) else w.record(k)
                b = np.ascontiguousarray(narrowed(np.asarray(r))).tobytes()
                f.write(b)
                at += len(b)
                e[k] = at
    e.astype("<u8").tofile(ends)
    return records, ends


def zstd_ceiling(w: DenseWorkload | RaggedWorkload, where: Path, level: int = 3,
                 dict_bytes: bytes | None = None, repeat: int = 3, narrow: bool = True) -> ZstdCeiling:
    """The compressor's time for ``w``'s records, one frame per record, on all cores: the
    median of ``repeat`` runs."""
    exe = bench_binary("loaderx_write_ceiling")
    threads = os.cpu_count() or 1
    where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=where, prefix=".ceiling-") as d:
        records, ends = _record_files(w, Path(d), narrow)
        args: list[object] = ["zstd", "--records", records, "--ends", ends, "--level", level,
                              "--threads", threads, "--repeat", repeat]
        if dict_bytes is not None:
            (Path(d) / "dict").write_bytes(dict_bytes)
            args += ["--dict", Path(d) / "dict"]
        got = run_cpp(exe, *args)
    m = median_index(got["samples"])
    return ZstdCeiling(got["samples"][m], int(got["out_bytes"]), threads, float(got["cpu_samples"][m]))
