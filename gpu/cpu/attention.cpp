#include "gpu/cpu/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "gpu/cpu/elementwise.hpp"
#include "gpu/cpu/half_dot.hpp"
#include "gpu/cpu/quant_dot.hpp"

namespace weft::gpu::cpu {

namespace {

inline const uint16_t* cache_row(const uint16_t* cache, const attention_batch& b,
                                 const int32_t* table, int64_t pos, int64_t kv_head) {
  const int64_t block = table[pos / b.block_size];
  const int64_t slot = pos % b.block_size;
  return cache + ((block * b.block_size + slot) * b.n_kv_heads + kv_head) * b.head_dim;
}

constexpr int64_t key_prefetch_distance = 8;

// Element offsets of kv head `g`'s rows for positions [0, n_pos) of a sequence, walking its block
// table (no division per position).
void row_offsets(const attention_batch& b, const int32_t* table, int64_t n_pos, int64_t g,
                 std::vector<int64_t>& out) {
  out.resize(static_cast<size_t>(n_pos));
  const int64_t row = b.n_kv_heads * b.head_dim;
  for (int64_t p = 0, j = 0; p < n_pos; ++j) {
    const int64_t base = static_cast<int64_t>(table[j]) * b.block_size * row + g * b.head_dim;
    for (int64_t slot = 0; slot < b.block_size && p < n_pos; ++slot, ++p) {
      out[static_cast<size_t>(p)] = base + slot * row;
    }
  }
}

}  // namespace

void attention_tasks(const attention_batch& b, attention_scratch& s, int64_t first,
                     int64_t stride) {
  const int64_t group = b.n_heads / b.n_kv_heads;
  const int64_t hd = b.head_dim;
  const int64_t q_stride = b.n_heads * hd;
  const int64_t lanes = ggml_simd_lanes(ggml_simd_layout());
  const int64_t n_tasks = b.n_tokens * b.n_heads;
  int64_t rows_t = -1;
  int64_t rows_g = -1;
  for (int64_t task = first; task < n_tasks; task += stride) {
    const int64_t t = task / b.n_heads;
    const int64_t h = task % b.n_heads;
    const int64_t g = h / group;
    const int32_t seq = b.token_seq[t];
    const int64_t n_pos = static_cast<int64_t>(b.token_pos[t]) + 1;
    const int64_t n_kv = (n_pos + 31) / 32 * 32;
    // GEMM numerics need a lane-aligned head_dim; otherwise ggml also falls back to its GEMV path.
    const bool gemm = b.seq_n_tokens != nullptr && b.seq_n_tokens[seq] >= 2 && hd % lanes == 0;
    if (t != rows_t || g != rows_g) {
      row_offsets(b, b.block_table + b.seq_block_offset[seq], n_pos, g, s.offsets);
      s.v_rows.resize(static_cast<size_t>(n_pos));
      for (int64_t p = 0; p < n_pos; ++p)
        s.v_rows[static_cast<size_t>(p)] = b.v_cache + s.offsets[static_cast<size_t>(p)];
      rows_t = t;
      rows_g = g;
    }
    s.scores.resize(static_cast<size_t>(n_kv));
    s.probs.assign(static_cast<size_t>(n_kv), 0);
    s.q.resize(static_cast<size_t>(hd));
    s.acc.resize(static_cast<size_t>(64 * hd));
    float_to_half_row(b.q + t * q_stride + h * hd, s.q.data(), hd);
    float* sc = s.scores.data();
    for (int64_t p = 0; p < n_pos; ++p) {
      // The cache rows of one head are strided and the weights streamed through the caches
      // meanwhile evicted them: fetch a few keys ahead.
      if (p + key_prefetch_distance < n_pos) {
        prefetch_bytes(b.k_cache + s.offsets[static_cast<size_t>(p + key_prefetch_distance)],
                       hd * 2);
      }
      const uint16_t* k = b.k_cache + s.offsets[static_cast<size_t>(p)];
      sc[p] = (gemm ? dot_f16_gemm(k, s.q.data(), hd) : dot_f16(k, s.q.data(), hd)) * b.scale;
    }
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t p = 0; p < n_pos; ++p) max = std::max(max, sc[p]);
    // Masked keys (the padding up to n_kv) are -inf, as in llama.cpp's KQ mask: exp gives 0.
    for (int64_t p = n_pos; p < n_kv; ++p) sc[p] = -std::numeric_limits<float>::infinity();
    const double sum = exp_sum_row(sc, n_kv, max);
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t p = 0; p < n_pos; ++p)
      s.probs[static_cast<size_t>(p)] = float_to_half(sc[p] * inv);
    float* out = b.out + t * q_stride + h * hd;
    // V is read row by row (no transpose), each column's sum in the chosen dot's order.
    if (gemm) {
      dot_f16_gemm_columns(s.v_rows.data(), n_pos, s.probs.data(), n_kv, hd, s.acc.data(), out);
    } else {
      dot_f16_columns(s.v_rows.data(), n_pos, s.probs.data(), n_kv, hd, s.acc.data(), out);
    }
  }
}

void attention_reference(const attention_batch& b) {
  const int64_t group = b.n_heads / b.n_kv_heads;
  const int64_t hd = b.head_dim;
  const int64_t q_stride = b.n_heads * hd;
  for (int64_t t = 0; t < b.n_tokens; ++t) {
    const int64_t n_pos = static_cast<int64_t>(b.token_pos[t]) + 1;
    const int32_t* table = b.block_table + b.seq_block_offset[b.token_seq[t]];
    for (int64_t h = 0; h < b.n_heads; ++h) {
      const int64_t g = h / group;
      const float* q = b.q + t * q_stride + h * hd;
      std::vector<double> sc(static_cast<size_t>(n_pos));
      double max = -1e300;
      for (int64_t p = 0; p < n_pos; ++p) {
        const uint16_t* k = cache_row(b.k_cache, b, table, p, g);
        double d = 0.0;
        for (int64_t i = 0; i < hd; ++i) d += static_cast<double>(q[i]) * fp16_to_fp32(k[i]);
        sc[p] = d * b.scale;
        max = std::max(max, sc[p]);
      }
      double sum = 0.0;
      for (auto& v : sc) sum += (v = std::exp(v - max));
      float* out = b.out + t * q_stride + h * hd;
      for (int64_t i = 0; i < hd; ++i) {
        double acc = 0.0;
        for (int64_t p = 0; p < n_pos; ++p)
          acc += sc[p] / sum * fp16_to_fp32(cache_row(b.v_cache, b, table, p, g)[i]);
        out[i] = static_cast<float>(acc);
      }
    }
  }
}

}  // namespace weft::gpu::cpu
