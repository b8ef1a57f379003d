"""Frames of protocol 1.3 for the hand-written clients of the tests.

The per-batch messages (``batch``, ``release``, ``consumed``) are fixed
little-endian binary frames (``0xc1``, a type byte, the fields:
docs/protocol.md "Binary frames"); every other message is a msgpack map. A
message is a dict with its type in ``"t"``, as in the msgpack maps, so the
tests read the same either way; a ``batch``'s ``streams`` are dicts of the
five layout fields.

Used by test_daemon.py, security_attacker.py and tests/fuzz/make_seeds.py
(the seed corpus): one Python copy of the layout, checked against the C++
codec by the tests that send these frames to a real loaderxd.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

MARK = 0xC1  # msgpack's "never used" byte: no msgpack frame starts with it
BATCH, RELEASE, CONSUMED = 1, 2, 3  # the type byte

# After the mark and the type byte.
_BATCH_HEADER = struct.Struct("<QQIQQQQB")  # gen step slot seq offset batch_size total_bytes count
_BATCH_STREAM = struct.Struct("<BQQQQ")  # kind values_offset values_bytes shapes_offset offsets_offset
_RELEASE = struct.Struct("<IQ")  # slot seq
_CONSUMED = struct.Struct("<QQB")  # gen step waiting
_BATCH_FIELDS = ("gen", "step", "slot", "seq", "offset", "batch_size", "total_bytes")
_STREAM_FIELDS = ("kind", "values_offset", "values_bytes", "shapes_offset", "offsets_offset")
assert 2 + _BATCH_HEADER.size == 55 and _BATCH_STREAM.size == 33
assert 2 + _RELEASE.size == 14 and 2 + _CONSUMED.size == 19


def pack(msg: dict[str, Any]) -> bytes:
    """The frame of ``msg``: binary for the three per-batch types, msgpack
    otherwise. Values are packed as given (``waiting=2`` makes a frame the
    daemon must refuse)."""
    t = msg["t"]
    if t == "batch":
        streams = msg.get("streams", [])
        head = _BATCH_HEADER.pack(*(msg[k] for k in _BATCH_FIELDS), len(streams))
        return bytes([MARK, BATCH]) + head + b"".join(
            _BATCH_STREAM.pack(*(s[k] for k in _STREAM_FIELDS)) for s in streams)
    if t == "release":
        return bytes([MARK, RELEASE]) + _RELEASE.pack(msg["slot"], msg["seq"])
    if t == "consumed":
        return bytes([MARK, CONSUMED]) + _CONSUMED.pack(msg["gen"], msg["step"],
                                                        int(msg.get("waiting", 0)))
    return msgpack.packb(msg)


def unpack(frame: bytes) -> dict[str, Any]:
    """The message of ``frame`` (either encoding); ValueError if it is not
    one of the shapes above."""
    if not frame or frame[0] != MARK:
        msg = msgpack.unpackb(frame)
        if not isinstance(msg, dict):
            raise ValueError(f"not a msgpack map: {msg!r}")
        return msg
    kind = frame[1] if len(frame) > 1 else None
    body = frame[2:]
    if kind == BATCH and len(body) >= _BATCH_HEADER.size:
        *fields, count = _BATCH_HEADER.unpack_from(body)
        if len(body) == _BATCH_HEADER.size + count * _BATCH_STREAM.size:
            streams = [dict(zip(_STREAM_FIELDS, _BATCH_STREAM.unpack_from(
                body, _BATCH_HEADER.size + i * _BATCH_STREAM.size), strict=True))
                for i in range(count)]
            return {"t": "batch", **dict(zip(_BATCH_FIELDS, fields, strict=True)), "streams": streams}
    if kind == RELEASE and len(body) == _RELEASE.size:
        return {"t": "release", **dict(zip(("slot", "seq"), _RELEASE.unpack(body), strict=True))}
    if kind == CONSUMED and len(body) == _CONSUMED.size:
        gen, step, waiting = _CONSUMED.unpack(body)
        return {"t": "consumed", "gen": gen, "step": step, "waiting": waiting}
    raise ValueError(f"malformed binary frame {frame.hex()}")
