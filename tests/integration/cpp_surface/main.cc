// Uses the public C++ API the way a trainer would, from installed headers
// only: Store (loaderx::common), Client::Connect/hello/Report, a broadcast
// group loader (loaderx/group.h) read through the BatchSource interface,
// once as a client::Batch over the view and once as the view itself.
//
//   loaderx_surface SOCKET LABELS_STORE
//
// Prints, one per line: "records N" (the store opened directly),
// "hello MAJOR.MINOR heartbeat_ms H", "counter NAME" for every counter of
// Report(), "step S v0 v1 v2 v3" for two int64 batches of 4, and finally
// "status:" followed by Report()'s status document.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "loaderx/batch_source.h"
#include "loaderx/client.h"
#include "loaderx/group.h"
#include "loaderx/status.h"
#include "loaderx/store.h"

namespace {

int Fail(const char* what, const loaderx::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: loaderx_surface SOCKET LABELS_STORE\n");
    return 2;
  }
  auto store = loaderx::Store::Open(argv[2]);
  if (!store.ok()) return Fail("open store", store.status());
  std::printf("records %llu\n", static_cast<unsigned long long>((*store)->size()));

  auto client = loaderx::Client::Connect(argv[1]);
  if (!client.ok()) return Fail("connect", client.status());
  const loaderx::client::DaemonInfo& hello = (*client)->hello();
  std::printf("hello %u.%u heartbeat_ms %u\n", hello.major, hello.minor, hello.heartbeat_ms);

  loaderx::client::LoaderSpec spec;
  spec.stores = {argv[2]};
  spec.batch_size = 4;
  spec.mode = loaderx::SamplerMode::kSequential;
  spec.group = "surface";
  spec.group_mode = loaderx::GroupMode::kBroadcast;
  spec.join = loaderx::GroupJoin::kCurrent;
  auto loader = (*client)->OpenLoader(spec);
  if (!loader.ok()) return Fail("open loader", loader.status());
  loaderx::BatchSource& source = **loader;
  auto view = source.NextUntil(loaderx::BatchSource::Clock::now() + std::chrono::seconds(10));
  if (!view.ok()) return Fail("next until", view.status());
  if (!view->has_value()) {
    std::fprintf(stderr, "next until: no batch within 10 s\n");
    return 1;
  }
  const loaderx::client::Batch first(std::move(**view), **loader);
  auto second = source.NextUntil(loaderx::BatchSource::Clock::now() + std::chrono::seconds(10));
  if (!second.ok()) return Fail("next until", second.status());
  if (!second->has_value()) {
    std::fprintf(stderr, "next until: no batch within 10 s\n");
    return 1;
  }
  const auto* a = static_cast<const int64_t*>(first.Dense(0).data);
  const auto* b = reinterpret_cast<const int64_t*>((*second)->streams[0].values);
  std::printf("step %llu %lld %lld %lld %lld\n", static_cast<unsigned long long>(first.step()),
              static_cast<long long>(a[0]), static_cast<long long>(a[1]),
              static_cast<long long>(a[2]), static_cast<long long>(a[3]));
  std::printf("step %llu %lld %lld %lld %lld\n", static_cast<unsigned long long>((*second)->step),
              static_cast<long long>(b[0]), static_cast<long long>(b[1]),
              static_cast<long long>(b[2]), static_cast<long long>(b[3]));

  auto report = (*client)->Report();
  if (!report.ok()) return Fail("report", report.status());
  for (const auto& [name, value] : report->counters) std::printf("counter %s\n", name.c_str());
  std::printf("status:\n%s\n", report->status.c_str());
  (*loader)->Close();
  return 0;
}
