// The status document of a stats request with `detail` (protocol 1.2): what
// `loaderx status` and `connect(path).stats()` show. docs/daemon.md "Status"
// documents every field; this file is its one producer.
//
// The server only gathers the inputs (a snapshot of every group, the per-uid
// accounts, its counters); BuildStatusJson renders them for one viewer:
//  * the daemon section and the daemon-wide counters are shown to everyone
//    who may connect (they were public before the document existed);
//  * groups, solo loaders and per-uid usage are shown only for the viewer's
//    own uid, unless the viewer is root (uid 0) or the daemon's own uid,
//    who see every uid's. Another user's group names, pids, steps and ring
//    sizes are therefore never revealed to a plain user.
//
// Thread-safety: pure functions over values.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "config.h"
#include "serving_group.h"

namespace loaderx::daemon {

struct StatusInput {
  pid_t pid = 0;
  double uptime_s = 0;
  uint64_t incarnation = 0;
  std::string socket_path;
  const Config* config = nullptr;  // limits; must outlive the call
  std::vector<std::pair<std::string, uint64_t>> counters;
  struct OwnedGroup {
    uint32_t uid = 0;  // the uid whose group (or solo loader) it is
    Group::Snapshot snapshot;
  };
  std::vector<OwnedGroup> groups;  // named groups and solo loaders (name "")
  struct UidUsage {
    uint32_t uid = 0;
    uint64_t sessions = 0;
    uint64_t ring_bytes = 0;
  };
  std::vector<UidUsage> uids;
};

// Whether `viewer` sees the groups, loaders and usage of `owner`.
bool MaySee(uint32_t viewer, uint32_t owner);

// The JSON document for `viewer` (at most kMaxStatusBytes; if the groups do
// not fit, the last ones are left out and "truncated" is true).
std::string BuildStatusJson(const StatusInput& in, uint32_t viewer);

}  // namespace loaderx::daemon
