// Sampler: the batch index generator behind every loader.
//
// Purpose. A Sampler turns a step number into the batch of record indices of
// that step. The indices of step s are a pure function of
// (n, batch_size, world_size, mode, seed, s) and the rank: counter-based
// randomness, no sequential RNG state. Any thread may compute any step in any
// order, Seek() is O(1), and resuming needs nothing but the step.
//
// Modes (the algorithms are described in docs/guide.md, "## Sampler"):
//  * kSequential: global position p = s * G + j maps to index p mod n, i.e.
//    records in order, wrapping at the end.
//  * kIID: uniform with replacement. Each index is drawn from a SplitMix64
//    stream keyed by (seed, step) at counter j (the position in the global
//    batch), reduced to [0, n) by Lemire's multiply-shift with rejection, so
//    there is no modulo bias. When n <= 2^32 each 64-bit word yields the
//    32-bit draws of two positions.
//  * kCyclic: sampling without replacement. With G = batch_size * world_size,
//    a cycle is n / G steps; cycle c walks a pseudo-random permutation of
//    0..n-1 keyed by (seed, c): a 6-round alternating Feistel network (32-bit
//    keyed round function) over the next power of two >= n with cycle walking. O(1) memory for any
//    n (10^12 works). Only full global batches are drawn, so the n mod G indices left out differ
//    per cycle. REQUIRES G <= n (else Validate() fails).
//
// Sharding. The global batch of step s has G = batch_size * world_size
// positions; rank r receives positions [r * batch_size, (r + 1) * batch_size).
// Concatenating the ranks' batches gives exactly the batch of a world_size = 1
// sampler with batch_size = G, so resuming on a different world size with the
// same global batch keeps the step unchanged.
//
// Segments (mixture schedules, python/loaderx/mix.py). A spec may split the
// steps into segments: segment k covers steps [start_k, start_{k+1}) and owns
// the index range [base_k, base_k + size_k) of [0, n). A step s of segment k
// draws base_k + the indices that a plain sampler over n = size_k with seed
// SegmentSeed(seed, k) draws at step s - start_k (same batch, rank, world
// size and mode): each segment's walk starts fresh at its first step, so
// appending a segment never changes a step before its start, and a step's
// indices stay a pure function of (spec, step). Segment 0 has seed `seed`, so
// one segment {0, 0, n} draws exactly what a spec without segments draws.
//
// Thread-safety. Fill() is const and pure: any number of threads may call it
// concurrently on one Sampler. Next()/Seek() mutate the cursor and the
// internal buffer and need external synchronisation (the Python face holds the
// GIL). Ownership: a Sampler owns its buffer; the reference returned by Next()
// and buffer() stays valid until the Sampler is destroyed, and its contents
// until the next Next().
#pragma once

#include <cstdint>
#include <vector>

#include "loaderx/status.h"

namespace loaderx {

enum class SamplerMode : uint8_t { kSequential = 0, kIID = 1, kCyclic = 2 };

// "Sequential", "IID", "Cyclic" (or "unknown").
const char* SamplerModeName(SamplerMode mode);

struct SamplerSegment {
  uint64_t start_step = 0;  // first step of the segment
  uint64_t base = 0;        // first index it owns
  uint64_t size = 0;        // indices it owns, > 0
  bool operator==(const SamplerSegment&) const = default;
};

// Largest number of segments of one spec.
inline constexpr size_t kMaxSamplerSegments = 1 << 16;

// The seed of segment k's draws: `seed` for k = 0, a 64-bit mix of (seed, k)
// after (docs/guide.md, "Mixture schedules", gives the formula).
uint64_t SegmentSeed(uint64_t seed, uint64_t k);

struct SamplerSpec {
  uint64_t n = 0;           // dataset size, > 0
  uint64_t batch_size = 0;  // per-rank batch, 1..Sampler::kMaxBatchSize
  SamplerMode mode = SamplerMode::kIID;
  uint64_t seed = 42;
  uint64_t rank = 0;        // < world_size
  uint64_t world_size = 1;  // > 0
  // Empty: one segment {0, 0, n}. Else segments[0].start_step == 0, starts
  // strictly increasing, each [base, base + size) inside [0, n) and, in
  // Cyclic mode, size >= the global batch (checked by Validate()).
  std::vector<SamplerSegment> segments;

  // Checks every field; InvalidArgument naming the bad one. Also rejects a
  // global batch that overflows 64 bits and, in Cyclic mode, a global batch
  // larger than n (a cycle must hold at least one full global batch).
  Status Validate() const;

  // batch_size * world_size. REQUIRES: Validate().ok().
  uint64_t global_batch() const { return batch_size * world_size; }

  // The spec a sampler runs with, the one place of the rule: in Cyclic mode
  // with one rank, a batch larger than n becomes n (each batch one whole
  // cycle, as the 2.5.4 wheel's sampler); any other spec is itself.
  // Sampler::Make (and so every pipeline) applies it; callers that must
  // know the batch size they will get (the DataLoader) ask for it here.
  SamplerSpec Effective() const;
};

class Sampler {
 public:
  // Largest per-rank batch: 2^31 indices (16 GiB of uint64) is far beyond any
  // real batch and keeps Make() from attempting absurd allocations.
  static constexpr uint64_t kMaxBatchSize = uint64_t{1} << 31;
  // Feistel rounds of the Cyclic permutation. Luby-Rackoff: four rounds of
  // ideal round functions give a strong pseudo-random permutation; two more
  // are margin for the cheap 32-bit mixer used as round function. Changing
  // this changes every Cyclic order (the outputs are pinned by tests).
  static constexpr int kFeistelRounds = 6;

  // Validates `spec` and returns a sampler whose next draw is `start_step`.
  static Result<Sampler> Make(const SamplerSpec& spec, uint64_t start_step = 0);

  const SamplerSpec& spec() const { return spec_; }
  // Writes this rank's batch_size indices of `step` into out[0..batch_size).
  // Pure, const, thread-safe. REQUIRES: out has room for batch_size values.
  void Fill(uint64_t step, uint64_t* out) const;

  // Stateful face: Next() fills the internal buffer with step() and advances.
  const std::vector<uint64_t>& Next();
  void Seek(uint64_t step) { step_ = step; }
  uint64_t step() const { return step_; }
  const std::vector<uint64_t>& buffer() const { return buf_; }
  // The same buffer, writable, for hosts that fill it themselves with
  // Fill(step, buffer_data()) (the Python face does so with the GIL released
  // for large batches, under its own lock).
  uint64_t* buffer_data() { return buf_.data(); }

  // Cyclic: steps per cycle (n / G). 0 in the other modes.
  uint64_t cycle_steps() const { return cycle_steps_; }

 private:
  explicit Sampler(const SamplerSpec& spec, uint64_t step);

  void FillSequential(uint64_t step, uint64_t* out) const;
  void FillIID(uint64_t step, uint64_t* out) const;
  void FillCyclic(uint64_t step, uint64_t* out) const;
  void FillPlain(uint64_t step, uint64_t* out) const;

  // One plain sampler per segment of spec_.segments (empty without segments).
  std::vector<Sampler> segment_samplers_;

  SamplerSpec spec_;
  uint64_t step_ = 0;
  std::vector<uint64_t> buf_;
  // Mode-independent stream key derived from the seed once.
  uint64_t seed_key_ = 0;
  // IID: Lemire rejection threshold, 2^w mod n for w-bit draws (w = 32 when
  // n <= 2^32, else 64).
  uint64_t reject_below_ = 0;
  // Cyclic: steps per cycle and the Feistel geometry (left half is the high
  // bits; left_bits_ >= right_bits_, left_bits_ + right_bits_ >= 2).
  uint64_t cycle_steps_ = 0;
  uint32_t left_bits_ = 0;
  uint32_t right_bits_ = 0;
};

}  // namespace loaderx
