#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "loaderx/memfd.h"
#include "loaderx/unix_socket.h"

namespace loaderx {
namespace {

std::string TempSocketPath(const std::string& name) {
  std::string dir = ::testing::TempDir() + "lxsock_XXXXXX";
  char* made = ::mkdtemp(dir.data());
  EXPECT_NE(made, nullptr);
  return dir + "/" + name;
}

std::pair<UniqueFd, UniqueFd> SocketPair() {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
  return {UniqueFd(sv[0]), UniqueFd(sv[1])};
}

TEST(MemfdTest, SealedMemfdRefusesResizeAndNewWritableMappings) {
  auto fd = CreateMemfd("test-ring", 8192);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  auto rw = MappedRegion::Map(fd->get(), 8192, 0, /*writable=*/true);
  ASSERT_TRUE(rw.ok());
  ASSERT_TRUE(SealMemfd(fd->get(), kRingSeals).ok());

  // The daemon's existing writable mapping keeps working.
  rw->mutable_data()[100] = 42;
  EXPECT_EQ(::ftruncate(fd->get(), 4096), -1);
  EXPECT_EQ(::ftruncate(fd->get(), 16384), -1);
  void* p = ::mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd->get(), 0);
  EXPECT_EQ(p, MAP_FAILED);
  auto ro = MappedRegion::Map(fd->get(), 8192);
  ASSERT_TRUE(ro.ok());
  EXPECT_EQ(ro->data()[100], 42);
  EXPECT_TRUE(CheckSealedMemfd(fd->get(), kRingSeals, 8192).ok());
}

TEST(MemfdTest, CheckRejectsUnsealedWrongSizeAndNonMemfd) {
  auto fd = CreateMemfd("unsealed", 4096);
  ASSERT_TRUE(fd.ok());
  EXPECT_EQ(CheckSealedMemfd(fd->get(), kRingSeals, 4096).code(), Status::Code::kInvalidArgument);
  ASSERT_TRUE(SealMemfd(fd->get(), kRingSeals).ok());
  EXPECT_EQ(CheckSealedMemfd(fd->get(), kRingSeals, 8192).code(), Status::Code::kInvalidArgument);
  auto [a, b] = SocketPair();
  EXPECT_EQ(CheckSealedMemfd(a.get(), kRingSeals, 0).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(CreateMemfd("zero", 0).status().code(), Status::Code::kInvalidArgument);
}

TEST(UnixSocketTest, FrameWithFdsArrivesWholeAndFdsAreUsable) {
  auto [a, b] = SocketPair();
  auto mem = CreateMemfd("passed", 4096);
  ASSERT_TRUE(mem.ok());
  ASSERT_EQ(::pwrite(mem->get(), "hello", 5, 0), 5);
  const uint8_t payload[] = {1, 2, 3};
  int fds[] = {mem->get()};
  ASSERT_TRUE(SendFrame(a.get(), payload, fds).ok());

  auto f = RecvFrame(b.get());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_FALSE(f->eof);
  EXPECT_EQ(f->bytes, std::vector<uint8_t>({1, 2, 3}));
  ASSERT_EQ(f->fds.size(), 1u);
  char buf[5];
  ASSERT_EQ(::pread(f->fds[0].get(), buf, 5, 0), 5);
  EXPECT_EQ(std::string(buf, 5), "hello");
  EXPECT_TRUE(::fcntl(f->fds[0].get(), F_GETFD) & FD_CLOEXEC);
}

TEST(UnixSocketTest, OversizedFrameIsProtocolError) {
  auto [a, b] = SocketPair();
  std::vector<uint8_t> big(1000, 7);
  ASSERT_TRUE(SendFrame(a.get(), big).ok());
  auto f = RecvFrame(b.get(), /*max_bytes=*/100);
  EXPECT_EQ(f.status().code(), Status::Code::kProtocol);
}

TEST(UnixSocketTest, TooManyFdsIsProtocolErrorAndClosesThem) {
  auto [a, b] = SocketPair();
  auto m1 = CreateMemfd("x", 4096);
  auto m2 = CreateMemfd("y", 4096);
  const uint8_t byte = 1;
  int fds[] = {m1->get(), m2->get()};
  ASSERT_TRUE(SendFrame(a.get(), std::span(&byte, 1), fds).ok());
  auto f = RecvFrame(b.get(), kMaxFrameBytes, /*max_fds=*/1);
  EXPECT_EQ(f.status().code(), Status::Code::kProtocol);
}

TEST(UnixSocketTest, HangUpIsEofAndNonblockingEmptyIsWouldBlock) {
  auto [a, b] = SocketPair();
  auto wb = RecvFrame(b.get(), kMaxFrameBytes, kMaxFrameFds, /*nonblocking=*/true);
  ASSERT_TRUE(wb.ok());
  EXPECT_TRUE(wb->would_block);
  auto ready = WaitReadable(b.get(), 0);
  ASSERT_TRUE(ready.ok());
  EXPECT_FALSE(*ready);
  a.Reset();
  ready = WaitReadable(b.get(), 1000);
  ASSERT_TRUE(ready.ok());
  EXPECT_TRUE(*ready);
  auto eof = RecvFrame(b.get());
  ASSERT_TRUE(eof.ok());
  EXPECT_TRUE(eof->eof);
  const uint8_t byte = 1;
  EXPECT_EQ(SendFrame(b.get(), std::span(&byte, 1)).code(), Status::Code::kDaemon);
}

TEST(UnixSocketTest, PeerClosingWithUnreadFramesStillDeliversItsLastFrames) {
  // a sends its last frame, leaves b's frame unread and closes: AF_UNIX
  // reports ECONNRESET to b once, ahead of a's frame. b must still get the
  // frame (a client's last release before it closes), then the hang-up.
  auto [a, b] = SocketPair();
  const uint8_t last[] = {7, 8, 9};
  const uint8_t unread = 1;
  ASSERT_TRUE(SendFrame(a.get(), std::span(last)).ok());
  ASSERT_TRUE(SendFrame(b.get(), std::span(&unread, 1)).ok());
  a.Reset();
  for (bool nonblocking : {false, true}) {
    SCOPED_TRACE(nonblocking ? "nonblocking" : "blocking");
    if (nonblocking) {
      auto [c, d] = SocketPair();
      ASSERT_TRUE(SendFrame(c.get(), std::span(last)).ok());
      ASSERT_TRUE(SendFrame(d.get(), std::span(&unread, 1)).ok());
      c.Reset();
      b = std::move(d);
    }
    auto f = RecvFrame(b.get(), kMaxFrameBytes, kMaxFrameFds, nonblocking);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_FALSE(f->eof);
    EXPECT_FALSE(f->would_block);
    EXPECT_EQ(f->bytes, std::vector<uint8_t>(std::begin(last), std::end(last)));
    auto eof = RecvFrame(b.get(), kMaxFrameBytes, kMaxFrameFds, nonblocking);
    ASSERT_TRUE(eof.ok()) << eof.status().ToString();
    EXPECT_TRUE(eof->eof);
    EXPECT_TRUE(eof->bytes.empty());
  }
}

// SendFrames: one sendmmsg, frames arrive whole and in order; a queue that
// fills part-way ends the count (the rest is the caller's to queue), a queue
// full before the first is ResourceExhausted, a closed peer a Daemon error.
TEST(UnixSocketTest, SendFramesSendsInOrderAndCountsWhatWentWhenTheQueueFills) {
  auto [a, b] = SocketPair();
  const std::vector<uint8_t> one{1, 2, 3}, two{4, 5};
  const std::array<std::span<const uint8_t>, 2> frames{one, two};
  auto sent = SendFrames(a.get(), frames, /*nonblocking=*/true);
  ASSERT_TRUE(sent.ok()) << sent.status().ToString();
  EXPECT_EQ(*sent, 2u);
  auto f1 = RecvFrame(b.get());
  auto f2 = RecvFrame(b.get());
  ASSERT_TRUE(f1.ok() && f2.ok());
  EXPECT_EQ(f1->bytes, one);
  EXPECT_EQ(f2->bytes, two);

  // Fill a's send queue with frames nobody reads, until one more fails.
  const std::vector<uint8_t> filler(4096, 7);
  int queued = 0;
  while (SendFrame(a.get(), filler, {}, /*nonblocking=*/true).ok()) ++queued;
  ASSERT_GT(queued, 0);
  auto none = SendFrames(a.get(), frames, /*nonblocking=*/true);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Status::Code::kResourceExhausted);
  // Room for some frames but not for eight more of the filler's size: the
  // count says how many went, and exactly those arrive, in order.
  ASSERT_TRUE(RecvFrame(b.get()).ok());  // frees one filler's worth
  std::vector<std::vector<uint8_t>> tagged;
  for (uint8_t k = 0; k < 8; ++k) tagged.push_back(std::vector<uint8_t>(4096, k));
  std::vector<std::span<const uint8_t>> spans(tagged.begin(), tagged.end());
  auto part = SendFrames(a.get(), spans, /*nonblocking=*/true);
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  ASSERT_GE(*part, 1u);
  ASSERT_LT(*part, 8u);
  for (int i = 1; i < queued; ++i) ASSERT_TRUE(RecvFrame(b.get()).ok());  // the fillers
  for (size_t k = 0; k < *part; ++k) {
    auto got = RecvFrame(b.get(), kMaxFrameBytes, kMaxFrameFds, /*nonblocking=*/true);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(got->bytes, tagged[k]) << "frame " << k;
  }
  auto after = RecvFrame(b.get(), kMaxFrameBytes, kMaxFrameFds, /*nonblocking=*/true);
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->would_block);  // nothing beyond the count went

  b.Reset();
  auto gone = SendFrames(a.get(), frames, /*nonblocking=*/true);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), Status::Code::kDaemon);
}

TEST(UnixSocketTest, ListenConnectAndPeerCredName) {
  std::string path = TempSocketPath("d.sock");
  auto l = ListenSeqpacket(path, 0660);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::all,
            std::filesystem::perms(0660));
  auto c = ConnectSeqpacket(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  UniqueFd s(::accept4(l->get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(s.valid());
  auto cred = GetPeerCred(s.get());
  ASSERT_TRUE(cred.ok());
  EXPECT_EQ(cred->uid, ::getuid());
  EXPECT_EQ(cred->pid, ::getpid());
  // A second daemon on a live socket is refused.
  EXPECT_EQ(ListenSeqpacket(path, 0660).status().code(), Status::Code::kAlreadyExists);
}

TEST(UnixSocketTest, StaleSocketIsReplacedAndMissingSocketIsDaemonError) {
  std::string path = TempSocketPath("stale.sock");
  EXPECT_EQ(ConnectSeqpacket(path).status().code(), Status::Code::kDaemon);
  {
    auto l = ListenSeqpacket(path, 0600);
    ASSERT_TRUE(l.ok());
  }
  // The listener is closed; the file remains: connecting is refused...
  EXPECT_EQ(ConnectSeqpacket(path).status().code(), Status::Code::kDaemon);
  // ...and a new daemon takes the path over.
  auto l2 = ListenSeqpacket(path, 0600);
  EXPECT_TRUE(l2.ok()) << l2.status().ToString();
  EXPECT_EQ(ListenSeqpacket(std::string(200, 'x'), 0600).status().code(),
            Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace loaderx
