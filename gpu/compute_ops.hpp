#pragma once
/// The kernels a device provides to the model: every backend implements the same set with the
/// same numerics contract (the CPU backend is the reference; see docs/engine.md).
///
/// All pointers are device pointers of the implementing device. Calls are enqueued on the device's
/// compute stream and complete in order; `synchronize()` on the device waits for them.
/// Not thread-safe: one model drives one device's ops at a time.

#include <cstdint>
#include <span>

#include "gpu/status.hpp"
#include "gpu/tensor_view.hpp"

namespace weft::gpu {

/// How RoPE pairs dimensions.
enum class rope_style {
  normal,  ///< Adjacent pairs (x[2i], x[2i+1]) — llama in GGUF (the converter permutes Q/K).
  neox,    ///< Halves (x[i], x[i + d/2]).
};

/// RoPE parameters (GGUF rope.* fields).
struct rope_config {
  rope_style style = rope_style::normal;
  int64_t n_dims = 0;          ///< Rotated dimensions per head (rope.dimension_count).
  float freq_base = 10000.0f;  ///< rope.freq_base.
  float freq_scale = 1.0f;     ///< 1 / rope.scaling.factor for linear scaling.
  const float* freq_factors =
      nullptr;  ///< Optional per-pair divisors (rope_freqs.weight), device memory.
};

/// One batch of attention over a paged KV cache (one layer).
///
/// Token t belongs to sequence `token_seq[t]` at position `token_pos[t]` and attends to that
/// sequence's positions [0, token_pos[t]] (its K/V must be stored already). The sequence's
/// position p lives in block `block_table[seq_block_offset[seq] + p / block_size]`, slot
/// p % block_size. Cache layout per layer: [block][slot][kv_head][head_dim] fp16.
struct attention_batch {
  const float* q = nullptr;                   ///< [n_tokens][n_heads * head_dim]
  float* out = nullptr;                       ///< [n_tokens][n_heads * head_dim]
  const uint16_t* k_cache = nullptr;          ///< This layer's K blocks.
  const uint16_t* v_cache = nullptr;          ///< This layer's V blocks.
  const int32_t* token_seq = nullptr;         ///< [n_tokens]
  const int32_t* token_pos = nullptr;         ///< [n_tokens]
  const int32_t* block_table = nullptr;       ///< Concatenated block ids of all sequences.
  const int32_t* seq_block_offset = nullptr;  ///< [n_seqs] start of each sequence in block_table.
  /// [n_seqs] tokens each sequence has in this batch. A sequence with >= 2 tokens (a prefill chunk)
  /// gets llama.cpp's GEMM numerics, a single decode token its GEMV numerics (see docs/engine.md).
  const int32_t* seq_n_tokens = nullptr;
  int64_t n_tokens = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 0;
  float scale = 1.0f;         ///< Usually 1 / sqrt(head_dim).
  int64_t max_positions = 0;  ///< max(token_pos) + 1 over the batch (host-known bound).
};

/// Writes K/V rows of a batch into cache slots (fp16).
struct kv_store_batch {
  const float* k = nullptr;  ///< [n_tokens][n_kv_heads * head_dim]
  const float* v = nullptr;
  uint16_t* k_cache = nullptr;  ///< This layer's K blocks.
  uint16_t* v_cache = nullptr;
  const int32_t* slots = nullptr;  ///< [n_tokens] block * block_size + slot
  int64_t n_tokens = 0;
  int64_t row_elems = 0;  ///< n_kv_heads * head_dim
};

/// The kernels. Shapes: activations are row-major [n_tokens][width] f32.
class compute_ops {
 public:
  virtual ~compute_ops() = default;

  /// y[t][r] = sum_c w[r][c] * x[t][c] for t < n_tokens, r < w.n_rows (one matrix of `w`).
  /// Quantized weights use quantized activations (Q8_0 / Q8_1), as llama.cpp.
  virtual status matmul(const tensor_view& w, const float* x, int64_t n_tokens, float* y) = 0;
  /// Several products sharing the input x (Q/K/V, gate/up): ys[i] = ws[i] x, bit-identical to
  /// separate matmul calls; backends may convert x once and run one parallel region.
  virtual status matmul_multi(std::span<const tensor_view> ws, const float* x, int64_t n_tokens,
                              std::span<float* const> ys) {
    for (size_t i = 0; i < ws.size(); ++i) {
      if (auto st = matmul(ws[i], x, n_tokens, ys[i]); !st) return st;
    }
    return {};
  }
  /// Bytes of a copy of `w` in the layout this backend's matmul reads fastest, to be written by
  /// pack_weight and set as w.packed; 0 when it reads `w` as stored (the default).
  virtual size_t packed_weight_bytes(const tensor_view& /*w*/) { return 0; }
  /// Writes that copy of `w`'s values to `dst` (packed_weight_bytes(w) bytes of device memory); run
  /// again whenever the values in w.data change. Results are the same bits with or without it.
  virtual status pack_weight(const tensor_view& /*w*/, void* /*dst*/) { return {}; }
  /// y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight.
  virtual status rms_norm(const float* x, const float* weight, float* y, int64_t n_tokens,
                          int64_t dim, float eps) = 0;
  /// Rotates the first n_dims of each head in place; x is [n_tokens][n_heads * head_dim].
  virtual status rope(float* x, const int32_t* positions, int64_t n_tokens, int64_t n_heads,
                      int64_t head_dim, const rope_config& config) = 0;
  /// y = silu(gate) * up, elementwise over n values.
  virtual status swiglu(const float* gate, const float* up, float* y, int64_t n) = 0;
  /// y = a + b, elementwise.
  virtual status add(const float* a, const float* b, float* y, int64_t n) = 0;
  /// y[i] = dequantized row ids[i] of `table`.
  virtual status get_rows(const tensor_view& table, const int32_t* ids, int64_t n, float* y) = 0;
  /// Stores K/V rows into the cache.
  virtual status kv_store(const kv_store_batch& batch) = 0;
  /// Causal attention over the paged cache.
  virtual status attention(const attention_batch& batch) = 0;
  /// Row-wise softmax in place over [n_rows][n].
  virtual status softmax(float* x, int64_t n_rows, int64_t n) = 0;
  /// dst[i] = src[ids[i]] for rows of `dim` floats.
  virtual status gather_rows(const float* src, const int32_t* ids, int64_t n, int64_t dim,
                             float* dst) = 0;
  /// dst[ids[i]] = src[i] for rows of `dim` floats.
  virtual status scatter_rows(const float* src, const int32_t* ids, int64_t n, int64_t dim,
                              float* dst) = 0;
  /// out[t] = sum_j weights[t][j] * rows[t][j] for j < k, summed in j order (MoE expert mixing).
  virtual status weighted_sum(const float* rows, const float* weights, int64_t n_tokens, int64_t k,
                              int64_t dim, float* out) = 0;
};

}  // namespace weft::gpu
