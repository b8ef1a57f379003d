"""A client process for the crash and soak matrix (tests/integration/test_reliability.py).

Usage: reliability_client.py SOCKET STORE_DIR SEED SECONDS BEHAVIOUR

BEHAVIOUR ``soak``: for SECONDS, opens loaders through loaderxd with
settings drawn from SEED (batch size, sampler mode, seed, leases; with
LOADERX_SOAK_GROUPS=1 also broadcast groups), takes batches, holds and frees them at random, seeks and
loads state at random, closes and reconnects; every batch is compared with
the embedded loader's batch of the same step (values, dtypes, shapes). Prints
one JSON line ``{"batches": n, "mismatches": m, "opens": k, "seeks": s}``.

BEHAVIOUR ``victim``: opens one loader and loops taking and holding batches
until killed; prints ``ready`` once it holds its first batch (the test kills
it at a random moment, before or after that line).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

from batch_compare import batch_difference
from loaderx.client import DaemonOptions
from loaderx.dataloader import DataLoader
from loaderx.zrecord import Dense, Ragged
from loaderx.zsampler import Sampler

MODES = [Sampler.Mode.Sequential, Sampler.Mode.IID, Sampler.Mode.Cyclic]
GROUPS = os.environ.get("LOADERX_SOAK_GROUPS") == "1"


def open_streams(root: str) -> dict:
    return {"image": Dense.open(f"{root}/images"), "label": Dense.open(f"{root}/labels"),
            "tokens": Ragged.open(f"{root}/tokens")}


def soak(sock: str, root: str, seed: int, seconds: float) -> None:
    rng = random.Random(seed)
    streams = open_streams(root)
    stats = {"batches": 0, "mismatches": 0, "opens": 0, "seeks": 0}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        batch = rng.choice([1, 4, 16])
        mode = rng.choice(MODES)
        lseed = rng.randrange(4)
        leases = rng.randint(1, 3)
        group = {}
        # A broadcast group shared with other soak clients, only on request:
        # members that run at different speeds and hold batches can fill the
        # group's ring (ResourceExhausted at a step; docs/reliability.md).
        if GROUPS and rng.random() < 0.3:
            # Members of one group share its lease count: the ring is sized for it.
            group = {"group": f"b{batch}-{int(mode)}-{lseed}-{leases}", "group_mode": "broadcast", "join": "current"}
        start = rng.randrange(50)
        kw = {"batch_size": batch, "mode": mode, "seed": lseed, "start_step": start}
        stats["opens"] += 1
        with DataLoader(streams, daemon=DaemonOptions(sock, leases=leases, **group), **kw) as remote, \
                DataLoader(streams, **kw) as local:
            if group:  # a broadcast member starts at the group's step
                local.seek(remote.step)
            held: list[dict] = []
            for _ in range(rng.randint(1, 40)):
                r = rng.random()
                if r < 0.1 and not group:
                    step = rng.randrange(200)
                    held.clear()  # a seek may be refused while batches are held in a group
                    remote.seek(step)
                    local.seek(step)
                    stats["seeks"] += 1
                    continue
                got, want = next(remote), next(local)
                stats["batches"] += 1
                stats["mismatches"] += batch_difference(got, want) is not None
                held.append(got)
                del got, want
                # Hold at most leases - 1 between calls (the next call takes one more).
                while len(held) > leases - 1 or (held and rng.random() < 0.5):
                    held.pop(rng.randrange(len(held)))
                if time.monotonic() > deadline:
                    break
            # Sometimes close while still holding a batch, then free it.
            keep = held[:1] if rng.random() < 0.3 else []
            held.clear()
        keep.clear()
    print(json.dumps(stats), flush=True)


def victim(sock: str, root: str, seed: int) -> None:
    rng = random.Random(seed)
    streams = open_streams(root)
    group = {"group": "victims", "group_mode": "broadcast"} if rng.random() < 0.5 else {}
    with DataLoader(streams, batch_size=4, seed=1, daemon=DaemonOptions(sock, leases=3, **group)) as loader:
        held = [next(loader)]
        print("ready", flush=True)
        while True:
            held.append(next(loader))
            if len(held) >= 3:
                held.pop(0)


def main() -> None:
    sock, root, seed, seconds, behaviour = sys.argv[1:]
    if behaviour == "soak":
        soak(sock, root, int(seed), float(seconds))
    elif behaviour == "victim":
        victim(sock, root, int(seed))
    else:
        raise SystemExit(f"unknown behaviour {behaviour}")


if __name__ == "__main__":
    main()
