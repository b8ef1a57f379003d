// On-disk integer narrowing of format 1.2 (docs/format.md, section 5): a
// record of a little-endian integer dtype whose values all fit in fewer bytes
// is stored with each value truncated to w in {1, 2, 4} bytes, and widened
// back on read (zero-extension for unsigned dtypes, sign-extension for
// signed ones).
//
// Private to common/. Thread-safety: pure functions. Values are loaded and
// stored with memcpy: record buffers need not be aligned to the itemsize.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace loaderx::narrow {
namespace detail {

template <typename T>
inline T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// OR of every value's magnitude bits: the value itself (unsigned), or
// v ^ (v >> (bits - 1)) (signed: v for v >= 0, -v - 1 below), so one
// branch-free, vectorizable pass bounds every value. Stops early, a block
// at a time, once the values need the full width.
template <typename T>
inline uint64_t MagnitudeOr(const uint8_t* src, uint64_t n) {
  using U = std::make_unsigned_t<T>;
  constexpr uint64_t kBlock = 1024;
  // The bound of the widest narrower width (half the itemsize).
  constexpr U kTop = U{1} << (sizeof(T) * 4 - (std::is_signed_v<T> ? 1 : 0));
  U acc = 0;
  for (uint64_t k0 = 0; k0 < n; k0 += kBlock) {
    const uint64_t k1 = n - k0 < kBlock ? n : k0 + kBlock;
    for (uint64_t k = k0; k < k1; ++k) {
      const T v = Load<T>(src + k * sizeof(T));
      if constexpr (std::is_signed_v<T>) {
        acc |= static_cast<U>(v ^ (v >> (sizeof(T) * 8 - 1)));
      } else {
        acc |= v;
      }
    }
    if (acc >= kTop) break;  // no narrower width can hold the record
  }
  return acc;
}

template <typename From, typename To>
inline void Convert(const uint8_t* src, uint64_t n, uint8_t* dst) {
  for (uint64_t k = 0; k < n; ++k) {
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
inline void WidenAs(const uint8_t* src, uint64_t n, uint32_t w, uint8_t* dst) {
  constexpr bool kSigned = std::is_signed_v<Wide>;
  using N1 = std::conditional_t<kSigned, int8_t, uint8_t>;
  using N2 = std::conditional_t<kSigned, int16_t, uint16_t>;
  using N4 = std::conditional_t<kSigned, int32_t, uint32_t>;
  if (w == 1) Convert<N1, Wide>(src, n, dst);
  if constexpr (sizeof(Wide) > 2) {
    if (w == 2) Convert<N2, Wide>(src, n, dst);
  }
  if constexpr (sizeof(Wide) > 4) {
    if (w == 4) Convert<N4, Wide>(src, n, dst);
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

// The smallest w in {1, 2, 4}, w < itemsize, such that every one of the n
// values at src fits in w bytes; itemsize when none does.
inline uint32_t Width(const uint8_t* src, uint64_t n, uint32_t itemsize, bool is_signed) {
  uint64_t acc = 0;
  detail::ByType(itemsize, is_signed,
                 [&](auto t) { acc = detail::MagnitudeOr<decltype(t)>(src, n); });
  const int sign = is_signed ? 1 : 0;
  for (uint32_t w = 1; w < itemsize; w *= 2) {
    if (acc >> (8 * w - sign) == 0) return w;
  }
  return itemsize;
}

// Stores the low w bytes of each of the n values at src (n * w bytes at dst).
inline void Narrow(const uint8_t* src, uint64_t n, uint32_t itemsize, uint32_t w, uint8_t* dst) {
  detail::ByType(itemsize, false, [&](auto t) { detail::NarrowAs<decltype(t)>(src, n, w, dst); });
}

// The inverse: n values of w bytes at src, extended to itemsize bytes at dst.
inline void Widen(const uint8_t* src, uint64_t n, uint32_t itemsize, bool is_signed, uint32_t w,
                  uint8_t* dst) {
  detail::ByType(itemsize, is_signed,
                 [&](auto t) { detail::WidenAs<decltype(t)>(src, n, w, dst); });
}

}  // namespace loaderx::narrow
