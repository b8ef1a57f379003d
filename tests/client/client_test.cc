// The C++ client against a scripted fake daemon: whatever the daemon says is
// checked before the client trusts it.
#include "loaderx/client.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <functional>
#include <thread>

#include "common/store_test_util.h"
#include "loaderx/memfd.h"
#include "loaderx/ring.h"
#include "loaderx/unix_socket.h"
#include "loaderx/wire.h"

namespace loaderx::testing {
namespace {

// Accepts one connection and runs `script` on it.
class FakeDaemon {
 public:
  explicit FakeDaemon(std::function<void(int fd)> script) {
    path_ = dir_.Sub("fake.sock");
    listener_ = ListenSeqpacket(path_, 0600).value();
    thread_ = std::thread([this, script] {
      UniqueFd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (conn.valid()) script(conn.get());
    });
  }
  ~FakeDaemon() {
    ::shutdown(listener_.get(), SHUT_RDWR);
    thread_.join();
  }
  const std::string& path() const { return path_; }
  const TempDir& dir() const { return dir_; }

 private:
  TempDir dir_;
  std::string path_;
  UniqueFd listener_;
  std::thread thread_;
};

Message Receive(int fd) {
  auto f = RecvFrame(fd);
  if (!f.ok() || f->eof) return CloseMsg{};
  auto m = DecodeMessage(f->bytes);
  return m.ok() ? *m : Message(CloseMsg{});
}

void Reply(int fd, const Message& m, std::span<const int> fds = {}) {
  (void)SendFrame(fd, EncodeMessage(m), fds);
}

void HelloOk(int fd, uint32_t major = kProtocolMajor) {
  Receive(fd);
  Reply(fd, HelloOkMsg{major, 0, "fake", 1, 1});
}

TEST(ClientTest, NoSocketIsDaemonErrorNamingThePath) {
  TempDir dir;
  auto c = Client::Connect(dir.Sub("none.sock"));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Status::Code::kDaemon);
  EXPECT_NE(c.status().message().find("none.sock"), std::string::npos);
}

TEST(ClientTest, DaemonOfAnotherMajorIsProtocolError) {
  FakeDaemon fake([](int fd) { HelloOk(fd, kProtocolMajor + 1); });
  auto c = Client::Connect(fake.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Status::Code::kProtocol) << c.status().ToString();
}

TEST(ClientTest, GarbageReplyIsProtocolError) {
  FakeDaemon fake([](int fd) {
    Receive(fd);
    const uint8_t junk[] = {0xc1, 0x00};
    (void)SendFrame(fd, junk);
  });
  EXPECT_EQ(Client::Connect(fake.path()).status().code(), Status::Code::kProtocol);
}

TEST(ClientTest, HangUpDuringHelloIsDaemonError) {
  FakeDaemon fake([](int fd) { Receive(fd); });
  EXPECT_EQ(Client::Connect(fake.path()).status().code(), Status::Code::kDaemon);
}

// A fake daemon that opens a real sealed ring and then answers `next` with
// `batch` (possibly lying); records what the client released.
struct RingScript {
  std::function<BatchMsg(const RingGeometry&, uint8_t* base)> make_batch;
  bool seal = true;
  std::vector<ReleaseMsg> releases;

  void operator()(int fd) {
    HelloOk(fd);
    Receive(fd);  // open (fds are dropped with the frame)
    RingGeometry g = RingGeometry::Compute(4, 1 << 16).value();
    UniqueFd mem = CreateMemfd("fake-ring", g.total_bytes).value();
    MappedRegion rw = MappedRegion::Map(mem.get(), g.total_bytes, 0, true).value();
    InitRing(rw.mutable_data(), g, 1, 1);
    if (seal) (void)SealMemfd(mem.get(), kRingSeals);
    int ring_fd = mem.get();
    OpenedMsg opened{10, 4, g.total_bytes, 2, {{0, "<u4", {4}, 1, 10}}};
    Reply(fd, opened, std::span<const int>(&ring_fd, 1));
    while (true) {
      Message m = Receive(fd);
      if (std::holds_alternative<NextMsg>(m)) {
        Reply(fd, make_batch(g, rw.mutable_data()));
      } else if (auto* r = std::get_if<ReleaseMsg>(&m)) {
        releases.push_back(*r);
      } else {
        return;
      }
    }
  }
};

client::LoaderSpec SpecWithStore(const TempDir& dir) {
  auto w = StoreWriter::Create(dir.Sub("s"), DenseSchema("<u4", {4}), WriteOptions{}).value();
  std::vector<uint32_t> data(40, 1);
  EXPECT_TRUE(w->AppendDense(data.data(), 10).ok());
  EXPECT_TRUE(w->Publish().ok());
  client::LoaderSpec spec;
  spec.stores = {dir.Sub("s")};
  spec.batch_size = 2;
  return spec;
}

TEST(ClientTest, HonestBatchIsReadAndReleasedWhenDropped) {
  auto script = std::make_shared<RingScript>();
  script->make_batch = [](const RingGeometry& g, uint8_t* base) {
    uint64_t off = g.payload_offset;
    auto* v = reinterpret_cast<uint32_t*>(base + off);
    for (int i = 0; i < 8; ++i) v[i] = 100 + i;
    PublishSlot(base, g, 1, 5, 0, off, 64);
    return BatchMsg{0, 1, 5, off, 2, 64, {{0, 0, 32, 0, 0}}};
  };
  {
    FakeDaemon fake([script](int fd) { (*script)(fd); });
    auto c = Client::Connect(fake.path()).value();
    auto loader = c->OpenLoader(SpecWithStore(fake.dir())).value();
    auto b = loader->Next();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(static_cast<const uint32_t*>(b->Dense(0).data)[7], 107u);
    EXPECT_EQ(loader->leases_held(), 1u);
    b->Reset();
    EXPECT_EQ(loader->leases_held(), 0u);
    loader->Close();
  }
  ASSERT_EQ(script->releases.size(), 1u);
  EXPECT_EQ(script->releases[0].slot, 1u);
  EXPECT_EQ(script->releases[0].seq, 5u);
}

TEST(ClientTest, BatchOutsideTheRingOrNotMatchingItsSlotIsRefusedAndReleased) {
  auto script = std::make_shared<RingScript>();
  int call = 0;
  script->make_batch = [&call](const RingGeometry& g, uint8_t* base) {
    uint64_t off = g.payload_offset;
    PublishSlot(base, g, 0, 7, 0, off, 64);
    switch (call++) {
      case 0: return BatchMsg{0, 0, 7, g.total_bytes, 2, 64, {{0, 0, 32, 0, 0}}};  // past the end
      case 1: return BatchMsg{0, 0, 6, off, 2, 64, {{0, 0, 32, 0, 0}}};            // stale seq
      case 2: return BatchMsg{0, 0, 7, off, 2, 64, {{0, 0, 16, 0, 0}}};            // wrong size
      default: return BatchMsg{0, 0, 7, off, 2, 64, {{1, 0, 32, 0, 0}}};           // wrong kind
    }
  };
  {
    FakeDaemon fake([script](int fd) { (*script)(fd); });
    auto c = Client::Connect(fake.path()).value();
    auto loader = c->OpenLoader(SpecWithStore(fake.dir())).value();
    for (int i = 0; i < 4; ++i) {
      auto b = loader->Next();
      ASSERT_FALSE(b.ok());
      EXPECT_EQ(b.status().code(), Status::Code::kProtocol) << i;
    }
    EXPECT_EQ(loader->leases_held(), 0u);
    loader->Close();
  }
  EXPECT_EQ(script->releases.size(), 4u);  // every refused slot was handed back
}

TEST(ClientTest, UnsealedRingIsRefused) {
  auto script = std::make_shared<RingScript>();
  script->seal = false;
  script->make_batch = [](const RingGeometry&, uint8_t*) { return BatchMsg{}; };
  FakeDaemon fake([script](int fd) { (*script)(fd); });
  auto c = Client::Connect(fake.path()).value();
  auto loader = c->OpenLoader(SpecWithStore(fake.dir()));
  ASSERT_FALSE(loader.ok());
  EXPECT_NE(loader.status().message().find("seals"), std::string::npos) << loader.status().ToString();
}

TEST(ClientTest, NextForTimesOutAndTheLateBatchIsDeliveredNext) {
  auto script = std::make_shared<RingScript>();
  script->make_batch = [](const RingGeometry& g, uint8_t* base) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    PublishSlot(base, g, 2, 9, 0, g.payload_offset, 64);
    return BatchMsg{0, 2, 9, g.payload_offset, 2, 64, {{0, 0, 32, 0, 0}}};
  };
  FakeDaemon fake([script](int fd) { (*script)(fd); });
  auto c = Client::Connect(fake.path()).value();
  auto loader = c->OpenLoader(SpecWithStore(fake.dir())).value();
  auto first = loader->NextFor(std::chrono::milliseconds(20));
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(first->has_value());
  EXPECT_EQ(loader->Step(), 0u);
  auto second = loader->Next();  // no second request: it collects the owed reply
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->step(), 0u);
  EXPECT_EQ(loader->Step(), 1u);
  loader->Close();
}

}  // namespace
}  // namespace loaderx::testing
