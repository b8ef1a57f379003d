#!/usr/bin/env python3
"""Ragged token batches of 256: the list form against the packed form (``ragged="packed"``).

Workload: the token corpus of bench/prepare_tokens.py
(``bench/data/tokens_ragged``: int32 records of 16..512 GPT-2 tokens) when it
has been prepared; otherwise a synthetic stand-in, said so in the output:
20,000 int32 records of 16..512 tokens (uniform lengths, seed 0). The
records are written once to a raw (uncompressed) Ragged store under
``bench/data/ragged_batch/``, so the gather is cheap and the form's own
cost shows.

For each form (``list``: 256 ndarrays per batch; ``packed``: one
:class:`loaderx.RaggedBatch`), IID batches of 256, the same seed:

* ``deliver``: ``next(loader)`` only;
* ``varlen``: ``next(loader)`` plus what a variable-length attention step
  takes, one flat int32 token array and int32 ``cu_seqlens``: the list form
  concatenates the records (a copy) and sums their lengths, the packed form
  takes ``.values`` and ``.cu_seqlens`` as they are.

Reported per form and task: batches/s of the loop (wall clock) and the
consumer thread's CPU time per batch (``time.thread_time``: the Python side,
without the native gather threads), best of ``--rounds`` rounds that
alternate the forms; then the list/packed ratios. The first ``CHECK``
batches of both forms are compared exactly before anything is timed.

Usage: bench/ragged_batch.py [--batches 200] [--rounds 3] [--threads N] [--daemon SOCKET]

Nothing is written to docs/: the figures are run on a quiet machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from benchlib import DATA, load_ragged, machine_line, markdown_table, update_doc_section

BATCH = 256
CHECK = 3
WARMUP = 5
SEED = 7
SYNTHETIC_N = 20_000


def records() -> tuple[list[np.ndarray], str]:
    """The token records and a line naming where they come from."""
    try:
        w = load_ragged("tokens-ragged", "tokens_ragged", "")
    except FileNotFoundError:
        rng = np.random.default_rng(0)
        lengths = rng.integers(16, 513, size=SYNTHETIC_N)
        recs = [rng.integers(0, 50257, size=int(n), dtype=np.int32) for n in lengths]
        return recs, (f"synthetic stand-in ({SYNTHETIC_N} int32 records of 16..512 tokens, "
                      "seed 0): bench/data/tokens_ragged is not prepared "
                      "(bench/prepare_tokens.py)")
    origin = f"the token corpus bench/data/tokens_ragged ({w.n} records)"
    return [np.asarray(r) for r in w.records()], origin


def store(recs: list[np.ndarray], tag: str) -> Path:
    """A raw Ragged store of ``recs`` under bench/data/ragged_batch/<tag> (written once)."""
    from loaderx.zrecord import Ragged

    path = DATA / "ragged_batch" / tag
    if not path.exists():  # a store is published whole by close()
        path.parent.mkdir(parents=True, exist_ok=True)
        with Ragged.create(str(path), np.int32, ndim=1, codec="raw") as rs:
            rs.append(recs)
    return path


def varlen_list(tokens: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    cu = np.zeros(len(tokens) + 1, dtype=np.int32)
    np.cumsum([len(t) for t in tokens], out=cu[1:])
    return np.concatenate(tokens), cu


def varlen_packed(tokens: Any) -> tuple[np.ndarray, np.ndarray]:
    return tokens.values, tokens.cu_seqlens


def run(path: Path, form: str, task: str, batches: int, threads: int | None,
        daemon: str | None) -> tuple[float, float]:
    """(batches/s, consumer CPU µs per batch) of one timed loop."""
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Ragged

    kw: dict[str, Any] = {"ragged": form, "mode": "IID", "seed": SEED, "batch_size": BATCH}
    if threads is not None:
        kw["num_threads"] = threads
    if daemon is not None:
        kw["daemon"] = daemon
    convert: Callable[[Any], Any] | None = None
    if task == "varlen":
        convert = varlen_list if form == "list" else varlen_packed
    with Ragged.open(str(path)) as tokens, DataLoader({"tokens": tokens}, **kw) as loader:
        for _ in range(WARMUP):
            next(loader)
        cpu0, t0 = time.thread_time(), time.perf_counter()
        for _ in range(batches):
            b = next(loader)["tokens"]
            if convert is not None:
                convert(b)
        wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    return batches / wall, cpu / batches * 1e6


def check(path: Path, daemon: str | None) -> None:
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Ragged

    kw: dict[str, Any] = {"mode": "IID", "seed": SEED, "batch_size": BATCH, "daemon": daemon}
    with Ragged.open(str(path)) as tokens, DataLoader({"tokens": tokens}, **kw) as a, \
            DataLoader({"tokens": tokens}, ragged="packed", **kw) as b:
        for _ in range(CHECK):
            listed, packed = next(a)["tokens"], next(b)["tokens"]
            flat, cu = varlen_list(listed)
            same = flat.tobytes() == packed.values.tobytes()
            if not same or cu.tolist() != packed.cu_seqlens.tolist():
                raise SystemExit("the packed batch differs from the list form")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--daemon", default=None, help="a loaderxd socket (default: embedded)")
    ap.add_argument("--no-doc", action="store_true", help="do not update docs/benchmarks.md")
    args = ap.parse_args()

    recs, origin = records()
    path = store(recs, "corpus" if origin.startswith("the token") else "synthetic")
    del recs
    check(path, args.daemon)
    best: dict[tuple[str, str], tuple[float, float]] = {}
    for _ in range(args.rounds):
        for task in ("deliver", "varlen"):
            for form in ("list", "packed"):
                rate, cpu = run(path, form, task, args.batches, args.threads, args.daemon)
                old = best.get((form, task))
                best[(form, task)] = (max(rate, old[0]), min(cpu, old[1])) if old else (rate, cpu)
    print(f"# {machine_line()}")
    print(f"# records: {origin}")
    print(f"# batch {BATCH}, IID, {args.batches} batches x best of {args.rounds} rounds, "
          f"{'loaderxd ' + args.daemon if args.daemon else 'embedded'}")
    rows = []
    for task in ("deliver", "varlen"):
        (lr, lc), (pr, pc) = best[("list", task)], best[("packed", task)]
        rows.append([task, f"{lr:.0f}", f"{pr:.0f}", f"{pr / lr:.2f}x", f"{lc:.0f}", f"{pc:.0f}",
                     f"{lc / pc:.1f}x"])
    table = markdown_table(["task", "list batches/s", "packed batches/s", "packed/list",
                            "list CPU µs/batch", "packed CPU µs/batch", "list/packed CPU"], rows)
    print(table)
    if not args.no_doc and args.daemon is None:
        update_doc_section("ragged-batch", (
            f"### Ragged batches: list or packed (bench/ragged_batch.py)\n\nRun: {machine_line()}.\n"
            f"Records: {origin}; IID batches of {BATCH}, {args.batches} batches, best of {args.rounds} "
            "rounds, embedded. `deliver`: the batch reaches the training loop; `varlen`: the loop also "
            "builds what a variable-length attention kernel takes (one flat token array and int32 "
            "`cu_seqlens`): from the list form with NumPy, from `ragged=\"packed\"` as the views it "
            "already has. CPU is the consumer thread's.\n\n" + table + "\n"))


if __name__ == "__main__":
    main()
