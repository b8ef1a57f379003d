#include "config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "common/store_test_util.h"

namespace loaderx::daemon {
namespace {

Result<Config> Parse(std::vector<std::string> args) {
  std::string help;
  return ParseArgs(args, &help);
}

TEST(ConfigTest, FlagsSetEveryField) {
  auto c = Parse({"--socket",
                  "/tmp/x.sock",
                  "--threads",
                  "3",
                  "--memory-limit",
                  "2G",
                  "--memory-per-uid=512M",
                  "--sessions-per-uid",
                  "5",
                  "--max-leases",
                  "9",
                  "--max-prefetch",
                  "7",
                  "--max-skew",
                  "3",
                  "--group-prefetch",
                  "0",
                  "--group-live-batches",
                  "5",
                  "--socket-mode",
                  "0600",
                  "--log-level",
                  "debug",
                  "--foreground"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->socket_path, "/tmp/x.sock");
  EXPECT_EQ(c->threads, 3u);
  EXPECT_EQ(c->memory_limit, uint64_t{2} << 30);
  EXPECT_EQ(c->memory_per_uid, uint64_t{512} << 20);
  EXPECT_EQ(c->sessions_per_uid, 5u);
  EXPECT_EQ(c->max_leases, 9u);
  EXPECT_EQ(c->max_prefetch, 7u);
  EXPECT_EQ(c->max_skew, 3u);
  EXPECT_EQ(c->group_prefetch, 0u);
  EXPECT_EQ(c->group_live_batches, 5u);
  EXPECT_EQ(c->socket_mode, 0600u);
  EXPECT_EQ(c->log_level, LogLevel::kDebug);
  EXPECT_TRUE(c->foreground);
  EXPECT_FALSE(c->check_config);
}

TEST(ConfigTest, GroupTimeoutLogFileAndPidFile) {
  auto c = Parse({"--socket", "/s"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->group_timeout, std::chrono::minutes(5));
  EXPECT_EQ(c->log_file, "");
  EXPECT_EQ(c->pid_file, "");
  c = Parse({"--socket", "/s", "--group-timeout", "0.25", "--log-file", "/var/log/x.log",
             "--pid-file=/run/x.pid"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->group_timeout, std::chrono::milliseconds(250));
  EXPECT_EQ(c->log_file, "/var/log/x.log");
  EXPECT_EQ(c->pid_file, "/run/x.pid");
  c = Parse({"--socket", "/s", "--group-timeout", "86400"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->group_timeout, std::chrono::hours(24));
  for (const char* v : {"0", "0.09", "86400.5", "5m", "", ".", "1.2.3", "-1"}) {
    auto b = Parse({"--socket", "/s", "--group-timeout", v});
    ASSERT_FALSE(b.ok()) << v;
    EXPECT_EQ(b.status().message(),
              std::string("group-timeout: '") + v + "' is not a number of seconds in 0.1..86400");
  }
  auto empty = Parse({"--socket", "/s", "--log-file", ""});
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().message(), "log-file: empty path");
}

TEST(ConfigTest, PerUidMemoryDefaultsToAndIsCappedByTheLimit) {
  auto c = Parse({"--socket", "/s", "--memory-limit", "1G"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->memory_per_uid, uint64_t{1} << 30);
  c = Parse({"--socket", "/s", "--memory-limit", "1G", "--memory-per-uid", "4G"});
  EXPECT_EQ(c->memory_per_uid, uint64_t{1} << 30);
}

TEST(ConfigTest, BadValuesNameTheSetting) {
  auto bad = [](std::vector<std::string> args, const std::string& needle) {
    auto c = Parse(args);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), Status::Code::kInvalidArgument);
    EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status().message();
  };
  bad({"--threads", "-1"}, "threads");
  bad({"--threads", "x"}, "threads");
  bad({"--memory-limit", "12Q"}, "size");
  bad({"--memory-limit", "10"}, "memory-limit");
  bad({"--log-level", "loud"}, "log-level");
  bad({"--socket-mode", "999"}, "socket-mode");
  bad({"--max-leases", "0"}, "max-leases");
  bad({"--max-skew", "1025"}, "max-skew");
  bad({"--group-prefetch", "1025"}, "group-prefetch");
  bad({"--group-prefetch", "-1"}, "group-prefetch");
  bad({"--group-live-batches", "1025"}, "group-live-batches: 1025 exceeds 1024");
  bad({"--group-live-batches", "two"}, "group-live-batches: 'two' is not a non-negative integer");
  bad({"--bogus", "1"}, "unknown option --bogus");
  bad({"--socket"}, "missing value");
  bad({"stray"}, "unexpected argument");
}

TEST(ConfigTest, FileSettingsApplyAndCommandLineWins) {
  testing::TempDir dir;
  std::string path = dir.Sub("loaderxd.conf");
  std::ofstream(path) << "# comment\nsocket = /from/file.sock\nthreads = 6  # trailing\n\n"
                         "max-leases=12\n";
  auto c = Parse({"--config", path, "--threads", "2"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->socket_path, "/from/file.sock");
  EXPECT_EQ(c->threads, 2u);
  EXPECT_EQ(c->max_leases, 12u);
  EXPECT_EQ(c->max_skew, 8u);  // the default
  EXPECT_EQ(c->group_prefetch, 1u);
  EXPECT_EQ(c->group_live_batches, 2u);  // the default
}

TEST(ConfigTest, FileErrorsNameFileAndLine) {
  testing::TempDir dir;
  std::string path = dir.Sub("bad.conf");
  std::ofstream(path) << "socket = /s\nthreads = many\n";
  auto c = Parse({"--config", path});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("bad.conf:2"), std::string::npos) << c.status().message();
  std::ofstream(path) << "no equals sign\n";
  EXPECT_FALSE(Parse({"--config", path}).ok());
  EXPECT_EQ(Parse({"--config", dir.Sub("missing.conf")}).status().code(), Status::Code::kNotFound);
}

TEST(ConfigTest, DefaultSocketFollowsXdgRuntimeDirForUsers) {
  if (::geteuid() == 0) {
    EXPECT_EQ(DefaultSocketPath().value(), "/run/loaderx/loaderxd.sock");
    return;
  }
  ::setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
  EXPECT_EQ(DefaultSocketPath().value(), "/run/user/1234/loaderx/loaderxd.sock");
}

TEST(ConfigTest, GatherNiceDefaultsToZeroAndAcceptsZeroToNineteen) {
  auto c = Parse({"--socket", "/s"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->gather_nice, 0);
  EXPECT_EQ(c->gather_nice, kDefaultGatherNice);
  EXPECT_EQ(Parse({"--socket", "/s", "--gather-nice", "10"})->gather_nice, 10);
  EXPECT_EQ(Parse({"--socket", "/s", "--gather-nice", "0"})->gather_nice, 0);
  EXPECT_EQ(Parse({"--socket", "/s", "--gather-nice=19"})->gather_nice, 19);
  testing::TempDir dir;
  std::string path = dir.Sub("nice.conf");
  std::ofstream(path) << "gather-nice = 4\n";
  EXPECT_EQ(Parse({"--socket", "/s", "--config", path})->gather_nice, 4);
  EXPECT_EQ(Parse({"--socket", "/s", "--config", path, "--gather-nice", "2"})->gather_nice, 2);
}

TEST(ConfigTest, GatherNiceOutOfRangeNamesTheSettingAndTheBound) {
  for (const char* v : {"20", "-1", "ten", ""}) {
    auto c = Parse({"--socket", "/s", "--gather-nice", v});
    ASSERT_FALSE(c.ok()) << v;
    EXPECT_EQ(c.status().code(), Status::Code::kInvalidArgument);
    EXPECT_NE(c.status().message().find("gather-nice"), std::string::npos) << c.status().message();
  }
  EXPECT_NE(Parse({"--gather-nice", "20"}).status().message().find("19"), std::string::npos);
  testing::TempDir dir;
  std::string path = dir.Sub("bad.conf");
  std::ofstream(path) << "gather-nice = 25\n";
  auto c = Parse({"--socket", "/s", "--config", path});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("bad.conf:1"), std::string::npos) << c.status().message();
}

TEST(ConfigTest, HelpAndSizes) {
  std::string help;
  ASSERT_TRUE(ParseArgs({"--help"}, &help).ok());
  EXPECT_NE(help.find("--memory-limit"), std::string::npos);
  EXPECT_NE(help.find("--gather-nice N"), std::string::npos);
  EXPECT_EQ(ParseSize("3K").value(), 3072u);
  EXPECT_EQ(ParseSize("1t").value(), uint64_t{1} << 40);
  EXPECT_FALSE(ParseSize("99999999999999999999").ok());
  EXPECT_FALSE(ParseSize("20000000T").ok());
}

}  // namespace
}  // namespace loaderx::daemon
