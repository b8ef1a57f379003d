// The zstd the engine is linked with (CMakeLists.txt, LOADERX_VENDORED_ZSTD).
#include <gtest/gtest.h>
#include <zstd.h>

namespace {

// A header of one zstd with the library of another would be undefined
// behaviour in every call whose struct or parameter changed between them.
TEST(Codec, TheLinkedZstdIsTheVersionItsHeaderDeclares) {
  EXPECT_EQ(ZSTD_versionNumber(), static_cast<unsigned>(ZSTD_VERSION_NUMBER));
#ifdef LOADERX_VENDORED_ZSTD
  // The vendored library (scripts/setup.sh), not Debian 12's 1.5.4.
  EXPECT_EQ(ZSTD_versionNumber(), 10507u) << ZSTD_versionString();
#endif
}

}  // namespace
