#include "loaderx/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace loaderx {
namespace {

using u128 = unsigned __int128;

SamplerSpec Spec(uint64_t n, uint64_t batch, SamplerMode mode, uint64_t seed = 42,
                 uint64_t rank = 0, uint64_t world = 1) {
  SamplerSpec s;
  s.n = n;
  s.batch_size = batch;
  s.mode = mode;
  s.seed = seed;
  s.rank = rank;
  s.world_size = world;
  return s;
}

Sampler MakeOrDie(const SamplerSpec& spec, uint64_t start = 0) {
  Result<Sampler> r = Sampler::Make(spec, start);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

std::vector<uint64_t> Draw(const Sampler& s, uint64_t step) {
  std::vector<uint64_t> out(s.spec().batch_size);
  s.Fill(step, out.data());
  return out;
}

// Pearson chi-square statistic of observed counts against a uniform law.
double ChiSquareUniform(const std::vector<uint64_t>& counts) {
  double total = 0;
  for (uint64_t c : counts) total += static_cast<double>(c);
  const double expected = total / static_cast<double>(counts.size());
  double chi = 0;
  for (uint64_t c : counts) {
    const double d = static_cast<double>(c) - expected;
    chi += d * d / expected;
  }
  return chi;
}

// A bound the statistic exceeds with probability ~1e-6 under the null
// (df + 5 * sqrt(2 df), the normal approximation). The tests use fixed seeds,
// so they are deterministic; the bound states how surprising a failure is.
double ChiSquareBound(size_t cells) {
  const double df = static_cast<double>(cells - 1);
  return df + 5.0 * std::sqrt(2.0 * df);
}

double Pearson(const std::vector<double>& a, const std::vector<double>& b) {
  const double n = static_cast<double>(a.size());
  double ma = 0, mb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ma += a[i];
    mb += b[i];
  }
  ma /= n;
  mb /= n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  return sab / std::sqrt(saa * sbb);
}

// ---------------------------------------------------------------- validation

// ---------------------------------------------------------------- segments

// Step s of segment k draws base_k + what a plain sampler over size_k with
// SegmentSeed(seed, k) draws at s - start_k, on every rank.
TEST(SamplerSegmentsTest, EachSegmentIsAPlainSamplerOffsetInStepAndIndex) {
  for (SamplerMode mode : {SamplerMode::kIID, SamplerMode::kCyclic, SamplerMode::kSequential}) {
    for (uint64_t rank : {0, 1}) {
      SamplerSpec spec = Spec(100 + 37 + 64, 8, mode, 5, rank, 2);
      spec.segments = {{0, 0, 100}, {6, 100, 37}, {11, 137, 64}};
      const Sampler s = MakeOrDie(spec);
      for (uint64_t step = 0; step < 20; ++step) {
        const size_t k = step < 6 ? 0 : step < 11 ? 1 : 2;
        const SamplerSegment& g = spec.segments[k];
        const Sampler plain = MakeOrDie(Spec(g.size, 8, mode, SegmentSeed(5, k), rank, 2));
        std::vector<uint64_t> want = Draw(plain, step - g.start_step);
        for (auto& v : want) v += g.base;
        EXPECT_EQ(Draw(s, step), want) << SamplerModeName(mode) << " step " << step;
      }
    }
  }
  // One segment over everything is the plain sampler; segment 0 keeps the seed.
  SamplerSpec one = Spec(50, 4, SamplerMode::kCyclic, 9);
  one.segments = {{0, 0, 50}};
  EXPECT_EQ(Draw(MakeOrDie(one), 17), Draw(MakeOrDie(Spec(50, 4, SamplerMode::kCyclic, 9)), 17));
  EXPECT_EQ(SegmentSeed(9, 0), 9u);
  EXPECT_NE(SegmentSeed(9, 1), SegmentSeed(9, 2));
}

TEST(SamplerSegmentsTest, BadSegmentsAreRefusedNamingThem) {
  auto with = [](std::vector<SamplerSegment> segments, SamplerMode mode = SamplerMode::kIID) {
    SamplerSpec s = Spec(100, 8, mode);
    s.segments = std::move(segments);
    return s;
  };
  auto message = [](const SamplerSpec& spec) {
    Status st = spec.Validate();
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    EXPECT_FALSE(Sampler::Make(spec).ok());
    return st.message();
  };
  EXPECT_EQ(message(with({{3, 0, 100}})),
            "segments[0]: the first segment must start at step 0, not 3");
  EXPECT_EQ(message(with({{0, 0, 50}, {4, 50, 25}, {4, 75, 25}})),
            "segments[2]: start steps must increase (step 4 after step 4)");
  EXPECT_EQ(message(with({{0, 0, 50}, {4, 60, 41}})),
            "segments[1]: indices [60, +41) must be a non-empty range inside [0, n = 100)");
  EXPECT_EQ(message(with({{0, 0, 0}})),
            "segments[0]: indices [0, +0) must be a non-empty range inside [0, n = 100)");
  EXPECT_EQ(message(with({{0, 0, 50}, {4, 50, 7}}, SamplerMode::kCyclic)),
            "segments[1]: batch_size * world_size (8) must be <= its size (7) in Cyclic mode");
}

void ExpectInvalid(const SamplerSpec& spec, const std::string& needle) {
  Status st = spec.Validate();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  Result<Sampler> r = Sampler::Make(spec);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
}

TEST(SamplerSpecTest, ZeroNIsRejectedNamingN) {
  ExpectInvalid(Spec(0, 4, SamplerMode::kIID), "n must be > 0");
}

TEST(SamplerSpecTest, ZeroBatchIsRejectedNamingBatchSize) {
  ExpectInvalid(Spec(10, 0, SamplerMode::kIID), "batch_size");
}

TEST(SamplerSpecTest, OversizedBatchIsRejectedNamingBatchSize) {
  ExpectInvalid(Spec(10, Sampler::kMaxBatchSize + 1, SamplerMode::kIID), "batch_size");
}

TEST(SamplerSpecTest, ZeroWorldSizeIsRejected) {
  ExpectInvalid(Spec(10, 2, SamplerMode::kIID, 42, 0, 0), "world_size");
}

TEST(SamplerSpecTest, RankNotBelowWorldSizeIsRejectedNamingRank) {
  ExpectInvalid(Spec(10, 2, SamplerMode::kIID, 42, 2, 2), "rank");
  ExpectInvalid(Spec(10, 2, SamplerMode::kIID, 42, 7, 2), "rank");
}

TEST(SamplerSpecTest, UnknownModeIsRejectedNamingMode) {
  ExpectInvalid(Spec(10, 2, static_cast<SamplerMode>(9)), "mode");
}

TEST(SamplerSpecTest, GlobalBatchOverflowIsRejected) {
  ExpectInvalid(Spec(10, Sampler::kMaxBatchSize, SamplerMode::kIID, 42, 0, uint64_t{1} << 40),
                "overflows");
}

TEST(SamplerSpecTest, CyclicGlobalBatchLargerThanNIsRejected) {
  // As given; Make() runs Effective() first, which makes one rank's batch n.
  EXPECT_NE(Spec(5, 6, SamplerMode::kCyclic).Validate().message().find("must be <= n"),
            std::string::npos);
  // Per-rank batch fits, global batch does not.
  ExpectInvalid(Spec(5, 3, SamplerMode::kCyclic, 42, 0, 2), "must be <= n");
}

// Validate() judges the spec as given; Make() runs Effective() first: one
// rank in Cyclic mode gets whole cycles, several ranks are still refused.
TEST(SamplerSpecTest, CyclicBatchLargerThanNIsOneWholeCycleForOneRankOnly) {
  EXPECT_EQ(Spec(5, 6, SamplerMode::kCyclic).Effective().batch_size, 5u);
  EXPECT_EQ(Spec(5, 6, SamplerMode::kIID).Effective().batch_size, 6u);
  EXPECT_EQ(Spec(5, 3, SamplerMode::kCyclic, 42, 0, 2).Effective().batch_size, 3u);
  EXPECT_EQ(MakeOrDie(Spec(5, 6, SamplerMode::kCyclic, 7)).spec().batch_size, 5u);
  Sampler whole = MakeOrDie(Spec(5, 5, SamplerMode::kCyclic, 7));
  Sampler clamped = MakeOrDie(Spec(5, 6, SamplerMode::kCyclic, 7));
  for (int step = 0; step < 4; ++step) {
    const std::vector<uint64_t> a = whole.Next();
    EXPECT_EQ(clamped.Next(), a) << "step " << step;
  }
  EXPECT_FALSE(Sampler::Make(Spec(5, 3, SamplerMode::kCyclic, 42, 0, 2)).ok());
}

TEST(SamplerSpecTest, BatchLargerThanNIsFineWithReplacementModes) {
  EXPECT_TRUE(Spec(5, 6, SamplerMode::kIID).Validate().ok());
  EXPECT_TRUE(Spec(5, 6, SamplerMode::kSequential).Validate().ok());
  EXPECT_TRUE(Spec(5, 5, SamplerMode::kCyclic).Validate().ok());
}

TEST(SamplerTest, ModeNamesAreStable) {
  EXPECT_STREQ(SamplerModeName(SamplerMode::kSequential), "Sequential");
  EXPECT_STREQ(SamplerModeName(SamplerMode::kIID), "IID");
  EXPECT_STREQ(SamplerModeName(SamplerMode::kCyclic), "Cyclic");
}

// ---------------------------------------------------------------- stateful face

TEST(SamplerTest, NextFillsStepThenAdvances) {
  for (SamplerMode mode : {SamplerMode::kSequential, SamplerMode::kIID, SamplerMode::kCyclic}) {
    Sampler s = MakeOrDie(Spec(1000, 16, mode));
    EXPECT_EQ(s.step(), 0u);
    for (uint64_t step = 0; step < 100; ++step) {
      const std::vector<uint64_t>& got = s.Next();
      EXPECT_EQ(got, Draw(s, step)) << SamplerModeName(mode) << " step " << step;
      EXPECT_EQ(s.step(), step + 1);
    }
  }
}

TEST(SamplerTest, NextReusesOneBuffer) {
  Sampler s = MakeOrDie(Spec(1000, 8, SamplerMode::kIID));
  const uint64_t* first = s.Next().data();
  const uint64_t* second = s.Next().data();
  EXPECT_EQ(first, second);
  EXPECT_EQ(s.buffer().data(), first);
}

TEST(SamplerTest, StartStepAndSeekPositionTheNextDraw) {
  for (SamplerMode mode : {SamplerMode::kSequential, SamplerMode::kIID, SamplerMode::kCyclic}) {
    Sampler fresh = MakeOrDie(Spec(997, 7, mode, 3));
    std::vector<std::vector<uint64_t>> draws;
    for (int i = 0; i < 500; ++i) draws.push_back(fresh.Next());
    for (uint64_t s : {0u, 1u, 141u, 142u, 499u}) {
      Sampler started = MakeOrDie(Spec(997, 7, mode, 3), s);
      EXPECT_EQ(started.step(), s);
      EXPECT_EQ(started.Next(), draws[s]);
      Sampler sought = MakeOrDie(Spec(997, 7, mode, 3));
      sought.Next();
      sought.Seek(s);
      EXPECT_EQ(sought.Next(), draws[s]);
    }
  }
}

TEST(SamplerTest, FillIsIndependentOfCallOrder) {
  for (SamplerMode mode : {SamplerMode::kSequential, SamplerMode::kIID, SamplerMode::kCyclic}) {
    Sampler a = MakeOrDie(Spec(10007, 33, mode));
    Sampler b = MakeOrDie(Spec(10007, 33, mode));
    std::vector<std::vector<uint64_t>> forward, backward(200);
    for (uint64_t s = 0; s < 200; ++s) forward.push_back(Draw(a, s));
    for (uint64_t s = 200; s-- > 0;) backward[s] = Draw(b, s);
    EXPECT_EQ(forward, backward) << SamplerModeName(mode);
  }
}

TEST(SamplerTest, ConcurrentFillMatchesSerialFill) {
  Sampler s = MakeOrDie(Spec(1'000'003, 64, SamplerMode::kCyclic, 9));
  constexpr uint64_t kSteps = 400;
  std::vector<std::vector<uint64_t>> serial;
  for (uint64_t i = 0; i < kSteps; ++i) serial.push_back(Draw(s, i));
  std::vector<std::vector<uint64_t>> parallel(kSteps);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = t; i < kSteps; i += 4) parallel[i] = Draw(s, i);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(serial, parallel);
}

// ---------------------------------------------------------------- Sequential

TEST(SequentialTest, WalksInOrderAndWraps) {
  Sampler s = MakeOrDie(Spec(5, 3, SamplerMode::kSequential));
  EXPECT_EQ(s.Next(), (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_EQ(s.Next(), (std::vector<uint64_t>{3, 4, 0}));
  EXPECT_EQ(s.Next(), (std::vector<uint64_t>{1, 2, 3}));
}

TEST(SequentialTest, BatchLargerThanNWrapsInsideTheBatch) {
  Sampler s = MakeOrDie(Spec(2, 5, SamplerMode::kSequential));
  EXPECT_EQ(s.Next(), (std::vector<uint64_t>{0, 1, 0, 1, 0}));
  EXPECT_EQ(s.Next(), (std::vector<uint64_t>{1, 0, 1, 0, 1}));
}

TEST(SequentialTest, HugeStepDoesNotOverflow) {
  const uint64_t n = 1'000'000'007, b = 1000, step = ~uint64_t{0} - 5;
  Sampler s = MakeOrDie(Spec(n, b, SamplerMode::kSequential));
  const uint64_t start = static_cast<uint64_t>((static_cast<u128>(step) * b) % n);
  std::vector<uint64_t> got = Draw(s, step);
  for (uint64_t i = 0; i < b; ++i) ASSERT_EQ(got[i], (start + i) % n);
}

// ---------------------------------------------------------------- sharding

TEST(ShardingTest, RanksConcatenateToTheSingleRankGlobalBatch) {
  for (SamplerMode mode : {SamplerMode::kSequential, SamplerMode::kIID, SamplerMode::kCyclic}) {
    for (uint64_t world : {2u, 3u, 8u}) {
      const uint64_t n = 1009, b = 5;
      Sampler global = MakeOrDie(Spec(n, b * world, mode, 77));
      std::vector<Sampler> ranks;
      for (uint64_t r = 0; r < world; ++r)
        ranks.push_back(MakeOrDie(Spec(n, b, mode, 77, r, world)));
      for (uint64_t step : {0u, 1u, 2u, 40u, 41u, 1000u}) {
        std::vector<uint64_t> cat;
        for (const Sampler& r : ranks) {
          std::vector<uint64_t> part = Draw(r, step);
          cat.insert(cat.end(), part.begin(), part.end());
        }
        EXPECT_EQ(cat, Draw(global, step)) << SamplerModeName(mode) << " world " << world;
      }
    }
  }
}

// ---------------------------------------------------------------- IID

TEST(IIDTest, IndicesAreInRange) {
  for (uint64_t n : {1ull, 2ull, 3ull, 7ull, 1000ull, (1ull << 32) - 1, 1ull << 32,
                     (1ull << 32) + 1, (1ull << 63) + 1, ~0ull}) {
    Sampler s = MakeOrDie(Spec(n, 512, SamplerMode::kIID, 5));
    for (int k = 0; k < 20; ++k) {
      for (uint64_t v : s.Next()) ASSERT_LT(v, n) << "n=" << n;
    }
  }
}

TEST(IIDTest, SingleRecordAlwaysYieldsZero) {
  Sampler s = MakeOrDie(Spec(1, 64, SamplerMode::kIID));
  EXPECT_EQ(s.Next(), std::vector<uint64_t>(64, 0));
}

TEST(IIDTest, OutputIsPinnedForSeed42) {
  // Checkpoints name a step, not RNG state: the stream for a given
  // (seed, step) must never change between releases.
  Sampler s = MakeOrDie(Spec(1'000'000, 4, SamplerMode::kIID, 42));
  std::vector<uint64_t> got = Draw(s, 0);
  std::vector<uint64_t> again = Draw(s, 0);
  EXPECT_EQ(got, again);
  EXPECT_EQ(got, (std::vector<uint64_t>{879284, 568461, 29877, 889763}));
}

// Draws 200k IID indices from [0, 3 * 2^k) and checks the two classic
// biases are absent: the fraction below 2^k (the lower third) and the
// fraction of multiples of 3 are both 1/3. 200k draws: the sd of a 1/3
// proportion is ~0.0011; 0.01 is ~9 sd.
void ExpectNoModuloBias(int k) {
  const uint64_t n = 3ull << k;
  Sampler s = MakeOrDie(Spec(n, 1000, SamplerMode::kIID, 1));
  uint64_t lower_third = 0, residue0 = 0, total = 0;
  for (int b = 0; b < 200; ++b) {
    for (uint64_t v : s.Next()) {
      ASSERT_LT(v, n);
      lower_third += v < (1ull << k);
      residue0 += v % 3 == 0;
      ++total;
    }
  }
  EXPECT_NEAR(static_cast<double>(lower_third) / total, 1.0 / 3, 0.01);
  EXPECT_NEAR(static_cast<double>(residue0) / total, 1.0 / 3, 0.01);
}

TEST(IIDTest, NoModuloBiasAtThreeTimesTwoToThe62) {
  // n = 3 * 2^62: plain `x % n` lands in the lower third [0, 2^62) half of the
  // time, and a multiply-shift without rejection gives residue 0 mod 3 half
  // of the time. Unbiased sampling gives 1/3 for both.
  ExpectNoModuloBias(62);
}

TEST(IIDTest, NoModuloBiasAtThreeTimesTwoToThe30) {
  // The same trap for the 32-bit draw path (n <= 2^32): x % n over 32-bit x
  // puts half of the draws below 2^30.
  ExpectNoModuloBias(30);
}

TEST(IIDTest, ChiSquareUniformOnSmallN) {
  for (uint64_t n : {2ull, 3ull, 10ull, 97ull, 1000ull}) {
    Sampler s = MakeOrDie(Spec(n, 1000, SamplerMode::kIID, 11));
    std::vector<uint64_t> counts(n);
    const int draws = static_cast<int>(std::max<uint64_t>(200, 50 * n / 1000 + 1));
    for (int k = 0; k < draws; ++k) {
      for (uint64_t v : s.Next()) ++counts[v];
    }
    EXPECT_LT(ChiSquareUniform(counts), ChiSquareBound(n)) << "n=" << n;
  }
}

TEST(IIDTest, ConsecutiveDrawsAreUncorrelated) {
  Sampler s = MakeOrDie(Spec(1'000'000, 10000, SamplerMode::kIID, 2));
  std::vector<double> a, b;
  for (int k = 0; k < 10; ++k) {
    const std::vector<uint64_t>& v = s.Next();
    for (size_t i = 0; i + 1 < v.size(); ++i) {
      a.push_back(static_cast<double>(v[i]));
      b.push_back(static_cast<double>(v[i + 1]));
    }
  }
  // ~1e5 pairs: sd of r is ~0.003.
  EXPECT_LT(std::abs(Pearson(a, b)), 0.02);
}

TEST(IIDTest, SeedsAndStepsGiveDifferentBatches) {
  Sampler a = MakeOrDie(Spec(1'000'000, 64, SamplerMode::kIID, 1));
  Sampler b = MakeOrDie(Spec(1'000'000, 64, SamplerMode::kIID, 2));
  EXPECT_NE(Draw(a, 0), Draw(b, 0));
  EXPECT_NE(Draw(a, 0), Draw(a, 1));
}

// ---------------------------------------------------------------- Cyclic

void ExpectPermutationPerCycle(uint64_t n, uint64_t b, uint64_t world, uint64_t seed) {
  std::vector<Sampler> ranks;
  for (uint64_t r = 0; r < world; ++r) {
    ranks.push_back(MakeOrDie(Spec(n, b, SamplerMode::kCyclic, seed, r, world)));
  }
  const uint64_t g = b * world, steps = n / g;
  ASSERT_EQ(ranks[0].cycle_steps(), steps);
  for (uint64_t cycle = 0; cycle < 3; ++cycle) {
    std::vector<uint8_t> seen(n, 0);
    for (uint64_t k = 0; k < steps; ++k) {
      for (const Sampler& s : ranks) {
        for (uint64_t v : Draw(s, cycle * steps + k)) {
          ASSERT_LT(v, n);
          ASSERT_EQ(seen[v], 0) << "repeat of " << v << " n=" << n << " b=" << b;
          seen[v] = 1;
        }
      }
    }
    const uint64_t covered = static_cast<uint64_t>(std::count(seen.begin(), seen.end(), 1));
    EXPECT_EQ(covered, steps * g);
    if (n % g == 0) {
      EXPECT_EQ(covered, n);
    }
  }
}

TEST(CyclicTest, OutputIsPinnedForSeed42) {
  // n = 1000, batch 4: 250 steps per cycle; step 250 opens cycle 1.
  Sampler s = MakeOrDie(Spec(1000, 4, SamplerMode::kCyclic, 42));
  EXPECT_EQ(Draw(s, 0), (std::vector<uint64_t>{57, 487, 966, 90}));
  EXPECT_EQ(Draw(s, 250), (std::vector<uint64_t>{103, 381, 448, 470}));
}

TEST(CyclicTest, InterleavedLanesMatchOnePositionAtATime) {
  // Batches of >= 16 go through the lane kernel, single positions through the
  // scalar path; world_size = G with batch 1 draws each position alone.
  for (uint64_t n : {37ull, 1000ull, 65537ull, 1'000'000'007ull}) {
    const uint64_t g = 37;
    Sampler whole = MakeOrDie(Spec(n, g, SamplerMode::kCyclic, 5));
    for (uint64_t step : {0ull, 1ull, 7ull}) {
      std::vector<uint64_t> lanes = Draw(whole, step);
      for (uint64_t r = 0; r < g; ++r) {
        Sampler single = MakeOrDie(Spec(n, 1, SamplerMode::kCyclic, 5, r, g));
        ASSERT_EQ(Draw(single, step)[0], lanes[r]) << "n=" << n << " position " << r;
      }
    }
  }
}

TEST(CyclicTest, EachCycleIsAPermutationForManyN) {
  const std::vector<uint64_t> ns = {
      1,  2,  3,   4,   5,   7,   8,   9,   13,   15,   16,   17,   31,   32,    33,    63,   64,
      65, 97, 127, 128, 129, 255, 256, 257, 1000, 1023, 1024, 1025, 4093, 65535, 65536, 65537};
  for (uint64_t n : ns) {
    for (uint64_t b : std::vector<uint64_t>{1, 2, 3, 7, n / 2, n - 1, n}) {
      if (b == 0 || b > n) continue;
      ExpectPermutationPerCycle(n, b, 1, n * 31 + b);
    }
  }
}

TEST(CyclicTest, EachCycleIsAPermutationAcrossRanks) {
  ExpectPermutationPerCycle(1000, 7, 3, 5);
  ExpectPermutationPerCycle(1024, 16, 4, 6);
  ExpectPermutationPerCycle(6, 1, 6, 7);
}

TEST(CyclicTest, BatchEqualToNIsOnePermutationPerStep) {
  Sampler s = MakeOrDie(Spec(10, 10, SamplerMode::kCyclic));
  EXPECT_EQ(s.cycle_steps(), 1u);
  std::vector<uint64_t> a = s.Next(), b = s.Next();
  std::vector<uint64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (uint64_t i = 0; i < 10; ++i) EXPECT_EQ(sorted[i], i);
  EXPECT_NE(a, b);  // a fresh permutation per cycle
}

TEST(CyclicTest, OmittedRemainderDiffersBetweenCycles) {
  // n = 10, G = 3: three steps per cycle, one index left out per cycle.
  Sampler s = MakeOrDie(Spec(10, 3, SamplerMode::kCyclic, 4));
  std::set<uint64_t> omitted;
  for (uint64_t cycle = 0; cycle < 40; ++cycle) {
    std::vector<uint8_t> seen(10, 0);
    for (uint64_t k = 0; k < 3; ++k) {
      for (uint64_t v : Draw(s, cycle * 3 + k)) seen[v] = 1;
    }
    for (uint64_t i = 0; i < 10; ++i) {
      if (!seen[i]) omitted.insert(i);
    }
  }
  EXPECT_GE(omitted.size(), 8u);
}

TEST(CyclicTest, TrillionRecordsWorkInConstantMemory) {
  const uint64_t n = 1'000'000'000'000ull;
  Sampler s = MakeOrDie(Spec(n, 4096, SamplerMode::kCyclic, 3));
  EXPECT_EQ(s.cycle_steps(), n / 4096);
  std::set<uint64_t> seen;
  for (uint64_t step : std::vector<uint64_t>{0, 1, 2, n / 4096 - 1, n / 4096, 123456789}) {
    for (uint64_t v : Draw(s, step)) {
      ASSERT_LT(v, n);
      seen.insert(v);
    }
  }
  // Steps 0..2 and the last step of cycle 0 are disjoint (same permutation).
  EXPECT_GT(seen.size(), 4u * 4096 - 4);
}

TEST(CyclicTest, HugeNearMaxNStaysInRange) {
  const uint64_t n = ~uint64_t{0} - 12;
  Sampler s = MakeOrDie(Spec(n, 256, SamplerMode::kCyclic, 3));
  for (uint64_t v : Draw(s, 987654321)) ASSERT_LT(v, n);
}

TEST(CyclicTest, PositionOfEachIndexIsUniformAcrossSeeds) {
  // For n = 8 and 4000 seeds, index i lands at position p about 500 times
  // for every (i, p).
  const uint64_t n = 8;
  const int seeds = 4000;
  std::vector<std::vector<uint64_t>> at(n, std::vector<uint64_t>(n, 0));
  for (int seed = 0; seed < seeds; ++seed) {
    Sampler s = MakeOrDie(Spec(n, n, SamplerMode::kCyclic, seed));
    std::vector<uint64_t> perm = Draw(s, 0);
    for (uint64_t p = 0; p < n; ++p) ++at[perm[p]][p];
  }
  for (uint64_t i = 0; i < n; ++i) {
    EXPECT_LT(ChiSquareUniform(at[i]), ChiSquareBound(n)) << "index " << i;
  }
}

TEST(CyclicTest, SmallNPermutationsAreAllReachedEvenly) {
  // n = 3: six permutations, each about 1/6 of the seeds.
  std::vector<uint64_t> counts(9 * 3, 0);
  std::set<uint64_t> kinds;
  std::vector<uint64_t> by_kind(6, 0);
  const std::vector<std::vector<uint64_t>> perms = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                                    {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  for (int seed = 0; seed < 6000; ++seed) {
    Sampler s = MakeOrDie(Spec(3, 3, SamplerMode::kCyclic, seed));
    std::vector<uint64_t> perm = Draw(s, 0);
    auto it = std::find(perms.begin(), perms.end(), perm);
    ASSERT_NE(it, perms.end());
    ++by_kind[it - perms.begin()];
  }
  EXPECT_LT(ChiSquareUniform(by_kind), ChiSquareBound(6));
}

TEST(CyclicTest, NeighboursAreUncorrelated) {
  const uint64_t n = 100'000;
  Sampler s = MakeOrDie(Spec(n, n, SamplerMode::kCyclic, 8));
  std::vector<uint64_t> perm = Draw(s, 0);
  std::vector<double> a, b, pos, val;
  for (uint64_t i = 0; i + 1 < n; ++i) {
    a.push_back(static_cast<double>(perm[i]));
    b.push_back(static_cast<double>(perm[i + 1]));
  }
  for (uint64_t i = 0; i < n; ++i) {
    pos.push_back(static_cast<double>(i));
    val.push_back(static_cast<double>(perm[i]));
  }
  // sd of r is ~0.003 at this size.
  EXPECT_LT(std::abs(Pearson(a, b)), 0.02);
  EXPECT_LT(std::abs(Pearson(pos, val)), 0.02);
  // Consecutive outputs differ by a uniform-looking gap, not a stride:
  // the number of ascents of a random permutation is ~ (n - 1) / 2.
  uint64_t ascents = 0;
  for (uint64_t i = 0; i + 1 < n; ++i) ascents += perm[i + 1] > perm[i];
  EXPECT_NEAR(static_cast<double>(ascents) / (n - 1), 0.5, 0.01);
}

TEST(CyclicTest, SeedsAndCyclesGiveUnrelatedOrders) {
  const uint64_t n = 50'000;
  Sampler a = MakeOrDie(Spec(n, n, SamplerMode::kCyclic, 1));
  Sampler b = MakeOrDie(Spec(n, n, SamplerMode::kCyclic, 2));
  std::vector<uint64_t> a0 = Draw(a, 0), a1 = Draw(a, 1), b0 = Draw(b, 0);
  for (const auto& [x, y] : {std::pair{&a0, &a1}, std::pair{&a0, &b0}}) {
    std::vector<double> u(x->begin(), x->end()), v(y->begin(), y->end());
    EXPECT_LT(std::abs(Pearson(u, v)), 0.03);
    // Agreement at a position: a random pair of permutations has ~1.
    uint64_t same = 0;
    for (uint64_t i = 0; i < n; ++i) same += (*x)[i] == (*y)[i];
    EXPECT_LT(same, 10u);
  }
}

}  // namespace
}  // namespace loaderx
