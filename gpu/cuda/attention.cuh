#pragma once
// Paged-KV attention on the GPU (causal, GQA), plus the K/V store into cache slots.
#include <cstdint>
#include "gpu/cuda/runtime.cuh"
namespace weft::gpu::cuda {
struct attention_args {
  const float* q = nullptr;
  float* out = nullptr;
  const uint16_t* k_cache = nullptr;
  const uint16_t* v_cache = nullptr;
  const int32_t* token_seq = nullptr;
  const int32_t* token_pos = nullptr;
  const int32_t* block_table = nullptr;
  const int32_t* seq_block_offset = nullptr;
  int64_t n_tokens = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, block_size = 0;
  int64_t max_positions = 0;  ///< Upper bound of token_pos + 1 (sizes shared memory).
  float scale = 1.0f;
};
int launch_attention(const attention_args& a, stream_handle s);
/// cache[slots[t] * row_elems + j] = half(src[t * row_elems + j]) for K and V.
int launch_kv_store(const float* k, const float* v, uint16_t* k_cache, uint16_t* v_cache,
                    const int32_t* slots, int64_t n_tokens, int64_t row_elems, stream_handle s);
}  // namespace weft::gpu::cuda
