#!/usr/bin/env python3
"""Prepare the real-photo workloads (benchmark engineer).

Sources: every colour JPEG/PNG installed by the Debian packages
``plasma-workspace-wallpapers`` and ``visp-images-data`` (found with
``dpkg -L``), except the wallpapers' ``screenshot.*`` thumbnails, grayscale
files and visp's ``AprilTag/`` renderings (synthetic fiducial-marker scenes,
not photos); sources whose decoded pixels are identical (the wallpapers ship
one file under many resolution names) are kept once.

Outputs under bench/data/ (idempotent: reused when present and complete):

* ``vision_dense.npy``: ``uint8 (N, 3, 224, 224)`` CHW. Record ``v*S + s`` is
  variant ``v`` of source ``s``: the image resized so its short side is
  ``VARIANTS[v].short`` (Pillow, bilinear with antialias), a 224x224 crop at the
  relative anchor ``VARIANTS[v].ax, .ay`` (variant 0 = the usual resize-256 /
  centre-crop-224), mirrored horizontally when ``VARIANTS[v].flip``.
* ``vision_ragged/{values,offsets,shapes}.npy``: native-resolution ``uint8
  (3, H, W)`` records. Variant 0 is the whole photo, its longest side capped at
  ``RAGGED_CAP`` pixels (the wallpapers are up to 5120x2880); other variants are
  crops / downscales / mirror images of it (``RAGGED_VARIANTS``).
* ``vision_labels.npy``: ``int32 (N,)`` source index of each dense record.

Both workloads have ``TARGET`` records (default 2,500); there are only a few
hundred photos, so the variants make the additional records distinct.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import DATA, save_npy_atomic, save_ragged

PACKAGES = ("plasma-workspace-wallpapers", "visp-images-data")
TARGET = 2500
SIDE = 224
RAGGED_CAP = 1024  # longest side of a native-resolution record, pixels


@dataclass(frozen=True)
class DenseVariant:
    short: int   # short side after resize
    ax: float    # crop anchor in [0, 1] along x (0 = left, 0.5 = centre)
    ay: float
    flip: bool


def _dense_variants() -> tuple[DenseVariant, ...]:
    """Variant 0 is resize-256 / centre-crop; the rest a fixed pseudo-random order of
    short side (256..512), anchor (centre or a corner) and mirror combinations."""
    shorts = (256, 288, 320, 352, 384, 416, 448, 480, 512)
    anchors = ((0.5, 0.5), (0.0, 0.0), (1.0, 1.0), (0.0, 1.0), (1.0, 0.0))
    combos = [DenseVariant(sh, ax, ay, fl) for sh in shorts for ax, ay in anchors for fl in (False, True)]
    first = combos.pop(0)
    order = np.random.default_rng(20261130).permutation(len(combos))
    return (first, *(combos[i] for i in order))


VARIANTS = _dense_variants()


@dataclass(frozen=True)
class RaggedVariant:
    scale: float  # of the capped photo
    fw: float     # crop width / height as a fraction of the scaled photo
    fh: float
    ax: float
    ay: float
    flip: bool


def _ragged_variants(count: int = 48) -> tuple[RaggedVariant, ...]:
    """Variant 0 is the whole (capped) photo; the rest fixed pseudo-random crops,
    downscales and mirror images of it, all of different shapes."""
    rng = np.random.default_rng(1130)
    out = [RaggedVariant(1.0, 1.0, 1.0, 0.5, 0.5, False)]
    for _ in range(count - 1):
        out.append(RaggedVariant(float(rng.choice((1.0, 0.85, 0.7, 0.55, 0.4, 0.3))),
                                 float(rng.uniform(0.3, 1.0)), float(rng.uniform(0.3, 1.0)),
                                 float(rng.uniform()), float(rng.uniform()), bool(rng.integers(2))))
    return tuple(out)


RAGGED_VARIANTS = _ragged_variants()


def source_files() -> list[str]:
    files: list[str] = []
    for pkg in PACKAGES:
        try:
            out = subprocess.run(["dpkg", "-L", pkg], check=True, capture_output=True, text=True).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            raise SystemExit(f"Debian package {pkg} is not installed: run bench/setup.sh ({e})")
        for line in out.splitlines():
            low = line.lower()
            if (low.endswith((".jpg", ".jpeg", ".png")) and "/screenshot." not in low
                    and "/apriltag/" not in low and Path(line).is_file()):
                files.append(line)
    return sorted(files)


def load_sources(files: list[str]) -> tuple[list[Image.Image], list[str]]:
    """Decodes every colour source once, capped to RAGGED_CAP, dropping exact duplicates."""
    seen: set[bytes] = set()
    images, names = [], []
    for f in tqdm(files, desc="decode photos", unit="file"):
        im: Image.Image = Image.open(f)
        if im.mode in ("L", "LA", "1", "I", "I;16", "F"):
            continue  # grayscale: not part of the colour-photo workload
        im = im.convert("RGB")
        digest = hashlib.blake2b(im.tobytes(), digest_size=16).digest()
        if digest in seen:
            continue
        seen.add(digest)
        w, h = im.size
        if max(w, h) > RAGGED_CAP:
            s = RAGGED_CAP / max(w, h)
            im = im.resize((max(1, round(w * s)), max(1, round(h * s))), Image.Resampling.BILINEAR,
                           reducing_gap=3.0)
        images.append(im)
        names.append(f)
    return images, names


def _chw(im: Image.Image) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(im, dtype=np.uint8).transpose(2, 0, 1))


def dense_record(im: Image.Image, v: DenseVariant) -> np.ndarray:
    w, h = im.size
    s = v.short / min(w, h)
    nw, nh = max(SIDE, round(w * s)), max(SIDE, round(h * s))
    r = im.resize((nw, nh), Image.Resampling.BILINEAR)
    x0 = round((nw - SIDE) * v.ax)
    y0 = round((nh - SIDE) * v.ay)
    r = r.crop((x0, y0, x0 + SIDE, y0 + SIDE))
    if v.flip:
        r = r.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return _chw(r)


def ragged_record(im: Image.Image, v: RaggedVariant) -> np.ndarray:
    w, h = im.size
    if v.scale != 1.0:
        im = im.resize((max(16, round(w * v.scale)), max(16, round(h * v.scale))), Image.Resampling.BILINEAR)
        w, h = im.size
    cw, ch = max(16, round(w * v.fw)), max(16, round(h * v.fh))
    x0, y0 = round((w - cw) * v.ax), round((h - ch) * v.ay)
    im = im.crop((x0, y0, x0 + cw, y0 + ch))
    if v.flip:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return _chw(im)


def plan(n_sources: int, n_variants: int, target: int) -> list[tuple[int, int]]:
    """(variant, source) pairs, variant-major so every source appears before any repeats."""
    pairs = [(v, s) for v in range(n_variants) for s in range(n_sources)]
    if len(pairs) < target:
        raise SystemExit(f"only {len(pairs)} distinct variants available, {target} requested")
    return pairs[:target]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=TARGET)
    ap.add_argument("--force", action="store_true", help="rebuild even if outputs exist")
    args = ap.parse_args()

    DATA.mkdir(parents=True, exist_ok=True)
    dense_path = DATA / "vision_dense.npy"
    labels_path = DATA / "vision_labels.npy"
    ragged_dir = DATA / "vision_ragged"
    info_path = DATA / "vision_info.json"
    if not args.force and info_path.exists():
        info = json.loads(info_path.read_text())
        if info.get("records") == args.records and dense_path.exists() and (ragged_dir / "shapes.npy").exists():
            print(f"vision data up to date in {DATA} ({info['records']} records, "
                  f"{info['sources']} source photos); --force rebuilds")
            return 0

    images, names = load_sources(source_files())
    print(f"{len(images)} distinct colour photos from {', '.join(PACKAGES)}")

    pairs = plan(len(images), len(VARIANTS), args.records)
    dense = np.lib.format.open_memmap(DATA / ".vision_dense.npy.tmp", mode="w+", dtype=np.uint8,
                                      shape=(len(pairs), 3, SIDE, SIDE))
    labels = np.empty(len(pairs), dtype=np.int32)
    for k, (v, s) in enumerate(tqdm(pairs, desc="dense 3x224x224", unit="rec")):
        dense[k] = dense_record(images[s], VARIANTS[v])
        labels[k] = s
    dense.flush()
    del dense
    (DATA / ".vision_dense.npy.tmp").rename(dense_path)
    save_npy_atomic(labels_path, labels)

    rpairs = plan(len(images), len(RAGGED_VARIANTS), args.records)
    records = [ragged_record(images[s], RAGGED_VARIANTS[v])
               for v, s in tqdm(rpairs, desc="ragged native CHW", unit="rec")]
    save_ragged("vision_ragged", records, np.dtype(np.uint8))
    hs = np.array([r.shape[1] for r in records])
    ws = np.array([r.shape[2] for r in records])
    total = sum(r.nbytes for r in records)

    info = {
        "records": len(pairs), "sources": len(images), "packages": list(PACKAGES),
        "dense_bytes": len(pairs) * 3 * SIDE * SIDE,
        "ragged_bytes": int(total), "ragged_cap": RAGGED_CAP,
        "ragged_h": [int(hs.min()), int(np.median(hs)), int(hs.max())],
        "ragged_w": [int(ws.min()), int(np.median(ws)), int(ws.max())],
        "source_files": names,
    }
    info_path.write_text(json.dumps(info, indent=1))
    print(f"made {dense_path}: uint8 {len(pairs)}x3x{SIDE}x{SIDE} ({info['dense_bytes'] / 2**20:.1f} MiB)")
    print(f"made {ragged_dir}/: {len(records)} uint8 (3,H,W) records, H {hs.min()}..{hs.max()} "
          f"(median {int(np.median(hs))}), W {ws.min()}..{ws.max()} (median {int(np.median(ws))}), "
          f"{total / 2**20:.1f} MiB; longest side capped at {RAGGED_CAP}")
    print(f"made {labels_path}: int32 source index per dense record")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
