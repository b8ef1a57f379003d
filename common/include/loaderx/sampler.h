// Sampler: the batch index generator behind every loader (DESIGN.md §5).
//
// The indices of step s are a pure function of (n, batch_size, world_size,
// mode, seed, s) and the rank: counter-based randomness, no sequential RNG
// state. Fill(step, out) may be called for any step from any thread; the
// stateful Next()/Seek() wrapper exists for the Python face.
//
// (Contract header: the implementation lives in common/src/sampler.cc.)
#pragma once

#include <cstdint>
#include <vector>

#include "loaderx/status.h"

namespace loaderx {

enum class SamplerMode : uint8_t { kSequential = 0, kIID = 1, kCyclic = 2 };

struct SamplerSpec {
  uint64_t n = 0;           // dataset size, > 0
  uint64_t batch_size = 0;  // per-rank batch, > 0
  SamplerMode mode = SamplerMode::kIID;
  uint64_t seed = 42;
  uint64_t rank = 0;        // < world_size
  uint64_t world_size = 1;  // > 0

  // Checks every field; InvalidArgument naming the bad one.
  Status Validate() const;
};

class Sampler {
 public:
  static Result<Sampler> Make(const SamplerSpec& spec, uint64_t start_step = 0);

  const SamplerSpec& spec() const { return spec_; }
  // Writes this rank's batch_size indices of `step` into out. Pure, const,
  // thread-safe.
  void Fill(uint64_t step, uint64_t* out) const;

  // Stateful face: Next() fills the internal buffer with step() and advances.
  const std::vector<uint64_t>& Next();
  void Seek(uint64_t step) { step_ = step; }
  uint64_t step() const { return step_; }
  const std::vector<uint64_t>& buffer() const { return buf_; }

 private:
  explicit Sampler(const SamplerSpec& spec, uint64_t step);
  SamplerSpec spec_;
  uint64_t step_ = 0;
  std::vector<uint64_t> buf_;
  // Mode-specific precomputed constants (Feistel parameters, etc.) go here.
  uint64_t cycle_steps_ = 0;
};

}  // namespace loaderx
