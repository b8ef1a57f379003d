#include "store_registry.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <string>

#include "loaderx/mix.h"

namespace loaderx::daemon {

namespace {
// A descriptor proves read access only if it was opened for reading: an
// O_PATH handle (openable with search permission on the directory alone)
// reports O_RDONLY as its access mode, so it is refused by name.
Result<StoreRegistry::FileId> CheckReadableFile(const UniqueFd& fd, const std::string& what) {
  if (!fd.valid()) return Status::InvalidArgument(what + ": missing fd");
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(what, errno);
  if (!S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(what + ": passed fd is not a regular file");
  }
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || (flags & O_PATH) != 0 || (flags & O_ACCMODE) == O_WRONLY) {
    return Status::InvalidArgument(what + ": passed fd is not open for reading");
  }
  return StoreRegistry::FileId{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}
}  // namespace

Result<StoreRegistry::Key> StoreRegistry::KeyOf(const StoreFiles& files) {
  Key key;
  key.reserve(4 + files.data.size());
  auto add = [&](const UniqueFd& fd, const std::string& what, bool optional) -> Status {
    if (optional && !fd.valid()) {
      key.push_back(FileId{});
      return Status::OK();
    }
    LX_ASSIGN_OR_RETURN(FileId id, CheckReadableFile(fd, files.label + " (" + what + ")"));
    key.push_back(id);
    return Status::OK();
  };
  LX_RETURN_IF_ERROR(add(files.meta, "metadata", false));
  LX_RETURN_IF_ERROR(add(files.index, "index", false));
  LX_RETURN_IF_ERROR(add(files.shapes, "shapes", true));
  LX_RETURN_IF_ERROR(add(files.dict, "dictionary", true));
  for (size_t i = 0; i < files.data.size(); ++i) {
    LX_RETURN_IF_ERROR(add(files.data[i], "data " + std::to_string(i), false));
  }
  return key;
}

Result<std::shared_ptr<const Store>> StoreRegistry::Get(StoreFiles files) {
  LX_ASSIGN_OR_RETURN(Key key, KeyOf(files));
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

Result<std::shared_ptr<const Store>> StoreRegistry::GetMixed(
    std::vector<std::shared_ptr<const Store>> parts, const std::vector<uint64_t>& counts) {
  MixKey key;
  for (const auto& p : parts) key.first.push_back(p.get());
  key.second = counts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = mixed_.find(key);
    if (it != mixed_.end()) {
      if (std::shared_ptr<const Store> s = it->second.lock()) return s;
    }
  }
  std::shared_ptr<Store> made;
  if (parts.empty()) {
    LX_ASSIGN_OR_RETURN(made, MixSourceStore(counts));
  } else {
    LX_ASSIGN_OR_RETURN(made, MixedStore(std::move(parts), counts));
  }
  std::shared_ptr<const Store> store = std::move(made);
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = mixed_[key];
  if (std::shared_ptr<const Store> raced = slot.lock()) return raced;
  slot = store;
  for (auto it = mixed_.begin(); it != mixed_.end();) {
    it = it->second.expired() ? mixed_.erase(it) : std::next(it);
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
