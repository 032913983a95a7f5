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
  std::vector<float> acc;  ///< dot_f16_columns accumulators; the tiled kernel's value lanes
  std::vector<uint16_t> q;
  // The tiled prefill kernel: a tile's scores [query][key] (then its probabilities, in place), its
  // queries as floats [query][dim], the score tree's first level [query][8][16].
  std::vector<float> tile_scores, tile_q, t8;
  /// One kv head's keys and values of one sequence as floats, converted once per attention call
  /// for all of this thread's tiles: keys in blocks of 16 (AVX-512 layout; AVX2: 8) transposed
  /// ([block][dim][16 or 8]), values transposed ([dim][position], row stride `stride`); positions
  /// [0, n) are done.
  struct converted_head {
    int32_t seq = -1;
    int64_t last = -1;  ///< the sequence's last position in the batch (sizes the buffers)
    int64_t n = 0;
    int64_t stride = 0;
    std::vector<int64_t> offsets;
    std::vector<float> kt, vt;
  };
  std::vector<converted_head> heads;
  std::vector<std::vector<uint16_t>> group_probs;  ///< probabilities of up to 3 decode heads
};

/// Runs work items first, first + stride, ... of `batch` (first = thread index, stride = thread
/// count). An item is one (token, query head) pair, or — for prefill tokens (GEMM numerics) — up
/// to 16 consecutive tokens of a sequence with every query head of one kv head, which read keys and
/// values converted to floats once per call (per thread) and score each block of 16 keys (AVX-512
/// layout) or 8 (AVX2 layout) for all their queries. Both give the same bits (per-key dot products
/// in ggml's order).
void attention_tasks(const attention_batch& batch, attention_scratch& scratch, int64_t first,
                     int64_t stride);

/// Plain f32/f64 reference of the same attention (for tests): softmax in double, no fp16 rounding
/// of q or probabilities (the cache itself is fp16).
void attention_reference(const attention_batch& batch);

}  // namespace weft::gpu::cpu
