# The header-only dependencies of a cross build (cmake/mingw-w64.cmake), from
# the build machine's Debian packages, as targets named like the native
# build's: xxHash (libxxhash-dev, compiled inline: XXH_INLINE_ALL),
# msgpack-c (libmsgpack-cxx-dev) and GoogleTest built from source with the
# cross compiler (googletest, /usr/src/googletest). Only their own headers
# are copied into the build tree: adding /usr/include itself would mix the
# build machine's C library headers into the target's.
set(_xinc "${CMAKE_BINARY_DIR}/_cross_include")
foreach(_f xxhash.h msgpack.hpp msgpack)
  if(NOT EXISTS "/usr/include/${_f}")
    message(FATAL_ERROR "/usr/include/${_f} is missing: install libxxhash-dev and libmsgpack-cxx-dev")
  endif()
  file(COPY "/usr/include/${_f}" DESTINATION "${_xinc}")
endforeach()
add_library(PkgConfig::XXHASH INTERFACE IMPORTED GLOBAL)
set_target_properties(PkgConfig::XXHASH PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${_xinc}" INTERFACE_COMPILE_DEFINITIONS XXH_INLINE_ALL)
add_library(msgpackc-cxx INTERFACE IMPORTED GLOBAL)
set_target_properties(msgpackc-cxx PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${_xinc}" INTERFACE_LINK_LIBRARIES ws2_32)
if(LOADERX_BUILD_TESTS)
  set(LOADERX_GTEST_SOURCE /usr/src/googletest CACHE PATH "GoogleTest's source (Debian: googletest)")
  if(NOT EXISTS "${LOADERX_GTEST_SOURCE}/CMakeLists.txt")
    message(FATAL_ERROR "${LOADERX_GTEST_SOURCE} has no GoogleTest source: install googletest")
  endif()
  set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  add_subdirectory("${LOADERX_GTEST_SOURCE}" "${CMAKE_BINARY_DIR}/_googletest" EXCLUDE_FROM_ALL SYSTEM)
endif()
