"""loaderx.converter on real local 🤗 Datasets built from Fashion-MNIST."""

from __future__ import annotations

import numpy as np
import pytest

datasets = pytest.importorskip("datasets")

from loaderx.converter import convert
from loaderx.datasets import FASHION_MNIST_ROOT, fashion_mnist
from loaderx.errors import SchemaError, StoreExistsError
from loaderx.zrecord import Dense, Ragged

pytestmark = pytest.mark.skipif(not FASHION_MNIST_ROOT.exists(), reason="needs dataset-fashion-mnist")


def crop(img: np.ndarray) -> np.ndarray:
    rows = np.flatnonzero(img.any(axis=1))
    cols = np.flatnonzero(img.any(axis=0))
    return img[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]


@pytest.fixture(scope="module")
def fmnist():
    x, y = fashion_mnist("test")
    return x[:300], y[:300]


def make_dict(x, y):
    feats = datasets.Features({
        "image": datasets.Image(),
        "crop": datasets.Image(),
        "label": datasets.ClassLabel(num_classes=10),
        "rowsum": datasets.Sequence(datasets.Value("int32")),
    })
    def split(lo, hi):
        return datasets.Dataset.from_dict({
            "image": list(x[lo:hi]),
            "crop": [crop(im) for im in x[lo:hi]],
            "label": y[lo:hi].tolist(),
            "rowsum": [im.sum(axis=1)[im.sum(axis=1) > 0].astype(np.int32) for im in x[lo:hi]],
        }, features=feats)
    return datasets.DatasetDict({"train": split(0, 200), "test": split(200, 300)})


def test_convert_writes_dense_and_ragged_streams_exactly(tmp_path, fmnist):
    x, y = fmnist
    root = convert(make_dict(x, y), tmp_path / "fmnist", codec="zstd", progress=False)
    assert sorted(p.name for p in root.iterdir()) == ["test", "train"]
    with Dense.open(root / "train" / "image") as s:
        assert len(s) == 200 and s.item_shape == (28, 28) and s.dtype == np.uint8
        assert np.array_equal(s[:], x[:200])
    with Dense.open(root / "test" / "label") as s:
        assert s.dtype == np.int64 and s.item_shape == ()
        assert s[:].tolist() == y[200:300].tolist()
    with Ragged.open(root / "train" / "crop") as s:
        assert s.ndim == 2 and len(s) == 200
        for i in (0, 57, 199):
            assert np.array_equal(s[i], crop(x[i]))
    with Ragged.open(root / "test" / "rowsum") as s:
        assert s.dtype == np.int32 and s.ndim == 1
        r = x[250].sum(axis=1)
        assert np.array_equal(s[50], r[r > 0])


def test_convert_refuses_existing_root(tmp_path, fmnist):
    (tmp_path / "out").mkdir()
    with pytest.raises(StoreExistsError):
        convert(make_dict(*fmnist), tmp_path / "out", progress=False)


def test_unsupported_column_fails_before_writing(tmp_path):
    d = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a", "b"], "n": [1, 2]})})
    with pytest.raises(SchemaError, match="'text'"):
        convert(d, tmp_path / "out", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_mixed_rank_column_is_rejected(tmp_path):
    feats = datasets.Features({"a": datasets.Sequence(datasets.Sequence(datasets.Value("float32")))})
    d = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"a": [[[1.0]], [[1.0, 2.0], [3.0, 4.0]]]}, features=feats)})
    # both rank 2 but different shapes -> ragged, fine
    root = convert(d, tmp_path / "ok", progress=False)
    with Ragged.open(root / "train" / "a") as s:
        assert [r.shape for r in s[0, 1]] == [(1, 1), (2, 2)]
