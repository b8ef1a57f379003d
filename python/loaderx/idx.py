"""idx files (the MNIST family's format) and the datasets Debian ships in it.

:func:`read_idx` reads one idx(.gz) file; :func:`fashion_mnist` reads Debian's
``dataset-fashion-mnist`` package, which installs the original idx files under
``/usr/share/datasets/fashion-mnist`` (no network needed).

The module is named after the file format, not ``datasets``, so that inside
the package it never stands for the Hugging Face ``datasets`` library that
:mod:`loaderx.converter` imports.
"""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np

__all__ = ["FASHION_MNIST_ROOT", "fashion_mnist", "read_idx"]

FASHION_MNIST_ROOT = Path(os.environ.get("LOADERX_FMNIST_ROOT", "/usr/share/datasets/fashion-mnist"))

# idx element type codes -> NumPy dtypes (big-endian on disk)
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read one idx(.gz) file into a native-endian ndarray of its stored shape.

    Raises ``FileNotFoundError`` if absent and ``ValueError`` if the header is
    not a valid idx header or the payload size does not match it.
    """
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{p}: not an idx file (bad magic)")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise ValueError(f"{p}: unknown idx element type 0x{code:02x}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{p}: truncated idx header")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_IDX_DTYPES[code])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(f"{p}: payload is {len(raw) - header} bytes, header says {expected}")
    arr = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def fashion_mnist(split: str = "all", root: str | os.PathLike[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(images, labels)``: ``uint8 (N, 28, 28)`` and ``uint8 (N,)``.

    ``split`` is ``"train"`` (60,000), ``"test"`` (10,000) or ``"all"``
    (70,000, train then test).
    """
    base = Path(root) if root is not None else FASHION_MNIST_ROOT
    names = {"train": "train", "test": "t10k"}
    if split not in (*names, "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', not {split!r}")
    parts = ["train", "test"] if split == "all" else [split]
    xs, ys = [], []
    for part in parts:
        stem = names[part]
        img = base / f"{stem}-images-idx3-ubyte.gz"
        lab = base / f"{stem}-labels-idx1-ubyte.gz"
        if not img.exists():
            raise FileNotFoundError(
                f"{img} not found: install Debian's dataset-fashion-mnist "
                "(apt-get install dataset-fashion-mnist) or set LOADERX_FMNIST_ROOT")
        xs.append(read_idx(img))
        ys.append(read_idx(lab))
    x = np.concatenate(xs) if len(xs) > 1 else xs[0]
    y = np.concatenate(ys) if len(ys) > 1 else ys[0]
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"{base}: {x.shape[0]} images but {y.shape[0]} labels")
    return x, y
