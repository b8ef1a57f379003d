"""loaderx.idx: the idx reader and the Debian Fashion-MNIST files."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest
from loaderx.idx import FASHION_MNIST_ROOT, fashion_mnist, read_idx


def write_idx(path, arr: np.ndarray, code: int, *, gz: bool = True, extra: bytes = b"") -> None:
    header = bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    payload = arr.astype(arr.dtype.newbyteorder(">")).tobytes() + extra
    opener = gzip.open if gz else open
    with opener(path, "wb") as f:
        f.write(header + payload)


def test_read_idx_round_trips_uint8_and_int32(tmp_path):
    a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(tmp_path / "a.gz", a, 0x08)
    got = read_idx(tmp_path / "a.gz")
    assert got.dtype == np.uint8 and got.shape == (2, 3, 4)
    assert np.array_equal(got, a)
    b = np.array([1, -2, 70000], dtype=np.int32)
    write_idx(tmp_path / "b", b, 0x0C, gz=False)
    got = read_idx(tmp_path / "b")
    assert got.dtype == np.dtype("=i4") and got.tolist() == [1, -2, 70000]


def test_read_idx_rejects_bad_magic(tmp_path):
    (tmp_path / "x").write_bytes(b"\x01\x00\x08\x01\x00\x00\x00\x01\x05")
    with pytest.raises(ValueError, match="bad magic"):
        read_idx(tmp_path / "x")


def test_read_idx_rejects_unknown_type(tmp_path):
    (tmp_path / "x").write_bytes(b"\x00\x00\x07\x01\x00\x00\x00\x01\x05")
    with pytest.raises(ValueError, match="element type 0x07"):
        read_idx(tmp_path / "x")


def test_read_idx_rejects_size_mismatch(tmp_path):
    write_idx(tmp_path / "x.gz", np.zeros(5, np.uint8), 0x08, extra=b"\x00")
    with pytest.raises(ValueError, match="payload is 6 bytes, header says 5"):
        read_idx(tmp_path / "x.gz")


def test_fashion_mnist_missing_root_names_the_package(tmp_path):
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        fashion_mnist("train", root=tmp_path)


def test_fashion_mnist_bad_split():
    with pytest.raises(ValueError, match="split"):
        fashion_mnist("validation")


@pytest.mark.skipif(not FASHION_MNIST_ROOT.exists(), reason="dataset-fashion-mnist not installed")
def test_fashion_mnist_real_files():
    x, y = fashion_mnist("test")
    assert x.shape == (10000, 28, 28) and x.dtype == np.uint8
    assert y.shape == (10000,) and y.dtype == np.uint8
    assert sorted(np.unique(y).tolist()) == list(range(10))
    assert np.bincount(y).tolist() == [1000] * 10  # the test split is balanced
    xa, ya = fashion_mnist("all")
    assert xa.shape[0] == 70000 and np.array_equal(xa[60000:], x) and np.array_equal(ya[60000:], y)
