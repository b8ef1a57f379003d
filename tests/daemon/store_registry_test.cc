// StoreRegistry shares a mapping only between clients that passed
// descriptors of every same file: the cross-user leak (a client passing the
// owner's meta and index with data files of its own was served the owner's
// mapped records) and its variants.
#include "store_registry.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/store_test_util.h"
#include "format.h"

namespace loaderx::daemon {
namespace {

using loaderx::testing::DenseSchema;
using loaderx::testing::MakeBytes;
using loaderx::testing::TempDir;

constexpr uint64_t kItem = 64;
constexpr uint64_t kCount = 32;

void WriteStore(const std::string& path, uint32_t shards) {
  WriteOptions o;
  o.codec = Codec::kRaw;
  o.data_shards = shards;
  auto w = StoreWriter::Create(path, DenseSchema("|u1", {kItem}), o);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::vector<uint8_t> data = MakeBytes(kItem * kCount, 11);
  ASSERT_TRUE((*w)->AppendDense(data.data(), kCount).ok());
  ASSERT_TRUE((*w)->Publish().ok());
}

UniqueFd OpenFd(const std::string& path, int flags = O_RDONLY) {
  return UniqueFd(::open(path.c_str(), flags | O_CLOEXEC));
}

StoreFiles FilesOf(const std::string& dir, uint32_t shards, const std::string& data_dir = "") {
  StoreFiles f;
  f.label = dir;
  f.meta = OpenFd(dir + "/" + format::kMetaFile);
  f.index = OpenFd(dir + "/" + format::kIndexFile);
  const std::string d = data_dir.empty() ? dir : data_dir;
  for (uint32_t i = 0; i < shards; ++i) {
    f.data.push_back(OpenFd(d + "/" + format::DataFileName(i)));
  }
  return f;
}

// A directory beside `real` that links `meta` and `index` and holds zero-filled
// data files of the same sizes: what a uid that may read only meta/index makes.
std::string ForgeWithOwnData(const TempDir& tmp, const std::string& real, uint32_t shards) {
  const std::string forged = tmp.Sub("forged");
  std::filesystem::create_directory(forged);
  std::filesystem::create_hard_link(real + "/meta", forged + "/meta");
  std::filesystem::create_hard_link(real + "/index", forged + "/index");
  for (uint32_t i = 0; i < shards; ++i) {
    const std::string name = "/" + format::DataFileName(i);
    const auto size = std::filesystem::file_size(real + name);
    UniqueFd fd(::open((forged + name).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
    EXPECT_TRUE(fd.valid());
    EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(size)), 0);
  }
  return forged;
}

std::vector<uint8_t> Record(const Store& s, uint64_t i) {
  std::vector<uint8_t> out(kItem);
  EXPECT_TRUE(s.ReadRecord(i, out.data(), out.size()).ok());
  return out;
}

TEST(StoreRegistryTest, SameFilesShareOneMapping) {
  TempDir tmp;
  WriteStore(tmp.Sub("s"), 2);
  StoreRegistry reg;
  auto a = reg.Get(FilesOf(tmp.Sub("s"), 2));
  auto b = reg.Get(FilesOf(tmp.Sub("s"), 2));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(reg.size(), 1u);
}

TEST(StoreRegistryTest, OwnDataFilesBesideLinkedMetaAreNeverServedTheOwnersRecords) {
  TempDir tmp;
  const std::string real = tmp.Sub("s");
  WriteStore(real, 2);
  const std::string forged = ForgeWithOwnData(tmp, real, 2);
  StoreRegistry reg;
  auto owner = reg.Get(FilesOf(real, 2));
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  auto attacker = reg.Get(FilesOf(forged, 2));
  // The forged data files are of the right size and the index checksums
  // hold, so the store opens, but from the attacker's own (zero) files.
  ASSERT_TRUE(attacker.ok()) << attacker.status().ToString();
  EXPECT_NE(attacker->get(), owner->get());
  EXPECT_EQ(reg.size(), 2u);
  const std::vector<uint8_t> zeros(kItem, 0);
  const std::vector<uint8_t> data = MakeBytes(kItem * kCount, 11);
  for (uint64_t i = 0; i < kCount; ++i) {
    EXPECT_EQ(Record(**attacker, i), zeros) << i;
    EXPECT_EQ(Record(**owner, i),
              std::vector<uint8_t>(data.begin() + i * kItem, data.begin() + (i + 1) * kItem));
  }
}

TEST(StoreRegistryTest, OneForeignDataShardMakesAnotherStore) {
  TempDir tmp;
  const std::string real = tmp.Sub("s");
  WriteStore(real, 2);
  const std::string forged = ForgeWithOwnData(tmp, real, 2);
  StoreRegistry reg;
  auto owner = reg.Get(FilesOf(real, 2));
  ASSERT_TRUE(owner.ok());
  StoreFiles mixed = FilesOf(real, 2);
  mixed.data[1] = OpenFd(forged + "/" + format::DataFileName(1));  // shard 0 real, shard 1 its own
  auto other = reg.Get(std::move(mixed));
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_NE(other->get(), owner->get());
}

TEST(StoreRegistryTest, FewerDataFdsThanTheMetadataListsAreRefused) {
  TempDir tmp;
  const std::string real = tmp.Sub("s");
  WriteStore(real, 2);
  StoreRegistry reg;
  auto owner = reg.Get(FilesOf(real, 2));
  ASSERT_TRUE(owner.ok());
  auto fewer = reg.Get(FilesOf(real, 1));
  ASSERT_FALSE(fewer.ok());
  EXPECT_EQ(fewer.status().code(), Status::Code::kCorruption) << fewer.status().ToString();
  EXPECT_NE(fewer.status().message().find("data files"), std::string::npos);
  auto none = reg.Get(FilesOf(real, 0));
  EXPECT_FALSE(none.ok());
}

TEST(StoreRegistryTest, OPathHandlesProveNoReadAccessAndAreRefused) {
  TempDir tmp;
  const std::string real = tmp.Sub("s");
  WriteStore(real, 1);
  StoreRegistry reg;
  auto owner = reg.Get(FilesOf(real, 1));
  ASSERT_TRUE(owner.ok());
  // O_PATH needs only search permission on the directory, not read on the file.
  StoreFiles f = FilesOf(real, 1);
  f.data[0] = OpenFd(real + "/" + format::DataFileName(0), O_PATH);
  ASSERT_TRUE(f.data[0].valid());
  auto r = reg.Get(std::move(f));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("data 0"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("not open for reading"), std::string::npos);
}

TEST(StoreRegistryTest, WriteOnlyAndNonRegularFdsAreRefusedNamingTheFile) {
  TempDir tmp;
  const std::string real = tmp.Sub("s");
  WriteStore(real, 1);
  StoreRegistry reg;
  StoreFiles w = FilesOf(real, 1);
  w.index = OpenFd(real + "/index", O_WRONLY);
  auto r1 = reg.Get(std::move(w));
  ASSERT_FALSE(r1.ok());
  EXPECT_NE(r1.status().message().find("(index)"), std::string::npos) << r1.status().ToString();
  StoreFiles d = FilesOf(real, 1);
  d.meta = OpenFd(real, O_RDONLY | O_DIRECTORY);
  auto r2 = reg.Get(std::move(d));
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("not a regular file"), std::string::npos);
}

TEST(StoreRegistryTest, KeyCoversEveryFileInOrder) {
  TempDir tmp;
  const std::string real = tmp.Sub("s");
  WriteStore(real, 3);
  auto k = StoreRegistry::KeyOf(FilesOf(real, 3));
  ASSERT_TRUE(k.ok());
  ASSERT_EQ(k->size(), 4u + 3u);                // meta, index, shapes, dict, 3 data shards
  EXPECT_EQ((*k)[2], StoreRegistry::FileId{});  // dense: no shapes
  EXPECT_EQ((*k)[3], StoreRegistry::FileId{});  // raw: no dictionary
  for (size_t i : {0u, 1u, 4u, 5u, 6u}) EXPECT_NE((*k)[i].ino, 0u) << i;
  EXPECT_NE((*k)[4], (*k)[5]);
}

}  // namespace
}  // namespace loaderx::daemon
