# Finds every dependency of weft on Debian 12 (+ the CUDA toolkit at /usr/local/cuda when present).
# scripts/setup.sh installs all of them.

find_package(CLI11 CONFIG REQUIRED)               # the weft binary only

if(WEFT_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)           # GTest::gtest_main, GTest::gmock
else()
  find_package(GTest CONFIG QUIET)              # weft::testing is built when GoogleTest is there
endif()
if(WEFT_BUILD_BENCH)
  find_package(benchmark CONFIG REQUIRED)       # benchmark::benchmark
endif()

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
    set(WEFT_WITH_CUDA ON)
    message(STATUS "weft: CUDA backend and NCCL transport enabled (nvcc ${CMAKE_CUDA_COMPILER_VERSION})")
  elseif(WEFT_CUDA STREQUAL "ON")
    message(FATAL_ERROR "WEFT_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
if(NOT WEFT_WITH_CUDA)
  message(STATUS "weft: CUDA backend disabled")
endif()

# The libraries' dependencies (also what an installed weft's config finds again).
include(${CMAKE_CURRENT_LIST_DIR}/weftDependencies.cmake)
# cblas.h for gpu/ (the build only: OpenBLAS's header lives in a multiarch sub-folder).
find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas-pthread openblas REQUIRED)
