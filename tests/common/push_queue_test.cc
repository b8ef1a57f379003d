// The push queue (loaderx/push_queue.h): frames written by the daemon's
// side come out of the client's side whole and in order, across the wrap of
// the data area; a full queue refuses a write; each side refuses what the
// other could have forged (a head past the tail, a malformed entry, a
// header that is not a queue's).
#include "loaderx/push_queue.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "loaderx/memfd.h"

namespace loaderx::testing {
namespace {

constexpr uint64_t kTailAt = 64;
constexpr uint64_t kHeadAt = 128;

std::vector<uint8_t> FrameOf(size_t n, uint8_t seed) {
  std::vector<uint8_t> f(n);
  std::iota(f.begin(), f.end(), seed);
  return f;
}

struct Pair {
  PushQueueWriter writer;
  PushQueueReader reader;
  MappedRegion raw;  // a third mapping: what a forger would write
};

Pair Make(uint64_t data_bytes) {
  Pair p;
  p.writer = PushQueueWriter::Create(data_bytes).value();
  p.raw = MappedRegion::Map(p.writer.fd(), p.writer.total_bytes(), 0, true).value();
  p.reader =
      PushQueueReader::Attach(UniqueFd(::dup(p.writer.fd())), p.writer.total_bytes()).value();
  return p;
}

TEST(PushQueueTest, FramesComeOutWholeAndInOrderAcrossTheWrap) {
  Pair q = Make(4096);
  std::vector<uint8_t> got;
  // 300 frames of 1..997 bytes through 4 KiB: the data area wraps many
  // times, with entries split at every possible offset.
  for (int i = 0; i < 300; ++i) {
    const std::vector<uint8_t> want = FrameOf(1 + (i * 331) % 997, static_cast<uint8_t>(i));
    ASSERT_TRUE(q.writer.Write(want).value()) << i;
    EXPECT_EQ(q.writer.Unread().value(), 8 + (want.size() + 7) / 8 * 8);
    ASSERT_TRUE(q.reader.Peek(&got).value()) << i;
    EXPECT_EQ(got, want) << i;
    ASSERT_TRUE(q.reader.Peek(&got).value());  // a peek does not consume
    q.reader.Pop();
    EXPECT_FALSE(q.reader.Peek(&got).value());
    EXPECT_EQ(q.writer.Unread().value(), 0u);
  }
}

TEST(PushQueueTest, AFullQueueRefusesTheWriteUntilTheReaderFreesRoom) {
  Pair q = Make(4096);
  const std::vector<uint8_t> f = FrameOf(1000, 7);  // 1008 bytes an entry
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(q.writer.Write(f).value()) << i;
  EXPECT_FALSE(q.writer.Write(f).value());              // 4 * 1008 + 1008 > 4096
  EXPECT_TRUE(q.writer.Write(FrameOf(56, 1)).value());  // 64 bytes still fit
  std::vector<uint8_t> got;
  ASSERT_TRUE(q.reader.Peek(&got).value());
  q.reader.Pop();
  EXPECT_TRUE(q.writer.Write(f).value());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(q.reader.Peek(&got).value());
    EXPECT_EQ(got, f);
    q.reader.Pop();
  }
  ASSERT_TRUE(q.reader.Peek(&got).value());
  EXPECT_EQ(got, FrameOf(56, 1));
  q.reader.Pop();
  ASSERT_TRUE(q.reader.Peek(&got).value());
  EXPECT_EQ(got, f);
  EXPECT_EQ(q.writer.Write(FrameOf(4096, 0)).status().code(), Status::Code::kInternal);
}

TEST(PushQueueTest, AHeadTheClientForgesIsAProtocolError) {
  for (uint64_t forged : {uint64_t{1} << 20, uint64_t{8}}) {
    Pair q = Make(4096);
    ASSERT_TRUE(q.writer.Write(FrameOf(100, 0)).value());  // tail 112
    ASSERT_TRUE(q.writer.Write(FrameOf(100, 0)).value());  // tail 224
    std::vector<uint8_t> got;
    ASSERT_TRUE(q.reader.Peek(&got).value());
    q.reader.Pop();  // head 112
    EXPECT_EQ(q.writer.Unread().value(), 112u);
    // Past the tail, or behind the head the writer already saw.
    std::memcpy(q.raw.mutable_data() + kHeadAt, &forged, 8);
    Result<uint64_t> unread = q.writer.Unread();
    ASSERT_FALSE(unread.ok()) << forged;
    EXPECT_EQ(unread.status().code(), Status::Code::kProtocol);
    EXPECT_NE(unread.status().message().find("head is at " + std::to_string(forged)),
              std::string::npos)
        << unread.status().message();
    EXPECT_EQ(q.writer.Write(FrameOf(8, 0)).status().code(), Status::Code::kProtocol);
  }
}

TEST(PushQueueTest, AMalformedEntryOrTailIsAProtocolErrorForTheReader) {
  std::vector<uint8_t> got;
  {
    Pair q = Make(4096);  // a tail past a whole data area
    const uint64_t tail = 8192;
    std::memcpy(q.raw.mutable_data() + kTailAt, &tail, 8);
    EXPECT_EQ(q.reader.Peek(&got).status().code(), Status::Code::kProtocol);
  }
  {
    Pair q = Make(4096);  // an entry longer than what the tail covers
    ASSERT_TRUE(q.writer.Write(FrameOf(16, 0)).value());
    const uint32_t len = 100;
    std::memcpy(q.raw.mutable_data() + 4096, &len, 4);
    Result<bool> r = q.reader.Peek(&got);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Status::Code::kProtocol);
    EXPECT_NE(r.status().message().find("an entry of 100 bytes"), std::string::npos)
        << r.status().message();
  }
  {
    Pair q = Make(4096);  // a pad word that is not 0
    ASSERT_TRUE(q.writer.Write(FrameOf(16, 0)).value());
    const uint32_t pad = 1;
    std::memcpy(q.raw.mutable_data() + 4096 + 4, &pad, 4);
    EXPECT_EQ(q.reader.Peek(&got).status().code(), Status::Code::kProtocol);
  }
}

TEST(PushQueueTest, AttachRefusesWhatIsNotASealedQueue) {
  // Not sealed against resizing.
  UniqueFd plain = CreateMemfd("not-a-queue", 8192).value();
  EXPECT_EQ(PushQueueReader::Attach(std::move(plain), 8192).status().code(),
            Status::Code::kInvalidArgument);
  // Sealed, the right size, but no queue header.
  UniqueFd blank = CreateMemfd("blank", 8192).value();
  ASSERT_TRUE(SealMemfd(blank.get(), kPushQueueSeals).ok());
  Result<PushQueueReader> r = PushQueueReader::Attach(std::move(blank), 8192);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kProtocol);
  EXPECT_NE(r.status().message().find("push queue header"), std::string::npos)
      << r.status().message();
  // A real queue, announced with the wrong size.
  PushQueueWriter w = PushQueueWriter::Create(4096).value();
  EXPECT_EQ(PushQueueReader::Attach(UniqueFd(::dup(w.fd())), 4096 * 3).status().code(),
            Status::Code::kInvalidArgument);
  // Data areas that are not a power of two in range are not made.
  EXPECT_EQ(PushQueueWriter::Create(6000).status().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(PushQueueWriter::Create(2048).status().code(), Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace loaderx::testing
