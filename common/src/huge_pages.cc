#include "huge_pages.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace loaderx::hugepages {

Result<uint64_t> MemAvailableBytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "re");
  if (f == nullptr) return Status::FromErrno("/proc/meminfo", errno);
  static constexpr char kKey[] = "MemAvailable:";
  char line[256];
  bool found = false;
  uint64_t kib = 0;
  while (!found && std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, kKey, sizeof(kKey) - 1) != 0) continue;
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(line + sizeof(kKey) - 1, &end, 10);
    found = errno == 0 && end != line + sizeof(kKey) - 1;
    kib = static_cast<uint64_t>(v);
  }
  std::fclose(f);
  if (!found) return Status::IOError("/proc/meminfo: no MemAvailable line");
  return kib * 1024;
}

}  // namespace loaderx::hugepages
