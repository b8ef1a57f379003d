// loaderxd configuration: command-line flags, optionally a config file.
//
// The file holds `key = value` lines ('#' starts a comment) using the long
// flag names without dashes (socket, threads, memory-limit, log-level,
// sessions-per-uid, memory-per-uid, max-leases, max-prefetch, max-skew,
// group-prefetch, socket-mode, gather-nice, group-timeout, log-file, pid-file).
// Flags given on the command line win over the file. Sizes accept K/M/G/T
// binary suffixes. Every problem is InvalidArgument naming the key and, for
// the file, the line.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "loaderx/status.h"
#include "log.h"

namespace loaderx::daemon {

// Gather threads at the daemon's priority unless --gather-nice says
// otherwise: lowering them showed no consistent hand-off gain on the 2-core
// box and risks starving the loader of a busy machine (docs/daemon.md
// "Performance").
inline constexpr int kDefaultGatherNice = 0;
// A few minutes: far longer than any healthy step or a rank's start-up, short
// enough that a job whose rank died fails before anyone wonders.
inline constexpr std::chrono::milliseconds kDefaultGroupTimeout = std::chrono::minutes(5);
// One batch ahead, gathered by all --threads at once: 4 broadcast members on
// the 2-core box kept (or raised) their batches/s against the creator's
// prefetch 4, and the ring's resident pages fell from ~6 batches to 2-3
// (docs/daemon.md "Memory").
inline constexpr uint32_t kDefaultGroupPrefetch = 1;
// The batches a broadcast group's ring keeps live at once (Group "Live
// bound"): the one its members read and the one being gathered
// (docs/daemon.md "Memory").
inline constexpr uint32_t kDefaultGroupLiveBatches = 2;

struct Config {
  std::string socket_path;                    // default: DefaultSocketPath()
  uint32_t threads = 0;                       // gather threads per loader; 0 = hardware concurrency
  uint64_t memory_limit = uint64_t{8} << 30;  // all rings together
  uint64_t memory_per_uid = 0;                // ring bytes per uid; 0 = memory_limit
  uint32_t sessions_per_uid = 64;
  uint32_t max_leases = 64;  // cap on the batches one client may hold
  uint32_t max_prefetch = 64;
  // Steps a group member may run ahead of its group's slowest member before
  // its `next` waits (docs/daemon.md "Groups"); also sizes group rings.
  uint32_t max_skew = 8;
  // Cap on the prefetch of a named group's pipeline (the creator's prefetch
  // if lower; 0 = no cap). Solo loaders keep their own prefetch.
  uint32_t group_prefetch = kDefaultGroupPrefetch;
  // Live bound K of a named broadcast group's ring (Group::Options::max_live;
  // 0 = none but the skew window).
  uint32_t group_live_batches = kDefaultGroupLiveBatches;
  // Nice increment of every pipeline's gather threads over the daemon's
  // own (PipelineOptions::gather_nice; docs/daemon.md "Performance").
  int gather_nice = kDefaultGatherNice;
  // How long a group member's `next` may wait for the other members before
  // it fails naming them (Group "Group timeout"); a member may ask for its
  // own (DaemonOptions.group_timeout).
  std::chrono::milliseconds group_timeout{kDefaultGroupTimeout};
  mode_t socket_mode = 0660;
  bool foreground = false;
  bool check_config = false;
  LogLevel log_level = LogLevel::kInfo;
  std::string log_file;  // "": stderr (the journal under systemd)
  std::string pid_file;  // "": none
  std::string config_file;
};

// /run/loaderx/loaderxd.sock for root, $XDG_RUNTIME_DIR/loaderx/loaderxd.sock
// otherwise (InvalidArgument if XDG_RUNTIME_DIR is unset for a non-root user).
Result<std::string> DefaultSocketPath();

// Parses argv (argv[0] skipped). `*help` is set for --help/--version with the
// text to print.
Result<Config> ParseArgs(const std::vector<std::string>& args, std::string* help);

// Parses a size with an optional K/M/G/T suffix.
Result<uint64_t> ParseSize(const std::string& s);

}  // namespace loaderx::daemon
