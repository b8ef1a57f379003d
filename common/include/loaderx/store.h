// Zrecord stores: typed, immutable record sequences on disk.
//
// A store is a directory holding one metadata file, one index, an optional
// shape table (ragged) and dictionary (zstd_dict), and `data_shards` data
// files. The byte layout is specified in docs/format.md.
//
//  * StoreWriter builds a store in a sibling temporary directory and publishes
//    it with one atomic rename after every file is fsynced (metadata last).
//    Destroying an unpublished writer discards everything: nothing appears at
//    `path`.
//  * Store is a read-only, mmap-backed view of a published store. Open() checks
//    magic, version, the metadata checksum and every file's size in O(1);
//    index blocks are checksummed lazily on first use; every index entry is
//    bounds-checked before a read. Corruption is reported as
//    Status::Corruption naming the file, never by crashing. Large records
//    (raw >= 64 KiB, compressed frames of 16 KiB..4 MiB) are read with pread
//    rather than through the mapping, so an epoch over a store does not
//    leave the whole store mapped into the reader's RSS/PSS
//    (docs/format.md, "How reads work").
//
// Thread-safety: a Store is immutable after Open and all const methods may be
// called concurrently (the gather pool does). A StoreWriter is used by one
// thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loaderx/fd.h"
#include "loaderx/status.h"

namespace loaderx {

class Env;
class ThreadPool;

// A NumPy dtype with a fixed itemsize, stored by its NumPy string ("<f4",
// "|u1", "<M8[ns]", "|b1", ">i4", "|S5", "<U3", "|V16"). Records are opaque
// bytes to the engine, so the byte order is only carried: a big-endian store
// returns big-endian arrays. Structured, object, subarray and zero-itemsize
// dtypes are rejected by Parse (NumPy's dtype.str cannot express the first
// three faithfully).
struct DType {
  std::string str;        // canonical NumPy dtype.str ('<' or '>' for multi-byte numbers)
  char kind = 0;          // NumPy kind: b i u f c M m S U V
  uint32_t itemsize = 0;  // bytes per element, > 0 (a "<U3" element is 12 bytes)

  static Result<DType> Parse(std::string_view numpy_str);
  bool operator==(const DType&) const = default;
};

enum class Kind : uint8_t { kDense = 0, kRagged = 1 };
enum class Codec : uint8_t { kRaw = 0, kZstd = 1, kZstdDict = 2 };

Result<Codec> ParseCodec(std::string_view name);  // "raw" | "zstd" | "zstd_dict"
const char* CodecName(Codec c);

struct Schema {
  Kind kind = Kind::kDense;
  DType dtype;
  std::vector<uint64_t> item_shape;  // dense only; may be empty (scalar records)
  uint32_t ndim = 0;                 // ragged rank; for dense == item_shape.size()

  // Bytes of one dense record (itemsize * prod(item_shape)).
  uint64_t DenseItemBytes() const;
};

struct WriteOptions {
  Codec codec = Codec::kRaw;
  uint32_t data_shards = 4;    // 1..255
  int level = 3;               // zstd level
  std::string dictionary;      // zstd_dict only: non-empty zstd dictionary bytes
  ThreadPool* pool = nullptr;  // compression/write pool; nullptr = Default()
  // Every file operation of the writer goes through this Env (loaderx/env.h;
  // tests inject faults with it); nullptr = Env::Default(). Must outlive the
  // writer.
  Env* env = nullptr;
  // Records larger than this are not buffered: they are compressed (or copied)
  // streaming straight into their shard file, so writer memory stays bounded
  // for records of any size (> 4 GiB included). Tests lower it.
  uint64_t stream_threshold = uint64_t{32} << 20;
  // Input compressed per parallel round (> 0). A round is written while the
  // next one of the same append call is compressed, so the writer holds the
  // output of at most two rounds: about 2 x chunk_bytes (plus zstd's
  // worst-case bound) beside the caller's input (docs/format.md, Writing).
  // It keeps those buffers from one round and one append to the next, and
  // frees them when it publishes or aborts.
  // Small enough that the 64 MiB slices of a Python Dense.append are four
  // rounds. The bytes on disk do not depend on it. Tests lower it.
  uint64_t chunk_bytes = uint64_t{16} << 20;
  // true: data files are written in whole 2 MiB-aligned pieces, so their
  // page cache is in 2 MiB folios that readers map with 2 MiB pages
  // (docs/format.md, Writing). false (default): pieces as they come (at
  // most 256 KiB each). Off by default because on a VM with free page
  // reporting each 2 MiB folio is first touched on the host and writes were
  // up to 4-6x slower, for a gather gain of 2-4 % (docs/benchmarks.md,
  // "Huge pages"); on bare metal it may pay.
  bool huge_page_writes = false;
  // User metadata: JSON text stored (and checksummed) in `meta`, at most
  // 512 KiB; empty = none. The writer does not parse it.
  std::string user_metadata;
  // true (default): a zstd / zstd_dict store of a little-endian integer dtype
  // of 2, 4 or 8 bytes stores each record's values in the fewest bytes (1, 2
  // or 4) that hold them all, widened again on read (format 1.2,
  // docs/format.md section 5). false: every record at full width, format
  // 1.1, which builds older than 1.2 read. Other stores are 1.1 either way.
  bool narrow_integers = true;
  // true (default): a store that narrows, of records of at most 4 KiB on
  // average (runs of at least 64 records), gets the compact "groups" index
  // and bare zstd blocks (format 1.3, docs/format.md section 3). false: the
  // 1.2 "ends" index, 8 bytes a record. Other stores are not affected.
  bool group_index = true;
};

class StoreWriter {
 public:
  // REQUIRES: `path` does not exist (else AlreadyExists). Missing parent
  // directories are created.
  static Result<std::unique_ptr<StoreWriter>> Create(const std::string& path, const Schema& schema,
                                                     const WriteOptions& options);
  virtual ~StoreWriter() = default;

  // Dense: appends `n` records from C-contiguous `data` (n * item_bytes bytes).
  // Any n; memory used is bounded independently of n.
  virtual Status AppendDense(const void* data, uint64_t n) = 0;
  // Ragged: appends `count` records whose values are concatenated in `data`
  // and whose shapes are `shapes[count * ndim]` (C order per record).
  virtual Status AppendRagged(const void* data, const uint64_t* shapes, uint64_t count) = 0;
  // Ragged: the same, with record k's values at `records[k]` (buffers
  // anywhere, each C-contiguous and alive for the call): nothing is gathered
  // into one buffer first. Neighbouring records that are also neighbours in
  // memory are written as one; large ones straight from their buffers.
  virtual Status AppendRaggedRecords(const void* const* records, const uint64_t* shapes,
                                     uint64_t count) = 0;
  // fsync everything, write metadata, rename into place. After Publish the
  // writer accepts nothing more.
  virtual Status Publish() = 0;
  // Removes the temporary directory; idempotent. Called by the destructor of
  // an unpublished writer.
  virtual void Abort() = 0;

  virtual uint64_t size() const = 0;
  virtual const Schema& schema() const = 0;
};

// One record's location, decoded from the index and bounds-checked.
struct RecordRef {
  uint32_t shard = 0;
  uint64_t offset = 0;
  uint64_t stored_len = 0;
  uint64_t raw_len = 0;  // decoded length in bytes
  bool compressed = false;
  // 1.2: bytes per stored value of a narrowed record (1, 2 or 4; the stored
  // bytes decode to raw_len / itemsize * width), 0 = the dtype's itemsize.
  uint32_t width = 0;
  // 1.2, a narrowed record of a signed dtype: its values are unsigned
  // (zero-extended on read) instead of signed (sign-extended).
  bool zero_extend = false;
  // 1.3: a compressed record stored as a bare zstd block after its 1- or
  // 2-byte content size field (its frame header and block header left out);
  // 0 = a whole frame.
  uint32_t bare = 0;
  uint64_t checksum = 0;  // format 1.0: low 32 bits of XXH3 of the stored bytes; 1.1: 0
};

// The already-opened files of a store, as the client passes them to loaderxd.
struct StoreFiles {
  std::string label;                   // for messages (the path as the opener saw it)
  UniqueFd meta, index, shapes, dict;  // shapes/dict may be invalid if absent
  std::vector<UniqueFd> data;
};

class Store {
 public:
  // Every file operation of a store (open, fstat, pread, mmap) goes through
  // `env` (loaderx/env.h); nullptr = Env::Default(). A non-default Env must
  // outlive the store: reads go through it too.
  //
  // Opens `path` read-only (OpenFileSet, then FromFiles).
  static Result<std::shared_ptr<Store>> Open(const std::string& path, Env* env = nullptr);
  // Opens every file of the store at `path` without validating more than the
  // metadata needed to know which files exist.
  static Result<StoreFiles> OpenFileSet(const std::string& path, Env* env = nullptr);
  // Validates and maps an already-opened file set (daemon path).
  static Result<std::shared_ptr<Store>> FromFiles(StoreFiles files, Env* env = nullptr);

  virtual ~Store() = default;

  virtual const Schema& schema() const = 0;
  virtual Codec codec() const = 0;
  virtual uint32_t data_shards() const = 0;
  virtual uint64_t size() const = 0;          // record count N
  virtual uint64_t nbytes() const = 0;        // logical (decoded) bytes of all records
  virtual uint64_t stored_bytes() const = 0;  // bytes of every file of the store
  virtual const std::string& label() const = 0;
  // The JSON text given as WriteOptions::user_metadata; empty if none (and
  // for format 1.0 stores).
  // (Defaults for test doubles; the real store overrides both.)
  virtual const std::string& user_metadata() const {
    static const std::string kNone;
    return kNone;
  }
  // Format version of the store as written ({1, 0} or {1, 1}).
  virtual std::pair<uint32_t, uint32_t> format_version() const { return {1, 1}; }

  // Ragged: writes the ndim dims of record i. Dense: writes item_shape.
  virtual Status RecordShape(uint64_t i, uint64_t* dims) const = 0;
  virtual Result<uint64_t> RecordBytes(uint64_t i) const = 0;
  virtual Result<RecordRef> Locate(uint64_t i) const = 0;

  // Decodes record i into out[0, out_len); out_len must equal RecordBytes(i).
  virtual Status ReadRecord(uint64_t i, void* out, uint64_t out_len) const = 0;

  // Reads records indices[k] into outs[k] (each sized RecordBytes) using
  // `pool` (nullptr: calling thread only). Large records are split, small ones
  // grouped. Returns the first error.
  virtual Status Gather(std::span<const uint64_t> indices, std::span<void* const> outs,
                        ThreadPool* pool) const = 0;

  // Checks every checksum (metadata, index, shapes, dictionary, each record).
  // `progress(done, total)` is called now and then. The first bad record is
  // named in the message ("record 17 (shard 2): checksum mismatch").
  virtual Status Verify(const std::function<void(uint64_t, uint64_t)>& progress) const = 0;
};

// Trains a zstd dictionary of at most `capacity` bytes from samples. With
// `narrow_as` (the records' dtype), each sample of a dtype StoreWriter
// narrows (WriteOptions::narrow_integers) is narrowed as a record of it is
// stored, so the dictionary learns the bytes the store's frames will hold.
Result<std::string> TrainDictionary(const std::vector<std::string_view>& samples, size_t capacity,
                                    const DType* narrow_as = nullptr);

}  // namespace loaderx
