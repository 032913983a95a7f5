#pragma once
// Shared device-side helpers of the CUDA kernels. Included by .cu files only.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace weft::gpu::cuda::internal {

__device__ inline float half_bits_to_float(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
__device__ inline uint16_t float_to_half_bits(float f) {
  return __half_as_ushort(__float2half_rn(f));
}

template <class T>
__device__ inline T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ inline int warp_sum_int(int v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Block-wide reductions for blockDim.x a multiple of 32 (<= 1024).
// In a fixed order (lanes, then warps): the same inputs give the same bits.
template <class T>
__device__ inline T block_sum(T v, T* shared32) {
  v = warp_sum(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  const int n_warps = (blockDim.x + 31) / 32;
  v = threadIdx.x < n_warps ? shared32[threadIdx.x] : T(0);
  if (warp == 0) v = warp_sum(v);
  if (threadIdx.x == 0) shared32[0] = v;
  __syncthreads();
  v = shared32[0];
  __syncthreads();
  return v;
}
__device__ inline float block_max(float v, float* shared32) {
  v = warp_max(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) shared32[warp] = v;
  __syncthreads();
  const int n_warps = (blockDim.x + 31) / 32;
  v = threadIdx.x < n_warps ? shared32[threadIdx.x] : -INFINITY;
  if (warp == 0) v = warp_max(v);
  if (threadIdx.x == 0) shared32[0] = v;
  __syncthreads();
  v = shared32[0];
  __syncthreads();
  return v;
}

inline unsigned grid_for(int64_t n, unsigned block) {
  return static_cast<unsigned>((n + block - 1) / block);
}

}  // namespace weft::gpu::cuda::internal

namespace weft::gpu::cuda::internal {
// Block layouts (same bytes as gpu/ggml_types.hpp, repeated here so .cu files include CUDA headers
// only).
struct blk_q8_0 {
  uint16_t d;
  int8_t qs[32];
};
struct blk_q8_1 {
  uint16_t d;
  uint16_t s;
  int8_t qs[32];
};
struct blk_q4_0 {
  uint16_t d;
  uint8_t qs[16];
};
struct blk_q4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
static_assert(sizeof(blk_q8_0) == 34 && sizeof(blk_q8_1) == 36 && sizeof(blk_q4_0) == 18 &&
              sizeof(blk_q4_1) == 20);
// ggml type ids used by the launchers.
enum : int { type_f32 = 0, type_f16 = 1, type_q4_0 = 2, type_q4_1 = 3, type_q8_0 = 8 };
}  // namespace weft::gpu::cuda::internal
