"""A hyperparameter sweep of N trainer processes fed by ONE loader (a loaderxd broadcast group).

    python examples/broadcast_sweep.py --root /tmp/fmnist --daemon /run/loaderx/loaderxd.sock \\
        --lrs 0.3 0.1 0.03 0.01 --steps 300

Every trainer joins the broadcast group ``--group`` where it stands: loaderxd
gathers and decodes each batch once and every trainer maps the same
memory, so N trainings cost about one loader's CPU and memory
(docs/benchmarks.md, "loaderxd groups with processes"). Trainers differ only in their learning
rate; each prints its final loss. ``--check`` compares every batch a trainer
receives with an embedded loader's batch of the same step and fails on any
difference. Runs on the CPU with NumPy only (softmax regression).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from fmnist_stores import build_stores, open_split
from loaderx.client import DaemonOptions
from loaderx.dataloader import DataLoader


def train(args: argparse.Namespace, lr: float) -> int:
    streams = open_split(args.root, "train")
    kw = {"batch_size": args.batch_size, "mode": "Cyclic", "seed": 11}
    # join="current" (the broadcast default): a trainer that starts late
    # joins at the group's oldest held step instead of forcing a re-read.
    group = DaemonOptions(args.daemon, group=args.group, group_mode="broadcast")
    w = np.zeros((28 * 28, 10), dtype=np.float32)
    mismatches = 0
    loss = float("nan")
    with DataLoader(streams, daemon=group, **kw) as loader, DataLoader(streams, **kw) as reference:
        reference.seek(loader.step)  # where this member joined
        for _ in range(args.steps):
            batch = next(loader)
            if args.check:
                want = next(reference)
                mismatches += not all(np.array_equal(batch[k], want[k]) for k in want)
            x = batch["image"].reshape(len(batch["label"]), -1).astype(np.float32) / 255.0
            y = batch["label"].astype(np.int64)
            logits = x @ w
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            loss = float(-np.log(p[np.arange(len(y)), y] + 1e-9).mean())
            p[np.arange(len(y)), y] -= 1.0
            w -= lr * (x.T @ p) / len(y)
            del batch
    for s in streams.values():
        s.close()
    print(f"trainer lr={lr}: final loss {loss:.4f}, batch mismatches {mismatches}", flush=True)
    return 1 if mismatches else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="fmnist-stores")
    ap.add_argument("--daemon", required=True, help="loaderxd socket")
    ap.add_argument("--group", default="sweep-fmnist")
    ap.add_argument("--lrs", type=float, nargs="+", default=[0.3, 0.1, 0.03, 0.01])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--limit", type=int, default=None, help="use only the first N records")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--trainer", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trainer is not None:
        return train(args, args.trainer)
    build_stores(args.root, args.limit)
    base = [sys.executable, __file__, "--root", args.root, "--daemon", args.daemon, "--group", args.group,
            "--steps", str(args.steps), "--batch-size", str(args.batch_size)]
    if args.check:
        base.append("--check")
    procs = [subprocess.Popen([*base, "--trainer", str(lr)]) for lr in args.lrs]
    codes = [p.wait() for p in procs]
    print(f"sweep: {len(procs)} trainers, exit codes {codes}")
    return 0 if not any(codes) else 1


if __name__ == "__main__":
    sys.exit(main())
