// Faults injected through the Env seam (tests/common/fault_env.h): ENOSPC and
// EIO on writes, EIO on syncs, short writes and reads, failing renames, EIO
// and failing mappings at open and gather, and crashes that drop unsynced
// data at every crash point of a create. Every fault ends in a Status naming
// the file and the errno; nothing (or, after the rename, the whole store) is
// at the path; no temporary directory is left; a store written before the
// fault still reads exactly.
#include <sys/stat.h>

#include <climits>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <random>
#include <set>

#include "fault_env.h"
#include "loaderx/env.h"
#include "loaderx/store.h"
#include "loaderx/thread_pool.h"
#include "store_test_util.h"

namespace loaderx {
namespace {

namespace fs = std::filesystem;
using testing::FaultEnv;
using testing::MakeBytes;
using testing::RaggedSchema;
using testing::TempDir;
using Op = FaultEnv::Op;

// The store the write tests create: ragged rank 2 (so it has a shape table),
// zstd_dict (a dictionary file), 2 data shards, written in 3 appends.
constexpr uint64_t kRecords = 600;

struct Content {
  std::vector<uint64_t> shapes;  // 2 per record
  std::vector<uint8_t> values;
  std::vector<uint64_t> offsets;  // byte offset of each record in values
};

const Content& TheContent() {
  static const Content c = [] {
    Content c;
    uint64_t total = 0;
    for (uint64_t i = 0; i < kRecords; ++i) {
      c.shapes.push_back(1 + i % 37);
      c.shapes.push_back(1 + i % 3);
      c.offsets.push_back(total);
      total += (1 + i % 37) * (1 + i % 3) * 4;
    }
    c.values = MakeBytes(total, 5);
    return c;
  }();
  return c;
}

WriteOptions Options(Env* env, ThreadPool* pool) {
  WriteOptions o;
  o.huge_page_writes = true;  // the call counts below assume it, whatever the default
  o.codec = Codec::kZstdDict;
  static const std::string dict = testing::TestDictionary();
  o.dictionary = dict;
  o.data_shards = 2;
  o.env = env;
  o.pool = pool;
  return o;
}

// Creates the store at `path` through `env`; the first error of any step.
Status WriteStore(const std::string& path, Env* env) {
  ThreadPool pool(2);
  const Content& c = TheContent();
  auto w = StoreWriter::Create(path, RaggedSchema("<i4", 2), Options(env, &pool));
  if (!w.ok()) return w.status();
  for (uint64_t first : {uint64_t{0}, uint64_t{250}, uint64_t{400}}) {
    const uint64_t end = first == 0 ? 250 : first == 250 ? 400 : kRecords;
    LX_RETURN_IF_ERROR((*w)->AppendRagged(c.values.data() + c.offsets[first],
                                          c.shapes.data() + 2 * first, end - first));
  }
  return (*w)->Publish();
}

// The store at `path` opens, verifies and reads back exactly (default Env).
void ExpectWholeStore(const std::string& path) {
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ((*s)->size(), kRecords);
  ASSERT_TRUE((*s)->Verify(nullptr).ok());
  const Content& c = TheContent();
  std::vector<uint8_t> buf;
  for (uint64_t i = 0; i < kRecords; ++i) {
    uint64_t dims[2];
    ASSERT_TRUE((*s)->RecordShape(i, dims).ok());
    ASSERT_EQ(dims[0], c.shapes[2 * i]);
    ASSERT_EQ(dims[1], c.shapes[2 * i + 1]);
    const uint64_t n = dims[0] * dims[1] * 4;
    buf.assign(n, 0);
    ASSERT_TRUE((*s)->ReadRecord(i, buf.data(), n).ok());
    ASSERT_EQ(std::memcmp(buf.data(), c.values.data() + c.offsets[i], n), 0) << "record " << i;
  }
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// Entries of `dir` other than the ones named.
std::set<std::string> Others(const std::string& dir, const std::set<std::string>& known) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (!known.count(n)) out.insert(n);
  }
  return out;
}

bool Contains(const Status& st, const std::string& piece) {
  return st.message().find(piece) != std::string::npos;
}

// The mutating calls of one fault-free create, by kind ("pwrite", ...).
std::map<std::string, int> CleanRunCalls() {
  TempDir dir;
  FaultEnv env(dir.path());
  EXPECT_TRUE(WriteStore(dir.Sub("s"), &env).ok());
  std::map<std::string, int> calls;
  for (const std::string& e : env.log()) ++calls[e.substr(0, e.find(' '))];
  return calls;
}

constexpr uint64_t kHugePage = uint64_t{2} << 20;

// Every write to a data file starts on a huge-page boundary and, but for the
// file's last one, covers whole huge pages (docs/format.md, Writing).
// `contiguous`: each write also starts where the previous one ended (no
// rewind cut the file meanwhile). Returns the number of data-file writes.
int ExpectHugePageWrites(const FaultEnv& env, bool contiguous) {
  std::map<std::string, std::vector<FaultEnv::Write>> by_file;
  for (const FaultEnv::Write& w : env.writes()) {
    if (w.path.find("/data-") != std::string::npos) by_file[w.path].push_back(w);
  }
  int n = 0;
  for (const auto& [path, ws] : by_file) {
    for (size_t k = 0; k < ws.size(); ++k) {
      SCOPED_TRACE(path + " write " + std::to_string(k) + " at " + std::to_string(ws[k].offset) +
                   ", " + std::to_string(ws[k].len) + " bytes");
      EXPECT_EQ(ws[k].offset % kHugePage, 0u);
      if (k + 1 < ws.size()) {
        EXPECT_EQ(ws[k].len % kHugePage, 0u);
      }
      EXPECT_GT(ws[k].len, 0u);
      if (contiguous && k > 0) {
        EXPECT_EQ(ws[k].offset, ws[k - 1].offset + ws[k - 1].len);
      }
      ++n;
    }
  }
  return n;
}

// How many of the mutating calls done were `call` ("ftruncate").
int CountCalls(const FaultEnv& env, const std::string& call) {
  int n = 0;
  for (const std::string& e : env.log()) n += e.rfind(call + " ", 0) == 0;
  return n;
}

// Runs one create whose `nth` call of `op` fails with `err`; checks the
// contract of a failed create and returns the Status.
Status FailedCreate(Op op, int nth, int err, const std::string& part = "") {
  TempDir dir;
  EXPECT_TRUE(WriteStore(dir.Sub("before"), nullptr).ok());
  FaultEnv env(dir.path());
  env.AddRule({.op = op, .path_part = part, .nth = nth, .err = err});
  Status st = WriteStore(dir.Sub("s"), &env);
  EXPECT_FALSE(st.ok()) << "call " << nth << " did not fail the create";
  EXPECT_EQ(env.Matches(0) >= nth, true);
  EXPECT_FALSE(Exists(dir.Sub("s"))) << st.ToString();
  EXPECT_EQ(Others(dir.path(), {"before"}), std::set<std::string>{}) << st.ToString();
  ExpectWholeStore(dir.Sub("before"));
  return st;
}

// A store-file name in a message: the file the failing call was on.
bool NamesAStoreFile(const Status& st) {
  for (const char* f : {"/meta", "/index", "/shapes", "/dict", "/data-000", "/data-001"}) {
    if (Contains(st, f)) return true;
  }
  return false;
}

TEST(StoreFaultTest, AFaultFreeCreateThroughTheEnvMakesTheSameStore) {
  TempDir dir;
  FaultEnv env(dir.path());
  ASSERT_TRUE(WriteStore(dir.Sub("s"), &env).ok());
  ExpectWholeStore(dir.Sub("s"));
  EXPECT_EQ(Others(dir.path(), {"s"}), std::set<std::string>{});
  // Every file of the store was created, written and synced through the Env.
  const auto calls = CleanRunCalls();
  for (const auto& [call, n] : calls) std::cout << call << ": " << n << "\n";
  EXPECT_EQ(calls.at("open"), 6);  // dict, index, shapes, 2 data, meta
  EXPECT_EQ(calls.at("fdatasync"), 6);
  EXPECT_EQ(calls.at("fsync"), 2);  // the temporary directory, the parent
  EXPECT_EQ(calls.at("mkdir"), 1);
  EXPECT_EQ(calls.at("rename"), 1);
  EXPECT_GE(calls.at("pwrite"), 4);  // dict, index, shapes, meta
  // The 600 records are one run, all in data-000 (data-001 is empty), below
  // one huge page: written once, its tail at the sync.
  EXPECT_EQ(calls.at("pwritev"), 1);
}

// Fails each call of `op` (`call` in the clean run's log) in turn with `err`:
// every create fails with IOError naming the file, the call and the errno.
void ExpectEveryCallFails(Op op, const std::string& call, int err) {
  const int calls = CleanRunCalls().at(call);
  for (int n = 1; n <= calls; ++n) {
    SCOPED_TRACE(call + " " + std::to_string(n));
    Status st = FailedCreate(op, n, err);
    EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
    EXPECT_TRUE(Contains(st, call + ": " + std::strerror(err))) << st.ToString();
    EXPECT_TRUE(NamesAStoreFile(st)) << st.ToString();
  }
}

TEST(StoreFaultTest, EnospcOnEveryWriteFailsNamingTheFileAndLeavesNothing) {
  ExpectEveryCallFails(Op::kPWrite, "pwrite", ENOSPC);
}

TEST(StoreFaultTest, EioOnEveryWriteFailsNamingTheFileAndLeavesNothing) {
  ExpectEveryCallFails(Op::kPWrite, "pwrite", EIO);
}

TEST(StoreFaultTest, EnospcOnEveryDataFileWriteFailsNamingTheFileAndLeavesNothing) {
  ExpectEveryCallFails(Op::kPWriteV, "pwritev", ENOSPC);
}

TEST(StoreFaultTest, EioOnEveryDataFileWriteFailsNamingTheFileAndLeavesNothing) {
  ExpectEveryCallFails(Op::kPWriteV, "pwritev", EIO);
}

TEST(StoreFaultTest, EioOnEveryFdatasyncFailsNamingTheFileAndDoesNotPublish) {
  ExpectEveryCallFails(Op::kDataSync, "fdatasync", EIO);
}

// One append cut into chunks of about 1 KiB, data files written as their
// pieces come: each chunk's data-file pwrite runs while the next chunk is
// compressed (docs/format.md, Writing). Whichever of them fails, the append
// fails naming the file and the call, after the compression in flight has
// finished, and no store or temporary directory is left.
TEST(StoreFaultTest, AFailingDataWriteWhileTheNextChunkIsCompressedLeavesNothing) {
  const auto write = [](const std::string& path, Env* env) -> Status {
    ThreadPool pool(2);
    WriteOptions o = Options(env, &pool);
    o.huge_page_writes = false;
    o.chunk_bytes = 1024;
    const Content& c = TheContent();
    auto w = StoreWriter::Create(path, RaggedSchema("<i4", 2), o);
    if (!w.ok()) return w.status();
    LX_RETURN_IF_ERROR((*w)->AppendRagged(c.values.data(), c.shapes.data(), kRecords));
    return (*w)->Publish();
  };
  int data_writes = 0;
  {
    TempDir dir;
    FaultEnv env(dir.path());
    ASSERT_TRUE(write(dir.Sub("s"), &env).ok());
    ExpectWholeStore(dir.Sub("s"));
    for (const std::string& e : env.log()) {
      data_writes += e.rfind("pwrite ", 0) == 0 && e.find("/data-") != std::string::npos;
    }
  }
  EXPECT_GE(data_writes, 50);  // about 90 KiB of input in 1 KiB chunks
  for (int n = 1; n <= data_writes; ++n) {
    SCOPED_TRACE("data pwrite " + std::to_string(n));
    for (int err : {ENOSPC, EIO}) {
      TempDir dir;
      FaultEnv env(dir.path());
      env.AddRule({.op = Op::kPWrite, .path_part = "/data-", .nth = n, .err = err});
      const Status st = write(dir.Sub("s"), &env);
      EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
      EXPECT_TRUE(Contains(st, "/data-000")) << st.ToString();
      EXPECT_TRUE(Contains(st, "pwrite: " + std::string(std::strerror(err)))) << st.ToString();
      EXPECT_EQ(env.Matches(0), n);  // nothing was written after the failing call
      EXPECT_FALSE(Exists(dir.Sub("s")));
      EXPECT_EQ(Others(dir.path(), {}), std::set<std::string>{}) << st.ToString();
    }
  }
}

TEST(StoreFaultTest, EioOnTheTemporaryDirectoryFsyncDoesNotPublish) {
  Status st = FailedCreate(Op::kSync, 1, EIO);
  EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
  EXPECT_TRUE(Contains(st, ".s.zrecord-tmp-")) << st.ToString();
  EXPECT_TRUE(Contains(st, "fsync: " + std::string(std::strerror(EIO)))) << st.ToString();
}

// After the rename the store is visible and must stay: an fsync error of the
// parent is reported (its durability is not confirmed), the store is whole.
TEST(StoreFaultTest, EioOnTheParentFsyncAfterTheRenameReportsItAndKeepsTheWholeStore) {
  TempDir dir;
  FaultEnv env(dir.path());
  env.AddRule({.op = Op::kSync, .nth = 2, .err = EIO});
  Status st = WriteStore(dir.Sub("s"), &env);
  EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
  EXPECT_TRUE(Contains(st, dir.path() + ": fsync: " + std::strerror(EIO))) << st.ToString();
  ExpectWholeStore(dir.Sub("s"));
  EXPECT_EQ(Others(dir.path(), {"s"}), std::set<std::string>{});
}

TEST(StoreFaultTest, EveryFailingCreateOpenFailsNamingTheFile) {
  const int opens = CleanRunCalls().at("open");
  for (int n = 1; n <= opens; ++n) {
    SCOPED_TRACE("open " + std::to_string(n));
    Status st = FailedCreate(Op::kOpen, n, ENOSPC, "/.s.zrecord-tmp-");
    EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
    EXPECT_TRUE(Contains(st, std::strerror(ENOSPC))) << st.ToString();
  }
}

TEST(StoreFaultTest, FailingMkdirOfTheTemporaryDirectoryFailsNamingIt) {
  Status st = FailedCreate(Op::kMkdir, 1, EACCES, ".s.zrecord-tmp-");
  EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
  EXPECT_TRUE(Contains(st, ".s.zrecord-tmp-")) << st.ToString();
  EXPECT_TRUE(Contains(st, std::strerror(EACCES))) << st.ToString();
}

TEST(StoreFaultTest, FailingRenameFailsNamingBothPathsAndLeavesNothing) {
  for (int err : {EIO, EXDEV, EACCES}) {
    Status st = FailedCreate(Op::kRename, 1, err);
    EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
    EXPECT_TRUE(Contains(st, "/s: rename: " + std::string(std::strerror(err)))) << st.ToString();
    EXPECT_TRUE(Contains(st, ".s.zrecord-tmp-")) << st.ToString();
  }
}

TEST(StoreFaultTest, RenameOntoAStoreMadeMeanwhileIsAlreadyExists) {
  Status st = FailedCreate(Op::kRename, 1, EEXIST);
  EXPECT_EQ(st.code(), Status::Code::kAlreadyExists) << st.ToString();
  EXPECT_TRUE(Contains(st, "created while this store was being written")) << st.ToString();
}

TEST(StoreFaultTest, ShortWritesAreRetriedAndTheStoreIsExact) {
  for (size_t cut : {size_t{1}, size_t{7}, size_t{4093}}) {
    TempDir dir;
    FaultEnv env(dir.path());
    env.AddRule({.op = Op::kPWrite, .nth = 1, .every = true, .short_to = cut});
    env.AddRule({.op = Op::kPWriteV, .nth = 1, .every = true, .short_to = cut});
    ASSERT_TRUE(WriteStore(dir.Sub("s"), &env).ok());
    EXPECT_GT(env.Matches(0), 4);
    EXPECT_GT(env.Matches(1), 1);  // data-000's tail, in several calls
    ExpectWholeStore(dir.Sub("s"));
  }
}

// Stores of several huge pages per data file, from each kind of input: a
// dense array (written from the caller's buffer), ragged records from
// scattered pointers (small ones copied together), zstd pieces, in appends
// that end off any boundary.
// The store at `path` opens and verifies (default Env), and every 37th of
// its `count` records of `item` bytes reads back as the bytes at `want(i)`.
template <typename Want>
void ExpectRecordsReadBack(const std::string& path, uint64_t count, uint64_t item, Want want) {
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE((*s)->Verify(nullptr).ok());
  std::vector<uint8_t> out(item);
  for (uint64_t i = 0; i < count; i += 37) {
    ASSERT_TRUE((*s)->ReadRecord(i, out.data(), item).ok());
    ASSERT_EQ(std::memcmp(out.data(), want(i), item), 0) << i;
  }
}

TEST(StoreFaultTest, DataFilesAreWrittenInWholeHugePagesButTheirLastWrite) {
  struct Case {
    const char* name;
    Codec codec;
    bool ragged;
  };
  for (const Case c :
       {Case{"dense raw", Codec::kRaw, false}, Case{"dense zstd", Codec::kZstd, false},
        Case{"ragged raw", Codec::kRaw, true}}) {
    SCOPED_TRACE(c.name);
    TempDir dir;
    FaultEnv env(dir.path());
    ThreadPool pool(2);
    WriteOptions o;
    o.huge_page_writes = true;
    o.codec = c.codec;
    o.data_shards = 2;
    o.env = &env;
    o.pool = &pool;
    constexpr uint64_t kItem = 1000, kCount = 13000;  // 13 MB: 3+ huge pages per shard
    const std::vector<uint8_t> v = MakeBytes(kItem * kCount, 11);
    auto w = StoreWriter::Create(
        dir.Sub("s"), c.ragged ? RaggedSchema("|u1", 1) : testing::DenseSchema("|u1", {kItem}), o);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    std::vector<const void*> ptrs;
    std::vector<uint64_t> shapes;
    for (uint64_t i = 0; i < kCount; ++i) {
      // Scrambled: no two records neighbours in memory (copied together).
      ptrs.push_back(v.data() + ((i * 7919) % kCount) * kItem);
      shapes.push_back(kItem);
    }
    for (uint64_t first = 0; first < kCount;) {
      const uint64_t n = std::min<uint64_t>(kCount - first, 3001);
      Status st = c.ragged
                      ? (*w)->AppendRaggedRecords(ptrs.data() + first, shapes.data() + first, n)
                      : (*w)->AppendDense(v.data() + first * kItem, n);
      ASSERT_TRUE(st.ok()) << st.ToString();
      first += n;
    }
    ASSERT_TRUE((*w)->Publish().ok());
    EXPECT_GE(ExpectHugePageWrites(env, /*contiguous=*/true), c.codec == Codec::kRaw ? 6 : 2);
    ASSERT_NO_FATAL_FAILURE(ExpectRecordsReadBack(dir.Sub("s"), kCount, kItem, [&](uint64_t i) {
      return c.ragged ? static_cast<const uint8_t*>(ptrs[i]) : v.data() + i * kItem;
    }));
  }
}

TEST(StoreFaultTest, WithoutHugePageWritesDataFilesAreWrittenAsTheirPiecesCome) {
  TempDir dir;
  FaultEnv env(dir.path());
  ThreadPool pool(2);
  WriteOptions o;
  o.huge_page_writes = false;
  o.data_shards = 2;
  o.env = &env;
  o.pool = &pool;
  constexpr uint64_t kItem = 1000, kCount = 13000;
  const std::vector<uint8_t> v = MakeBytes(kItem * kCount, 11);
  auto w = StoreWriter::Create(dir.Sub("s"), testing::DenseSchema("|u1", {kItem}), o);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE((*w)->AppendDense(v.data(), kCount).ok());
  ASSERT_TRUE((*w)->Publish().ok());
  int data_writes = 0;
  for (const FaultEnv::Write& x : env.writes()) {
    if (x.path.find("/data-") == std::string::npos) continue;
    ++data_writes;
    EXPECT_LE(x.len, uint64_t{256} << 10);  // one piece (a run of at most 256 KiB)
  }
  EXPECT_GT(data_writes, 40);
  EXPECT_EQ(CountCalls(env, "pwritev"), 0);
  ASSERT_NO_FATAL_FAILURE(ExpectRecordsReadBack(dir.Sub("s"), kCount, kItem,
                                                [&](uint64_t i) { return v.data() + i * kItem; }));
}

TEST(StoreFaultTest, AWriteThatWritesNothingFailsInsteadOfLooping) {
  for (auto [op, call] : {std::pair{Op::kPWrite, "pwrite"}, std::pair{Op::kPWriteV, "pwritev"}}) {
    const int writes = CleanRunCalls().at(call);
    for (int n : {1, writes / 2, writes}) {
      if (n == 0) continue;
      SCOPED_TRACE(std::string(call) + " " + std::to_string(n));
      TempDir dir;
      FaultEnv env(dir.path());
      env.AddRule({.op = op, .nth = n, .short_to = 0});
      Status st = WriteStore(dir.Sub("s"), &env);
      EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
      EXPECT_TRUE(Contains(st, std::string(call) + " wrote nothing")) << st.ToString();
      EXPECT_TRUE(NamesAStoreFile(st)) << st.ToString();
      EXPECT_FALSE(Exists(dir.Sub("s")));
      EXPECT_EQ(Others(dir.path(), {}), std::set<std::string>{});
    }
  }
}

// --- Reads ---------------------------------------------------------------

// A store whose gathers read with pread: raw records of 64 KiB (>= the pread
// threshold) over 2 shards.
constexpr uint64_t kBigItem = uint64_t{64} << 10;
constexpr uint64_t kBigRecords = 12;

std::vector<uint8_t> BigValues() { return MakeBytes(kBigItem * kBigRecords, 9); }

void WriteBigStore(const std::string& path) {
  WriteOptions o;
  o.data_shards = 2;
  auto w = StoreWriter::Create(path, testing::DenseSchema("|u1", {kBigItem}), o);
  ASSERT_TRUE(w.ok());
  const auto v = BigValues();
  ASSERT_TRUE((*w)->AppendDense(v.data(), kBigRecords).ok());
  ASSERT_TRUE((*w)->Publish().ok());
}

Status GatherAll(const Store& s, std::vector<uint8_t>* out) {
  out->assign(kBigItem * kBigRecords, 0);
  std::vector<uint64_t> idx;
  std::vector<void*> outs;
  for (uint64_t i = 0; i < kBigRecords; ++i) {
    idx.push_back(i);
    outs.push_back(out->data() + i * kBigItem);
  }
  ThreadPool pool(2);
  return s.Gather(idx, outs, &pool);
}

// How many calls of `op` one open of `path` makes.
int OpenCalls(const std::string& path, Op op) {
  FaultEnv env;
  env.AddRule({.op = op, .nth = INT_MAX});
  EXPECT_TRUE(Store::Open(path, &env).ok());
  return env.Matches(0);
}

TEST(StoreFaultTest, EioOnEveryReadAtOpenFailsNamingTheFile) {
  TempDir dir;
  ASSERT_TRUE(WriteStore(dir.Sub("s"), nullptr).ok());
  const int reads = OpenCalls(dir.Sub("s"), Op::kPRead);
  std::cout << "pread at open: " << reads << "\n";
  ASSERT_GE(reads, 4);  // meta (twice: the file set, the store), dict, the tables' block sums
  std::set<std::string> named;
  for (int n = 1; n <= reads; ++n) {
    FaultEnv env;
    env.AddRule({.op = Op::kPRead, .nth = n, .err = EIO});
    auto s = Store::Open(dir.Sub("s"), &env);
    ASSERT_FALSE(s.ok()) << "read " << n;
    EXPECT_EQ(s.status().code(), Status::Code::kIOError) << s.status().ToString();
    EXPECT_TRUE(Contains(s.status(), "pread: " + std::string(std::strerror(EIO))))
        << s.status().ToString();
    EXPECT_TRUE(NamesAStoreFile(s.status())) << s.status().ToString();
    for (const char* f : {"/meta", "/index", "/shapes", "/dict"}) {
      if (Contains(s.status(), f)) named.insert(f);
    }
  }
  EXPECT_EQ(named, (std::set<std::string>{"/meta", "/index", "/shapes", "/dict"}));
  ExpectWholeStore(dir.Sub("s"));
}

TEST(StoreFaultTest, EveryFailingFstatAndMmapAtOpenFailsNamingTheFile) {
  TempDir dir;
  ASSERT_TRUE(WriteStore(dir.Sub("s"), nullptr).ok());
  for (Op op : {Op::kStat, Op::kMap, Op::kOpen}) {
    const int calls = OpenCalls(dir.Sub("s"), op);
    std::cout << (op == Op::kStat  ? "fstat"
                  : op == Op::kMap ? "mmap"
                                   : "open")
              << " at open: " << calls << "\n";
    ASSERT_GE(calls, 4);
    for (int n = 1; n <= calls; ++n) {
      FaultEnv env;
      env.AddRule({.op = op, .nth = n, .err = op == Op::kMap ? ENOMEM : EIO});
      auto s = Store::Open(dir.Sub("s"), &env);
      ASSERT_FALSE(s.ok());
      EXPECT_EQ(s.status().code(), Status::Code::kIOError) << s.status().ToString();
      EXPECT_TRUE(NamesAStoreFile(s.status())) << s.status().ToString();
    }
  }
}

// The daemon's path: descriptors opened elsewhere, validated through the Env.
TEST(StoreFaultTest, EioOnAReadOfPassedDescriptorsNamesTheFile) {
  TempDir dir;
  ASSERT_TRUE(WriteStore(dir.Sub("s"), nullptr).ok());
  auto files = Store::OpenFileSet(dir.Sub("s"));
  ASSERT_TRUE(files.ok());
  FaultEnv env;
  env.AddRule({.op = Op::kPRead, .path_part = "/shapes", .err = EIO});
  auto s = Store::FromFiles(std::move(*files), &env);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Status::Code::kIOError);
  EXPECT_TRUE(Contains(s.status(), dir.Sub("s") + "/shapes: pread")) << s.status().ToString();
}

TEST(StoreFaultTest, AReadOfNothingAtOpenIsCorruptionNamingTheFile) {
  TempDir dir;
  ASSERT_TRUE(WriteStore(dir.Sub("s"), nullptr).ok());
  FaultEnv env;
  env.AddRule({.op = Op::kPRead, .path_part = "/meta", .short_to = 0});
  auto s = Store::Open(dir.Sub("s"), &env);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Status::Code::kCorruption);
  EXPECT_TRUE(Contains(s.status(), "/meta: truncated (short read)")) << s.status().ToString();
}

TEST(StoreFaultTest, ShortReadsAreRetriedAtOpenAndGather) {
  TempDir dir;
  ASSERT_TRUE(WriteStore(dir.Sub("s"), nullptr).ok());
  WriteBigStore(dir.Sub("big"));
  for (size_t cut : {size_t{61}, size_t{4097}}) {
    FaultEnv env;
    env.AddRule({.op = Op::kPRead, .nth = 1, .every = true, .short_to = cut});
    auto s = Store::Open(dir.Sub("s"), &env);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ((*s)->size(), kRecords);
    auto big = Store::Open(dir.Sub("big"), &env);
    ASSERT_TRUE(big.ok()) << big.status().ToString();
    const int before = env.Matches(0);
    std::vector<uint8_t> out;
    ASSERT_TRUE(GatherAll(**big, &out).ok());
    EXPECT_EQ(out, BigValues());
    EXPECT_GE(env.Matches(0) - before, static_cast<int>(kBigRecords * (kBigItem / 4097)));
  }
}

TEST(StoreFaultTest, EioOnAReadAtGatherFailsNamingTheFileAndRecordThenReadsAgain) {
  TempDir dir;
  WriteBigStore(dir.Sub("big"));
  FaultEnv env;
  auto s = Store::Open(dir.Sub("big"), &env);
  ASSERT_TRUE(s.ok());
  env.AddRule({.op = Op::kPRead, .path_part = "/data-001", .nth = 1, .err = EIO});
  std::vector<uint8_t> out;
  Status st = GatherAll(**s, &out);
  EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
  EXPECT_TRUE(Contains(st, "/big/data-001: pread: " + std::string(std::strerror(EIO))))
      << st.ToString();
  EXPECT_TRUE(Contains(st, "record ")) << st.ToString();
  // A transient error: the next gather reads everything exactly.
  ASSERT_TRUE(GatherAll(**s, &out).ok());
  EXPECT_EQ(out, BigValues());
  std::vector<uint8_t> one(kBigItem);
  env.AddRule({.op = Op::kPRead, .nth = 1, .every = true, .err = EIO});
  st = (*s)->ReadRecord(3, one.data(), one.size());
  EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
  EXPECT_TRUE(Contains(st, "record 3")) << st.ToString();
}

// --- Crashes -------------------------------------------------------------

const char* ModelName(FaultEnv::NameModel m) {
  switch (m) {
    case FaultEnv::NameModel::kKeepAll:
      return "keep-all-names";
    case FaultEnv::NameModel::kDropUnsynced:
      return "drop-unsynced-names";
    case FaultEnv::NameModel::kKeepParentOnly:
      return "keep-parent-entries-only";
  }
  return "?";
}

// One create per crash point (every mutating call of a create, plus none),
// under each model of which unsynced directory operations survive: the path
// holds nothing or the whole verified store (`check`), never a part of one.
// Returns the number of crash points.
int CrashAtEveryPoint(const std::function<Status(const std::string&, Env*)>& write,
                      const std::function<void(const std::string&)>& check) {
  int points = 0;
  {
    TempDir dir;
    FaultEnv env(dir.path());
    EXPECT_TRUE(write(dir.Sub("s"), &env).ok());
    points = env.mutations();
  }
  for (auto model : {FaultEnv::NameModel::kKeepAll, FaultEnv::NameModel::kDropUnsynced,
                     FaultEnv::NameModel::kKeepParentOnly}) {
    int nothing = 0, whole = 0;
    for (int k = 1; k <= points + 1; ++k) {
      SCOPED_TRACE(std::string(ModelName(model)) + ", crash at call " + std::to_string(k));
      TempDir dir;
      FaultEnv env(dir.path());
      env.CrashAt(k);
      Status st = write(dir.Sub("s"), &env);
      EXPECT_EQ(st.ok(), k > points) << st.ToString();
      EXPECT_EQ(env.crashed(), k <= points);
      env.ApplyCrash(model);
      if (!Exists(dir.Sub("s"))) {
        ++nothing;
        continue;
      }
      ++whole;
      check(dir.Sub("s"));
      if (::testing::Test::HasFailure()) return points;
    }
    // Crash points after the rename (the parent's fsync) keep the store when
    // the rename survives; every earlier point leaves nothing.
    std::cout << ModelName(model) << ": " << points + 1 << " crash points, " << nothing
              << " nothing at the path, " << whole << " whole store\n";
    EXPECT_EQ(whole, model == FaultEnv::NameModel::kDropUnsynced ? 1 : 2);
    EXPECT_EQ(nothing + whole, points + 1);
  }
  return points;
}

TEST(StoreFaultTest, ACrashAtEveryPointOfACreateLeavesNothingOrTheWholeStore) {
  EXPECT_GT(CrashAtEveryPoint(WriteStore, ExpectWholeStore), 20);
}

// Records above stream_threshold are compressed straight into their shard,
// in pieces of 4 MiB of input; one that zstd cannot shrink is rewound and
// written raw. A rewind within the staged head of a huge page drops staged
// bytes; one whose compressed attempt already went out past a huge-page
// boundary reads the head back (pread) and cuts the file at the boundary
// (ftruncate). Even records are half compressible, odd ones incompressible;
// with 2 shards and one record per run, the odd ones all go to data-001.
struct Streamed {
  uint64_t item, records;
};
// 8 KiB records: all in one run (data-000), every rewind within the staging.
constexpr Streamed kSmallStream{8192, 10};
// 4.5 MiB records: the first 4 MiB of each odd record's attempt go out
// (data-001 at 0, then at 4.5 MiB) before zstd is seen to lose; the second
// rewind restages the 0.5 MiB after the 4 MiB boundary.
constexpr Streamed kLargeStream{(uint64_t{9} << 20) / 2, 4};

std::vector<uint8_t> StreamValues(Streamed k) {
  std::vector<uint8_t> v;
  std::mt19937_64 rng(3);
  for (uint64_t i = 0; i < k.records; ++i) {
    std::vector<uint8_t> r = MakeBytes(k.item, i);  // half compressible
    if (i % 2 == 1) {
      for (uint8_t& b : r) b = static_cast<uint8_t>(rng());  // incompressible
    }
    v.insert(v.end(), r.begin(), r.end());
  }
  return v;
}

Status WriteStreamedStore(Streamed k, const std::string& path, Env* env) {
  ThreadPool pool(2);
  WriteOptions o;
  o.huge_page_writes = true;
  o.codec = Codec::kZstd;
  o.data_shards = 2;
  o.stream_threshold = 4096;
  o.env = env;
  o.pool = &pool;
  auto w = StoreWriter::Create(path, testing::DenseSchema("|u1", {k.item}), o);
  if (!w.ok()) return w.status();
  const auto v = StreamValues(k);
  LX_RETURN_IF_ERROR((*w)->AppendDense(v.data(), k.records));
  return (*w)->Publish();
}

void ExpectWholeStreamedStore(Streamed k, const std::string& path) {
  auto s = Store::Open(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ((*s)->size(), k.records);
  ASSERT_TRUE((*s)->Verify(nullptr).ok());
  const auto v = StreamValues(k);
  std::vector<uint8_t> out(k.item);
  for (uint64_t i = 0; i < k.records; ++i) {
    ASSERT_TRUE((*s)->ReadRecord(i, out.data(), out.size()).ok());
    ASSERT_EQ(std::memcmp(out.data(), v.data() + i * k.item, k.item), 0) << i;
  }
}

TEST(StoreFaultTest, RewindsWithinAStagedHugePageTouchNoFile) {
  TempDir dir;
  FaultEnv env(dir.path());
  ASSERT_TRUE(WriteStreamedStore(kSmallStream, dir.Sub("s"), &env).ok());
  EXPECT_EQ(CountCalls(env, "ftruncate"), 0);
  EXPECT_EQ(CountCalls(env, "pwritev"), 1);  // data-000's tail (data-001 is empty)
  ExpectWholeStreamedStore(kSmallStream, dir.Sub("s"));
}

TEST(StoreFaultTest, RewindsAcrossAHugePageBoundaryRestageTheHeadAndCutTheFile) {
  TempDir dir;
  FaultEnv env(dir.path());
  env.AddRule({.op = Op::kPRead, .path_part = "/data-001", .nth = INT_MAX});  // counts only
  ASSERT_TRUE(WriteStreamedStore(kLargeStream, dir.Sub("s"), &env).ok());
  EXPECT_EQ(CountCalls(env, "ftruncate"), 2);
  EXPECT_GE(env.Matches(0), 1);  // the staged head read back
  // After a cut the next write starts on the boundary again.
  EXPECT_GT(ExpectHugePageWrites(env, /*contiguous=*/false), 4);
  ExpectWholeStreamedStore(kLargeStream, dir.Sub("s"));
}

TEST(StoreFaultTest, EioOnTheRewindOfAStreamedRecordFailsNamingTheFile) {
  for (Op op : {Op::kTruncate, Op::kPRead}) {
    TempDir dir;
    FaultEnv env(dir.path());
    env.AddRule({.op = op, .path_part = "/.s.zrecord-tmp-", .nth = 1, .err = EIO});
    Status st = WriteStreamedStore(kLargeStream, dir.Sub("s"), &env);
    EXPECT_EQ(env.Matches(0), 1);
    EXPECT_EQ(st.code(), Status::Code::kIOError) << st.ToString();
    const std::string call = op == Op::kTruncate ? "ftruncate: " : "pread: ";
    EXPECT_TRUE(Contains(st, call + std::strerror(EIO))) << st.ToString();
    EXPECT_TRUE(Contains(st, "/data-001")) << st.ToString();
    EXPECT_FALSE(Exists(dir.Sub("s")));
    EXPECT_EQ(Others(dir.path(), {}), std::set<std::string>{});
  }
}

TEST(StoreFaultTest, ACrashAtEveryPointOfAStreamedCreateWithRewindsLeavesNothingOrTheWholeStore) {
  {
    TempDir dir;
    FaultEnv env(dir.path());
    ASSERT_TRUE(WriteStreamedStore(kLargeStream, dir.Sub("s"), &env).ok());
    EXPECT_EQ(CountCalls(env, "ftruncate"), 2);  // the rewinds that crossed a boundary
  }
  auto write = [](const std::string& p, Env* e) { return WriteStreamedStore(kLargeStream, p, e); };
  auto check = [](const std::string& p) { ExpectWholeStreamedStore(kLargeStream, p); };
  EXPECT_GT(CrashAtEveryPoint(write, check), 20);
}

}  // namespace
}  // namespace loaderx
