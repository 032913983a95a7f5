#pragma once
/// Internals the attention kernels of the CPU backend share (attention.cpp, the AVX-512 tile
/// kernels and the per-query paths; attention_avx2.cpp, the AVX2 tile kernels): not an API.

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "gpu/cpu/attention.hpp"
#include "gpu/cpu/quant_dot.hpp"

namespace weft::gpu::cpu::attention_detail {

/// Element offsets of kv head `g`'s rows for positions [0, n_pos) of a sequence, walking its block
/// table (no division per position).
void row_offsets(const attention_batch& b, const int32_t* table, int64_t n_pos, int64_t g,
                 std::vector<int64_t>& out);

/// The largest of x[0, n) (-inf for n = 0).
float row_max(const float* x, int64_t n);

// A row stride of `n` floats plus one cache line: rows a power of two apart (8192 positions, 32 KB)
// map to the same cache sets, and the value sums read 8 value rows and 3 probability rows at once.
inline int64_t padded_stride(int64_t n) {
  return n + 16;
}

// Up to 16 consecutive prefill tokens [t0, t1) of one sequence (whose last token in the batch is
// at position `last`) and every query head of kv head g, with one lane layout's kernels `K`: its
// keys and values converted once per call (K::convert), each block of K::keys keys scored for all
// the tile's queries (K::scores), each query's probabilities in place of its scores (K::softmax),
// the value sums K::lanes wide per column (K::values, K::finish).
template <class K>
void attention_tile_with(const attention_batch& b, attention_scratch& s, int64_t t0, int64_t t1,
                         int64_t g, int64_t last) {
  const int64_t group = b.n_heads / b.n_kv_heads;
  const int64_t hd = b.head_dim;
  const int64_t q_stride = b.n_heads * hd;
  const int32_t seq = b.token_seq[t0];
  const int64_t n_max = static_cast<int64_t>(b.token_pos[t1 - 1]) + 1;
  const int64_t width = (n_max + 31) / 32 * 32;  // covers every query's n_kv and the key blocks
  const int64_t ld = padded_stride(width);       // the rows' stride
  const int64_t n_q = (t1 - t0) * group;
  const auto& c = K::convert(b, s, seq, g, n_max, last);
  s.tile_scores.resize(static_cast<size_t>(n_q * ld));
  s.tile_q.resize(static_cast<size_t>(n_q * hd));
  s.q.resize(static_cast<size_t>(hd));
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t k = 0; k < group; ++k) {
      const int64_t h = g * group + k;
      float_to_half_row(b.q + t * q_stride + h * hd, s.q.data(), hd);
      half_to_float_row(s.q.data(), s.tile_q.data() + ((t - t0) * group + k) * hd, hd);
    }
  }
  s.t8.resize(static_cast<size_t>(n_q * 8 * 16));
  for (int64_t p0 = 0; p0 < n_max; p0 += K::keys) {
    // The queries of tokens at or past p0 (a suffix: positions increase); a token's later keys in
    // the block are computed too and masked by the softmax.
    int64_t q0 = 0;
    while (b.token_pos[t0 + q0 / group] < p0) q0 += group;
    K::scores(c.kt.data() + p0 * hd, p0 + K::keys < n_max, s.tile_q.data() + q0 * hd, n_q - q0, hd,
              b.scale, s.tile_scores.data() + q0 * ld + p0, ld, s.t8.data());
  }
  for (int64_t qi = 0; qi < n_q; ++qi) {
    const int64_t n_pos = static_cast<int64_t>(b.token_pos[t0 + qi / group]) + 1;
    float* row = s.tile_scores.data() + qi * ld;
    K::softmax(row, n_pos, row);
  }
  // The value sums, a block of positions at a time for all the tile's queries: the block's values
  // (~128 KB) are read from the converted copy once per tile instead of once per token — a kv
  // head's values outgrow the core's cache at long contexts (2 MB at 8k tokens, head size 64).
  const int64_t block = std::max<int64_t>(16, (int64_t{32768} / hd) / 16 * 16);
  s.acc.resize(static_cast<size_t>(n_q * hd * K::lanes));
  for (int64_t i0 = 0; i0 < width; i0 += block) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n_pos = static_cast<int64_t>(b.token_pos[t]) + 1;
      const int64_t n_kv = (n_pos + 31) / 32 * 32;
      if (i0 >= n_kv) continue;
      const int64_t i1 = std::min(i0 + block, n_kv);
      // The token's query heads, up to three at a time (they share n_pos and every value load).
      for (int64_t k0 = 0; k0 < group; k0 += 3) {
        const int nq = static_cast<int>(std::min<int64_t>(3, group - k0));
        const int64_t qi = (t - t0) * group + k0;
        const float* pf = s.tile_scores.data() + qi * ld;
        float* acc = s.acc.data() + qi * hd * K::lanes;
        const auto values = [&](auto n) {
          K::template values<decltype(n)::value>(c.vt.data(), c.stride, pf, ld, n_pos, i0, i1, hd,
                                                 acc, i0 == 0);
        };
        if (nq == 3) {
          values(std::integral_constant<int, 3>{});
        } else if (nq == 2) {
          values(std::integral_constant<int, 2>{});
        } else {
          values(std::integral_constant<int, 1>{});
        }
      }
    }
  }
  for (int64_t qi = 0; qi < n_q; ++qi) {
    const int64_t t = t0 + qi / group;
    const int64_t h = g * group + qi % group;
    K::finish(s.acc.data() + qi * hd * K::lanes, hd, b.out + t * q_stride + h * hd);
  }
}

/// Whether this build has the AVX2 layout's tile kernels (attention_avx2.cpp).
bool tile_8_built();
/// attention_tile_with in the AVX2 layout: tokens [t0, t1) (at most 16) of one sequence, every
/// query head of kv head g (a no-op where tile_8_built() is false).
void attention_tile_8(const attention_batch& b, attention_scratch& s, int64_t t0, int64_t t1,
                      int64_t g, int64_t last);

}  // namespace weft::gpu::cpu::attention_detail
