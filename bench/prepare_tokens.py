#!/usr/bin/env python3
"""Prepare the GPT-2 token workloads from real text (benchmark engineer).

Corpus: the kernel documentation text of the Debian package ``linux-doc-6.1``:
every ``Documentation/**/*.rst.gz`` and ``*.txt.gz`` file listed by ``dpkg -L``
(the reStructuredText sources and plain-text notes; the package's HTML pages
render the same sources, so they are not added twice), in sorted path order.

Tokeniser: GPT-2 BPE via tiktoken, built locally from ``gpt2.tiktoken``, which
ships inside the PyPI ``openai-whisper`` distribution (``whisper/assets/``).
We ``pip download --no-deps`` it once and extract that single file; whisper is
never installed (it pulls torch) and nothing is fetched at tokenisation time.

Outputs under bench/data/ (idempotent):

* ``tokens_dense.npy``: ``int32 (N, 512)``: all files' tokens, each file
  followed by ``<|endoftext|>`` (50256), concatenated and cut into 512-token
  blocks (the tail shorter than 512 is dropped). N is what the corpus gives,
  at most ``--blocks`` (200,000).
* ``tokens_ragged/{values,offsets,shapes}.npy``: ``int32`` records of 16..512
  tokens: each file's paragraphs (blank-line separated) are tokenised, short
  paragraphs are joined with the next ones of the same file until at least 16
  tokens, long ones are split every 512 tokens (a tail under 16 tokens is
  joined to the previous piece's file run or dropped if alone).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import DATA, save_npy_atomic, save_ragged

PACKAGE = "linux-doc-6.1"
BLOCK = 512
MIN_LEN, MAX_LEN = 16, 512
EOT = 50256
ASSET = "whisper/assets/gpt2.tiktoken"


def gpt2_file() -> Path:
    """Returns bench/data/gpt2.tiktoken, extracting it from the openai-whisper dist once."""
    out = DATA / "gpt2.tiktoken"
    if out.exists():
        return out
    dl = DATA / "dl"
    dl.mkdir(parents=True, exist_ok=True)
    dists = sorted(dl.glob("openai[-_]whisper-*"))
    if not dists:
        print("downloading the openai-whisper distribution (for its gpt2.tiktoken file only)")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation",
                        "-q", "-d", str(dl), "openai-whisper"], check=True)
        dists = sorted(dl.glob("openai[-_]whisper-*"))
    if not dists:
        raise SystemExit("pip download openai-whisper produced no file")
    dist = dists[-1]
    data: bytes | None = None
    if dist.suffix == ".whl":
        with zipfile.ZipFile(dist) as z:
            data = z.read(ASSET)
    else:
        with tarfile.open(dist) as t:
            for m in t.getmembers():
                if m.name.endswith("/" + ASSET):
                    f = t.extractfile(m)
                    data = f.read() if f else None
                    break
    if not data:
        raise SystemExit(f"{dist} has no {ASSET}")
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.rename(out)
    print(f"made {out} from {dist.name}")
    return out


def gpt2_encoding():  # -> tiktoken.Encoding
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext.openai_public import r50k_pat_str

    ranks = load_tiktoken_bpe(str(gpt2_file()))
    # GPT-2 and r50k_base share ranks, pattern and the single special token.
    return tiktoken.Encoding(name="gpt2-local", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT}, explicit_n_vocab=50257)


def corpus_files() -> list[str]:
    try:
        out = subprocess.run(["dpkg", "-L", PACKAGE], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"Debian package {PACKAGE} is not installed: run bench/setup.sh ({e})")
    return sorted(p for p in out.splitlines()
                  if "/Documentation/" in p and p.endswith((".rst.gz", ".txt.gz")) and Path(p).is_file())


_PARA = re.compile(r"\n\s*\n")


def ragged_pieces(paragraph_tokens: list[list[int]]) -> list[list[int]]:
    """Joins/splits one file's paragraphs into pieces of MIN_LEN..MAX_LEN tokens."""
    out: list[list[int]] = []
    cur: list[int] = []
    for toks in paragraph_tokens:
        cur.extend(toks)
        while len(cur) >= MAX_LEN:
            out.append(cur[:MAX_LEN])
            cur = cur[MAX_LEN:]
        if len(cur) >= MIN_LEN:
            out.append(cur)
            cur = []
    if cur:
        if out and len(out[-1]) + len(cur) <= MAX_LEN:
            out[-1] = out[-1] + cur
        elif len(cur) >= MIN_LEN:
            out.append(cur)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=200_000, help="at most this many dense blocks")
    ap.add_argument("--records", type=int, default=200_000, help="at most this many ragged records")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()

    DATA.mkdir(parents=True, exist_ok=True)
    info_path = DATA / "tokens_info.json"
    if not args.force and info_path.exists():
        info = json.loads(info_path.read_text())
        if (info.get("max_blocks"), info.get("max_records")) == (args.blocks, args.records) \
                and (DATA / "tokens_dense.npy").exists() and (DATA / "tokens_ragged" / "shapes.npy").exists():
            print(f"token data up to date in {DATA} ({info['dense_blocks']} blocks, "
                  f"{info['ragged_records']} ragged records); --force rebuilds")
            return 0

    enc = gpt2_encoding()
    files = corpus_files()
    stream: list[np.ndarray] = []
    pieces: list[np.ndarray] = []
    chars = 0
    for path in tqdm(files, desc=f"tokenise {PACKAGE}", unit="file"):
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            text = f.read()
        chars += len(text)
        paras = [p for p in _PARA.split(text) if p.strip()]
        if not paras:
            continue
        toks = enc.encode_ordinary_batch(paras, num_threads=2)
        flat = [t for p in toks for t in p]
        stream.append(np.asarray(flat + [EOT], dtype=np.int32))
        pieces.extend(np.asarray(p, dtype=np.int32) for p in ragged_pieces(toks))

    all_tokens = np.concatenate(stream)
    n_blocks = min(args.blocks, all_tokens.size // BLOCK)
    dense = np.ascontiguousarray(all_tokens[: n_blocks * BLOCK].reshape(n_blocks, BLOCK))
    save_npy_atomic(DATA / "tokens_dense.npy", dense)
    pieces = pieces[: args.records]
    save_ragged("tokens_ragged", pieces, np.dtype(np.int32))
    lens = np.array([p.size for p in pieces])
    info = {
        "package": PACKAGE, "files": len(files), "chars": chars, "tokens": int(all_tokens.size),
        "max_blocks": args.blocks, "max_records": args.records,
        "dense_blocks": int(n_blocks), "ragged_records": len(pieces),
        "ragged_len": {"min": int(lens.min()), "p10": int(np.percentile(lens, 10)),
                       "median": int(np.median(lens)), "mean": float(lens.mean()),
                       "p90": int(np.percentile(lens, 90)), "max": int(lens.max())},
        "ragged_tokens": int(lens.sum()),
    }
    info_path.write_text(json.dumps(info, indent=1))
    print(f"corpus: {len(files)} files of {PACKAGE}, {chars / 1e6:.1f} M characters, "
          f"{all_tokens.size / 1e6:.2f} M GPT-2 tokens")
    print(f"made {DATA / 'tokens_dense.npy'}: int32 ({n_blocks}, {BLOCK}) = {dense.nbytes / 2**20:.1f} MiB"
          + ("" if n_blocks == args.blocks else f" (the corpus gives {n_blocks}, fewer than {args.blocks})"))
    print(f"made {DATA / 'tokens_ragged'}/: {len(pieces)} int32 records of {lens.min()}..{lens.max()} tokens "
          f"(median {int(np.median(lens))}, mean {lens.mean():.1f}), {lens.sum() * 4 / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
