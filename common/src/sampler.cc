#include "loaderx/sampler.h"

#include <algorithm>
#include <array>
#include <new>
#include <string>

namespace loaderx {

namespace {

using u128 = unsigned __int128;

// Weyl increment of SplitMix64 (2^64 / golden ratio, odd).
constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ULL;
// Separate odd constants so the seed, step, cycle, retry and round-key
// derivations never feed the mixer the same input for different purposes.
constexpr uint64_t kSeedSalt = 0x243F6A8885A308D3ULL;  // pi
constexpr uint64_t kStepSalt = 0x13198A2E03707345ULL;
constexpr uint64_t kCycleSalt = 0xA4093822299F31D1ULL;
constexpr uint64_t kRetrySalt = 0x082EFA98EC4E6C89ULL;
constexpr uint64_t kRoundSalt = 0x452821E638D01377ULL;
constexpr uint64_t kSegmentSalt = 0xBE5466CF34E90C6CULL;

// SplitMix64's finaliser (Stafford's "Mix13"): a bijection of 64-bit words
// with full avalanche.
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 31;
  return x;
}

// A 32-bit bijective mixer (Wellons' "lowbias32" with the improved
// constants of his hash-prospector search), the Feistel round function: half
// words are at most 32 bits wide, and 32-bit multiplies vectorise.
inline uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x21F0AAADU;
  x ^= x >> 15;
  x *= 0xD35A2D97U;
  x ^= x >> 15;
  return x;
}

// ceil(log2(n)) for n >= 1.
inline uint32_t CeilLog2(uint64_t n) {
  return n <= 1 ? 0 : 64 - static_cast<uint32_t>(__builtin_clzll(n - 1));
}

inline uint64_t LowMask(uint32_t bits) {
  return bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
}

// One cycle's Feistel permutation restricted to [0, n) (see FillCyclic).
struct FeistelPerm {
  static constexpr int kRounds = Sampler::kFeistelRounds;
  static_assert(kRounds % 2 == 0, "rounds come in left/right pairs");
  uint64_t n;
  uint32_t rbits;  // width of the right (low) half
  uint32_t lmask;
  uint32_t rmask;
  std::array<uint32_t, kRounds> keys;

  // Alternating Feistel network: even rounds update the left (high) half from
  // the right, odd rounds the right from the left. Each round is invertible
  // whatever the half widths, so the network is a bijection of
  // [0, 2^(left+right)).
  uint64_t Encrypt(uint64_t x) const {
    uint32_t left = static_cast<uint32_t>(x >> rbits);
    uint32_t right = static_cast<uint32_t>(x) & rmask;
    for (int r = 0; r < kRounds; r += 2) {
      left = (left ^ Mix32(right ^ keys[r])) & lmask;
      right = (right ^ Mix32(left ^ keys[r + 1])) & rmask;
    }
    return (static_cast<uint64_t>(left) << rbits) | right;
  }
  // Cycle walking: re-encrypting until the value is < n restricts the
  // bijection to [0, n) (the walk from a value < n returns below n).
  uint64_t Permute(uint64_t x) const {
    x = Encrypt(x);
    while (x >= n) x = Encrypt(x);
    return x;
  }
};

// out[i] = perm(first + i) for i < count. Lanes of independent positions go
// through the network round by round, so the multiply latency of one lane
// hides behind the others and the compiler can use SIMD; the rare values that
// need cycle walking finish one by one.
__attribute__((always_inline)) inline void PermuteRange(const FeistelPerm& f, uint64_t first,
                                                        uint64_t count, uint64_t* out) {
  constexpr uint64_t kLanes = 16;
  uint64_t i = 0, p = first;
  for (; i + kLanes <= count; i += kLanes, p += kLanes) {
    uint32_t left[kLanes], right[kLanes];
    for (uint64_t j = 0; j < kLanes; ++j) {
      left[j] = static_cast<uint32_t>((p + j) >> f.rbits);
      right[j] = static_cast<uint32_t>(p + j) & f.rmask;
    }
    for (int r = 0; r < FeistelPerm::kRounds; r += 2) {
      for (uint64_t j = 0; j < kLanes; ++j) {
        left[j] = (left[j] ^ Mix32(right[j] ^ f.keys[r])) & f.lmask;
      }
      for (uint64_t j = 0; j < kLanes; ++j) {
        right[j] = (right[j] ^ Mix32(left[j] ^ f.keys[r + 1])) & f.rmask;
      }
    }
    for (uint64_t j = 0; j < kLanes; ++j) {
      uint64_t x = (static_cast<uint64_t>(left[j]) << f.rbits) | right[j];
      while (x >= f.n) x = f.Encrypt(x);
      out[i + j] = x;
    }
  }
  for (; i < count; ++i, ++p) out[i] = f.Permute(p);
}

// The same kernel compiled for AVX2 (8-wide 32-bit multiplies, about 1.5x
// faster) and for baseline x86-64, chosen once at run time. Explicit dispatch
// rather than GNU ifunc (target_clones): an ifunc resolver runs before the
// sanitizer runtimes are initialised and crashes TSan builds.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) void PermuteRangeAvx2(const FeistelPerm& f, uint64_t first,
                                                      uint64_t count, uint64_t* out) {
  PermuteRange(f, first, count, out);
}
bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#endif

void PermuteRangeDispatch(const FeistelPerm& f, uint64_t first, uint64_t count, uint64_t* out) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (HasAvx2()) {
    PermuteRangeAvx2(f, first, count, out);
    return;
  }
#endif
  PermuteRange(f, first, count, out);
}

}  // namespace

const char* SamplerModeName(SamplerMode mode) {
  switch (mode) {
    case SamplerMode::kSequential:
      return "Sequential";
    case SamplerMode::kIID:
      return "IID";
    case SamplerMode::kCyclic:
      return "Cyclic";
  }
  return "unknown";
}

Status SamplerSpec::Validate() const {
  if (n == 0) return Status::InvalidArgument("n must be > 0 (got 0)");
  if (batch_size == 0) return Status::InvalidArgument("batch_size must be > 0 (got 0)");
  if (batch_size > Sampler::kMaxBatchSize) {
    return Status::InvalidArgument(
        "batch_size must be <= " + std::to_string(Sampler::kMaxBatchSize) + " (got " +
        std::to_string(batch_size) + ")");
  }
  if (world_size == 0) return Status::InvalidArgument("world_size must be > 0 (got 0)");
  if (rank >= world_size) {
    return Status::InvalidArgument("rank must be < world_size (got rank " + std::to_string(rank) +
                                   ", world_size " + std::to_string(world_size) + ")");
  }
  if (mode != SamplerMode::kSequential && mode != SamplerMode::kIID &&
      mode != SamplerMode::kCyclic) {
    return Status::InvalidArgument("mode: unknown sampler mode " +
                                   std::to_string(static_cast<int>(mode)));
  }
  uint64_t global = 0;
  if (__builtin_mul_overflow(batch_size, world_size, &global)) {
    return Status::InvalidArgument("batch_size * world_size overflows 64 bits (batch_size " +
                                   std::to_string(batch_size) + ", world_size " +
                                   std::to_string(world_size) + ")");
  }
  if (mode == SamplerMode::kCyclic && global > n) {
    return Status::InvalidArgument("batch_size * world_size (" + std::to_string(global) +
                                   ") must be <= n (" + std::to_string(n) +
                                   ") in Cyclic mode: a cycle holds only full global batches");
  }
  if (segments.size() > kMaxSamplerSegments) {
    return Status::InvalidArgument("segments: at most " + std::to_string(kMaxSamplerSegments) +
                                   " segments, got " + std::to_string(segments.size()));
  }
  for (size_t k = 0; k < segments.size(); ++k) {
    const SamplerSegment& g = segments[k];
    const std::string at = "segments[" + std::to_string(k) + "]";
    if (k == 0 && g.start_step != 0) {
      return Status::InvalidArgument(at + ": the first segment must start at step 0, not " +
                                     std::to_string(g.start_step));
    }
    if (k > 0 && g.start_step <= segments[k - 1].start_step) {
      return Status::InvalidArgument(at + ": start steps must increase (step " +
                                     std::to_string(g.start_step) + " after step " +
                                     std::to_string(segments[k - 1].start_step) + ")");
    }
    if (g.size == 0 || g.base >= n || g.size > n - g.base) {
      return Status::InvalidArgument(at + ": indices [" + std::to_string(g.base) + ", +" +
                                     std::to_string(g.size) +
                                     ") must be a non-empty range "
                                     "inside [0, n = " +
                                     std::to_string(n) + ")");
    }
    if (mode == SamplerMode::kCyclic && global > g.size) {
      return Status::InvalidArgument(at + ": batch_size * world_size (" + std::to_string(global) +
                                     ") must be <= its size (" + std::to_string(g.size) +
                                     ") in Cyclic mode");
    }
  }
  return Status::OK();
}

SamplerSpec SamplerSpec::Effective() const {
  SamplerSpec s = *this;
  if (s.mode == SamplerMode::kCyclic && s.world_size == 1 && s.n >= 1 && s.batch_size > s.n) {
    s.batch_size = s.n;
  }
  return s;
}

uint64_t SegmentSeed(uint64_t seed, uint64_t k) {
  if (k == 0) return seed;
  return Mix64(seed ^ Mix64(k * kGamma + kSegmentSalt));
}

Result<Sampler> Sampler::Make(const SamplerSpec& requested, uint64_t start_step) {
  const SamplerSpec spec = requested.Effective();
  LX_RETURN_IF_ERROR(spec.Validate());
  try {
    Sampler sampler(spec, start_step);
    sampler.segment_samplers_.reserve(spec.segments.size());
    for (size_t k = 0; k < spec.segments.size(); ++k) {
      SamplerSpec plain = spec;
      plain.segments.clear();
      plain.n = spec.segments[k].size;
      plain.seed = SegmentSeed(spec.seed, k);
      sampler.segment_samplers_.push_back(Sampler(plain, 0));
    }
    return sampler;
  } catch (const std::bad_alloc&) {
    return Status::ResourceExhausted("cannot allocate the sampler buffer of batch_size " +
                                     std::to_string(spec.batch_size) + " indices");
  }
}

Sampler::Sampler(const SamplerSpec& spec, uint64_t step)
    : spec_(spec), step_(step), buf_(spec.batch_size) {
  seed_key_ = Mix64(Mix64(spec.seed ^ kSeedSalt) + kGamma);
  // Lemire's rejection threshold 2^w mod n for the w-bit draws FillIID uses:
  // w = 32 when n fits 32 bits, else 64 (computed as (2^64 - n) mod n).
  reject_below_ = spec.n <= (uint64_t{1} << 32) ? ((uint64_t{1} << 32) - spec.n) % spec.n
                                                : (0 - spec.n) % spec.n;
  if (spec.mode == SamplerMode::kCyclic) {
    cycle_steps_ = spec.n / spec.global_batch();
    // At least one bit per half so every round mixes something; the domain
    // 2^(left+right) is < 2n (or 4 when n <= 4), so cycle walking takes fewer
    // than two rounds of the network on average.
    const uint32_t bits = CeilLog2(spec.n) < 2 ? 2 : CeilLog2(spec.n);
    right_bits_ = bits / 2;
    left_bits_ = bits - right_bits_;
  }
}

void Sampler::Fill(uint64_t step, uint64_t* out) const {
  if (segment_samplers_.empty()) {
    FillPlain(step, out);
    return;
  }
  const auto& segs = spec_.segments;
  // The last segment starting at or before `step` (segs[0] starts at 0).
  const size_t k = static_cast<size_t>(
      std::upper_bound(segs.begin(), segs.end(), step,
                       [](uint64_t s, const SamplerSegment& g) { return s < g.start_step; }) -
      segs.begin() - 1);
  segment_samplers_[k].FillPlain(step - segs[k].start_step, out);
  const uint64_t base = segs[k].base;
  if (base != 0) {
    for (uint64_t i = 0; i < spec_.batch_size; ++i) out[i] += base;
  }
}

void Sampler::FillPlain(uint64_t step, uint64_t* out) const {
  switch (spec_.mode) {
    case SamplerMode::kSequential:
      FillSequential(step, out);
      return;
    case SamplerMode::kIID:
      FillIID(step, out);
      return;
    case SamplerMode::kCyclic:
      FillCyclic(step, out);
      return;
  }
}

const std::vector<uint64_t>& Sampler::Next() {
  Fill(step_, buf_.data());
  ++step_;
  return buf_;
}

void Sampler::FillSequential(uint64_t step, uint64_t* out) const {
  const uint64_t n = spec_.n;
  // 128-bit product: step * G may exceed 2^64 long before step does.
  uint64_t p = static_cast<uint64_t>((static_cast<u128>(step) * spec_.global_batch() +
                                      static_cast<u128>(spec_.rank) * spec_.batch_size) %
                                     n);
  for (uint64_t i = 0; i < spec_.batch_size; ++i) {
    out[i] = p;
    if (++p == n) p = 0;
  }
}

void Sampler::FillIID(uint64_t step, uint64_t* out) const {
  const uint64_t n = spec_.n;
  // SplitMix64 stream for this step: word w is Mix64(step_key + (w + 1) * gamma),
  // addressed by the position j in the global batch, so rank slices of one
  // global batch come from the same stream.
  const uint64_t step_key = Mix64(seed_key_ ^ Mix64(step * kGamma + kStepSalt));
  const uint64_t first = spec_.rank * spec_.batch_size;
  const uint64_t batch = spec_.batch_size;
  if (n <= (uint64_t{1} << 32)) {
    // n fits 32 bits: each 64-bit word yields the candidates of two positions
    // (low half for even j, high half for odd j), reduced by Lemire's 32-bit
    // multiply-shift; a rejected position redraws from its own chain.
    const uint64_t n64 = n;
    const uint32_t threshold = static_cast<uint32_t>(reject_below_);
    auto reduce = [&](uint32_t x, uint64_t j) {
      uint64_t m = static_cast<uint64_t>(x) * n64;
      if (__builtin_expect(static_cast<uint32_t>(m) < threshold, 0)) {
        uint64_t v = step_key ^ Mix64(j + kRetrySalt);
        do {
          v = Mix64(v + kGamma);
          m = static_cast<uint64_t>(static_cast<uint32_t>(v)) * n64;
        } while (static_cast<uint32_t>(m) < threshold);
      }
      return m >> 32;
    };
    uint64_t i = 0, j = first;
    if (j & 1) {
      out[i++] = reduce(static_cast<uint32_t>(Mix64(step_key + (j / 2 + 1) * kGamma) >> 32), j);
      ++j;
    }
    for (; i + 2 <= batch; i += 2, j += 2) {
      const uint64_t word = Mix64(step_key + (j / 2 + 1) * kGamma);
      out[i] = reduce(static_cast<uint32_t>(word), j);
      out[i + 1] = reduce(static_cast<uint32_t>(word >> 32), j + 1);
    }
    if (i < batch)
      out[i] = reduce(static_cast<uint32_t>(Mix64(step_key + (j / 2 + 1) * kGamma)), j);
    return;
  }
  const uint64_t threshold = reject_below_;
  uint64_t state = step_key + first * kGamma;
  for (uint64_t i = 0; i < batch; ++i) {
    state += kGamma;
    uint64_t x = Mix64(state);
    // Lemire: the high word of x * n is uniform on [0, n) once draws whose
    // low word falls below 2^64 mod n are rejected.
    u128 m = static_cast<u128>(x) * n;
    uint64_t low = static_cast<uint64_t>(m);
    if (__builtin_expect(low < threshold, 0)) {
      while (low < threshold) {
        x = Mix64(x ^ kRetrySalt);
        m = static_cast<u128>(x) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    out[i] = static_cast<uint64_t>(m >> 64);
  }
}

void Sampler::FillCyclic(uint64_t step, uint64_t* out) const {
  const uint64_t cycle = step / cycle_steps_;
  const uint64_t within = step % cycle_steps_;
  FeistelPerm f;
  f.n = spec_.n;
  // Halves are at most 32 bits wide (n < 2^64).
  f.rbits = right_bits_;
  f.lmask = static_cast<uint32_t>(LowMask(left_bits_));
  f.rmask = static_cast<uint32_t>(LowMask(right_bits_));
  // Round keys of this cycle's permutation.
  const uint64_t cycle_key = Mix64(seed_key_ ^ Mix64(cycle * kGamma + kCycleSalt));
  for (int r = 0; r < kFeistelRounds; ++r) {
    f.keys[r] = static_cast<uint32_t>(Mix64(cycle_key + static_cast<uint64_t>(r + 1) * kRoundSalt));
  }
  PermuteRangeDispatch(f, within * spec_.global_batch() + spec_.rank * spec_.batch_size,
                       spec_.batch_size, out);
}

}  // namespace loaderx
