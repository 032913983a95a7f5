#pragma once
// Row movement and mixing on the GPU: softmax, gather, scatter, weighted sum (MoE).
#include <cstdint>
#include "gpu/cuda/runtime.cuh"
namespace weft::gpu::cuda {
int launch_softmax(float* x, int64_t n_rows, int64_t n, stream_handle s);
int launch_gather_rows(const float* src, const int32_t* ids, int64_t n, int64_t dim, float* dst,
                       stream_handle s);
int launch_scatter_rows(const float* src, const int32_t* ids, int64_t n, int64_t dim, float* dst,
                        stream_handle s);
int launch_weighted_sum(const float* rows, const float* weights, int64_t n_tokens, int64_t k,
                        int64_t dim, float* out, stream_handle s);
}  // namespace weft::gpu::cuda
