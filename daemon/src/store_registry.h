// StoreRegistry: a store opened by several clients is validated and mapped
// once. Keyed by (device, inode) of the metadata fd the client passed, never
// by a path string (paths lie: bind mounts, symlinks, renames).
//
// The daemon never opens a store path itself: every Store here was built
// from fds a client opened, so a client can only reach data it could read.
// A second client naming the same store still has to pass its own fds (which
// proves its access) before it shares the mapping.
//
// Entries are weak: the store is unmapped when the last loader using it
// closes. Thread-safety: all methods are thread-safe.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "loaderx/store.h"

namespace loaderx::daemon {

class StoreRegistry {
 public:
  // Checks every fd (a readable regular file), then returns the registered
  // store with the same metadata (dev, ino) or builds one with
  // Store::FromFiles.
  Result<std::shared_ptr<const Store>> Get(StoreFiles files);
  // Stores currently mapped.
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<uint64_t, uint64_t>, std::weak_ptr<const Store>> stores_;  // guarded by mu_
};

}  // namespace loaderx::daemon
