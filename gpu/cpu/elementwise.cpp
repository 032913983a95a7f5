#include "gpu/cpu/elementwise.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include "gpu/cpu/simd.hpp"
#endif

#include "gpu/cpu/quant_dot.hpp"

namespace weft::gpu::cpu {

float exp_approx_avx512(float x) {
  const float r = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, r);
  const float n = z - r;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  if (!(std::fabs(n) <= 192.0f)) {
    if (std::isnan(x)) return x;
    return x > 0.0f ? std::numeric_limits<float>::infinity() : 0.0f;
  }
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                    std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, std::fma(0x1.ffffecp-1f, b, 1.0f));
  // j * 2^n: for |n| <= 126, 2^n is a normal float and the product is j * 2^n correctly rounded,
  // which is what ldexp returns (without its library call).
  if (std::fabs(n) <= 126.0f)
    return j * std::bit_cast<float>(static_cast<uint32_t>(static_cast<int>(n) + 127) << 23);
  return std::ldexp(j, static_cast<int>(n));
}

float exp_approx_avx2(float x) {
  // Same reduction and polynomial; 2^n is built in the exponent bits of k, the result is k + k*p.
  const float r = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, r);
  const float n = z - r;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  const uint32_t e = std::bit_cast<uint32_t>(z) << 23;
  const float k = std::bit_cast<float>(e + std::bit_cast<uint32_t>(1.0f));
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                    std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, 0x1.ffffecp-1f * b);
  const float an = std::fabs(n);
  if (!(an > 126.0f)) return std::fma(k, j, k);  // also NaN
  // Outside the normal exponent range: scale in two steps (s2 * s1), or saturate to 0 / inf.
  const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
  const float s1 = std::bit_cast<float>(g + 0x7f000000u);
  if (an > 192.0f) return s1 * s1;
  const float s2 = std::bit_cast<float>(e - g);
  return std::fma(s2, j, s2) * s1;
}

float exp_approx(float x) {
  return ggml_simd_layout() == ggml_simd::avx512 ? exp_approx_avx512(x) : exp_approx_avx2(x);
}

void rms_norm_rows(const float* x, const float* weight, float* y, int64_t row_begin,
                   int64_t row_end, int64_t dim, float eps) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum += static_cast<double>(xr[i] * xr[i]);
    const float mean = static_cast<float>(sum / static_cast<double>(dim));
    const float scale = 1.0f / std::sqrt(mean + eps);
    if (weight != nullptr) {
      for (int64_t i = 0; i < dim; ++i) yr[i] = (xr[i] * scale) * weight[i];
    } else {
      for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * scale;
    }
  }
}

void rope_cache(float* cache, int32_t position, const rope_config& config) {
  const float theta_scale = std::pow(config.freq_base, -2.0f / static_cast<float>(config.n_dims));
  float theta = static_cast<float>(position);
  for (int64_t i = 0; i < config.n_dims; i += 2) {
    const float base = config.freq_factors != nullptr ? theta / config.freq_factors[i / 2] : theta;
    const float t = config.freq_scale * base;
    cache[i] = std::cos(t);
    cache[i + 1] = std::sin(t);
    theta *= theta_scale;
  }
}

void rope_head(float* x, const float* cache, const rope_config& config) {
  const int64_t n = config.n_dims;
  if (config.style == rope_style::normal) {
    for (int64_t i = 0; i < n; i += 2) {
      const float c = cache[i];
      const float s = cache[i + 1];
      const float x0 = x[i];
      const float x1 = x[i + 1];
      // The contraction GCC applies to ggml's `x0*c - x1*s` / `x0*s + x1*c`.
      x[i] = std::fma(x0, c, -(x1 * s));
      x[i + 1] = std::fma(x0, s, x1 * c);
    }
  } else {
    const int64_t half = n / 2;
    for (int64_t i = 0; i < half; ++i) {
      const float c = cache[2 * i];
      const float s = cache[2 * i + 1];
      const float x0 = x[i];
      const float x1 = x[i + half];
      x[i] = std::fma(x0, c, -(x1 * s));
      x[i + half] = std::fma(x0, s, x1 * c);
    }
  }
}

void add_range(const float* a, const float* b, float* y, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) y[i] = a[i] + b[i];
}

float reduce16(const float* v) {
  float t8[8];
  for (int l = 0; l < 8; ++l) t8[l] = v[8 + l] + v[l];
  return reduce8(t8);
}

float reduce8(const float* v) {
  float t4[4];
  for (int l = 0; l < 4; ++l) t4[l] = v[4 + l] + v[l];
  return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

namespace {

// exp_approx's constants: 2^n * e^b with n = round(x / ln 2), b = x - n ln 2 (ln 2 in two parts),
// e^b by a degree-5 polynomial.
constexpr float kRound = 0x1.8p23f, kLog2e = 0x1.715476p+0f, kLn2Hi = 0x1.62e4p-1f,
                kLn2Lo = 0x1.7f7d1cp-20f, kP5 = 0x1.0e4020p-7f, kP4 = 0x1.573e2ep-5f,
                kP3 = 0x1.555e66p-3f, kP2 = 0x1.fffdb6p-2f, kP1 = 0x1.ffffecp-1f;
constexpr float kLowest = -87.0f;  // e^-87 ~ 1.6e-38: 2^n stays a normal float

template <int lanes, float (*exp_fn)(float)>
double exp_sum_row_impl(float* x, int64_t n, float max) {
  double sum = 0.0;
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    for (int l = 0; l < lanes; ++l) x[i + l] = exp_fn(x[i + l] - max);
    sum += static_cast<double>(lanes == 16 ? reduce16(x + i) : reduce8(x + i));
  }
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - max);  // ggml's scalar tail uses the C library's expf.
    sum += static_cast<double>(x[i]);
  }
  return sum;
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// The last level of reduce8's tree on t4 = hi + lo: (t4[0] + t4[2]) + (t4[1] + t4[3]).
inline float reduce4_tree(__m128 t4) {
  const __m128 t2 = _mm_add_ps(_mm_movehl_ps(t4, t4), t4);  // t4[0] + t4[2], t4[1] + t4[3]
  return _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));
}

// exp_sum_row_impl's tail from i (fewer than a vector's lanes left): the C library's expf, as
// ggml's scalar tail.
double exp_sum_tail(float* x, int64_t i, int64_t n, float max, double sum) {
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += static_cast<double>(x[i]);
  }
  return sum;
}
#endif

#if defined(__AVX512F__)
// exp_approx's reduction and polynomial on 16 lanes: returns e^b, with n (= round(v / ln 2), as a
// float) in `k`; the caller scales by 2^n.
inline __m512 exp_poly_avx512(__m512 v, __m512& k) {
  const __m512 round = _mm512_set1_ps(kRound);
  k = _mm512_sub_ps(_mm512_fmadd_ps(v, _mm512_set1_ps(kLog2e), round), round);
  const __m512 b =
      _mm512_fnmadd_ps(k, _mm512_set1_ps(kLn2Lo), _mm512_fnmadd_ps(k, _mm512_set1_ps(kLn2Hi), v));
  const __m512 u = _mm512_mul_ps(b, b);
  return _mm512_fmadd_ps(
      _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(kP5), b, _mm512_set1_ps(kP4)), u,
                      _mm512_fmadd_ps(_mm512_set1_ps(kP3), b, _mm512_set1_ps(kP2))),
      u, _mm512_fmadd_ps(_mm512_set1_ps(kP1), b, _mm512_set1_ps(1.0f)));
}

// exp_sum_row_impl<16, exp_approx_avx512> in registers: the same reduction and polynomial per lane,
// j * 2^n by scalef (correctly rounded, as exp_approx_avx512's multiply or ldexp), and each group
// of 16 added in reduce16's tree before the double sum.
double exp_sum_row_avx512(float* x, int64_t n, float max) {
  double sum = 0.0;
  int64_t i = 0;
  const __m512 vmax = _mm512_set1_ps(max);
  for (; i + 16 <= n; i += 16) {
    __m512 k;
    const __m512 j = exp_poly_avx512(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmax), k);
    __m512 r = _mm512_scalef_ps(j, k);
    // |n| > 192 (never true for NaN): +inf above, 0 below.
    const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(k), _mm512_set1_ps(192.0f), _CMP_GT_OQ);
    if (big != 0) {
      const __mmask16 neg = _mm512_cmp_ps_mask(k, _mm512_setzero_ps(), _CMP_LE_OQ);
      r = _mm512_mask_blend_ps(
          big, r,
          _mm512_mask_blend_ps(neg, _mm512_set1_ps(std::numeric_limits<float>::infinity()),
                               _mm512_setzero_ps()));
    }
    _mm512_storeu_ps(x + i, r);
    const __m256 t8 = _mm256_add_ps(_mm512_extractf32x8_ps(r, 1), _mm512_castps512_ps256(r));
    const __m128 t4 = _mm_add_ps(_mm256_extractf128_ps(t8, 1), _mm256_castps256_ps128(t8));
    sum += static_cast<double>(reduce4_tree(t4));
  }
  return exp_sum_tail(x, i, n, max, sum);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
// exp_sum_row_impl<8, exp_approx_avx2> in registers: exp_approx_avx2's reduction, polynomial and
// k + k * p on 8 lanes (a block with a lane outside its fast range, |n| > 126 — masked keys,
// -inf padding — takes the scalar function for those lanes), each group of 8 added in reduce8's
// tree before the double sum. The prefill attention's softmax on AVX2 hosts spent ~15 % of its
// time in the scalar loop.
double exp_sum_row_avx2(float* x, int64_t n, float max) {
  double sum = 0.0;
  int64_t i = 0;
  const __m256 vmax = _mm256_set1_ps(max);
  const __m256 round = _mm256_set1_ps(kRound);
  const __m256 limit = _mm256_set1_ps(126.0f);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + i), vmax);
    const __m256 z = _mm256_fmadd_ps(v, _mm256_set1_ps(kLog2e), round);
    const __m256 k = _mm256_sub_ps(z, round);
    const __m256 b =
        _mm256_fnmadd_ps(k, _mm256_set1_ps(kLn2Lo), _mm256_fnmadd_ps(k, _mm256_set1_ps(kLn2Hi), v));
    const __m256 scale = _mm256_castsi256_ps(_mm256_add_epi32(
        _mm256_slli_epi32(_mm256_castps_si256(z), 23), _mm256_set1_epi32(0x3f800000)));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(kP5), b, _mm256_set1_ps(kP4)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(kP3), b, _mm256_set1_ps(kP2))),
        u, _mm256_mul_ps(_mm256_set1_ps(kP1), b));
    __m256 r = _mm256_fmadd_ps(scale, j, scale);
    const int slow =
        _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(k, abs_mask), limit, _CMP_GT_OQ));
    if (slow != 0) {
      alignas(32) float lanes[8], in[8];
      _mm256_store_ps(lanes, r);
      _mm256_store_ps(in, v);
      for (int l = 0; l < 8; ++l) {
        if ((slow >> l) & 1) lanes[l] = exp_approx_avx2(in[l]);
      }
      r = _mm256_load_ps(lanes);
    }
    _mm256_storeu_ps(x + i, r);
    const __m128 t4 = _mm_add_ps(_mm256_extractf128_ps(r, 1), _mm256_castps256_ps128(r));
    sum += static_cast<double>(reduce4_tree(t4));
  }
  return exp_sum_tail(x, i, n, max, sum);
}
#endif

}  // namespace

namespace {

#if defined(__AVX512F__)
// swiglu_range's AVX-512 body: exp_approx_avx512 on 16 lanes (as exp_sum_row_avx512), then the
// same division and product as the scalar loop, so every element gets the scalar loop's bits.
int64_t swiglu_avx512(const float* g, const float* u, float* y, int64_t begin, int64_t end) {
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 v = _mm512_loadu_ps(g + i);
    __m512 k;
    const __m512 neg = _mm512_sub_ps(_mm512_setzero_ps(), v);
    const __m512 p = exp_poly_avx512(neg, k);
    __m512 e = _mm512_scalef_ps(p, k);
    const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(k), _mm512_set1_ps(192.0f), _CMP_GT_OQ);
    if (big != 0) {
      const __mmask16 low = _mm512_cmp_ps_mask(k, _mm512_setzero_ps(), _CMP_LE_OQ);
      e = _mm512_mask_blend_ps(
          big, e,
          _mm512_mask_blend_ps(low, _mm512_set1_ps(std::numeric_limits<float>::infinity()),
                               _mm512_setzero_ps()));
    }
    const __m512 silu = _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    _mm512_storeu_ps(y + i, _mm512_mul_ps(silu, _mm512_loadu_ps(u + i)));
  }
  return i;
}
#endif

}  // namespace

void swiglu_range(const float* g, const float* u, float* y, int64_t begin, int64_t end) {
  const auto body = [&](auto exp_fn) {
    for (int64_t i = begin; i < end; ++i) {
      const float v = g[i];
      y[i] = (v / (1.0f + exp_fn(-v))) * u[i];
    }
  };
  if (ggml_simd_layout() == ggml_simd::avx512) {
#if defined(__AVX512F__)
    begin = swiglu_avx512(g, u, y, begin, end);  // the tail below
#endif
    body([](float v) { return exp_approx_avx512(v); });
  } else {
    body([](float v) { return exp_approx_avx2(v); });
  }
}

double exp_sum_row(float* x, int64_t n, float max) {
#if defined(__AVX512F__)
  if (ggml_simd_layout() == ggml_simd::avx512) return exp_sum_row_avx512(x, n, max);
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if (ggml_simd_layout() == ggml_simd::avx2) return exp_sum_row_avx2(x, n, max);
#endif
  return ggml_simd_layout() == ggml_simd::avx512
             ? exp_sum_row_impl<16, exp_approx_avx512>(x, n, max)
             : exp_sum_row_impl<8, exp_approx_avx2>(x, n, max);
}

double exp_sum_row_scalar(float* x, int64_t n, float max) {
  return ggml_simd_layout() == ggml_simd::avx512
             ? exp_sum_row_impl<16, exp_approx_avx512>(x, n, max)
             : exp_sum_row_impl<8, exp_approx_avx2>(x, n, max);
}

double exp_scaled_below(const float* x, float* y, int64_t n, float max, float scale) {
  int64_t i = 0;
  double sum = 0.0;
#if defined(__AVX512F__)
  const __m512 vmax = _mm512_set1_ps(max), lo = _mm512_set1_ps(kLowest),
               vscale = _mm512_set1_ps(scale);
  __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
  for (; i + 16 <= n; i += 16) {
    const __m512 v =
        _mm512_max_ps(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), vmax), vscale), lo);
    __m512 k;
    const __m512 p = exp_poly_avx512(v, k);
    const __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
    const __m512 r = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
    if (y != nullptr) _mm512_storeu_ps(y + i, r);
    acc0 = _mm512_add_pd(acc0, _mm512_cvtps_pd(_mm512_castps512_ps256(r)));
    acc1 = _mm512_add_pd(
        acc1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(r), 1))));
  }
  sum = _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 vmax = _mm256_set1_ps(max), lo = _mm256_set1_ps(kLowest),
               vscale = _mm256_set1_ps(scale);
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  for (; i + 8 <= n; i += 8) {
    const __m256 v =
        _mm256_max_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax), vscale), lo);
    const __m256 z = _mm256_fmadd_ps(v, _mm256_set1_ps(kLog2e), _mm256_set1_ps(kRound));
    const __m256 k = _mm256_sub_ps(z, _mm256_set1_ps(kRound));
    const __m256 b =
        _mm256_fnmadd_ps(k, _mm256_set1_ps(kLn2Lo), _mm256_fnmadd_ps(k, _mm256_set1_ps(kLn2Hi), v));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 p = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(kP5), b, _mm256_set1_ps(kP4)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(kP3), b, _mm256_set1_ps(kP2))),
        u, _mm256_fmadd_ps(_mm256_set1_ps(kP1), b, _mm256_set1_ps(1.0f)));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    const __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    if (y != nullptr) _mm256_storeu_ps(y + i, r);
    acc0 = _mm256_add_pd(acc0, _mm256_cvtps_pd(_mm256_castps256_ps128(r)));
    acc1 = _mm256_add_pd(acc1, _mm256_cvtps_pd(_mm256_extractf128_ps(r, 1)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(acc0, acc1));
  sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
  for (; i < n; ++i) {
    const auto e = static_cast<float>(std::exp(
        std::max((static_cast<double>(x[i]) - max) * scale, static_cast<double>(kLowest))));
    if (y != nullptr) y[i] = e;
    sum += static_cast<double>(e);
  }
  return sum;
}

int64_t first_max_index(const float* x, int64_t n, float* max) {
  // vmaxps returns its second operand when either is NaN: with the running maximum second, NaN
  // entries leave it as it was.
  float m = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 m0 = _mm512_set1_ps(m), m1 = m0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm512_max_ps(_mm512_loadu_ps(x + i), m0);
    m1 = _mm512_max_ps(_mm512_loadu_ps(x + i + 16), m1);
  }
  if (i + 16 <= n) {
    m0 = _mm512_max_ps(_mm512_loadu_ps(x + i), m0);
    i += 16;
  }
  m = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 m0 = _mm256_set1_ps(m), m1 = m0;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
    m1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), m1);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(m0, m1));
  for (const float l : lanes) m = std::max(m, l);
#endif
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  *max = m;
  if (n == 0 || std::isnan(x[0])) return 0;
  // x[0] is a number, so the running first maximum of std::max_element is the first x[i] == m.
  i = 0;
#if defined(__AVX512F__)
  const __m512 vm = _mm512_set1_ps(m);
  for (; i + 16 <= n; i += 16) {
    const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), vm, _CMP_EQ_OQ);
    if (eq != 0) return i + std::countr_zero(static_cast<unsigned>(eq));
  }
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 vm = _mm256_set1_ps(m);
  for (; i + 8 <= n; i += 8) {
    const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vm, _CMP_EQ_OQ));
    if (eq != 0) return i + std::countr_zero(static_cast<unsigned>(eq));
  }
#endif
  for (; i < n; ++i) {
    if (x[i] == m) return i;
  }
  return 0;
}

namespace {

// Runs `block` (W lanes at the pointers it is given) over n elements: whole blocks in place, the
// tail on zero-padded copies, so that every element goes through the same instructions.
template <int W, size_t In, size_t Out, class Block>
void over_lanes(std::array<const float*, In> in, std::array<float*, Out> out, int64_t n,
                const Block& block) {
  int64_t i = 0;
  std::array<const float*, In> ip;
  std::array<float*, Out> op;
  for (; i + W <= n; i += W) {
    for (size_t a = 0; a < In; ++a) ip[a] = in[a] + i;
    for (size_t a = 0; a < Out; ++a) op[a] = out[a] + i;
    block(ip, op);
  }
  if (i == n) return;
  const int64_t rest = n - i;
  alignas(64) float ib[In][W] = {}, ob[Out][W];
  for (size_t a = 0; a < In; ++a) {
    std::copy(in[a] + i, in[a] + n, ib[a]);
    ip[a] = ib[a];
  }
  for (size_t a = 0; a < Out; ++a) op[a] = ob[a];
  block(ip, op);
  for (size_t a = 0; a < Out; ++a) std::copy(ob[a], ob[a] + rest, out[a] + i);
}

constexpr float kSigmoidLo = -87.0f, kSigmoidHi = 88.0f;  // e^x stays a normal float

// vfloat is a float, or GCC's vector type behind __m512 / __m256, whose + − × ÷ are the
// element-wise IEEE operations; the wrappers below are what the operators do not cover.

#if defined(__AVX512F__)
constexpr int kLanes = 16;
using vfloat = __m512;
inline vfloat vload(const float* p) {
  return _mm512_loadu_ps(p);
}
inline void vstore(float* p, vfloat v) {
  _mm512_storeu_ps(p, v);
}
inline vfloat vset(float v) {
  return _mm512_set1_ps(v);
}
inline vfloat vfma(vfloat a, vfloat b, vfloat c) {
  return _mm512_fmadd_ps(a, b, c);
}
inline vfloat vfnma(vfloat a, vfloat b, vfloat c) {
  return _mm512_fnmadd_ps(a, b, c);
}
inline vfloat vclamp(vfloat v, float lo, float hi) {
  return _mm512_min_ps(_mm512_max_ps(v, vset(lo)), vset(hi));
}
inline vfloat vpow2(vfloat k) {  // 2^k for integral k in [-126, 127]
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23));
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kLanes = 8;
using vfloat = __m256;
inline vfloat vload(const float* p) {
  return _mm256_loadu_ps(p);
}
inline void vstore(float* p, vfloat v) {
  _mm256_storeu_ps(p, v);
}
inline vfloat vset(float v) {
  return _mm256_set1_ps(v);
}
inline vfloat vfma(vfloat a, vfloat b, vfloat c) {
  return _mm256_fmadd_ps(a, b, c);
}
inline vfloat vfnma(vfloat a, vfloat b, vfloat c) {
  return _mm256_fnmadd_ps(a, b, c);
}
inline vfloat vclamp(vfloat v, float lo, float hi) {
  return _mm256_min_ps(_mm256_max_ps(v, vset(lo)), vset(hi));
}
inline vfloat vpow2(vfloat k) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23));
}
#else
constexpr int kLanes = 1;
using vfloat = float;
inline vfloat vload(const float* p) {
  return *p;
}
inline void vstore(float* p, vfloat v) {
  *p = v;
}
inline vfloat vset(float v) {
  return v;
}
inline vfloat vfma(vfloat a, vfloat b, vfloat c) {
  return std::fma(a, b, c);
}
inline vfloat vfnma(vfloat a, vfloat b, vfloat c) {
  return std::fma(-a, b, c);
}
inline vfloat vclamp(vfloat v, float lo, float hi) {
  return std::isnan(v) ? lo : std::min(std::max(v, lo), hi);  // as the vector max: NaN -> lo
}
inline vfloat vpow2(vfloat k) {
  return std::bit_cast<float>(static_cast<uint32_t>(static_cast<int>(k) + 127) << 23);
}
#endif

// σ(g) = 1 / (1 + e^-g): exp_approx's reduction and polynomial on -g clamped to [-87, 88].
inline vfloat vsigmoid(vfloat g) {
  const vfloat v = vclamp(vset(0.0f) - g, kSigmoidLo, kSigmoidHi);
  const vfloat k = vfma(v, vset(kLog2e), vset(kRound)) - vset(kRound);
  const vfloat b = vfnma(k, vset(kLn2Lo), vfnma(k, vset(kLn2Hi), v));
  const vfloat u = b * b;
  const vfloat p = vfma(vfma(vfma(vset(kP5), b, vset(kP4)), u, vfma(vset(kP3), b, vset(kP2))), u,
                        vfma(vset(kP1), b, vset(1.0f)));
  return vset(1.0f) / (vset(1.0f) + p * vpow2(k));
}

}  // namespace

void silu_mul_forward(const float* g, const float* u, float* h, int64_t n) {
  over_lanes<kLanes, 2, 1>({g, u}, {h}, n, [](const auto& in, const auto& out) {
    const vfloat gv = vload(in[0]);
    vstore(out[0], gv * vsigmoid(gv) * vload(in[1]));
  });
}

void silu_mul_backward(const float* g, const float* u, const float* dh, float* dg, float* du,
                       int64_t n) {
  over_lanes<kLanes, 3, 2>({g, u, dh}, {dg, du}, n, [](const auto& in, const auto& out) {
    const vfloat gv = vload(in[0]);
    const vfloat dhv = vload(in[2]);
    const vfloat s = vsigmoid(gv);
    vstore(out[1], dhv * (gv * s));
    // dh·u·s·(1 + g·(1 − s))
    const vfloat t = vfma(gv, vset(1.0f) - s, vset(1.0f));
    vstore(out[0], dhv * vload(in[1]) * s * t);
  });
}

void softmax_row(float* x, int64_t n) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max = std::max(max, x[i]);
  const float inv = static_cast<float>(1.0 / exp_sum_row(x, n, max));
  for (int64_t j = 0; j < n; ++j) x[j] *= inv;
}

status get_row(const tensor_view& table, int64_t row, float* y) {
  if (row < 0 || row >= table.n_rows) {
    return {status_code::invalid_argument, "row id " + std::to_string(row) + " out of range"};
  }
  const void* src = table.row(row);
  switch (table.type) {
    case ggml_type::q8_0: {
      const auto* b = static_cast<const block_q8_0*>(src);
      for (int64_t k = 0; k < table.n_cols / 32; ++k) {
        const float d = half_to_float(b[k].d);
        for (int j = 0; j < 32; ++j) y[k * 32 + j] = static_cast<float>(b[k].qs[j]) * d;
      }
      return {};
    }
    case ggml_type::f16:
      half_to_float_row(static_cast<const uint16_t*>(src), y, table.n_cols);
      return {};
    default:
      if (dequantize_row(table.type, src, y, table.n_cols) != row_status::ok) {
        return {status_code::unsupported,
                std::string{"get_rows: type "} + std::string{type_name(table.type)}};
      }
      return {};
  }
}

}  // namespace weft::gpu::cpu
