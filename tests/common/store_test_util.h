// Helpers shared by the store tests: a self-removing temporary directory and
// deterministic record contents.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "loaderx/store.h"

namespace loaderx::testing {

class TempDir {
 public:
  TempDir() {
#if defined(_WIN32)  // no mkdtemp: a random name, made with create_directory (fails if taken)
    std::random_device rd;
    for (int attempt = 0; attempt < 100 && path_.empty(); ++attempt) {
      char name[32];
      std::snprintf(name, sizeof(name), "lxstore-%08x", rd());
      std::error_code ec;
      const auto p = std::filesystem::temp_directory_path() / name;
      if (std::filesystem::create_directory(p, ec)) path_ = p.generic_string();
    }
#else
    std::string tmpl = (std::filesystem::temp_directory_path() / "lxstore-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data()) ? tmpl : "";
#endif
    EXPECT_FALSE(path_.empty());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Record bytes: a compressible half (a repeated byte) and a pseudo-random half,
// so zstd stores some records compressed and others raw.
inline std::vector<uint8_t> MakeBytes(uint64_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0; i < n; ++i) {
    v[i] = i < n / 2 ? static_cast<uint8_t>(seed * 7 + i / 64) : static_cast<uint8_t>(rng());
  }
  return v;
}

inline Schema DenseSchema(const std::string& dtype, std::vector<uint64_t> shape) {
  Schema s;
  s.kind = Kind::kDense;
  s.dtype = DType::Parse(dtype).value();
  s.item_shape = std::move(shape);
  s.ndim = static_cast<uint32_t>(s.item_shape.size());
  return s;
}

inline Schema RaggedSchema(const std::string& dtype, uint32_t ndim) {
  Schema s;
  s.kind = Kind::kRagged;
  s.dtype = DType::Parse(dtype).value();
  s.ndim = ndim;
  return s;
}

inline std::string ReadFileBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline void WriteFileBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Appends `recs` to `w` in two calls, the second from the middle record on
// (so it goes on with the first call's runs): dense rows, or ragged records
// whose dims are `shapes` (ndim per record).
template <typename T>
Status AppendInTwoHalves(StoreWriter& w, const std::vector<std::vector<T>>& recs, bool dense,
                         const std::vector<uint64_t>& shapes, uint32_t ndim) {
  std::vector<T> flat;
  for (const auto& r : recs) flat.insert(flat.end(), r.begin(), r.end());
  const uint64_t half = recs.size() / 2;
  uint64_t half_values = 0;
  for (uint64_t k = 0; k < half; ++k) half_values += recs[k].size();
  if (dense) {
    Status st = w.AppendDense(flat.data(), half);
    return st.ok() ? w.AppendDense(flat.data() + half_values, recs.size() - half) : st;
  }
  Status st = w.AppendRagged(flat.data(), shapes.data(), half);
  return st.ok() ? w.AppendRagged(flat.data() + half_values, shapes.data() + half * ndim,
                                  recs.size() - half)
                 : st;
}

// A small zstd dictionary trained on structured samples.
inline std::string TestDictionary() {
  std::vector<std::string> samples;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string s = "record-header:" + std::to_string(i % 17) + ";payload=";
    for (int j = 0; j < 40; ++j) s += static_cast<char>('a' + (rng() % 6));
    samples.push_back(s);
  }
  std::vector<std::string_view> views(samples.begin(), samples.end());
  return TrainDictionary(views, 4096).value();
}

}  // namespace loaderx::testing
