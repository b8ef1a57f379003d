// Weighted mixing of several datasets as one virtual store per stream.
//
// Purpose. A mixture of K datasets (each a set of equal-length stores with
// the same stream names) is presented to the unchanged sampler and pipeline
// as one index space of V "positions". Dataset k owns the contiguous segment
// [start_k, start_k + count_k) of it, and position start_k + j stands for its
// record j mod n_k:
//
//   position: 0 ........ count_0 | count_0 ....... count_0+count_1 | ...
//   dataset:  0 (records 0..n_0-1, 0..n_0-1, ...) | 1 (0..n_1-1, ...) | ...
//
// The sampler draws positions exactly as it draws records (IID, Cyclic,
// Sequential over n = V), so the dataset of the sample at position p of step
// s is a pure function of (seed, s, p): resume, sharding and thread-count
// independence come with the sampler. The share of dataset k is count_k / V:
// exact per Cyclic cycle, the expectation under IID. Choosing the counts from
// the weights is the caller's (python/loaderx/mix.py); this file only maps.
//
// MixedStore(parts, counts): the stream gathered from part k (one store per
// dataset, same kind, dtype and item_shape / ndim) for positions of segment
// k. MixSourceStore(counts): a dense int64 scalar stream whose record at a
// position is its dataset's number k, so a batch says where each sample came
// from.
//
// Thread-safety and ownership: both are immutable Stores (store.h): every
// const method may be called concurrently; they share ownership of the parts.
// Locate() has no file to name and returns InvalidArgument.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "loaderx/status.h"
#include "loaderx/store.h"

namespace loaderx {

// Largest number of datasets in one mixture (the segment lookup is a binary
// search over this many starts; more would only make messages unreadable).
inline constexpr size_t kMaxMixParts = 1 << 16;

// Every count > 0, their sum V < 2^63, 1 <= counts.size() <= kMaxMixParts,
// else InvalidArgument naming the bad one.
Status ValidateMixCounts(const std::vector<uint64_t>& counts);

// REQUIRES of `parts`: one non-null, non-empty store per count, all of one
// kind and dtype, and one item_shape (dense) or ndim (ragged); else
// InvalidArgument / SchemaError naming the part by its label.
Result<std::shared_ptr<Store>> MixedStore(std::vector<std::shared_ptr<const Store>> parts,
                                          std::vector<uint64_t> counts);

Result<std::shared_ptr<Store>> MixSourceStore(std::vector<uint64_t> counts);

}  // namespace loaderx
