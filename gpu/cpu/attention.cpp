#include "gpu/cpu/attention.hpp"
#include "gpu/cpu/attention_tiles.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#if defined(__AVX512F__) && defined(__FMA__) && defined(__F16C__)
#include "gpu/cpu/simd.hpp"
#endif

#include "gpu/cpu/elementwise.hpp"
#include "gpu/cpu/half_dot.hpp"
#include "gpu/cpu/quant_dot.hpp"

namespace weft::gpu::cpu {

namespace attention_detail {

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

float row_max(const float* x, int64_t n) {
  float max = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
#if defined(__AVX512F__) && defined(__FMA__) && defined(__F16C__)
  __m512 m = _mm512_set1_ps(max);
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
  max = _mm512_reduce_max_ps(m);
#endif
  for (; i < n; ++i) max = std::max(max, x[i]);
  return max;
}

}  // namespace attention_detail

namespace {

using namespace attention_detail;

inline const uint16_t* cache_row(const uint16_t* cache, const attention_batch& b,
                                 const int32_t* table, int64_t pos, int64_t kv_head) {
  const int64_t block = table[pos / b.block_size];
  const int64_t slot = pos % b.block_size;
  return cache + ((block * b.block_size + slot) * b.n_kv_heads + kv_head) * b.head_dim;
}

constexpr int64_t key_prefetch_distance = 8;

// Softmax of one query's scores (sc[p] for p < n_pos computed) into s.probs in llama.cpp's order:
// -inf padding to n_kv (returned), probabilities rounded to fp16, zeros past n_pos.
int64_t softmax_probs_to(float* sc, int64_t n_pos, std::vector<uint16_t>& probs) {
  const int64_t n_kv = (n_pos + 31) / 32 * 32;
  const float max = row_max(sc, n_pos);
  // Masked keys (the padding up to n_kv) are -inf, as in llama.cpp's KQ mask: exp gives 0.
  for (int64_t p = n_pos; p < n_kv; ++p) sc[p] = -std::numeric_limits<float>::infinity();
  const double sum = exp_sum_row(sc, n_kv, max);
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t p = 0; p < n_pos; ++p) sc[p] *= inv;
  probs.resize(static_cast<size_t>(n_kv));
  float_to_half_row(sc, probs.data(), n_pos);
  std::fill(probs.begin() + n_pos, probs.end(), uint16_t{0});
  return n_kv;
}

int64_t softmax_probs(attention_scratch& s, float* sc, int64_t n_pos) {
  return softmax_probs_to(sc, n_pos, s.probs);
}

// The softmax, then the probability-weighted sum of the V rows into `out`, read row by row in the
// chosen dot's order.
void softmax_and_values(attention_scratch& s, float* sc, int64_t n_pos, int64_t hd, bool gemm,
                        float* out) {
  const int64_t n_kv = softmax_probs(s, sc, n_pos);
  if (gemm) {
    dot_f16_gemm_columns(s.v_rows.data(), n_pos, s.probs.data(), n_kv, hd, s.acc.data(), out);
  } else {
    dot_f16_columns(s.v_rows.data(), n_pos, s.probs.data(), n_kv, hd, s.acc.data(), out);
  }
}

void set_rows(const attention_batch& b, attention_scratch& s, int32_t seq, int64_t n_pos,
              int64_t g) {
  row_offsets(b, b.block_table + b.seq_block_offset[seq], n_pos, g, s.offsets);
  s.v_rows.resize(static_cast<size_t>(n_pos));
  for (int64_t p = 0; p < n_pos; ++p)
    s.v_rows[static_cast<size_t>(p)] = b.v_cache + s.offsets[static_cast<size_t>(p)];
}

#if defined(__AVX512F__) && defined(__FMA__) && defined(__F16C__)
constexpr bool tiled_kernel_built = true;
constexpr int64_t attention_tile_tokens = 16;  // query tokens that share one pass over the keys

// dot_f16_gemm (AVX-512 layout) of one query against 16 keys at once, key j in lane j: the same
// per-key operations in the same order (lane l of the accumulators takes dims l, l + 16, ... by
// fma; then hi + lo, then reduce8's tree), so every score has dot_f16_gemm's bits. `kt` holds
// the keys transposed, [dim][16] as floats; `q` the fp16-rounded query as floats.
[[gnu::always_inline]] inline void scores_16_keys(const float* kt, const float* q, int64_t hd,
                                                  float scale, float* out) {
  __m512 a[16];
#pragma GCC unroll 16
  for (auto& x : a) x = _mm512_setzero_ps();
  for (int64_t i = 0; i < hd; i += 16) {
    // Fully unrolled so the 16 accumulators stay in registers (a loop over an array of them is
    // compiled as loads and stores: one store-forwarding round trip per fma).
#pragma GCC unroll 16
    for (int l = 0; l < 16; ++l) {
      a[l] = _mm512_fmadd_ps(_mm512_loadu_ps(kt + (i + l) * 16), _mm512_set1_ps(q[i + l]), a[l]);
    }
  }
  _mm512_storeu_ps(out, _mm512_mul_ps(tree_sum_16(a), _mm512_set1_ps(scale)));
}

// scores_16_keys for queries [0, n_q) (rows of `q`, hd = 16 * NC) against one block of 16 keys,
// with every operation of it in the same order: the accumulators of lanes l and l + 8 take their
// fma chains over the NC dim groups, and their sum (the tree's first level) goes to `t8`; the rest
// of the tree follows per query. The 2 * NC key rows of a lane pair stay in registers for all the
// queries, which then cost one broadcast per fma instead of a broadcast and a key load.
template <int NC, int QB>
void scores_block(const float* kt, const float* q, int64_t n_q, float scale, float* out,
                  int64_t out_stride, float* t8, const float* next_kt) {
  constexpr int64_t hd = 16 * NC;
  for (int l = 0; l < 8; ++l) {
    // The next block's keys (hd x 16 floats), a slice per lane pair: read lane-pair by lane-pair
    // they jump 512 bytes at a time, which the hardware's stream prefetch does not follow.
    if (next_kt != nullptr) {
      const char* nk = reinterpret_cast<const char*>(next_kt);
#pragma GCC unroll 8
      for (int i = 0; i < 2 * NC; ++i) _mm_prefetch(nk + (l * 2 * NC + i) * 64, _MM_HINT_T0);
    }
    __m512 k0[NC], k1[NC];
#pragma GCC unroll 8
    for (int i = 0; i < NC; ++i) {
      k0[i] = _mm512_loadu_ps(kt + (i * 16 + l) * 16);
      k1[i] = _mm512_loadu_ps(kt + (i * 16 + l + 8) * 16);
    }
    int64_t qi = 0;
    for (; qi + QB <= n_q; qi += QB) {
      __m512 a[QB], b[QB];
#pragma GCC unroll 4
      for (int j = 0; j < QB; ++j) {
        a[j] = _mm512_setzero_ps();
        b[j] = _mm512_setzero_ps();
      }
#pragma GCC unroll 8
      for (int i = 0; i < NC; ++i) {
#pragma GCC unroll 4
        for (int j = 0; j < QB; ++j) {
          const float* qj = q + (qi + j) * hd + i * 16;
          a[j] = _mm512_fmadd_ps(k0[i], _mm512_set1_ps(qj[l]), a[j]);
          b[j] = _mm512_fmadd_ps(k1[i], _mm512_set1_ps(qj[l + 8]), b[j]);
        }
      }
#pragma GCC unroll 4
      for (int j = 0; j < QB; ++j)
        _mm512_storeu_ps(t8 + ((qi + j) * 8 + l) * 16, _mm512_add_ps(b[j], a[j]));
    }
    for (; qi < n_q; ++qi) {
      __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
#pragma GCC unroll 8
      for (int i = 0; i < NC; ++i) {
        const float* qj = q + qi * hd + i * 16;
        a = _mm512_fmadd_ps(k0[i], _mm512_set1_ps(qj[l]), a);
        b = _mm512_fmadd_ps(k1[i], _mm512_set1_ps(qj[l + 8]), b);
      }
      _mm512_storeu_ps(t8 + (qi * 8 + l) * 16, _mm512_add_ps(b, a));
    }
  }
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t qi = 0; qi < n_q; ++qi) {
    const float* t = t8 + qi * 8 * 16;
    __m512 t4[4];
#pragma GCC unroll 4
    for (int l = 0; l < 4; ++l)
      t4[l] = _mm512_add_ps(_mm512_loadu_ps(t + (4 + l) * 16), _mm512_loadu_ps(t + l * 16));
    const __m512 r = _mm512_add_ps(_mm512_add_ps(t4[0], t4[2]), _mm512_add_ps(t4[1], t4[3]));
    _mm512_storeu_ps(out + qi * out_stride, _mm512_mul_ps(r, vscale));
  }
}

// softmax_probs for the tiled kernel, in one pass after the exponentials: the fp16-rounded
// probabilities as floats into pf[0, n_kv) (zeros from n_pos), same bits as softmax_probs followed
// by half_to_float_row.
int64_t softmax_probs_f32(float* sc, int64_t n_pos, float* pf) {
  const int64_t n_kv = (n_pos + 31) / 32 * 32;
  const float max = row_max(sc, n_pos);
  for (int64_t p = n_pos; p < n_kv; ++p) sc[p] = -std::numeric_limits<float>::infinity();
  const double sum = exp_sum_row(sc, n_kv, max);
  const __m512 inv = _mm512_set1_ps(static_cast<float>(1.0 / sum));
  for (int64_t p = 0; p < n_kv; p += 16) {
    const int64_t left = n_pos - p;
    const auto m = static_cast<__mmask16>(left >= 16 ? 0xffff : left <= 0 ? 0 : (1u << left) - 1);
    const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, sc + p), inv);
    const __m512 r = _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
    _mm512_storeu_ps(pf + p, r);
  }
  return n_kv;
}

// The 16 x 16 floats r[j][c] transposed in registers: r[c][j] after (32-bit, 64-bit, then two
// 128-bit-lane shuffle stages).
[[gnu::always_inline]] inline void transpose_16x16(__m512* r) {
  __m512 t[16], u[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // u[4i + e]'s 128-bit lane k: rows 4i .. 4i + 3 of column 4k + e.
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const auto pd = [](__m512 x) { return _mm512_castps_pd(x); };
    u[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[4 * i]), pd(t[4 * i + 2])));
    u[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[4 * i]), pd(t[4 * i + 2])));
    u[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[4 * i + 1]), pd(t[4 * i + 3])));
    u[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[4 * i + 1]), pd(t[4 * i + 3])));
  }
  // Column 4k + e: lane k of u[e], u[4 + e], u[8 + e], u[12 + e].
#pragma GCC unroll 4
  for (int e = 0; e < 4; ++e) {
    const __m512 w0 = _mm512_shuffle_f32x4(u[e], u[4 + e], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 w1 = _mm512_shuffle_f32x4(u[e], u[4 + e], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 w2 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 w3 = _mm512_shuffle_f32x4(u[8 + e], u[12 + e], _MM_SHUFFLE(3, 2, 3, 2));
    r[e] = _mm512_shuffle_f32x4(w0, w2, _MM_SHUFFLE(2, 0, 2, 0));
    r[4 + e] = _mm512_shuffle_f32x4(w0, w2, _MM_SHUFFLE(3, 1, 3, 1));
    r[8 + e] = _mm512_shuffle_f32x4(w1, w3, _MM_SHUFFLE(2, 0, 2, 0));
    r[12 + e] = _mm512_shuffle_f32x4(w1, w3, _MM_SHUFFLE(3, 1, 3, 1));
  }
}

// 16 rows of hd halves (nullptr: a row of zeros) as floats, transposed: dst[d * dst_stride + j] is
// row j's dimension d (hd a multiple of 16). The conversion is exact, as half_to_float_row's.
void transpose_16_rows(const uint16_t* const* rows, int64_t hd, float* dst, int64_t dst_stride) {
  for (int64_t d0 = 0; d0 < hd; d0 += 16) {
    __m512 r[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      r[j] =
          rows[j] == nullptr
              ? _mm512_setzero_ps()
              : _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[j] + d0)));
    }
    transpose_16x16(r);
#pragma GCC unroll 16
    for (int d = 0; d < 16; ++d) _mm512_storeu_ps(dst + (d0 + d) * dst_stride, r[d]);
  }
}

// Keys and values of sequence `seq`, kv head g, as floats for positions [0, n_needed) (whole blocks
// of 16; positions past the sequence's last one in the batch, `last`, are zeros).
const attention_scratch::converted_head& converted(const attention_batch& b, attention_scratch& s,
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
  const uint16_t* k_rows[16];
  const uint16_t* v_rows[16];
  for (; c.n < n_needed; c.n += 16) {
    for (int64_t j = 0; j < 16; ++j) {
      const int64_t p = c.n + j;
      const bool in = p <= last;
      k_rows[j] = in ? b.k_cache + c.offsets[static_cast<size_t>(p)] : nullptr;
      v_rows[j] = in ? b.v_cache + c.offsets[static_cast<size_t>(p)] : nullptr;
    }
    transpose_16_rows(k_rows, hd, c.kt.data() + c.n * hd, 16);
    transpose_16_rows(v_rows, hd, c.vt.data() + c.n, c.stride);
  }
  return c;
}

// The probability-weighted sum of the values for NQ queries of one token (n_pos keys each) over
// positions [i0, i1) (multiples of 16; i1 at most the queries' n_kv): every output column a
// 16-lane dot over positions (lane l takes positions l, l + 16, ...; then hi + lo and reduce8's
// tree, in finish_values), column_fma's slot layout and order. The lanes continue from `acc`
// ([NQ][hd][16]; from zero when `first`) and are left there, so a query's positions can be run
// block by block in order with the bits of one pass. 8 columns x NQ queries in flight, each value
// load serving all NQ queries.
template <int NQ>
void weight_values(const float* vt, int64_t stride, const float* pf, int64_t pf_stride,
                   int64_t n_pos, int64_t i0, int64_t i1, int64_t hd, float* acc, bool first) {
  const auto tail = static_cast<__mmask16>((1u << (n_pos % 16)) - 1);
  for (int64_t d0 = 0; d0 < hd; d0 += 8) {
    __m512 a[NQ][8];
#pragma GCC unroll 4
    for (int q = 0; q < NQ; ++q) {
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c)
        a[q][c] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + (q * hd + d0 + c) * 16);
    }
    const float* row = vt + d0 * stride;
    int64_t i = i0;
    for (; i + 16 <= std::min(i1, n_pos); i += 16) {
      __m512 pv[NQ];
#pragma GCC unroll 4
      for (int q = 0; q < NQ; ++q) pv[q] = _mm512_loadu_ps(pf + q * pf_stride + i);
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        __m512 v = _mm512_loadu_ps(row + c * stride + i);
        // One load for the NQ fmas: GCC otherwise folds it into each of them (NQ loads).
        __asm__("" : "+v"(v));
#pragma GCC unroll 4
        for (int q = 0; q < NQ; ++q) a[q][c] = _mm512_fmadd_ps(v, pv[q], a[q][c]);
      }
    }
    // Positions at or past n_pos are llama.cpp's zero padding rows: fma(+0, p, a).
    for (; i < i1; i += 16) {
      const __mmask16 m = i < n_pos ? tail : 0;
      __m512 pv[NQ];
#pragma GCC unroll 4
      for (int q = 0; q < NQ; ++q) pv[q] = _mm512_loadu_ps(pf + q * pf_stride + i);
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m512 v = _mm512_maskz_loadu_ps(m, row + c * stride + i);
#pragma GCC unroll 4
        for (int q = 0; q < NQ; ++q) a[q][c] = _mm512_fmadd_ps(v, pv[q], a[q][c]);
      }
    }
#pragma GCC unroll 4
    for (int q = 0; q < NQ; ++q) {
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) _mm512_storeu_ps(acc + (q * hd + d0 + c) * 16, a[q][c]);
    }
  }
}

// The horizontal sums of 16 vectors at once, lane k of the result the sum of v[k] in the order
// the one-vector reduction takes (256-bit halves, 128-bit halves, elements 0,1 + 2,3, then 0 + 1,
// i.e. hi + lo, then reduce8's tree): each level adds two vectors' halves gathered by shuffles.
[[gnu::always_inline]] inline __m512 hsum_16x16(const __m512* v) {
  __m512 w[8], x[4], y[2];
#pragma GCC unroll 8
  for (int m = 0; m < 8; ++m) {  // [A.lo256 | B.lo256] + [A.hi256 | B.hi256]
    w[m] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * m], v[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)),
                         _mm512_shuffle_f32x4(v[2 * m], v[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)));
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {  // each 256-bit half: its high 128 bits + its low ones
    x[j] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * j], w[2 * j + 1], _MM_SHUFFLE(3, 1, 3, 1)),
                         _mm512_shuffle_f32x4(w[2 * j], w[2 * j + 1], _MM_SHUFFLE(2, 0, 2, 0)));
  }
  // x[j]'s 128-bit lane L holds key 4j + L's four partial sums; elements 0,1 + elements 2,3.
#pragma GCC unroll 2
  for (int j = 0; j < 2; ++j) {
    y[j] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * j], x[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(x[2 * j], x[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  // y[j]'s lane L: keys 8j + L and 8j + 4 + L, two sums each; element 0 + element 1.
  const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // r's element 4L + e is key 4e + L.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, r);
}

// The reduction that ends weight_values: each column's 16 lanes, hi + lo, then reduce8's tree,
// 16 columns at a time.
void finish_values(const float* acc, int64_t hd, float* out) {
  int64_t d = 0;
  for (; d + 16 <= hd; d += 16) {
    __m512 v[16];
#pragma GCC unroll 16
    for (int c = 0; c < 16; ++c) v[c] = _mm512_loadu_ps(acc + (d + c) * 16);
    _mm512_storeu_ps(out + d, hsum_16x16(v));
  }
  for (; d < hd; ++d) {
    const float* v = acc + d * 16;
    float t8[8];
    for (int l = 0; l < 8; ++l) t8[l] = v[8 + l] + v[l];
    out[d] = reduce8(t8);
  }
}

// The AVX-512 layout's tile kernels (16 lanes) for attention_tile_with.
struct tile_kernels_16 {
  static constexpr int64_t keys = 16, lanes = 16;
  static const attention_scratch::converted_head& convert(const attention_batch& b,
                                                          attention_scratch& s, int32_t seq,
                                                          int64_t g, int64_t n, int64_t last) {
    return converted(b, s, seq, g, n, last);
  }
  // One block of 16 keys (`kt`; `more`: another block follows, fetched meanwhile) for n_q queries.
  static void scores(const float* kt, bool more, const float* q, int64_t n_q, int64_t hd,
                     float scale, float* out, int64_t ld, float* t8) {
    const float* next_kt = more ? kt + 16 * hd : nullptr;
    if (hd == 64) {
      scores_block<4, 4>(kt, q, n_q, scale, out, ld, t8, next_kt);
    } else if (hd == 128) {
      scores_block<8, 2>(kt, q, n_q, scale, out, ld, t8, next_kt);
    } else {
      for (int64_t qi = 0; qi < n_q; ++qi)
        scores_16_keys(kt, q + qi * hd, hd, scale, out + qi * ld);
    }
  }
  static int64_t softmax(float* sc, int64_t n_pos, float* pf) {
    return softmax_probs_f32(sc, n_pos, pf);
  }
  template <int NQ>
  static void values(const float* vt, int64_t stride, const float* pf, int64_t pf_stride,
                     int64_t n_pos, int64_t i0, int64_t i1, int64_t hd, float* acc, bool first) {
    weight_values<NQ>(vt, stride, pf, pf_stride, n_pos, i0, i1, hd, acc, first);
  }
  static void finish(const float* acc, int64_t hd, float* out) { finish_values(acc, hd, out); }
};

void attention_tile(const attention_batch& b, attention_scratch& s, int64_t t0, int64_t t1,
                    int64_t g, int64_t last) {
  attention_tile_with<tile_kernels_16>(b, s, t0, t1, g, last);
}

// dot_f16 (AVX-512 layout: 4 accumulators over steps of 64, (a0 + a2) + (a1 + a3), then the tree)
// of NH queries (fp16-rounded, as floats, [NH][hd]) against every key [0, n_pos) of the kv head in
// s.offsets, each key row converted once for all of them; times the scale, into sc[h]. Sixteen
// keys' folded accumulators are reduced together (hsum_16x16: the one-vector tree's additions, in
// its order, for 16 vectors at once), where reducing each alone cost a dozen shuffles and adds
// per key and head.
template <int NH>
void scores_gemv(const attention_batch& b, const attention_scratch& s, const float* qf,
                 int64_t n_pos, float* const* sc) {
  const int64_t hd = b.head_dim;
  const __m512 scale = _mm512_set1_ps(b.scale);
  for (int64_t p0 = 0; p0 < n_pos; p0 += 16) {
    const int64_t n = std::min<int64_t>(16, n_pos - p0);
    __m512 folded[NH][16];
    for (int64_t j = 0; j < n; ++j) {
      const int64_t p = p0 + j;
      if (p + key_prefetch_distance < n_pos) {
        prefetch_bytes(b.k_cache + s.offsets[static_cast<size_t>(p + key_prefetch_distance)],
                       hd * 2);
      }
      const uint16_t* k = b.k_cache + s.offsets[static_cast<size_t>(p)];
      __m512 a[NH][4];
#pragma GCC unroll 4
      for (int h = 0; h < NH; ++h) {
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) a[h][c] = _mm512_setzero_ps();
      }
      for (int64_t i = 0; i < hd; i += 64) {
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          const __m512 x =
              _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + i + 16 * c)));
#pragma GCC unroll 4
          for (int h = 0; h < NH; ++h)
            a[h][c] = _mm512_fmadd_ps(x, _mm512_loadu_ps(qf + h * hd + i + 16 * c), a[h][c]);
        }
      }
#pragma GCC unroll 4
      for (int h = 0; h < NH; ++h) {
        folded[h][j] =
            _mm512_add_ps(_mm512_add_ps(a[h][0], a[h][2]), _mm512_add_ps(a[h][1], a[h][3]));
      }
    }
    for (int64_t j = n; j < 16; ++j) {
#pragma GCC unroll 4
      for (int h = 0; h < NH; ++h) folded[h][j] = _mm512_setzero_ps();
    }
    const auto keys = static_cast<__mmask16>((1u << n) - 1u);
#pragma GCC unroll 4
    for (int h = 0; h < NH; ++h)
      _mm512_mask_storeu_ps(sc[h] + p0, keys, _mm512_mul_ps(hsum_16x16(folded[h]), scale));
  }
}

// Query heads [h, h + nh) (nh <= 3, one kv head) of decode token t with GEMV numerics:
// attention_one for each, bit for bit, with the key and value rows read once for all of them.
void attention_group_gemv(const attention_batch& b, attention_scratch& s, int64_t t, int64_t h,
                          int nh) {
  const int64_t group = b.n_heads / b.n_kv_heads;
  const int64_t hd = b.head_dim;
  const int64_t q_stride = b.n_heads * hd;
  const int64_t n_pos = static_cast<int64_t>(b.token_pos[t]) + 1;
  const int64_t n_kv = (n_pos + 31) / 32 * 32;
  set_rows(b, s, b.token_seq[t], n_pos, h / group);
  s.q.resize(static_cast<size_t>(hd));
  s.tile_q.resize(static_cast<size_t>(3 * hd));
  s.tile_scores.resize(static_cast<size_t>(3 * n_kv));
  s.acc.resize(static_cast<size_t>(3 * 64 * hd));
  float* sc[3];
  float* acc[3];
  float* out[3];
  const uint16_t* probs[3];
  for (int k = 0; k < nh; ++k) {
    float_to_half_row(b.q + t * q_stride + (h + k) * hd, s.q.data(), hd);
    half_to_float_row(s.q.data(), s.tile_q.data() + k * hd, hd);
    sc[k] = s.tile_scores.data() + k * n_kv;
    acc[k] = s.acc.data() + k * 64 * hd;
    out[k] = b.out + t * q_stride + (h + k) * hd;
  }
  if (nh == 3) {
    scores_gemv<3>(b, s, s.tile_q.data(), n_pos, sc);
  } else if (nh == 2) {
    scores_gemv<2>(b, s, s.tile_q.data(), n_pos, sc);
  } else {
    scores_gemv<1>(b, s, s.tile_q.data(), n_pos, sc);
  }
  s.group_probs.resize(3);
  for (int k = 0; k < nh; ++k) {
    softmax_probs_to(sc[k], n_pos, s.group_probs[static_cast<size_t>(k)]);
    probs[k] = s.group_probs[static_cast<size_t>(k)].data();
  }
  if (!dot_f16_columns_multi(s.v_rows.data(), n_pos, probs, nh, n_kv, hd, acc, out)) {
    // Not reached (attention_heads checks the same layout and head sizes); the per-head sums give
    // the same bits.
    for (int k = 0; k < nh; ++k)
      dot_f16_columns(s.v_rows.data(), n_pos, probs[k], n_kv, hd, acc[k], out[k]);
  }
}
constexpr bool grouped_gemv_built = true;
#else
constexpr bool tiled_kernel_built = false;
constexpr int64_t attention_tile_tokens = 1;
void attention_tile(const attention_batch&, attention_scratch&, int64_t, int64_t, int64_t,
                    int64_t) {}
constexpr bool grouped_gemv_built = false;
void attention_group_gemv(const attention_batch&, attention_scratch&, int64_t, int64_t, int) {}
#endif

// One (token, query head) pair, every key read for it alone.
void attention_one(const attention_batch& b, attention_scratch& s, int64_t t, int64_t h, bool gemm,
                   int64_t& rows_t, int64_t& rows_g) {
  const int64_t group = b.n_heads / b.n_kv_heads;
  const int64_t hd = b.head_dim;
  const int64_t q_stride = b.n_heads * hd;
  const int64_t g = h / group;
  const int32_t seq = b.token_seq[t];
  const int64_t n_pos = static_cast<int64_t>(b.token_pos[t]) + 1;
  const int64_t n_kv = (n_pos + 31) / 32 * 32;
  if (t != rows_t || g != rows_g) {
    set_rows(b, s, seq, n_pos, g);
    rows_t = t;
    rows_g = g;
  }
  s.scores.resize(static_cast<size_t>(n_kv));
  s.q.resize(static_cast<size_t>(hd));
  s.acc.resize(static_cast<size_t>(64 * hd));
  float_to_half_row(b.q + t * q_stride + h * hd, s.q.data(), hd);
  float* sc = s.scores.data();
  for (int64_t p = 0; p < n_pos; ++p) {
    // The cache rows of one head are strided and the weights streamed through the caches
    // meanwhile evicted them: fetch a few keys ahead.
    if (p + key_prefetch_distance < n_pos) {
      prefetch_bytes(b.k_cache + s.offsets[static_cast<size_t>(p + key_prefetch_distance)], hd * 2);
    }
    const uint16_t* k = b.k_cache + s.offsets[static_cast<size_t>(p)];
    sc[p] = (gemm ? dot_f16_gemm(k, s.q.data(), hd) : dot_f16(k, s.q.data(), hd)) * b.scale;
  }
  softmax_and_values(s, sc, n_pos, hd, gemm, b.out + t * q_stride + h * hd);
}

// Query heads [h0, h1) of token t, all of one kv head: GEMV numerics on the AVX-512 layout with a
// 64- or 128-wide head run up to 3 heads at a time on shared key and value reads.
void attention_heads(const attention_batch& b, attention_scratch& s, int64_t t, int64_t h0,
                     int64_t h1, bool gemm, int64_t& rows_t, int64_t& rows_g) {
  const bool grouped = grouped_gemv_built && !gemm && ggml_simd_layout() == ggml_simd::avx512 &&
                       (b.head_dim == 64 || b.head_dim == 128);
  if (!grouped) {
    for (int64_t h = h0; h < h1; ++h) attention_one(b, s, t, h, gemm, rows_t, rows_g);
    return;
  }
  rows_t = -1;  // attention_group_gemv sets the rows itself
  for (int64_t h = h0; h < h1; h += 3)
    attention_group_gemv(b, s, t, h, static_cast<int>(std::min<int64_t>(3, h1 - h)));
}

}  // namespace

void attention_tasks(const attention_batch& b, attention_scratch& s, int64_t first,
                     int64_t stride) {
  const int64_t lanes = ggml_simd_lanes(ggml_simd_layout());
  const auto gemm_seq = [&](int32_t seq) {
    // GEMM numerics need a lane-aligned head_dim; otherwise ggml also falls back to its GEMV path.
    return b.seq_n_tokens != nullptr && b.seq_n_tokens[seq] >= 2 && b.head_dim % lanes == 0;
  };
  // Tiled work items, the same list on every thread: a tile of prefill tokens x one kv head (the
  // tiled kernel, AVX-512 layout). Threads take items first, first + stride, ...: interleaving
  // balances a causal prefill chunk (later tokens attend to more keys).
  // The 16-lane kernel (AVX-512 builds) or the 8-lane one (AVX2 builds, and AVX-512 builds told
  // to follow ggml's AVX2 layout).
  const bool tiled16 = tiled_kernel_built && lanes == 16;
  const bool tiled8 = lanes == 8 && tile_8_built();
  const bool tiled = tiled16 || tiled8;
  int64_t item = 0;
  int64_t rows_t = -1, rows_g = -1;
  // Converted keys and values are this call's (this layer's) only.
  s.heads.resize(static_cast<size_t>(b.n_kv_heads));
  for (auto& c : s.heads) c.seq = -1;
  int64_t seq_end = 0;  // one past the current tiled sequence's last token in the batch
  for (int64_t t = 0; t < b.n_tokens;) {
    const int32_t seq = b.token_seq[t];
    const bool gemm = gemm_seq(seq);
    if (tiled && gemm) {
      if (seq_end <= t) {
        seq_end = t + 1;
        while (seq_end < b.n_tokens && b.token_seq[seq_end] == seq) ++seq_end;
      }
      const int64_t t1 = std::min(t + (tiled16 ? attention_tile_tokens : 16), seq_end);
      const int64_t last = b.token_pos[seq_end - 1];
      for (int64_t g = 0; g < b.n_kv_heads; ++g, ++item) {
        if ((item - first) % stride != 0 || item < first) continue;
        if (tiled16) {
          attention_tile(b, s, t, t1, g, last);
        } else {
          attention_tile_8(b, s, t, t1, g, last);
        }
      }
      t = t1;
      continue;
    }
    ++t;
  }
  // The other tokens' (token, query head) pairs: each thread takes a contiguous range of them
  // holding an equal share of the keys to read, and runs the heads of one (token, kv head) in its
  // range together (they share every key and value row).
  const auto per_query = [&](int64_t t) { return !(tiled && gemm_seq(b.token_seq[t])); };
  int64_t total = 0;
  for (int64_t t = 0; t < b.n_tokens; ++t) {
    if (per_query(t)) total += b.n_heads * (static_cast<int64_t>(b.token_pos[t]) + 1);
  }
  const int64_t lo = total * first / stride, hi = total * (first + 1) / stride;
  const int64_t group = b.n_heads / b.n_kv_heads;
  int64_t cost = 0;
  for (int64_t t = 0; t < b.n_tokens && cost < hi; ++t) {
    if (!per_query(t)) continue;
    const int64_t keys = static_cast<int64_t>(b.token_pos[t]) + 1;
    const bool gemm = gemm_seq(b.token_seq[t]);
    int64_t run = -1;  // first head of the current run of this thread's heads
    for (int64_t h = 0; h < b.n_heads; ++h, cost += keys) {
      const bool mine = cost >= lo && cost < hi;
      if (run >= 0 && (!mine || h % group == 0)) {
        attention_heads(b, s, t, run, h, gemm, rows_t, rows_g);
        run = -1;
      }
      if (mine && run < 0) run = h;
    }
    if (run >= 0) attention_heads(b, s, t, run, b.n_heads, gemm, rows_t, rows_g);
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
