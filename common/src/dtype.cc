// DType parsing, codec names and schema helpers (store.h).
#include <array>
#include <cctype>
#include <string>

#include "loaderx/store.h"

namespace loaderx {
namespace {

// Bytes per element at most: NumPy's own limit for flexible dtypes is INT_MAX.
constexpr uint64_t kMaxItemSize = 0x7fffffff;

bool IsValidTimeUnit(std::string_view u) {
  // NumPy datetime units, optionally prefixed by a multiplier ("10s").
  size_t i = 0;
  while (i < u.size() && std::isdigit(static_cast<unsigned char>(u[i]))) ++i;
  if (i > 0 && u[0] == '0') return false;
  std::string_view unit = u.substr(i);
  static constexpr std::array<std::string_view, 13> kUnits = {
      "Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs", "as"};
  for (auto k : kUnits) {
    if (unit == k) return true;
  }
  return false;
}

}  // namespace

Result<DType> DType::Parse(std::string_view s) {
  auto bad = [&](const std::string& why) {
    return Status::SchemaError("unsupported dtype '" + std::string(s) + "': " + why);
  };
  if (s.empty()) return bad("empty");
  char order = 0;
  size_t p = 0;
  if (s[0] == '<' || s[0] == '>' || s[0] == '|' || s[0] == '=') order = s[p++];
  if (p >= s.size()) return bad("no type code");
  const char kind = s[p++];
  size_t q = p;
  while (q < s.size() && std::isdigit(static_cast<unsigned char>(s[q]))) ++q;
  if (q == p) return bad("no item size");
  if (q - p > 9) return bad("item size too large");
  // The number is the element count for 'U' (UCS-4 code points), bytes otherwise.
  const uint64_t count = std::stoull(std::string(s.substr(p, q - p)));
  const uint64_t itemsize64 = kind == 'U' ? count * 4 : count;
  if (itemsize64 > kMaxItemSize) return bad("item size too large");
  const uint32_t itemsize = static_cast<uint32_t>(itemsize64);
  std::string_view rest = s.substr(q);

  bool ok_size = false;
  switch (kind) {
    case 'b':
      ok_size = itemsize == 1;
      break;
    case 'i':
    case 'u':
      ok_size = itemsize == 1 || itemsize == 2 || itemsize == 4 || itemsize == 8;
      break;
    case 'f':
      ok_size = itemsize == 2 || itemsize == 4 || itemsize == 8 || itemsize == 16;
      break;
    case 'c':
      ok_size = itemsize == 8 || itemsize == 16 || itemsize == 32;
      break;
    case 'M':
    case 'm':
      ok_size = itemsize == 8;
      break;
    case 'O':
      return bad("object dtypes hold pointers and cannot be stored");
    case 'S':  // fixed-width bytes, text and unstructured void: any width
    case 'U':
    case 'V':
      ok_size = true;
      break;
    default:
      return bad(std::string("unknown type code '") + kind + "'");
  }
  if (itemsize == 0) return bad("zero itemsize");
  if (!ok_size) return bad("invalid item size for kind '" + std::string(1, kind) + "'");
  if (kind == 'M' || kind == 'm') {
    if (!rest.empty()) {
      if (rest.size() < 3 || rest.front() != '[' || rest.back() != ']' ||
          !IsValidTimeUnit(rest.substr(1, rest.size() - 2))) {
        return bad("bad datetime unit");
      }
    }
  } else if (!rest.empty()) {
    return bad("trailing characters");
  }

  // NumPy's dtype.str: '|' where byte order means nothing (one-byte
  // numbers, bytes, void), else '<' or '>' ('=' is this little-endian host).
  char canonical = order == '>' ? '>' : '<';
  if (kind == 'S' || kind == 'V' || (kind != 'U' && itemsize == 1)) canonical = '|';
  DType d;
  d.kind = kind;
  d.itemsize = itemsize;
  d.str = std::string(1, canonical) + kind + std::to_string(count) + std::string(rest);
  return d;
}

Result<Codec> ParseCodec(std::string_view name) {
  if (name == "raw") return Codec::kRaw;
  if (name == "zstd") return Codec::kZstd;
  if (name == "zstd_dict") return Codec::kZstdDict;
  return Status::InvalidArgument("unknown codec '" + std::string(name) +
                                 "' (expected 'raw', 'zstd' or 'zstd_dict')");
}

const char* CodecName(Codec c) {
  switch (c) {
    case Codec::kRaw:
      return "raw";
    case Codec::kZstd:
      return "zstd";
    case Codec::kZstdDict:
      return "zstd_dict";
  }
  return "?";
}

uint64_t Schema::DenseItemBytes() const {
  uint64_t n = dtype.itemsize;
  for (uint64_t d : item_shape) n *= d;  // overflow rejected by writer/reader validation
  return n;
}

}  // namespace loaderx
