"""The store codecs, defined without NumPy so the CLI's parser can name them."""

from __future__ import annotations

from typing import Literal, get_args

Codec = Literal["raw", "zstd", "zstd_dict"]
CODECS: tuple[str, ...] = get_args(Codec)
