// Anonymous shared-memory files (memfd) for loaderxd's batch rings.
//
// A ring is a memfd: it has no name in /dev/shm (nothing to leak when a
// process dies, no container /dev/shm size limit), lives exactly as long as
// the last fd or mapping, and is passed to clients with SCM_RIGHTS.
//
// Sealing protocol (docs/protocol.md, "The ring"): the daemon creates the memfd with
// MFD_ALLOW_SEALING, sizes it, maps it read-write, then applies
// kRingSeals = SHRINK | GROW | FUTURE_WRITE | SEAL. After that nobody can
// change its size (so a client's mapping can never SIGBUS) and no new
// writable mapping can be created (so a client holding the fd cannot scribble
// on the ring even with mprotect or a fresh mmap); the daemon's existing
// writable mapping keeps working. Clients verify the seals with
// CheckSeals() before trusting the fd.
//
// Thread-safety: free functions, no shared state.
#pragma once

#include <cstdint>
#include <string>

#include "loaderx/fd.h"
#include "loaderx/status.h"

namespace loaderx {

// F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL.
extern const int kRingSeals;

// memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING) + ftruncate(size).
// REQUIRES: size > 0.
Result<UniqueFd> CreateMemfd(const std::string& name, uint64_t size);

// Adds `seals` (F_ADD_SEALS).
Status SealMemfd(int fd, int seals);

// Returns InvalidArgument unless `fd` is a sealed memfd carrying at least
// `required` seals and exactly `size` bytes long.
Status CheckSealedMemfd(int fd, int required, uint64_t size);

}  // namespace loaderx
