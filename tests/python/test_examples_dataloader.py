"""The training examples: an interrupted run resumed from its checkpoint sees
exactly the batches of an uninterrupted run, so their losses are identical."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from loaderx.idx import FASHION_MNIST_ROOT

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "python")}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (FASHION_MNIST_ROOT / "train-labels-idx1-ubyte.gz").exists(),
        reason="Debian dataset-fashion-mnist is not installed",
    ),
]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fmnist")


def _run(script: str, root: Path, ckpt: Path, *extra: str) -> list[str]:
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / script),
            "--root",
            str(root),
            "--limit",
            "1500",
            "--steps",
            "40",
            "--ckpt-every",
            "20",
            "--batch-size",
            "64",
            "--ckpt",
            str(ckpt),
            *extra,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize(
    ("script", "framework"),
    [("train_torch_fmnist.py", "torch"), ("train_jax_fmnist.py", "jax")],
)
def test_interrupted_and_resumed_training_matches_the_uninterrupted_run(
    root: Path, tmp_path: Path, script: str, framework: str
) -> None:
    if framework == "torch" and importlib.util.find_spec("torch") is None:
        out = _run(script, root, tmp_path / "c")
        assert out == ["torch is not installed; skipping this example (pip install torch)"]
        return
    full = _run(script, root, tmp_path / "full")
    if framework == "jax":
        have_jax = importlib.util.find_spec("jax") is not None
        # CI installs the CPU jax wheel (requirements-dev.txt): there the real JAX path must run.
        assert have_jax or not os.environ.get("CI"), "CI must have jax"
        if have_jax:  # the CPU wheel: jit-compiled steps, device_put to the CPU device
            assert full[0].startswith("using jax ") and full[0].endswith(" on cpu")
        else:
            assert full[0].startswith("jax is not installed")
    first = _run(script, root, tmp_path / "ckpt", "--stop-at", "20")
    second = _run(script, root, tmp_path / "ckpt", "--resume")
    losses = [line for line in full if line.startswith("step ")]
    assert len(losses) == 4
    assert "stopping at step 20 (simulated crash)" in first
    assert [line for line in first if line.startswith("step ")] == losses[:2]
    assert "resumed at step 20" in second
    assert [line for line in second if line.startswith("step ")] == losses[2:]
    assert full[-1].startswith("test accuracy") and full[-1] == second[-1]
