"""Scenarios of the 2.5.4 compatibility suite, run the same in both interpreters.

This file is executed as a script, once by the reference venv's Python (the
``loaderx==2.5.4`` wheel) and once by ours (``PYTHONPATH=python``)::

    python scenarios.py OUT.json [NAME_GLOB ...]

Each scenario is a function run in a fresh empty working directory; its return
value (or the exception it raises) is normalised by :func:`outcome` and written
to ``OUT.json`` as ``{name: outcome}``. Only the public API both packages share
is used, the way a user of the wheel calls it. Values that are random in both
but by different algorithms (sampler draws, dictionary bytes) are reduced to
the properties both promise (a permutation, a length, a dtype) inside the
scenario, so what is compared is what a user can rely on.

``test_compat.py`` compares the two files; docs/compat.md lists the
divergences that are on purpose.
"""

from __future__ import annotations

import fnmatch
import hashlib
import inspect
import json
import os
import pathlib
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

SCENARIOS: dict[str, Callable[[], Any]] = {}


def scenario(name: str) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    def add(f: Callable[[], Any]) -> Callable[[], Any]:
        assert name not in SCENARIOS, name
        SCENARIOS[name] = f
        return f
    return add


# -- normalisation -----------------------------------------------------------------


def builtin_classes(exc: BaseException) -> list[str]:
    """The builtin exception classes in ``exc``'s MRO, most specific first."""
    return [c.__name__ for c in type(exc).__mro__
            if c.__module__ == "builtins" and c not in (BaseException, Exception, object)]


def norm(v: Any) -> Any:
    """A JSON value describing ``v`` by type, dtype, shape, bytes and writeability."""
    if isinstance(v, np.ndarray):
        return {"t": "ndarray", "dtype": v.dtype.str, "shape": list(v.shape),
                "writeable": bool(v.flags.writeable),
                "bytes": hashlib.sha1(np.ascontiguousarray(v).tobytes()).hexdigest()[:16]}
    if isinstance(v, np.generic):
        return {"t": "np." + type(v).__name__, "dtype": v.dtype.str,
                "bytes": hashlib.sha1(v.tobytes()).hexdigest()[:16]}
    if isinstance(v, np.dtype):
        return {"t": "dtype", "str": v.str, "descr": str(v)}
    if isinstance(v, (list, tuple)):
        return {"t": type(v).__name__, "items": [norm(x) for x in v]}
    if isinstance(v, dict):
        return {"t": "dict", "items": {str(k): norm(x) for k, x in v.items()}}
    if isinstance(v, pathlib.PurePath):
        return {"t": "Path", "v": str(v)}
    if isinstance(v, bytes):
        return {"t": "bytes", "len": len(v)}
    if v is None or isinstance(v, (bool, int, float, str)):
        return {"t": type(v).__name__, "v": v}
    return {"t": "object", "type": type(v).__name__}


def outcome(f: Callable[[], Any]) -> dict[str, Any]:
    try:
        v = f()
    except Exception as e:  # noqa: BLE001 - the outcome is what is compared
        return {"raises": builtin_classes(e), "type": type(e).__name__, "msg": str(e)[:300],
                "where": traceback.format_exc(limit=-2)[-600:]}
    return {"ok": norm(v)}


# -- helpers (plain public API) ------------------------------------------------------


def _mods() -> Any:
    from loaderx import dataloader, utils, zrecord, zsampler
    return zrecord, zsampler, dataloader, utils


def _dense(path: str, data: np.ndarray, codec: str = "raw", **kw: Any) -> None:
    from loaderx.zrecord import Dense
    with Dense.create(path, data.dtype, data.shape[1:], codec=codec, **kw) as ds:
        ds.append(data)


def _ragged(path: str, records: list[np.ndarray], dtype: Any, ndim: int, codec: str = "raw",
            **kw: Any) -> None:
    from loaderx.zrecord import Ragged
    with Ragged.create(path, dtype, ndim, codec=codec, **kw) as rs:
        rs.append(records)


def _read_dense(path: str, key: Any) -> Any:
    from loaderx.zrecord import Dense
    with Dense.open(path) as ds:
        return ds[key]


def _data(dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    if dt.kind == "U":
        words = np.array(["", "a", "bc", "déf", "ghij"], dtype=dt)
        return words[np.arange(n) % len(words)].reshape(shape)
    if dt.kind == "b":
        return (np.arange(n) % 3 == 0).reshape(shape).astype(dt)
    if dt.kind in "mM":
        return np.arange(n, dtype=np.int64).view(dt.newbyteorder("=")).astype(dt).reshape(shape)
    if dt.kind == "f" and dt.itemsize == 2:
        return np.linspace(-3, 3, n).astype(dt).reshape(shape)
    raw = (np.arange(n * dt.itemsize, dtype=np.uint64) * 2654435761 % 251).astype(np.uint8)
    if dt.kind == "f" or dt.kind == "c":  # finite values only, so bytes compare stably
        return (np.arange(n) * 0.5 - 3).astype(dt).reshape(shape)
    return raw.view(dt).reshape(shape)


# -- stores: dtypes x codecs -----------------------------------------------------------

DTYPES = ["|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f4", "<f8", "<c8",
          "<c16", "|b1", "<M8[s]", "<m8[ms]", ">i2", ">i4", ">u8", ">f4", ">f8", ">c16", ">M8[ns]",
          "|S1", "|S7", "<U1", "<U5", ">U3", "|V1", "|V6"]
CODECS = ["raw", "zstd"]


def _dt_name(dt: str) -> str:
    return dt.replace("<", "le").replace(">", "be").replace("|", "").replace("[", "_").replace("]", "")


for _dt in DTYPES:
    for _codec in CODECS:
        def _dense_roundtrip(dt: str = _dt, codec: str = _codec) -> Any:
            from loaderx.zrecord import Dense
            data = _data(dt, (5, 2, 3))
            with Dense.create("s", dt, (2, 3), codec=codec) as ds:
                ds.append(data)
                schema = (ds.dtype, ds.item_shape, ds.ndim, ds.codec, len(ds))
            with Dense.open("s") as ds:
                return [schema, ds.dtype, ds.item_shape, ds.ndim, len(ds), ds[0], ds[4],
                        ds[1:3], ds[[4, 0, 4]], ds[:], list(ds)]
        scenario(f"dense.dtype.{_dt_name(_dt)}.{_codec}")(_dense_roundtrip)

    def _ragged_roundtrip(dt: str = _dt) -> Any:
        from loaderx.zrecord import Ragged
        recs = [_data(dt, (k + 1, 2)) for k in range(4)]
        with Ragged.create("r", dt, 2, codec="zstd") as rs:
            rs.append(recs)
            schema = (rs.dtype, rs.ndim, rs.codec, len(rs))
        with Ragged.open("r") as rs:
            return [schema, rs.dtype, rs.ndim, len(rs), rs[0], rs[3], rs[1:3], rs[[3, 0]],
                    rs[:], list(rs)]
    scenario(f"ragged.dtype.{_dt_name(_dt)}")(_ragged_roundtrip)

    def _scalar_records(dt: str = _dt) -> Any:
        from loaderx.zrecord import Dense
        data = _data(dt, (4,))
        with Dense.create("s", dt, (), codec="raw") as ds:
            ds.append(data)
        with Dense.open("s") as ds:
            return [ds[0], ds[3], ds[np.int64(2)], ds[:2], list(ds)]
    scenario(f"dense.scalar_records.{_dt_name(_dt)}")(_scalar_records)

for _dt in ["<i4", "<f8", "|b1", ">i4", "|S3"]:
    def _append_0d(dt: str = _dt) -> Any:
        from loaderx.zrecord import Dense
        with Dense.create("s", dt, (), codec="raw") as ds:
            ds.append(_data(dt, (1,)).reshape(()))
            ds.append(_data(dt, (3,)))
        with Dense.open("s") as ds:
            return [len(ds), ds[:]]
    scenario(f"dense.append_0d.{_dt_name(_dt)}")(_append_0d)

BAD_DTYPES = {
    "structured": [("a", "<i4"), ("b", "<f4")],
    "subarray": ("<i4", (2,)),
    "object": object,
    "V0": "V0",
    "S0": "S0",
    "U0": "U0",
    "not_a_dtype": "notadtype",
}
for _name, _bad in BAD_DTYPES.items():
    def _bad_dense(bad: Any = _bad) -> Any:
        from loaderx.zrecord import Dense
        Dense.create("s", bad, (2,), codec="raw")

    def _bad_ragged(bad: Any = _bad) -> Any:
        from loaderx.zrecord import Ragged
        Ragged.create("r", bad, 1, codec="raw")
    scenario(f"dense.bad_dtype.{_name}")(_bad_dense)
    scenario(f"ragged.bad_dtype.{_name}")(_bad_ragged)


@scenario("dense.bad_dtype.metadata")
def _bad_meta() -> Any:
    from loaderx.zrecord import Dense
    Dense.create("s", np.dtype("<i4", metadata={"k": 1}), (2,), codec="raw")


@scenario("dense.dtype_none_is_float64")
def _dtype_none() -> Any:
    from loaderx.zrecord import Dense
    with Dense.create("s", None, (2,), codec="raw") as ds:
        ds.append(np.zeros((3, 2)))
        d = ds.dtype
    with Dense.open("s") as ds:
        return [d, ds.dtype, ds[:]]


@scenario("ragged.dtype_none_is_float64")
def _rdtype_none() -> Any:
    from loaderx.zrecord import Ragged
    with Ragged.create("r", None, 1, codec="raw") as rs:
        rs.append([np.zeros(3), np.ones(1)])
    with Ragged.open("r") as rs:
        return [rs.dtype, rs[:]]


for _spelling in ["int32", "i4", "<i4", "float32", "uint8", "bool", "S4", "U2", ">f8"]:
    def _dtype_spelling(sp: str = _spelling) -> Any:
        from loaderx.zrecord import Dense
        dt = np.dtype(sp)
        with Dense.create("s", sp, (2,), codec="raw") as ds:
            ds.append(_data(dt, (2, 2)))
        with Dense.open("s") as ds:
            return [ds.dtype, ds[:]]
    scenario(f"dense.dtype_spelling.{_spelling.replace('<', 'le').replace('>', 'be')}")(_dtype_spelling)

    def _dtype_type(sp: str = _spelling) -> Any:
        from loaderx.zrecord import Dense
        dt = np.dtype(sp)
        with Dense.create("s", dt.type if dt.kind not in "SU" else dt, (2,), codec="raw") as ds:
            return ds.dtype
    scenario(f"dense.dtype_object.{_spelling.replace('<', 'le').replace('>', 'be')}")(_dtype_type)


# -- shapes and ranks -------------------------------------------------------------------

for _shape in [(), (1,), (3,), (2, 3), (1, 1, 1, 1), (2, 0), (0,), (1,) * 31, (1,) * 32,
               (1,) * 33, (1,) * 63, (1,) * 64, (1,) * 65]:
    def _shape_case(shape: tuple[int, ...] = _shape) -> Any:
        from loaderx.zrecord import Dense
        data = np.ones((2,) + shape, np.uint8)
        with Dense.create("s", np.uint8, shape, codec="zstd") as ds:
            ds.append(data)
            s = (ds.item_shape, ds.ndim)
        with Dense.open("s") as ds:
            return [s, ds.item_shape, ds.ndim, ds[:], ds[1]]
    scenario(f"dense.item_shape.rank{len(_shape)}.{'x'.join(map(str, _shape)) if len(_shape) < 5 else 'ones'}")(
        _shape_case)

for _form_name, _form in {"list": [2, 3], "tuple": (2, 3), "ndarray": np.array([2, 3]),
                          "np_ints": (np.int64(2), np.uint8(3)), "int": 3, "float": (2.0, 3),
                          "bool_dim": (True, 2), "negative": (-1, 2), "none": None,
                          "str": "ab", "nested": ((2,), 3), "range": range(1, 3)}.items():
    def _item_shape_form(form: Any = _form) -> Any:
        from loaderx.zrecord import Dense
        ds = Dense.create("s", np.uint8, form, codec="raw")
        try:
            return [ds.item_shape, ds.ndim]
        finally:
            ds.close()
    scenario(f"dense.item_shape_form.{_form_name}")(_item_shape_form)

for _ndim in [0, 1, 2, 3, 32, 33, 63, 64, 65, -1, True, 1.0, "2", None, np.int32(2)]:
    def _ndim_case(ndim: Any = _ndim) -> Any:
        from loaderx.zrecord import Ragged
        rs = Ragged.create("r", np.uint8, ndim, codec="raw")
        try:
            return [rs.ndim]
        finally:
            rs.close()
    scenario(f"ragged.ndim.{type(_ndim).__name__}_{_ndim!r}")(_ndim_case)


@scenario("ragged.ndim64_roundtrip")
def _ragged64() -> Any:
    from loaderx.zrecord import Ragged
    _ragged("r", [np.ones((1,) * 63 + (k + 1,), np.int16) for k in range(3)], np.int16, 64)
    with Ragged.open("r") as rs:
        return [rs.ndim, rs[2], rs[:]]


# -- create arguments ---------------------------------------------------------------------

for _kw_name, _kw in {
    "codec_raw": {"codec": "raw"}, "codec_zstd": {"codec": "zstd"},
    "codec_unknown": {"codec": "lz4"}, "codec_none": {"codec": None}, "codec_upper": {"codec": "ZSTD"},
    "codec_missing": {},
    "zstd_dict_no_dict": {"codec": "zstd_dict"},
    "zstd_dict_empty": {"codec": "zstd_dict", "dict_bytes": b""},
    "zstd_dict_raw_content": {"codec": "zstd_dict", "dict_bytes": b"hello world"},
    "zstd_dict_one_byte": {"codec": "zstd_dict", "dict_bytes": b"x"},
    "zstd_dict_bytearray": {"codec": "zstd_dict", "dict_bytes": bytearray(b"some dictionary content")},
    "dict_with_raw": {"codec": "raw", "dict_bytes": b"abc"},
    "dict_with_zstd": {"codec": "zstd", "dict_bytes": b"abc"},
    "empty_dict_with_raw": {"codec": "raw", "dict_bytes": b""},
    "dict_none_raw": {"codec": "raw", "dict_bytes": None},
    "shards_1": {"codec": "raw", "data_shards": 1}, "shards_255": {"codec": "raw", "data_shards": 255},
    "shards_0": {"codec": "raw", "data_shards": 0}, "shards_256": {"codec": "raw", "data_shards": 256},
    "shards_neg": {"codec": "raw", "data_shards": -1}, "shards_float": {"codec": "raw", "data_shards": 2.0},
    "shards_bool": {"codec": "raw", "data_shards": True}, "shards_str": {"codec": "raw", "data_shards": "4"},
    "shards_np": {"codec": "raw", "data_shards": np.int8(3)},
    "unknown_kw": {"codec": "raw", "level": 3},
}.items():
    def _create_kw(kw: dict[str, Any] = _kw) -> Any:
        from loaderx.zrecord import Dense, Ragged
        out = []
        with Dense.create("s", np.uint8, (8,), **kw) as ds:
            out += [ds.codec, ds.data_shards, ds.has_dict()]
            ds.append(np.tile(np.arange(8, dtype=np.uint8), (20, 1)))
        with Dense.open("s") as ds:
            out += [ds.codec, ds.data_shards, ds.has_dict(), ds[:]]
        with Ragged.create("r", np.uint8, 1, **kw) as rs:
            rs.append([np.arange(k + 1, dtype=np.uint8) for k in range(20)])
        with Ragged.open("r") as rs:
            out += [rs.codec, rs.data_shards, rs.has_dict(), rs[:]]
        return out
    scenario(f"create.kw.{_kw_name}")(_create_kw)


@scenario("create.positional_codec")
def _pos_codec() -> Any:
    from loaderx.zrecord import Dense
    Dense.create("s", np.uint8, (2,), "raw")  # codec is keyword-only in the wheel


@scenario("create.keywords_by_name")
def _by_name() -> Any:
    from loaderx.zrecord import Dense, Ragged
    with Dense.create(path="s", dtype=np.int16, item_shape=(2,), codec="zstd", dict_bytes=None,
                      data_shards=2) as ds:
        ds.append(np.zeros((1, 2), np.int16))
    with Ragged.create(path="r", dtype=np.int16, ndim=1, codec="zstd", dict_bytes=None,
                       data_shards=2) as rs:
        rs.append([np.zeros(1, np.int16)])
    with Dense.open(path="s") as a, Ragged.open(path="r") as b:
        return [a[:], b[:]]


@scenario("create.pathlib_and_str_paths")
def _paths() -> Any:
    from loaderx.zrecord import Dense
    with Dense.create(pathlib.Path("a"), np.uint8, (), codec="raw") as ds:
        ds.append(np.arange(3, dtype=np.uint8))
        p1 = ds.path
    with Dense.open("a") as ds:
        return [p1, ds.path, type(ds.path).__name__, ds[:]]


@scenario("create.nested_parent_dirs")
def _nested() -> Any:
    _dense("x/y/z", np.arange(4, dtype=np.uint8).reshape(4, 1))
    return _read_dense("x/y/z", slice(None))


@scenario("create.over_existing_store")
def _over_store() -> Any:
    _dense("s", np.zeros((2, 2), np.uint8))
    _dense("s", np.zeros((2, 2), np.uint8))


@scenario("create.over_existing_file")
def _over_file() -> Any:
    pathlib.Path("f").write_bytes(b"x")
    _dense("f", np.zeros((2, 2), np.uint8))


@scenario("create.over_nonempty_dir")
def _over_dir() -> Any:
    os.mkdir("d")
    pathlib.Path("d/x").write_bytes(b"")
    _dense("d", np.zeros((2, 2), np.uint8))


@scenario("create.over_empty_dir")
def _over_empty() -> Any:
    os.mkdir("d")
    _dense("d", np.arange(4, dtype=np.uint8).reshape(2, 2))
    return _read_dense("d", slice(None))


@scenario("ragged.create.over_empty_dir")
def _rover_empty() -> Any:
    from loaderx.zrecord import Ragged
    os.mkdir("d")
    _ragged("d", [np.arange(3, dtype=np.uint8)], np.uint8, 1)
    with Ragged.open("d") as rs:
        return rs[:]


@scenario("create.dict_train_then_use")
def _dict_use() -> Any:
    from loaderx.utils import train_dict
    data = np.random.default_rng(1).integers(0, 20, (2000, 32), dtype=np.uint8)
    d = train_dict(data)
    _dense("s", data, codec="zstd_dict", dict_bytes=d)
    from loaderx.zrecord import Dense
    with Dense.open("s") as ds:
        return [type(d).__name__, ds.codec, ds.has_dict(), ds[:]]


# -- opening --------------------------------------------------------------------------------

@scenario("open.missing")
def _open_missing() -> Any:
    from loaderx.zrecord import Dense
    Dense.open("nope")


@scenario("open.empty_dir")
def _open_empty() -> Any:
    from loaderx.zrecord import Dense
    os.mkdir("d")
    Dense.open("d")


@scenario("ragged.open.empty_dir")
def _ropen_empty() -> Any:
    from loaderx.zrecord import Ragged
    os.mkdir("d")
    Ragged.open("d")


@scenario("open.a_file")
def _open_file() -> Any:
    from loaderx.zrecord import Dense
    pathlib.Path("f").write_bytes(b"not a store")
    Dense.open("f")


@scenario("open.dense_as_ragged")
def _dense_as_ragged() -> Any:
    from loaderx.zrecord import Ragged
    _dense("s", np.zeros((2, 2), np.uint8))
    Ragged.open("s")


@scenario("open.ragged_as_dense")
def _ragged_as_dense() -> Any:
    from loaderx.zrecord import Dense
    _ragged("r", [np.zeros(2, np.uint8)], np.uint8, 1)
    Dense.open("r")


@scenario("open.twice_same_store")
def _open_twice() -> Any:
    from loaderx.zrecord import Dense
    _dense("s", np.arange(6, dtype=np.int32).reshape(3, 2))
    with Dense.open("s") as a, Dense.open("s") as b:
        return [a[0], b[2]]


# -- index forms ------------------------------------------------------------------------------

INDEX_FORMS: dict[str, Callable[[], Any]] = {
    "int0": lambda: 0, "int_last": lambda: 5, "int_past_end": lambda: 6, "int_negative": lambda: -1,
    "int_huge": lambda: 2**63, "int_beyond_u64": lambda: 2**70,
    "np_int64": lambda: np.int64(3), "np_uint8": lambda: np.uint8(2), "np_int64_neg": lambda: np.int64(-2),
    "bool_true": lambda: True, "bool_false": lambda: False, "np_bool": lambda: np.bool_(True),
    "float": lambda: 1.0, "np_float": lambda: np.float32(1), "str": lambda: "a", "none": lambda: None,
    "slice_all": lambda: slice(None), "slice_1_4": lambda: slice(1, 4), "slice_step": lambda: slice(None, None, 2),
    "slice_neg": lambda: slice(-2, None), "slice_rev": lambda: slice(None, None, -1),
    "slice_empty": lambda: slice(3, 3), "slice_past": lambda: slice(4, 100),
    "tuple": lambda: (0, 5, 2), "list": lambda: [0, 5, 2], "list_dup": lambda: [1, 1, 1],
    "list_one": lambda: [4], "list_empty": list, "tuple_empty": lambda: (),
    "list_np_ints": lambda: [np.int32(1), np.uint64(2)], "list_neg": lambda: [0, -1],
    "list_past_end": lambda: [0, 6], "list_float": lambda: [0, 1.5], "list_str": lambda: ["a"],
    "list_2d": lambda: [[0, 1], [5, 4]], "list_ragged": lambda: [[0, 1], [2]],
    "list_bools_full": lambda: [True, False, True, False, False, True],
    "list_bools_short": lambda: [True, False],
    "list_bool_int_mix": lambda: [True, 1],
    "range": lambda: range(1, 4), "range_empty": lambda: range(0), "range_step": lambda: range(5, 0, -2),
    "arr_int64": lambda: np.array([3, 1], np.int64), "arr_uint64": lambda: np.array([3, 1], np.uint64),
    "arr_int8": lambda: np.array([3, 1], np.int8), "arr_uint16": lambda: np.array([5], np.uint16),
    "arr_0d": lambda: np.array(2), "arr_0d_bool": lambda: np.array(True),
    "arr_2d": lambda: np.array([[0, 1], [5, 4]]), "arr_3d": lambda: np.arange(6).reshape(1, 2, 3),
    "arr_noncontig": lambda: np.arange(6)[::2], "arr_neg": lambda: np.array([-1]),
    "arr_past_end": lambda: np.array([6]), "arr_float": lambda: np.array([1.0]),
    "arr_float_empty": lambda: np.array([], np.float64), "arr_int_empty": lambda: np.array([], np.int64),
    "arr_2d_empty": lambda: np.zeros((0, 3), np.int32), "arr_str_empty": lambda: np.array([], "U1"),
    "arr_obj": lambda: np.array([1, 2], object),
    "mask_full": lambda: np.array([True, False, True, False, False, True]),
    "mask_all_false": lambda: np.zeros(6, bool), "mask_short": lambda: np.array([True, False]),
    "mask_long": lambda: np.ones(7, bool), "mask_2d": lambda: np.ones((2, 3), bool),
    "mask_2d_full": lambda: np.ones((6, 1), bool),
    "dict": lambda: {0: 1}, "set": lambda: {0, 1},
}


def _index_stores() -> None:
    _dense("d", np.arange(12, dtype=np.int32).reshape(6, 2))
    _dense("s", np.arange(6, dtype=np.float32))
    _ragged("r", [np.arange(k + 1, dtype=np.int16) for k in range(6)], np.int16, 1)


for _iname, _ikey in INDEX_FORMS.items():
    for _kind in ("dense", "scalar", "ragged"):
        def _index_case(make: Callable[[], Any] = _ikey, kind: str = _kind) -> Any:
            from loaderx.zrecord import Dense, Ragged
            _index_stores()
            path = {"dense": "d", "scalar": "s", "ragged": "r"}[kind]
            with (Ragged if kind == "ragged" else Dense).open(path) as st:
                return st[make()]
        scenario(f"index.{_kind}.{_iname}")(_index_case)

    for _kind in ("dense", "ragged"):
        def _getitems_case(make: Callable[[], Any] = _ikey, kind: str = _kind) -> Any:
            from loaderx.zrecord import Dense, Ragged
            _index_stores()
            with (Ragged.open("r") if kind == "ragged" else Dense.open("d")) as st:
                return st.__getitems__(make())
        scenario(f"getitems.{_kind}.{_iname}")(_getitems_case)


@scenario("index.empty_store")
def _empty_store() -> Any:
    from loaderx.zrecord import Dense
    with Dense.create("e", np.int32, (2,), codec="raw"):
        pass
    with Dense.open("e") as ds:
        out: list[Any] = [len(ds), ds[:], ds[[]], list(ds)]
        try:
            ds[0]
        except Exception as e:  # noqa: BLE001
            out.append(builtin_classes(e))
        return out


@scenario("index.ragged_empty_store")
def _rempty_store() -> Any:
    from loaderx.zrecord import Ragged
    with Ragged.create("e", np.int32, 1, codec="raw"):
        pass
    with Ragged.open("e") as rs:
        return [len(rs), rs[:], rs[[]], list(rs)]


# -- append -------------------------------------------------------------------------------------

APPEND_DENSE: dict[str, Callable[[], Any]] = {
    "exact": lambda: np.zeros((3, 2), np.int32),
    "memmap_like_noncontig": lambda: np.zeros((3, 4), np.int32)[:, ::2],
    "fortran": lambda: np.asfortranarray(np.arange(6, dtype=np.int32).reshape(3, 2)),
    "wrong_dtype": lambda: np.zeros((3, 2), np.int64),
    "wrong_byteorder": lambda: np.zeros((3, 2), ">i4"),
    "wrong_shape": lambda: np.zeros((3, 3), np.int32),
    "one_record_no_batch_axis": lambda: np.zeros((2,), np.int32),
    "extra_axis": lambda: np.zeros((1, 3, 2), np.int32),
    "zero_records": lambda: np.zeros((0, 2), np.int32),
    "list": lambda: [[1, 2], [3, 4]],
    "bytes": lambda: b"\x00" * 8,
    "memoryview": lambda: memoryview(np.zeros((3, 2), np.int32)),
    "none": lambda: None,
    "int": lambda: 5,
    "0d": lambda: np.array(1, np.int32),
}
for _aname, _adata in APPEND_DENSE.items():
    def _append_case(make: Callable[[], Any] = _adata) -> Any:
        from loaderx.zrecord import Dense
        ds = Dense.create("s", np.int32, (2,), codec="zstd")
        try:
            ds.append(make())
            ds.append(np.ones((1, 2), np.int32))
        finally:
            ds.close()
        with Dense.open("s") as r:
            return [len(r), r[:]]
    scenario(f"dense.append.{_aname}")(_append_case)

APPEND_RAGGED: dict[str, Callable[[], Any]] = {
    "list": lambda: [np.arange(3, dtype=np.int32), np.arange(1, dtype=np.int32)],
    "tuple": lambda: (np.arange(3, dtype=np.int32),),
    "generator": lambda: (np.arange(k + 1, dtype=np.int32) for k in range(3)),
    "2d_array_rows": lambda: np.arange(6, dtype=np.int32).reshape(2, 3),
    "empty_list": list,
    "zero_length_record": lambda: [np.zeros(0, np.int32)],
    "wrong_dtype": lambda: [np.zeros(2, np.int64)],
    "wrong_ndim": lambda: [np.zeros((2, 2), np.int32)],
    "0d_record": lambda: [np.array(1, np.int32)],
    "list_of_lists": lambda: [[1, 2, 3]],
    "bytes": lambda: b"abc",
    "str": lambda: "abc",
    "int": lambda: 5,
    "none": lambda: None,
    "noncontig_record": lambda: [np.arange(6, dtype=np.int32)[::2]],
    "mixed_bad_second": lambda: [np.zeros(2, np.int32), np.zeros(2, np.float32)],
}
for _aname, _adata in APPEND_RAGGED.items():
    def _rappend_case(make: Callable[[], Any] = _adata) -> Any:
        from loaderx.zrecord import Ragged
        rs = Ragged.create("r", np.int32, 1, codec="zstd")
        try:
            rs.append(make())
            rs.append([np.ones(2, np.int32)])
        finally:
            rs.close()
        with Ragged.open("r") as r:
            return [len(r), r[:]]
    scenario(f"ragged.append.{_aname}")(_rappend_case)


@scenario("dense.append.many_calls_order")
def _many_appends() -> Any:
    from loaderx.zrecord import Dense
    with Dense.create("s", np.uint16, (3,), codec="zstd", data_shards=3) as ds:
        for k in range(7):
            ds.append(np.full((k + 1, 3), k, np.uint16))
        n = len(ds)
    with Dense.open("s") as r:
        return [n, len(r), r[:], r[27], r[::5]]


@scenario("ragged.append.shapes_every_axis")
def _ragged_shapes() -> Any:
    from loaderx.zrecord import Ragged
    recs = [np.arange(a * b, dtype=np.float32).reshape(a, b) for a, b in [(1, 4), (3, 1), (2, 2), (5, 3)]]
    _ragged("r", recs, np.float32, 2, codec="zstd")
    with Ragged.open("r") as rs:
        return [rs[:], [r.shape for r in rs], rs[np.array([3, 3, 0])]]


# -- lifecycle ------------------------------------------------------------------------------------

@scenario("life.builder_read")
def _builder_read() -> Any:
    from loaderx.zrecord import Dense
    with Dense.create("s", np.int32, (2,), codec="raw") as ds:
        ds.append(np.zeros((2, 2), np.int32))
        return ds[0]


@scenario("life.builder_getitems")
def _builder_getitems() -> Any:
    from loaderx.zrecord import Dense
    with Dense.create("s", np.int32, (2,), codec="raw") as ds:
        ds.append(np.zeros((2, 2), np.int32))
        return ds.__getitems__([0])


@scenario("life.builder_len")
def _builder_len() -> Any:
    from loaderx.zrecord import Dense, Ragged
    with Dense.create("s", np.int32, (2,), codec="raw") as ds, \
            Ragged.create("r", np.int32, 1, codec="raw") as rs:
        a = len(ds)
        ds.append(np.zeros((3, 2), np.int32))
        rs.append([np.zeros(1, np.int32)] * 4)
        return [a, len(ds), len(rs)]


@scenario("life.builder_schema_attrs")
def _builder_attrs() -> Any:
    from loaderx.zrecord import Dense, Ragged
    with Dense.create("s", "<u2", (4, 1), codec="zstd", data_shards=3) as ds, \
            Ragged.create("r", ">i8", 3, codec="raw", data_shards=1) as rs:
        return [ds.dtype, ds.item_shape, ds.ndim, ds.codec, ds.data_shards, ds.has_dict(),
                ds.path, rs.dtype, rs.ndim, rs.codec, rs.data_shards, rs.has_dict(), rs.path]


for _attr in ["nbytes", "stored_bytes", "item_shape", "ndim", "dtype", "codec", "data_shards", "path",
              "writable", "length", "verify", "has_dict", "__getitems__", "__iter__", "__len__",
              "__enter__", "close", "append", "open", "create"]:
    def _hasattr_case(attr: str = _attr) -> Any:
        from loaderx.zrecord import Dense, Ragged
        with Dense.create("s", np.int32, (2,), codec="raw") as ds, \
                Ragged.create("r", np.int32, 1, codec="raw") as rs:
            b = [hasattr(ds, attr), hasattr(rs, attr)]
        with Dense.open("s") as ds, Ragged.open("r") as rs:
            return b + [hasattr(ds, attr), hasattr(rs, attr)]
    scenario(f"life.hasattr.{_attr}")(_hasattr_case)


@scenario("life.reader_append")
def _reader_append() -> Any:
    from loaderx.zrecord import Dense
    _dense("s", np.zeros((2, 2), np.int32))
    with Dense.open("s") as ds:
        ds.append(np.zeros((1, 2), np.int32))


@scenario("life.ragged_reader_append")
def _rreader_append() -> Any:
    from loaderx.zrecord import Ragged
    _ragged("r", [np.zeros(2, np.int32)], np.int32, 1)
    with Ragged.open("r") as rs:
        rs.append([np.zeros(1, np.int32)])


@scenario("life.close_twice")
def _close_twice() -> Any:
    from loaderx.zrecord import Dense
    ds = Dense.create("s", np.int32, (2,), codec="raw")
    ds.append(np.zeros((1, 2), np.int32))
    ds.close()
    ds.close()
    r = Dense.open("s")
    r.close()
    r.close()
    return [len(Dense.open("s"))]


@scenario("life.len_after_close")
def _len_after_close() -> Any:
    from loaderx.zrecord import Dense
    _dense("s", np.zeros((3, 2), np.int32))
    r = Dense.open("s")
    r.close()
    return [len(r), r.dtype, r.item_shape, r.codec]


@scenario("life.read_after_close")
def _read_after_close() -> Any:
    from loaderx.zrecord import Dense
    _dense("s", np.zeros((3, 2), np.int32))
    r = Dense.open("s")
    r.close()
    return r[0]


@scenario("life.append_after_close")
def _append_after_close() -> Any:
    from loaderx.zrecord import Dense
    ds = Dense.create("s", np.int32, (2,), codec="raw")
    ds.close()
    ds.append(np.zeros((1, 2), np.int32))


@scenario("life.reopen_published")
def _reopen() -> Any:
    from loaderx.zrecord import Dense
    _dense("s", np.arange(4, dtype=np.int8).reshape(2, 2))
    out = []
    for _ in range(3):
        with Dense.open("s") as ds:
            out.append(ds[:])
    return out


@scenario("life.with_returns_self")
def _with_self() -> Any:
    from loaderx.zrecord import Dense
    b = Dense.create("s", np.int8, (), codec="raw")
    with b as x:
        same = x is b
        x.append(np.arange(2, dtype=np.int8))
    r = Dense.open("s")
    with r as y:
        return [same, y is r, y[:]]


@scenario("life.exception_in_with_publishes")
def _exc_in_with() -> Any:
    from loaderx.zrecord import Dense
    try:
        with Dense.create("s", np.int8, (), codec="raw") as ds:
            ds.append(np.arange(2, dtype=np.int8))
            raise KeyError("boom")
    except KeyError:
        pass
    return os.path.exists("s")


@scenario("life.unclosed_builder_publishes")
def _unclosed() -> Any:
    from loaderx.zrecord import Dense
    ds = Dense.create("s", np.int8, (), codec="raw")
    ds.append(np.arange(2, dtype=np.int8))
    del ds
    import gc
    gc.collect()
    return os.path.exists("s")


@scenario("life.empty_builder_publishes_empty_store")
def _empty_builder() -> Any:
    from loaderx.zrecord import Dense
    with Dense.create("s", np.int8, (3,), codec="zstd"):
        pass
    with Dense.open("s") as ds:
        return [len(ds), ds[:]]


@scenario("life.records_independent_of_store")
def _independent() -> Any:
    from loaderx.zrecord import Dense
    _dense("s", np.arange(6, dtype=np.int32).reshape(3, 2))
    ds = Dense.open("s")
    a, b = ds[0], ds[[0, 1]]
    ds.close()
    a = a.copy() if not a.flags.writeable else a
    return [a, b]


@scenario("life.read_results_writeable")
def _writeable() -> Any:
    from loaderx.zrecord import Dense, Ragged
    _dense("s", np.arange(6, dtype=np.int32).reshape(3, 2))
    _ragged("r", [np.arange(3, dtype=np.int32)] * 2, np.int32, 1)
    with Dense.open("s") as ds, Ragged.open("r") as rs:
        return [ds[0].flags.writeable, ds[:].flags.writeable, ds[[1]].flags.writeable,
                rs[0].flags.writeable, rs[:][1].flags.writeable]


@scenario("life.repr_and_len_types")
def _types() -> Any:
    from loaderx.zrecord import Dense
    _dense("s", np.zeros((3, 2), np.int32))
    with Dense.open("s") as ds:
        return [type(len(ds)).__name__, type(ds.ndim).__name__, type(ds.data_shards).__name__,
                type(ds.item_shape).__name__, type(ds.codec).__name__]


# -- Sampler --------------------------------------------------------------------------------------

@scenario("sampler.mode_constants")
def _modes() -> Any:
    from loaderx.zsampler import Sampler
    return [int(Sampler.Mode.SEQUENTIAL), int(Sampler.Mode.IID), int(Sampler.Mode.CYCLIC),
            Sampler.Mode.SEQUENTIAL == 0, Sampler.Mode.IID == 1, Sampler.Mode.CYCLIC == 2]


def _draws(s: Any, k: int) -> list[np.ndarray]:
    return [s.next().copy() for _ in range(k)]


def _props(batches: list[np.ndarray], n: int) -> dict[str, Any]:
    """What both samplers promise about a sequence of draws, not the draws themselves."""
    return {"dtype": batches[0].dtype.str, "shapes": [list(b.shape) for b in batches],
            "in_range": bool(all(((b >= 0) & (b < n)).all() for b in batches)),
            "distinct_each": [len(set(b.tolist())) == len(b) for b in batches]}


for _n, _b in [(10, 3), (10, 10), (10, 11), (5, 8), (1, 1), (1, 256), (7, 256), (1000, 256), (3, 1)]:
    def _seq_case(n: int = _n, b: int = _b) -> Any:
        from loaderx.zsampler import Sampler
        s = Sampler(n, b, Sampler.Mode.SEQUENTIAL)
        return _draws(s, 4)
    scenario(f"sampler.sequential.n{_n}_b{_b}")(_seq_case)

    def _cyclic_case(n: int = _n, b: int = _b) -> Any:
        from loaderx.zsampler import Sampler
        s = Sampler(n, b, Sampler.Mode.CYCLIC, seed=3)
        draws = _draws(s, 2 * (n // min(n, b)) + 1)
        per_cycle = n // min(n, b)
        cycle = np.concatenate(draws[:per_cycle])
        return [_props(draws, n), len(set(cycle.tolist())) == cycle.size]
    scenario(f"sampler.cyclic.n{_n}_b{_b}")(_cyclic_case)

    def _iid_case(n: int = _n, b: int = _b) -> Any:
        from loaderx.zsampler import Sampler
        s = Sampler(n, b, Sampler.Mode.IID, 7)
        p = _props(_draws(s, 3), n)
        del p["distinct_each"]  # with replacement
        return p
    scenario(f"sampler.iid.n{_n}_b{_b}")(_iid_case)


for _mode in (0, 1, 2):
    def _det_case(mode: int = _mode) -> Any:
        from loaderx.zsampler import Sampler
        a = _draws(Sampler(100, 8, mode, 5), 5)
        b = _draws(Sampler(100, 8, mode, 5), 5)
        c = _draws(Sampler(100, 8, mode, 6), 5)
        s = Sampler(100, 8, mode, 5)
        s.seek(3)
        d = s.next().copy()
        return [all((x == y).all() for x, y in zip(a, b)),
                mode == 0 or any((x != y).any() for x, y in zip(a, c)), bool((d == a[3]).all())]
    scenario(f"sampler.deterministic_and_seek.mode{_mode}")(_det_case)

    def _iter_case(mode: int = _mode) -> Any:
        from loaderx.zsampler import Sampler
        s = Sampler(50, 4, mode)
        it = iter(s)
        first = next(it).copy()
        s2 = Sampler(50, 4, mode)
        return [it is s, bool((first == s2.next()).all())]
    scenario(f"sampler.iter.mode{_mode}")(_iter_case)

    def _borrowed(mode: int = _mode) -> Any:
        from loaderx.zsampler import Sampler
        s = Sampler(50, 4, mode)
        a = s.next()
        b = s.next()
        return [a is b or np.shares_memory(a, b), a.flags.writeable, a.dtype.str]
    scenario(f"sampler.borrowed_buffer.mode{_mode}")(_borrowed)

for _args_name, _args in {
    "length0": ((0, 4, 1), {}), "batch0": ((10, 0, 1), {}), "mode3": ((10, 4, 3), {}),
    "mode_neg": ((10, 4, -1), {}), "seed_neg": ((10, 4, 1, -1), {}), "seed_max": ((10, 4, 1, 2**64 - 1), {}),
    "seed_over": ((10, 4, 1, 2**64), {}), "length_float": ((10.0, 4, 1), {}), "batch_float": ((10, 4.0, 1), {}),
    "mode_float": ((10, 4, 1.0), {}), "seed_float": ((10, 4, 1, 1.5), {}), "length_str": (("10", 4, 1), {}),
    "length_bool": ((True, 1, 1), {}), "batch_bool": ((10, True, 1), {}), "mode_bool": ((10, 4, True), {}),
    "seed_bool": ((10, 4, 1, False), {}), "np_ints": ((np.int64(10), np.uint8(4), np.int8(2), np.uint64(9)), {}),
    "keywords": ((), {"length": 10, "batch_size": 4, "mode": 1, "seed": 3}),
    "kw_n": ((), {"n": 10, "batch_size": 4, "mode": 1}),
    "missing_mode": ((10, 4), {}), "length_huge": ((2**64 - 1, 4, 1), {}), "length_over": ((2**64, 4, 1), {}),
    "mode_enum": ((10, 4, "iid"), {}), "too_many": ((10, 4, 1, 42, 0), {}),
}.items():
    def _sampler_args(a: tuple[Any, ...] = _args[0], kw: dict[str, Any] = _args[1]) -> Any:
        from loaderx.zsampler import Sampler
        s = Sampler(*a, **kw)
        b = s.next()
        return [b.dtype.str, list(b.shape)]
    scenario(f"sampler.args.{_args_name}")(_sampler_args)


for _step in [0, 5, 2**64 - 1, -1, 2**64, 1.0, True, "3", np.int64(4)]:
    def _seek_case(step: Any = _step) -> Any:
        from loaderx.zsampler import Sampler
        s = Sampler(10, 2, 0)
        s.seek(step)
        return [s.next().dtype.str]
    scenario(f"sampler.seek.{type(_step).__name__}_{_step!r}")(_seek_case)


@scenario("sampler.close_and_with")
def _sclose() -> Any:
    from loaderx.zsampler import Sampler
    with Sampler(10, 2, 1) as s:
        a = s.next().copy()
    s.close()
    s.close()
    t = Sampler(10, 2, 1)
    t.close()
    return [list(a.shape), a.dtype.str]


@scenario("sampler.next_after_close")
def _snext_closed() -> Any:
    from loaderx.zsampler import Sampler
    s = Sampler(10, 2, 1)
    s.close()
    return s.next()


@scenario("sampler.sequential_values")
def _seq_values() -> Any:
    from loaderx.zsampler import Sampler
    s = Sampler(7, 3, Sampler.Mode.SEQUENTIAL)
    return _draws(s, 5)


# -- DataLoader -----------------------------------------------------------------------------------

def _loader_stores(n: int = 20) -> Any:
    from loaderx.zrecord import Dense, Ragged
    _dense("x", np.arange(n * 3, dtype=np.float32).reshape(n, 3), codec="zstd")
    _dense("y", np.arange(n, dtype=np.int64))
    _ragged("t", [np.arange(k % 5 + 1, dtype=np.int32) for k in range(n)], np.int32, 1)
    return Dense.open("x"), Dense.open("y"), Ragged.open("t")


def _batch_props(batch: Any, n: int) -> Any:
    """A loader batch reduced to what both loaders promise (the order differs by algorithm)."""
    if not isinstance(batch, dict):
        return norm(batch)
    out: dict[str, Any] = {"keys": list(batch)}
    for k, v in batch.items():
        if isinstance(v, np.ndarray):
            out[k] = {"t": "ndarray", "dtype": v.dtype.str, "shape": list(v.shape),
                      "writeable": bool(v.flags.writeable), "contiguous": bool(v.flags.c_contiguous)}
        else:
            out[k] = {"t": type(v).__name__, "len": len(v),
                      "items": sorted({(r.dtype.str, r.ndim) for r in v})}
    if "y" in batch and "x" in batch:  # records line up across streams
        y = np.asarray(batch["y"])
        out["aligned"] = bool((batch["x"][:, 0] == y * 3).all()) and bool((y >= 0).all() and (y < n).all())
        if "t" in batch:
            out["aligned_ragged"] = all(len(r) == yy % 5 + 1 for r, yy in zip(batch["t"], y.tolist()))
    return out


@scenario("loader.signature")
def _lsig() -> Any:
    from loaderx.dataloader import DataLoader
    ps = list(inspect.signature(DataLoader).parameters.values())
    wheel = ["streams", "transform_workers", "batch_size", "prefetch_size", "mode", "seed", "transform"]
    out = []
    for p in ps[:len(wheel)]:
        d = p.default
        out.append([p.name, str(p.kind), "callable" if callable(d) else repr(int(d)) if isinstance(d, int) else repr(d)])
    out.append([p.name for p in ps[len(wheel):] if p.kind is not p.KEYWORD_ONLY])
    return out


@scenario("loader.default_transform_is_identity")
def _lident() -> Any:
    from loaderx.dataloader import DataLoader
    t = inspect.signature(DataLoader).parameters["transform"].default
    marker = {"a": 1}
    return t(marker) is marker


def _loader_case(args: tuple[Any, ...], kw: dict[str, Any], steps: int = 3, n: int = 20,
                 streams: str = "xy") -> Any:
    from loaderx.dataloader import DataLoader
    x, y, t = _loader_stores(n)
    m = {"x": x, "y": y, "t": t}
    try:
        loader = DataLoader({k: m[k] for k in streams}, *args, **kw)
        try:
            return [_batch_props(next(loader), n) for _ in range(steps)]
        finally:
            loader.close()
    finally:
        for s in (x, y, t):
            s.close()


for _lname, (_largs, _lkw) in {
    "defaults": ((), {}),
    "defaults_small_dataset": ((), {}),
    "positional_all": ((2, 4, 3, 0, 7, lambda b: b), {}),
    "positional_transform_workers": ((2,), {}),
    "kw_transform_workers": ((), {"transform_workers": 1}),
    "kw_prefetch_size": ((), {"prefetch_size": 1}),
    "kw_batch_size": ((), {"batch_size": 5}),
    "batch_equal_n": ((), {"batch_size": 20}),
    "batch_over_n_cyclic": ((), {"batch_size": 21}),
    "batch_over_n_sequential": ((), {"batch_size": 25, "mode": 0}),
    "batch_over_n_iid": ((), {"batch_size": 25, "mode": 1}),
    "mode0": ((), {"mode": 0, "batch_size": 4}), "mode1": ((), {"mode": 1, "batch_size": 4}),
    "mode2": ((), {"mode": 2, "batch_size": 4}),
    "mode_consts": ((), {"mode": 0, "batch_size": 3}),
    "seed": ((), {"seed": 123, "batch_size": 4}),
    "transform_kw": ((), {"transform": lambda b: ("n", len(b["y"])), "batch_size": 4}),
    "transform_returns_array": ((), {"transform": lambda b: b["x"] * 0, "batch_size": 4}),
    "transform_none": ((), {"transform": None, "batch_size": 4}),
    "transform_not_callable": ((), {"transform": 5}),
    "transform_workers_0": ((), {"transform_workers": 0}),
    "transform_workers_neg": ((), {"transform_workers": -1}),
    "transform_workers_float": ((), {"transform_workers": 2.0}),
    "transform_workers_bool": ((), {"transform_workers": True}),
    "prefetch_0": ((), {"prefetch_size": 0}),
    "prefetch_float": ((), {"prefetch_size": 1.5}),
    "prefetch_bool": ((), {"prefetch_size": True}),
    "batch_0": ((), {"batch_size": 0}),
    "batch_float": ((), {"batch_size": 2.5}),
    "batch_bool": ((), {"batch_size": True}),
    "mode_bad": ((), {"mode": 7}),
    "mode_float": ((), {"mode": 1.0}),
    "seed_neg": ((), {"seed": -1}),
    "seed_bool": ((), {"seed": True}),
    "unknown_kw": ((), {"workers": 2}),
    "too_many_positional": ((1, 2, 3, 0, 5, None, 7), {}),
}.items():
    def _lc(a: tuple[Any, ...] = _largs, kw: dict[str, Any] = _lkw, name: str = _lname) -> Any:
        return _loader_case(a, kw, n=300 if name == "defaults" else 20)
    scenario(f"loader.args.{_lname}")(_lc)


@scenario("loader.ragged_stream")
def _lragged() -> Any:
    return _loader_case((), {"batch_size": 6, "mode": 1}, streams="xyt")


@scenario("loader.ragged_stream_cyclic_default")
def _lragged2() -> Any:
    return _loader_case((), {}, streams="xyt")


@scenario("loader.sequential_exact_values")
def _lseq() -> Any:
    from loaderx.dataloader import DataLoader
    x, y, t = _loader_stores(10)
    with DataLoader({"y": y}, batch_size=4, mode=0) as loader:
        out = [next(loader)["y"].tolist() for _ in range(4)]
    for s in (x, y, t):
        s.close()
    return out


@scenario("loader.cyclic_covers_each_cycle")
def _lcyc() -> Any:
    from loaderx.dataloader import DataLoader
    x, y, t = _loader_stores(12)
    with DataLoader({"y": y}, batch_size=4) as loader:
        got = [next(loader)["y"].tolist() for _ in range(3)]
    for s in (x, y, t):
        s.close()
    return sorted(x for b in got for x in b)


@scenario("loader.cyclic_batch_over_n_is_permutation")
def _lcyc2() -> Any:
    from loaderx.dataloader import DataLoader
    x, y, t = _loader_stores(12)
    with DataLoader({"y": y}) as loader:
        got = [sorted(next(loader)["y"].tolist()) for _ in range(3)]
    for s in (x, y, t):
        s.close()
    return got


STREAM_FORMS: dict[str, Callable[[Any, Any], Any]] = {
    "dict": lambda x, y: {"x": x, "y": y},
    "list_of_pairs": lambda x, y: [("x", x), ("y", y)],
    "tuple_of_pairs": lambda x, y: (("x", x), ("y", y)),
    "generator_of_pairs": lambda x, y: ((k, v) for k, v in [("x", x), ("y", y)]),
    "dict_items": lambda x, y: {"x": x, "y": y}.items(),
    "mapping_proxy": lambda x, y: __import__("types").MappingProxyType({"x": x, "y": y}),
    "ordered_dict": lambda x, y: __import__("collections").OrderedDict([("y", y), ("x", x)]),
    "empty_dict": lambda x, y: {},
    "empty_list": lambda x, y: [],
    "a_store": lambda x, y: x,
    "none": lambda x, y: None,
    "int": lambda x, y: 5,
    "list_of_stores": lambda x, y: [x, y],
    "non_store_value": lambda x, y: {"x": x, "y": np.zeros(20)},
    "int_names": lambda x, y: {0: x, 1: y},
}
for _sname, _sform in STREAM_FORMS.items():
    def _stream_case(form: Callable[[Any, Any], Any] = _sform) -> Any:
        from loaderx.dataloader import DataLoader
        x, y, t = _loader_stores(20)
        try:
            loader = DataLoader(form(x, y), batch_size=4)
            try:
                return _batch_props(next(loader), 20)
            finally:
                loader.close()
        finally:
            for s in (x, y, t):
                s.close()
    scenario(f"loader.streams.{_sname}")(_stream_case)


@scenario("loader.streams.different_lengths")
def _ldiff() -> Any:
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Dense
    _dense("a", np.zeros((3, 1), np.uint8))
    _dense("b", np.zeros((4, 1), np.uint8))
    with Dense.open("a") as a, Dense.open("b") as b:
        DataLoader({"a": a, "b": b})


@scenario("loader.streams.builder")
def _lbuilder() -> Any:
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Dense
    with Dense.create("a", np.uint8, (1,), codec="raw") as a:
        a.append(np.zeros((3, 1), np.uint8))
        DataLoader({"a": a})


@scenario("loader.streams.empty_store")
def _lempty() -> Any:
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Dense
    with Dense.create("a", np.uint8, (1,), codec="raw"):
        pass
    with Dense.open("a") as a:
        DataLoader({"a": a})


@scenario("loader.len")
def _llen() -> Any:
    from loaderx.dataloader import DataLoader
    x, y, t = _loader_stores(20)
    # The loader is closed before its stores: the 2.5.4 wheel unmaps a closed
    # store under its own prefetch thread (a segfault about one run in five).
    try:
        with DataLoader({"y": y}, batch_size=2) as loader:
            return len(loader)
    finally:
        for s in (x, y, t):
            s.close()


@scenario("loader.iter_is_self_and_close_twice")
def _liter() -> Any:
    from loaderx.dataloader import DataLoader
    x, y, t = _loader_stores(20)
    loader = DataLoader({"y": y}, batch_size=2)
    r = [iter(loader) is loader]
    with loader as same:
        r.append(same is loader)
        next(loader)
    loader.close()
    loader.close()
    for s in (x, y, t):
        s.close()
    return r


@scenario("loader.next_after_close")
def _lnext_closed() -> Any:
    from loaderx.dataloader import DataLoader
    x, y, t = _loader_stores(20)
    loader = DataLoader({"y": y}, batch_size=2)
    loader.close()
    try:
        return next(loader)
    finally:
        for s in (x, y, t):
            s.close()


@scenario("loader.transform_error_raised")
def _lterr() -> Any:
    from loaderx.dataloader import DataLoader
    x, y, t = _loader_stores(20)

    def bad(b: Any) -> Any:
        raise KeyError("in transform")
    loader = DataLoader({"y": y}, batch_size=2, transform=bad)
    try:
        return next(loader)
    finally:
        loader.close()
        for s in (x, y, t):
            s.close()


@scenario("loader.transform_sees_raw_batch")
def _ltraw() -> Any:
    from loaderx.dataloader import DataLoader
    x, y, t = _loader_stores(20)
    seen: list[Any] = []

    def f(b: Any) -> Any:
        seen.append(_batch_props(b, 20))
        return "done"
    with DataLoader({"x": x, "y": y, "t": t}, 1, 4, transform=f) as loader:
        v = next(loader)
    for s in (x, y, t):
        s.close()
    return [v, seen[0]]


# -- train_dict -----------------------------------------------------------------------------------

def _dict_props(d: Any) -> Any:
    """A dictionary reduced to its type and usability (its bytes differ by trainer)."""
    from loaderx.zrecord import Dense
    data = np.tile(np.arange(64, dtype=np.uint8), (50, 1))
    _dense("use", data, codec="zstd_dict", dict_bytes=d)
    with Dense.open("use") as ds:
        ok = bool((ds[:] == data).all())
    return [type(d).__name__, len(d) > 0, ok]


TRAIN_SOURCES: dict[str, Callable[[], Any]] = {
    "array_large": lambda: np.random.default_rng(0).integers(0, 30, (4000, 48), dtype=np.uint8),
    "array_int32": lambda: np.random.default_rng(0).integers(0, 30, (3000, 16), dtype=np.int32),
    "array_tiny": lambda: np.arange(3, dtype=np.int32),
    "array_1d_large": lambda: np.arange(100000, dtype=np.int32),
    "array_bytes_S": lambda: np.array([b"abc", b"de", b"fghij"] * 2000, dtype="S5"),
    "array_text_U": lambda: np.array(["abc", "de"] * 2000, dtype="U5"),
    "array_structured": lambda: np.zeros(4000, dtype=[("a", "<i4"), ("b", "<f4")]),
    "array_big_endian": lambda: np.arange(50000, dtype=">i4"),
    "array_empty": lambda: np.zeros((0, 4), np.int32),
    "array_object": lambda: np.array([1, "a"], dtype=object),
    "list_few_small": lambda: [np.arange(5, dtype=np.int32)] * 3,
    "list_one_record": lambda: [np.arange(2, dtype=np.int64)],
    "list_many": lambda: [np.random.default_rng(k).integers(0, 9, 40, dtype=np.uint8) for k in range(3000)],
    "list_empty": list,
    "generator": lambda: (np.full(64, k % 7, np.uint8) for k in range(3000)),
    "python_bytes": lambda: b"abc" * 1000,
    "python_str": lambda: "text",
    "python_lists": lambda: [[1, 2, 3]] * 20,
    "python_int": lambda: 42,
    "none": lambda: None,
}
for _tname, _tsrc in TRAIN_SOURCES.items():
    def _train_case(make: Callable[[], Any] = _tsrc) -> Any:
        from loaderx.utils import train_dict
        return _dict_props(train_dict(make()))
    scenario(f"train_dict.source.{_tname}")(_train_case)


for _kind in ("dense", "ragged"):
    def _train_store(kind: str = _kind) -> Any:
        from loaderx.utils import train_dict
        from loaderx.zrecord import Dense, Ragged
        rng = np.random.default_rng(4)
        if kind == "dense":
            _dense("src", rng.integers(0, 20, (3000, 32), dtype=np.uint8))
            s: Any = Dense.open("src")
        else:
            _ragged("src", [rng.integers(0, 20, k % 30 + 5, dtype=np.uint8) for k in range(3000)],
                    np.uint8, 1)
            s = Ragged.open("src")
        with s:
            return _dict_props(train_dict(s))
    scenario(f"train_dict.source.{_kind}_store")(_train_store)

    def _train_builder(kind: str = _kind) -> Any:
        from loaderx.utils import train_dict
        from loaderx.zrecord import Dense, Ragged
        b = Dense.create("b", np.uint8, (4,), codec="raw") if kind == "dense" else \
            Ragged.create("b", np.uint8, 1, codec="raw")
        try:
            return train_dict(b)
        finally:
            b.close()
    scenario(f"train_dict.source.{_kind}_builder")(_train_builder)


@scenario("train_dict.path_writes_file")
def _train_path() -> Any:
    from loaderx.utils import train_dict
    d = train_dict(np.random.default_rng(0).integers(0, 30, (4000, 48), dtype=np.uint8), path="d.bin")
    d2 = train_dict(np.random.default_rng(0).integers(0, 30, (4000, 48), dtype=np.uint8),
                    path=pathlib.Path("e.bin"))
    return [pathlib.Path("d.bin").read_bytes() == d, pathlib.Path("e.bin").read_bytes() == d2]


@scenario("train_dict.signature")
def _train_sig() -> Any:
    from loaderx.utils import train_dict
    ps = inspect.signature(train_dict).parameters
    return [[p.name, str(p.kind), repr(p.default) if p.default is not p.empty else "-"]
            for p in ps.values() if p.name in ("source", "path")]


@scenario("train_dict.positional_path")
def _train_pos() -> Any:
    from loaderx.utils import train_dict
    return train_dict(np.zeros((100, 8), np.uint8), "d.bin")


# -- module surface and converter signatures ------------------------------------------------------

for _mod, _names in {
    "loaderx.zrecord": ["Dense", "Ragged", "ZrecordError"],
    "loaderx.zsampler": ["Sampler"],
    "loaderx.dataloader": ["DataLoader"],
    "loaderx.utils": ["train_dict"],
}.items():
    def _surface(mod: str = _mod, names: list[str] = _names) -> Any:
        import importlib
        m = importlib.import_module(mod)
        return [[n, hasattr(m, n), type(getattr(m, n, None)).__name__] for n in names]
    scenario(f"surface.{_mod}")(_surface)


@scenario("surface.zrecord_error_base")
def _zerr() -> Any:
    from loaderx.zrecord import ZrecordError
    return [issubclass(ZrecordError, RuntimeError), issubclass(ZrecordError, Exception)]


@scenario("surface.version")
def _version() -> Any:
    import loaderx
    return type(loaderx.__version__).__name__


def _sig(f: Callable[..., Any], wheel_kwonly: set[str]) -> Any:
    """``f``'s parameters as the wheel has them; further keyword-only parameters
    with defaults (``metadata=``, ``image_layout=``...) are additions no 2.5.4
    call meets, so only their being optional keyword-only is compared."""
    ps = list(inspect.signature(f).parameters.values())
    kept = [p for p in ps if p.kind is not p.KEYWORD_ONLY or p.name in wheel_kwonly
            or p.default is p.empty]
    extras_optional = all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty
                          for p in ps if p not in kept)
    return [sorted([p.name, str(p.kind), repr(p.default) if p.default is not p.empty else "-"]
                   for p in kept), extras_optional]


@scenario("surface.create_signatures")
def _csig() -> Any:
    from loaderx.zrecord import Dense, Ragged
    kw = {"codec", "dict_bytes", "data_shards"}
    return [_sig(f, kw) for f in (Dense.create, Ragged.create, Dense.open, Ragged.open)]


@scenario("surface.sampler_signature")
def _ssig() -> Any:
    from loaderx.zsampler import Sampler
    ps = list(inspect.signature(Sampler).parameters.values())[:4]
    return [[p.name, str(p.kind)] for p in ps] + [repr(ps[3].default)]


def _converter_sig(name: str) -> Any:
    import importlib
    wheel_kwonly = {"convert": {"codec"},
                    "huggingface": {"config", "revision", "token", "endpoint"}}[name]
    return _sig(getattr(importlib.import_module("loaderx.converter"), name), wheel_kwonly)


@scenario("converter.signature.convert")
def _conv_sig() -> Any:
    return _converter_sig("convert")


@scenario("converter.signature.huggingface")
def _hf_sig() -> Any:
    return _converter_sig("huggingface")


# -- runner ---------------------------------------------------------------------------------------

def run(names: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    home = os.getcwd()
    for name in names:
        with tempfile.TemporaryDirectory(prefix="loaderx-compat-") as d:
            os.chdir(d)
            try:
                results[name] = outcome(SCENARIOS[name])
            finally:
                os.chdir(home)
    return results


def main(argv: list[str]) -> int:
    out, globs = argv[0], argv[1:] or ["*"]
    names = [n for n in SCENARIOS if any(fnmatch.fnmatchcase(n, g) for g in globs)]
    results = run(names)
    with open(out, "w") as f:
        json.dump(results, f, indent=0, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
