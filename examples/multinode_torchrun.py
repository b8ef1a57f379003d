"""A multi-node (and model-parallel) job fed by one loaderxd node group per node.

Run one torchrun agent per node; each node runs its own loaderxd over its own
copy of the stores (``LOADERXD_SOCKET`` and ``--stores`` per node):

    torchrun --nnodes 2 --node_rank N --nproc_per_node 2 --rdzv_backend c10d \\
        --rdzv_endpoint HOST:29400 --rdzv_id job17 \\
        examples/multinode_torchrun.py --stores /data/tokens --steps 100 [--mp 2]

Every process reads its layout from torchrun (``loaderx.distributed``): its
loader has ``rank = RANK // mp`` and ``world_size = WORLD_SIZE // mp``, and
the processes of one node share a node group (one gather of the node's rows
per step; the ``mp`` model-parallel ranks of a replica map the same slot).
Checkpoints: global rank 0 writes the loader's state every ``--ckpt-every``
steps to ``ckpt.json`` in the ``--out`` directory; a job started again (after
a crash, or on another node count with the same global batch) resumes there.
Each process writes what it received there too (``rank<RANK>.npz``) so a test
can compare it with the embedded loader. CPU only (gloo).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

try:
    import torch.distributed as dist
except ModuleNotFoundError:
    print("torch is not installed; skipping this example (pip install torch)")
    sys.exit(0)

import numpy as np
from loaderx.distributed import layout, node_loader
from loaderx.zrecord import Dense


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stores", required=True, help="this node's copy of the stores (labels, images)")
    ap.add_argument("--steps", type=int, default=20, help="run until this global step")
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--mp", type=int, default=1, help="model-parallel (tensor-parallel) size")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ckpt-every", type=int, default=4)
    ap.add_argument("--die-at", type=int, default=-1,
                    help="global rank 1 exits at this step (a crash to restart from)")
    ap.add_argument("--collective-timeout", type=float, default=1800.0,
                    help="seconds a barrier waits for a dead peer before the job fails")
    args = ap.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.collective_timeout))
    lay = layout(model_parallel_size=args.mp)
    out = Path(args.out)
    ckpt = out / "ckpt.json"
    start = json.loads(ckpt.read_text())["step"] if ckpt.exists() else 0
    streams = {"label": Dense.open(os.path.join(args.stores, "labels")),
               "image": Dense.open(os.path.join(args.stores, "images"))}
    batch = args.global_batch // lay.dp_world_size
    got = {"label": [], "image": [], "steps": []}
    with node_loader(streams, batch, layout=lay, mode="Cyclic", seed=3, start_step=start) as loader:
        for step in range(start, args.steps):
            if lay.rank == 1 and step == args.die_at:
                os._exit(3)  # a crash: its peers fail at the next collective
            b = next(loader)
            got["label"].append(b["label"].copy())
            got["image"].append(b["image"].copy())
            got["steps"].append(step)
            dist.barrier()  # the model's collective: every rank is at this step
            if lay.rank == 0 and (step + 1) % args.ckpt_every == 0:
                tmp = out / "ckpt.json.tmp"
                tmp.write_text(json.dumps(loader.state_dict()))
                tmp.replace(ckpt)
    np.savez(out / f"rank{lay.rank}.npz", label=np.array(got["label"]),
             image=np.array(got["image"]), steps=np.array(got["steps"]), dp_rank=lay.dp_rank,
             dp_world=lay.dp_world_size, world=lay.world_size)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
