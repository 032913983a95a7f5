#pragma once
// Embedding lookup on the GPU: y[i] = dequantized row ids[i] (f32, f16, q8_0, q4_0, q4_1).
#include <cstddef>
#include <cstdint>
#include "gpu/cuda/runtime.cuh"
namespace weft::gpu::cuda {
int launch_get_rows(int type, const void* table, size_t row_bytes, int64_t n_cols,
                    const int32_t* ids, int64_t n, float* y, stream_handle s);
}  // namespace weft::gpu::cuda
