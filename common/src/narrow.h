// On-disk integer narrowing of format 1.2 (docs/format.md, section 5): a
// record of a little-endian integer dtype whose values all fit in fewer bytes
// is stored with each value truncated to w in {1, 2, 4} bytes, and widened
// back on read (zero-extension for unsigned values, sign-extension for
// signed ones; a signed record without negative values is stored unsigned).
//
// Private to common/. Thread-safety: pure functions. Values are loaded and
// stored with memcpy: record buffers need not be aligned to the itemsize.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace loaderx::narrow {
namespace detail {

template <typename T>
inline T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// One branch-free, vectorizable pass over the values: `all` is the OR of
// their bits (its top bit is set iff one is negative) and `mag` the OR of
// their magnitude bits, v ^ (v >> (bits - 1)) (v for v >= 0, -v - 1 below).
// Stops early, a block at a time, once no narrower width can hold them.
// With W (an unsigned type narrower than T), the same pass also stores each
// value's low sizeof(W) bytes at dst (those before an early stop).
template <typename T>
struct Bounds {
  std::make_unsigned_t<T> all = 0, mag = 0;
};
template <typename T, typename W = void>
inline Bounds<T> ValueBounds(const uint8_t* src, uint64_t n, uint8_t* dst = nullptr) {
  using U = std::make_unsigned_t<T>;
  constexpr uint64_t kBlock = 1024;
  // Half the itemsize: the widest narrower width, unsigned and signed.
  constexpr U kTopUnsigned = U{1} << (sizeof(T) * 4);
  constexpr U kTopSigned = U{1} << (sizeof(T) * 4 - 1);
  Bounds<T> b;
  for (uint64_t k0 = 0; k0 < n; k0 += kBlock) {
    const uint64_t k1 = n - k0 < kBlock ? n : k0 + kBlock;
    U all = b.all, mag = b.mag;
    for (uint64_t k = k0; k < k1; ++k) {
      const T v = Load<T>(src + k * sizeof(T));
      all |= static_cast<U>(v);
      if constexpr (std::is_signed_v<T>) mag |= static_cast<U>(v ^ (v >> (sizeof(T) * 8 - 1)));
      if constexpr (!std::is_void_v<W>) {
        const W w = static_cast<W>(static_cast<U>(v));
        std::memcpy(dst + k * sizeof(W), &w, sizeof(W));
      }
    }
    b.all = all;
    b.mag = mag;
    if (b.all >= kTopUnsigned && (!std::is_signed_v<T> || b.mag >= kTopSigned)) break;
  }
  return b;
}

template <typename From, typename To>
inline void Convert(const uint8_t* src, uint64_t n, uint8_t* dst) {
  for (uint64_t k = 0; k < n; ++k) {
    // From int8_t this sign-extends on purpose (narrowed signed values).
    // NOLINTNEXTLINE(bugprone-signed-char-misuse)
    const To v = static_cast<To>(Load<From>(src + k * sizeof(From)));
    std::memcpy(dst + k * sizeof(To), &v, sizeof(To));
  }
}

template <typename Wide>
inline void NarrowAs(const uint8_t* src, uint64_t n, uint32_t w, uint8_t* dst) {
  using U = std::make_unsigned_t<Wide>;
  if (w == 1) Convert<U, uint8_t>(src, n, dst);
  if constexpr (sizeof(Wide) > 2) {
    if (w == 2) Convert<U, uint16_t>(src, n, dst);
  }
  if constexpr (sizeof(Wide) > 4) {
    if (w == 4) Convert<U, uint32_t>(src, n, dst);
  }
}

template <typename Wide>
inline void WidenAs(const uint8_t* src, uint64_t n, uint32_t w, bool zero_extend, uint8_t* dst) {
  using U = std::make_unsigned_t<Wide>;
  using S = std::make_signed_t<Wide>;
  if (zero_extend || std::is_unsigned_v<Wide>) {
    if (w == 1) Convert<uint8_t, U>(src, n, dst);
    if constexpr (sizeof(Wide) > 2) {
      if (w == 2) Convert<uint16_t, U>(src, n, dst);
    }
    if constexpr (sizeof(Wide) > 4) {
      if (w == 4) Convert<uint32_t, U>(src, n, dst);
    }
  } else {
    if (w == 1) Convert<int8_t, S>(src, n, dst);
    if constexpr (sizeof(Wide) > 2) {
      if (w == 2) Convert<int16_t, S>(src, n, dst);
    }
    if constexpr (sizeof(Wide) > 4) {
      if (w == 4) Convert<int32_t, S>(src, n, dst);
    }
  }
}

// Calls f(T{}) with T the integer type of (itemsize, is_signed); itemsize is
// 2, 4 or 8 (format::NarrowableDType).
template <typename F>
inline void ByType(uint32_t itemsize, bool is_signed, F&& f) {
  switch (itemsize) {
    case 2:
      is_signed ? f(int16_t{}) : f(uint16_t{});
      break;
    case 4:
      is_signed ? f(int32_t{}) : f(uint32_t{});
      break;
    default:
      is_signed ? f(int64_t{}) : f(uint64_t{});
      break;
  }
}

}  // namespace detail

// How a record is narrowed: `width` bytes per value (itemsize: not
// narrowed); `zero_extend`: a signed record whose values are all >= 0, kept
// as unsigned w-byte values (so int32 tokens below 65,536 take 2 bytes).
struct Plan {
  uint32_t width = 0;
  bool zero_extend = false;
};

// The smallest w in {1, 2, 4}, w < itemsize, holding values whose bits OR
// to `all` and magnitude bits to `mag` (detail::ValueBounds): unsigned
// values (an unsigned dtype, or a signed one with no negative value) below
// 2^(8w), else signed ones in [-2^(8w-1), 2^(8w-1)).
inline Plan PlanOf(uint64_t all, uint64_t mag, uint32_t itemsize, bool is_signed) {
  const bool negative = is_signed && (all >> (8 * itemsize - 1)) != 0;
  const uint64_t bound = negative ? mag : all;
  const int sign = negative ? 1 : 0;
  for (uint32_t w = 1; w < itemsize; w *= 2) {
    if (bound >> (8 * w - sign) == 0) return {w, is_signed && !negative};
  }
  return {itemsize, false};
}

// The Plan of the n values at src.
inline Plan Choose(const uint8_t* src, uint64_t n, uint32_t itemsize, bool is_signed) {
  uint64_t all = 0, mag = 0;
  detail::ByType(itemsize, is_signed, [&](auto t) {
    const auto b = detail::ValueBounds<decltype(t)>(src, n);
    all = b.all;
    mag = b.mag;
  });
  return PlanOf(all, mag, itemsize, is_signed);
}

// Stores the low w bytes of each of the n values at src (n * w bytes at dst).
inline void Narrow(const uint8_t* src, uint64_t n, uint32_t itemsize, uint32_t w, uint8_t* dst) {
  detail::ByType(itemsize, false, [&](auto t) { detail::NarrowAs<decltype(t)>(src, n, w, dst); });
}

// A record as a 1.2 store keeps it: its Plan, and, if a narrower width holds
// its n values, those values narrowed into *out (resized to n * width).
// `guess` (1, 2 or 4 below itemsize; else none): the width expected, e.g. the
// previous record's. The values are then narrowed to it in the same pass that
// finds the Plan, so a record of that width is read once; a record of
// another width is narrowed again. The result never depends on the guess.
inline Plan NarrowRecord(const uint8_t* src, uint64_t n, uint32_t itemsize, bool is_signed,
                         std::vector<uint8_t>* out, uint32_t guess = 0) {
  if (guess != 1 && guess != 2 && guess != 4) guess = itemsize;
  uint64_t all = 0, mag = 0;
  if (guess < itemsize) out->resize(n * guess);
  detail::ByType(itemsize, is_signed, [&](auto t) {
    using T = decltype(t);
    detail::Bounds<T> b;
    if (guess == 1) {
      b = detail::ValueBounds<T, uint8_t>(src, n, out->data());
    } else if (guess == 2 && sizeof(T) > 2) {
      b = detail::ValueBounds<T, uint16_t>(src, n, out->data());
    } else if (guess == 4 && sizeof(T) > 4) {
      b = detail::ValueBounds<T, uint32_t>(src, n, out->data());
    } else {
      b = detail::ValueBounds<T>(src, n);
    }
    all = b.all;
    mag = b.mag;
  });
  const Plan plan = PlanOf(all, mag, itemsize, is_signed);
  if (plan.width < itemsize && plan.width != guess) {
    out->resize(n * plan.width);
    Narrow(src, n, itemsize, plan.width, out->data());
  }
  return plan;
}

// The inverse: n values of w bytes at src, extended to itemsize bytes at dst
// (zero-extended for unsigned dtypes or with zero_extend, else sign-extended).
inline void Widen(const uint8_t* src, uint64_t n, uint32_t itemsize, bool is_signed, uint32_t w,
                  bool zero_extend, uint8_t* dst) {
  detail::ByType(itemsize, is_signed,
                 [&](auto t) { detail::WidenAs<decltype(t)>(src, n, w, zero_extend, dst); });
}

}  // namespace loaderx::narrow
