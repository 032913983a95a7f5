#include <cublas_v2.h>

#include "gpu/cuda/common.cuh"
#include "gpu/cuda/matmul.cuh"

namespace weft::gpu::cuda {

using namespace internal;

namespace {

// One warp per 32-element block: amax, d = amax / 127, q = round-half-even(x * 127 / amax).
template <bool WithSum>
__global__ void quantize_q8(const float* x, void* out, int64_t n_blocks_total) {
  const int64_t b = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (b >= n_blocks_total) return;
  const float v = x[b * 32 + lane];
  const float amax = warp_max(fabsf(v));
  const float d = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  const int q = __float2int_rn(v * id);
  if constexpr (WithSum) {
    auto* y = static_cast<blk_q8_1*>(out) + b;
    const int sum = warp_sum_int(q);
    y->qs[lane] = static_cast<int8_t>(q);
    if (lane == 0) {
      y->d = float_to_half_bits(d);
      y->s = float_to_half_bits(d * static_cast<float>(sum));
    }
  } else {
    auto* y = static_cast<blk_q8_0*>(out) + b;
    y->qs[lane] = static_cast<int8_t>(q);
    if (lane == 0) y->d = float_to_half_bits(d);
  }
}

__device__ inline float block_dot(const blk_q4_0& w, const blk_q8_0& a) {
  int s = 0;
  for (int j = 0; j < 16; ++j)
    s += ((w.qs[j] & 0x0F) - 8) * a.qs[j] + ((w.qs[j] >> 4) - 8) * a.qs[j + 16];
  return half_bits_to_float(w.d) * half_bits_to_float(a.d) * static_cast<float>(s);
}
__device__ inline float block_dot(const blk_q4_1& w, const blk_q8_1& a) {
  int s = 0;
  for (int j = 0; j < 16; ++j) s += (w.qs[j] & 0x0F) * a.qs[j] + (w.qs[j] >> 4) * a.qs[j + 16];
  return half_bits_to_float(w.d) * half_bits_to_float(a.d) * static_cast<float>(s) +
         half_bits_to_float(w.m) * half_bits_to_float(a.s);
}
__device__ inline float block_dot(const blk_q8_0& w, const blk_q8_0& a) {
  int s = 0;
  for (int j = 0; j < 32; ++j) s += w.qs[j] * a.qs[j];
  return half_bits_to_float(w.d) * half_bits_to_float(a.d) * static_cast<float>(s);
}

// One warp per (row, token); lanes stride over the blocks of the row.
template <class W, class A>
__global__ void matmul_quant(const void* w, size_t row_bytes, int64_t n_rows, int64_t n_blocks,
                             const void* act, int64_t n_tokens, float* y) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= n_rows * n_tokens) return;
  const int64_t r = warp % n_rows;
  const int64_t t = warp / n_rows;
  const W* wr = reinterpret_cast<const W*>(static_cast<const char*>(w) + r * row_bytes);
  const A* at = static_cast<const A*>(act) + t * n_blocks;
  float acc = 0.0f;
  for (int64_t b = lane; b < n_blocks; b += 32) acc += block_dot(wr[b], at[b]);
  acc = warp_sum(acc);
  if (lane == 0) y[t * n_rows + r] = acc;
}

__global__ void to_half(const float* x, __half* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2half_rn(x[i]);
}

}  // namespace

size_t matmul_scratch_bytes(int type, int64_t n_cols, int64_t n_tokens) {
  switch (type) {
    case type_q4_0:
    case type_q8_0:
      return static_cast<size_t>(n_cols / 32 * n_tokens) * sizeof(blk_q8_0);
    case type_q4_1:
      return static_cast<size_t>(n_cols / 32 * n_tokens) * sizeof(blk_q8_1);
    case type_f16:
      return static_cast<size_t>(n_cols * n_tokens) * sizeof(__half);
    default:
      return 0;
  }
}

int launch_matmul(const matmul_args& a, blas_handle blas, stream_handle s) {
  auto st = static_cast<cudaStream_t>(s);
  const unsigned threads = 256;
  const int64_t n_blocks = a.n_cols / 32;
  const int64_t warps = a.n_rows * a.n_tokens;
  switch (a.type) {
    case type_q4_0:
    case type_q8_0:
    case type_q4_1: {
      const int64_t qb = n_blocks * a.n_tokens;
      if (a.type == type_q4_1) {
        quantize_q8<true><<<grid_for(qb * 32, threads), threads, 0, st>>>(a.x, a.scratch, qb);
        matmul_quant<blk_q4_1, blk_q8_1><<<grid_for(warps * 32, threads), threads, 0, st>>>(
            a.w, a.row_bytes, a.n_rows, n_blocks, a.scratch, a.n_tokens, a.y);
      } else {
        quantize_q8<false><<<grid_for(qb * 32, threads), threads, 0, st>>>(a.x, a.scratch, qb);
        if (a.type == type_q4_0) {
          matmul_quant<blk_q4_0, blk_q8_0><<<grid_for(warps * 32, threads), threads, 0, st>>>(
              a.w, a.row_bytes, a.n_rows, n_blocks, a.scratch, a.n_tokens, a.y);
        } else {
          matmul_quant<blk_q8_0, blk_q8_0><<<grid_for(warps * 32, threads), threads, 0, st>>>(
              a.w, a.row_bytes, a.n_rows, n_blocks, a.scratch, a.n_tokens, a.y);
        }
      }
      return static_cast<int>(cudaGetLastError());
    }
    case type_f32: {
      // Row-major y[t][r] = sum_c w[r][c] x[t][c]  <=>  column-major Y(r, t) = W^T(r, c) X(c, t).
      const float alpha = 1.0f, beta = 0.0f;
      const cublasStatus_t r = cublasSgemm(
          static_cast<cublasHandle_t>(blas), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(a.n_rows),
          static_cast<int>(a.n_tokens), static_cast<int>(a.n_cols), &alpha,
          static_cast<const float*>(a.w), static_cast<int>(a.row_bytes / sizeof(float)), a.x,
          static_cast<int>(a.n_cols), &beta, a.y, static_cast<int>(a.n_rows));
      return r == CUBLAS_STATUS_SUCCESS ? 0 : 1000 + static_cast<int>(r);
    }
    case type_f16: {
      auto* xh = static_cast<__half*>(a.scratch);
      to_half<<<grid_for(a.n_cols * a.n_tokens, threads), threads, 0, st>>>(a.x, xh,
                                                                            a.n_cols * a.n_tokens);
      const float alpha = 1.0f, beta = 0.0f;
      const cublasStatus_t r = cublasGemmEx(
          static_cast<cublasHandle_t>(blas), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(a.n_rows),
          static_cast<int>(a.n_tokens), static_cast<int>(a.n_cols), &alpha, a.w, CUDA_R_16F,
          static_cast<int>(a.row_bytes / sizeof(__half)), xh, CUDA_R_16F,
          static_cast<int>(a.n_cols), &beta, a.y, CUDA_R_32F, static_cast<int>(a.n_rows),
          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      return r == CUBLAS_STATUS_SUCCESS ? 0 : 1000 + static_cast<int>(r);
    }
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace weft::gpu::cuda
