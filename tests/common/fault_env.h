// FaultEnv: an Env for tests that forwards to a real Env (the POSIX one by
// default) and injects faults: an errno on the n-th matching call, short
// reads and writes, and a crash model.
//
// Faults are rules: a rule matches calls of one operation whose file path
// contains a given piece ("data-000", "meta", "" for any). Descriptors are
// named by their current path (/proc/self/fd), so a rule on "meta" also
// hits descriptors a test opened itself and passed to Store::FromFiles.
//
// The crash model: Crash() (or CrashAt(k), which crashes instead of doing the
// k-th mutating call) marks the process dead: from then on every call fails
// with EIO and changes nothing, as a killed writer would do nothing more
// (its destructor's cleanup included). ApplyCrash(model) then rewrites the
// real files to a state a power cut at that instant could leave:
//  * every file's content is what its last DataSync made durable (a file
//    never synced is empty): unsynced writes and truncations are dropped;
//  * directory operations (create, mkdir, rename, unlink, rmdir) followed by
//    an fsync of their directory stay; the others persist or not as `model`
//    says: all of them, none of them, or only those in the search root (the
//    store's parent: its entries reach the disk before those of the
//    directories made in it).
// Files are tracked by inode, so a file keeps its durable content across the
// rename of its directory. Only calls made through this Env are tracked.
//
// Thread-safety: every method may be called from any thread (the writer
// writes shards in parallel).
#pragma once

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loaderx/env.h"

namespace loaderx::testing {

class FaultEnv final : public Env {
 public:
  enum class Op {
    kOpen,
    kPWrite,
    kPWriteV,
    kPRead,
    kTruncate,
    kDataSync,
    kSync,
    kStat,
    kTryLock,
    kMap,
    kStatPath,
    kMkdir,
    kUnlink,
    kRmdir,
    kListDir,
    kRename,
  };
  struct Rule {
    Op op = Op::kOpen;
    std::string path_part = "";  // matches calls on paths containing it ("" = any)
    int nth = 1;                 // the first matching call that fails (1-based)
    bool every = false;          // and every matching call after it
    int err = EIO;               // errno of the failure
    // PRead/PWrite/PWriteV only: instead of failing, transfer at most this many bytes
    // (0: a write that writes nothing, a read that reads nothing).
    std::optional<size_t> short_to = std::nullopt;
  };
  enum class NameModel { kKeepAll, kDropUnsynced, kKeepParentOnly };

  // `search_root`: where ApplyCrash looks for the files it tracked (the
  // test's temporary directory; only needed by crash tests).
  explicit FaultEnv(std::string search_root = "", Env* base = Env::Default())
      : base_(base), search_root_(std::move(search_root)) {}

  void AddRule(Rule r) {
    std::lock_guard<std::mutex> l(mu_);
    rules_.push_back({std::move(r), 0});
  }
  // How many times a rule has matched (whether or not it fired yet).
  int Matches(size_t rule) const {
    std::lock_guard<std::mutex> l(mu_);
    return rules_.at(rule).seen;
  }
  // Crashes instead of doing the k-th (1-based) mutating call: creating
  // opens, writes, truncations, syncs and directory changes.
  void CrashAt(int k) {
    std::lock_guard<std::mutex> l(mu_);
    crash_at_ = k;
  }
  // Mutating calls done so far.
  int mutations() const {
    std::lock_guard<std::mutex> l(mu_);
    return mutations_;
  }
  bool crashed() const {
    std::lock_guard<std::mutex> l(mu_);
    return crashed_;
  }
  // The names of the mutating calls done, in order ("pwrite <path>").
  std::vector<std::string> log() const {
    std::lock_guard<std::mutex> l(mu_);
    return log_;
  }
  // The byte ranges asked of the base Env by pwrite and pwritev calls, in order.
  struct Write {
    std::string path;
    uint64_t offset = 0, len = 0;
  };
  std::vector<Write> writes() const {
    std::lock_guard<std::mutex> l(mu_);
    return writes_;
  }

  // Rewrites the real files as a power cut at the crash could leave them
  // (see the file comment). Call once, after the writer is gone.
  void ApplyCrash(NameModel model) {
    std::lock_guard<std::mutex> l(mu_);
    // Directory operations first, newest first, so each undo sees the names
    // the operation left.
    for (auto it = dirops_.rbegin(); it != dirops_.rend(); ++it) {
      const DirOp& d = *it;
      if (d.synced) continue;
      const bool keep = model == NameModel::kKeepAll ||
                        (model == NameModel::kKeepParentOnly && d.dir == RootIno());
      if (keep) continue;
      switch (d.kind) {
        case DirOp::kCreate:
        case DirOp::kMkdir: {
          // Where it is now (its directory may have been renamed since).
          const std::string at = FindInode(d.ino);
          if (!at.empty()) (void)RemoveTree(*base_, at);
          break;
        }
        case DirOp::kRename:
          (void)::rename(d.to.c_str(), d.from.c_str());
          break;
        case DirOp::kRemove:
          break;  // cannot bring back a removed file: tests avoid it
      }
    }
    for (const auto& [ino, durable] : content_) {
      const std::string at = FindInode(ino);
      if (at.empty()) continue;
      const int fd = ::open(at.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd < 0) continue;
      if (::ftruncate(fd, 0) == 0 && durable.has_value() && !durable->empty()) {
        (void)!::pwrite(fd, durable->data(), durable->size(), 0);
      }
      ::close(fd);
    }
  }

  // --- Env ---------------------------------------------------------------
  Result<UniqueFd> Open(const std::string& path, int flags, mode_t mode) override {
    const bool creates = (flags & O_CREAT) != 0;
    LX_RETURN_IF_ERROR(Enter(Op::kOpen, path, creates, "open", nullptr, true, true));
    auto fd = base_->Open(path, flags, mode);
    if (fd.ok() && creates) {
      std::lock_guard<std::mutex> l(mu_);
      const Ino ino = InoOf(fd->get());
      if (!content_.count(ino)) content_[ino] = std::nullopt;  // created: nothing durable yet
      AddDirOp({DirOp::kCreate, ParentIno(path), ino, "", ""});
    }
    return fd;
  }
  Result<size_t> PWrite(int fd, const void* data, size_t len, uint64_t offset) override {
    std::optional<size_t> cut;
    LX_RETURN_IF_ERROR(Enter(Op::kPWrite, FdPath(fd), true, "pwrite", &cut));
    Track(fd);
    const size_t n = cut ? std::min(len, *cut) : len;
    Wrote(fd, offset, n);
    return base_->PWrite(fd, data, n, offset);
  }
  Result<size_t> PWriteV(int fd, const struct iovec* iov, int iovcnt, uint64_t offset) override {
    std::optional<size_t> cut;
    LX_RETURN_IF_ERROR(Enter(Op::kPWriteV, FdPath(fd), true, "pwritev", &cut));
    Track(fd);
    // A short write: the list cut after `*cut` bytes.
    std::vector<struct iovec> list(iov, iov + iovcnt);
    size_t total = 0;
    for (struct iovec& v : list) {
      if (cut) v.iov_len = std::min(v.iov_len, *cut - std::min(*cut, total));
      total += v.iov_len;
    }
    Wrote(fd, offset, total);
    if (total == 0) return size_t{0};
    return base_->PWriteV(fd, list.data(), iovcnt, offset);
  }
  Result<size_t> PRead(int fd, void* data, size_t len, uint64_t offset) override {
    std::optional<size_t> cut;
    LX_RETURN_IF_ERROR(Enter(Op::kPRead, FdPath(fd), false, "pread", &cut));
    if (cut && *cut == 0) return size_t{0};
    return base_->PRead(fd, data, cut ? std::min(len, *cut) : len, offset);
  }
  Status Truncate(int fd, uint64_t size) override {
    LX_RETURN_IF_ERROR(Enter(Op::kTruncate, FdPath(fd), true, "ftruncate"));
    Track(fd);
    return base_->Truncate(fd, size);
  }
  Status DataSync(int fd) override {
    LX_RETURN_IF_ERROR(Enter(Op::kDataSync, FdPath(fd), true, "fdatasync"));
    LX_RETURN_IF_ERROR(base_->DataSync(fd));
    std::lock_guard<std::mutex> l(mu_);
    content_[InoOf(fd)] = ReadAllOf(fd);
    return Status::OK();
  }
  Status Sync(int fd) override {
    LX_RETURN_IF_ERROR(Enter(Op::kSync, FdPath(fd), true, "fsync"));
    LX_RETURN_IF_ERROR(base_->Sync(fd));
    std::lock_guard<std::mutex> l(mu_);
    struct stat st;
    if (::fstat(fd, &st) != 0) return Status::OK();
    if (S_ISDIR(st.st_mode)) {
      const Ino dir{st.st_dev, st.st_ino};
      for (DirOp& d : dirops_) d.synced |= d.dir == dir;
    } else {
      content_[InoOf(fd)] = ReadAllOf(fd);
    }
    return Status::OK();
  }
  void StartWriteback(int fd, uint64_t offset, uint64_t len) override {
    if (Enter(Op::kPWrite, FdPath(fd), false, "sync_file_range", nullptr, /*count=*/false).ok()) {
      base_->StartWriteback(fd, offset, len);
    }
  }
  Status Stat(int fd, struct stat* st) override {
    LX_RETURN_IF_ERROR(Enter(Op::kStat, FdPath(fd), false, "fstat"));
    return base_->Stat(fd, st);
  }
  Result<bool> TryLock(int fd) override {
    LX_RETURN_IF_ERROR(Enter(Op::kTryLock, FdPath(fd), false, "flock"));
    return base_->TryLock(fd);
  }
  Result<MappedRegion> Map(int fd, size_t length) override {
    LX_RETURN_IF_ERROR(Enter(Op::kMap, FdPath(fd), false, "mmap"));
    return base_->Map(fd, length);
  }
  Status StatPath(const std::string& path, bool follow, struct stat* st) override {
    LX_RETURN_IF_ERROR(Enter(Op::kStatPath, path, false, "stat", nullptr, true, true));
    return base_->StatPath(path, follow, st);
  }
  Status Mkdir(const std::string& path, mode_t mode) override {
    LX_RETURN_IF_ERROR(Enter(Op::kMkdir, path, true, "mkdir", nullptr, true, true));
    LX_RETURN_IF_ERROR(base_->Mkdir(path, mode));
    std::lock_guard<std::mutex> l(mu_);
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) {
      AddDirOp({DirOp::kMkdir, ParentIno(path), Ino{st.st_dev, st.st_ino}, "", ""});
    }
    return Status::OK();
  }
  Status Unlink(const std::string& path) override {
    LX_RETURN_IF_ERROR(Enter(Op::kUnlink, path, true, "unlink", nullptr, true, true));
    LX_RETURN_IF_ERROR(base_->Unlink(path));
    std::lock_guard<std::mutex> l(mu_);
    AddDirOp({DirOp::kRemove, ParentIno(path), Ino{}, path, ""});
    return Status::OK();
  }
  Status Rmdir(const std::string& path) override {
    LX_RETURN_IF_ERROR(Enter(Op::kRmdir, path, true, "rmdir", nullptr, true, true));
    LX_RETURN_IF_ERROR(base_->Rmdir(path));
    std::lock_guard<std::mutex> l(mu_);
    AddDirOp({DirOp::kRemove, ParentIno(path), Ino{}, path, ""});
    return Status::OK();
  }
  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    LX_RETURN_IF_ERROR(Enter(Op::kListDir, dir, false, "readdir", nullptr, true, true));
    return base_->ListDir(dir);
  }
  Status RenameNoReplace(const std::string& from, const std::string& to) override {
    LX_RETURN_IF_ERROR(Enter(Op::kRename, from + " -> " + to, true, "rename", nullptr, true, true));
    LX_RETURN_IF_ERROR(base_->RenameNoReplace(from, to));
    std::lock_guard<std::mutex> l(mu_);
    AddDirOp({DirOp::kRename, ParentIno(to), Ino{}, from, to});
    return Status::OK();
  }

 private:
  struct Ino {
    dev_t dev = 0;
    ino_t ino = 0;
    auto operator<=>(const Ino&) const = default;
  };
  struct DirOp {
    enum Kind { kCreate, kMkdir, kRename, kRemove } kind;
    Ino dir;  // the directory whose entries it changes
    Ino ino;  // create/mkdir: what it made
    std::string from, to;
    bool synced = false;
  };
  struct RuleState {
    Rule rule;
    int seen;
  };

  // Counts the call, applies a crash or a matching rule. `cut` receives a
  // short-I/O limit. Path calls name the path in their error, descriptor
  // calls only the call (callers add the file name, as with the POSIX Env).
  Status Enter(Op op, const std::string& path, bool mutating, const char* call,
               std::optional<size_t>* cut = nullptr, bool count = true, bool named = false) {
    std::lock_guard<std::mutex> l(mu_);
    const std::string who = named ? path + ": " + call : std::string(call);
    if (crashed_) return Status::FromErrno(who + " (after the crash)", EIO);
    if (mutating && count) {
      if (crash_at_ > 0 && mutations_ + 1 == crash_at_) {
        crashed_ = true;
        return Status::FromErrno(who + " (the crash)", EIO);
      }
      ++mutations_;
      log_.push_back(std::string(call) + " " + path);
    }
    if (!count) return Status::OK();
    for (RuleState& r : rules_) {
      if (r.rule.op != op || path.find(r.rule.path_part) == std::string::npos) continue;
      ++r.seen;
      if (r.seen != r.rule.nth && !(r.rule.every && r.seen > r.rule.nth)) continue;
      if (r.rule.short_to.has_value() && cut != nullptr) {
        *cut = r.rule.short_to;
        continue;
      }
      if (mutating && count) {  // it did not happen
        --mutations_;
        log_.pop_back();
      }
      return Status::FromErrno(who, r.rule.err);
    }
    return Status::OK();
  }

  static std::string FdPath(int fd) {
    char buf[PATH_MAX];
    const std::string link = "/proc/self/fd/" + std::to_string(fd);
    const ssize_t n = ::readlink(link.c_str(), buf, sizeof(buf) - 1);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : link;
  }
  static Ino InoOf(int fd) {
    struct stat st;
    if (::fstat(fd, &st) != 0) return {};
    return {st.st_dev, st.st_ino};
  }
  static Ino ParentIno(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    const std::string parent = slash == std::string::npos ? "."
                               : slash == 0               ? "/"
                                                          : path.substr(0, slash);
    struct stat st;
    if (::stat(parent.c_str(), &st) != 0) return {};
    return {st.st_dev, st.st_ino};
  }
  static std::string ReadAllOf(int fd) {
    std::string s;
    struct stat st;
    if (::fstat(fd, &st) != 0) return s;
    s.resize(static_cast<size_t>(st.st_size));
    // The descriptor may be write-only: read through a fresh one.
    const int r = ::open(FdPath(fd).c_str(), O_RDONLY | O_CLOEXEC);
    if (r < 0) return {};
    size_t got = 0;
    while (got < s.size()) {
      const ssize_t n = ::pread(r, s.data() + got, s.size() - got, static_cast<off_t>(got));
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    ::close(r);
    s.resize(got);
    return s;
  }
  void Track(int fd) {
    std::lock_guard<std::mutex> l(mu_);
    const Ino ino = InoOf(fd);
    if (!content_.count(ino)) content_[ino] = std::nullopt;
  }
  void Wrote(int fd, uint64_t offset, uint64_t len) {
    std::lock_guard<std::mutex> l(mu_);
    writes_.push_back({FdPath(fd), offset, len});
  }
  void AddDirOp(DirOp d) { dirops_.push_back(std::move(d)); }
  // The current path of an inode, searched under the search root.
  Ino RootIno() const {
    struct stat st;
    if (search_root_.empty() || ::stat(search_root_.c_str(), &st) != 0) return {};
    return {st.st_dev, st.st_ino};
  }
  std::string FindInode(const Ino& want) const {
    return search_root_.empty() ? std::string() : FindUnder(search_root_, want, 4);
  }
  static std::string FindUnder(const std::string& dir, const Ino& want, int depth) {
    auto names = Env::Default()->ListDir(dir);
    if (!names.ok()) return {};
    for (const std::string& n : *names) {
      const std::string p = dir + "/" + n;
      struct stat st;
      if (::lstat(p.c_str(), &st) != 0) continue;
      if (Ino{st.st_dev, st.st_ino} == want) return p;
      if (S_ISDIR(st.st_mode) && depth > 0) {
        std::string hit = FindUnder(p, want, depth - 1);
        if (!hit.empty()) return hit;
      }
    }
    return {};
  }

  Env* const base_;
  mutable std::mutex mu_;
  std::vector<RuleState> rules_;
  int crash_at_ = 0, mutations_ = 0;
  bool crashed_ = false;
  std::vector<std::string> log_;
  std::vector<Write> writes_;
  std::map<Ino, std::optional<std::string>> content_;  // durable content, by inode
  std::vector<DirOp> dirops_;
  std::string search_root_;
};

}  // namespace loaderx::testing
