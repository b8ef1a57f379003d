// The temporary directories of writers that died (SIGKILL, a crash, _exit)
// are swept by the next StoreWriter::Create in the same parent, once their
// writer is provably gone (nobody holds the directory's lock and its pid is
// dead); a live writer's directory is never touched.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>

#include "loaderx/thread_pool.h"
#include "store_test_util.h"

namespace loaderx {
namespace {

using testing::DenseSchema;
using testing::TempDir;
namespace fs = std::filesystem;

std::set<std::string> Entries(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

size_t TmpDirs(const std::string& dir) {
  size_t n = 0;
  for (const std::string& e : Entries(dir)) n += e.find(".zrecord-tmp-") != std::string::npos;
  return n;
}

// Forks a child that starts a writer of `name` under `dir` and then, with
// the writer still open, dies by SIGKILL (hold = false) or waits to be
// killed (hold = true; the parent gets its pid back).
pid_t WriterChild(const std::string& dir, const std::string& name, bool hold) {
  int ready[2];
  EXPECT_EQ(::pipe(ready), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    ThreadPool pool(1);
    WriteOptions o;
    o.pool = &pool;
    auto w = StoreWriter::Create(dir + "/" + name, DenseSchema("|u1", {8}), o);
    if (!w.ok()) ::_exit(3);
    std::vector<uint8_t> rec(8 * 100, 7);
    if (!(*w)->AppendDense(rec.data(), 100).ok()) ::_exit(4);
    char c = 'r';
    if (::write(ready[1], &c, 1) != 1) ::_exit(5);
    if (hold) ::pause();
    ::raise(SIGKILL);
  }
  ::close(ready[1]);
  char c = 0;
  EXPECT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  return pid;
}

void Reap(pid_t pid) {
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

Status WriteOne(const std::string& path) {
  auto w = StoreWriter::Create(path, DenseSchema("|u1", {8}), WriteOptions{});
  if (!w.ok()) return w.status();
  std::vector<uint8_t> rec(8, 1);
  LX_RETURN_IF_ERROR((*w)->AppendDense(rec.data(), 1));
  return (*w)->Publish();
}

TEST(StoreSweepTest, KilledWritersLeaveTmpDirsThatTheNextCreateSweeps) {
  TempDir dir;
  for (int i = 0; i < 3; ++i) {
    Reap(WriterChild(dir.path(), "s" + std::to_string(i), false));
    // Each killed writer's Create swept the one before: they never pile up.
    EXPECT_EQ(TmpDirs(dir.path()), 1u) << i;
  }
  EXPECT_EQ(Entries(dir.path()).count("s2"), 0u);  // nothing published
  ASSERT_TRUE(WriteOne(dir.Sub("next")).ok());
  EXPECT_EQ(Entries(dir.path()), std::set<std::string>{"next"});
}

TEST(StoreSweepTest, ALiveWritersTmpDirIsNeverSwept) {
  TempDir dir;
  const pid_t live = WriterChild(dir.path(), "busy", true);
  ASSERT_TRUE(WriteOne(dir.Sub("a")).ok());
  EXPECT_EQ(TmpDirs(dir.path()), 1u);  // the live writer's
  ::kill(live, SIGKILL);
  Reap(live);
  ASSERT_TRUE(WriteOne(dir.Sub("b")).ok());
  EXPECT_EQ(Entries(dir.path()), (std::set<std::string>{"a", "b"}));
}

TEST(StoreSweepTest, UnlockedTmpDirOfALivePidIsKeptUntilThePidIsGone) {
  TempDir dir;
  // A writer between its mkdir and its flock: no lock yet, its pid alive.
  const pid_t sleeper = ::fork();
  if (sleeper == 0) {
    ::pause();
    ::_exit(0);
  }
  const std::string name = ".x.zrecord-tmp-" + std::to_string(sleeper) + "-0000000000000000";
  ASSERT_TRUE(fs::create_directory(dir.Sub(name)));
  ASSERT_TRUE(WriteOne(dir.Sub("a")).ok());
  EXPECT_EQ(Entries(dir.path()).count(name), 1u);
  ::kill(sleeper, SIGKILL);
  Reap(sleeper);
  ASSERT_TRUE(WriteOne(dir.Sub("b")).ok());
  EXPECT_EQ(Entries(dir.path()).count(name), 0u);
}

TEST(StoreSweepTest, OtherHiddenEntriesAreUntouched) {
  TempDir dir;
  ASSERT_TRUE(fs::create_directory(dir.Sub(".git")));
  ASSERT_TRUE(fs::create_directory(dir.Sub(".zrecord-tmp")));  // no marker with a dash
  testing::WriteFileBytes(dir.Sub(".y.zrecord-tmp-1-abc"), "a file, not a writer's directory");
  ASSERT_TRUE(WriteOne(dir.Sub("a")).ok());
  EXPECT_EQ(Entries(dir.path()),
            (std::set<std::string>{".git", ".zrecord-tmp", ".y.zrecord-tmp-1-abc", "a"}));
}

}  // namespace
}  // namespace loaderx
