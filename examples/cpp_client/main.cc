// A C++ training-side consumer of loaderxd, built against an installed
// loaderx (`cmake --install`, then find_package(loaderx)).
//
//   loaderx_cpp_client SOCKET BATCH STEPS [--seed S] [--mode iid|cyclic|sequential]
//                      [--start S] STORE...
//
// Prints one line per step: "step <s> <stream> <fnv1a-64 of its bytes>", the
// bytes being the dense (B, *item_shape) array, or for a ragged stream every
// record's bytes in order. The Python side prints the same digest
// (tests/integration/test_cpp_client.py compares them), so this is also a
// check that both clients see byte-identical batches.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "loaderx/client.h"

namespace {

uint64_t Fnv1a(uint64_t h, const void* data, uint64_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (uint64_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001B3ULL;
  }
  return h;
}

uint64_t Bytes(const loaderx::client::ArrayView& v) {
  uint64_t n = v.itemsize;
  for (uint64_t d : v.shape) n *= d;
  return n;
}

int Usage(const char* why) {
  std::fprintf(stderr,
               "error: %s\nusage: loaderx_cpp_client SOCKET BATCH STEPS [--seed S] "
               "[--mode iid|cyclic|sequential] [--start S] STORE...\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) return Usage("missing arguments");
  loaderx::client::LoaderSpec spec;
  const std::string socket = argv[1];
  spec.batch_size = std::strtoull(argv[2], nullptr, 10);
  const uint64_t steps = std::strtoull(argv[3], nullptr, 10);
  for (int i = 4; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--seed" || a == "--mode" || a == "--start") && i + 1 >= argc) {
      return Usage((a + " needs a value").c_str());
    }
    if (a == "--seed") {
      spec.seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--start") {
      spec.start_step = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--mode") {
      const std::string m = argv[++i];
      if (m == "iid") {
        spec.mode = loaderx::SamplerMode::kIID;
      } else if (m == "cyclic") {
        spec.mode = loaderx::SamplerMode::kCyclic;
      } else if (m == "sequential") {
        spec.mode = loaderx::SamplerMode::kSequential;
      } else {
        return Usage(("unknown mode " + m).c_str());
      }
    } else {
      spec.stores.push_back(a);
    }
  }
  if (spec.stores.empty()) return Usage("no store given");

  auto client = loaderx::Client::Connect(socket);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  auto loader = (*client)->OpenLoader(spec);
  if (!loader.ok()) {
    std::fprintf(stderr, "open: %s\n", loader.status().ToString().c_str());
    return 1;
  }
  for (uint64_t s = 0; s < steps; ++s) {
    // The seam's wait (batch_source.h): a batch, or nullopt once the deadline passed.
    auto view = (*loader)->NextUntil(loaderx::BatchSource::Clock::now() + std::chrono::seconds(60));
    if (!view.ok() || !view->has_value()) {
      std::fprintf(stderr, "next: %s\n",
                   view.ok() ? "no batch within 60 s" : view.status().ToString().c_str());
      return 1;
    }
    const loaderx::client::Batch batch(std::move(**view), **loader);
    for (size_t j = 0; j < batch.num_streams(); ++j) {
      uint64_t h = 0xCBF29CE484222325ULL;
      if ((*loader)->streams()[j].kind == loaderx::Kind::kDense) {
        const auto v = batch.Dense(j);
        h = Fnv1a(h, v.data, Bytes(v));
      } else {
        for (uint64_t k = 0; k < batch.batch_size(); ++k) {
          const auto v = batch.Record(j, k);
          h = Fnv1a(h, v.data, Bytes(v));
        }
      }
      std::printf("step %llu %zu %016llx\n", static_cast<unsigned long long>(batch.step()), j,
                  static_cast<unsigned long long>(h));
    }
  }
  (*loader)->Close();
  return 0;
}
