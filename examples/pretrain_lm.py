"""Language-model pretraining input, end to end (docs/guide.md, "Pretraining").

Two tokenised corpora ("web" and "books": Ragged int32 token documents) are
mixed on a schedule (80/20, then 50/50 from step --switch), packed into
dense (rows, seq_len) rows with segment ids and positions, and read by two
data-parallel ranks. A loss spike makes the job skip a range of steps; it
checkpoints, a weight change is appended for a future step, and the job
resumes from the checkpoint on ONE rank with the same global batch. The
script checks that the resumed run sees exactly the rows the two ranks
would have seen, step for step, and prints what it did.

    PYTHONPATH=python python examples/pretrain_lm.py --root /tmp/lm
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from loaderx import DataLoader, Ragged
from loaderx.mix import mix
from loaderx.packing import Packing

SEQ_LEN = 512
DOCS_PER_RANK = 16  # documents per rank and step: the global batch is 32
PACK = Packing(seq_len=SEQ_LEN, rows=4, docs=8, policy="best_fit", streams=("tokens",),
               cu_seqlens=True)


def write_corpus(path: Path, n: int, seed: int, vocab: int) -> None:
    """n token documents of 20..400 tokens (a stand-in for a tokenised corpus)."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(1, vocab, size=int(rng.integers(20, 400)), dtype=np.int32)
            for _ in range(n)]
    with Ragged.create(str(path), np.int32, ndim=1, codec="zstd") as w:
        w.append(docs)


def loader(root: Path, rank: int, world: int, schedule: list, state: dict | None = None
           ) -> DataLoader:
    streams = mix({"web": {"tokens": Ragged.open(str(root / "web"))},
                   "books": {"tokens": Ragged.open(str(root / "books"))}},
                  schedule=schedule)
    dl = DataLoader(streams, batch_size=DOCS_PER_RANK * 2 // world, mode="IID", seed=7,
                    rank=rank, world_size=world, pack=PACK)
    if state is not None:
        dl.load_state_dict(state)
    return dl


def rows_of(batches: list[dict]) -> np.ndarray:
    """The packed token rows of one step, ranks in order."""
    return np.concatenate([b["tokens"] for b in batches])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--switch", type=int, default=40)
    ap.add_argument("--spike", type=int, default=12)
    args = ap.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    for name, n, seed, vocab in (("web", 3000, 1, 50_000), ("books", 500, 2, 30_000)):
        if not (args.root / name).exists():
            write_corpus(args.root / name, n, seed, vocab)

    schedule = [(0, {"web": 0.8, "books": 0.2}), (args.switch, {"web": 0.5, "books": 0.5})]
    ranks = [loader(args.root, r, 2, schedule) for r in range(2)]
    checkpoint: dict | None = None
    seen: dict[int, np.ndarray] = {}
    padded = dropped = tokens = 0
    while ranks[0].step < args.steps:
        step = ranks[0].step
        batches = [next(dl) for dl in ranks]
        seen[step] = rows_of(batches)
        for b in batches:
            c = b["pack_counts"]
            padded, dropped, tokens = (padded + c["tokens_padded"], dropped + c["tokens_dropped"],
                                       tokens + c["tokens"])
        if step == args.spike:  # a loss spike: skip the next 5 data steps on every rank
            for dl in ranks:
                dl.skip(step + 1, step + 6)
        if step == args.steps // 2:
            checkpoint = ranks[0].state_dict()  # one dict for every rank
    # A weight change for a future step, appended while running.
    later = args.steps + 10
    for dl in ranks:
        dl.append_mix(later, {"web": 0.3, "books": 0.7})
    tail = {}
    while ranks[0].step < later + 5:
        step = ranks[0].step
        tail[step] = rows_of([next(dl) for dl in ranks])
    for dl in ranks:
        dl.close()

    # Resume from the checkpoint on one rank with the same global batch: the
    # state carries the schedule and the skipped range.
    assert checkpoint is not None
    one = loader(args.root, 0, 1, schedule, checkpoint)
    one.append_mix(later, {"web": 0.3, "books": 0.7})
    resumed = 0
    while one.step < later + 5:
        step = one.step
        want = seen.get(step, tail.get(step))
        got = next(one)["tokens"]
        assert want is not None and np.array_equal(got, want), f"step {step} differs"
        resumed += 1
    one.close()
    skipped = [s for s in range(args.spike + 1, args.spike + 6) if s in seen]
    assert not skipped, f"skipped steps were delivered: {skipped}"
    print(f"packed {tokens} tokens into rows of {SEQ_LEN}: "
          f"{padded / (padded + tokens - dropped):.1%} padding, {dropped / tokens:.1%} dropped")
    print(f"skipped steps {args.spike + 1}..{args.spike + 5} after the spike at {args.spike}")
    print(f"resumed on 1 rank at step {checkpoint['step']}: {resumed} steps identical to 2 ranks")
    print(f"schedule: {[s for s, _ in one.mixture.schedule]}")


if __name__ == "__main__":
    main()
