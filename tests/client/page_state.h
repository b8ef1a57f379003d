// What /proc/self/pagemap says of one page of this process: the client tests
// of copy-on-write batch views (private_rings_test, client_test) ask it.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <optional>
#include <utility>

#include "loaderx/fd.h"

namespace loaderx::testing {

// Whether the page holding `p` is mapped in this process, and whether it is a
// file (ring) page rather than a private copy; nullopt if pagemap cannot be
// read.
inline std::optional<std::pair<bool, bool>> PageState(const void* p) {
  UniqueFd fd(::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return std::nullopt;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  uint64_t e = 0;
  const auto at = static_cast<off_t>(reinterpret_cast<uintptr_t>(p) / page * sizeof e);
  if (::pread(fd.get(), &e, sizeof e, at) != static_cast<ssize_t>(sizeof e)) return std::nullopt;
  return std::make_pair((e >> 63) != 0, ((e >> 61) & 1) != 0);
}

}  // namespace loaderx::testing
