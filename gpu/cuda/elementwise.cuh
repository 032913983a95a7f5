#pragma once
// Element-wise GPU ops: SwiGLU (silu(g) * u) and addition.
#include <cstdint>
#include "gpu/cuda/runtime.cuh"
namespace weft::gpu::cuda {
int launch_swiglu(const float* g, const float* u, float* y, int64_t n, stream_handle s);
int launch_add(const float* a, const float* b, float* y, int64_t n, stream_handle s);
}  // namespace weft::gpu::cuda
