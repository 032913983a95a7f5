#include "gpu/cuda/common.cuh"
#include "gpu/cuda/rope.cuh"
namespace weft::gpu::cuda {
using namespace internal;
namespace {
__global__ void rope_kernel(rope_args a) {
  const int64_t half = a.n_dims / 2;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= a.n_tokens * a.n_heads * half) return;
  const int64_t i = idx % half;
  const int64_t h = (idx / half) % a.n_heads;
  const int64_t t = idx / (half * a.n_heads);
  float theta = static_cast<float>(a.positions[t]) *
                powf(a.freq_base, -2.0f * static_cast<float>(i) / a.n_dims);
  if (a.freq_factors != nullptr) theta /= a.freq_factors[i];
  theta *= a.freq_scale;
  float sn, cs;
  sincosf(theta, &sn, &cs);
  float* x = a.x + (t * a.n_heads + h) * a.head_dim;
  const int64_t i0 = a.style == 0 ? 2 * i : i;
  const int64_t i1 = a.style == 0 ? 2 * i + 1 : i + half;
  const float x0 = x[i0], x1 = x[i1];
  x[i0] = x0 * cs - x1 * sn;
  x[i1] = x0 * sn + x1 * cs;
}
}  // namespace
int launch_rope(const rope_args& a, stream_handle s) {
  const int64_t n = a.n_tokens * a.n_heads * (a.n_dims / 2);
  if (n == 0) return 0;
  rope_kernel<<<grid_for(n, 256), 256, 0, static_cast<cudaStream_t>(s)>>>(a);
  return static_cast<int>(cudaGetLastError());
}
}  // namespace weft::gpu::cuda
