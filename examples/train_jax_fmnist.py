"""JAX/Flax-style training loop on Fashion-MNIST fed by loaderx, with checkpoint and resume.

    python examples/train_jax_fmnist.py --root /tmp/fmnist --steps 600
    python examples/train_jax_fmnist.py --root /tmp/fmnist --steps 600 --stop-at 300
    python examples/train_jax_fmnist.py --root /tmp/fmnist --steps 600 --resume

The style of a Flax training loop: parameters are a pytree (a dict of arrays),
``train_step(params, x, y) -> (params, loss)`` is a pure function (jit-compiled
under JAX), and the loader's ``transform`` puts each batch on the device with
``jax.device_put``. The checkpoint is the parameters (``.npz``) plus
``loader.state_dict()`` (JSON), written together; a resumed run continues with
exactly the batches the uninterrupted run would have seen.

If JAX is not installed the example says so and runs the same pure step with
NumPy (the model's gradients are written out by hand, so no autodiff is
needed), which still exercises the loader, checkpoint and resume.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

# One BLAS thread: bit-reproducible CPU math, so a resumed run's losses match
# the uninterrupted run's exactly (set before NumPy loads its BLAS).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fmnist_stores import build_stores, open_split, training_args
from loaderx.dataloader import DataLoader

try:
    import jax
    import jax.numpy as xp

    HAVE_JAX = True
except ModuleNotFoundError:
    jax = None
    xp = np
    HAVE_JAX = False

HIDDEN = 128
LR = 0.1


def init_params(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "w1": (rng.standard_normal((784, HIDDEN)) * np.sqrt(2 / 784)).astype(np.float32),
        "b1": np.zeros(HIDDEN, np.float32),
        "w2": (rng.standard_normal((HIDDEN, 10)) * np.sqrt(1 / HIDDEN)).astype(np.float32),
        "b2": np.zeros(10, np.float32),
    }


def train_step(params: dict[str, Any], x: Any, y: Any) -> tuple[dict[str, Any], Any]:
    """One SGD step of a 784-128-10 MLP with softmax cross-entropy (pure function)."""
    h_pre = x @ params["w1"] + params["b1"]
    h = xp.maximum(h_pre, 0.0)
    logits = h @ params["w2"] + params["b2"]
    logits = logits - logits.max(axis=1, keepdims=True)
    p = xp.exp(logits)
    p = p / p.sum(axis=1, keepdims=True)
    onehot = (y[:, None] == xp.arange(10)[None, :]).astype(xp.float32)
    loss = -(onehot * xp.log(p + 1e-9)).sum(axis=1).mean()
    g_logits = (p - onehot) / x.shape[0]
    g_h = (g_logits @ params["w2"].T) * (h_pre > 0)
    grads = {
        "w1": x.T @ g_h,
        "b1": g_h.sum(axis=0),
        "w2": h.T @ g_logits,
        "b2": g_logits.sum(axis=0),
    }
    return {k: params[k] - LR * grads[k] for k in params}, loss


if HAVE_JAX:
    train_step = jax.jit(train_step)


def to_device(batch: dict[str, np.ndarray]) -> tuple[Any, Any]:
    """The loader transform: flatten, scale, and place on the default device."""
    x = batch["image"].reshape(len(batch["image"]), 784).astype(np.float32) / 255.0
    y = batch["label"].astype(np.int32)
    if HAVE_JAX:
        return jax.device_put(x), jax.device_put(y)
    return x, y


def save_checkpoint(path: Path, params: dict[str, Any], loader: DataLoader) -> None:
    """Parameters and loader state, published together with one atomic rename."""
    tmp = path.with_suffix(".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    np.savez(tmp / "params.npz", **{k: np.asarray(v) for k, v in params.items()})
    (tmp / "loader.json").write_text(json.dumps(loader.state_dict()))
    if path.exists():
        old = path.with_suffix(".old")
        os.rename(path, old)
        os.rename(tmp, path)
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    else:
        os.rename(tmp, path)


def main() -> None:
    args = training_args(__doc__.splitlines()[0], "checkpoint dir (default ROOT/jax.ckpt)")

    if HAVE_JAX:
        print(f"using jax {jax.__version__} on {jax.devices()[0].platform}")
    else:
        print("jax is not installed: running the same functional step with NumPy")
    root = build_stores(args.root, args.limit)
    ckpt = Path(args.ckpt or root / "jax.ckpt")
    params = init_params(0)
    streams = open_split(root, "train")
    # One batch of prefetch: while the step runs, the loader gathers the next
    # batch and one transform thread puts it on the device.
    loader = DataLoader(streams, batch_size=args.batch_size, transform=to_device, mode="Cyclic",
                        seed=7, prefetch=1, transform_threads=1)
    if args.resume:
        with np.load(ckpt / "params.npz") as saved:
            params = {k: saved[k] for k in saved.files}
        loader.load_state_dict(json.loads((ckpt / "loader.json").read_text()))
        print(f"resumed at step {loader.step}")
    try:
        while loader.step < args.steps:
            step = loader.step
            x, y = next(loader)
            params, loss = train_step(params, x, y)
            if (step + 1) % 10 == 0:
                print(f"step {step + 1} loss {float(loss):.6f}", flush=True)
            if (step + 1) % args.ckpt_every == 0:
                save_checkpoint(ckpt, params, loader)
            if args.stop_at is not None and step + 1 >= args.stop_at:
                print(f"stopping at step {step + 1} (simulated crash)")
                return
    finally:
        loader.close()
        for s in streams.values():
            s.close()

    test = open_split(root, "test")
    n = len(test["label"]) // 500 * 500
    with DataLoader(test, batch_size=500, transform=to_device, mode="Sequential") as loader:
        correct = 0
        for _ in range(n // 500):
            x, y = next(loader)
            h = xp.maximum(x @ params["w1"] + params["b1"], 0.0)
            correct += int(((h @ params["w2"] + params["b2"]).argmax(axis=1) == y).sum())
    for s in test.values():
        s.close()
    print(f"test accuracy {correct / n:.4f}")


if __name__ == "__main__":
    main()
