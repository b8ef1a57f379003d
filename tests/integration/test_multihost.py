"""Beyond one box: every host runs its own loaderxd over its own copy of the
stores, and ranks find their slice from (rank, world_size) alone.

Two daemons on two sockets stand for two hosts, each with its own copy of
the stores (a copy, not the same files). 2 hosts x 2 ranks: rank r of 4
reads through the daemon of host r // 2; the four slices of every step,
concatenated in rank order, are the global batch of one world-1 loader.
A job saved at step k on 4 ranks resumes on 2 ranks (twice the per-rank
batch, the same global batch) with exactly the same global batches.
docs/guide.md, "Multi-node and model-parallel jobs".
"""

from __future__ import annotations

import shutil

import numpy as np
from conftest import assert_same_batch
from loaderx.client import DaemonOptions
from loaderx.dataloader import DataLoader
from loaderx.zrecord import Dense, Ragged
from loaderx.zsampler import Sampler

GLOBAL_BATCH = 16
SEED = 5


def copy_stores(src, dst) -> dict:
    for name in ("images", "labels", "tokens"):
        shutil.copytree(src / name, dst / name)
    return {"image": Dense.open(str(dst / "images")), "label": Dense.open(str(dst / "labels")),
            "tokens": Ragged.open(str(dst / "tokens"))}


def concat(slices: list[dict]) -> dict:
    out = {}
    for k in slices[0]:
        if isinstance(slices[0][k], list):
            out[k] = [a for s in slices for a in s[k]]
        else:
            out[k] = np.concatenate([s[k] for s in slices])
    return out


def test_two_hosts_two_ranks_form_the_global_batch_and_resume_on_two_ranks(daemon_factory, stores, tmp_path):
    hosts = [daemon_factory(name="host-a.sock"), daemon_factory(name="host-b.sock")]
    copies = []
    for h in ("a", "b"):
        (tmp_path / h).mkdir()
        copies.append(copy_stores(stores["dir"], tmp_path / h))
    mode = Sampler.Mode.Cyclic

    def rank_loader(rank: int, world: int, start: int) -> DataLoader:
        host = rank * len(hosts) // world
        return DataLoader(copies[host], batch_size=GLOBAL_BATCH // world, mode=mode, seed=SEED, rank=rank,
                          world_size=world, start_step=start, daemon=DaemonOptions(hosts[host].socket))

    k = 6
    with DataLoader(stores["streams"], batch_size=GLOBAL_BATCH, mode=mode, seed=SEED) as one:
        ranks = [rank_loader(r, 4, 0) for r in range(4)]
        for _ in range(k):
            assert_same_batch(concat([next(ld) for ld in ranks]), next(one))
        state = ranks[0].state_dict()
        for ld in ranks:
            ld.close()
        # Every host served its own ranks from its own copy.
        assert all(h.stats()["batches_served"] >= 2 * k for h in hosts)
        start = state["step"]
        assert start == k
        resumed = [rank_loader(r, 2, start) for r in range(2)]
        for _ in range(k):
            assert_same_batch(concat([next(ld) for ld in resumed]), next(one))
        for ld in resumed:
            ld.close()
    for c in copies:
        for s in c.values():
            s.close()
