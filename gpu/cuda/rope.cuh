#pragma once
// RoPE on the GPU, in place over [n_tokens][n_heads][head_dim]; style 0 = adjacent pairs, 1 = neox.
#include <cstdint>
#include "gpu/cuda/runtime.cuh"
namespace weft::gpu::cuda {
struct rope_args {
  float* x = nullptr;
  const int32_t* positions = nullptr;
  int64_t n_tokens = 0, n_heads = 0, head_dim = 0, n_dims = 0;
  int style = 0;
  float freq_base = 10000.0f, freq_scale = 1.0f;
  const float* freq_factors = nullptr;
};
int launch_rope(const rope_args& a, stream_handle s);
}  // namespace weft::gpu::cuda
