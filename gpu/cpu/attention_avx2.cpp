#include "gpu/cpu/attention_tiles.hpp"

#include <algorithm>
#include <limits>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#endif

#include "gpu/cpu/elementwise.hpp"

namespace weft::gpu::cpu::attention_detail {

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// The tiled prefill kernel for the AVX2 layout (8 lanes), the same plan as the AVX-512 one: up to
// 16 tokens x the query heads of one kv head share each pass over keys and values converted to
// floats once per call. Its numerics are ggml's AVX2 GEMM path (dot_f16_gemm, 8 lanes, reduce8's
// tree), key and value sums alike, so its bits are the per-key path's. AVX2 machines have 16
// vector registers: the loops keep at most 16 live.
namespace {

// Keys and values of sequence `seq`, kv head g, as floats for positions [0, n_needed) (whole
// blocks of 8; positions past `last` are zeros): keys in blocks of 8 transposed ([block][dim][8]),
// values transposed ([dim][position], row stride c.stride).
const attention_scratch::converted_head& converted8(const attention_batch& b, attention_scratch& s,
                                                    int32_t seq, int64_t g, int64_t n_needed,
                                                    int64_t last) {
  const int64_t hd = b.head_dim;
  auto& c = s.heads[static_cast<size_t>(g)];
  if (c.seq != seq || c.last != last) {
    c.seq = seq;
    c.last = last;
    c.n = 0;
    c.stride = padded_stride((last + 1 + 31) / 32 * 32);
    row_offsets(b, b.block_table + b.seq_block_offset[seq], last + 1, g, c.offsets);
    c.kt.resize(static_cast<size_t>(c.stride * hd));
    c.vt.resize(static_cast<size_t>(c.stride * hd));
  }
  s.q.resize(static_cast<size_t>(hd));
  s.scores.resize(static_cast<size_t>(2 * hd));
  float* k = s.scores.data();
  float* v = k + hd;
  for (; c.n < n_needed; c.n += 8) {
    float* kt = c.kt.data() + c.n * hd;
    for (int64_t j = 0; j < 8; ++j) {
      const int64_t p = c.n + j;
      if (p <= last) {
        half_to_float_row(b.k_cache + c.offsets[static_cast<size_t>(p)], k, hd);
        half_to_float_row(b.v_cache + c.offsets[static_cast<size_t>(p)], v, hd);
      } else {
        std::fill(k, k + 2 * hd, 0.0f);
      }
      for (int64_t d = 0; d < hd; ++d) {
        kt[d * 8 + j] = k[d];
        c.vt[static_cast<size_t>(d * c.stride + p)] = v[d];
      }
    }
  }
  return c;
}

// reduce8's tree on 8 vectors, lane by lane: (v[4 + l] + v[l]), then (t[0] + t[2]) + (t[1] + t[3]).
[[gnu::always_inline]] inline __m256 tree_sum_8(const __m256* v) {
  __m256 t4[4];
#pragma GCC unroll 4
  for (int l = 0; l < 4; ++l) t4[l] = _mm256_add_ps(v[4 + l], v[l]);
  return _mm256_add_ps(_mm256_add_ps(t4[0], t4[2]), _mm256_add_ps(t4[1], t4[3]));
}

// dot_f16_gemm (AVX2 layout: lane l takes dims l, l + 8, ... by fma; then reduce8's tree) of
// queries [0, n_q) (rows of `q`, fp16-rounded floats) against one block of 8 keys (`kt`, [dim][8]),
// key j in lane j: out[qi * out_stride + j] = the score times `scale`. Four queries at a time share
// each key load; each lane's chains go to `lanes` ([query][8][8]) before the tree.
void scores_8_keys(const float* kt, const float* q, int64_t n_q, int64_t hd, float scale,
                   float* out, int64_t out_stride, float* lanes) {
  for (int l = 0; l < 8; ++l) {
    int64_t qi = 0;
    for (; qi + 4 <= n_q; qi += 4) {
      __m256 a[4];
#pragma GCC unroll 4
      for (auto& x : a) x = _mm256_setzero_ps();
      for (int64_t i = l; i < hd; i += 8) {
        const __m256 k = _mm256_loadu_ps(kt + i * 8);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j)
          a[j] = _mm256_fmadd_ps(k, _mm256_broadcast_ss(q + (qi + j) * hd + i), a[j]);
      }
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) _mm256_storeu_ps(lanes + ((qi + j) * 8 + l) * 8, a[j]);
    }
    for (; qi < n_q; ++qi) {
      __m256 a = _mm256_setzero_ps();
      for (int64_t i = l; i < hd; i += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(kt + i * 8), _mm256_broadcast_ss(q + qi * hd + i), a);
      _mm256_storeu_ps(lanes + (qi * 8 + l) * 8, a);
    }
  }
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int64_t qi = 0; qi < n_q; ++qi) {
    __m256 v[8];
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) v[l] = _mm256_loadu_ps(lanes + (qi * 8 + l) * 8);
    _mm256_storeu_ps(out + qi * out_stride, _mm256_mul_ps(tree_sum_8(v), vscale));
  }
}

// softmax_probs with its probabilities rounded to fp16 and back into pf[0, n_kv) (zeros from
// n_pos): the same bits as softmax_probs followed by half_to_float_row.
int64_t softmax_probs_f32_8(float* sc, int64_t n_pos, float* pf) {
  const int64_t n_kv = (n_pos + 31) / 32 * 32;
  const float max = row_max(sc, n_pos);
  for (int64_t p = n_pos; p < n_kv; ++p) sc[p] = -std::numeric_limits<float>::infinity();
  const double sum = exp_sum_row(sc, n_kv, max);
  const __m256 inv = _mm256_set1_ps(static_cast<float>(1.0 / sum));
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t p = 0; p < n_kv; p += 8) {
    const __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n_pos - p)), lane);
    const __m256 x = _mm256_mul_ps(_mm256_maskload_ps(sc + p, in), inv);
    _mm256_storeu_ps(pf + p, _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)));
  }
  return n_kv;
}

// The probability-weighted value sums of NQ queries of one token (n_pos keys each) over positions
// [i0, i1) (multiples of 8; i1 at most the queries' n_kv): column d's lane l takes positions l,
// l + 8, ... by fma, as dot_f16_gemm_columns' slots (positions from n_pos on are its zero rows).
// The lanes continue from `acc` ([NQ][hd][8]; from zero when `first`) and are left there. Four
// columns x NQ queries in flight, each value load serving the NQ queries.
template <int NQ>
void weight_values_8(const float* vt, int64_t stride, const float* pf, int64_t pf_stride,
                     int64_t n_pos, int64_t i0, int64_t i1, int64_t hd, float* acc, bool first) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t d0 = 0; d0 < hd; d0 += 4) {
    __m256 a[NQ][4];
#pragma GCC unroll 3
    for (int q = 0; q < NQ; ++q) {
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c)
        a[q][c] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + (q * hd + d0 + c) * 8);
    }
    const float* row = vt + d0 * stride;
    int64_t i = i0;
    for (; i + 8 <= std::min(i1, n_pos); i += 8) {
      __m256 pv[NQ];
#pragma GCC unroll 3
      for (int q = 0; q < NQ; ++q) pv[q] = _mm256_loadu_ps(pf + q * pf_stride + i);
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m256 v = _mm256_loadu_ps(row + c * stride + i);
#pragma GCC unroll 3
        for (int q = 0; q < NQ; ++q) a[q][c] = _mm256_fmadd_ps(v, pv[q], a[q][c]);
      }
    }
    for (; i < i1; i += 8) {
      const __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n_pos - i)), lane);
      __m256 pv[NQ];
#pragma GCC unroll 3
      for (int q = 0; q < NQ; ++q) pv[q] = _mm256_loadu_ps(pf + q * pf_stride + i);
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m256 v = _mm256_maskload_ps(row + c * stride + i, in);
#pragma GCC unroll 3
        for (int q = 0; q < NQ; ++q) a[q][c] = _mm256_fmadd_ps(v, pv[q], a[q][c]);
      }
    }
#pragma GCC unroll 3
    for (int q = 0; q < NQ; ++q) {
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) _mm256_storeu_ps(acc + (q * hd + d0 + c) * 8, a[q][c]);
    }
  }
}

// The AVX2 layout's tile kernels (8 lanes) for attention_tile_with.
struct tile_kernels_8 {
  static constexpr int64_t keys = 8, lanes = 8;
  static const attention_scratch::converted_head& convert(const attention_batch& b,
                                                          attention_scratch& s, int32_t seq,
                                                          int64_t g, int64_t n, int64_t last) {
    return converted8(b, s, seq, g, n, last);
  }
  static void scores(const float* kt, bool, const float* q, int64_t n_q, int64_t hd, float scale,
                     float* out, int64_t ld, float* t8) {
    scores_8_keys(kt, q, n_q, hd, scale, out, ld, t8);
  }
  static int64_t softmax(float* sc, int64_t n_pos, float* pf) {
    return softmax_probs_f32_8(sc, n_pos, pf);
  }
  template <int NQ>
  static void values(const float* vt, int64_t stride, const float* pf, int64_t pf_stride,
                     int64_t n_pos, int64_t i0, int64_t i1, int64_t hd, float* acc, bool first) {
    weight_values_8<NQ>(vt, stride, pf, pf_stride, n_pos, i0, i1, hd, acc, first);
  }
  static void finish(const float* acc, int64_t hd, float* out) {
    for (int64_t d = 0; d < hd; ++d) out[d] = reduce8(acc + d * 8);
  }
};

// attention_tile in the AVX2 layout: tokens [t0, t1) (at most 16) of one sequence, every query
// head of kv head g.
}  // namespace

bool tile_8_built() {
  return true;
}

void attention_tile_8(const attention_batch& b, attention_scratch& s, int64_t t0, int64_t t1,
                      int64_t g, int64_t last) {
  attention_tile_with<tile_kernels_8>(b, s, t0, t1, g, last);
}
#else
bool tile_8_built() {
  return false;
}

void attention_tile_8(const attention_batch&, attention_scratch&, int64_t, int64_t, int64_t,
                      int64_t) {}
#endif

}  // namespace weft::gpu::cpu::attention_detail
