#pragma once
// RMSNorm on the GPU: y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight (one block per row).
#include <cstdint>
#include "gpu/cuda/runtime.cuh"
namespace weft::gpu::cuda {
int launch_rms_norm(const float* x, const float* weight, float* y, int64_t n_rows, int64_t dim,
                    float eps, stream_handle s);
}  // namespace weft::gpu::cuda
