// A client::Loader's batches as the client tests take them: the seam's
// NextUntil (common/source_test_util.h), read through client::Batch.
#pragma once

#include <chrono>
#include <optional>
#include <utility>

#include "common/source_test_util.h"
#include "loaderx/client.h"

namespace loaderx::testing {

// The batch of loader.step(), however long it takes.
inline Result<client::Batch> TakeBatch(client::Loader& loader) {
  LX_ASSIGN_OR_RETURN(BatchView v, NextBatch(loader));
  return client::Batch(std::move(v), loader);
}

// The batch of loader.step(), or nullopt if it is not in within `timeout`
// (nothing is consumed then).
inline Result<std::optional<client::Batch>> TakeBatchFor(client::Loader& loader,
                                                         std::chrono::milliseconds timeout) {
  LX_ASSIGN_OR_RETURN(std::optional<BatchView> v,
                      loader.NextUntil(BatchSource::Clock::now() + timeout));
  if (!v) return std::optional<client::Batch>();
  return std::optional<client::Batch>(client::Batch(std::move(*v), loader));
}

}  // namespace loaderx::testing
