#include "store_registry.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <string>
#include <utility>

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

template <typename K, typename Make>
Result<std::shared_ptr<const Store>> StoreRegistry::Shared(Entries<K>& entries, const K& key,
                                                           Make make) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries.find(key);
    if (it != entries.end()) {
      if (std::shared_ptr<const Store> s = it->second.lock()) return s;
    }
  }
  LX_ASSIGN_OR_RETURN(std::shared_ptr<Store> made, make());
  std::shared_ptr<const Store> store = std::move(made);
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = entries[key];
  if (std::shared_ptr<const Store> raced = slot.lock()) return raced;  // another client won
  slot = store;
  for (auto it = entries.begin(); it != entries.end();) {
    it = it->second.expired() ? entries.erase(it) : std::next(it);
  }
  return store;
}

Result<std::shared_ptr<const Store>> StoreRegistry::Get(StoreFiles files) {
  LX_ASSIGN_OR_RETURN(Key key, KeyOf(files));
  return Shared(stores_, key, [&] { return Store::FromFiles(std::move(files)); });
}

Result<std::shared_ptr<const Store>> StoreRegistry::GetMixed(
    std::vector<std::shared_ptr<const Store>> parts, const std::vector<uint64_t>& counts,
    size_t datasets) {
  MixKey key;
  for (const auto& p : parts) key.first.push_back(p.get());
  key.second = counts;
  // The dataset-number stream also depends on K: the same counts split into
  // other segments number their positions otherwise.
  if (parts.empty()) key.second.push_back(datasets == 0 ? counts.size() : datasets);
  return Shared(mixed_, key, [&]() -> Result<std::shared_ptr<Store>> {
    if (parts.empty()) return MixSourceStore(counts, datasets);
    // The decoder checked that the counts are segments of parts.size().
    const size_t segments = counts.size() / parts.size();
    return MixedStore(std::move(parts), counts, segments);
  });
}

size_t StoreRegistry::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [k, v] : stores_) n += !v.expired();
  return n;
}

}  // namespace loaderx::daemon
