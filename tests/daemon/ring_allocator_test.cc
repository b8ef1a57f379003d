#include "ring_allocator.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <future>

#include "loaderx/memfd.h"

namespace loaderx::daemon {
namespace {

TEST(RingAllocatorTest, RingFdIsSealedAndHeaderValidates) {
  auto ring = RingAllocator::Create(3, 4096, 11, 22);
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  const RingGeometry& g = (*ring)->geometry();
  EXPECT_TRUE(CheckSealedMemfd((*ring)->fd(), kRingSeals, g.total_bytes).ok());
  auto ro = MappedRegion::Map((*ring)->fd(), g.total_bytes);
  ASSERT_TRUE(ro.ok());
  auto v = ValidateRing(ro->data(), g.total_bytes);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->slot_count, 3u);
  // Nobody else can map it writable.
  EXPECT_EQ(::mmap(nullptr, g.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, (*ring)->fd(), 0),
            MAP_FAILED);
}

// Bytes of the ring memfd backed by memory (shmem pages allocated).
uint64_t ResidentBytes(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

// The pages a ring keeps are the high-water of its live batches, not every
// slot it ever used: a freed region is reused lowest first (first fit), so
// a 12-slot ring that never has more than 2 batches live touches 2 batches'
// worth however many steps it serves. Pages are not released once touched
// (the FUTURE_WRITE seal forbids punching holes; docs/daemon.md "Memory"),
// so a burst to 4 live batches stays resident at 4.
TEST(RingAllocatorTest, ResidentPagesAreTheLiveHighWaterNotEverySlot) {
  constexpr uint64_t kBatch = uint64_t{1} << 20;
  auto ring = RingAllocator::Create(12, 12 * kBatch, 1, 1).value();
  const uint64_t base = ResidentBytes(ring->fd());  // the header
  EXPECT_LT(base, kBatch);
  std::deque<std::shared_ptr<BatchMemory>> live;
  auto step = [&](uint64_t s, size_t keep) {  // at most `keep` live, this one included
    while (live.size() >= keep) live.pop_front();
    auto mem = ring->Allocate(s, kBatch);
    ASSERT_TRUE(mem.ok()) << mem.status().ToString();
    std::memset((*mem)->data(), static_cast<int>(s), kBatch);  // the gather writes every page
    live.push_back(std::move(mem).value());
  };
  for (uint64_t s = 0; s < 40; ++s) step(s, 2);
  EXPECT_LE(ResidentBytes(ring->fd()), base + 2 * kBatch + 8192);
  EXPECT_GE(ResidentBytes(ring->fd()), base + 2 * kBatch - 4096);
  for (uint64_t s = 40; s < 44; ++s) step(s, 4);  // a burst: 4 live
  for (uint64_t s = 44; s < 80; ++s) step(s, 1);
  EXPECT_LE(ResidentBytes(ring->fd()), base + 4 * kBatch + 8192);
  EXPECT_GE(ResidentBytes(ring->fd()), base + 4 * kBatch - 4096);
}

TEST(RingAllocatorTest, AllocationWritesLandInTheClientsReadOnlyView) {
  auto ring = RingAllocator::Create(2, 4096, 1, 1).value();
  auto ro = MappedRegion::Map(ring->fd(), ring->geometry().total_bytes).value();
  auto mem = ring->Allocate(0, 100).value();
  auto* rm = static_cast<RingMemory*>(mem.get());
  mem->data()[5] = 0x5a;
  EXPECT_EQ(ro.data()[rm->ring_offset() + 5], 0x5a);
  uint64_t seq = ring->Publish(*rm, 7, 100);
  EXPECT_TRUE(
      CheckSlot(ro.data(), ring->geometry(), rm->slot(), seq, 7, rm->ring_offset(), 100).ok());
  auto mem2 = ring->Allocate(1, 100).value();
  uint64_t seq2 = ring->Publish(*static_cast<RingMemory*>(mem2.get()), 8, 100);
  EXPECT_GT(seq2, seq);  // epochs are never reused
}

TEST(RingAllocatorTest, FullRingBlocksUntilABatchIsFreed) {
  auto ring = RingAllocator::Create(2, 4096, 1, 1).value();
  auto a = ring->Allocate(0, 4096).value();
  auto pending = std::async(std::launch::async, [&] { return ring->Allocate(1, 4096); });
  EXPECT_EQ(pending.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  EXPECT_EQ(ring->slots_in_use(), 1u);
  a.reset();
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  auto b = pending.get();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(ring->bytes_in_use(), 4096u);
}

TEST(RingAllocatorTest, SlotsRunOutBeforePayload) {
  auto ring = RingAllocator::Create(1, 8192, 1, 1).value();
  auto a = ring->Allocate(0, 64).value();
  auto pending = std::async(std::launch::async, [&] { return ring->Allocate(1, 64); });
  EXPECT_EQ(pending.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  ring->Cancel();
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(pending.get().status().code(), Status::Code::kCancelled);
}

TEST(RingAllocatorTest, CancelUnblocksAWaiterAndLaterCallsAreCancelled) {
  auto ring = RingAllocator::Create(2, 4096, 1, 1).value();
  auto a = ring->Allocate(0, 4096).value();
  auto pending = std::async(std::launch::async, [&] { return ring->Allocate(1, 4096); });
  ring->Cancel();
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(pending.get().status().code(), Status::Code::kCancelled);
  a.reset();
  EXPECT_EQ(ring->Allocate(2, 64).status().code(), Status::Code::kCancelled);
  EXPECT_EQ(ring->bytes_in_use(), 0u);
}

TEST(RingAllocatorTest, RingFullOfClientHeldBatchesIsResourceExhaustedNotAHang) {
  auto ring = RingAllocator::Create(4, 8192, 1, 1).value();
  auto a = ring->Allocate(0, 4096).value();
  auto b = ring->Allocate(1, 4096).value();
  ring->Publish(*static_cast<RingMemory*>(a.get()), 0, 4096);
  // b is still in the pipeline: waiting is right, b may yet be freed.
  auto pending = std::async(std::launch::async, [&] { return ring->Allocate(2, 4096); });
  EXPECT_EQ(pending.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  // Once b is published too, only the client can make room: the waiter is
  // woken and refuses instead of hanging.
  ring->Publish(*static_cast<RingMemory*>(b.get()), 1, 4096);
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  Status st = pending.get().status();
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(st.message().find("full of the 2 batches the client holds"), std::string::npos)
      << st.message();
  // The client lets one go: room again.
  a.reset();
  EXPECT_TRUE(ring->Allocate(4, 4096).ok());
}

TEST(RingAllocatorTest, RingFullOfGroupRetainedBatchesWaitsInsteadOfRefusing) {
  auto ring = RingAllocator::Create(4, 8192, 1, 1).value();
  auto a = ring->Allocate(0, 4096).value();
  auto b = ring->Allocate(1, 4096).value();
  // Both published but still retained by a group for a slower member: the
  // daemon side will free room, so a producer must wait, not fail the step.
  ring->Publish(*static_cast<RingMemory*>(a.get()), 0, 4096, /*retained=*/true);
  ring->Publish(*static_cast<RingMemory*>(b.get()), 1, 4096, /*retained=*/true);
  auto pending = std::async(std::launch::async, [&] { return ring->Allocate(2, 4096); });
  EXPECT_EQ(pending.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  // The group drops `a` while a client still leases it: still one retained.
  ring->EndRetain(static_cast<RingMemory*>(a.get())->slot());
  EXPECT_EQ(pending.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  // The group drops `b` too: now only clients hold the ring -> refused.
  ring->EndRetain(static_cast<RingMemory*>(b.get())->slot());
  ASSERT_EQ(pending.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  Status st = pending.get().status();
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find("full of the 2 batches"), std::string::npos) << st.message();
  ring->EndRetain(0);  // not retained any more: a no-op, counts unchanged
  b.reset();
  EXPECT_TRUE(ring->Allocate(3, 4096).ok());
}

TEST(RingAllocatorTest, BatchLargerThanThePayloadIsResourceExhaustedNotAHang) {
  auto ring = RingAllocator::Create(2, 4096, 1, 1).value();
  Status st = ring->Allocate(3, 4097).status();
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(st.message().find("ring_bytes"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace loaderx::daemon
