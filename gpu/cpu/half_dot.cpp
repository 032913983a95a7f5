#include "gpu/cpu/half_dot.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gpu/cpu/elementwise.hpp"
#include "gpu/cpu/quant_dot.hpp"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define WEFT_CPU_AVX2 1
#include "gpu/cpu/simd.hpp"
#endif

namespace weft::gpu::cpu {

// -- half and f32 dot products ------------------------------------------------------------------

namespace {

// Element-wise fp16 FMA of 8 consecutive elements into 8 float lanes.
inline void fma_f16_8(const uint16_t* x, const uint16_t* y, float* acc) {
#ifdef WEFT_CPU_AVX2
  const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
  const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y)));
  _mm256_storeu_ps(acc, _mm256_fmadd_ps(a, b, _mm256_loadu_ps(acc)));
#else
  for (int l = 0; l < 8; ++l) acc[l] = std::fma(half_to_float(x[l]), half_to_float(y[l]), acc[l]);
#endif
}

// The reduction of ggml_vec_dot_f16's 4 accumulators (`at(j, l)`: accumulator j, lane l): acc0 +=
// acc2, acc1 += acc3, acc0 += acc1, then the layout's horizontal sum (GGML_F32x8_REDUCE for 8
// lanes: lo + hi, then two horizontal adds).
template <int lanes, class At>
double reduce_dot_f16(At at) {
  float v[lanes];
  for (int l = 0; l < lanes; ++l) v[l] = (at(0, l) + at(2, l)) + (at(1, l) + at(3, l));
  if constexpr (lanes == 16) {
    float t8[8];
    for (int l = 0; l < 8; ++l) t8[l] = v[8 + l] + v[l];
    float t4[4];
    for (int l = 0; l < 4; ++l) t4[l] = t8[4 + l] + t8[l];
    return static_cast<double>((t4[0] + t4[2]) + (t4[1] + t4[3]));
  } else {
    float t4[4];
    for (int l = 0; l < 4; ++l) t4[l] = v[l] + v[4 + l];
    return static_cast<double>((t4[0] + t4[1]) + (t4[2] + t4[3]));
  }
}

// ggml_vec_dot_f16 with `lanes`-wide registers: 4 accumulators over steps of 4 * lanes, reduced
// as acc0 += acc2, acc1 += acc3, acc0 += acc1, then the layout's horizontal sum; tail in double.
template <int lanes>
float dot_f16_vec(const uint16_t* x, const uint16_t* y, int64_t n) {
  constexpr int64_t step = 4 * lanes;
  const int64_t np = n / step * step;
  float acc[4][lanes] = {};
  for (int64_t i = 0; i < np; i += step) {
    for (int j = 0; j < 4; ++j) {
      for (int h = 0; h < lanes; h += 8)
        fma_f16_8(x + i + lanes * j + h, y + i + lanes * j + h, &acc[j][h]);
    }
  }
  double sum = 0.0;
  if (np > 0) {
    sum = reduce_dot_f16<lanes>([&](int j, int l) { return acc[j][l]; });
  }
  for (int64_t i = np; i < n; ++i)
    sum += static_cast<double>(half_to_float(x[i]) * half_to_float(y[i]));
  return static_cast<float>(sum);
}

#if defined(WEFT_CPU_AVX2) && defined(__AVX512F__) && defined(__AVX512DQ__)
// The 16-lane layout in registers (attention's K dots on AVX-512 hosts): the same FMAs and the
// same reduction tree as the generic version, so the results are bit-identical.
template <>
float dot_f16_vec<16>(const uint16_t* x, const uint16_t* y, int64_t n) {
  const int64_t np = n / 64 * 64;
  __m512 a0 = _mm512_setzero_ps();
  __m512 a1 = _mm512_setzero_ps();
  __m512 a2 = _mm512_setzero_ps();
  __m512 a3 = _mm512_setzero_ps();
  const auto half16 = [](const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  };
  for (int64_t i = 0; i < np; i += 64) {
    a0 = _mm512_fmadd_ps(half16(x + i), half16(y + i), a0);
    a1 = _mm512_fmadd_ps(half16(x + i + 16), half16(y + i + 16), a1);
    a2 = _mm512_fmadd_ps(half16(x + i + 32), half16(y + i + 32), a2);
    a3 = _mm512_fmadd_ps(half16(x + i + 48), half16(y + i + 48), a3);
  }
  double sum = 0.0;
  if (np > 0) {
    // v = (acc0 + acc2) + (acc1 + acc3); t8 = v.hi + v.lo; t4 = t8.hi + t8.lo;
    // (t4[0] + t4[2]) + (t4[1] + t4[3]).
    const __m512 v = _mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3));
    const __m256 t8 = _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
    const __m128 t4 = _mm_add_ps(_mm256_extractf128_ps(t8, 1), _mm256_castps256_ps128(t8));
    const __m128 h = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    sum = static_cast<double>(_mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h))));
  }
  for (int64_t i = np; i < n; ++i)
    sum += static_cast<double>(half_to_float(x[i]) * half_to_float(y[i]));
  return static_cast<float>(sum);
}
#endif

#ifdef WEFT_CPU_AVX2
// The 8-lane layout in registers (attention's K dots call this once per key): the same FMAs and
// the same reduction tree as the generic version above, so the results are bit-identical.
template <>
float dot_f16_vec<8>(const uint16_t* x, const uint16_t* y, int64_t n) {
  const int64_t np = n / 32 * 32;
  __m256 a0 = _mm256_setzero_ps();
  __m256 a1 = _mm256_setzero_ps();
  __m256 a2 = _mm256_setzero_ps();
  __m256 a3 = _mm256_setzero_ps();
  const auto half8 = [](const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  };
  for (int64_t i = 0; i < np; i += 32) {
    a0 = _mm256_fmadd_ps(half8(x + i), half8(y + i), a0);
    a1 = _mm256_fmadd_ps(half8(x + i + 8), half8(y + i + 8), a1);
    a2 = _mm256_fmadd_ps(half8(x + i + 16), half8(y + i + 16), a2);
    a3 = _mm256_fmadd_ps(half8(x + i + 24), half8(y + i + 24), a3);
  }
  double sum = 0.0;
  if (np > 0) {
    // v = (acc0 + acc2) + (acc1 + acc3); t4 = v.lo + v.hi; (t4[0] + t4[1]) + (t4[2] + t4[3]).
    const __m256 v = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
    const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 h = _mm_hadd_ps(t4, t4);
    sum = static_cast<double>(_mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h))));
  }
  for (int64_t i = np; i < n; ++i)
    sum += static_cast<double>(half_to_float(x[i]) * half_to_float(y[i]));
  return static_cast<float>(sum);
}
#endif

// acc[i % slots][d] = fma(v_i[d], y[i], acc[i % slots][d]) for i < np, in i order: the FMA chain
// of lane (i % slots) of a dot product, for every column d of a row-major V at once. Rows past
// n_rows are zeros (padding).
void column_fma(const uint16_t* const* rows, int64_t n_rows, const uint16_t* y, int64_t np,
                int64_t slots, int64_t n_cols, float* acc) {
  std::fill(acc, acc + slots * n_cols, 0.0f);
  for (int64_t i = 0; i < np; ++i) {
    float* a = acc + (i % slots) * n_cols;
    const float p = half_to_float(y[i]);
    if (i >= n_rows) {
      // A zero row: fma(0, p, a) is exactly a + (0 * p) (only the sign of a zero sum can change).
      const float z = 0.0f * p;
      for (int64_t d = 0; d < n_cols; ++d) a[d] += z;
      continue;
    }
    const uint16_t* v = rows[i];
    // Strided cache rows, likely evicted by the weight stream: fetch a few rows ahead.
    if (i + 8 < n_rows) prefetch_bytes(rows[i + 8], n_cols * 2);
    int64_t d = 0;
#if defined(WEFT_CPU_AVX2) && defined(__AVX512F__)
    const __m512 pw = _mm512_set1_ps(p);
    for (; d + 16 <= n_cols; d += 16) {
      const __m512 x = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + d)));
      _mm512_storeu_ps(a + d, _mm512_fmadd_ps(x, pw, _mm512_loadu_ps(a + d)));
    }
#endif
#ifdef WEFT_CPU_AVX2
    const __m256 pv = _mm256_set1_ps(p);
    for (; d + 8 <= n_cols; d += 8) {
      const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + d)));
      _mm256_storeu_ps(a + d, _mm256_fmadd_ps(x, pv, _mm256_loadu_ps(a + d)));
    }
#endif
    for (; d < n_cols; ++d) a[d] = std::fma(half_to_float(v[d]), p, a[d]);
  }
}

// dot_f16_vec (4 accumulators of `lanes` lanes per step) for every column of V. The reduction
// tree and the double tail run over 16 columns at a time (each column's operations in dot_f16_vec's
// order; the loops over columns vectorize).
// The reduction and double tail of dot_f16_columns_vec over accumulators column_fma filled.
#if defined(WEFT_CPU_AVX2) && defined(__AVX512F__)
// reduce_columns<16> for the 16 columns from d0, in vectors: every column's operations and their
// order as in the scalar loops (the tree in floats, then the tail's float products added in
// double), so the same bits. Decode contexts are short: the tail (up to 63 positions past the
// last whole step) is often as long as the part the accumulators hold.
void reduce_16_columns(const uint16_t* const* rows, int64_t n_rows, const uint16_t* y, int64_t n,
                       int64_t np, int64_t n_cols, int64_t d0, const float* acc, float* out) {
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  if (np > 0) {
    const auto at = [&](int j, int l) { return _mm512_loadu_ps(acc + (j * 16 + l) * n_cols + d0); };
    __m512 v[16];
#pragma GCC unroll 16
    for (int l = 0; l < 16; ++l)
      v[l] = _mm512_add_ps(_mm512_add_ps(at(0, l), at(2, l)), _mm512_add_ps(at(1, l), at(3, l)));
    const __m512 sum = tree_sum_16(v);
    lo = _mm512_cvtps_pd(_mm512_castps512_ps256(sum));
    hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sum), 1)));
  }
  for (int64_t i = np; i < n; ++i) {
    const __m512 x =
        i < n_rows
            ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[i] + d0)))
            : _mm512_setzero_ps();
    const __m512 prod = _mm512_mul_ps(x, _mm512_set1_ps(half_to_float(y[i])));
    lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(prod)));
    hi = _mm512_add_pd(
        hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(prod), 1))));
  }
  _mm256_storeu_ps(out + d0, _mm512_cvtpd_ps(lo));
  _mm256_storeu_ps(out + d0 + 8, _mm512_cvtpd_ps(hi));
}
#endif

template <int lanes>
void reduce_columns(const uint16_t* const* rows, int64_t n_rows, const uint16_t* y, int64_t n,
                    int64_t n_cols, const float* acc, float* out) {
  constexpr int64_t step = 4 * lanes;
  constexpr int w = 16;
  const int64_t np = n / step * step;
  for (int64_t d0 = 0; d0 < n_cols; d0 += w) {
    const int m = static_cast<int>(std::min<int64_t>(w, n_cols - d0));
#if defined(WEFT_CPU_AVX2) && defined(__AVX512F__)
    if (lanes == 16 && m == w) {
      reduce_16_columns(rows, n_rows, y, n, np, n_cols, d0, acc, out);
      continue;
    }
#endif
    double sum[w] = {};
    if (np > 0) {
      const auto at = [&](int j, int l) { return acc + (j * lanes + l) * n_cols + d0; };
      float v[lanes][w];
      for (int l = 0; l < lanes; ++l) {
        const float *a0 = at(0, l), *a1 = at(1, l), *a2 = at(2, l), *a3 = at(3, l);
        for (int k = 0; k < m; ++k) v[l][k] = (a0[k] + a2[k]) + (a1[k] + a3[k]);
      }
      float t4[4][w];
      if constexpr (lanes == 16) {
        float t8[8][w];
        for (int l = 0; l < 8; ++l)
          for (int k = 0; k < m; ++k) t8[l][k] = v[8 + l][k] + v[l][k];
        for (int l = 0; l < 4; ++l)
          for (int k = 0; k < m; ++k) t4[l][k] = t8[4 + l][k] + t8[l][k];
        for (int k = 0; k < m; ++k)
          sum[k] = static_cast<double>((t4[0][k] + t4[2][k]) + (t4[1][k] + t4[3][k]));
      } else {
        for (int l = 0; l < 4; ++l)
          for (int k = 0; k < m; ++k) t4[l][k] = v[l][k] + v[4 + l][k];
        for (int k = 0; k < m; ++k)
          sum[k] = static_cast<double>((t4[0][k] + t4[1][k]) + (t4[2][k] + t4[3][k]));
      }
    }
    float x[w];
    for (int64_t i = np; i < n; ++i) {
      if (i < n_rows) {
        half_to_float_row(rows[i] + d0, x, m);
      } else {
        std::fill(x, x + m, 0.0f);
      }
      const float p = half_to_float(y[i]);
      for (int k = 0; k < m; ++k) sum[k] += static_cast<double>(x[k] * p);
    }
    for (int k = 0; k < m; ++k) out[d0 + k] = static_cast<float>(sum[k]);
  }
}

template <int lanes>
void dot_f16_columns_vec(const uint16_t* const* rows, int64_t n_rows, const uint16_t* y, int64_t n,
                         int64_t n_cols, float* acc, float* out) {
  constexpr int64_t step = 4 * lanes;
  column_fma(rows, n_rows, y, n / step * step, step, n_cols, acc);
  reduce_columns<lanes>(rows, n_rows, y, n, n_cols, acc, out);
}

#if defined(WEFT_CPU_AVX2) && defined(__AVX512F__)
// column_fma for NY weight vectors over the same rows (slots = 64, n_cols = 16 * NC), slot by slot:
// each slot's chain (positions slot, slot + 64, ... in order) runs in registers for every column
// and vector, so each row is converted once for all NY vectors and no accumulator goes through
// memory per row. The accumulators end as column_fma leaves them.
template <int NY, int NC>
void column_fma_slots(const uint16_t* const* rows, int64_t n_rows, const uint16_t* const* ys,
                      int64_t np, float* const* acc) {
  constexpr int64_t n_cols = 16 * NC;
  for (int64_t slot = 0; slot < 64; ++slot) {
    __m512 a[NY][NC];
#pragma GCC unroll 4
    for (int y = 0; y < NY; ++y) {
#pragma GCC unroll 8
      for (int c = 0; c < NC; ++c) a[y][c] = _mm512_setzero_ps();
    }
    for (int64_t i = slot; i < np; i += 64) {
      __m512 pw[NY];
#pragma GCC unroll 4
      for (int y = 0; y < NY; ++y) pw[y] = _mm512_set1_ps(half_to_float(ys[y][i]));
      if (i >= n_rows) {
        // A zero row: fma(0, p, a) is exactly a + (0 * p), as column_fma adds it.
#pragma GCC unroll 4
        for (int y = 0; y < NY; ++y) {
          const __m512 z = _mm512_mul_ps(_mm512_setzero_ps(), pw[y]);
#pragma GCC unroll 8
          for (int c = 0; c < NC; ++c) a[y][c] = _mm512_add_ps(a[y][c], z);
        }
        continue;
      }
      if (i + 128 < n_rows) prefetch_bytes(rows[i + 128], n_cols * 2);
      const uint16_t* v = rows[i];
#pragma GCC unroll 8
      for (int c = 0; c < NC; ++c) {
        const __m512 x =
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 16 * c)));
#pragma GCC unroll 4
        for (int y = 0; y < NY; ++y) a[y][c] = _mm512_fmadd_ps(x, pw[y], a[y][c]);
      }
    }
    for (int y = 0; y < NY; ++y) {
      for (int c = 0; c < NC; ++c) _mm512_storeu_ps(acc[y] + slot * n_cols + 16 * c, a[y][c]);
    }
  }
}
#endif

}  // namespace

bool dot_f16_columns_multi(const uint16_t* const* rows, int64_t n_rows, const uint16_t* const* ys,
                           int n_y, int64_t n, int64_t n_cols, float* const* scratch,
                           float* const* outs) {
#if defined(WEFT_CPU_AVX2) && defined(__AVX512F__)
  if (ggml_simd_layout() != ggml_simd::avx512 || n_y < 1 || n_y > 3 ||
      (n_cols != 64 && n_cols != 128))
    return false;
  const int64_t np = n / 64 * 64;
  const int key = n_y * 1000 + static_cast<int>(n_cols);
  switch (key) {
    case 1064:
      column_fma_slots<1, 4>(rows, n_rows, ys, np, scratch);
      break;
    case 2064:
      column_fma_slots<2, 4>(rows, n_rows, ys, np, scratch);
      break;
    case 3064:
      column_fma_slots<3, 4>(rows, n_rows, ys, np, scratch);
      break;
    case 1128:
      column_fma_slots<1, 8>(rows, n_rows, ys, np, scratch);
      break;
    case 2128:
      column_fma_slots<2, 8>(rows, n_rows, ys, np, scratch);
      break;
    default:
      column_fma_slots<3, 8>(rows, n_rows, ys, np, scratch);
      break;
  }
  for (int y = 0; y < n_y; ++y)
    reduce_columns<16>(rows, n_rows, ys[y], n, n_cols, scratch[y], outs[y]);
  return true;
#else
  (void)rows, (void)n_rows, (void)ys, (void)n_y, (void)n, (void)n_cols, (void)scratch, (void)outs;
  return false;
#endif
}

void dot_f16_columns(const uint16_t* const* rows, int64_t n_rows, const uint16_t* y, int64_t n,
                     int64_t n_cols, float* scratch, float* out) {
  if (ggml_simd_layout() == ggml_simd::avx512) {
    dot_f16_columns_vec<16>(rows, n_rows, y, n, n_cols, scratch, out);
  } else {
    dot_f16_columns_vec<8>(rows, n_rows, y, n, n_cols, scratch, out);
  }
}

void dot_f16_gemm_columns(const uint16_t* const* rows, int64_t n_rows, const uint16_t* y, int64_t n,
                          int64_t n_cols, float* scratch, float* out) {
  const bool wide = ggml_simd_layout() == ggml_simd::avx512;
  const int64_t lanes = wide ? 16 : 8;
  column_fma(rows, n_rows, y, n, lanes, n_cols, scratch);
  for (int64_t d = 0; d < n_cols; ++d) {
    float v[16];
    for (int64_t l = 0; l < lanes; ++l) v[l] = scratch[l * n_cols + d];
    if (wide) {
      float t8[8];
      for (int l = 0; l < 8; ++l) t8[l] = v[8 + l] + v[l];
      out[d] = reduce8(t8);
    } else {
      out[d] = reduce8(v);
    }
  }
}

float dot_f16(const uint16_t* x, const uint16_t* y, int64_t n) {
  return ggml_simd_layout() == ggml_simd::avx512 ? dot_f16_vec<16>(x, y, n)
                                                 : dot_f16_vec<8>(x, y, n);
}

float dot_f16_gemm(const uint16_t* x, const uint16_t* y, int64_t n) {
  if (ggml_simd_layout() == ggml_simd::avx512) {
    float acc[16] = {};
    for (int64_t i = 0; i < n; i += 16) {
      fma_f16_8(x + i, y + i, acc);
      fma_f16_8(x + i + 8, y + i + 8, acc + 8);
    }
    // _mm512_reduce_add_ps: halves added (256, then 128 bits), then hsum_float_8's tail order.
    float t8[8];
    for (int l = 0; l < 8; ++l) t8[l] = acc[8 + l] + acc[l];
    return reduce8(t8);
  }
  float acc[8] = {};
  for (int64_t i = 0; i < n; i += 8) fma_f16_8(x + i, y + i, acc);
  return reduce8(acc);
}

float dot_f16_f32(const uint16_t* w, const float* x, int64_t n) {
  constexpr int64_t chunk = 256;
  uint16_t xh[chunk];
  // Rounding x to fp16 chunk-wise keeps the lane layout only within chunks: callers that need
  // ggml's exact layout pass n <= 256 or use dot_f16 on a converted row.
  if (n <= chunk) {
    float_to_half_row(x, xh, n);
    return dot_f16(w, xh, n);
  }
  double sum = 0.0;
  for (int64_t i = 0; i < n; i += chunk) {
    const int64_t m = std::min(chunk, n - i);
    float_to_half_row(x + i, xh, m);
    sum += dot_f16(w + i, xh, m);
  }
  return static_cast<float>(sum);
}

float dot_f32(const float* x, const float* y, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
#ifdef WEFT_CPU_AVX2
  __m256 a = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a);
  _mm256_storeu_ps(acc, a);
#else
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(x[i + l], y[i + l], acc[l]);
  }
#endif
  float s = reduce8(acc);
  for (; i < n; ++i) s += x[i] * y[i];
  return s;
}

#if defined(WEFT_CPU_AVX2) && defined(__AVX512F__)
#define WEFT_F32_PAIRS 1
#endif

void pack_f32_acts(f32_acts& a, std::vector<float>& buf) {
  a.pairs = nullptr;
#ifdef WEFT_F32_PAIRS
  // Pair p, step k: x[2p][8k..8k+8] then x[2p+1][8k..8k+8] (an odd count repeats its last token).
  const int64_t steps = a.n / 8;
  const int64_t n_pairs = (a.n_tokens + 1) / 2;
  buf.resize(static_cast<size_t>(n_pairs * steps * 16));
  for (int64_t p = 0; p < n_pairs; ++p) {
    const float* lo = a.x + 2 * p * a.n;
    const float* hi = 2 * p + 1 < a.n_tokens ? lo + a.n : lo;
    float* out = buf.data() + p * steps * 16;
    for (int64_t k = 0; k < steps; ++k) {
      std::copy(lo + 8 * k, lo + 8 * k + 8, out + 16 * k);
      std::copy(hi + 8 * k, hi + 8 * k + 8, out + 16 * k + 8);
    }
  }
  a.pairs = buf.data();
#else
  (void)buf;
#endif
}

namespace {

// The lanes of (row r, token j)'s chain summed as dot_f32 sums them, with its scalar tail.
inline float finish_f32(const float* lanes, const float* row, const float* x, int64_t i,
                        int64_t n) {
  float s = reduce8(lanes);
  for (; i < n; ++i) s += row[i] * x[i];
  return s;
}

#ifdef WEFT_CPU_AVX2
// reduce8 of a register's 8 lanes, in registers: (l + 4) + l, then (0 + 2) + (1 + 3).
inline float reduce8_reg(__m256 v) {
  const __m128 t4 = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));
}

inline float finish_f32(__m256 lanes, const float* row, const float* x, int64_t i, int64_t n) {
  float s = reduce8_reg(lanes);
  for (; i < n; ++i) s += row[i] * x[i];
  return s;
}
#endif

#ifdef WEFT_F32_PAIRS
// NP pairs of tokens: each zmm holds the 8-lane chains of two tokens side by side (the weight's 8
// floats broadcast to both halves), so one 16-lane FMA advances two dot_f32 chains.
template <int NP>
void tile_f32(const float* w, int64_t stride, const f32_acts& a, int64_t t0, int n_tok,
              float* const* out, const float* next) {
  const float* rows[f32_tile_rows];
  for (int r = 0; r < f32_tile_rows; ++r) rows[r] = w + r * stride;
  const int64_t steps = a.n / 8;
  const float* pair[NP];
  for (int p = 0; p < NP; ++p) pair[p] = a.pairs + (t0 / 2 + p) * steps * 16;
  __m512 acc[f32_tile_rows][NP];
#pragma GCC unroll 4
  for (int r = 0; r < f32_tile_rows; ++r) {
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  static_assert(f32_tile_rows * 8 * sizeof(float) == 128, "two cache lines of `next` a step");
  for (int64_t k = 0; k < steps; ++k) {
    if (next != nullptr) {
      _mm_prefetch(reinterpret_cast<const char*>(next + f32_tile_rows * 8 * k), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(next + f32_tile_rows * 8 * k + 16), _MM_HINT_T1);
    }
    __m512 wv[f32_tile_rows];
#pragma GCC unroll 4
    for (int r = 0; r < f32_tile_rows; ++r)
      wv[r] = _mm512_broadcast_f32x8(_mm256_loadu_ps(rows[r] + 8 * k));
#pragma GCC unroll 4
    for (int p = 0; p < NP; ++p) {
      const __m512 b = _mm512_loadu_ps(pair[p] + 16 * k);
#pragma GCC unroll 4
      for (int r = 0; r < f32_tile_rows; ++r) acc[r][p] = _mm512_fmadd_ps(wv[r], b, acc[r][p]);
    }
  }
  for (int r = 0; r < f32_tile_rows; ++r) {
    for (int p = 0; p < NP; ++p) {
      const int j = 2 * p;
      out[j][r] = finish_f32(_mm512_castps512_ps256(acc[r][p]), rows[r], a.x + (t0 + j) * a.n,
                             8 * steps, a.n);
      if (j + 1 < n_tok) {
        out[j + 1][r] =
            finish_f32(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r][p]), 1)),
                       rows[r], a.x + (t0 + j + 1) * a.n, 8 * steps, a.n);
      }
    }
  }
}
#else
// NT tokens: one 8-lane FMA chain per (row, token), each the chain of dot_f32.
template <int NT>
void tile_f32(const float* w, int64_t stride, const f32_acts& a, int64_t t0, int /*n_tok*/,
              float* const* out, const float* next) {
  const float* rows[f32_tile_rows];
  for (int r = 0; r < f32_tile_rows; ++r) rows[r] = w + r * stride;
  const float* x[NT];
  for (int j = 0; j < NT; ++j) x[j] = a.x + (t0 + j) * a.n;
  const int64_t n = a.n;
  int64_t i = 0;
#ifdef WEFT_CPU_AVX2
  __m256 acc[f32_tile_rows][NT];
#pragma GCC unroll 4
  for (int r = 0; r < f32_tile_rows; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < NT; ++j) acc[r][j] = _mm256_setzero_ps();
  }
  for (; i + 8 <= n; i += 8) {
    if (next != nullptr) {
      _mm_prefetch(reinterpret_cast<const char*>(next + f32_tile_rows * i), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(next + f32_tile_rows * i + 16), _MM_HINT_T1);
    }
    __m256 wv[f32_tile_rows];
#pragma GCC unroll 4
    for (int r = 0; r < f32_tile_rows; ++r) wv[r] = _mm256_loadu_ps(rows[r] + i);
#pragma GCC unroll 4
    for (int j = 0; j < NT; ++j) {
      const __m256 b = _mm256_loadu_ps(x[j] + i);
#pragma GCC unroll 4
      for (int r = 0; r < f32_tile_rows; ++r) acc[r][j] = _mm256_fmadd_ps(wv[r], b, acc[r][j]);
    }
  }
#else
  (void)next;
  float acc[f32_tile_rows][NT][8] = {};
  for (; i + 8 <= n; i += 8) {
    for (int r = 0; r < f32_tile_rows; ++r) {
      for (int j = 0; j < NT; ++j) {
        for (int l = 0; l < 8; ++l)
          acc[r][j][l] = std::fma(rows[r][i + l], x[j][i + l], acc[r][j][l]);
      }
    }
  }
#endif
  for (int r = 0; r < f32_tile_rows; ++r) {
    for (int j = 0; j < NT; ++j) {
      out[j][r] = finish_f32(acc[r][j], rows[r], x[j], i, n);
    }
  }
}
#endif

}  // namespace

void dot_tile_f32(const float* w, int64_t stride, const f32_acts& a, int64_t t0, int n_tok,
                  float* const* out, const float* next) {
#ifdef WEFT_F32_PAIRS
  const int groups = (n_tok + 1) / 2;  // tile_f32's parameter counts token pairs
#else
  const int groups = n_tok;
#endif
  switch (groups) {
    case 1:
      return tile_f32<1>(w, stride, a, t0, n_tok, out, next);
    case 2:
      return tile_f32<2>(w, stride, a, t0, n_tok, out, next);
    case 3:
      return tile_f32<3>(w, stride, a, t0, n_tok, out, next);
    default:
      return tile_f32<4>(w, stride, a, t0, n_tok, out, next);
  }
}

}  // namespace weft::gpu::cpu
