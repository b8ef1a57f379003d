// The C++ client against a scripted fake daemon: whatever the daemon says is
// checked before the client trusts it.
#include "loaderx/client.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "client/batch_test_util.h"
#include "client/page_state.h"
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
  ~FakeDaemon() { Join(); }
  // Waits for the script to end (it reads until the client closes or hangs
  // up); what it recorded is then safe to read.
  void Join() {
    ::shutdown(listener_.get(), SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
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

void HelloOk(int fd, uint32_t major = kProtocolMajor, uint32_t minor = kProtocolMinor) {
  Receive(fd);
  Reply(fd, HelloOkMsg{major, minor, "fake", 1, 1});
}

// LoaderSpec's rules, the one place every host checks them (Python's
// DaemonOptions calls ValidateOptions): each bad field is InvalidArgument
// naming the field as the Python keyword, its value and the allowed range.
TEST(LoaderSpecTest, EachRuleNamesTheFieldAndTheValue) {
  using std::chrono::milliseconds;
  auto fails = [](const client::LoaderSpec& s, const std::string& want) {
    const Status st = s.Validate();
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << want;
    EXPECT_NE(st.message().find(want), std::string::npos) << st.message();
  };
  client::LoaderSpec ok;
  ok.stores = {"a"};
  EXPECT_TRUE(ok.Validate().ok());
  EXPECT_TRUE(client::LoaderSpec().ValidateOptions().ok());  // no streams needed
  fails(client::LoaderSpec(), "at least one stream");

  client::LoaderSpec s = ok;
  s.group = std::string(kMaxGroupName + 1, 'g');
  fails(s, "group must be 1..256 UTF-8 bytes, got 257");
  s = ok;
  s.join = GroupJoin::kCurrent;
  fails(s, "join only applies to a group member");
  s = ok;
  s.liveness_timeout = milliseconds(999);
  fails(s, "liveness_timeout must be in 1..86400 seconds, got 0.999");
  s.liveness_timeout = milliseconds(86'400'001);
  fails(s, "got 86400");
  s = ok;
  s.group_timeout = milliseconds(5000);
  fails(s, "group_timeout needs a group");
  s.group = "g";
  EXPECT_TRUE(s.Validate().ok());
  s.group_timeout = milliseconds(50);
  fails(s, "group_timeout must be in 0.1..86400 seconds, got 0.05");
  s = ok;
  s.group = "g";
  s.group_mode = GroupMode::kBroadcast;
  s.replicas = 2;
  fails(s, "ranks and replicas are for shard groups");
  s.replicas = 1;
  // ranks=range(0, 4, 2) in Python: not consecutive, named as Python writes
  // it, and refused before any other rule (here: the group mode's).
  s.ranks_first = 0;
  s.ranks_count = 2;
  s.ranks_step = 2;
  EXPECT_EQ(s.ValidateOptions().code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.ValidateOptions().message(),
            "ranks must be a range of consecutive ranks, got range(0, 4, 2)");
  s.ranks_first = 3;
  s.ranks_count = 3;
  s.ranks_step = -1;
  EXPECT_EQ(s.Validate().message(),
            "ranks must be a range of consecutive ranks, got range(3, 0, -1)");
  s.ranks_count = 0;
  s.ranks_step = 2;
  EXPECT_EQ(s.Validate().message(),
            "ranks must be a range of consecutive ranks, got range(3, 3, 2)");
  s.ranks_first = 0;
  s.ranks_step = 1;
  s.start_step = 7;
  s.join = GroupJoin::kCurrent;
  fails(s, "start_step=7 and join='current' contradict each other");
  s.join = GroupJoin::kDefault;  // a broadcast member with a start_step starts there
  EXPECT_TRUE(s.Validate().ok());
  s = ok;
  s.mix_counts = {3, 4};
  fails(s, "one mix_parts entry per stream (1 streams, 0 mix_parts entries)");
  s.mix_parts = {{"x", "y", "z"}};
  fails(s, "mixed stream 0 has 3 parts; the mixture has 2 datasets");
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

// This client refuses a 1.2 daemon (msgpack batch frames) and a 1.1 one.
TEST(ClientTest, DaemonOfAnOlderMinorIsProtocolErrorNamingBothVersions) {
  for (uint32_t minor : {2u, 1u}) {
    FakeDaemon fake([minor](int fd) { HelloOk(fd, kProtocolMajor, minor); });
    auto c = Client::Connect(fake.path());
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), Status::Code::kProtocol) << c.status().ToString();
    EXPECT_NE(c.status().message().find("loaderxd speaks protocol 1." + std::to_string(minor) +
                                        ", this client 1." + std::to_string(kProtocolMinor) +
                                        " (it needs at least 1.3: upgrade loaderxd)"),
              std::string::npos)
        << c.status().ToString();
  }
}

TEST(ClientTest, GarbageReplyIsProtocolError) {
  FakeDaemon fake([](int fd) {
    Receive(fd);
    const uint8_t junk[] = {0xc1, 0x00};  // a binary frame of no known type
    (void)SendFrame(fd, junk);
  });
  EXPECT_EQ(Client::Connect(fake.path()).status().code(), Status::Code::kProtocol);
}

TEST(ClientTest, HangUpDuringHelloIsDaemonError) {
  FakeDaemon fake([](int fd) { Receive(fd); });
  EXPECT_EQ(Client::Connect(fake.path()).status().code(), Status::Code::kDaemon);
}

// A fake daemon that opens a real sealed ring and then pushes `batch`es
// (possibly lying) while the client holds fewer than the credit it granted
// (opened.leases); records what the client released and reported consumed.
// `on_seek` (optional) answers a seek and may push more.
struct RingScript {
  std::function<BatchMsg(const RingGeometry&, uint8_t* base)> make_batch;
  std::function<void(int fd, const SeekMsg&, const RingGeometry&, uint8_t* base)> on_seek;
  bool seal = true;
  uint32_t minor = kProtocolMinor;  // the protocol minor the fake announces
  uint32_t ring_slots = 4;          // slots of the ring it makes
  OpenedMsg opened{0,           10, 4, 0, 2, {{0, "<u4", {4}, 1, 10}},
                   std::nullopt};  // id, ring_bytes filled in
  // Push only in answer to the client's first `push_on_waits` waiting notes
  // (one batch each), instead of filling the credit: the client's waits are
  // then exact. 0: fill the credit.
  int push_on_waits = 0;
  std::vector<ReleaseMsg> releases;
  // Written by the fake's thread; read after it ends. `consumed`: the notes
  // of items taken; `waits`: those saying the caller waits (waiting: true).
  std::vector<ConsumedMsg> consumed;
  std::vector<ConsumedMsg> waits;

  void operator()(int fd) {
    HelloOk(fd, kProtocolMajor, minor);
    Message open = Receive(fd);  // (fds are dropped with the frame)
    if (auto* o = std::get_if<OpenMsg>(&open)) opened.id = o->id;
    RingGeometry g = RingGeometry::Compute(ring_slots, 1 << 16).value();
    UniqueFd mem = CreateMemfd("fake-ring", g.total_bytes).value();
    MappedRegion rw = MappedRegion::Map(mem.get(), g.total_bytes, 0, true).value();
    InitRing(rw.mutable_data(), g, 1, 1);
    if (seal) (void)SealMemfd(mem.get(), kRingSeals);
    int ring_fd = mem.get();
    opened.ring_bytes = g.total_bytes;
    Reply(fd, opened, std::span<const int>(&ring_fd, 1));
    uint32_t held = 0;
    while (true) {
      if (push_on_waits == 0) {
        for (; held < opened.leases; ++held) Reply(fd, make_batch(g, rw.mutable_data()));
      }
      Message m = Receive(fd);
      if (auto* r = std::get_if<ReleaseMsg>(&m)) {
        releases.push_back(*r);
        --held;
      } else if (auto* c = std::get_if<ConsumedMsg>(&m); c != nullptr && c->waiting) {
        waits.push_back(*c);
        if (static_cast<int>(waits.size()) <= push_on_waits) {
          Reply(fd, make_batch(g, rw.mutable_data()));
          ++held;
        }
      } else if (auto* c = std::get_if<ConsumedMsg>(&m)) {
        consumed.push_back(*c);
      } else if (auto* k = std::get_if<SeekMsg>(&m); k != nullptr && on_seek) {
        on_seek(fd, *k, g, rw.mutable_data());
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
  spec.shared_view = true;  // views of the shared ring, never moved out at the cap
  return spec;
}

// Protocol 1.4: the client asks for a push queue only a daemon that said
// minor >= 4, and refuses an `opened` whose queue it did not ask for or
// whose queue fd is missing, naming what it expected.
TEST(ClientTest, PushQueueIsAskedOnlyOfA14DaemonAndAnUnaskedOrFdlessQueueIsRefused) {
  for (uint32_t minor : {3u, 4u}) {
    auto asked = std::make_shared<std::optional<bool>>();
    {
      FakeDaemon fake([minor, asked](int fd) {
        HelloOk(fd, kProtocolMajor, minor);
        Message m = Receive(fd);
        if (auto* o = std::get_if<OpenMsg>(&m)) *asked = o->push_queue;
      });
      auto c = Client::Connect(fake.path()).value();
      (void)c->OpenLoader(SpecWithStore(fake.dir()));  // the fake hangs up after the open
    }
    ASSERT_TRUE(asked->has_value()) << minor;
    EXPECT_EQ(**asked, minor >= 4) << minor;
  }
  struct Case {
    bool ask;
    int fds;
    const char* want;
  };
  for (const Case k : {Case{false, 2, "'opened' carries a push queue this client did not ask for"},
                       Case{true, 1, "expected 'opened' with a ring fd and a queue fd"}}) {
    FakeDaemon fake([k](int fd) {
      HelloOk(fd);
      Message m = Receive(fd);
      const auto* o = std::get_if<OpenMsg>(&m);
      if (o == nullptr) return;
      RingGeometry g = RingGeometry::Compute(4, 1 << 16).value();
      UniqueFd mem = CreateMemfd("fake-ring", g.total_bytes).value();
      MappedRegion rw = MappedRegion::Map(mem.get(), g.total_bytes, 0, true).value();
      InitRing(rw.mutable_data(), g, 1, 1);
      (void)SealMemfd(mem.get(), kRingSeals);
      OpenedMsg opened{o->id, 10, 4, g.total_bytes, 2, {{0, "<u4", {4}, 1, 10}}, std::nullopt};
      opened.queue_bytes = 4096 + 65536;
      const int fds[2] = {mem.get(), mem.get()};
      Reply(fd, opened, std::span<const int>(fds, static_cast<size_t>(k.fds)));
      Receive(fd);  // until the client hangs up
    });
    auto c = Client::Connect(fake.path()).value();
    client::LoaderSpec spec = SpecWithStore(fake.dir());
    spec.push_queue = k.ask;
    auto loader = c->OpenLoader(spec);
    ASSERT_FALSE(loader.ok()) << k.want;
    EXPECT_EQ(loader.status().code(), Status::Code::kProtocol) << loader.status().ToString();
    EXPECT_NE(loader.status().message().find(k.want), std::string::npos)
        << loader.status().ToString();
  }
}

TEST(ClientTest, HonestBatchIsReadAndReleasedWhenDropped) {
  auto script = std::make_shared<RingScript>();
  script->make_batch = [](const RingGeometry& g, uint8_t* base) {
    uint64_t off = g.payload_offset;
    auto* v = reinterpret_cast<uint32_t*>(base + off);
    for (int i = 0; i < 8; ++i) v[i] = 100 + i;
    PublishSlot(base, g, 1, 5, 0, off, 64);
    return BatchMsg{0, 0, 1, 5, off, 2, 64, {{0, 0, 32, 0, 0}}};
  };
  {
    FakeDaemon fake([script](int fd) { (*script)(fd); });
    auto c = Client::Connect(fake.path()).value();
    auto loader = c->OpenLoader(SpecWithStore(fake.dir())).value();
    auto b = TakeBatch(*loader);
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

// A connection keeps its Leases in a pool of 64 blocks (client/src
// connection.h, LeasePool) and takes the heap when they are all in use.
// Holding more batches than that at once, each is still its own (step,
// values, slot) and is released exactly once; so are the batches drawn after
// all were dropped, in reused blocks.
TEST(ClientTest, MoreBatchesHeldThanLeaseBlocksAreEachValidAndReleasedOnce) {
  constexpr uint32_t kHeld = 100;
  auto script = std::make_shared<RingScript>();
  script->ring_slots = kHeld;
  script->opened.slot_count = kHeld;
  script->opened.leases = kHeld;
  script->opened.n = 1000;
  auto pushed = std::make_shared<uint64_t>(0);
  script->make_batch = [pushed](const RingGeometry& g, uint8_t* base) {
    const uint64_t i = (*pushed)++;
    const uint32_t slot = static_cast<uint32_t>(i % kHeld);
    const uint64_t off = g.payload_offset + uint64_t{slot} * 64;
    auto* v = reinterpret_cast<uint32_t*>(base + off);
    for (uint32_t k = 0; k < 8; ++k) v[k] = static_cast<uint32_t>(i * 10 + k);
    PublishSlot(base, g, slot, i + 1, i, off, 64);
    return BatchMsg{0, i, slot, i + 1, off, 2, 64, {{0, 0, 32, 0, 0}}};
  };
  {
    FakeDaemon fake([script](int fd) { (*script)(fd); });
    auto c = Client::Connect(fake.path()).value();
    auto loader = c->OpenLoader(SpecWithStore(fake.dir())).value();
    for (uint64_t round = 0; round < 2; ++round) {
      std::vector<client::Batch> held;
      for (uint64_t k = 0; k < kHeld; ++k) {
        auto b = TakeBatch(*loader);
        ASSERT_TRUE(b.ok()) << b.status().ToString();
        held.push_back(std::move(*b));
      }
      EXPECT_EQ(loader->leases_held(), kHeld);
      for (uint64_t k = 0; k < kHeld; ++k) {
        const uint64_t i = round * kHeld + k;
        ASSERT_EQ(held[k].step(), i);
        const client::ArrayView v = held[k].Dense(0);
        EXPECT_EQ(v.shape, (std::vector<uint64_t>{2, 4}));
        const auto* x = static_cast<const uint32_t*>(v.data);
        for (uint32_t e = 0; e < 8; ++e) ASSERT_EQ(x[e], i * 10 + e) << "batch " << i;
      }
    }
    loader->Close();
  }
  std::map<std::pair<uint32_t, uint64_t>, int> released;
  for (const ReleaseMsg& r : script->releases) ++released[{r.slot, r.seq}];
  for (uint64_t i = 0; i < 2 * kHeld; ++i) {
    EXPECT_EQ((released[{static_cast<uint32_t>(i % kHeld), i + 1}]), 1) << "batch " << i;
  }
}

// A shard member's rows of the node's batch start past the slot's first byte
// (the rows of the ranks before it): its writable view starts at its own
// rows, so moving the batch out of the ring at the lease cap copies the
// pages of its rows only, never those of the other members' rows.
TEST(ClientTest, ShardMemberBatchMovedOutOfTheRingCopiesOnlyItsOwnRows) {
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (!PageState(&page)) GTEST_SKIP() << "/proc/self/pagemap cannot be read";
  auto script = std::make_shared<RingScript>();
  script->opened.leases = 1;
  auto pushed = std::make_shared<uint64_t>(0);
  script->make_batch = [pushed, page](const RingGeometry& g, uint8_t* base) {
    // The node's batch of step i in slot i % 2, from a page boundary: two
    // pages of the rows before this member's, then its 2 records of u4[4].
    const uint64_t i = (*pushed)++;
    const auto slot = static_cast<uint32_t>(i % 2);
    const uint64_t off = (g.payload_offset + page - 1) / page * page + uint64_t{slot} * 4 * page;
    std::memset(base + off, 0xEE, 2 * page);
    auto* v = reinterpret_cast<uint32_t*>(base + off + 2 * page);
    for (uint32_t k = 0; k < 8; ++k) v[k] = static_cast<uint32_t>(i * 10 + k);
    PublishSlot(base, g, slot, i + 1, i, off, 2 * page + 32);
    return BatchMsg{0, i, slot, i + 1, off, 2, 2 * page + 32, {{0, 2 * page, 32, 0, 0}}};
  };
  FakeDaemon fake([script](int fd) { (*script)(fd); });
  auto c = Client::Connect(fake.path()).value();
  client::LoaderSpec spec = SpecWithStore(fake.dir());
  spec.shared_view = false;
  auto loader = c->OpenLoader(spec).value();
  auto a = TakeBatch(*loader);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(a->writable());
  const auto* x = static_cast<const uint32_t*>(a->Dense(0).data);
  EXPECT_EQ(x[7], 7u);
  auto b = TakeBatch(*loader);  // at the cap: `a` moves out of the ring first
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(loader->batches_moved_out(), 1u);
  EXPECT_EQ(static_cast<const uint32_t*>(b->Dense(0).data)[7], 17u);
  for (uint32_t k = 0; k < 8; ++k) EXPECT_EQ(x[k], k);
  // `a`'s rows are now its private copy; the page before them (the other
  // rows, in the same mapping of the ring) was not copied.
  const auto* own = reinterpret_cast<const uint8_t*>(x);
  EXPECT_EQ(PageState(own).value(), std::make_pair(true, false));
  const auto before = PageState(own - page).value();
  EXPECT_FALSE(before.first && !before.second) << "the other rows' page was copied out";
  a->Reset();
  b->Reset();
  loader->Close();
}

TEST(ClientTest, BatchOutsideTheRingOrNotMatchingItsSlotIsRefusedAndReleased) {
  auto script = std::make_shared<RingScript>();
  int call = 0;
  script->make_batch = [&call](const RingGeometry& g, uint8_t* base) {
    uint64_t off = g.payload_offset;
    PublishSlot(base, g, 0, 7, 0, off, 64);
    switch (call++) {
      case 0:
        return BatchMsg{0, 0, 0, 7, g.total_bytes, 2, 64, {{0, 0, 32, 0, 0}}};  // past the end
      case 1:
        return BatchMsg{0, 0, 0, 6, off, 2, 64, {{0, 0, 32, 0, 0}}};  // stale seq
      case 2:
        return BatchMsg{0, 0, 0, 7, off, 2, 64, {{0, 0, 16, 0, 0}}};  // wrong size
      default:
        return BatchMsg{0, 0, 0, 7, off, 2, 64, {{1, 0, 32, 0, 0}}};  // wrong kind
    }
  };
  {
    FakeDaemon fake([script](int fd) { (*script)(fd); });
    auto c = Client::Connect(fake.path()).value();
    auto loader = c->OpenLoader(SpecWithStore(fake.dir())).value();
    for (int i = 0; i < 4; ++i) {
      auto b = TakeBatch(*loader);
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
  EXPECT_NE(loader.status().message().find("seals"), std::string::npos)
      << loader.status().ToString();
}

TEST(ClientTest, NextForTimesOutAndTheLateBatchIsDeliveredNext) {
  auto script = std::make_shared<RingScript>();
  script->make_batch = [](const RingGeometry& g, uint8_t* base) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    PublishSlot(base, g, 2, 9, 0, g.payload_offset, 64);
    return BatchMsg{0, 0, 2, 9, g.payload_offset, 2, 64, {{0, 0, 32, 0, 0}}};
  };
  FakeDaemon fake([script](int fd) { (*script)(fd); });
  auto c = Client::Connect(fake.path()).value();
  auto loader = c->OpenLoader(SpecWithStore(fake.dir())).value();
  auto first = TakeBatchFor(*loader, std::chrono::milliseconds(20));
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(first->has_value());
  EXPECT_EQ(loader->step(), 0u);
  auto second = TakeBatch(*loader);  // the late push, nothing asked again
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->step(), 0u);
  EXPECT_EQ(loader->step(), 1u);
  loader->Close();
}

// Protocol 1.1: a shard member's ragged slice keeps the global offsets; the
// client reads them relative to the slice's first record, and still checks
// that they are monotone and span exactly the slice's values.
TEST(ClientTest, RaggedShardSliceIsReadRelativeToItsFirstOffsetAndValidated) {
  auto script = std::make_shared<RingScript>();
  script->opened.streams = {{1, "<i2", {}, 1, 10}};
  int call = 0;
  script->make_batch = [&call](const RingGeometry& g, uint8_t* base) {
    // Global batch of 4 records with 1, 2, 3, 1 int16 values = the index.
    // A slot per call: the next is pushed while this one is leased.
    const uint32_t slot = static_cast<uint32_t>(call % 4);
    const uint64_t off = g.payload_offset + slot * 256;
    auto* v = reinterpret_cast<int16_t*>(base + off);
    const int16_t values[] = {0, 1, 1, 2, 2, 2, 3};
    std::memcpy(v, values, sizeof(values));
    auto* shapes = reinterpret_cast<uint64_t*>(base + off + 64);
    const uint64_t sh[] = {1, 2, 3, 1};
    std::memcpy(shapes, sh, sizeof(sh));
    auto* offsets = reinterpret_cast<uint64_t*>(base + off + 128);
    const uint64_t of[] = {0, 2, 6, 12, 14};
    std::memcpy(offsets, of, sizeof(of));
    const uint64_t seq = 10 + call;
    PublishSlot(base, g, slot, seq, 0, off, 192);
    // Rank 1 of 2: records 2 and 3.
    StreamLayoutMsg slice{1, 6, 8, 64 + 16, 128 + 16};
    switch (call++) {
      case 0:
        break;  // honest
      case 1:
        slice.values_bytes = 6;
        break;  // does not span the slice
      case 2:
        slice.offsets_offset = 128 + 24;
        break;  // offsets past the values
      default:
        slice.values_offset = 188;
        break;  // values outside the batch
    }
    return BatchMsg{0, 0, slot, seq, off, 2, 192, {slice}};
  };
  FakeDaemon fake([script](int fd) { (*script)(fd); });
  auto c = Client::Connect(fake.path()).value();
  auto loader = c->OpenLoader(SpecWithStore(fake.dir())).value();
  auto b = TakeBatch(*loader);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  client::ArrayView r0 = b->Record(0, 0), r1 = b->Record(0, 1);
  EXPECT_EQ(r0.shape, std::vector<uint64_t>({3}));
  EXPECT_EQ(r1.shape, std::vector<uint64_t>({1}));
  const auto* x = static_cast<const int16_t*>(r0.data);
  EXPECT_EQ(x[0], 2);
  EXPECT_EQ(x[2], 2);
  EXPECT_EQ(static_cast<const int16_t*>(r1.data)[0], 3);
  b->Reset();
  for (int i = 0; i < 3; ++i) {
    auto bad = TakeBatch(*loader);
    ASSERT_FALSE(bad.ok()) << i;
    EXPECT_EQ(bad.status().code(), Status::Code::kProtocol) << i;
  }
  loader->Close();
}

TEST(ClientTest, GroupOpenedReplyMustNameTheFirstStepAndSetsIt) {
  for (bool with_step : {false, true}) {
    auto script = std::make_shared<RingScript>();
    if (with_step) script->opened.step = 42;
    script->make_batch = [](const RingGeometry&, uint8_t*) { return BatchMsg{}; };
    FakeDaemon fake([script](int fd) { (*script)(fd); });
    auto c = Client::Connect(fake.path()).value();
    client::LoaderSpec spec = SpecWithStore(fake.dir());
    spec.group = "g";
    spec.join = GroupJoin::kCurrent;
    auto loader = c->OpenLoader(spec);
    if (!with_step) {
      ASSERT_FALSE(loader.ok());
      EXPECT_EQ(loader.status().code(), Status::Code::kProtocol) << loader.status().ToString();
      continue;
    }
    ASSERT_TRUE(loader.ok()) << loader.status().ToString();
    EXPECT_EQ((*loader)->step(), 42u);  // join="current": where the group is
    (*loader)->Close();
  }
}

// Ring layout 1.1: the client reports the daemon's publish stamp, and a slot
// whose stamp is missing or lies in the future is refused (and released) like
// any other inconsistent slot.
TEST(ClientTest, BatchCarriesThePublishStampOfItsSlot) {
  auto script = std::make_shared<RingScript>();
  auto published = std::make_shared<std::atomic<uint64_t>>(0);
  script->make_batch = [published](const RingGeometry& g, uint8_t* base) {
    PublishSlot(base, g, 1, 5, 0, g.payload_offset, 64);
    published->store(SlotAt(static_cast<const uint8_t*>(base), g, 1)->publish_ns);
    return BatchMsg{0, 0, 1, 5, g.payload_offset, 2, 64, {{0, 0, 32, 0, 0}}};
  };
  FakeDaemon fake([script](int fd) { (*script)(fd); });
  auto c = Client::Connect(fake.path()).value();
  auto loader = c->OpenLoader(SpecWithStore(fake.dir())).value();
  auto b = TakeBatch(*loader);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_NE(b->publish_ns(), 0u);
  EXPECT_EQ(b->publish_ns(), published->load());
  EXPECT_LE(b->publish_ns(), MonotonicNowNs());
  loader->Close();
}

TEST(ClientTest, SlotWithoutStampOrStampedInTheFutureIsRefusedAndReleased) {
  auto script = std::make_shared<RingScript>();
  auto call = std::make_shared<std::atomic<int>>(0);
  script->make_batch = [call](const RingGeometry& g, uint8_t* base) {
    const int k = call->fetch_add(1);
    const uint32_t slot = static_cast<uint32_t>(k % 4);  // the next is pushed while this is leased
    const uint64_t off = g.payload_offset + slot * 64;
    PublishSlot(base, g, slot, 7, 0, off, 64);
    SlotAt(base, g, slot)->publish_ns = k == 0 ? 0 : MonotonicNowNs() + 3'600'000'000'000ull;
    return BatchMsg{0, 0, slot, 7, off, 2, 64, {{0, 0, 32, 0, 0}}};
  };
  {
    FakeDaemon fake([script](int fd) { (*script)(fd); });
    auto c = Client::Connect(fake.path()).value();
    auto loader = c->OpenLoader(SpecWithStore(fake.dir())).value();
    for (const char* why : {"no publish stamp", "in the future"}) {
      auto b = TakeBatch(*loader);
      ASSERT_FALSE(b.ok());
      EXPECT_EQ(b.status().code(), Status::Code::kProtocol);
      EXPECT_NE(b.status().message().find(why), std::string::npos) << b.status().ToString();
    }
    EXPECT_EQ(loader->leases_held(), 0u);
    loader->Close();
  }
  EXPECT_EQ(script->releases.size(), 2u);
}

// Step k in slot k % 4 with seq k + 1, of generation `gen`.
BatchMsg StepBatch(const RingGeometry& g, uint8_t* base, uint64_t k, uint64_t gen = 0) {
  const uint32_t slot = static_cast<uint32_t>(k % 4);
  const uint64_t off = g.payload_offset + slot * 64;
  PublishSlot(base, g, slot, k + 1, k, off, 64);
  return BatchMsg{gen, k, slot, k + 1, off, 2, 64, {{0, 0, 32, 0, 0}}};
}

TEST(ClientTest, DaemonPushesUnderTheCreditWithoutBeingAsked) {
  auto script = std::make_shared<RingScript>();
  auto calls = std::make_shared<std::atomic<int>>(0);
  script->make_batch = [calls](const RingGeometry& g, uint8_t* base) {
    return StepBatch(g, base, static_cast<uint64_t>(calls->fetch_add(1)));
  };
  FakeDaemon fake([script](int fd) { (*script)(fd); });
  auto c = Client::Connect(fake.path()).value();
  auto loader = c->OpenLoader(SpecWithStore(fake.dir())).value();  // credit 2
  for (int i = 0; i < 200 && calls->load() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(calls->load(), 2);  // both pushed before any Next()
  auto b0 = TakeBatch(*loader).value();
  auto b1 = TakeBatch(*loader).value();
  EXPECT_EQ(b0.step(), 0u);
  EXPECT_EQ(b1.step(), 1u);
  EXPECT_EQ(TakeBatch(*loader).status().code(), Status::Code::kResourceExhausted);
  b0.Reset();  // a credit back: step 2 comes
  auto b2 = TakeBatch(*loader).value();
  EXPECT_EQ(b2.step(), 2u);
  EXPECT_EQ(loader->step(), 3u);
  loader->Close();
  fake.Join();  // the script ended at the `close`
  // One `consumed` per batch taken, with the step the caller takes next;
  // the refused Next took nothing and reported nothing.
  EXPECT_EQ(script->consumed, (std::vector<ConsumedMsg>{{0, 1}, {0, 2}, {0, 3}}));
}

// A seek: what was pushed before its `ok` (generation 0) is released
// unread, even a batch of the old generation arriving after it (a daemon
// must not, but the client does not trust it); then the new generation.
TEST(ClientTest, SeekReleasesBatchesOfOlderGenerationsUnread) {
  auto script = std::make_shared<RingScript>();
  auto calls = std::make_shared<std::atomic<int>>(0);
  script->make_batch = [calls](const RingGeometry& g, uint8_t* base) {
    return StepBatch(g, base, static_cast<uint64_t>(calls->fetch_add(1)));
  };
  script->on_seek = [](int fd, const SeekMsg& seek, const RingGeometry& g, uint8_t* base) {
    Reply(fd, StepBatch(g, base, 2, /*gen=*/0));  // before the ok: old generation
    Reply(fd, OkMsg{seek.id, seek.step, 1});
    Reply(fd, StepBatch(g, base, 3, /*gen=*/0));  // after it, still old: a lie
    Reply(fd, StepBatch(g, base, seek.step, /*gen=*/1));
  };
  FakeDaemon fake([script](int fd) { (*script)(fd); });
  auto c = Client::Connect(fake.path()).value();
  auto loader = c->OpenLoader(SpecWithStore(fake.dir())).value();
  auto b0 = TakeBatch(*loader).value();  // step 0; step 1 is queued or in the socket
  EXPECT_EQ(b0.step(), 0u);
  ASSERT_TRUE(SeekTo(*loader, 5).ok());
  EXPECT_EQ(loader->step(), 5u);
  auto b5 = TakeBatch(*loader);
  ASSERT_TRUE(b5.ok()) << b5.status().ToString();
  EXPECT_EQ(b5->step(), 5u);
  b5->Reset();
  b0.Reset();
  loader->Close();
  c.reset();
  fake.Join();  // the script ended at the hang-up: what it recorded is complete
  // Steps 1, 2, 3 went back unread (seq = step + 1), then 5 and 0.
  std::vector<uint64_t> released;
  for (const ReleaseMsg& r : script->releases) released.push_back(r.seq - 1);
  EXPECT_EQ(released, (std::vector<uint64_t>{1, 2, 3, 5, 0}));
  // Consumed: step 0 taken in generation 0, step 5 in generation 1; the
  // batches released unread were never reported.
  EXPECT_EQ(script->consumed, (std::vector<ConsumedMsg>{{0, 1}, {1, 6}}));
}

TEST(ClientTest, PushedBatchOfAFutureGenerationIsProtocolError) {
  auto script = std::make_shared<RingScript>();
  auto calls = std::make_shared<std::atomic<int>>(0);
  script->make_batch = [calls](const RingGeometry& g, uint8_t* base) {
    return StepBatch(g, base, static_cast<uint64_t>(calls->fetch_add(1)), /*gen=*/3);
  };
  FakeDaemon fake([script](int fd) { (*script)(fd); });
  auto c = Client::Connect(fake.path()).value();
  auto loader = c->OpenLoader(SpecWithStore(fake.dir())).value();
  auto b = TakeBatch(*loader);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Status::Code::kProtocol);
  EXPECT_NE(b.status().message().find("generation 3"), std::string::npos) << b.status().ToString();
  loader->Close();
}

// Protocol 1.2 "waiting": Next() that finds nothing queued and nothing in
// the socket says once, at its position, that the caller waits (the
// daemon's group timeout counts only such waits); slicing the wait
// (NextFor, the Python binding) or timing out does not say it again, and
// an item taken clears it (its own `consumed` has no flag).
TEST(ClientTest, NextOnAnEmptySocketSaysOnceThatTheCallerWaits) {
  auto script = std::make_shared<RingScript>();
  script->push_on_waits = 1;  // step 0 in answer to the first wait only
  script->make_batch = [](const RingGeometry& g, uint8_t* base) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // several slices
    return StepBatch(g, base, 0);
  };
  FakeDaemon fake([script](int fd) { (*script)(fd); });
  auto c = Client::Connect(fake.path()).value();
  auto loader = c->OpenLoader(SpecWithStore(fake.dir())).value();
  int slices = 0;
  std::optional<client::Batch> b0;
  while (!b0) {
    auto r = TakeBatchFor(*loader, std::chrono::milliseconds(20));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    b0 = std::move(*r);
    ++slices;
  }
  EXPECT_GT(slices, 1);
  EXPECT_EQ(b0->step(), 0u);
  for (int i = 0; i < 3; ++i) {  // nothing comes: three timed-out waits at step 1
    auto r = TakeBatchFor(*loader, std::chrono::milliseconds(20));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(r->has_value());
  }
  b0->Reset();
  loader->Close();
  c.reset();
  fake.Join();
  EXPECT_EQ(script->waits, (std::vector<ConsumedMsg>{{0, 0, true}, {0, 1, true}}));
  EXPECT_EQ(script->consumed, (std::vector<ConsumedMsg>{{0, 1}}));
}

// A release or `consumed` that finds the socket full (a stopped or slow
// daemon) is queued; 1.2 sends no request per batch to carry it, so the
// wait for the next batch sends the queue as soon as the socket has room,
// in order. The fake pushes 2000 batches without reading a frame (the
// client's notes fill its socket), then reads, and pushes one more batch
// only once it has the release of the last one, as a daemon counting the
// credit would.
TEST(ClientTest, NotesQueuedByAFullSocketAreSentWhileWaitingInOrder) {
  constexpr uint64_t kBatches = 2000;
  auto taken = std::make_shared<std::atomic<uint64_t>>(0);
  auto releases = std::make_shared<std::vector<ReleaseMsg>>();
  auto consumed = std::make_shared<std::vector<ConsumedMsg>>();
  FakeDaemon fake([=](int fd) {
    HelloOk(fd);
    Message open = Receive(fd);
    OpenedMsg opened{0, 10, 4, 0, 2, {{0, "<u4", {4}, 1, 10}}, std::nullopt};
    if (auto* o = std::get_if<OpenMsg>(&open)) opened.id = o->id;
    RingGeometry g = RingGeometry::Compute(4, 1 << 16).value();
    UniqueFd mem = CreateMemfd("fake-ring", g.total_bytes).value();
    MappedRegion rw = MappedRegion::Map(mem.get(), g.total_bytes, 0, true).value();
    InitRing(rw.mutable_data(), g, 1, 1);
    (void)SealMemfd(mem.get(), kRingSeals);
    int ring_fd = mem.get();
    opened.ring_bytes = g.total_bytes;
    Reply(fd, opened, std::span<const int>(&ring_fd, 1));
    for (uint64_t k = 0; k < kBatches; ++k) {
      // Slot k % 4 is reused only once the client took step k - 4.
      while (taken->load() + 3 < k) std::this_thread::sleep_for(std::chrono::microseconds(50));
      Reply(fd, StepBatch(g, rw.mutable_data(), k));
    }
    while (releases->empty() || releases->back().seq != kBatches) {
      Message m = Receive(fd);
      if (auto* r = std::get_if<ReleaseMsg>(&m)) {
        releases->push_back(*r);
      } else if (auto* c = std::get_if<ConsumedMsg>(&m)) {
        if (!c->waiting) consumed->push_back(*c);
      } else {
        return;  // hung up before the last release came
      }
    }
    while (taken->load() < kBatches) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    Reply(fd, StepBatch(g, rw.mutable_data(), kBatches));
    while (!std::holds_alternative<CloseMsg>(Receive(fd))) {
    }
  });
  auto c = Client::Connect(fake.path()).value();
  auto loader = c->OpenLoader(SpecWithStore(fake.dir())).value();
  for (uint64_t k = 0; k < kBatches; ++k) {
    auto b = TakeBatchFor(*loader, std::chrono::seconds(10));
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ASSERT_TRUE(b->has_value()) << "no step " << k;
    ASSERT_EQ((*b)->step(), k);
    b->reset();  // released (or queued)
    taken->fetch_add(1);
  }
  // Only the queued notes, once sent, bring the next batch.
  auto last = TakeBatchFor(*loader, std::chrono::seconds(10));
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  ASSERT_TRUE(last->has_value()) << "the daemon never got the queued releases";
  EXPECT_EQ((*last)->step(), kBatches);
  last->reset();
  loader->Close();
  c.reset();
  fake.Join();
  ASSERT_EQ(releases->size(), kBatches);
  ASSERT_EQ(consumed->size(), kBatches);
  for (uint64_t k = 0; k < kBatches; ++k) {
    EXPECT_EQ((*releases)[k].seq, k + 1) << k;
    EXPECT_EQ((*consumed)[k].step, k + 1) << k;
  }
}

TEST(ClientTest, ReplyNamingAnIdNeverSentIsProtocolError) {
  auto script = std::make_shared<RingScript>();
  script->make_batch = [](const RingGeometry& g, uint8_t* base) { return StepBatch(g, base, 0); };
  script->on_seek = [](int fd, const SeekMsg& seek, const RingGeometry&, uint8_t*) {
    Reply(fd, OkMsg{seek.id + 100, seek.step, 1});
  };
  FakeDaemon fake([script](int fd) { (*script)(fd); });
  auto c = Client::Connect(fake.path()).value();
  auto loader = c->OpenLoader(SpecWithStore(fake.dir())).value();
  Status st = SeekTo(*loader, 4);
  EXPECT_EQ(st.code(), Status::Code::kProtocol) << st.ToString();
  EXPECT_NE(st.message().find("never sent"), std::string::npos) << st.ToString();
  loader->Close();
}

}  // namespace
}  // namespace loaderx::testing
