"""Record-store backends compared by bench_store.py and bench_loader.py (benchmark engineer).

Every backend stores the same prepared workload (benchlib.DenseWorkload or
RaggedWorkload) and answers the same question: "give me these records, in this
order, duplicates allowed", returning exactly what the loaderx API returns:

* dense:  one ``(B, *item_shape)`` ndarray of the workload's dtype;
* ragged: a ``list`` of B ndarrays with their exact shapes.

Each backend is written the way its documentation recommends for random
access (one record per key/row/chunk/record-group), and read through its own
Python API with whatever batching that API offers. Write time includes making
the files durable (fsync), because loaderx's ``close()`` publishes durably.
"""

from __future__ import annotations

import importlib
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from benchlib import DenseWorkload, RaggedWorkload

Workload = DenseWorkload | RaggedWorkload
Batch = np.ndarray | list[np.ndarray]


def fsync_tree(path: Path) -> None:
    paths = [path] if path.is_file() else [Path(r) / f for r, _, fs in os.walk(path) for f in fs]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _chunks(n: int, size: int):
    for a in range(0, n, size):
        yield a, min(n, a + size)


class Reader:
    def gather(self, idx: np.ndarray) -> Batch:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        pass


class Backend:
    """``name`` is the table label; ``kinds`` the workload kinds it supports."""

    name: str = ""
    kinds: tuple[str, ...] = ("dense", "ragged")
    compressed = False
    requires: tuple[str, ...] = ()  # modules that must import for it to run

    def available(self) -> str | None:
        """None when usable, else the reason it is skipped."""
        for module in self.requires:
            try:
                importlib.import_module(module)
            except ImportError as e:
                return f"{module} not importable ({e})"
        return None

    def write(self, w: Workload, path: Path) -> None:
        raise NotImplementedError

    def open(self, w: Workload, path: Path) -> Reader:
        raise NotImplementedError


def kind_of(w: Workload) -> str:
    return "dense" if isinstance(w, DenseWorkload) else "ragged"


# --------------------------------------------------------------------------
# loaderx (this project), through its public Python API
# --------------------------------------------------------------------------

class _LoaderxReader(Reader):
    def __init__(self, store: Any) -> None:
        self.store = store

    def gather(self, idx: np.ndarray) -> Batch:
        return self.store[idx]

    def close(self) -> None:
        self.store.close()


class LoaderxBackend(Backend):
    def __init__(self, codec: str) -> None:
        self.codec = codec
        self.name = {"raw": "loaderx-raw", "zstd": "loaderx-zstd", "zstd_dict": "loaderx-zstd_dict"}[codec]
        self.compressed = codec != "raw"
        self.dict_bytes: bytes | None = None
        self.data_shards = 4  # the Python API's default, written out so the ceilings use the same
        self.level = 3  # the level of the Python API's zstd codecs
        self.publish_s = 0.0  # the last write's close(): its durable publish

    @property
    def requires(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("loaderx.zrecord", "loaderx.utils") if self.codec == "zstd_dict" else ("loaderx.zrecord",)

    def prepare(self, w: Workload) -> None:
        """Trains the zstd dictionary (outside the timed write, as documented)."""
        if self.codec != "zstd_dict":
            return
        from loaderx.utils import train_dict
        if isinstance(w, DenseWorkload):
            # Tiny records (scalar labels): 2,000 of them are too few bytes to train on.
            step = max(1, w.n // 2000) if w.record_bytes >= 64 else 1
            self.dict_bytes = train_dict(np.ascontiguousarray(w.array[::step]))
        else:
            step = max(1, w.n // 2000)
            self.dict_bytes = train_dict([np.ascontiguousarray(w.record(i)) for i in range(0, w.n, step)])

    def write(self, w: Workload, path: Path) -> None:
        """Writes the store; ``publish_s`` is then the time of its ``close()``: the durable
        publish (every file and directory synced, the rename, the parent synced)."""
        from loaderx.zrecord import Dense, Ragged
        kw: dict[str, Any] = {"codec": self.codec, "data_shards": self.data_shards}
        if self.codec == "zstd_dict":
            kw["dict_bytes"] = self.dict_bytes
        if isinstance(w, DenseWorkload):
            st = Dense.create(str(path), w.array.dtype, w.array.shape[1:], **kw)
            with st:
                st.append(w.array)
                t0 = time.perf_counter()
        else:
            st = Ragged.create(str(path), w.dtype, ndim=w.ndim, **kw)
            with st:
                st.append(w.records())
                t0 = time.perf_counter()
        self.publish_s = time.perf_counter() - t0

    def open(self, w: Workload, path: Path) -> Reader:
        from loaderx.zrecord import Dense, Ragged
        return _LoaderxReader((Dense if isinstance(w, DenseWorkload) else Ragged).open(str(path)))


# --------------------------------------------------------------------------
# NumPy: .npy memmap (dense: fancy indexing; ragged: values+offsets slices)
# --------------------------------------------------------------------------

class _NpyDenseReader(Reader):
    def __init__(self, path: Path) -> None:
        self.mm = np.load(path / "data.npy", mmap_mode="r")

    def gather(self, idx: np.ndarray) -> Batch:
        return self.mm[idx]


class _NpyRaggedReader(Reader):
    def __init__(self, path: Path) -> None:
        self.values = np.load(path / "values.npy", mmap_mode="r")
        self.offsets = np.load(path / "offsets.npy")
        self.shapes = np.load(path / "shapes.npy")

    def gather(self, idx: np.ndarray) -> Batch:
        v, o, s = self.values, self.offsets, self.shapes
        return [np.array(v[o[i]:o[i + 1]]).reshape(s[i]) for i in idx]


class NumpyBackend(Backend):
    name = "numpy-memmap"

    def write(self, w: Workload, path: Path) -> None:
        path.mkdir()
        if isinstance(w, DenseWorkload):
            out = np.lib.format.open_memmap(path / "data.npy", mode="w+", dtype=w.array.dtype, shape=w.array.shape)
            for a, b in _chunks(w.n, 1024):
                out[a:b] = w.array[a:b]
            out.flush()
            del out
        else:
            out = np.lib.format.open_memmap(path / "values.npy", mode="w+", dtype=w.dtype, shape=w.values.shape)
            step = 1 << 24
            for a, b in _chunks(w.values.shape[0], step):
                out[a:b] = w.values[a:b]
            out.flush()
            del out
            np.save(path / "offsets.npy", w.offsets)
            np.save(path / "shapes.npy", w.shapes)
        fsync_tree(path)

    def open(self, w: Workload, path: Path) -> Reader:
        return _NpyDenseReader(path) if isinstance(w, DenseWorkload) else _NpyRaggedReader(path)


# --------------------------------------------------------------------------
# Records as bytes (LMDB, ArrayRecord): ragged records carry their shape
# --------------------------------------------------------------------------

def _encode_ragged(rec: np.ndarray) -> bytes:
    return struct.pack(f"<B{rec.ndim}Q", rec.ndim, *rec.shape) + np.ascontiguousarray(rec).tobytes()


def _decode_ragged(buf: bytes | memoryview, dtype: np.dtype) -> np.ndarray:
    ndim = buf[0]
    shape = struct.unpack_from(f"<{ndim}Q", buf, 1)
    return np.frombuffer(buf, dtype=dtype, offset=1 + 8 * ndim).reshape(shape).copy()


def _dense_from_bytes(bufs: list[Any], w: DenseWorkload) -> np.ndarray:
    out = np.empty((len(bufs), *w.array.shape[1:]), dtype=w.array.dtype)
    flat = out.reshape(len(bufs), -1).view(np.uint8)
    for k, b in enumerate(bufs):
        flat[k] = np.frombuffer(b, dtype=np.uint8)
    return out


def _record_bytes_iter(w: Workload):
    if isinstance(w, DenseWorkload):
        for a, b in _chunks(w.n, 256):
            block = np.ascontiguousarray(w.array[a:b])
            for r in block:
                yield r.tobytes()
    else:
        for r in w.records():
            yield _encode_ragged(r)


class _LmdbReader(Reader):
    def __init__(self, path: Path, w: Workload) -> None:
        import lmdb
        self.env = lmdb.open(str(path), readonly=True, lock=False, readahead=False, subdir=True)
        self.w = w

    def gather(self, idx: np.ndarray) -> Batch:
        with self.env.begin(buffers=True) as txn:
            keys = [struct.pack(">Q", int(i)) for i in idx]
            if isinstance(self.w, DenseWorkload):
                return _dense_from_bytes([txn.get(k) for k in keys], self.w)
            out = []
            for k in keys:
                b = txn.get(k)
                if b is None:
                    raise KeyError(f"lmdb: record {struct.unpack('>Q', k)[0]} is missing")
                out.append(_decode_ragged(b, self.w.dtype))
            return out

    def close(self) -> None:
        self.env.close()


class LmdbBackend(Backend):
    name = "lmdb"
    requires = ("lmdb",)

    def write(self, w: Workload, path: Path) -> None:
        import lmdb
        env = lmdb.open(str(path), map_size=max(1 << 30, int(w.nbytes * 2.2)), subdir=True, sync=True,
                        writemap=False, meminit=False)
        txn = env.begin(write=True)
        for i, b in enumerate(_record_bytes_iter(w)):
            txn.put(struct.pack(">Q", i), b, append=True)
            if i % 4096 == 4095:
                txn.commit()
                txn = env.begin(write=True)
        txn.commit()
        env.sync(True)
        env.close()

    def open(self, w: Workload, path: Path) -> Reader:
        return _LmdbReader(path, w)


class _ArrayRecordReader(Reader):
    def __init__(self, path: Path, w: Workload) -> None:
        from array_record.python.array_record_module import ArrayRecordReader
        self.r = ArrayRecordReader(str(path / "data.array_record"), "readahead_buffer_size:0")
        self.w = w

    def gather(self, idx: np.ndarray) -> Batch:
        bufs = self.r.read([int(i) for i in idx])
        if isinstance(self.w, DenseWorkload):
            return _dense_from_bytes(bufs, self.w)
        return [_decode_ragged(b, self.w.dtype) for b in bufs]

    def close(self) -> None:
        self.r.close()


class ArrayRecordBackend(Backend):
    requires = ("array_record.python.array_record_module",)

    def __init__(self, codec: str) -> None:
        self.codec = codec
        self.name = f"array-record-{'raw' if codec == 'uncompressed' else 'zstd'}"
        self.compressed = codec != "uncompressed"

    def write(self, w: Workload, path: Path) -> None:
        from array_record.python.array_record_module import ArrayRecordWriter
        path.mkdir()
        opts = "group_size:1," + ("uncompressed" if self.codec == "uncompressed" else "zstd:3")
        wr = ArrayRecordWriter(str(path / "data.array_record"), opts)
        for b in _record_bytes_iter(w):
            wr.write(b)
        wr.close()
        fsync_tree(path)

    def open(self, w: Workload, path: Path) -> Reader:
        return _ArrayRecordReader(path, w)


# --------------------------------------------------------------------------
# HDF5 (h5py): dense = one chunk per record; ragged = vlen bytes + shapes
# --------------------------------------------------------------------------

class _H5Reader(Reader):
    def __init__(self, path: Path, w: Workload) -> None:
        import h5py
        self.f = h5py.File(path / "data.h5", "r")
        self.d = self.f["data"]
        self.w = w
        if isinstance(w, RaggedWorkload):
            self.shapes = self.f["shapes"][...]

    def gather(self, idx: np.ndarray) -> Batch:
        # Dense: one read per record; h5py's fancy indexing (increasing unique
        # indices, a selection over 256 chunks) measured ~10 s per batch here.
        # Ragged (vlen): fancy indexing over sorted unique indices is the faster
        # of the two (about 4x over per-record reads), then reorder.
        d = self.d
        if isinstance(self.w, DenseWorkload):
            out = np.empty((len(idx), *self.w.array.shape[1:]), dtype=self.w.array.dtype)
            for k, i in enumerate(idx):
                d.read_direct(out, source_sel=np.s_[int(i)], dest_sel=np.s_[k])
            return out
        uniq, inv = np.unique(idx, return_inverse=True)
        got = d[uniq]
        recs = [np.frombuffer(got[k], dtype=self.w.dtype).reshape(self.shapes[uniq[k]]) for k in range(len(uniq))]
        return [recs[k].copy() for k in inv]

    def close(self) -> None:
        self.f.close()


class H5Backend(Backend):
    requires = ("h5py",)

    def __init__(self, codec: str) -> None:
        self.codec = codec
        self.name = f"h5py-{codec}"
        self.compressed = codec != "raw"

    def write(self, w: Workload, path: Path) -> None:
        import h5py
        path.mkdir()
        comp = {} if self.codec == "raw" else {"compression": "gzip", "compression_opts": 4}
        with h5py.File(path / "data.h5", "w") as f:
            if isinstance(w, DenseWorkload):
                d = f.create_dataset("data", shape=w.array.shape, dtype=w.array.dtype,
                                     chunks=(1, *w.array.shape[1:]), **comp)
                for a, b in _chunks(w.n, 256):
                    d[a:b] = w.array[a:b]
            else:
                vt = h5py.vlen_dtype(np.dtype(np.uint8))
                d = f.create_dataset("data", shape=(w.n,), dtype=vt, chunks=(min(w.n, 64),), **comp)
                for a, b in _chunks(w.n, 256):
                    buf = np.empty(b - a, dtype=object)
                    for k in range(a, b):
                        buf[k - a] = np.ascontiguousarray(w.record(k)).view(np.uint8).reshape(-1)
                    d[a:b] = buf
                f.create_dataset("shapes", data=w.shapes)
        fsync_tree(path)

    def open(self, w: Workload, path: Path) -> Reader:
        return _H5Reader(path, w)


# --------------------------------------------------------------------------
# Arrow IPC file (pyarrow): one binary column, record batches of 256 rows
# --------------------------------------------------------------------------

ARROW_BATCH = 256


def _binary_rows(arr: Any, w: Workload, shapes: np.ndarray | None) -> np.ndarray | list[np.ndarray]:
    """The records held by a pyarrow binary array, decoded.

    ``arr``: ``fixed_size_binary`` (dense) or ``large_binary`` (ragged) rows,
    possibly a slice (non-zero ``offset``). Dense: a ``(len(arr), record_bytes)``
    uint8 view of its value buffer; ragged: a list of fresh arrays of ``w.dtype``
    reshaped to ``shapes[k]`` (one row of ``shapes`` per element of ``arr``).
    Shared by the Arrow IPC and Parquet readers.
    """
    if isinstance(w, DenseWorkload):
        rb = w.record_bytes
        return np.frombuffer(arr.buffers()[1], dtype=np.uint8, count=len(arr) * rb,
                             offset=arr.offset * rb).reshape(len(arr), rb)
    assert shapes is not None
    offs = np.frombuffer(arr.buffers()[1], dtype=np.int64, count=len(arr) + 1, offset=arr.offset * 8)
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8)
    return [data[offs[j]:offs[j + 1]].view(w.dtype).reshape(shapes[j]).copy() for j in range(len(arr))]


def _binary_array(w: Workload, a: int, b: int, typ: Any) -> Any:
    """Records ``a..b-1`` of ``w`` as one pyarrow binary array of type ``typ``
    (dense: zero-copy over the contiguous block; ragged: one bytes object each)."""
    import pyarrow as pa
    if isinstance(w, DenseWorkload):
        block = np.ascontiguousarray(w.array[a:b]).reshape(-1).view(np.uint8)
        return pa.Array.from_buffers(typ, b - a, [None, pa.py_buffer(block)])
    return pa.array([np.ascontiguousarray(w.record(k)).tobytes() for k in range(a, b)], type=typ)


def _binary_type(w: Workload) -> Any:
    import pyarrow as pa
    return pa.binary(w.record_bytes) if isinstance(w, DenseWorkload) else pa.large_binary()


class _ArrowReader(Reader):
    def __init__(self, path: Path, w: Workload, compressed: bool) -> None:
        import pyarrow as pa
        self.pa = pa
        self.src = pa.memory_map(str(path / "data.arrow"), "r")
        self.r = pa.ipc.open_file(self.src)
        self.w = w
        # Uncompressed IPC maps zero-copy: keep every batch's column (views of
        # the file). Compressed batches are read (decompressed) per gather.
        self.cols = None if compressed else [self.r.get_batch(i).column(0)
                                             for i in range(self.r.num_record_batches)]
        self.shapes = np.load(path / "shapes.npy") if isinstance(w, RaggedWorkload) else None

    def gather(self, idx: np.ndarray) -> Batch:
        # Per touched record batch: one vectorised take of the rows wanted from
        # it (with compression the touched batch is decompressed whole: that is
        # the format's read amplification), then scatter into request order.
        pa = self.pa
        idx64 = idx.astype(np.int64)
        bidx = idx64 // ARROW_BATCH
        w = self.w
        dense = isinstance(w, DenseWorkload)
        if isinstance(w, DenseWorkload):
            out = np.empty((len(idx), *w.array.shape[1:]), dtype=w.array.dtype)
            flat = out.reshape(len(idx), -1).view(np.uint8)
        else:
            recs: list[np.ndarray | None] = [None] * len(idx)
        for b in np.unique(bidx):
            ks = np.flatnonzero(bidx == b)
            col = self.cols[b] if self.cols is not None else self.r.get_batch(int(b)).column(0)
            arr = col.take(pa.array(idx64[ks] - b * ARROW_BATCH))
            got = _binary_rows(arr, w, None if self.shapes is None else self.shapes[idx64[ks]])
            if dense:
                flat[ks] = got
            else:
                for j, k in enumerate(ks):
                    recs[k] = got[j]
        return out if dense else recs  # type: ignore[return-value]

    def close(self) -> None:
        self.cols = None
        self.src.close()


class _BinaryColumnBackend(Backend):
    """A store of one ``data`` column of binary values (Arrow IPC, Parquet);
    ragged shapes go to a side ``shapes.npy``."""

    prefix = ""

    def __init__(self, codec: str) -> None:
        self.codec = codec
        self.name = f"{self.prefix}-{codec}"
        self.compressed = codec != "raw"

    def _begin(self, w: Workload, path: Path) -> tuple[Any, Any]:
        """Creates the directory and the shapes file; returns (value type, schema)."""
        import pyarrow as pa
        path.mkdir()
        typ = _binary_type(w)
        if isinstance(w, RaggedWorkload):
            np.save(path / "shapes.npy", w.shapes)
        return typ, pa.schema([("data", typ)])


class ArrowBackend(_BinaryColumnBackend):
    requires = ("pyarrow",)
    prefix = "arrow-ipc"

    def write(self, w: Workload, path: Path) -> None:
        import pyarrow as pa
        typ, schema = self._begin(w, path)
        opts = pa.ipc.IpcWriteOptions(compression=None if self.codec == "raw" else "zstd")
        with pa.OSFile(str(path / "data.arrow"), "wb") as sink, pa.ipc.new_file(sink, schema, options=opts) as wr:
            for a, b in _chunks(w.n, ARROW_BATCH):
                wr.write_batch(pa.record_batch([_binary_array(w, a, b, typ)], schema=schema))
        fsync_tree(path)

    def open(self, w: Workload, path: Path) -> Reader:
        return _ArrowReader(path, w, self.compressed)


# --------------------------------------------------------------------------
# Parquet (pyarrow.parquet): one binary column, one row group per 256 rows
# --------------------------------------------------------------------------

PARQUET_GROUP = 256  # rows per row group, as the reference README's Parquet runs


class _ParquetReader(Reader):
    def __init__(self, path: Path, w: Workload) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq
        self.pa = pa
        self.pf = pq.ParquetFile(str(path / "data.parquet"), memory_map=True)
        self.w = w
        # The row-group index, from the file footer: first row of every group.
        md = self.pf.metadata
        self.sizes = np.array([md.row_group(g).num_rows for g in range(md.num_row_groups)], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)])
        if int(self.starts[-1]) != w.n:
            raise ValueError(f"parquet: {path} holds {int(self.starts[-1])} rows, the workload {w.n}")
        self.shapes = np.load(path / "shapes.npy") if isinstance(w, RaggedWorkload) else None

    def gather(self, idx: np.ndarray) -> Batch:
        # Parquet's unit of random access is the row group: every group a
        # batch touches is read and decoded whole (read amplification; with
        # zstd, decompressed whole), once per gather however many of its rows
        # are wanted. Then one take puts the wanted rows in request order.
        idx64 = idx.astype(np.int64)
        group = np.searchsorted(self.starts, idx64, side="right") - 1
        groups, inv = np.unique(group, return_inverse=True)
        table = self.pf.read_row_groups(groups.tolist(), columns=["data"], use_threads=True)
        first = np.cumsum(self.sizes[groups]) - self.sizes[groups]  # each group's first row in `table`
        pos = first[inv.reshape(-1)] + idx64 - self.starts[group]
        arr = table.column(0).take(self.pa.array(pos)).combine_chunks()
        got = _binary_rows(arr, self.w, None if self.shapes is None else self.shapes[idx64])
        if isinstance(self.w, DenseWorkload):
            return got.view(self.w.array.dtype).reshape(len(idx), *self.w.array.shape[1:])  # type: ignore[union-attr]
        return got

    def close(self) -> None:
        self.pf.close()


class ParquetBackend(_BinaryColumnBackend):
    """One ``data`` column (``fixed_size_binary`` dense, ``large_binary``
    ragged; ragged shapes in a side ``shapes.npy`` as for Arrow IPC), written
    with one row group per :data:`PARQUET_GROUP` rows, plain encoding (no
    dictionary: the values are opaque blobs) and no column statistics (min/max
    of 147 KiB blobs would only bloat the footer). ``zstd`` is level 3, as
    loaderx's and ArrayRecord's zstd."""

    requires = ("pyarrow.parquet",)
    prefix = "parquet"

    def write(self, w: Workload, path: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq
        typ, schema = self._begin(w, path)
        kw: dict[str, Any] = {"compression": "none"} if self.codec == "raw" else {
            "compression": "zstd", "compression_level": 3}
        with pq.ParquetWriter(str(path / "data.parquet"), schema, use_dictionary=False, write_statistics=False,
                              **kw) as wr:
            for a, b in _chunks(w.n, PARQUET_GROUP):
                wr.write_table(pa.table([_binary_array(w, a, b, typ)], schema=schema), row_group_size=PARQUET_GROUP)
        fsync_tree(path)

    def open(self, w: Workload, path: Path) -> Reader:
        return _ParquetReader(path, w)


def all_backends() -> list[Backend]:
    """In table order: loaderx, NumPy, then peers in the order the issue lists them."""
    return [
        LoaderxBackend("raw"), LoaderxBackend("zstd"), LoaderxBackend("zstd_dict"),
        NumpyBackend(),
        LmdbBackend(),
        H5Backend("raw"), H5Backend("gzip"),
        ArrowBackend("raw"), ArrowBackend("zstd"),
        ParquetBackend("raw"), ParquetBackend("zstd"),
        ArrayRecordBackend("uncompressed"), ArrayRecordBackend("zstd"),
    ]


Factory = Callable[[], Backend]
