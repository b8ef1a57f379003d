// The seam's wait and seek (batch_source.h) without a deadline, as the tests
// of both hosts use them: what a host's poll loop does, slice by slice.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

#include "loaderx/batch_source.h"
#include "loaderx/loader.h"
#include "loaderx/status.h"

namespace loaderx::testing {

// The batch of source.step(), however long it takes (NextUntil in slices).
inline Result<BatchView> NextBatch(BatchSource& source) {
  for (;;) {
    LX_ASSIGN_OR_RETURN(std::optional<BatchView> v,
                        source.NextUntil(BatchSource::Clock::now() + kSourcePollBound));
    if (v) return std::move(*v);
  }
}

// The next batch is `step` once this returns OK (SeekUntil in slices).
inline Status SeekTo(BatchSource& source, uint64_t step) {
  for (;;) {
    LX_ASSIGN_OR_RETURN(bool settled,
                        source.SeekUntil(step, BatchSource::Clock::now() + kSourcePollBound));
    if (settled) return Status::OK();
  }
}

// The memory of an embedded batch: a Pipeline view's owner is its
// BatchMemory (loader.h).
inline BatchMemory& MemoryOf(const BatchView& v) {
  return const_cast<BatchMemory&>(*static_cast<const BatchMemory*>(v.owner.get()));
}

}  // namespace loaderx::testing
