#include "store_registry.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <string>

namespace loaderx::daemon {

namespace {
Status CheckReadableFile(const UniqueFd& fd, const std::string& what) {
  if (!fd.valid()) return Status::InvalidArgument(what + ": missing fd");
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(what, errno);
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(what + ": passed fd is not a regular file");
  }
  int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) == O_WRONLY) {
    return Status::InvalidArgument(what + ": passed fd is not open for reading");
  }
  return Status::OK();
}
}  // namespace

Result<std::shared_ptr<const Store>> StoreRegistry::Get(StoreFiles files) {
  LX_RETURN_IF_ERROR(CheckReadableFile(files.meta, files.label + " (metadata)"));
  LX_RETURN_IF_ERROR(CheckReadableFile(files.index, files.label + " (index)"));
  if (files.shapes.valid()) LX_RETURN_IF_ERROR(CheckReadableFile(files.shapes, files.label + " (shapes)"));
  if (files.dict.valid()) LX_RETURN_IF_ERROR(CheckReadableFile(files.dict, files.label + " (dictionary)"));
  for (size_t i = 0; i < files.data.size(); ++i) {
    LX_RETURN_IF_ERROR(
        CheckReadableFile(files.data[i], files.label + " (data " + std::to_string(i) + ")"));
  }
  struct stat st;
  if (::fstat(files.meta.get(), &st) != 0) return Status::FromErrno(files.label, errno);
  const std::pair<uint64_t, uint64_t> key{static_cast<uint64_t>(st.st_dev),
                                          static_cast<uint64_t>(st.st_ino)};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = stores_.find(key);
    if (it != stores_.end()) {
      if (std::shared_ptr<const Store> s = it->second.lock()) return s;
    }
  }
  // Validation and mapping happen outside the lock (O(1), but touches disk).
  LX_ASSIGN_OR_RETURN(std::shared_ptr<Store> made, Store::FromFiles(std::move(files)));
  std::shared_ptr<const Store> store = std::move(made);
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = stores_[key];
  if (std::shared_ptr<const Store> raced = slot.lock()) return raced;  // another client won
  slot = store;
  // Drop entries whose stores are gone, so the map does not grow forever.
  for (auto it = stores_.begin(); it != stores_.end();) {
    it = it->second.expired() ? stores_.erase(it) : std::next(it);
  }
  return store;
}

size_t StoreRegistry::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [k, v] : stores_) n += !v.expired();
  return n;
}

}  // namespace loaderx::daemon
