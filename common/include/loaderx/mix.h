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
// Schedules. With K datasets and S segments (python/loaderx/mix.py, "Mixture
// schedules"), `counts` holds S * K entries, segment-major: entry s * K + k is
// the count of dataset k in segment s, laid out consecutively, so segment s
// owns [base_s, base_s + V_s) with V_s the sum of its K counts. Entry e
// stands for dataset e mod K (its position j for record j mod n_k). A count
// may be 0 in a schedule (a dataset left out of a segment) as long as every
// segment and every dataset has one that is not. S = 1 is the plain mixture.
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

// Largest number of segments of one schedule.
inline constexpr size_t kMaxMixSegments = 1 << 16;

// `datasets` = K (0: counts.size(), one segment). counts.size() is a
// positive multiple of K, 1 <= K <= kMaxMixParts, at most kMaxMixSegments
// segments, every segment and every dataset has a count > 0 (with one
// segment: every count > 0), the sum V < 2^63; else InvalidArgument naming
// the bad one.
Status ValidateMixCounts(const std::vector<uint64_t>& counts, size_t datasets = 0);

// REQUIRES of `parts`: one non-null, non-empty store per dataset (K =
// parts.size(), counts as in ValidateMixCounts), all of one
// kind and dtype, and one item_shape (dense) or ndim (ragged); else
// InvalidArgument / SchemaError naming the part by its label.
// `segments` = S: counts.size() must be parts.size() * S.
Result<std::shared_ptr<Store>> MixedStore(std::vector<std::shared_ptr<const Store>> parts,
                                          std::vector<uint64_t> counts, size_t segments = 1);

// `datasets` as in ValidateMixCounts: the number at an entry e's position is e mod K.
Result<std::shared_ptr<Store>> MixSourceStore(std::vector<uint64_t> counts, size_t datasets = 0);

}  // namespace loaderx
