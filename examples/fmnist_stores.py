"""Fashion-MNIST as Zrecord stores and the command line, shared by the training examples.

Reads Debian's ``dataset-fashion-mnist`` idx files (``loaderx.idx``) and
writes, once, under ``root``::

    root/train/image  Dense uint8 (28, 28)   60,000 records, zstd
    root/train/label  Dense uint8 ()         60,000 records, zstd
    root/test/image   Dense uint8 (28, 28)   10,000 records, zstd
    root/test/label   Dense uint8 ()         10,000 records, zstd
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
from loaderx.idx import fashion_mnist
from loaderx.zrecord import Dense


def build_stores(root: str | os.PathLike[str], limit: int | None = None) -> Path:
    """Writes the four stores under ``root`` unless they exist; returns ``root``.

    ``limit`` keeps only the first ``limit`` records of each split (quick runs).
    """
    base = Path(root)
    for split in ("train", "test"):
        if (base / split / "label").exists():
            continue
        images, labels = fashion_mnist(split)
        if limit is not None:
            images, labels = images[:limit], labels[:limit]
        with Dense.create(str(base / split / "image"), np.uint8, (28, 28), codec="zstd") as ds:
            ds.append(np.ascontiguousarray(images))
        with Dense.create(str(base / split / "label"), np.uint8, (), codec="zstd") as ds:
            ds.append(np.ascontiguousarray(labels))
    return base


def open_split(root: str | os.PathLike[str], split: str) -> dict[str, Dense]:
    """``{"image": Dense, "label": Dense}`` of one split; the caller closes them."""
    base = Path(root) / split
    return {"image": Dense.open(str(base / "image")), "label": Dense.open(str(base / "label"))}


def training_args(description: str, ckpt_help: str) -> argparse.Namespace:
    """The examples' common command line: stores, checkpointing, crash/resume."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--root", default="fmnist-stores", help="where the stores are written")
    ap.add_argument("--ckpt", default=None, help=ckpt_help)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--stop-at", type=int, default=None, help="simulate a crash at this step")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N records")
    return ap.parse_args()
