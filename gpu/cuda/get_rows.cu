#include "gpu/cuda/common.cuh"
#include "gpu/cuda/get_rows.cuh"
namespace weft::gpu::cuda {
using namespace internal;
namespace {
__global__ void get_rows_kernel(int type, const void* table, size_t row_bytes, int64_t n_cols,
                                const int32_t* ids, float* y) {
  const char* row =
      static_cast<const char*>(table) + static_cast<size_t>(ids[blockIdx.x]) * row_bytes;
  float* out = y + blockIdx.x * n_cols;
  for (int64_t c = threadIdx.x; c < n_cols; c += blockDim.x) {
    const int64_t b = c / 32, j = c % 32;
    float v = 0.0f;
    switch (type) {
      case type_f32:
        v = reinterpret_cast<const float*>(row)[c];
        break;
      case type_f16:
        v = half_bits_to_float(reinterpret_cast<const uint16_t*>(row)[c]);
        break;
      case type_q8_0: {
        const blk_q8_0& q = reinterpret_cast<const blk_q8_0*>(row)[b];
        v = static_cast<float>(q.qs[j]) * half_bits_to_float(q.d);
        break;
      }
      case type_q4_0: {
        const blk_q4_0& q = reinterpret_cast<const blk_q4_0*>(row)[b];
        const int n = j < 16 ? (q.qs[j] & 0x0F) : (q.qs[j - 16] >> 4);
        v = static_cast<float>(n - 8) * half_bits_to_float(q.d);
        break;
      }
      case type_q4_1: {
        const blk_q4_1& q = reinterpret_cast<const blk_q4_1*>(row)[b];
        const int n = j < 16 ? (q.qs[j] & 0x0F) : (q.qs[j - 16] >> 4);
        v = static_cast<float>(n) * half_bits_to_float(q.d) + half_bits_to_float(q.m);
        break;
      }
      default:
        break;
    }
    out[c] = v;
  }
}
}  // namespace
int launch_get_rows(int type, const void* table, size_t row_bytes, int64_t n_cols,
                    const int32_t* ids, int64_t n, float* y, stream_handle s) {
  if (type != type_f32 && type != type_f16 && type != type_q8_0 && type != type_q4_0 &&
      type != type_q4_1) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  if (n == 0) return 0;
  get_rows_kernel<<<static_cast<unsigned>(n), 128, 0, static_cast<cudaStream_t>(s)>>>(
      type, table, row_bytes, n_cols, ids, y);
  return static_cast<int>(cudaGetLastError());
}
}  // namespace weft::gpu::cuda
