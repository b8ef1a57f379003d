"""Data-parallel training with torchrun, fed by loaderx: embedded or through loaderxd.

    torchrun --nproc_per_node 2 examples/ddp_torchrun.py --root /tmp/fmnist --steps 200
    torchrun --nproc_per_node 2 examples/ddp_torchrun.py --root /tmp/fmnist --steps 200 \\
        --daemon /run/loaderx/loaderxd.sock

Rank and world size come from torch.distributed (torchrun sets RANK and
WORLD_SIZE); there is no coordinator. Each rank draws its own ``batch_size``
rows of one global batch of ``batch_size * world_size`` (the sampler's
sharding), so the global order is the same for any world size. With
``--daemon`` the ranks of this host join one loaderxd **shard group**: the
global batch is gathered once and each rank maps its slice, zero-copy.
``--check`` compares every batch with an embedded loader of the same rank
and fails on any difference. CPU only (gloo). docs/guide.md, "Multi-node and model-parallel jobs".
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
except ModuleNotFoundError:
    print("torch is not installed; skipping this example (pip install torch)")
    sys.exit(0)

import numpy as np
from fmnist_stores import build_stores, open_split
from loaderx.client import DaemonOptions
from loaderx.dataloader import DataLoader
from loaderx.torch import to_torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="fmnist-stores")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N records")
    ap.add_argument("--daemon", default=None, help="loaderxd socket: share one shard group")
    ap.add_argument("--group", default="ddp-fmnist", help="shard group name (with --daemon)")
    ap.add_argument("--check", action="store_true", help="compare every batch with the embedded loader")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        build_stores(args.root, args.limit)
    dist.barrier()  # the stores exist before any rank opens them
    streams = open_split(args.root, "train")
    kw = {"batch_size": args.batch_size, "mode": "Cyclic", "seed": 7, "rank": rank, "world_size": world}
    daemon = DaemonOptions(args.daemon, group=args.group, group_mode="shard") if args.daemon else None
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mismatches = 0
    with DataLoader(streams, daemon=daemon, **kw) as loader, \
            DataLoader(streams, **kw) as reference:
        for step in range(args.steps):
            batch = next(loader)
            if args.check:
                want = next(reference)
                mismatches += not all(np.array_equal(batch[k], want[k]) for k in want)
            t = to_torch(batch)
            x = t["image"].float().div_(255.0)
            loss = nn.functional.cross_entropy(model(x), t["label"].long())
            opt.zero_grad()
            loss.backward()
            opt.step()
            if rank == 0 and (step + 1) % max(1, args.steps // 4) == 0:
                print(f"step {step + 1}: loss {loss.item():.4f}", flush=True)
    for s in streams.values():
        s.close()
    # Each rank reports its own count, and torchrun fails the job if any rank
    # exits non-zero.
    source = f"loaderxd shard group '{args.group}'" if args.daemon else "embedded"
    # One write per line, so the two ranks' lines never interleave in a pipe.
    sys.stdout.write(f"ddp rank {rank} of {world}: {args.steps} steps from {source}, "
                     f"batch mismatches {mismatches}\n")
    sys.stdout.flush()
    dist.destroy_process_group()
    return 1 if mismatches else 0


if __name__ == "__main__":
    code = main()
    # End the process without finalizing the interpreter. With torch 2.13,
    # every backward pass stashes a Python object in the collectives it starts
    # (DDP's gradient all-reduces), and a gloo worker thread releases the last
    # of them some time after the wait for it returned; if the interpreter is
    # finalizing by then, that thread cannot take the GIL and the process
    # aborts ("terminate called without an active exception", seen about once
    # in 30 runs on a loaded machine). destroy_process_group() does not join
    # those threads: DDP keeps the group alive. The loaders are closed above.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
