// Huge pages for store data (common/src/huge_pages.h): a freshly written
// store's data files are mapped with 2 MiB pages (FilePmdMapped in
// /proc/self/smaps) after an open and a gather, and so is a store read back
// cold, through the MADV_HUGEPAGE advice; the advice rule itself.
//
// Whether the kernel and the file system keep page cache in 2 MiB folios is
// probed first (one 4 MiB file written by one aligned pwrite, mapped,
// touched): where they do not, the mapping tests skip, naming the reason;
// where they do, our store must be PMD-mapped or the test fails.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

#include "huge_pages.h"
#include "loaderx/fd.h"
#include "loaderx/store.h"
#include "store_test_util.h"

namespace loaderx {
namespace {

using testing::MakeBytes;
using testing::TempDir;

constexpr uint64_t kHuge = hugepages::kBytes;

// kB of FilePmdMapped over this process's mappings of files whose path
// contains `part`.
uint64_t FilePmdMappedKb(const std::string& part) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool ours = false;
  uint64_t kb = 0;
  while (std::getline(smaps, line)) {
    // A mapping's header: "start-end perms offset dev inode [path]".
    const size_t dash = line.find('-');
    if (dash != std::string::npos && dash > 0 &&
        line.find_first_not_of("0123456789abcdef") == dash) {
      ours = line.find(part) != std::string::npos;
      continue;
    }
    if (ours && line.rfind("FilePmdMapped:", 0) == 0) {
      uint64_t n = 0;
      std::istringstream(line.substr(14)) >> n;
      kb += n;
    }
  }
  return kb;
}

// Drops the clean page cache of `path` (its pages were synced).
void DropCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  ::close(fd);
}

// Empty if this kernel and file system map a file written in whole 2 MiB
// pieces with 2 MiB pages; else why not.
std::string HugePageSupport(const std::string& dir) {
  const std::string path = dir + "/probe";
  const std::vector<uint8_t> bytes = MakeBytes(2 * kHuge, 1);
  {
    auto fd = OpenFile(path, O_RDWR | O_CREAT | O_EXCL);
    if (!fd.ok()) return fd.status().ToString();
    if (::pwrite(fd->get(), bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) {
      return "probe write failed";
    }
    auto map = MappedRegion::Map(fd->get(), bytes.size());
    if (!map.ok()) return map.status().ToString();
    if (!map->AdviseHugePages().ok()) return "madvise(MADV_HUGEPAGE) refused (no THP)";
    uint64_t sum = 0;
    for (uint64_t off = 0; off < map->size(); off += 4096) sum += map->data()[off];
    EXPECT_EQ(sum > 0, true);
    if (FilePmdMappedKb("/probe") == 0) {
      return "a 4 MiB file written by one aligned pwrite is not mapped with 2 MiB pages here "
             "(no large folios in this file system's page cache, or THP disabled)";
    }
  }
  ::unlink(path.c_str());
  return "";
}

// A dense raw store of 784-byte records, 12 MB over 2 data files (6 MB,
// so two whole huge pages each).
constexpr uint64_t kItem = 784, kCount = 16000;

std::vector<uint8_t> Values() { return MakeBytes(kItem * kCount, 5); }

void WriteStore(const std::string& path) {
  WriteOptions o;
  o.huge_page_writes = true;
  o.data_shards = 2;
  auto w = StoreWriter::Create(path, testing::DenseSchema("|u1", {kItem}), o);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const auto v = Values();
  ASSERT_TRUE((*w)->AppendDense(v.data(), kCount).ok());
  ASSERT_TRUE((*w)->Publish().ok());
}

// Gathers every record in a random order, in batches of 256, and checks them.
void GatherAll(const Store& s) {
  std::vector<uint64_t> order(kCount);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(9));
  const auto v = Values();
  std::vector<uint8_t> out(256 * kItem);
  for (size_t first = 0; first < kCount; first += 256) {
    const size_t n = std::min<size_t>(256, kCount - first);
    std::vector<void*> outs(n);
    for (size_t k = 0; k < n; ++k) outs[k] = out.data() + k * kItem;
    ASSERT_TRUE(s.Gather({order.data() + first, n}, outs, nullptr).ok());
    for (size_t k = 0; k < n; ++k) {
      ASSERT_EQ(std::memcmp(outs[k], v.data() + order[first + k] * kItem, kItem), 0);
    }
  }
}

TEST(StoreHugePageTest, AFreshlyWrittenStoreIsMappedWithHugePagesAfterAGather) {
  TempDir dir;
  const std::string why = HugePageSupport(dir.path());
  if (!why.empty()) GTEST_SKIP() << why;
  WriteStore(dir.Sub("s"));
  auto s = Store::Open(dir.Sub("s"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  GatherAll(**s);
  // The first 4 MiB of each 6 MB data file went out as whole huge pages.
  EXPECT_GE(FilePmdMappedKb(dir.Sub("s/data-")), 2 * 2 * kHuge / 1024);
}

TEST(StoreHugePageTest, AStoreReadBackColdIsMappedWithHugePagesThroughTheAdvice) {
  TempDir dir;
  const std::string why = HugePageSupport(dir.path());
  if (!why.empty()) GTEST_SKIP() << why;
  auto avail = hugepages::MemAvailableBytes();
  ASSERT_TRUE(avail.ok()) << avail.status().ToString();
  if (!hugepages::ShouldAdvise(3 * kHuge, kItem * kCount, *avail)) {
    GTEST_SKIP() << "MemAvailable too low for the advice on a 12 MB store";
  }
  WriteStore(dir.Sub("s"));
  // Out of the page cache: without the advice a fault reads 4 KiB pages
  // (and read-around), which nothing maps with 2 MiB pages.
  DropCache(dir.Sub("s/data-000"));
  DropCache(dir.Sub("s/data-001"));
  auto s = Store::Open(dir.Sub("s"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  GatherAll(**s);
  EXPECT_GE(FilePmdMappedKb(dir.Sub("s/data-")), 2 * 2 * kHuge / 1024);
}

TEST(StoreHugePageTest, TheAdviceIsForFilesOfAHugePageInStoresThatFitAQuarterOfMemAvailable) {
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  EXPECT_TRUE(hugepages::ShouldAdvise(kHuge, kHuge, 4 * kHuge));
  EXPECT_FALSE(hugepages::ShouldAdvise(kHuge - 1, 4 * kHuge, 64 * kGiB));  // below one huge page
  EXPECT_TRUE(hugepages::ShouldAdvise(kGiB, 4 * kGiB, 16 * kGiB));         // a quarter
  EXPECT_FALSE(hugepages::ShouldAdvise(kGiB, 4 * kGiB + 1, 16 * kGiB));
  EXPECT_FALSE(hugepages::ShouldAdvise(kGiB, kGiB, 0));  // MemAvailable unknown
  // A store larger than RAM, whatever its files' sizes.
  EXPECT_FALSE(hugepages::ShouldAdvise(kGiB, 64 * kGiB, 24 * kGiB));
}

TEST(StoreHugePageTest, MemAvailableIsReadFromProcMeminfo) {
  auto avail = hugepages::MemAvailableBytes();
  ASSERT_TRUE(avail.ok()) << avail.status().ToString();
  EXPECT_GT(*avail, uint64_t{0});
  EXPECT_EQ(*avail % 1024, 0u);  // kB in the file
}

}  // namespace
}  // namespace loaderx
