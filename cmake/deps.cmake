# Finds every dependency of weft on Debian 12 (+ the CUDA toolkit at /usr/local/cuda when present).
# scripts/setup.sh installs all of them.

find_package(Threads REQUIRED)
find_package(OpenSSL REQUIRED)
find_package(CapnProto 0.9 CONFIG REQUIRED)     # CapnProto::capnp, capnp_generate_cpp()
find_package(ucx CONFIG REQUIRED)               # link ucx::ucp AND ucx::ucs (no transitive deps)
find_package(spdlog CONFIG REQUIRED)            # compiled spdlog::spdlog (brings fmt::fmt)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
# cpp-httplib on Debian 12 is a compiled library with a pkg-config file, no CMake config.
find_path(HTTPLIB_INCLUDE_DIR httplib.h REQUIRED)
find_library(HTTPLIB_LIBRARY cpp-httplib REQUIRED)
add_library(httplib_dep INTERFACE)
target_include_directories(httplib_dep SYSTEM INTERFACE ${HTTPLIB_INCLUDE_DIR})
# The library is built with OpenSSL, zlib and Brotli support: every TU that includes httplib.h must
# see the same CPPHTTPLIB_* defines (its pkg-config cflags), or class layouts differ from the .so.
find_package(ZLIB REQUIRED)
find_library(BROTLIDEC_LIBRARY brotlidec REQUIRED)
find_library(BROTLIENC_LIBRARY brotlienc REQUIRED)
target_link_libraries(httplib_dep INTERFACE ${HTTPLIB_LIBRARY} OpenSSL::SSL ZLIB::ZLIB ${BROTLIDEC_LIBRARY}
                      ${BROTLIENC_LIBRARY} Threads::Threads)
target_compile_definitions(httplib_dep INTERFACE CPPHTTPLIB_OPENSSL_SUPPORT CPPHTTPLIB_ZLIB_SUPPORT
                           CPPHTTPLIB_BROTLI_SUPPORT)
add_library(httplib::httplib ALIAS httplib_dep)
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)                     # BLAS::BLAS
find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-pthread openblas REQUIRED)
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_library(XXHASH_LIBRARY xxhash REQUIRED)
add_library(xxhash_dep INTERFACE)
target_include_directories(xxhash_dep SYSTEM INTERFACE ${XXHASH_INCLUDE_DIR})
target_link_libraries(xxhash_dep INTERFACE ${XXHASH_LIBRARY})
add_library(xxHash::xxhash ALIAS xxhash_dep)

if(WEFT_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)           # GTest::gtest_main, GTest::gmock
endif()
if(WEFT_BUILD_BENCH)
  find_package(benchmark CONFIG REQUIRED)       # benchmark::benchmark
endif()

# CAF 0.17.6 ships no CMake config and no pkg-config file: wrap the libraries by hand.
find_path(CAF_INCLUDE_DIR caf/all.hpp REQUIRED)
find_library(CAF_CORE_LIB caf_core REQUIRED)
find_library(CAF_IO_LIB caf_io REQUIRED)
find_library(CAF_OPENSSL_LIB caf_openssl REQUIRED)
add_library(caf_core_dep INTERFACE)
target_include_directories(caf_core_dep SYSTEM INTERFACE ${CAF_INCLUDE_DIR})
target_link_libraries(caf_core_dep INTERFACE ${CAF_CORE_LIB} Threads::Threads)
add_library(CAF::core ALIAS caf_core_dep)
add_library(caf_io_dep INTERFACE)
target_link_libraries(caf_io_dep INTERFACE ${CAF_IO_LIB} CAF::core)
add_library(CAF::io ALIAS caf_io_dep)
add_library(caf_openssl_dep INTERFACE)
target_link_libraries(caf_openssl_dep INTERFACE ${CAF_OPENSSL_LIB} CAF::io OpenSSL::SSL)
add_library(CAF::openssl ALIAS caf_openssl_dep)

# CUDA + NCCL: compiled and linked when nvcc is present; nothing here can run them.
set(WEFT_WITH_CUDA OFF)
if(NOT WEFT_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)          # "native" fails without a GPU
    endif()
    if(CMAKE_VERSION VERSION_LESS 3.26)         # cmake 3.25 does not know CUDA C++20
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)          # CUDA::cudart, CUDA::cublas — never CUDA::cuda_driver
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} REQUIRED)
    add_library(nccl_dep INTERFACE)
    target_include_directories(nccl_dep SYSTEM INTERFACE ${NCCL_INCLUDE_DIR})
    target_link_libraries(nccl_dep INTERFACE ${NCCL_LIBRARY})
    add_library(NCCL::nccl ALIAS nccl_dep)
    set(WEFT_WITH_CUDA ON)
    message(STATUS "weft: CUDA backend and NCCL transport enabled (nvcc ${CMAKE_CUDA_COMPILER_VERSION})")
  elseif(WEFT_CUDA STREQUAL "ON")
    message(FATAL_ERROR "WEFT_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
if(NOT WEFT_WITH_CUDA)
  message(STATUS "weft: CUDA backend disabled")
endif()
