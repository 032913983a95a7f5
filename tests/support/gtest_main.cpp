// The main() of every weft GoogleTest binary: like gtest_main, but a binary in which a case was
// skipped (GTEST_SKIP) and none failed exits 77, which CTest reports as skipped (SKIP_RETURN_CODE)
// instead of passed. A check that did not run is never counted as a pass.

#include <gtest/gtest.h>

#include "gpu/cpu/blas_kernels.hpp"

int main(int argc, char** argv) {
  // The same OpenBLAS kernels as the weft processes the tests start (gpu/cpu/blas_kernels.hpp).
  weft::gpu::cpu::select_blas_kernels(argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  if (rc != 0) return rc;
  return ::testing::UnitTest::GetInstance()->skipped_test_count() > 0 ? 77 : 0;
}
