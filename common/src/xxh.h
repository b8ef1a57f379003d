// XXH3, the store's checksum (docs/format.md): libxxhash's functions, or on
// x86-64, when the installed library has them, its *_dispatch variants, which
// pick SSE2, AVX2 or AVX-512 at run time (the system library itself is built
// for baseline x86-64, so SSE2 only). Same algorithm, same hashes; about 2x
// the speed on data in cache (a writer hashes each piece right after writing
// it). LOADERX_XXH_DISPATCH is set by common/CMakeLists.txt when a program
// calling XXH3_64bits_update_dispatch links.
#pragma once

#include <xxhash.h>

#if defined(LOADERX_XXH_DISPATCH)
#include <xxh_x86dispatch.h>
#endif
