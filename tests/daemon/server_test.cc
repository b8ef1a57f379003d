// End-to-end: the C++ client against an in-process loaderxd.
#include <sys/wait.h>

#include <cstring>
#include <random>
#include <thread>

#include "daemon_fixture.h"
#include "loaderx/loader.h"

namespace loaderx::testing {
namespace {

using client::LoaderSpec;

class ServerTest : public DaemonFixture {
 protected:
  LoaderSpec DenseSpec(uint64_t batch = 8, SamplerMode mode = SamplerMode::kIID) {
    if (dense_.empty()) dense_ = MakeDenseStore(dir_.Sub("dense"), 100, Codec::kZstd);
    LoaderSpec s;
    s.stores = {dense_};
    s.batch_size = batch;
    s.mode = mode;
    s.seed = 5;
    s.shared_view = true;  // views of the shared ring, never moved out at the cap
    return s;
  }
  // The embedded pipeline's bytes for `step`, the reference for every check.
  std::vector<uint8_t> EmbeddedBytes(const LoaderSpec& spec, uint64_t step, BatchLayout* layout) {
    EmbeddedRef b = EmbeddedBatch(spec, step);
    *layout = b.layout;
    return std::vector<uint8_t>(b.base(), b.base() + b.layout.total_bytes);
  }
  std::vector<uint8_t> BytesOf(const client::Batch& b, uint64_t total) {
    const uint8_t* p = b.lease()->base();
    return std::vector<uint8_t>(p, p + total);
  }
  std::string dense_;
};

TEST_F(ServerTest, HelloReturnsIncarnationAndSessionIds) {
  auto a = Connect();
  auto b = Connect();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->hello().incarnation, server_->incarnation());
  EXPECT_NE(a->hello().session, b->hello().session);
  EXPECT_EQ(a->hello().major, kProtocolMajor);
}

TEST_F(ServerTest, DenseBatchesAreByteIdenticalToTheEmbeddedPipeline) {
  auto c = Connect();
  LoaderSpec spec = DenseSpec(8, SamplerMode::kCyclic);
  auto loader = c->OpenLoader(spec);
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  EXPECT_EQ((*loader)->size(), 100u);
  ASSERT_EQ((*loader)->streams().size(), 1u);
  EXPECT_EQ((*loader)->streams()[0].dtype, "<u4");
  for (uint64_t step = 0; step < 30; ++step) {
    auto b = TakeBatch(**loader);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(b->step(), step);
    BatchLayout layout;
    auto want = EmbeddedBytes(spec, step, &layout);
    EXPECT_EQ(BytesOf(*b, layout.total_bytes), want) << "step " << step;
    client::ArrayView v = b->Dense(0);
    EXPECT_EQ(v.shape, (std::vector<uint64_t>{8, 4}));
    EXPECT_EQ(v.dtype, "<u4");
    // Values are the records the sampler chose: record i = (i + k) * 7.
    const uint32_t* x = static_cast<const uint32_t*>(v.data);
    EXPECT_EQ(x[1] - x[0], 7u);
  }
  EXPECT_EQ((*loader)->step(), 30u);
}

TEST_F(ServerTest, RaggedAndDenseStreamsTogetherMatchEmbedded) {
  LoaderSpec spec = DenseSpec(6);
  spec.stores.push_back(MakeRaggedStore(dir_.Sub("ragged"), 100));
  auto c = Connect();
  auto loader = c->OpenLoader(spec);
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  for (uint64_t step = 0; step < 10; ++step) {
    auto b = TakeBatch(**loader);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    BatchLayout layout;
    auto want = EmbeddedBytes(spec, step, &layout);
    EXPECT_EQ(BytesOf(*b, layout.total_bytes), want);
    for (uint64_t k = 0; k < 6; ++k) {
      client::ArrayView r = b->Record(1, k);
      ASSERT_EQ(r.shape.size(), 1u);
      const int16_t* v = static_cast<const int16_t*>(r.data);
      const uint32_t* d = static_cast<const uint32_t*>(b->Dense(0).data);
      uint64_t index = d[k * 4] / 7;  // the dense record tells which index this row is
      EXPECT_EQ(r.shape[0], index % 5 + 1);
      EXPECT_EQ(v[0], static_cast<int16_t>(index));
    }
  }
}

TEST_F(ServerTest, SeekAndStartStepGiveTheSameBatchesAsEmbedded) {
  auto c = Connect();
  LoaderSpec spec = DenseSpec(4);
  spec.start_step = 17;
  auto loader = c->OpenLoader(spec).value();
  EXPECT_EQ(loader->step(), 17u);
  BatchLayout layout;
  auto b = TakeBatch(*loader).value();
  EXPECT_EQ(b.step(), 17u);
  EXPECT_EQ(BytesOf(b, 64), EmbeddedBytes(spec, 17, &layout));
  ASSERT_TRUE(SeekTo(*loader, 1000).ok());
  EXPECT_EQ(loader->step(), 1000u);
  auto s = TakeBatch(*loader).value();
  EXPECT_EQ(s.step(), 1000u);
  EXPECT_EQ(BytesOf(s, 64), EmbeddedBytes(spec, 1000, &layout));
  ASSERT_TRUE(SeekTo(*loader, 3).ok());
  EXPECT_EQ(TakeBatch(*loader).value().step(), 3u);
}

TEST_F(ServerTest, LeaseCapRefusesWithResourceExhaustedAndFreeingRestores) {
  auto c = Connect();
  LoaderSpec spec = DenseSpec();
  spec.leases = 3;
  auto loader = c->OpenLoader(spec).value();
  EXPECT_EQ(loader->lease_cap(), 3u);
  std::vector<client::Batch> held;
  for (int i = 0; i < 3; ++i) held.push_back(TakeBatch(*loader).value());
  EXPECT_EQ(loader->leases_held(), 3u);
  auto refused = TakeBatch(*loader);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(loader->step(), 3u);  // a refusal does not consume a step
  EXPECT_TRUE(WaitStat("slots_held", 3));
  held.erase(held.begin());
  auto b = TakeBatch(*loader);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->step(), 3u);
}

TEST_F(ServerTest, BatchFreedOnAnotherThreadNeverMakesTheNextNextRefused) {
  // A Batch may be destroyed on any thread. Once leases_held() shows its
  // lease gone, a Next at the cap must be granted: the release has to be
  // on the socket before the count drops, or the daemon, still counting
  // the lease, refuses the `next` with ResourceExhausted.
  auto c = Connect();
  LoaderSpec spec = DenseSpec();
  spec.leases = 1;
  auto loader = c->OpenLoader(spec).value();
  auto held = TakeBatch(*loader).value();
  for (uint64_t step = 1; step < 400; ++step) {
    std::thread freer([&] { held.Reset(); });
    while (loader->leases_held() != 0) {
    }
    auto next = TakeBatch(*loader);
    freer.join();
    ASSERT_TRUE(next.ok()) << "step " << step << ": " << next.status().ToString();
    ASSERT_EQ(next->step(), step);
    held = std::move(next).value();
  }
}

TEST_F(ServerTest, HeldBatchesStayIntactWhileTheLoaderRunsOn) {
  auto c = Connect();
  LoaderSpec spec = DenseSpec();
  spec.leases = 4;
  spec.prefetch = 2;
  auto loader = c->OpenLoader(spec).value();
  auto first = TakeBatch(*loader).value();
  auto copy = BytesOf(first, 128);
  for (int i = 0; i < 50; ++i) {
    auto b = TakeBatch(*loader);  // dropped at once: its slot is recycled
    ASSERT_TRUE(b.ok());
  }
  EXPECT_EQ(BytesOf(first, 128), copy);  // never overwritten while leased
}

TEST_F(ServerTest, ClosingTheLoaderReclaimsItsSlotsAndRing) {
  auto c = Connect();
  {
    LoaderSpec spec = DenseSpec();
    auto loader = c->OpenLoader(spec).value();
    auto b1 = TakeBatch(*loader).value();
    auto b2 = TakeBatch(*loader).value();
    // b1 and b2; b2 was taken while b1 was held, so its take waits for the
    // next frame (docs/protocol.md "Consumed positions"): step 2 is not
    // pushed yet.
    EXPECT_EQ(SettledStat("slots_held", 2), 2u);
    EXPECT_EQ(Stat("loaders"), 1u);
    EXPECT_GT(Stat("ring_bytes"), 0u);
    loader->Close();
    // Closed, yet the mapped batches remain readable here.
    EXPECT_EQ(static_cast<const uint32_t*>(b1.Dense(0).data)[1] -
                  static_cast<const uint32_t*>(b1.Dense(0).data)[0],
              7u);
    EXPECT_EQ(TakeBatch(*loader).status().code(), Status::Code::kCancelled);
  }
  EXPECT_TRUE(WaitStat("slots_held", 0));
  EXPECT_TRUE(WaitStat("loaders", 0));
  EXPECT_TRUE(WaitStat("ring_bytes", 0));
}

TEST_F(ServerTest, BatchesHeldPastCloseKeepTheirSlotsUntilFreed) {
  // Close() with batches held and more pushed: the daemon stops the loader
  // but must not reuse the held slots, and the session ends only once they
  // are freed (docs/protocol.md, `close`).
  auto c = Connect();
  LoaderSpec spec = DenseSpec();
  spec.prefetch = 2;
  for (uint64_t start = 0; start < 10; ++start) {
    spec.start_step = start;
    auto loader = c->OpenLoader(spec).value();
    std::vector<client::Batch> held;
    for (int i = 0; i < 2; ++i) held.push_back(TakeBatch(*loader).value());
    loader->Close();
    EXPECT_EQ(TakeBatch(*loader).status().code(), Status::Code::kCancelled);
    EXPECT_EQ(SeekTo(*loader, 0).code(), Status::Code::kCancelled);
    EXPECT_TRUE(WaitStat("loaders", 0));  // the loader itself is gone at once
    EXPECT_GE(Stat("slots_held"), 2u);    // ...but not the slots viewed here
    EXPECT_GT(Stat("ring_bytes"), 0u);    // whose ring stays charged
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    for (int i = 0; i < 2; ++i) {
      BatchLayout layout;
      auto want = EmbeddedBytes(spec, start + i, &layout);
      EXPECT_EQ(held[i].step(), start + i);
      EXPECT_EQ(BytesOf(held[i], layout.total_bytes), want) << "start " << start << " i " << i;
    }
    held.clear();  // the last lease ends the session
    EXPECT_TRUE(WaitStat("slots_held", 0));
    EXPECT_TRUE(WaitStat("ring_bytes", 0));
    EXPECT_TRUE(WaitStat("sessions", 0));  // (the stats query is not counted)
  }
}

TEST_F(ServerTest, RepliesEchoTheirRequestIdsAndCloseIsUnanswered) {
  auto fd = RawHello();
  ASSERT_TRUE(SendFrame(fd.get(), EncodeMessage(SeekMsg{41, 3})).ok());  // no loader: an error
  ASSERT_TRUE(SendFrame(fd.get(), EncodeMessage(StatsMsg{42})).ok());
  ASSERT_TRUE(SendFrame(fd.get(), EncodeMessage(CloseMsg{})).ok());  // no reply
  auto expect = [&](auto check) {
    auto frame = RecvFrame(fd.get()).value();
    auto m = DecodeMessage(frame.bytes).value();
    check(m);
  };
  expect([](const Message& m) {
    ASSERT_TRUE(std::holds_alternative<ErrorMsg>(m));
    EXPECT_EQ(std::get<ErrorMsg>(m).code, static_cast<uint32_t>(Status::Code::kState));
    EXPECT_EQ(std::get<ErrorMsg>(m).id, std::optional<uint64_t>(41));
    EXPECT_FALSE(std::get<ErrorMsg>(m).gen.has_value());
  });
  expect([](const Message& m) {
    ASSERT_TRUE(std::holds_alternative<StatsReplyMsg>(m));
    EXPECT_EQ(std::get<StatsReplyMsg>(m).id, 42u);
  });
  OpenMsg open;
  open.id = 43;
  open.streams = {{"x", false, false, 1}};
  open.batch_size = 1;
  auto mem = CreateMemfd("junk", 4096).value();
  int fds[] = {mem.get(), mem.get(), mem.get()};
  ASSERT_TRUE(SendFrame(fd.get(), EncodeMessage(open), fds).ok());
  expect([](const Message& m) {
    ASSERT_TRUE(std::holds_alternative<ErrorMsg>(m));
    const auto& err = std::get<ErrorMsg>(m);
    EXPECT_EQ(err.code, static_cast<uint32_t>(Status::Code::kState));
    EXPECT_NE(err.message.find("was closed"), std::string::npos) << err.message;
    EXPECT_EQ(err.id, std::optional<uint64_t>(43));  // the close itself was not answered
  });
}

TEST_F(ServerTest, StoreOpenedByTwoClientsIsMappedOnce) {
  auto c = Connect();
  LoaderSpec spec = DenseSpec();
  auto a = c->OpenLoader(spec).value();
  auto b = c->OpenLoader(spec).value();
  EXPECT_EQ(Stat("stores"), 1u);
  EXPECT_EQ(Stat("loaders"), 2u);
}

TEST_F(ServerTest, StoreErrorsComeBackWithTheirCodes) {
  auto c = Connect();
  LoaderSpec spec = DenseSpec();
  spec.stores = {dir_.Sub("nope")};
  EXPECT_EQ(c->OpenLoader(spec).status().code(), Status::Code::kNotFound);
  spec = DenseSpec();
  spec.stores.push_back(MakeDenseStore(dir_.Sub("short"), 50));
  auto st = c->OpenLoader(spec).status();
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("differ in length"), std::string::npos) << st.message();
  spec = DenseSpec();
  spec.batch_size = 0;
  EXPECT_EQ(c->OpenLoader(spec).status().code(), Status::Code::kInvalidArgument);
  // The connection is still good after refused opens.
  EXPECT_TRUE(c->OpenLoader(DenseSpec()).ok());
}

TEST_F(ServerTest, ProtocolMajorMismatchIsRefusedNamingBothVersions) {
  auto fd = ConnectSeqpacket(socket_).value();
  ASSERT_TRUE(SendFrame(fd.get(), EncodeMessage(HelloMsg{kProtocolMajor + 1, 0, "future"})).ok());
  auto reply = RecvFrame(fd.get()).value();
  auto m = DecodeMessage(reply.bytes).value();
  auto* err = std::get_if<ErrorMsg>(&m);
  ASSERT_NE(err, nullptr);
  EXPECT_EQ(err->code, static_cast<uint32_t>(Status::Code::kProtocol));
  EXPECT_NE(err->message.find(std::to_string(kProtocolMajor + 1) + ".0"), std::string::npos);
  EXPECT_NE(
      err->message.find(std::to_string(kProtocolMajor) + "." + std::to_string(kProtocolMinor)),
      std::string::npos);
  EXPECT_TRUE(HungUp(fd.get()));
}

TEST_F(ServerTest, MalformedFramesDropOnlyTheirConnection) {
  auto good = Connect();
  auto loader = good->OpenLoader(DenseSpec()).value();
  std::mt19937_64 rng(99);
  int dropped = 0;
  for (int i = 0; i < 300; ++i) {
    UniqueFd fd = (i % 3 == 0) ? ConnectSeqpacket(socket_).value() : RawHello();
    std::vector<uint8_t> junk(1 + rng() % 40);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    if (i % 5 == 0) junk = EncodeMessage(BatchMsg{});  // daemon->client type from a client
    if (i % 7 == 0 && i % 3 != 0) junk = EncodeMessage(HelloMsg{});  // a second hello
    ASSERT_TRUE(SendFrame(fd.get(), junk).ok());
    dropped += HungUp(fd.get());
  }
  EXPECT_EQ(dropped, 300);
  EXPECT_GE(Stat("protocol_errors"), 300u);
  auto b = TakeBatch(*loader);  // the good client never noticed
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->step(), 0u);
}

TEST_F(ServerTest, FdsWhereNoneAreExpectedOrMissingWhereRequiredDropTheConnection) {
  auto fd = RawHello();
  auto mem = CreateMemfd("junk", 4096).value();
  int fds[] = {mem.get()};
  ASSERT_TRUE(SendFrame(fd.get(), EncodeMessage(SeekMsg{1, 0}), fds).ok());
  EXPECT_TRUE(HungUp(fd.get()));

  auto fd2 = RawHello();
  OpenMsg open;
  open.streams = {{"x", false, false, 1}};
  open.batch_size = 1;
  ASSERT_TRUE(SendFrame(fd2.get(), EncodeMessage(open)).ok());  // announces 3 fds, sends none
  EXPECT_TRUE(HungUp(fd2.get()));

  // Non-file fds (a memfd is fine as a file, a socket is not) are refused, not mapped.
  auto fd3 = RawHello();
  auto [s1, s2] = std::pair(ConnectSeqpacket(socket_).value(), ConnectSeqpacket(socket_).value());
  int sockets[] = {s1.get(), s2.get(), s1.get()};
  ASSERT_TRUE(SendFrame(fd3.get(), EncodeMessage(open), sockets).ok());
  auto reply = RecvFrame(fd3.get()).value();
  auto m = DecodeMessage(reply.bytes).value();
  ASSERT_TRUE(std::holds_alternative<ErrorMsg>(m));
  EXPECT_EQ(std::get<ErrorMsg>(m).code, static_cast<uint32_t>(Status::Code::kInvalidArgument));
}

TEST_F(ServerTest, StaleAndForgedReleasesAreIgnored) {
  auto c = Connect();
  auto loader = c->OpenLoader(DenseSpec()).value();
  auto b = TakeBatch(*loader).value();
  EXPECT_EQ(SettledStat("slots_held", 2), 2u);  // b and step 1, pushed
  auto raw = RawHello();                        // another session cannot release our slot
  ASSERT_TRUE(SendFrame(raw.get(), EncodeMessage(ReleaseMsg{0, 1})).ok());
  ASSERT_TRUE(SendFrame(raw.get(), EncodeMessage(ReleaseMsg{12345, 999})).ok());
  EXPECT_TRUE(WaitStat("stale_releases", 2));
  EXPECT_EQ(Stat("slots_held"), 2u);
  EXPECT_EQ(Stat("batches_gathered"), 2u);
  EXPECT_EQ(Stat("releases"), 0u);
  b.Reset();  // the real release: counted; the push window (not the credit) binds
  EXPECT_TRUE(WaitStat("releases", 1));
  EXPECT_EQ(SettledStat("slots_held", 1), 1u);
  EXPECT_EQ(Stat("batches_gathered"), 2u);
  EXPECT_EQ(Stat("stale_releases"), 2u);
}

TEST_F(ServerTest, StopUnblocksClientsWithDaemonErrorAndMappedBatchesSurvive) {
  auto c = Connect();
  auto loader = c->OpenLoader(DenseSpec()).value();
  auto b = TakeBatch(*loader).value();
  auto before = BytesOf(b, 128);
  EXPECT_EQ(SettledStat("slots_held", 2), 2u);  // b and step 1, pushed
  StopDaemon();
  // What was pushed before the stop is still delivered, in order, from the
  // mapped ring; only a Next that has to wait gets the error.
  for (uint64_t step = 1; step < 2; ++step) {
    auto x = TakeBatch(*loader);
    ASSERT_TRUE(x.ok()) << "step " << step << ": " << x.status().ToString();
    EXPECT_EQ(x->step(), step);
  }
  auto next = TakeBatch(*loader);
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), Status::Code::kDaemon) << next.status().ToString();
  EXPECT_EQ(BytesOf(b, 128), before);
  EXPECT_EQ(c->Stats().status().code(), Status::Code::kDaemon);
}

TEST_F(ServerTest, AWaitThatGivesUpKeepsTheBatchForTheNextCall) {
  auto c = Connect();
  LoaderSpec spec = DenseSpec();
  auto loader = c->OpenLoader(spec).value();
  auto b0 = TakeBatch(*loader);  // warm
  ASSERT_TRUE(b0.ok());
  // A wait whose deadline has passed: whether or not the batch was already
  // there, no step is lost or repeated.
  auto given_up = loader->NextUntil(BatchSource::Clock::now());
  ASSERT_TRUE(given_up.ok()) << given_up.status().ToString();
  if (given_up->has_value()) EXPECT_EQ((*given_up)->step, 1u);
  const uint64_t expect = given_up->has_value() ? 2 : 1;
  auto b = TakeBatch(*loader);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->step(), expect);
}

TEST_F(ServerTest, ForkedChildCannotUseOrHoldTheSession) {
  auto c = Connect();
  auto loader = c->OpenLoader(DenseSpec()).value();
  auto b = TakeBatch(*loader).value();
  uint32_t first = static_cast<const uint32_t*>(b.Dense(0).data)[0];
  pid_t pid = ::fork();
  if (pid == 0) {
    auto r = TakeBatch(*loader);
    bool refused = !r.ok() && r.status().code() == Status::Code::kDaemon;
    bool readable = static_cast<const uint32_t*>(b.Dense(0).data)[0] == first;
    b.Reset();  // must not release the parent's slot
    ::_exit(refused && readable ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // b and step 1 pushed (the push window); the child released none of them.
  EXPECT_EQ(SettledStat("slots_held", 2), 2u);
  EXPECT_EQ(Stat("releases"), 0u);
  EXPECT_EQ(Stat("stale_releases"), 0u);
  auto next = TakeBatch(*loader);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->step(), 1u);
}

class CappedServerTest : public ServerTest {
 protected:
  void SetUp() override {
    daemon::Config config;
    config.sessions_per_uid = 3;
    config.memory_limit = 1 << 20;
    config.memory_per_uid = 1 << 20;
    StartDaemon(config);
  }
};

TEST_F(CappedServerTest, SessionsPerUidCapRefusesWithAClearError) {
  auto a = Connect();
  auto b = Connect();
  auto c = Connect();
  auto d = Client::Connect(socket_);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Status::Code::kResourceExhausted) << d.status().ToString();
  EXPECT_NE(d.status().message().find("sessions-per-uid"), std::string::npos);
  c.reset();  // a freed session makes room (teardown is asynchronous)
  Result<std::unique_ptr<Client>> again = Status::Daemon("not tried");
  for (int i = 0; i < 200 && !again.ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    again = Client::Connect(socket_);
  }
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

TEST_F(CappedServerTest, RingMemoryCapRefusesAnOversizedOpen) {
  auto c = Connect();
  LoaderSpec spec = DenseSpec();
  spec.ring_bytes = 4 << 20;
  Status st = c->OpenLoader(spec).status();
  EXPECT_EQ(st.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(st.message().find("memory-per-uid"), std::string::npos) << st.message();
  spec.ring_bytes = 0;
  EXPECT_TRUE(c->OpenLoader(spec).ok());
}

}  // namespace
}  // namespace loaderx::testing
