// Env: the file-system seam of the store (leveldb's Env is the model).
//
// Every file operation of the store writer and reader goes through an Env:
// open/create, positional writes (one buffer or a gather list) and reads, truncation,
// fdatasync/fsync, the writeback hint (sync_file_range), fstat, read-only mappings, advisory locks
// (flock), and the directory operations (stat, mkdir, unlink, rmdir, listing,
// no-replace rename). Env::Default() is the platform's implementation: on
// Linux each call is exactly the syscall the store made before the seam
// existed, so the seam costs one virtual call per operation and nothing else;
// macOS replaces the calls it lacks, and Windows maps each call to Win32
// (env_posix.cc, env_win32.cc; docs/platforms.md).
//
// Tests substitute an Env that injects faults: ENOSPC and EIO on the n-th
// write, EIO on a sync or a read, short writes and reads, failing renames,
// and crashes that drop every write not yet synced (tests/common/fault_env.h).
// Faults a test Env cannot inject: a read error on a page of a mapping (the
// kernel raises SIGBUS) and torn sectors inside a synced write.
//
// Files are named by open descriptors: loaderxd receives a store as
// descriptors its client opened (Store::FromFiles), so the reader's calls take
// descriptors, not paths. Calls on descriptors return errors naming the call
// and the errno ("pwrite: No space left on device"); the caller adds the file
// name (the helpers below take it as `what`). Calls on paths name the path.
// Errors from errno are Status::FromErrno (IOError, NotFound for ENOENT,
// AlreadyExists for EEXIST).
//
// Thread-safety: an Env is called from many threads at once (a writer writes
// its shards in parallel, a store gathers on a pool): implementations must be
// thread-safe. Ownership: the caller owns an Env it passes to a writer or a
// store (WriteOptions::env, Store::Open); it must outlive them. Env::Default()
// lives for the whole process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loaderx/fd.h"
#include "loaderx/platform.h"
#include "loaderx/status.h"

namespace loaderx {

class Env {
 public:
  Env() = default;
  virtual ~Env() = default;
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

  // The platform's Env. Never null, never destroyed.
  static Env* Default();

  // --- Descriptors -------------------------------------------------------
  // open(2) with O_CLOEXEC added, EINTR retried. Errors name `path`.
  virtual Result<UniqueFd> Open(const std::string& path, int flags, mode_t mode) = 0;
  // One pwrite(2): may write fewer than `len` bytes and returns how many
  // (EINTR is retried). Use PWriteAll to write everything.
  virtual Result<size_t> PWrite(int fd, const void* data, size_t len, uint64_t offset) = 0;
  // One pwritev(2) of `iovcnt` (at most IOV_MAX) buffers written back to
  // back at `offset`: may write fewer bytes than they hold and returns how
  // many (EINTR is retried). Use PWriteVAll to write everything.
  virtual Result<size_t> PWriteV(int fd, const struct iovec* iov, int iovcnt, uint64_t offset) = 0;
  // One pread(2): may read fewer than `len` bytes; 0 means end of file.
  // Use PReadAll to read exactly `len` bytes.
  virtual Result<size_t> PRead(int fd, void* data, size_t len, uint64_t offset) = 0;
  // ftruncate(2).
  virtual Status Truncate(int fd, uint64_t size) = 0;
  // fdatasync(2): the content and the size are durable on return.
  virtual Status DataSync(int fd) = 0;
  // fsync(2); the store uses it on directories, to make their entries durable.
  virtual Status Sync(int fd) = 0;
  // sync_file_range(SYNC_FILE_RANGE_WRITE): starts writeback of the range and
  // waits for nothing. A hint: it durably guarantees nothing and reports
  // nothing (a later DataSync reports the errors).
  virtual void StartWriteback(int fd, uint64_t offset, uint64_t len) = 0;
  // fstat(2).
  virtual Status Stat(int fd, struct stat* st) = 0;
  // flock(LOCK_EX | LOCK_NB): true if this descriptor now holds the lock,
  // false if another open file description holds it.
  virtual Result<bool> TryLock(int fd) = 0;
  // A read-only shared mapping of bytes [0, length) (MappedRegion::Map).
  virtual Result<MappedRegion> Map(int fd, size_t length) = 0;

  // --- Names -------------------------------------------------------------
  // stat(2) (`follow`) or lstat(2). NotFound if the path or a parent is
  // missing (ENOENT, ENOTDIR).
  virtual Status StatPath(const std::string& path, bool follow, struct stat* st) = 0;
  // mkdir(2); AlreadyExists if `path` exists (a directory or not).
  virtual Status Mkdir(const std::string& path, mode_t mode) = 0;
  // unlink(2) and rmdir(2).
  virtual Status Unlink(const std::string& path) = 0;
  virtual Status Rmdir(const std::string& path) = 0;
  // The names in directory `dir`, without "." and "..", in no set order.
  virtual Result<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  // renameat2(RENAME_NOREPLACE): atomically renames `from` to `to`, or fails
  // with AlreadyExists if `to` exists (EEXIST, ENOTEMPTY), never replacing it.
  virtual Status RenameNoReplace(const std::string& from, const std::string& to) = 0;
};

// Helpers over any Env: the retry loops live here once, so every Env gets
// the same handling of short I/O.

// Writes all of [data, data+len) at `offset`, retrying short writes. An
// error names `what`; a write that makes no progress is an IOError.
Status PWriteAll(Env& env, int fd, const void* data, size_t len, uint64_t offset,
                 const std::string& what);
// Writes all the bytes of iov[0..iovcnt) back to back at `offset`, retrying
// short writes (from where the last one stopped, so one call of a retry may
// start inside a buffer). An error names `what`; no progress is an IOError.
Status PWriteVAll(Env& env, int fd, const struct iovec* iov, int iovcnt, uint64_t offset,
                  const std::string& what);
// Reads exactly `len` bytes at `offset`, retrying short reads. End of file
// first is Corruption("<what>: truncated (short read)"); an error names `what`.
Status PReadAll(Env& env, int fd, void* data, size_t len, uint64_t offset, const std::string& what);
// Size of an open file (fstat); an error names `what`.
Result<uint64_t> FileSize(Env& env, int fd, const std::string& what);
// fsync of directory `dir` (opened read-only): makes its entries durable.
Status SyncDir(Env& env, const std::string& dir);
// mkdir -p: creates `dir` and its missing parents. OK if `dir` is already a
// directory; an error names the directory that could not be made.
Status CreateDirs(Env& env, const std::string& dir);
// rm -r: removes `path` (a file, or a directory and everything under it;
// symlinks are removed, never followed). The first error is returned after
// removing what can be removed; a missing `path` is OK.
Status RemoveTree(Env& env, const std::string& path);

}  // namespace loaderx
