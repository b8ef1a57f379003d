#!/usr/bin/env python3
"""Run the benchmark suite (``make bench``) - benchmark engineer.

Prepares the real data (idempotent), then runs, each in its own interpreter so
one failing benchmark does not hide the others:

* bench/bench_store.py   - store gather/write vs NumPy, lmdb, h5py, Arrow IPC, Parquet, ArrayRecord
* bench/bench_loader.py  - end-to-end loader vs reference wheel, torch, grain, mosaicml-streaming,
  litdata
* bench/bench_sampler.py, bench/bench_daemon.py - owned by the sampler and
  daemon engineers; run with no arguments when present.
* bench/bench_groups.py  - the design card's promise with processes: 4 trainers as
  embedded loaders, one loaderxd broadcast group, torch DataLoaders.
* bench/bench_node_groups.py - one node of a 2-node job: embedded, solo clients, a node group,
  torch, and with tensor-parallel size 2 a node group with replicas against solo clients.
* bench/packing.py       - sequence packing: native packer vs a NumPy packer and Grain's.
* bench/ragged_batch.py  - ragged batches delivered as lists or packed (values + cu_seqlens).

Each writes its tables into docs/benchmarks.md (its own marked section) and
its PNG plots into docs/; the scripts that measure goals also write
bench/results/goals-<section>.json (bench/goals.py). Before a script runs, its
goal file is removed, so a benchmark that fails shows its goals as not
measured; after the scripts, the "goals" block of docs/benchmarks.md is
rewritten from every goal file present. Exit status is non-zero if any
benchmark failed.

Usage: bench/run_all.py [--only store,loader,sampler,daemon,groups,node-groups,packing,ragged] [--skip-setup]
       bench/run_all.py --goals-only [--results DIR] [--doc FILE]   (only the goals block, no benchmark)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
import goals

SUITE = {
    "store": ["bench_store.py"],
    "loader": ["bench_loader.py"],
    "sampler": ["bench_sampler.py"],
    "daemon": ["bench_daemon.py"],
    "groups": ["bench_groups.py"],
    "node-groups": ["bench_node_groups.py"],
    "packing": ["packing.py"],
    "ragged": ["ragged_batch.py"],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(SUITE), help="comma list of " + ",".join(SUITE))
    ap.add_argument("--skip-setup", action="store_true", help="do not run bench/setup.sh")
    ap.add_argument("--goals-only", action="store_true",
                    help="run nothing: rewrite the goals block of the doc from the goal files present")
    ap.add_argument("--results", type=Path, default=goals.RESULTS, help="directory of the goal files")
    ap.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmarks.md", help="the page whose goals block is rewritten")
    args = ap.parse_args()
    if args.goals_only:
        goals.update_doc(args.doc, args.results)
        return 0

    if not args.skip_setup:
        subprocess.run(["bash", str(BENCH / "setup.sh")], check=True, cwd=REPO)
    env = dict(os.environ)
    env["LOADERX_BENCH_RESULTS"] = str(args.results.resolve())
    env["PYTHONPATH"] = str(REPO / "python") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    failed = []
    for name in args.only.split(","):
        if name not in SUITE:
            raise SystemExit(f"unknown benchmark {name!r}; choose from {', '.join(SUITE)}")
        script = BENCH / SUITE[name][0]
        if not script.exists():
            print(f"== {name}: {script.name} not present, skipped")
            continue
        print(f"\n== {name}: {script.name}", flush=True)
        if name in goals.SECTIONS:
            goals.clear_section(name, args.results)
        t0 = time.perf_counter()
        rc = subprocess.run([sys.executable, str(script), *SUITE[name][1:]], cwd=REPO, env=env,
                            check=False).returncode
        print(f"== {name}: exit {rc} after {time.perf_counter() - t0:.0f} s", flush=True)
        if rc:
            failed.append(name)
    goals.update_doc(args.doc, args.results)
    if failed:
        print("failed: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
