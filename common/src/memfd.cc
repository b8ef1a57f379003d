#include "loaderx/memfd.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace loaderx {

const int kRingSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;

Result<UniqueFd> CreateMemfd(const std::string& name, uint64_t size) {
  if (size == 0) return Status::InvalidArgument("memfd " + name + ": size must be > 0");
  int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Status::FromErrno("memfd_create " + name, errno);
  UniqueFd owned(fd);
  if (::ftruncate(owned.get(), static_cast<off_t>(size)) != 0) {
    return Status::FromErrno("ftruncate memfd " + name, errno);
  }
  return owned;
}

Status SealMemfd(int fd, int seals) {
  if (::fcntl(fd, F_ADD_SEALS, seals) != 0) return Status::FromErrno("F_ADD_SEALS", errno);
  return Status::OK();
}

Status CheckSealedMemfd(int fd, int required, uint64_t size) {
  int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return Status::InvalidArgument("fd is not a sealable memfd (F_GET_SEALS failed)");
  }
  if ((seals & required) != required) {
    return Status::InvalidArgument("memfd lacks required seals (has " + std::to_string(seals) +
                                   ", needs " + std::to_string(required) + ")");
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::FromErrno("fstat memfd", errno);
  if (static_cast<uint64_t>(st.st_size) != size) {
    return Status::InvalidArgument("memfd is " + std::to_string(st.st_size) + " bytes, expected " +
                                   std::to_string(size));
  }
  return Status::OK();
}

}  // namespace loaderx
