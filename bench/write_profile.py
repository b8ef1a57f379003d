#!/usr/bin/env python3
"""Where a zstd store write's CPU goes, against the compressor alone.

For each workload and codec of bench_store.py, two profiles of the same
records at the same level (or dictionary), sampled with ``perf record -e
cpu-clock`` (no hardware counters needed):

* **ours**: ``--writes`` loaderx writes of the store (``Dense.create`` or
  ``Ragged.create``, ``append``, ``close()``: the durable publish included) in a
  child process; perf attaches after the child loaded the data, trained the
  dictionary and made one untimed write, so only the writes are sampled;
* **the compressor alone**: ``loaderx_write_ceiling zstd`` (bench/ceilings.py),
  the writes' count of runs: the profile of one run more, less that of one
  run (what reading its input costs).

A ``zstd_dict`` store and its ceiling use one dictionary, trained once as
bench_store.py trains it.

Samples are grouped by what the code does (``AREAS``) and given in CPU
milliseconds per write. With ``--callgrind``, the first ``--callgrind-records``
records are also written once under valgrind's callgrind, and compressed once
by the ceiling: the instructions executed inside zstd's ``ZSTD_compress2`` in
each, which are equal when the writer calls the compressor as the ceiling does.

Writes its table into docs/benchmarks.md ("write-profile" section). Run it with
nothing else running (`make bench-write-profile`); needs ``perf`` (and
``valgrind`` for ``--callgrind``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from benchlib import (
    DATA,
    DenseWorkload,
    RaggedWorkload,
    bench_binary,
    machine_line,
    markdown_table,
    median_index,
    update_doc_section,
)

FREQ = 2000  # perf samples per second of CPU
# (area, test on (dso, symbol, kernel)): the first that matches names a sample.
AREAS: list[tuple[str, object]] = [
    ("compressor", lambda dso, sym, k: re.match(r"(ZSTD_|HUF_|FSE_|HIST_|ZDICT_)", sym) is not None),
    ("narrowing", lambda dso, sym, k: "narrow::" in sym),
    ("checksums", lambda dso, sym, k: "xxhash" in dso or sym.startswith("XXH")),
    ("kernel", lambda dso, sym, k: k),
    ("Python", lambda dso, sym, k: dso.startswith(("libpython", "python"))),
    ("libc (copies, allocation)", lambda dso, sym, k: dso.startswith(("libc.so", "ld-linux"))),
    ("writer, other", lambda dso, sym, k: "_loaderx" in dso or "loaderx_write_ceiling" in dso),
]
OTHER = "other"
COLUMNS = [a for a, _ in AREAS] + [OTHER]


def area_of(dso: str, sym: str, kernel: bool) -> str:
    for name, test in AREAS:
        if test(dso, sym, kernel):  # type: ignore[operator]
            return name
    return OTHER


def perf_areas(data: Path) -> dict[str, int]:
    """Sample counts of a perf.data file by area."""
    out = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,sym", "-n",
                          "--stdio", "-g", "none"], capture_output=True, text=True, check=True).stdout
    got: dict[str, int] = defaultdict(int)
    for line in out.splitlines():
        m = re.match(r"\s*[\d.]+%\s+(\d+)\s+(\S+)\s+\[([k.])\]\s+(.*)$", line)
        if m:
            got[area_of(m.group(2), m.group(4).strip(), m.group(3) == "k")] += int(m.group(1))
    return got


def load(name: str) -> DenseWorkload | RaggedWorkload:
    import bench_store
    return bench_store.workloads()[name]()


# ---- the child: the loaderx writes ----------------------------------------

def child(args: argparse.Namespace) -> int:
    from backends import LoaderxBackend
    w = load(args.workload)
    if args.limit and isinstance(w, DenseWorkload):
        w = DenseWorkload(w.name, w.array[: args.limit], w.description)
    elif args.limit:
        w.offsets = w.offsets[: args.limit + 1]
        w.shapes = w.shapes[: args.limit]
    if isinstance(w, RaggedWorkload):
        w.records()
    be = LoaderxBackend(args.codec)
    if args.dict_file:  # the ceiling's dictionary, so both compress with the same one
        be.dict_bytes = Path(args.dict_file).read_bytes()
    paths = [Path(args.dir) / f"store{k}" for k in range(args.writes)]
    if args.warm:
        be.write(w, paths[0])
        shutil.rmtree(paths[0])
    print("ready", flush=True)
    sys.stdin.readline()
    wall, cpu = [], []
    for path in paths:  # each its own store: removing one is not sampled
        c0, t0 = time.process_time(), time.perf_counter()
        be.write(w, path)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    print(json.dumps({"wall": wall, "cpu": cpu}), flush=True)
    sys.stdin.readline()  # the profile has stopped
    for path in paths:
        shutil.rmtree(path)
    return 0


def child_cmd(workload: str, codec: str, writes: int, d: Path, limit: int = 0) -> list[str]:
    """The child's command line; it compresses with the dictionary ceiling_args left in ``d``."""
    cmd = [sys.executable, __file__, "--child", "--workload", workload, "--codec", codec,
           "--writes", str(writes), "--dir", str(d), "--limit", str(limit)]
    return cmd + (["--dict-file", str(d / "dict")] if (d / "dict").exists() else [])


def run_child(workload: str, codec: str, writes: int, d: Path, perf_out: Path | None) -> dict[str, list[float]]:
    cmd = child_cmd(workload, codec, writes, d)
    if perf_out is not None:
        cmd.append("--warm")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdin is not None and p.stdout is not None
    if p.stdout.readline().strip() != "ready":
        raise SystemExit(f"the profiled child of {workload} {codec} failed")
    perf = None
    if perf_out is not None:
        perf = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", str(FREQ), "-p", str(p.pid),
                                 "-o", str(perf_out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # perf attached to every thread
    p.stdin.write("go\n")
    p.stdin.flush()
    result = json.loads(p.stdout.readline())
    if perf is not None:
        perf.send_signal(signal.SIGINT)
        perf.wait()
    p.stdin.write("done\n")
    p.stdin.close()
    if p.wait() != 0:
        raise SystemExit(f"the profiled child of {workload} {codec} failed")
    return result


# ---- the profiles ----------------------------------------------------------

def ceiling_args(w: DenseWorkload | RaggedWorkload, codec: str, d: Path, limit: int = 0) -> list[str]:
    import ceilings
    from backends import LoaderxBackend
    be = LoaderxBackend(codec)
    be.prepare(w)
    records, ends = ceilings._record_files(w, d, narrow=True)
    if limit:
        e = np.fromfile(ends, dtype="<u8")[:limit]
        e.tofile(ends)
        with open(records, "r+b") as f:
            f.truncate(int(e[-1]))
    args = ["zstd", "--records", str(records), "--ends", str(ends), "--level", str(be.level),
            "--threads", str(os.cpu_count() or 1)]
    if be.dict_bytes is not None:
        (d / "dict").write_bytes(be.dict_bytes)
        args += ["--dict", str(d / "dict")]
    return args


def profile(workload: str, codec: str, writes: int, where: Path) -> dict[str, object]:
    exe = bench_binary("loaderx_write_ceiling")
    with tempfile.TemporaryDirectory(dir=where, prefix=".profile-") as tmp:
        d = Path(tmp)
        args = ceiling_args(load(workload), codec, d)
        ours = run_child(workload, codec, writes, d, d / "ours.data")
        our_areas = perf_areas(d / "ours.data")
        runs: dict[int, dict[str, int]] = {}
        printed: dict[int, dict[str, Any]] = {}
        for r in (1, writes + 1):
            out = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", str(FREQ), "-o",
                                  str(d / f"ceiling{r}.data"), "--", exe, *args, "--repeat", str(r)],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True, text=True)
            runs[r] = perf_areas(d / f"ceiling{r}.data")
            printed[r] = json.loads(out.stdout)
    per = 1e3 / FREQ / writes  # ms of CPU per write, per sample
    alone = {a: max(0, runs[writes + 1].get(a, 0) - runs[1].get(a, 0)) * per for a in COLUMNS}
    m = median_index(ours["wall"])
    alone_wall, alone_cpu = sampled_median(printed[writes + 1], writes)
    return {
        "ours": {a: our_areas.get(a, 0) * per for a in COLUMNS},
        "alone": alone,
        "our_wall_ms": ours["wall"][m] * 1e3, "our_cpu_ms": ours["cpu"][m] * 1e3,
        "alone_wall_ms": alone_wall * 1e3, "alone_cpu_ms": alone_cpu * 1e3,
    }


def sampled_median(printed: dict[str, Any], writes: int) -> tuple[float, float]:
    """Wall and CPU seconds of the median of the last ``writes`` runs ``loaderx_write_ceiling``
    printed (``samples``, ``cpu_samples``): the compressor's runs under perf, after its first
    (warm-up) run, as the write's own figures are its ``writes`` runs under perf after a warm-up."""
    wall, cpu = printed["samples"][-writes:], printed["cpu_samples"][-writes:]
    if len(wall) != writes or len(cpu) != writes:
        raise SystemExit(f"loaderx_write_ceiling printed {len(printed['samples'])} runs, expected {writes + 1}")
    c = median_index(wall)
    return wall[c], cpu[c]


def callgrind_ir(cmd: list[str], d: Path, name: str) -> int:
    """Instructions executed inside ZSTD_compress2 (inclusive) by ``cmd`` under callgrind."""
    out = d / f"{name}.callgrind"
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd],
                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True,
                   input="go\ndone\n", text=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    ann = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)], capture_output=True, text=True,
                         check=True).stdout
    for line in ann.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\([\s\d.]+%\)\s+\S*:ZSTD_compress2 ", line)
        if m:
            return int(m.group(1).replace(",", ""))
    raise SystemExit(f"no ZSTD_compress2 in the callgrind profile of {name}")


def instructions(workload: str, codec: str, records: int, where: Path) -> tuple[int, int]:
    exe = bench_binary("loaderx_write_ceiling")
    with tempfile.TemporaryDirectory(dir=where, prefix=".profile-") as tmp:
        d = Path(tmp)
        args = ceiling_args(load(workload), codec, d, records)
        ours = callgrind_ir(child_cmd(workload, codec, 1, d, records), d, "ours")
        alone = callgrind_ir([exe, *args, "--repeat", "1"], d, "alone")
    return ours, alone


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--codec", help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--limit", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dict-file", help=argparse.SUPPRESS)
    ap.add_argument("--workloads", default="vision-dense,vision-ragged,tokens-dense,tokens-ragged,fmnist")
    ap.add_argument("--codecs", default="zstd,zstd_dict")
    ap.add_argument("--writes", type=int, default=5, help="writes profiled per workload and codec")
    ap.add_argument("--callgrind", action="store_true", help="also count the compressor's instructions")
    ap.add_argument("--callgrind-records", type=int, default=2000)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child(args)
    if shutil.which("perf") is None:
        raise SystemExit("write_profile.py needs perf (Debian: linux-perf)")
    where = DATA / "profile"
    where.mkdir(parents=True, exist_ok=True)
    rows = []
    for wname in args.workloads.split(","):
        for codec in args.codecs.split(","):
            p = profile(wname, codec, args.writes, where)
            ours, alone = p["ours"], p["alone"]
            ir = instructions(wname, codec, args.callgrind_records, where) if args.callgrind else None
            row = [wname, codec, f"{p['our_wall_ms']:.0f} / {p['alone_wall_ms']:.0f}",
                   f"{p['our_cpu_ms']:.0f} / {p['alone_cpu_ms']:.0f}"]
            row += [f"{ours[a]:.1f} / {alone[a]:.1f}" for a in COLUMNS]
            if ir is not None:
                row.append(f"{ir[0] / ir[1]:.4f}")
            rows.append(row)
            print(" | ".join(map(str, row)), flush=True)
    headers = ["workload", "codec", "wall ms: ours / alone", "CPU ms: ours / alone",
               *[f"{a} ms" for a in COLUMNS]]
    if args.callgrind:
        headers.append(f"compressor instructions, first {args.callgrind_records:,} records: ours / alone")
    table = markdown_table(headers, rows)
    print(table)
    if not args.no_doc:
        update_doc_section("write-profile", (
            "### Where a zstd write's CPU goes (bench/write_profile.py)\n\n"
            f"Run: {machine_line()}.\nPer workload and codec, one store write (create, append, durable "
            f"close) against the compressor alone on the same records (`loaderx_write_ceiling zstd`, "
            f"all cores), sampled by `perf record -e cpu-clock` over {args.writes} writes and "
            f"{args.writes} compressor runs, each side after one warm-up run: wall and CPU time of the "
            "median run, both under perf's sampling (the store tables give them unperturbed), then CPU milliseconds per write by "
            "what the code does (zstd's functions; the narrowing pass; the xxhash checksums; the kernel: "
            "page-cache copies, file system, writeback, faults, scheduling; Python; libc; the rest of "
            "the writer, with `Ragged.append`'s per-record checks; anything else, e.g. OpenBLAS "
            "threads). `ours / alone`.\n\n"
            + table + "\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
