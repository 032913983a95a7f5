# The dependencies of weft's libraries, as imported targets. One file for two users: the build
# (cmake/deps.cmake includes it) and the installed package (weftConfig.cmake includes it), so a
# program built against an installed weft links exactly what weft itself was built with.
# Every dependency is a Debian 12 -dev package (docs/embedding.md lists them).
# Input: WEFT_WITH_CUDA (the CUDA backend and NCCL transport were built).

find_package(Threads REQUIRED)
find_package(OpenSSL REQUIRED)
find_package(CapnProto 0.9 CONFIG REQUIRED)     # CapnProto::capnp, capnp_generate_cpp()
find_package(ucx CONFIG REQUIRED)               # link ucx::ucp AND ucx::ucs (no transitive deps)
find_package(spdlog CONFIG REQUIRED)            # compiled spdlog::spdlog (brings fmt::fmt)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(ZLIB REQUIRED)
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)                     # BLAS::BLAS

# cpp-httplib on Debian 12 is a compiled library with a pkg-config file, no CMake config.
# The library is built with OpenSSL, zlib and Brotli support: every TU that includes httplib.h must
# see the same CPPHTTPLIB_* defines (its pkg-config cflags), or class layouts differ from the .so.
if(NOT TARGET httplib::httplib)
  find_path(HTTPLIB_INCLUDE_DIR httplib.h REQUIRED)
  find_library(HTTPLIB_LIBRARY cpp-httplib REQUIRED)
  find_library(BROTLIDEC_LIBRARY brotlidec REQUIRED)
  find_library(BROTLIENC_LIBRARY brotlienc REQUIRED)
  add_library(httplib::httplib INTERFACE IMPORTED)
  set_target_properties(httplib::httplib PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${HTTPLIB_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${HTTPLIB_LIBRARY};OpenSSL::SSL;ZLIB::ZLIB;${BROTLIDEC_LIBRARY};${BROTLIENC_LIBRARY};Threads::Threads"
    INTERFACE_COMPILE_DEFINITIONS "CPPHTTPLIB_OPENSSL_SUPPORT;CPPHTTPLIB_ZLIB_SUPPORT;CPPHTTPLIB_BROTLI_SUPPORT")
endif()

if(NOT TARGET xxHash::xxhash)
  find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
  find_library(XXHASH_LIBRARY xxhash REQUIRED)
  add_library(xxHash::xxhash INTERFACE IMPORTED)
  set_target_properties(xxHash::xxhash PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${XXHASH_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${XXHASH_LIBRARY}")
endif()

# CAF 0.17.6 ships no CMake config and no pkg-config file: wrap the libraries by hand.
if(NOT TARGET CAF::core)
  find_path(CAF_INCLUDE_DIR caf/all.hpp REQUIRED)
  find_library(CAF_CORE_LIB caf_core REQUIRED)
  find_library(CAF_IO_LIB caf_io REQUIRED)
  find_library(CAF_OPENSSL_LIB caf_openssl REQUIRED)
  add_library(CAF::core INTERFACE IMPORTED)
  set_target_properties(CAF::core PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${CAF_CORE_LIB};Threads::Threads")
  add_library(CAF::io INTERFACE IMPORTED)
  set_target_properties(CAF::io PROPERTIES INTERFACE_LINK_LIBRARIES "${CAF_IO_LIB};CAF::core")
  add_library(CAF::openssl INTERFACE IMPORTED)
  set_target_properties(CAF::openssl PROPERTIES
    INTERFACE_LINK_LIBRARIES "${CAF_OPENSSL_LIB};CAF::io;OpenSSL::SSL")
endif()

# CUDA + NCCL (only when weft was built with them): cudart and cuBLAS, never CUDA::cuda_driver.
if(WEFT_WITH_CUDA)
  find_package(CUDAToolkit REQUIRED)
  if(NOT TARGET NCCL::nccl)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} REQUIRED)
    add_library(NCCL::nccl INTERFACE IMPORTED)
    set_target_properties(NCCL::nccl PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "${NCCL_LIBRARY}")
  endif()
endif()
