// StoreRegistry: a store opened by several clients is validated and mapped
// once, and shared only between clients that passed descriptors of the very
// same files.
//
// The daemon never opens a store path itself: every Store here was built
// from fds a client opened, so a client can only reach data it could read.
// The key is the (device, inode) of *every* fd the client passed (metadata,
// index, shapes, dictionary, each data shard), in their protocol order, so a
// mapping is reused only for a client that holds a readable descriptor of
// each file it would be served from. Keying on one file (the metadata) would
// let a client that may read `meta` but not `data-*` pass its own data files
// and be served the owner's (docs/daemon.md, "Security"). Paths are never
// keys (bind mounts, symlinks, renames).
//
// Entries are weak: the store is unmapped when the last loader using it
// closes. Thread-safety: all methods are thread-safe.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "loaderx/store.h"

namespace loaderx::daemon {

class StoreRegistry {
 public:
  // (device, inode) of one passed file; {0, 0} marks an absent optional file
  // (shapes, dictionary), which no real file has.
  struct FileId {
    uint64_t dev = 0;
    uint64_t ino = 0;
    auto operator<=>(const FileId&) const = default;
  };
  using Key = std::vector<FileId>;

  // Checks every fd (a regular file open for reading, not an O_PATH handle),
  // then returns the registered store whose every file is the same or builds
  // one with Store::FromFiles.
  Result<std::shared_ptr<const Store>> Get(StoreFiles files);
  // Checks the fds of `files` as Get does and returns their key.
  static Result<Key> KeyOf(const StoreFiles& files);
  // The mixture (loaderx/mix.h) of `parts` (stores from Get, one per
  // dataset) with `counts`, or with `parts` empty its dataset-number stream
  // of `datasets` datasets (0: counts.size(); loaderx/mix.h, "Schedules").
  // Shared, like stores, between clients that passed the same parts and
  // counts: a group tells its members' streams apart by identity, so two
  // members opening one mixture must get one Store. Errors are mix.h's.
  Result<std::shared_ptr<const Store>> GetMixed(std::vector<std::shared_ptr<const Store>> parts,
                                                const std::vector<uint64_t>& counts,
                                                size_t datasets = 0);
  // Stores currently mapped.
  size_t size() const;

 private:
  // The parts by identity (a live entry keeps them alive, so an address is
  // never reused while its entry can be found) and the counts.
  using MixKey = std::pair<std::vector<const Store*>, std::vector<uint64_t>>;
  template <typename K>
  using Entries = std::map<K, std::weak_ptr<const Store>>;

  // The live store of `key` in `entries`, or the one `make()` builds
  // (outside the lock: it validates and maps), registered unless another
  // caller registered one meanwhile (then that one is returned and ours is
  // dropped). Also forgets entries whose stores are gone.
  template <typename K, typename Make>
  Result<std::shared_ptr<const Store>> Shared(Entries<K>& entries, const K& key, Make make);

  mutable std::mutex mu_;
  Entries<Key> stores_;    // guarded by mu_
  Entries<MixKey> mixed_;  // guarded by mu_
};

}  // namespace loaderx::daemon
