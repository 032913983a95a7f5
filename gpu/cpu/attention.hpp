#pragma once
/// Causal GQA attention over the paged fp16 KV cache, CPU backend.
///
/// Numerics follow llama.cpp's non-flash path: q rounded to fp16, fp16 K·q dot products, scaled
/// softmax in f32, probabilities rounded to fp16 and multiplied with fp16 V. The key range of a
/// token is padded to a multiple of 32 with zero weights (llama.cpp's n_kv padding), which only
/// fixes the summation layout. The result for a token depends only on its own sequence's cache
/// and position (batch invariant).

#include <cstdint>
#include <vector>

#include "gpu/compute_ops.hpp"

namespace weft::gpu::cpu {

/// Per-thread buffers of the attention kernel.
struct attention_scratch {
  std::vector<float> scores;
  std::vector<uint16_t> probs;
  std::vector<int64_t> offsets;         ///< cache offsets of one kv head's rows, by position
  std::vector<const uint16_t*> v_rows;  ///< V rows of one kv head (read without transposing)
  std::vector<float> acc;               ///< dot_f16_columns accumulators
  std::vector<uint16_t> q;
};

/// Runs tasks first, first + stride, ... of `batch`; a task is one (token, query head) pair:
/// task = token * n_heads + head. Threads take interleaved tasks (first = thread index, stride =
/// thread count), which balances both a decode step (a handful of heads) and a causal prefill
/// chunk (later tokens attend to more keys).
void attention_tasks(const attention_batch& batch, attention_scratch& scratch, int64_t first,
                     int64_t stride);

/// Plain f32/f64 reference of the same attention (for tests): softmax in double, no fp16 rounding
/// of q or probabilities (the cache itself is fp16).
void attention_reference(const attention_batch& batch);

}  // namespace weft::gpu::cpu
