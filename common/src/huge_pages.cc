#include "huge_pages.h"

#include <cstdio>
#include <cstring>

#include "loaderx/fd.h"

namespace loaderx::hugepages {

Result<uint64_t> MemAvailableBytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "re");
  if (f == nullptr) return Status::IOError("/proc/meminfo: cannot open");
  char line[256];
  unsigned long long kib = 0;  // NOLINT(google-runtime-int): sscanf's %llu
  bool found = false;
  while (!found && std::fgets(line, sizeof(line), f) != nullptr) {
    found = std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
  }
  std::fclose(f);
  if (!found) return Status::IOError("/proc/meminfo: no MemAvailable line");
  return static_cast<uint64_t>(kib) * 1024;
}

}  // namespace loaderx::hugepages
