// An in-process loaderxd on a temporary socket, plus small stores, for the
// daemon and client tests.
#pragma once

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/batch_test_util.h"
#include "common/source_test_util.h"
#include "common/store_test_util.h"
#include "config.h"
#include "loaderx/client.h"
#include "loaderx/loader.h"
#include "loaderx/memfd.h"
#include "loaderx/store.h"
#include "loaderx/unix_socket.h"
#include "loaderx/wire.h"
#include "server.h"

namespace loaderx::testing {

// Dense store of n records of shape (4,) uint32 where record i = [i, i+1, i+2, i+3] * 7.
inline std::string MakeDenseStore(const std::string& path, uint64_t n, Codec codec = Codec::kRaw) {
  WriteOptions opt;
  opt.codec = codec;
  opt.data_shards = 2;
  auto w = StoreWriter::Create(path, DenseSchema("<u4", {4}), opt);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  std::vector<uint32_t> data(n * 4);
  for (uint64_t i = 0; i < n * 4; ++i) data[i] = static_cast<uint32_t>((i / 4 + i % 4) * 7);
  EXPECT_TRUE((*w)->AppendDense(data.data(), n).ok());
  EXPECT_TRUE((*w)->Publish().ok());
  return path;
}

// Ragged store of n int16 records; record i has i % 5 + 1 values, all = i.
inline std::string MakeRaggedStore(const std::string& path, uint64_t n) {
  WriteOptions opt;
  opt.codec = Codec::kZstd;
  opt.data_shards = 1;
  auto w = StoreWriter::Create(path, RaggedSchema("<i2", 1), opt);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  std::vector<int16_t> values;
  std::vector<uint64_t> shapes;
  for (uint64_t i = 0; i < n; ++i) {
    shapes.push_back(i % 5 + 1);
    for (uint64_t k = 0; k <= i % 5; ++k) values.push_back(static_cast<int16_t>(i));
  }
  EXPECT_TRUE((*w)->AppendRagged(values.data(), shapes.data(), n).ok());
  EXPECT_TRUE((*w)->Publish().ok());
  return path;
}

// The embedded pipeline's batch of `step` for `spec` (its rank/world too):
// the reference every daemon batch is compared with. `layout` is where its
// sections lie in its memory (loader.h), planned from the sampler's indices.
struct EmbeddedRef {
  BatchView view;
  BatchLayout layout;
  const uint8_t* base() const { return MemoryOf(view).data(); }
};

inline EmbeddedRef EmbeddedBatch(const client::LoaderSpec& spec, uint64_t step) {
  std::vector<std::shared_ptr<const Store>> streams;
  for (auto& p : spec.stores) streams.push_back(Store::Open(p).value());
  SamplerSpec ss{streams[0]->size(), spec.batch_size, spec.mode, spec.seed,
                 spec.rank,          spec.world_size, {}};
  PipelineOptions opt;
  opt.start_step = step;
  opt.prefetch = 1;
  opt.num_threads = 1;
  const Sampler sampler = Sampler::Make(ss).value();
  std::vector<uint64_t> indices(sampler.spec().batch_size);
  sampler.Fill(step, indices.data());
  EmbeddedRef ref;
  ref.view = NextBatch(*Pipeline::Create(streams, ss, opt).value()).value();
  ref.layout = PlanBatch(streams, indices).value();
  return ref;
}

class DaemonFixture : public ::testing::Test {
 protected:
  void SetUp() override { StartDaemon(daemon::Config{}); }
  void TearDown() override { StopDaemon(); }

  void StartDaemon(daemon::Config config) {
    socket_ = dir_.Sub("d.sock");
    config.socket_path = socket_;
    config.threads = 2;
    if (config.memory_per_uid == 0) config.memory_per_uid = config.memory_limit;
    daemon::SetLogLevel(daemon::LogLevel::kError);
    auto l = ListenSeqpacket(socket_, 0660);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    server_ = std::make_unique<daemon::Server>(config, std::move(l).value());
    thread_ = std::thread([this] { (void)server_->Run(false); });
  }
  void StopDaemon() {
    if (!server_) return;
    server_->Stop();
    thread_.join();
    server_.reset();
    ::unlink(socket_.c_str());
  }

  std::unique_ptr<Client> Connect() {
    auto c = Client::Connect(socket_);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  uint64_t Stat(const std::string& name) {
    auto c = Client::Connect(socket_);
    if (!c.ok()) return UINT64_MAX;
    auto s = (*c)->Stats();
    if (!s.ok()) return UINT64_MAX;
    for (auto& [k, v] : *s) {
      if (k == name) return v;
    }
    return UINT64_MAX;
  }

  // Polls a stat until it equals `want` (teardown is asynchronous), up to 5 s.
  bool WaitStat(const std::string& name, uint64_t want) {
    for (int i = 0; i < 500; ++i) {
      if (Stat(name) == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  // The settled value of a stat that pushes move asynchronously: polls until
  // it equals `want` (up to 5 s), then reads it again after the daemon had
  // time to push more, so a value that only passes through `want` fails.
  uint64_t SettledStat(const std::string& name, uint64_t want) {
    if (!WaitStat(name, want)) return Stat(name);
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    return Stat(name);
  }

  // Polls a stat until it is at least `want` (pushes are asynchronous), up to 5 s.
  bool WaitStatAtLeast(const std::string& name, uint64_t want) {
    for (int i = 0; i < 500; ++i) {
      const uint64_t v = Stat(name);
      if (v != UINT64_MAX && v >= want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  // A raw connection that has said hello.
  UniqueFd RawHello() {
    auto fd = ConnectSeqpacket(socket_);
    EXPECT_TRUE(fd.ok());
    auto bytes = EncodeMessage(HelloMsg{kProtocolMajor, kProtocolMinor, "raw"});
    EXPECT_TRUE(SendFrame(fd->get(), bytes).ok());
    auto reply = RecvFrame(fd->get());
    EXPECT_TRUE(reply.ok());
    auto m = DecodeMessage(reply->bytes);
    EXPECT_TRUE(m.ok() && std::holds_alternative<HelloOkMsg>(*m));
    return std::move(fd).value();
  }

  // True if the daemon hung up on `fd` within 2 s.
  static bool HungUp(int fd) {
    for (int i = 0; i < 200; ++i) {
      auto f = RecvFrame(fd, kMaxFrameBytes, kMaxFrameFds, true);
      if (!f.ok() || f->eof) return true;
      if (f->would_block) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  TempDir dir_;
  std::string socket_;
  std::unique_ptr<daemon::Server> server_;
  std::thread thread_;
};

}  // namespace loaderx::testing
