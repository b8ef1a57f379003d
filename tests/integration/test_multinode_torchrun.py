"""A real multi-node job on one box: two torchrun agents (c10d rendezvous on
127.0.0.1) stand for two nodes, each with its own loaderxd on its own socket
over its own copy of the stores, each node's processes sharing one node
group (examples/multinode_torchrun.py). Every rank's batches are checked
against the embedded loader of its data-parallel rank; a rank is killed
mid-run (the job fails) and a new job starts from its checkpoint on the same
two nodes; the job then resumes on one node of two processes, and on two nodes of one
process each, with the same global batches. With model-parallel size 2 the two
model-parallel ranks of a replica get byte-identical batches.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT
from loaderx.dataloader import DataLoader
from loaderx.zrecord import Dense

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")

EXAMPLE = ROOT / "examples" / "multinode_torchrun.py"
GLOBAL_BATCH = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_stores(root: Path) -> None:
    n = 150
    rng = np.random.default_rng(1)
    with Dense.create(str(root / "labels"), np.int64, (), codec="raw") as w:
        w.append(np.arange(n, dtype=np.int64) * 7)
    with Dense.create(str(root / "images"), np.uint8, (4, 4), codec="zstd") as w:
        w.append(rng.integers(0, 255, (n, 4, 4), dtype=np.uint8))


def torchrun(nodes: int, per_node: int, sockets: list[str], stores: list[Path], out: Path, *extra: str,
             fails: bool = False) -> None:
    port = free_port()
    procs = []
    for node in range(nodes):
        env = dict(os.environ, LOADERXD_SOCKET=sockets[node], PYTHONPATH=str(ROOT / "python"),
                   OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc-per-node",
               str(per_node), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-id", f"job-{out.name}", "--max-restarts", "0", "--monitor-interval", "0.5",
               str(EXAMPLE), "--stores", str(stores[node]), "--out", str(out), *extra]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for p, log in zip(procs, logs):
        assert (p.returncode != 0) == fails, log[-4000:]


def results(out: Path, world: int) -> dict[int, dict]:
    got = {}
    for r in range(world):
        got[r] = dict(np.load(out / f"rank{r}.npz"))
    return got


def check_against_embedded(stores_dir: Path, got: dict[int, dict]) -> None:
    streams = {"label": Dense.open(str(stores_dir / "labels")), "image": Dense.open(str(stores_dir / "images"))}
    for r, res in got.items():
        dp_rank, dp_world = int(res["dp_rank"]), int(res["dp_world"])
        steps = res["steps"].tolist()
        assert steps == list(range(steps[0], steps[0] + len(steps))), (r, steps)
        with DataLoader(streams, batch_size=GLOBAL_BATCH // dp_world, mode="Cyclic", seed=3, rank=dp_rank,
                        world_size=dp_world, start_step=steps[0]) as ref:
            for i, step in enumerate(steps):
                want = next(ref)
                np.testing.assert_array_equal(res["label"][i], want["label"], err_msg=f"rank {r} step {step}")
                np.testing.assert_array_equal(res["image"][i], want["image"], err_msg=f"rank {r} step {step}")


@pytest.mark.parametrize("mp", [1, 2])
def test_two_nodes_with_node_groups_survive_a_killed_rank_and_resume_on_one_node(
    daemon_factory, tmp_path: Path, mp: int
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    make_stores(data)
    copies = []
    for node in ("a", "b"):
        shutil.copytree(data, tmp_path / node)
        copies.append(tmp_path / node)
    daemons = [daemon_factory("--max-skew", "4", name=f"node-{node}.sock") for node in ("a", "b")]
    sockets = [d.socket for d in daemons]

    # 2 nodes x 2 processes; global rank 1 dies at step 7 and the job fails
    # (its peers' next collective times out); started again, it resumes from
    # the step-4 checkpoint through new node groups and runs to step 10.
    out = tmp_path / "run1"
    out.mkdir()
    torchrun(2, 2, sockets, copies, out, "--steps", "10", "--mp", str(mp), "--die-at", "7",
             "--collective-timeout", "15", fails=True)
    assert not list(out.glob("rank*.npz"))
    torchrun(2, 2, sockets, copies, out, "--steps", "10", "--mp", str(mp))
    got = results(out, 4)
    for r in range(4):
        assert int(got[r]["dp_world"]) == 4 // mp and int(got[r]["dp_rank"]) == r // mp
        assert got[r]["steps"][0] == 4  # from the checkpoint
    check_against_embedded(data, got)
    if mp == 2:  # the two model-parallel ranks of each replica: byte-identical
        for a, b in ((0, 1), (2, 3)):
            assert got[a]["label"].tobytes() == got[b]["label"].tobytes()
            assert got[a]["image"].tobytes() == got[b]["image"].tobytes()

    # The same job resumed on one node of two processes: the same global
    # batch, so the global batches go on exactly (checked against embedded
    # loaders of the new world).
    out2 = tmp_path / "run2"
    out2.mkdir()
    shutil.copy(out / "ckpt.json", out2 / "ckpt.json")
    torchrun(1, 2, sockets[:1], copies[:1], out2, "--steps", "14", "--mp", "1")
    got2 = results(out2, 2)
    assert all(res["steps"][0] == 8 for res in got2.values())  # the last checkpoint of run 1
    check_against_embedded(data, got2)
    if mp == 1:  # ...and on two nodes of one process each
        out3 = tmp_path / "run3"
        out3.mkdir()
        shutil.copy(out / "ckpt.json", out3 / "ckpt.json")
        torchrun(2, 1, sockets, copies, out3, "--steps", "12", "--mp", "1")
        got3 = results(out3, 2)
        assert all(res["steps"][0] == 8 for res in got3.values())
        check_against_embedded(data, got3)
