"""The daemon recipes of examples/ run at small size against a real loaderxd.

Each recipe checks every batch it trains on against the embedded loader of
the same step (``--check``) and exits non-zero on a difference.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run(args: list[str], timeout: float = 300) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python"), *sys.path]))
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_broadcast_sweep_trainers_share_one_group_and_get_the_embedded_batches(daemon, tmp_path) -> None:
    out = run([sys.executable, str(EXAMPLES / "broadcast_sweep.py"), "--root", str(tmp_path / "fm"),
               "--daemon", daemon.socket, "--steps", "25", "--batch-size", "64", "--limit", "2000",
               "--lrs", "0.3", "0.1", "0.03", "--check"])
    lines = [ln for ln in out.splitlines() if ln.startswith("trainer ")]
    assert len(lines) == 3 and all(ln.endswith("batch mismatches 0") for ln in lines), out
    assert "sweep: 3 trainers, exit codes [0, 0, 0]" in out
    # The trainers of a sweep differ only in their learning rate, so their losses differ.
    losses = {ln.split("final loss ")[1].split(",")[0] for ln in lines}
    assert len(losses) == 3, lines


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
@pytest.mark.parametrize("through_daemon", [False, True])
def test_ddp_torchrun_two_ranks_embedded_or_one_shard_group(daemon, tmp_path, through_daemon: bool) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(EXAMPLES / "ddp_torchrun.py"), "--root", str(tmp_path / "fm"), "--steps", "12",
           "--batch-size", "32", "--limit", "2000", "--check"]
    if through_daemon:
        cmd += ["--daemon", daemon.socket]
    out = run(cmd)
    source = "loaderxd shard group 'ddp-fmnist'" if through_daemon else "embedded"
    for rank in (0, 1):
        assert f"ddp rank {rank} of 2: 12 steps from {source}, batch mismatches 0" in out, out
