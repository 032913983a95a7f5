#include "gpu/cuda/attention.cuh"
#include "gpu/cuda/common.cuh"
namespace weft::gpu::cuda {
using namespace internal;
namespace {
// One block per (token, head): scores in shared memory, softmax, then V accumulation per dim.
__global__ void attention_kernel(attention_args a) {
  extern __shared__ float scores[];
  __shared__ float red[32];
  const int64_t t = blockIdx.x / a.n_heads;
  const int64_t h = blockIdx.x % a.n_heads;
  const int64_t g = h / (a.n_heads / a.n_kv_heads);
  const int64_t n_pos = static_cast<int64_t>(a.token_pos[t]) + 1;
  const int32_t* table = a.block_table + a.seq_block_offset[a.token_seq[t]];
  const float* q = a.q + (t * a.n_heads + h) * a.head_dim;
  auto row = [&](const uint16_t* cache, int64_t p) {
    const int64_t block = table[p / a.block_size];
    return cache + ((block * a.block_size + p % a.block_size) * a.n_kv_heads + g) * a.head_dim;
  };
  float local_max = -INFINITY;
  for (int64_t p = threadIdx.x; p < n_pos; p += blockDim.x) {
    const uint16_t* k = row(a.k_cache, p);
    float d = 0.0f;
    for (int64_t i = 0; i < a.head_dim; ++i) d += q[i] * half_bits_to_float(k[i]);
    scores[p] = d * a.scale;
    local_max = fmaxf(local_max, scores[p]);
  }
  const float max = block_max(local_max, red);
  float local_sum = 0.0f;
  for (int64_t p = threadIdx.x; p < n_pos; p += blockDim.x) {
    scores[p] = expf(scores[p] - max);
    local_sum += scores[p];
  }
  const float inv = 1.0f / block_sum(local_sum, red);
  float* out = a.out + (t * a.n_heads + h) * a.head_dim;
  for (int64_t d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t p = 0; p < n_pos; ++p) acc += scores[p] * half_bits_to_float(row(a.v_cache, p)[d]);
    out[d] = acc * inv;
  }
}
__global__ void kv_store_kernel(const float* k, const float* v, uint16_t* kc, uint16_t* vc,
                                const int32_t* slots, int64_t n_tokens, int64_t row) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tokens * row) return;
  const int64_t t = i / row, j = i % row;
  const int64_t dst = static_cast<int64_t>(slots[t]) * row + j;
  kc[dst] = float_to_half_bits(k[i]);
  vc[dst] = float_to_half_bits(v[i]);
}
}  // namespace
int launch_attention(const attention_args& a, stream_handle s) {
  if (a.n_tokens == 0) return 0;
  const size_t shared = static_cast<size_t>(a.max_positions) * sizeof(float);
  if (shared > 48 * 1024)
    return static_cast<int>(cudaErrorInvalidValue);  // > 12288 positions: not yet tiled
  attention_kernel<<<static_cast<unsigned>(a.n_tokens * a.n_heads), 128, shared,
                     static_cast<cudaStream_t>(s)>>>(a);
  return static_cast<int>(cudaGetLastError());
}
int launch_kv_store(const float* k, const float* v, uint16_t* k_cache, uint16_t* v_cache,
                    const int32_t* slots, int64_t n_tokens, int64_t row_elems, stream_handle s) {
  const int64_t n = n_tokens * row_elems;
  if (n == 0) return 0;
  kv_store_kernel<<<grid_for(n, 256), 256, 0, static_cast<cudaStream_t>(s)>>>(
      k, v, k_cache, v_cache, slots, n_tokens, row_elems);
  return static_cast<int>(cudaGetLastError());
}
}  // namespace weft::gpu::cuda
