// NoteOutbox (client/src/note_outbox.h) on a real SEQPACKET socket pair:
// notes go at once while the socket has room, queue in order while it is
// full, the deferred take goes first with the next note, and a hung-up peer
// drops notes instead of queueing them.
#include "note_outbox.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <variant>
#include <vector>

#include "loaderx/fd.h"
#include "loaderx/unix_socket.h"
#include "loaderx/wire.h"

namespace loaderx::client {
namespace {

class NoteOutboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    client_ = UniqueFd(sv[0]);
    daemon_ = UniqueFd(sv[1]);
    const int small = 4096;  // a few frames fill it
    ASSERT_EQ(::setsockopt(client_.get(), SOL_SOCKET, SO_SNDBUF, &small, sizeof small), 0);
    ASSERT_EQ(::setsockopt(daemon_.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
  }

  // What the daemon side has received, decoded, without waiting.
  std::vector<Message> Received() {
    std::vector<Message> out;
    while (true) {
      Result<Frame> f =
          RecvFrame(daemon_.get(), kMaxFrameBytes, kMaxFrameFds, /*nonblocking=*/true);
      EXPECT_TRUE(f.ok()) << f.status().ToString();
      if (!f.ok() || f->would_block || f->eof) return out;
      Result<Message> m = DecodeMessage(f->bytes);
      EXPECT_TRUE(m.ok()) << m.status().ToString();
      if (m.ok()) out.push_back(*m);
    }
  }

  // Fills the socket with heartbeats until a nonblocking send finds it full;
  // returns how many went.
  int Fill() {
    int sent = 0;
    while (SendFrame(client_.get(), EncodeMessage(HeartbeatMsg{}), {}, /*nonblocking=*/true).ok()) {
      ++sent;
    }
    return sent;
  }

  // Reads (and drops) `n` frames on the daemon side.
  void Drain(int n) {
    for (int i = 0; i < n; ++i) ASSERT_TRUE(RecvFrame(daemon_.get()).ok());
  }

  UniqueFd client_, daemon_;
};

TEST_F(NoteOutboxTest, SendsAtOnceWhileTheSocketHasRoom) {
  NoteOutbox out(client_.get());
  out.Send(ReleaseMsg{3, 7});
  out.Send(ConsumedMsg{1, 8});
  EXPECT_FALSE(out.queued());
  EXPECT_EQ(Received(), (std::vector<Message>{ReleaseMsg{3, 7}, ConsumedMsg{1, 8}}));
}

TEST_F(NoteOutboxTest, QueuesInOrderWhileFullAndSendsOnceThereIsRoom) {
  NoteOutbox out(client_.get());
  const int filler = Fill();
  ASSERT_GT(filler, 0);
  out.Send(ReleaseMsg{1, 1});
  out.Send(ConsumedMsg{0, 2});
  out.Send(ReleaseMsg{2, 2});
  EXPECT_TRUE(out.queued());
  EXPECT_FALSE(out.TrySendQueued());  // still full
  EXPECT_TRUE(out.queued());
  Drain(filler);
  EXPECT_TRUE(out.TrySendQueued());
  EXPECT_FALSE(out.queued());
  EXPECT_EQ(Received(),
            (std::vector<Message>{ReleaseMsg{1, 1}, ConsumedMsg{0, 2}, ReleaseMsg{2, 2}}));
}

TEST_F(NoteOutboxTest, TheDeferredTakeGoesFirstWithTheNextNote) {
  NoteOutbox out(client_.get());
  out.Defer(ConsumedMsg{4, 5});
  EXPECT_FALSE(out.queued());
  EXPECT_TRUE(Received().empty());  // kept until the next frame
  out.Send(ReleaseMsg{2, 9});
  EXPECT_EQ(Received(), (std::vector<Message>{ConsumedMsg{4, 5}, ReleaseMsg{2, 9}}));
  out.Send(ReleaseMsg{3, 10});  // nothing deferred any more
  EXPECT_EQ(Received(), (std::vector<Message>{ReleaseMsg{3, 10}}));
}

TEST_F(NoteOutboxTest, ANewerDeferredTakeSupersedesTheOlder) {
  NoteOutbox out(client_.get());
  out.Defer(ConsumedMsg{4, 5});
  out.Defer(ConsumedMsg{4, 6});
  out.SendAllThen(CloseMsg{});
  EXPECT_EQ(Received(), (std::vector<Message>{ConsumedMsg{4, 6}, CloseMsg{}}));
}

TEST_F(NoteOutboxTest, DropIfDeferredDropsOnlyThatPositionAndQueuesAnyOther) {
  NoteOutbox out(client_.get());
  out.Defer(ConsumedMsg{1, 5});
  EXPECT_TRUE(out.DropIfDeferred(1, 5));  // a miss: the wait's own note reports it
  EXPECT_FALSE(out.queued());
  out.Send(ReleaseMsg{0, 1});
  EXPECT_EQ(Received(), (std::vector<Message>{ReleaseMsg{0, 1}}));

  out.Defer(ConsumedMsg{1, 5});
  EXPECT_FALSE(out.DropIfDeferred(1, 6));  // another position: it must still go
  EXPECT_FALSE(out.DropIfDeferred(2, 5));
  EXPECT_TRUE(out.queued());
  EXPECT_TRUE(out.TrySendQueued());
  EXPECT_EQ(Received(), (std::vector<Message>{ConsumedMsg{1, 5}}));
}

TEST_F(NoteOutboxTest, BehindAFullSocketATakeIsQueuedInOrderAndTakeAllHandsEverythingOver) {
  NoteOutbox out(client_.get());
  const int filler = Fill();
  out.Send(ReleaseMsg{1, 1});
  out.Defer(ConsumedMsg{0, 3});  // behind a queued note: queued, not deferred
  out.Send(ReleaseMsg{2, 2});
  const std::deque<Message> all = out.TakeAll();
  EXPECT_EQ(std::vector<Message>(all.begin(), all.end()),
            (std::vector<Message>{ReleaseMsg{1, 1}, ConsumedMsg{0, 3}, ReleaseMsg{2, 2}}));
  EXPECT_FALSE(out.queued());
  Drain(filler);
  EXPECT_TRUE(Received().empty());  // handed over, not sent

  out.Defer(ConsumedMsg{0, 4});  // an empty queue: TakeAll gives the deferred take
  const std::deque<Message> just = out.TakeAll();
  EXPECT_EQ(std::vector<Message>(just.begin(), just.end()),
            (std::vector<Message>{ConsumedMsg{0, 4}}));
}

TEST_F(NoteOutboxTest, SendAllThenStopsAtAFullSocketWithoutSendingTheLast) {
  NoteOutbox out(client_.get());
  const int filler = Fill();
  out.Send(ReleaseMsg{1, 1});
  out.SendAllThen(CloseMsg{});  // the release cannot go, so neither may `close`
  Drain(filler);
  EXPECT_TRUE(Received().empty());
}

TEST_F(NoteOutboxTest, AHungUpPeerDropsNotesInsteadOfQueueingThem) {
  NoteOutbox out(client_.get());
  out.Defer(ConsumedMsg{0, 1});
  daemon_.Reset();
  out.Send(ReleaseMsg{1, 1});
  out.Send(ReleaseMsg{2, 2});
  EXPECT_FALSE(out.queued());
  EXPECT_TRUE(out.TakeAll().empty());
}

}  // namespace
}  // namespace loaderx::client
