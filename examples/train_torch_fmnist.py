"""PyTorch training loop on Fashion-MNIST fed by loaderx, with checkpoint and resume.

    python examples/train_torch_fmnist.py --root /tmp/fmnist --steps 600
    python examples/train_torch_fmnist.py --root /tmp/fmnist --steps 600 --stop-at 300
    python examples/train_torch_fmnist.py --root /tmp/fmnist --steps 600 --resume

A checkpoint holds the model, the optimizer and ``loader.state_dict()`` (just
the next step plus what identifies the sample order), so a resumed run sees
exactly the batches the uninterrupted run would have seen: its losses from the
resumed step on are identical. ``--stop-at`` simulates a crash after a
checkpoint. Runs on the CPU; exits cleanly with a message if torch is absent.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import torch
    from torch import nn
except ModuleNotFoundError:
    print("torch is not installed; skipping this example (pip install torch)")
    sys.exit(0)

from fmnist_stores import build_stores, open_split, training_args
from loaderx.dataloader import DataLoader
from loaderx.torch import to_torch


def to_inputs(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Collate (runs in the loader's transform threads): uint8 (B,28,28) -> float (B,1,28,28)."""
    t = to_torch(batch)  # zero-copy views of the batch memory
    x = t["image"].unsqueeze(1).float().div_(255.0)
    return x, t["label"].long()


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 10),
    )


def evaluate(model: nn.Module, root: Path) -> float:
    streams = open_split(root, "test")
    n = len(streams["label"])
    batch = 500
    correct = 0
    # Sequential over the test split: steps 0..n/batch-1 cover it exactly once.
    with torch.no_grad(), DataLoader(streams, batch_size=batch, transform=to_inputs, mode="Sequential") as loader:
        for _ in range(n // batch):
            x, y = next(loader)
            correct += int((model(x).argmax(1) == y).sum())
    for s in streams.values():
        s.close()
    return correct / (n // batch * batch)


def main() -> None:
    args = training_args(__doc__.splitlines()[0], "checkpoint file (default ROOT/torch.ckpt)")

    torch.manual_seed(0)
    torch.set_num_threads(1)  # bit-reproducible CPU math, so resumed losses match exactly
    root = build_stores(args.root, args.limit)
    ckpt = Path(args.ckpt or root / "torch.ckpt")
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    streams = open_split(root, "train")
    loader = DataLoader(streams, batch_size=args.batch_size, transform=to_inputs, mode="Cyclic", seed=7)
    if args.resume:
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        loader.load_state_dict(state["loader"])
        print(f"resumed at step {loader.step}")
    loss_fn = nn.CrossEntropyLoss()
    try:
        while loader.step < args.steps:
            step = loader.step
            x, y = next(loader)
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if (step + 1) % 10 == 0:
                print(f"step {step + 1} loss {loss.item():.6f}", flush=True)
            if (step + 1) % args.ckpt_every == 0:
                # loader.step is now step + 1: the batch a resumed run starts with.
                torch.save(
                    {
                        "model": model.state_dict(),
                        "optim": opt.state_dict(),
                        "loader": loader.state_dict(),
                    },
                    ckpt,
                )
            if args.stop_at is not None and step + 1 >= args.stop_at:
                print(f"stopping at step {step + 1} (simulated crash)")
                return
    finally:
        loader.close()
        for s in streams.values():
            s.close()
    print(f"test accuracy {evaluate(model, root):.4f}")


if __name__ == "__main__":
    main()
