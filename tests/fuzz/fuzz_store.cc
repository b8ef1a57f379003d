// libFuzzer target: opening and reading a mutated store, as the daemon does
// from fds a client passed (Store::FromFiles) and as `Dense.open` does. Any
// input must end in a Status (CorruptStoreError at the Python edge) at open,
// at read or from Verify, never a crash, a hang, or a read outside a file.
//
// Input (tests/fuzz/make_seeds.py writes seeds of real stores in it):
//   u8 flags: bits 0-1 data shards - 1, bit 2 shapes file, bit 3 dictionary
//   then, for meta, index, [shapes], [dict], data 0..: u32 LE length + bytes
// Each file becomes a memfd, so nothing touches the disk.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "loaderx/store.h"

namespace {
loaderx::UniqueFd Memfd(const uint8_t* p, size_t n) {
  loaderx::UniqueFd fd(::memfd_create("fuzz", MFD_CLOEXEC));
  size_t done = 0;
  while (fd.valid() && done < n) {
    const ssize_t w = ::write(fd.get(), p + done, n - done);
    if (w <= 0) return loaderx::UniqueFd();
    done += static_cast<size_t>(w);
  }
  return fd;
}

loaderx::UniqueFd Section(const uint8_t*& p, size_t& n) {
  uint32_t len = 0;
  const size_t k = std::min<size_t>(4, n);
  std::memcpy(&len, p, k);
  p += k;
  n -= k;
  const size_t take = std::min<size_t>(len, n);
  loaderx::UniqueFd fd = Memfd(p, take);
  p += take;
  n -= take;
  return fd;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  const uint8_t* p = data + 1;
  size_t n = size - 1;
  loaderx::StoreFiles f;
  f.label = "fuzz";
  f.meta = Section(p, n);
  f.index = Section(p, n);
  if (flags & 4) f.shapes = Section(p, n);
  if (flags & 8) f.dict = Section(p, n);
  for (int i = 0; i <= (flags & 3); ++i) f.data.push_back(Section(p, n));
  auto store = loaderx::Store::FromFiles(std::move(f));
  if (!store.ok()) return 0;
  const loaderx::Store& s = **store;
  // Read up to 160 records (three groups of the 1.3 index) one by one and as
  // one gather, bounded in bytes.
  std::vector<uint64_t> indices;
  std::vector<std::vector<uint8_t>> bufs;
  uint64_t total = 0;
  for (uint64_t i = 0; i < std::min<uint64_t>(s.size(), 160); ++i) {
    auto bytes = s.RecordBytes(i);
    if (!bytes.ok() || *bytes > (uint64_t{1} << 20) || total + *bytes > (uint64_t{8} << 20))
      continue;
    total += *bytes;
    std::vector<uint8_t> out(*bytes);
    (void)s.ReadRecord(i, out.data(), out.size());
    std::vector<uint64_t> dims(std::max<uint32_t>(s.schema().ndim, 1));
    (void)s.RecordShape(i, dims.data());
    indices.push_back(i);
    bufs.push_back(std::move(out));
  }
  std::vector<void*> outs;
  for (auto& b : bufs) outs.push_back(b.data());
  (void)s.Gather(indices, outs, nullptr);
  if (s.size() <= 4096) (void)s.Verify([](uint64_t, uint64_t) {});
  // Out-of-range reads are refused, not performed.
  uint8_t one = 0;
  if (s.ReadRecord(s.size(), &one, 1).ok()) __builtin_trap();
  return 0;
}
