// The two systemd interfaces loaderxd speaks, written by hand (no libsystemd):
//  * sd_notify: datagrams like "READY=1" to $NOTIFY_SOCKET (path or
//    '@'-prefixed abstract name). A no-op when the variable is unset.
//  * socket activation: $LISTEN_PID / $LISTEN_FDS hand us fd 3.
// Thread-safety: Notify may be called from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "loaderx/fd.h"
#include "loaderx/status.h"

namespace loaderx::daemon {

// Sends `state` (e.g. "READY=1\nSTATUS=serving") to the service manager.
Status Notify(const std::string& state);

// The listening socket passed by systemd, if any: checks LISTEN_PID is us,
// LISTEN_FDS == 1 and that fd 3 is a listening SOCK_SEQPACKET Unix socket;
// unsets the variables so children do not inherit them. nullopt when not
// socket-activated.
Result<std::optional<UniqueFd>> TakeListenFd();

// Watchdog period from $WATCHDOG_USEC (if WATCHDOG_PID is unset or us), in
// microseconds; 0 when disabled.
uint64_t WatchdogUsec();

}  // namespace loaderx::daemon
