// LeaseLedger: what one session's client holds, given back exactly once
// however the session ends.
#include "lease_ledger.h"

#include <gtest/gtest.h>

#include <memory>

namespace loaderx::daemon {
namespace {

// Counts how many of its kind are alive, so a test sees memory freed.
class CountedMemory final : public BatchMemory {
 public:
  explicit CountedMemory(int* live) : live_(live) { ++*live_; }
  ~CountedMemory() override { --*live_; }
  uint8_t* data() override { return nullptr; }
  uint64_t size() const override { return 0; }

 private:
  int* live_;
};

TEST(LeaseLedgerTest, ReleaseFreesTheSlotsMemory) {
  int live = 0;
  LeaseLedger ledger;
  ledger.Add(0, 0, /*slot=*/3, /*seq=*/7, std::make_shared<CountedMemory>(&live));
  EXPECT_EQ(ledger.held(), 1u);
  EXPECT_TRUE(ledger.Release(3, 7));
  EXPECT_EQ(live, 0);
  EXPECT_EQ(ledger.held(), 0u);
}

TEST(LeaseLedgerTest, ReleaseOfStaleOrForgedSlotIsIgnored) {
  int live = 0;
  LeaseLedger ledger;
  ledger.Add(0, 0, 3, 7, std::make_shared<CountedMemory>(&live));
  EXPECT_FALSE(ledger.Release(3, 6));  // older epoch of the same slot
  EXPECT_FALSE(ledger.Release(4, 7));  // a slot never leased
  EXPECT_EQ(ledger.held(), 1u);
  EXPECT_EQ(live, 1);
  EXPECT_TRUE(ledger.Release(3, 7));
  EXPECT_FALSE(ledger.Release(3, 7));  // duplicated
  EXPECT_EQ(ledger.held(), 0u);
}

TEST(LeaseLedgerTest, SameSlotDeliveredTwiceIsOneLeaseCountedTwice) {
  int live = 0;
  LeaseLedger ledger;
  auto memory = std::make_shared<CountedMemory>(&live);
  ledger.Add(0, 4, 2, 9, memory);
  ledger.Add(1, 4, 2, 9, memory);  // sought back to a step the group still holds
  memory.reset();
  EXPECT_EQ(ledger.held(), 2u);
  EXPECT_TRUE(ledger.Release(2, 9));
  EXPECT_EQ(live, 1);  // one delivery still held
  EXPECT_TRUE(ledger.Release(2, 9));
  EXPECT_EQ(live, 0);
  EXPECT_FALSE(ledger.Release(2, 9));
}

TEST(LeaseLedgerTest, ANewEpochOfASlotReplacesItsLease) {
  int live = 0;
  LeaseLedger ledger;
  ledger.Add(0, 0, 1, 5, std::make_shared<CountedMemory>(&live));
  ledger.Add(0, 1, 1, 6, std::make_shared<CountedMemory>(&live));
  EXPECT_EQ(live, 1);  // the slot's old memory is gone with its old epoch
  EXPECT_FALSE(ledger.Release(1, 5));
  EXPECT_TRUE(ledger.Release(1, 6));
  EXPECT_EQ(live, 0);
}

TEST(LeaseLedgerTest, DropUnreadDropsOnlyWhatTheCallerHasNotTaken) {
  int live = 0;
  LeaseLedger ledger;
  for (uint32_t step = 0; step < 4; ++step) {
    ledger.Add(0, step, step, 10 + step, std::make_shared<CountedMemory>(&live));
  }
  ledger.Taken(0, 2);                  // steps 0 and 1 taken
  EXPECT_TRUE(ledger.Release(2, 12));  // an unread one released meanwhile
  EXPECT_EQ(ledger.DropUnread(), 1u);  // step 3 only
  EXPECT_EQ(ledger.held(), 2u);
  EXPECT_EQ(live, 2);
  EXPECT_TRUE(ledger.Release(0, 10));
  EXPECT_TRUE(ledger.Release(1, 11));
  EXPECT_EQ(live, 0);
  EXPECT_EQ(ledger.DropUnread(), 0u);
}

TEST(LeaseLedgerTest, TakenOfAnotherGenerationAndForgetUnread) {
  int live = 0;
  LeaseLedger ledger;
  ledger.Add(0, 0, 0, 1, std::make_shared<CountedMemory>(&live));
  ledger.Taken(1, 5);     // a newer generation's position: not these
  ledger.ForgetUnread();  // a seek: the client releases them unread
  EXPECT_EQ(ledger.DropUnread(), 0u);
  EXPECT_EQ(ledger.held(), 1u);
  EXPECT_TRUE(ledger.Release(0, 1));
  EXPECT_EQ(live, 0);
}

TEST(LeaseLedgerTest, DropAllGivesBackEveryDeliveryOnce) {
  int live = 0;
  LeaseLedger ledger;
  auto shared = std::make_shared<CountedMemory>(&live);
  ledger.Add(0, 0, 0, 1, shared);
  ledger.Add(1, 0, 0, 1, shared);
  shared.reset();
  ledger.Add(1, 1, 1, 2, std::make_shared<CountedMemory>(&live));
  EXPECT_EQ(ledger.DropAll(), 3u);
  EXPECT_EQ(live, 0);
  EXPECT_EQ(ledger.held(), 0u);
  EXPECT_FALSE(ledger.Release(1, 2));
  EXPECT_EQ(ledger.DropAll(), 0u);
}

}  // namespace
}  // namespace loaderx::daemon
