"""Sequence packing (loaderx.packing, DataLoader(pack=...)): exact rows, segment ids,
positions and cu_seqlens, properties of both policies against a NumPy reference,
world-size invariance, seek/resume, and the refusals."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loaderx.dataloader import DataLoader
from loaderx.errors import ArgumentTypeError, InvalidArgumentError, SchemaError
from loaderx.mix import mix
from loaderx.packing import Packing
from loaderx.zrecord import Dense, Ragged

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from packing import numpy_pack  # the reference packer

DOCS = [
    np.array([1, 2, 3], np.int32),
    np.arange(10, 16, dtype=np.int32),
    np.array([], np.int32),
    np.array([20, 21], np.int32),
]


def test_concat_hand_computed() -> None:
    p = Packing(seq_len=4, rows=3, pad_id=-1, cu_seqlens=True)
    out = p({"tokens": DOCS, "label": "kept"})
    assert list(out) == ["tokens", "label", "segment_ids", "positions", "cu_seqlens", "pack_counts"]
    assert out["tokens"].dtype == np.int32 and out["tokens"].shape == (3, 4)
    assert out["tokens"].tolist() == [[1, 2, 3, 10], [11, 12, 13, 14], [15, 20, 21, -1]]
    assert out["segment_ids"].dtype == np.int32
    assert out["segment_ids"].tolist() == [[1, 1, 1, 2], [1, 1, 1, 1], [1, 2, 2, 0]]
    assert out["positions"].dtype == np.int32
    assert out["positions"].tolist() == [[0, 1, 2, 0], [0, 1, 2, 3], [0, 0, 1, 0]]
    assert out["cu_seqlens"].dtype == np.int32
    assert out["cu_seqlens"].tolist() == [0, 3, 4, 8, 9, 11, 12]
    assert out["label"] == "kept"
    assert out["pack_counts"] == {
        "tokens": 11,
        "tokens_padded": 1,
        "tokens_dropped": 0,
        "docs_split": 1,
        "docs_truncated": 0,
    }


def test_best_fit_hand_computed() -> None:
    docs = [
        np.array([1, 2, 3], np.int64),
        np.arange(10, 16, dtype=np.int64),
        np.array([30], np.int64),
        np.array([20, 21], np.int64),
    ]
    out = Packing(seq_len=4, rows=2, policy="best_fit", pad_id=0, cu_seqlens=True)({"tokens": docs})
    assert out["tokens"].dtype == np.int64
    # Chunks longest first: [10..13], [1 2 3], [14 15], [20 21], [30]; with two
    # rows, [14 15] and [20 21] fit nowhere and are dropped, [30] fills row 1.
    assert out["tokens"].tolist() == [[10, 11, 12, 13], [1, 2, 3, 30]]
    assert out["segment_ids"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 2]]
    assert out["positions"].tolist() == [[0, 1, 2, 3], [0, 1, 2, 0]]
    assert out["cu_seqlens"].tolist() == [0, 4, 7, 8]
    assert out["pack_counts"] == {
        "tokens": 12,
        "tokens_padded": 0,
        "tokens_dropped": 4,
        "docs_split": 0,
        "docs_truncated": 2,
    }


def test_aligned_streams_and_per_stream_pad() -> None:
    tokens = [np.array([7, 8, 9], np.uint16), np.array([5, 6], np.uint16)]
    mask = [np.array([0, 1, 1], np.bool_), np.array([1, 0], np.bool_)]
    p = Packing(
        seq_len=3, rows=2, policy="best_fit", streams=("tokens", "mask"), pad_id={"tokens": 65535}
    )
    out = p({"mask": mask, "tokens": tokens})
    assert list(out)[:2] == ["mask", "tokens"]  # the batch's order
    assert out["tokens"].dtype == np.uint16 and out["mask"].dtype == np.bool_
    assert out["tokens"].tolist() == [[7, 8, 9], [5, 6, 65535]]
    assert out["mask"].tolist() == [[False, True, True], [True, False, False]]
    assert "cu_seqlens" not in out


def check_layout(
    docs: list[np.ndarray], out: dict[str, Any], seq_len: int, rows: int, policy: str
) -> None:
    """Every property of a packed unit whose token values name (document, offset)."""
    tokens, segs, pos = out["tokens"], out["segment_ids"], out["positions"]
    counts = out["pack_counts"]
    total = sum(len(d) for d in docs)
    placed = int(np.count_nonzero(segs))
    assert counts["tokens"] == total
    assert counts["tokens"] == placed + counts["tokens_dropped"]
    assert rows * seq_len == placed + counts["tokens_padded"]
    seen: dict[int, list[tuple[int, int]]] = {}
    boundaries = [0]
    for r in range(rows):
        row = segs[r]
        used = int(np.count_nonzero(row))
        assert not row[used:].any() and (tokens[r, used:] == -1).all()  # padding at the end
        start = 0
        for k in range(1, int(row.max(initial=0)) + 1):
            idx = np.flatnonzero(row == k)
            assert idx[0] == start and (np.diff(idx) == 1).all()  # contiguous, in order
            assert pos[r, idx].tolist() == list(range(len(idx)))  # restart per segment
            values = tokens[r, idx]
            doc, offset = divmod(int(values[0]), 1 << 20)
            # a contiguous slice of one document, in order
            assert values.tolist() == docs[doc][offset : offset + len(idx)].tolist()
            seen.setdefault(doc, []).append((offset, len(idx)))
            start = idx[-1] + 1
            boundaries.append(r * seq_len + start)
        if used < seq_len:
            boundaries.append((r + 1) * seq_len)
    assert out["cu_seqlens"].tolist() == boundaries
    split = truncated = 0
    for d, doc in enumerate(docs):
        pieces = sorted(seen.get(d, []))
        got = sum(n for _, n in pieces)
        if policy == "concat":  # a prefix of the document, piece after piece
            assert [o for o, _ in pieces] == list(np.cumsum([0] + [n for _, n in pieces]))[:-1]
        else:  # whole chunks
            assert all(o % seq_len == 0 and n == min(seq_len, len(doc) - o) for o, n in pieces)
        split += len(pieces) > 1
        truncated += got < len(doc)
    assert counts["docs_split"] == split and counts["docs_truncated"] == truncated


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    seq_len=st.integers(1, 16),
    rows=st.integers(1, 6),
    policy=st.sampled_from(["concat", "best_fit"]),
)
def test_properties_and_reference(lengths: list[int], seq_len: int, rows: int, policy: str) -> None:
    docs = [np.arange(n, dtype=np.int64) + (d << 20) for d, n in enumerate(lengths)]
    out = Packing(seq_len, rows, policy=policy, pad_id=-1, cu_seqlens=True)({"tokens": docs})
    check_layout(docs, out, seq_len, rows, policy)
    ref = numpy_pack(docs, seq_len, rows, policy, pad=-1)
    for key in ("tokens", "segment_ids", "positions"):
        np.testing.assert_array_equal(out[key], ref[key])
    assert out["pack_counts"]["tokens_dropped"] == ref["tokens_dropped"]
    if policy == "concat":  # the placed tokens, row-major, are the documents in order
        flat = np.concatenate(docs)[: int(np.count_nonzero(out["segment_ids"]))]
        np.testing.assert_array_equal(out["tokens"][out["segment_ids"] > 0], flat)


def test_refusals() -> None:
    with pytest.raises(InvalidArgumentError, match=r"^packing seq_len must be >= 1, got 0$"):
        Packing(seq_len=0, rows=1)
    with pytest.raises(InvalidArgumentError, match=r"^packing rows must be >= 1, got -2$"):
        Packing(seq_len=4, rows=-2)
    with pytest.raises(ArgumentTypeError, match=r"^packing seq_len must be an int, got float$"):
        Packing(seq_len=4.0, rows=1)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match=r"^packing docs must be an int, got bool$"):
        Packing(seq_len=4, rows=1, docs=True)
    with pytest.raises(InvalidArgumentError, match=r"'concat' or 'best_fit', got 'first_fit'"):
        Packing(seq_len=4, rows=1, policy="first_fit")
    with pytest.raises(InvalidArgumentError, match=r"^packing streams name 'a' twice$"):
        Packing(seq_len=4, rows=1, streams=("a", "a"))
    with pytest.raises(InvalidArgumentError, match=r"not packed streams"):
        Packing(seq_len=4, rows=1, pad_id={"mask": 0})
    with pytest.raises(InvalidArgumentError, match=r"rows \* seq_len \(65536 \* 65536\)"):
        Packing(seq_len=1 << 16, rows=1 << 16)
    with pytest.raises(ArgumentTypeError, match=r"cu_seqlens must be a bool, got int"):
        Packing(seq_len=4, rows=1, cu_seqlens=1)  # type: ignore[arg-type]
    p = Packing(seq_len=4, rows=1, streams=("tokens", "mask"))
    with pytest.raises(
        InvalidArgumentError,
        match=r"^packing: document 1 has 1 elements in "
        r"stream 'mask' but 2 in 'tokens': packed streams must be aligned$",
    ):
        p(
            {
                "tokens": [np.ones(1, np.int32), np.ones(2, np.int32)],
                "mask": [np.ones(1, np.int32), np.ones(1, np.int32)],
            }
        )
    with pytest.raises(SchemaError, match=r"has dtype <f4: packing needs integer"):
        Packing(seq_len=4, rows=1)({"tokens": [np.ones(2, np.float32)]})
    with pytest.raises(SchemaError, match=r"document 0 has 2 dimensions, not 1"):
        Packing(seq_len=4, rows=1)({"tokens": [np.ones((2, 2), np.int32)]})
    with pytest.raises(InvalidArgumentError, match=r"pad value 256 .* does not fit its dtype \|u1"):
        Packing(seq_len=4, rows=1, pad_id=256)({"tokens": [np.ones(2, np.uint8)]})
    with pytest.raises(InvalidArgumentError, match=r"docs \(3\) must divide the batch size \(4\)"):
        Packing(seq_len=4, rows=1, docs=3)({"tokens": [np.ones(2, np.int32)] * 4})


# -- through the DataLoader ----------------------------------------------------

N = 64


def doc(i: int) -> np.ndarray:
    return (np.arange(1 + (i * 37) % 23, dtype=np.int32) + 1000 * i).astype(np.int32)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("packing")
    with Ragged.create(root / "tokens", np.int32, 1, codec="zstd") as w:
        w.append([doc(i) for i in range(N)])
    with Ragged.create(root / "mask", np.uint8, 1, codec="raw") as w:
        w.append([(doc(i) % 2).astype(np.uint8) for i in range(N)])
    with Dense.create(root / "label", np.int64, (), codec="raw") as w:
        w.append(np.arange(N, dtype=np.int64) * 3)
    with Ragged.create(root / "floats", np.float32, 1, codec="raw") as w:
        w.append([np.ones(2, np.float32)] * N)
    streams = {
        name: (Ragged if name != "label" else Dense).open(root / name)
        for name in ("tokens", "mask", "label", "floats")
    }
    yield streams
    for s in streams.values():
        s.close()


def packed_streams(corpus: dict[str, Any]) -> dict[str, Any]:
    return {k: corpus[k] for k in ("tokens", "mask", "label")}


PACK = Packing(
    seq_len=8,
    rows=3,
    docs=2,
    policy="best_fit",
    streams=("tokens", "mask"),
    pad_id={"tokens": -1},
    cu_seqlens=True,
)


def snapshot(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if isinstance(v, dict) else np.array(v)) for k, v in batch.items()}


def test_loader_packs_each_batch_exactly(corpus: dict[str, Any]) -> None:
    with DataLoader(
        packed_streams(corpus), batch_size=8, mode="Sequential", pack=PACK, transform_threads=2
    ) as loader:
        for step in range(4):
            batch = next(loader)
            ids = [(step * 8 + j) % N for j in range(8)]
            assert list(batch) == [
                "tokens",
                "mask",
                "label",
                "segment_ids",
                "positions",
                "cu_seqlens",
                "pack_counts",
            ]
            assert batch["tokens"].shape == (12, 8) and batch["mask"].shape == (12, 8)
            assert batch["label"].tolist() == [3 * i for i in ids]  # kept per document
            for u in range(4):  # each unit of two documents, three rows
                unit = [doc(i) for i in ids[2 * u : 2 * u + 2]]
                ref = numpy_pack(unit, 8, 3, "best_fit", pad=-1)
                rows = slice(3 * u, 3 * u + 3)
                np.testing.assert_array_equal(batch["tokens"][rows], ref["tokens"])
                np.testing.assert_array_equal(batch["segment_ids"][rows], ref["segment_ids"])
                np.testing.assert_array_equal(batch["positions"][rows], ref["positions"])
                mask = numpy_pack([(d % 2).astype(np.uint8) for d in unit], 8, 3, "best_fit")
                np.testing.assert_array_equal(batch["mask"][rows], mask["tokens"])
            tokens = sum(len(doc(i)) for i in ids)
            counts = batch["pack_counts"]
            assert counts["tokens"] == tokens
            assert 96 == tokens - counts["tokens_dropped"] + counts["tokens_padded"]


def test_packing_takes_the_packed_ragged_form_too(corpus: dict[str, Any]) -> None:
    # ragged="packed" delivers RaggedBatch objects; packing them gives the
    # same rows as packing the list form.
    def run(ragged: str) -> list[dict[str, Any]]:
        with DataLoader(packed_streams(corpus), batch_size=8, mode="IID", seed=3, pack=PACK,
                        ragged=ragged) as loader:
            return [snapshot(next(loader)) for _ in range(3)]

    for a, b in zip(run("list"), run("packed")):
        assert list(a) == list(b)
        for k in a:
            if isinstance(a[k], dict):
                assert a[k] == b[k]
            else:
                np.testing.assert_array_equal(a[k], b[k])


def test_transform_sees_the_packed_batch(corpus: dict[str, Any]) -> None:
    with DataLoader(
        packed_streams(corpus),
        batch_size=8,
        mode="Sequential",
        pack=PACK,
        transform=lambda b: (b["tokens"].shape, b["label"].shape),
    ) as loader:
        assert next(loader) == ((12, 8), (8,))


def concat_with_offsets(parts: list[np.ndarray], per_part: int) -> list[int]:
    out = [0]
    for k, cu in enumerate(parts):
        out += [int(v) + k * per_part for v in cu[1:]]
    return out


@pytest.mark.parametrize("policy", ["concat", "best_fit"])
@pytest.mark.parametrize("mode", ["Cyclic", "IID"])
def test_world_size_invariance(corpus: dict[str, Any], policy: str, mode: str) -> None:
    pack = Packing(
        seq_len=8, rows=3, docs=2, policy=policy, streams=("tokens", "mask"), cu_seqlens=True
    )
    global_batch = 8

    def steps(world: int, rank: int) -> list[dict[str, Any]]:
        with DataLoader(
            packed_streams(corpus),
            batch_size=global_batch // world,
            mode=mode,
            seed=9,
            rank=rank,
            world_size=world,
            pack=pack,
        ) as loader:
            return [snapshot(next(loader)) for _ in range(6)]

    whole = steps(1, 0)
    for world in (2, 4):
        ranks = [steps(world, r) for r in range(world)]
        for s in range(6):
            for key in ("tokens", "mask", "segment_ids", "positions", "label"):
                got = np.concatenate([ranks[r][s][key] for r in range(world)])
                np.testing.assert_array_equal(got, whole[s][key], err_msg=f"{key} step {s}")
            rows_per_rank = (global_batch // world) // 2 * 3 * 8
            assert (
                concat_with_offsets(
                    [ranks[r][s]["cu_seqlens"] for r in range(world)], rows_per_rank
                )
                == whole[s]["cu_seqlens"].tolist()
            )
            for c in ("tokens", "tokens_padded", "tokens_dropped", "docs_split"):
                assert (
                    sum(ranks[r][s]["pack_counts"][c] for r in range(world))
                    == whole[s]["pack_counts"][c]
                )


def test_seek_and_resume_are_exact(corpus: dict[str, Any]) -> None:
    kw: dict[str, Any] = {"batch_size": 8, "mode": "Cyclic", "seed": 3, "pack": PACK}
    with DataLoader(packed_streams(corpus), **kw) as loader:
        want = [snapshot(next(loader)) for _ in range(7)]
        loader.seek(2)
        assert loader.step == 2
        state = loader.state_dict()
        assert state["step"] == 2 and state["global_batch"] == 8
        again = [snapshot(next(loader)) for _ in range(5)]
    with DataLoader(packed_streams(corpus), **kw) as resumed:
        resumed.load_state_dict(state)
        later = [snapshot(next(resumed)) for _ in range(5)]
    # resumed on two ranks: the same global packed batches
    halves = []
    for rank in (0, 1):
        with DataLoader(
            packed_streams(corpus), **{**kw, "batch_size": 4}, rank=rank, world_size=2
        ) as r:
            r.load_state_dict(state)
            halves.append([snapshot(next(r)) for _ in range(5)])
    for k in range(5):
        for key in ("tokens", "mask", "segment_ids", "positions", "label"):
            np.testing.assert_array_equal(again[k][key], want[2 + k][key])
            np.testing.assert_array_equal(later[k][key], want[2 + k][key])
            np.testing.assert_array_equal(
                np.concatenate([halves[0][k][key], halves[1][k][key]]), want[2 + k][key]
            )


def test_loader_refusals(corpus: dict[str, Any]) -> None:
    streams = packed_streams(corpus)
    with pytest.raises(
        ArgumentTypeError, match=r"^pack must be a loaderx.packing.Packing, got dict$"
    ):
        DataLoader(streams, batch_size=8, pack={"seq_len": 8})
    with pytest.raises(InvalidArgumentError, match=r"docs \(2\) must divide the batch size \(7\)"):
        DataLoader(streams, batch_size=7, pack=PACK)
    with pytest.raises(InvalidArgumentError, match=r"^packed stream 'label' must be a Ragged"):
        DataLoader(streams, batch_size=8, pack=Packing(8, 1, streams="label"))
    with pytest.raises(InvalidArgumentError, match=r"^packed stream 'text' is not a stream"):
        DataLoader(streams, batch_size=8, pack=Packing(8, 1, streams="text"))
    with pytest.raises(SchemaError, match=r"^packed stream 'floats' has dtype <f4"):
        DataLoader({"floats": corpus["floats"]}, batch_size=8, pack=Packing(8, 1, streams="floats"))
    with pytest.raises(InvalidArgumentError, match=r"pad value 256 of packed stream 'mask'"):
        DataLoader(streams, batch_size=8, pack=Packing(8, 1, streams="mask", pad_id=256))
    with pytest.raises(
        InvalidArgumentError, match=r"^stream 'positions' has the name of a packing"
    ):
        DataLoader(
            {"tokens": corpus["tokens"], "positions": corpus["mask"]},
            batch_size=8,
            pack=Packing(8, 1),
        )


def test_packing_pickles_as_its_settings() -> None:
    p = Packing(
        seq_len=4,
        rows=3,
        docs=2,
        policy="best_fit",
        streams=("a", "b"),
        pad_id={"a": 7},
        cu_seqlens=True,
    )
    q = pickle.loads(pickle.dumps(p))
    assert q == p and q.streams == ("a", "b") and q.pad_id == {"a": 7}
    batch = {"a": DOCS[:2], "b": DOCS[:2]}
    for key in ("a", "b", "segment_ids", "positions", "cu_seqlens"):
        np.testing.assert_array_equal(q(batch)[key], p(batch)[key])


def test_a_batch_that_cannot_be_packed_raises_from_its_step(
    tmp_path: Path, corpus: dict[str, Any]
) -> None:
    with Ragged.create(tmp_path / "short", np.int32, 1, codec="raw") as w:
        w.append([doc(i)[: len(doc(i)) - (i == 3)] for i in range(N)])  # document 3 one short
    short = Ragged.open(tmp_path / "short")
    try:
        streams = {"tokens": corpus["tokens"], "short": short}
        pack = Packing(seq_len=8, rows=3, streams=("tokens", "short"))
        with DataLoader(streams, batch_size=8, mode="Sequential", pack=pack) as loader:
            with pytest.raises(
                InvalidArgumentError,
                match=r"^packing: document 3 has "
                rf"{len(doc(3)) - 1} elements in stream 'short' but ",
            ):
                next(loader)
            assert loader.step == 1  # consumed, as a failing transform
            assert next(loader)["tokens"].shape == (3, 8)
    finally:
        short.close()


def test_a_mixture_packs_and_keeps_the_dataset_of_every_document(corpus: dict[str, Any]) -> None:
    m = mix(
        {"a": ({"tokens": corpus["tokens"]}, 0.5), "b": ({"tokens": corpus["tokens"]}, 0.5)},
        min_positions=128,
    )
    with DataLoader(m, batch_size=8, mode="Sequential", pack=Packing(8, 3, docs=4)) as loader:
        batch = next(loader)
    assert batch["tokens"].shape == (6, 8) and batch["dataset"].tolist() == [0] * 8
    unit = [doc(i) for i in range(4)]
    np.testing.assert_array_equal(batch["tokens"][:3], numpy_pack(unit, 8, 3, "concat")["tokens"])


def test_to_torch_converts_a_packed_batch(corpus: dict[str, Any]) -> None:
    torch = pytest.importorskip("torch")
    from loaderx.torch import to_torch

    with DataLoader(packed_streams(corpus), batch_size=8, mode="Sequential", pack=PACK) as loader:
        batch = next(loader)
        t = to_torch(batch)
    assert t["tokens"].dtype == torch.int32 and tuple(t["tokens"].shape) == (12, 8)
    assert t["segment_ids"].dtype == torch.int32 and t["cu_seqlens"].dtype == torch.int32
    assert t["pack_counts"] == batch["pack_counts"]
    assert t["positions"].numpy().tolist() == batch["positions"].tolist()
