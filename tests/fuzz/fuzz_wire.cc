// libFuzzer target: the wire decoder (what loaderxd and the client run on
// every frame a peer sends). Any input must decode or fail with a Status,
// never crash, hang or allocate beyond the decoder caps. A frame that
// decodes must re-encode to a frame that decodes to the same bytes again
// (encode(decode(x)) is a fixed point), so the two directions agree.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "loaderx/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto m = loaderx::DecodeMessage(std::span<const uint8_t>(data, size));
  if (!m.ok()) return 0;
  const std::vector<uint8_t> once = loaderx::EncodeMessage(*m);
  auto again = loaderx::DecodeMessage(once);
  if (!again.ok()) std::abort();  // we encoded a frame we refuse
  if (loaderx::EncodeMessage(*again) != once) std::abort();
  return 0;
}
