#include "gpu/cuda/common.cuh"
#include "gpu/cuda/rows.cuh"
namespace weft::gpu::cuda {
using namespace internal;
namespace {
__global__ void softmax_kernel(float* x, int64_t n) {
  __shared__ float red[32];
  float* r = x + blockIdx.x * n;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, r[i]);
  m = block_max(m, red);
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += (r[i] = expf(r[i] - m));
  const float inv = 1.0f / block_sum(s, red);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) r[i] *= inv;
}
__global__ void gather_kernel(const float* src, const int32_t* ids, int64_t n, int64_t dim,
                              float* dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n * dim) dst[i] = src[static_cast<int64_t>(ids[i / dim]) * dim + i % dim];
}
__global__ void scatter_kernel(const float* src, const int32_t* ids, int64_t n, int64_t dim,
                               float* dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n * dim) dst[static_cast<int64_t>(ids[i / dim]) * dim + i % dim] = src[i];
}
__global__ void weighted_sum_kernel(const float* rows, const float* w, int64_t n_tokens, int64_t k,
                                    int64_t dim, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tokens * dim) return;
  const int64_t t = i / dim, c = i % dim;
  float acc = 0.0f;
  for (int64_t j = 0; j < k; ++j) acc += rows[(t * k + j) * dim + c] * w[t * k + j];
  out[i] = acc;
}
}  // namespace
int launch_softmax(float* x, int64_t n_rows, int64_t n, stream_handle s) {
  if (n_rows == 0) return 0;
  softmax_kernel<<<static_cast<unsigned>(n_rows), 256, 0, static_cast<cudaStream_t>(s)>>>(x, n);
  return static_cast<int>(cudaGetLastError());
}
int launch_gather_rows(const float* src, const int32_t* ids, int64_t n, int64_t dim, float* dst,
                       stream_handle s) {
  if (n * dim == 0) return 0;
  gather_kernel<<<grid_for(n * dim, 256), 256, 0, static_cast<cudaStream_t>(s)>>>(src, ids, n, dim,
                                                                                  dst);
  return static_cast<int>(cudaGetLastError());
}
int launch_scatter_rows(const float* src, const int32_t* ids, int64_t n, int64_t dim, float* dst,
                        stream_handle s) {
  if (n * dim == 0) return 0;
  scatter_kernel<<<grid_for(n * dim, 256), 256, 0, static_cast<cudaStream_t>(s)>>>(src, ids, n, dim,
                                                                                   dst);
  return static_cast<int>(cudaGetLastError());
}
int launch_weighted_sum(const float* rows, const float* weights, int64_t n_tokens, int64_t k,
                        int64_t dim, float* out, stream_handle s) {
  if (n_tokens * dim == 0) return 0;
  weighted_sum_kernel<<<grid_for(n_tokens * dim, 256), 256, 0, static_cast<cudaStream_t>(s)>>>(
      rows, weights, n_tokens, k, dim, out);
  return static_cast<int>(cudaGetLastError());
}
}  // namespace weft::gpu::cuda
