#include "log.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace loaderx::daemon {
namespace {

// A child that exits (or is killed) and stays a zombie until reaped.
pid_t Zombie(bool kill_it) {
  pid_t pid = ::fork();
  if (pid == 0) {
    if (kill_it) ::pause();
    ::_exit(3);
  }
  if (kill_it) ::kill(pid, SIGKILL);
  siginfo_t info{};
  // WNOWAIT: wait until it has exited but leave it a zombie.
  ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT);
  return pid;
}

TEST(PeerFateTest, NamesHowAProcessEnded) {
  EXPECT_EQ(PeerFate(::getpid(), ::geteuid()), "is still running");
  pid_t exited = Zombie(false);
  EXPECT_EQ(PeerFate(exited, ::geteuid()), "exited with status 3");
  pid_t killed = Zombie(true);
  EXPECT_EQ(PeerFate(killed, ::geteuid()), "was killed by signal 9 (SIGKILL)");
  int status = 0;
  ::waitpid(exited, &status, 0);
  ::waitpid(killed, &status, 0);
  EXPECT_EQ(PeerFate(exited, ::geteuid()), "has exited");  // reaped: nothing left to read
  EXPECT_EQ(PeerFate(0, ::geteuid()), "is unknown");
}

}  // namespace
}  // namespace loaderx::daemon
