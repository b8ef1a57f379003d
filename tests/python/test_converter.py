"""loaderx.converter on real local 🤗 Datasets: offline sources, exact values, failure paths."""

from __future__ import annotations

import inspect
import os
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

datasets = pytest.importorskip("datasets")

from loaderx import converter
from loaderx.converter import convert, huggingface
from loaderx.dataloader import DataLoader
from loaderx.errors import InvalidArgumentError, SchemaError, StoreExistsError
from loaderx.idx import FASHION_MNIST_ROOT, fashion_mnist
from loaderx.zrecord import Dense, Ragged


def crop(img: np.ndarray) -> np.ndarray:
    rows = np.flatnonzero(img.any(axis=1))
    cols = np.flatnonzero(img.any(axis=0))
    return img[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]


def images(n: int, seed: int = 0) -> np.ndarray:
    """n distinct 28x28 uint8 images, each with a non-empty, varying bounding box."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, 28, 28), np.uint8)
    for i in range(n):
        h, w = 3 + i % 20, 5 + (i * 7) % 20
        x[i, 2:2 + h, 1:1 + w] = rng.integers(1, 256, (h, w))
    return x


@pytest.fixture(scope="module")
def source() -> tuple[np.ndarray, np.ndarray]:
    if FASHION_MNIST_ROOT.exists():
        x, y = fashion_mnist("test")
        return np.ascontiguousarray(x[:300]), np.ascontiguousarray(y[:300])
    return images(300), np.arange(300, dtype=np.int64) % 10


def make_dict(x: np.ndarray, y: np.ndarray) -> Any:
    feats = datasets.Features({
        "image": datasets.Image(),
        "crop": datasets.Image(),
        "label": datasets.ClassLabel(names=[f"class{k}" for k in range(10)]),
        "rowsum": datasets.Sequence(datasets.Value("int32")),
    })

    def split(lo: int, hi: int) -> Any:
        return datasets.Dataset.from_dict({
            "image": list(x[lo:hi]),
            "crop": [crop(im) for im in x[lo:hi]],
            "label": y[lo:hi].tolist(),
            "rowsum": [rowsum(im) for im in x[lo:hi]],
        }, features=feats)
    return datasets.DatasetDict({"train": split(0, 200), "test": split(200, 300)})


def rowsum(im: np.ndarray) -> np.ndarray:
    r = im.sum(axis=1, dtype=np.int32)
    return r[r > 0]


def test_convert_writes_dense_and_ragged_streams_exactly(tmp_path: Path, source: Any) -> None:
    x, y = source
    root = convert(make_dict(x, y), tmp_path / "fmnist", codec="zstd", progress=False)
    assert root == tmp_path / "fmnist"
    assert sorted(p.name for p in root.iterdir()) == ["test", "train"]
    assert sorted(p.name for p in (root / "train").iterdir()) == ["crop", "image", "label", "rowsum"]
    with Dense.open(root / "train" / "image") as s:
        assert len(s) == 200 and s.item_shape == (28, 28) and s.dtype == np.uint8
        assert np.array_equal(s[:], x[:200])
    with Dense.open(root / "test" / "label") as s:
        assert s.dtype == np.int64 and s.item_shape == ()
        assert s[:].tolist() == y[200:300].tolist()
    with Ragged.open(root / "train" / "crop") as s:
        assert s.ndim == 2 and len(s) == 200 and s.dtype == np.uint8
        for i in range(200):
            assert np.array_equal(s[i], crop(x[i]))
    with Ragged.open(root / "test" / "rowsum") as s:
        assert s.dtype == np.int32 and s.ndim == 1
        for i in range(100):
            assert np.array_equal(s[i], rowsum(x[200 + i]))


def test_convert_then_dataloader_returns_the_source_values(tmp_path: Path, source: Any) -> None:
    x, y = source
    root = convert(make_dict(x, y), tmp_path / "c", codec="raw", progress=False)
    names = ("image", "label", "crop")
    streams = {"image": Dense.open(root / "train" / "image"),
               "label": Dense.open(root / "train" / "label"),
               "crop": Ragged.open(root / "train" / "crop")}
    try:
        with DataLoader(streams, batch_size=50, mode="Sequential", num_threads=2) as loader:
            for step in range(4):
                batch = next(loader)
                assert sorted(batch) == sorted(names)
                lo = 50 * step
                assert batch["image"].dtype == np.uint8
                assert np.array_equal(batch["image"], x[lo:lo + 50])
                assert batch["label"].tolist() == y[lo:lo + 50].tolist()
                for k, rec in enumerate(batch["crop"]):
                    assert np.array_equal(rec, crop(x[lo + k]))
    finally:
        for s in streams.values():
            s.close()


# -- sources: huggingface() offline ---------------------------------------------------------


def small_dict() -> Any:
    feats = datasets.Features({"image": datasets.Image(),
                               "label": datasets.ClassLabel(names=["a", "b", "c"])})
    x = images(12, seed=1)

    def split(lo: int, hi: int) -> Any:
        return datasets.Dataset.from_dict({"image": list(x[lo:hi]),
                                           "label": [i % 3 for i in range(lo, hi)]},
                                          features=feats, split=datasets.NamedSplit("train"))
    return datasets.DatasetDict({"train": split(0, 8), "test": split(8, 12)}), x


def check_small(root: Path, x: np.ndarray, splits: tuple[str, ...] = ("test", "train")) -> None:
    assert sorted(p.name for p in root.iterdir()) == sorted(splits)
    if "train" in splits:
        with Dense.open(root / "train" / "image") as s:
            assert np.array_equal(s[:], x[:8])
        with Dense.open(root / "train" / "label") as s:
            assert s[:].tolist() == [i % 3 for i in range(8)]
    if "test" in splits:
        with Dense.open(root / "test" / "image") as s:
            assert np.array_equal(s[:], x[8:12])


def test_save_to_disk_directories_convert_offline(tmp_path: Path) -> None:
    dd, x = small_dict()
    dd.save_to_disk(str(tmp_path / "saved_dict"))
    dd["train"].save_to_disk(str(tmp_path / "saved_one"))
    env = dict(os.environ)
    check_small(convert(huggingface(str(tmp_path / "saved_dict")), tmp_path / "a", codec="zstd",
                        progress=False), x)
    one = huggingface(tmp_path / "saved_one")  # a Path works as well as a str
    assert list(one) == ["train"]
    check_small(convert(one, tmp_path / "b", codec="zstd", progress=False), x, ("train",))
    assert dict(os.environ) == env


def test_a_directory_of_data_files_converts_offline(tmp_path: Path) -> None:
    data = tmp_path / "files"
    data.mkdir()
    rows = {"x": [[1, 2, 3], [4, 5, 6]], "y": [0.5, 1.5]}
    datasets.Dataset.from_dict(rows).to_parquet(str(data / "train.parquet"))
    datasets.Dataset.from_dict({"x": [[7, 8, 9]], "y": [2.5]}).to_parquet(str(data / "test.parquet"))
    env = dict(os.environ)
    root = convert(huggingface(str(data)), tmp_path / "out", codec="raw", progress=False)
    assert dict(os.environ) == env
    with Dense.open(root / "train" / "x") as s:  # every list has 3 values: a fixed shape
        assert s.dtype == np.int64 and s.item_shape == (3,)
        assert s[:].tolist() == rows["x"]
    with Dense.open(root / "test" / "y") as s:
        assert s.dtype == np.float64 and s[:].tolist() == [2.5]


def test_loaded_dataset_and_dataset_dict(tmp_path: Path) -> None:
    dd, x = small_dict()
    assert huggingface(dd) is dd
    single = huggingface(dd["test"])
    assert list(single) == ["train"]  # a Dataset becomes the one split, named by its split
    # convert() also takes one Dataset: its columns go straight under the root (as in 2.5.4).
    root = convert(dd["test"], tmp_path / "one", codec="zstd", progress=False)
    assert sorted(p.name for p in root.iterdir()) == ["image", "label"]
    with Dense.open(root / "image") as s:
        assert np.array_equal(s[:], x[8:12])


def test_hub_only_options_are_refused_for_local_data(tmp_path: Path) -> None:
    dd, _ = small_dict()
    dd.save_to_disk(str(tmp_path / "saved"))
    for kwargs in ({"revision": "v1"}, {"token": "hf_x"}, {"endpoint": "http://127.0.0.1:9"},
                   {"config": "default"}):
        with pytest.raises(InvalidArgumentError):
            huggingface(str(tmp_path / "saved"), **kwargs)
        with pytest.raises(InvalidArgumentError):
            huggingface(dd, **kwargs)
    with pytest.raises(FileNotFoundError):
        huggingface(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError):
        huggingface(tmp_path / "nope")
    with pytest.raises(TypeError):
        huggingface(42)


def test_hub_path_passes_endpoint_and_token_to_the_calls_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub
    from huggingface_hub import constants

    dd, x = small_dict()
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    dd["train"].to_parquet(str(snapshot / "train.parquet"))
    calls: list[tuple[str, Any]] = []

    class FakeApi:
        def __init__(self, endpoint: str | None = None, token: str | None = None) -> None:
            calls.append(("api", (endpoint, token)))

        def dataset_info(self, repo_id: str, revision: str) -> Any:
            calls.append(("info", (repo_id, revision)))
            return type("Info", (), {"sha": "c0ffee" * 6 + "0000"})()

    def fake_snapshot(repo_id: str, **kwargs: Any) -> str:
        calls.append(("snapshot", (repo_id, kwargs)))
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    env = dict(os.environ)
    before = (datasets.config.HF_ENDPOINT, constants.ENDPOINT)
    got = huggingface("someone/data", revision="v2", token="hf_t", endpoint="https://mirror.test/")
    assert (datasets.config.HF_ENDPOINT, constants.ENDPOINT) == before
    assert dict(os.environ) == env
    sha = "c0ffee" * 6 + "0000"
    assert calls == [("api", ("https://mirror.test", "hf_t")), ("info", ("someone/data", "v2")),
                     ("snapshot", ("someone/data", {"repo_type": "dataset", "revision": sha,
                                                    "token": "hf_t",
                                                    "endpoint": "https://mirror.test"}))]
    assert list(got) == ["train"]
    check_small(convert(got, tmp_path / "hub", codec="zstd", progress=False), x, ("train",))


# -- the reference README's example, with the Hub replaced by a local dataset -----------------


def test_reference_readme_converter_example_with_a_local_dataset(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_dataloader_readme import README, _blocks

    if not README.exists():
        pytest.skip(f"reference README not at {README}")
    first = _blocks("Offline Hugging Face conversion")[0]
    assert '"ylecun/mnist"' in first
    x = images(30, seed=3)
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)})
    local = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"image": list(x[:20]), "label": [i % 10 for i in range(20)]},
                                            features=feats),
        "test": datasets.Dataset.from_dict({"image": list(x[20:]), "label": [i % 10 for i in range(10)]},
                                           features=feats),
    })
    local.save_to_disk(str(tmp_path / "mnist-local"))
    monkeypatch.chdir(tmp_path)
    code = first.replace('"ylecun/mnist"', repr(str(tmp_path / "mnist-local")))
    exec(compile(code, str(README), "exec"), {})  # noqa: S102 - the example under test
    # The tree the README draws: mnist/{train,test}/{image,label}, ordinary stores.
    assert sorted(p.name for p in (tmp_path / "mnist").iterdir()) == ["test", "train"]
    for split, lo, hi in (("train", 0, 20), ("test", 20, 30)):
        assert sorted(p.name for p in (tmp_path / "mnist" / split).iterdir()) == ["image", "label"]
        with Dense.open(tmp_path / "mnist" / split / "image") as s:
            assert s.item_shape == (28, 28) and np.array_equal(s[:], x[lo:hi])


def test_signatures_match_the_2_5_4_wheel() -> None:
    conv = inspect.signature(convert).parameters
    assert list(conv)[:3] == ["dataset", "output", "codec"]
    assert conv["dataset"].kind is conv["output"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert conv["codec"].kind is inspect.Parameter.KEYWORD_ONLY
    assert conv["codec"].default is inspect.Parameter.empty  # required, as in 2.5.4
    hf = inspect.signature(huggingface).parameters
    assert list(hf) == ["repo_id", "config", "revision", "token", "endpoint"]
    assert [(p.kind, p.default) for p in list(hf.values())[1:]] == [
        (inspect.Parameter.KEYWORD_ONLY, d) for d in (None, "main", None, None)]
    with pytest.raises(TypeError):
        convert(small_dict()[0], "never-written")  # type: ignore[call-arg]


# -- images ---------------------------------------------------------------------------------


def test_image_layout_chw_and_grayscale(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    rgb = rng.integers(0, 256, (6, 7, 9, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, (6, 7, 9), dtype=np.uint8)
    feats = datasets.Features({"rgb": datasets.Image(), "gray": datasets.Image()})
    ds = datasets.Dataset.from_dict({"rgb": list(rgb), "gray": list(gray)}, features=feats)
    hwc = convert(ds, tmp_path / "hwc", codec="raw", progress=False)
    chw = convert(ds, tmp_path / "chw", codec="raw", image_layout="CHW", progress=False)
    with Dense.open(hwc / "rgb") as a, Dense.open(hwc / "gray") as b:
        assert a.item_shape == (7, 9, 3) and np.array_equal(a[:], rgb)
        assert b.item_shape == (7, 9) and np.array_equal(b[:], gray)
    with Dense.open(chw / "rgb") as a, Dense.open(chw / "gray") as b:
        assert a.item_shape == (3, 7, 9) and np.array_equal(a[:], rgb.transpose(0, 3, 1, 2))
        assert b.item_shape == (1, 7, 9) and np.array_equal(b[:], gray[:, None])
    with pytest.raises(InvalidArgumentError, match="image_layout"):
        convert(ds, tmp_path / "bad", codec="raw", image_layout="NHWC", progress=False)


def test_mixed_grayscale_and_colour_images_need_image_mode(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    a = rng.integers(0, 256, (5, 6, 3), dtype=np.uint8)
    b = rng.integers(0, 256, (5, 6), dtype=np.uint8)
    ds = datasets.Dataset.from_dict({"img": [a, b]}, features=datasets.Features({"img": datasets.Image()}))
    with pytest.raises(SchemaError, match=r"'img'.*rank.*image_mode"):
        convert(ds, tmp_path / "x", codec="raw", progress=False)
    assert not (tmp_path / "x").exists()
    root = convert(ds, tmp_path / "y", codec="raw", image_mode="RGB", progress=False)
    with Dense.open(root / "img") as s:
        assert s.item_shape == (5, 6, 3)
        assert np.array_equal(s[0], a)
        assert np.array_equal(s[1], np.repeat(b[:, :, None], 3, axis=2))


# -- unsupported columns, encoders -----------------------------------------------------------


def test_unsupported_column_fails_naming_it_before_writing(tmp_path: Path) -> None:
    d = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"n": [1, 2], "text": ["a", "b"]})})
    with pytest.raises(SchemaError, match="'text'.*encoders"):
        convert(d, tmp_path / "out", codec="zstd", progress=False)
    nested = datasets.Dataset.from_dict({"d": [{"a": 1}, {"a": 2}]})
    with pytest.raises(SchemaError, match="'d'"):
        convert(nested, tmp_path / "out", codec="zstd", progress=False)
    raw = datasets.Dataset.from_dict({"b": [b"xy", b"z"]})
    with pytest.raises(SchemaError, match="'b'"):
        convert(raw, tmp_path / "out", codec="zstd", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_encoders_turn_any_column_into_arrays(tmp_path: Path) -> None:
    text = ["hello", "", "zrecord", "é"]
    ds = datasets.Dataset.from_dict({"text": text, "cat": ["x", "y", "x", "z"], "n": [1, 2, 3, 4]})
    ids = {"x": 0, "y": 1, "z": 2}
    root = convert(ds, tmp_path / "enc", codec="zstd", progress=False, encoders={
        "text": lambda s: np.frombuffer(s.encode(), np.uint8),
        "cat": lambda s: np.int16(ids[s]),
    })
    with Ragged.open(root / "text") as s:
        assert s.dtype == np.uint8 and s.ndim == 1
        assert [bytes(r).decode() for r in s[:]] == text
    with Dense.open(root / "cat") as s:  # a 0-d encoder output makes a Dense store of scalars
        assert s.dtype == np.int16 and s.item_shape == () and s[:].tolist() == [0, 1, 0, 2]
    with Dense.open(root / "n") as s:
        assert s[:].tolist() == [1, 2, 3, 4]


def test_encoder_errors_name_the_column_and_record_and_publish_nothing(tmp_path: Path) -> None:
    ds = datasets.Dataset.from_dict({"text": [str(i) for i in range(600)]})

    def enc(s: str) -> np.ndarray:
        if s == "517":
            raise KeyError(s)
        return np.frombuffer(s.encode(), np.uint8)

    with pytest.raises(SchemaError, match="'text'.*record 517"):
        convert(ds, tmp_path / "x", codec="zstd", encoders={"text": enc}, progress=False)
    with pytest.raises(SchemaError, match="'text'.*list.*record 0"):
        convert(ds, tmp_path / "x", codec="zstd", encoders={"text": lambda s: [1]}, progress=False)

    def drift(s: str) -> np.ndarray:
        return np.zeros(2, np.uint8 if s != "300" else np.int32)

    with pytest.raises(SchemaError, match="'text'.*record 300"):
        convert(ds, tmp_path / "x", codec="zstd", encoders={"text": drift}, progress=False)
    with pytest.raises(InvalidArgumentError, match="'nope'"):
        convert(ds, tmp_path / "x", codec="zstd", encoders={"nope": enc}, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments(tmp_path: Path) -> None:
    dd, _ = small_dict()
    (tmp_path / "exists").mkdir()
    with pytest.raises(StoreExistsError):
        convert(dd, tmp_path / "exists", codec="zstd", progress=False)
    with pytest.raises(InvalidArgumentError, match="codec"):
        convert(dd, tmp_path / "o", codec="lz4", progress=False)
    with pytest.raises(InvalidArgumentError, match="no splits"):
        convert(datasets.DatasetDict(), tmp_path / "o", codec="zstd", progress=False)
    with pytest.raises(InvalidArgumentError, match="split"):
        convert({"../up": dd["train"]}, tmp_path / "o", codec="zstd", progress=False)
    with pytest.raises(TypeError):
        convert([1, 2], tmp_path / "o", codec="zstd", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exists"]


# -- memory and progress ---------------------------------------------------------------------


def test_memory_stays_bounded_by_the_append_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    n, shape = 4000, (64, 64)
    data = np.random.default_rng(7).integers(0, 256, (n, *shape), dtype=np.uint8)  # 16 MiB
    feats = datasets.Features({"x": datasets.Array2D(shape, "uint8"), "r": datasets.Sequence(datasets.Value("uint8"))})
    datasets.Dataset.from_dict({"x": data, "r": [row[: i % 64] for i, row in enumerate(data[:, 0])]},
                               features=feats).save_to_disk(str(tmp_path / "big"))
    del data
    ds = datasets.load_from_disk(str(tmp_path / "big"))  # memory-mapped Arrow
    monkeypatch.setattr(converter, "_TARGET_BATCH_BYTES", 1 << 20)
    tracemalloc.start()
    try:
        convert(ds, tmp_path / "out", codec="zstd", progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"peak {peak} bytes for a 16 MiB column converted in 1 MiB appends"
    with Dense.open(tmp_path / "out" / "x") as s:
        assert np.array_equal(s[:], ds.with_format("numpy")["x"])


def test_progress_bar_per_split_only_when_asked(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    dd, _ = small_dict()
    convert(dd, tmp_path / "a", codec="zstd", progress=True)
    err = capfd.readouterr().err
    assert "train" in err and "test" in err
    convert(dd, tmp_path / "b", codec="zstd")  # stderr is not a terminal here: no bar
    assert capfd.readouterr().err == ""


def test_store_metadata_records_features_layout_and_class_names(tmp_path: Path) -> None:
    dd, _ = small_dict()
    root = convert(dd, tmp_path / "m", codec="zstd", image_layout="CHW", progress=False)
    with Dense.open(root / "train" / "label") as s:
        meta: Any = s.metadata
        assert meta["class_names"] == ["a", "b", "c"]
        assert meta["feature"] == {"names": ["a", "b", "c"], "_type": "ClassLabel"}
    with Dense.open(root / "train" / "image") as s:
        assert s.metadata["image_layout"] == "CHW"
        assert s.metadata["feature"] == {"_type": "Image"}


def test_streamed_datasets_convert_exactly_in_one_pass(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    n = 700
    floats = rng.standard_normal(n)  # float64: nothing may be narrowed on the way
    small = rng.integers(-30000, 30000, n).astype(np.int16)
    seqs = [rng.integers(0, 255, k % 9).astype(np.uint8) for k in range(n)]
    imgs = [rng.integers(0, 256, (4 + k % 3, 5, 3), dtype=np.uint8) for k in range(n)]
    feats = datasets.Features({"f": datasets.Value("float64"), "i": datasets.Value("int16"),
                               "s": datasets.Sequence(datasets.Value("uint8")),
                               "img": datasets.Image(), "t": datasets.Value("string")})
    ds = datasets.Dataset.from_dict({"f": floats, "i": small, "s": seqs, "img": imgs,
                                     "t": [str(k) for k in range(n)]}, features=feats)
    streamed = datasets.IterableDatasetDict({"train": ds.to_iterable_dataset(num_shards=3)})
    root = convert(streamed, tmp_path / "st", codec="zstd", progress=False,
                   encoders={"t": lambda v: np.frombuffer(v.encode(), np.uint8)})
    with Dense.open(root / "train" / "f") as s:
        assert s.dtype == np.float64 and np.array_equal(s[:], floats)
    with Dense.open(root / "train" / "i") as s:
        assert s.dtype == np.int16 and np.array_equal(s[:], small)
    with Ragged.open(root / "train" / "s") as s:
        assert all(np.array_equal(a, b) for a, b in zip(s[:], seqs))
    with Ragged.open(root / "train" / "img") as s:  # an open axis in a stream: Ragged, HWC
        assert s.ndim == 3 and all(np.array_equal(a, b) for a, b in zip(s[:], imgs))
    with Ragged.open(root / "train" / "t") as s:
        assert [bytes(r).decode() for r in s[:]] == [str(k) for k in range(n)]
    one = convert(ds.select_columns(["i"]).to_iterable_dataset(), tmp_path / "one", codec="raw",
                  progress=False)
    with Dense.open(one / "i") as s:
        assert np.array_equal(s[:], small)
    with pytest.raises(SchemaError, match="'t'"):
        convert(ds.to_iterable_dataset(), tmp_path / "bad", codec="raw", progress=False)
    assert not (tmp_path / "bad").exists()


def test_an_empty_dataset_is_refused(tmp_path: Path) -> None:
    empty = datasets.Dataset.from_dict({"x": []}, features=datasets.Features({"x": datasets.Value("int32")}))
    with pytest.raises(InvalidArgumentError, match="empty"):
        convert(empty, tmp_path / "e", codec="raw", progress=False)
    with pytest.raises(InvalidArgumentError, match="empty"):
        convert(datasets.IterableDataset.from_generator(_no_rows, features=empty.features),
                tmp_path / "e", codec="raw", progress=False)
    assert list(tmp_path.iterdir()) == []


def _no_rows() -> Any:
    yield from ()
