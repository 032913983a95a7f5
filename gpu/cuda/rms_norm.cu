#include "gpu/cuda/common.cuh"
#include "gpu/cuda/rms_norm.cuh"
namespace weft::gpu::cuda {
using namespace internal;
namespace {
__global__ void rms_norm_kernel(const float* x, const float* w, float* y, int64_t dim, float eps) {
  __shared__ float red[32];
  const float* xr = x + blockIdx.x * dim;
  float* yr = y + blockIdx.x * dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, red);
  const float scale = rsqrtf(ss / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
    yr[i] = xr[i] * scale * (w != nullptr ? w[i] : 1.0f);
}
}  // namespace
int launch_rms_norm(const float* x, const float* weight, float* y, int64_t n_rows, int64_t dim,
                    float eps, stream_handle s) {
  if (n_rows == 0) return 0;
  rms_norm_kernel<<<static_cast<unsigned>(n_rows), 256, 0, static_cast<cudaStream_t>(s)>>>(
      x, weight, y, dim, eps);
  return static_cast<int>(cudaGetLastError());
}
}  // namespace weft::gpu::cuda
