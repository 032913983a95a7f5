#pragma once
// Matrix product y[t][r] = w[r] . x[t] on the GPU: quantized weights (q4_0, q4_1, q8_0) with
// activations quantized to Q8_0 / Q8_1 per 32-block (as the CPU backend), f32 / f16 via cuBLAS.
#include <cstddef>
#include <cstdint>

#include "gpu/cuda/runtime.cuh"

namespace weft::gpu::cuda {

/// Arguments of one matmul; all pointers are device pointers.
struct matmul_args {
  int type = 0;  ///< ggml type id of w.
  const void* w = nullptr;
  size_t row_bytes = 0;
  int64_t n_rows = 0;
  int64_t n_cols = 0;
  const float* x = nullptr;  ///< [n_tokens][n_cols]
  int64_t n_tokens = 0;
  float* y = nullptr;       ///< [n_tokens][n_rows]
  void* scratch = nullptr;  ///< >= matmul_scratch_bytes(...)
};

/// Scratch bytes a matmul of this shape needs.
size_t matmul_scratch_bytes(int type, int64_t n_cols, int64_t n_tokens);
/// Launches the matmul on `s` (cuBLAS handle `blas` bound to the same stream). 0 or an error code.
int launch_matmul(const matmul_args& a, blas_handle blas, stream_handle s);

}  // namespace weft::gpu::cuda
