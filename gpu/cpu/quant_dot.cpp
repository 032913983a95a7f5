#include "gpu/cpu/quant_dot.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <utility>

#include "gpu/cpu/elementwise.hpp"
#include "gpu/cpu/tile_common.hpp"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define WEFT_CPU_AVX2 1
#include "gpu/cpu/simd.hpp"
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__)
#define WEFT_CPU_AVX512 1
#endif
#endif

namespace weft::gpu::cpu {

// -- half conversions ---------------------------------------------------------------------------

float half_to_float(uint16_t h) {
#ifdef WEFT_CPU_AVX2
  return _cvtsh_ss(h);
#else
  return fp16_to_fp32(h);
#endif
}

uint16_t float_to_half(float f) {
#ifdef WEFT_CPU_AVX2
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
  return fp32_to_fp16(f);
#endif
}

void float_to_half_row(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
#ifdef WEFT_CPU_AVX2
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  for (; i < n; ++i) y[i] = float_to_half(x[i]);
}

void half_to_float_row(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
#ifdef WEFT_CPU_AVX2
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
  }
#endif
  for (; i < n; ++i) y[i] = half_to_float(x[i]);
}

const char* quant_kernel_path() {
#if defined(WEFT_CPU_AVX512)
  return "avx512-vnni";
#elif defined(WEFT_CPU_AVX2) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return "avx2+vnni";
#elif defined(WEFT_CPU_AVX2)
  return "avx2";
#else
  return "portable";
#endif
}

namespace {

ggml_simd detect_ggml_simd() {
  if (const char* env = std::getenv("WEFT_GGML_SIMD")) {
    const std::string_view v{env};
    if (v == "avx2") return ggml_simd::avx2;
    if (v == "avx512") return ggml_simd::avx512;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"))
    return ggml_simd::avx512;
#endif
  return ggml_simd::avx2;
}

std::atomic<int>& simd_layout_slot() {
  static std::atomic<int> slot{static_cast<int>(detect_ggml_simd())};
  return slot;
}

}  // namespace

ggml_simd ggml_simd_layout() {
  return static_cast<ggml_simd>(simd_layout_slot().load(std::memory_order_relaxed));
}

void set_ggml_simd_layout(ggml_simd layout) {
  simd_layout_slot().store(static_cast<int>(layout), std::memory_order_relaxed);
}

const char* ggml_simd_name(ggml_simd layout) {
  return layout == ggml_simd::avx512 ? "avx512" : "avx2";
}

// -- AVX2 implementations -----------------------------------------------------------------------

#ifdef WEFT_CPU_AVX2
namespace {

inline float hsum8(__m256 x) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

inline __m256i nibbles_to_bytes(const uint8_t* qs) {
  const __m128i tmp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i bytes =
      _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
  return _mm256_and_si256(_mm256_set1_epi8(0x0F), bytes);
}

// Unsigned x signed bytes -> 8 int32 lanes of 4-element sums -> floats (exact either way: the
// pair sums cannot saturate int16 for 4-bit x 8-bit or |8-bit| x 8-bit operands).
inline __m256 dot_us8(__m256i ux, __m256i sy) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ux, sy));
#else
  const __m256i p16 = _mm256_maddubs_epi16(ux, sy);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), p16));
#endif
}

inline __m256 dot_s8(__m256i x, __m256i y) {
  return dot_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

struct block_quant {
  __m256i q;
  float d;
  int sum;
};

inline block_quant quantize_block_avx2(const float* x) {
  __m256 v0 = _mm256_loadu_ps(x);
  __m256 v1 = _mm256_loadu_ps(x + 8);
  __m256 v2 = _mm256_loadu_ps(x + 16);
  __m256 v3 = _mm256_loadu_ps(x + 24);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_andnot_ps(sign, v0);
  m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v1));
  m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v2));
  m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v3));
  __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  const float d = amax / 127.f;
  const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
  const int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, id), rnd));
  __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, id), rnd));
  __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, id), rnd));
  __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, id), rnd));
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
  i0 = _mm256_packs_epi32(i0, i1);
  i2 = _mm256_packs_epi32(i2, i3);
  i0 = _mm256_packs_epi16(i0, i2);
  i0 = _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  return {i0, d, _mm_cvtsi128_si32(s4)};
}

}  // namespace

void quantize_act_q8_0(const float* x, block_q8_0* y, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const block_quant q = quantize_block_avx2(x + 32 * b);
    y[b].d = float_to_half(q.d);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs), q.q);
  }
}

void quantize_act_q8_1(const float* x, block_q8_1* y, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const block_quant q = quantize_block_avx2(x + 32 * b);
    y[b].d = float_to_half(q.d);
    y[b].s = float_to_half(q.d * static_cast<float>(q.sum));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs), q.q);
  }
}

float dot_q4_0_q8_0(const block_q4_0* w, const block_q8_0* a, int64_t n_blocks) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i off = _mm256_set1_epi8(8);
  for (int64_t b = 0; b < n_blocks; ++b) {
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(w[b].d) * _cvtsh_ss(a[b].d));
    const __m256i qx = _mm256_sub_epi8(nibbles_to_bytes(w[b].qs), off);
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
    acc = _mm256_fmadd_ps(d, dot_s8(qx, qy), acc);
  }
  return hsum8(acc);
}

float dot_q4_1_q8_1(const block_q4_1* w, const block_q8_1* a, int64_t n_blocks) {
  __m256 acc = _mm256_setzero_ps();
  float summs = 0.0f;
  for (int64_t b = 0; b < n_blocks; ++b) {
    summs += _cvtsh_ss(w[b].m) * _cvtsh_ss(a[b].s);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(w[b].d) * _cvtsh_ss(a[b].d));
    const __m256i qx = nibbles_to_bytes(w[b].qs);
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
    acc = _mm256_fmadd_ps(d, dot_us8(qx, qy), acc);
  }
  return hsum8(acc) + summs;
}

float dot_q8_0_q8_0(const block_q8_0* w, const block_q8_0* a, int64_t n_blocks) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(w[b].d) * _cvtsh_ss(a[b].d));
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs));
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
    acc = _mm256_fmadd_ps(d, dot_s8(qx, qy), acc);
  }
  return hsum8(acc);
}

namespace {
template <class W>
inline const W* row_at(const void* w, size_t row_bytes, int r) {
  return reinterpret_cast<const W*>(static_cast<const char*>(w) +
                                    static_cast<size_t>(r) * row_bytes);
}
}  // namespace

#ifdef WEFT_CPU_AVX512
namespace {

static_assert(tile_rows == 4 && tile_tokens == 8);

// The AVX-512 tile: two weight rows share one 512-bit register (row 2p in lanes 0-7, row 2p + 1 in
// lanes 8-15), each half holding exactly the 8 lanes of the one-row function, so one multiply
// covers two (row, token) pairs with the same per-lane operations and the results stay
// bit-identical. VNNI multiplies unsigned by signed bytes: signed weights are offset into unsigned
// range (q - 8 for Q4_0 is the nibble, q + 128 for Q8_0 is q ^ 0x80) and the offset times the
// activation's group sums starts the integer sum (exact: int32 cannot overflow here).
template <class W>
struct tile512_ops;

// Both rows' 16 packed bytes -> [row0 low nibbles, row0 high, row1 low, row1 high].
inline __m512i nibbles_to_bytes2(const uint8_t* qs0, const uint8_t* qs1) {
  const __m256i both = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs0))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs1)), 1);
  const __m512i z = _mm512_castsi256_si512(both);
  const __m512i dup = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(1, 1, 0, 0));
  const __m512i shift = _mm512_setr_epi64(0, 0, 0x0004000400040004, 0x0004000400040004, 0, 0,
                                          0x0004000400040004, 0x0004000400040004);
  return _mm512_and_si512(_mm512_srlv_epi16(dup, shift), _mm512_set1_epi8(0x0F));
}

template <>
struct tile512_ops<block_q4_0> {
  using act = block_q8_0;
  static constexpr bool has_min = false;
  static constexpr int offset_shift = 3;  // weights stored as q + 8
  static __m512i unpack2(const block_q4_0& a, const block_q4_0& b) {
    return nibbles_to_bytes2(a.qs, b.qs);
  }
};

template <>
struct tile512_ops<block_q4_1> {
  using act = block_q8_1;
  static constexpr bool has_min = true;
  static constexpr int offset_shift = -1;  // unsigned already
  static __m512i unpack2(const block_q4_1& a, const block_q4_1& b) {
    return nibbles_to_bytes2(a.qs, b.qs);
  }
};

template <>
struct tile512_ops<block_q8_0> {
  using act = block_q8_0;
  static constexpr bool has_min = false;
  static constexpr int offset_shift = 7;  // q ^ 0x80 = q + 128
  static __m512i unpack2(const block_q8_0& a, const block_q8_0& b) {
    const __m512i both = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs)), 1);
    return _mm512_xor_si512(both, _mm512_set1_epi8(static_cast<char>(0x80)));
  }
};

// Two fp16 scales -> [a x 8, b x 8].
inline __m512 scale_pair(uint16_t a, uint16_t b) {
  return _mm512_cvtph_ps(
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<short>(a))),
                              _mm_set1_epi16(static_cast<short>(b)), 1));
}

inline void store_pair(__m512 acc, float* out) {
  out[0] = hsum8(_mm512_castps512_ps256(acc));
  out[1] = hsum8(_mm512_extractf32x8_ps(acc, 1));
}

// 4 weight rows x T tokens: 2 row pairs x T accumulators of 16 lanes stay in registers.
template <class W, int T>
void dot_tile_4xT(const void* w, size_t row_bytes, const typename tile512_ops<W>::act* const* a,
                  const act_scales& sc, int64_t n_blocks, float* const* out) {
  using ops = tile512_ops<W>;
  using A = typename ops::act;
  const W* x[4] = {row_at<W>(w, row_bytes, 0), row_at<W>(w, row_bytes, 1),
                   row_at<W>(w, row_bytes, 2), row_at<W>(w, row_bytes, 3)};
  const A* y[T];
  __m512 acc[2][T];
#pragma GCC unroll 8
  for (int j = 0; j < T; ++j) {
    y[j] = a[j];
    acc[0][j] = _mm512_setzero_ps();
    acc[1][j] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    const __m512i qx0 = ops::unpack2(x[0][b], x[1][b]);
    const __m512i qx1 = ops::unpack2(x[2][b], x[3][b]);
    const __m512 dw0 = scale_pair(x[0][b].d, x[1][b].d);
    const __m512 dw1 = scale_pair(x[2][b].d, x[3][b].d);
    const float* dab = sc.d + b * sc.stride;
#pragma GCC unroll 8
    for (int j = 0; j < T; ++j) {
      const __m512i qy =
          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[j][b].qs)));
      __m512i start = _mm512_setzero_si512();
      if constexpr (ops::offset_shift >= 0) {
        const __m512i sums = _mm512_dpbusd_epi32(start, _mm512_set1_epi8(1), qy);
        start = _mm512_sub_epi32(start, _mm512_slli_epi32(sums, ops::offset_shift));
      }
      const __m512 da = _mm512_set1_ps(dab[j]);
      const __m512 s0 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, qx0, qy));
      const __m512 s1 = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, qx1, qy));
      acc[0][j] = _mm512_fmadd_ps(_mm512_mul_ps(dw0, da), s0, acc[0][j]);
      acc[1][j] = _mm512_fmadd_ps(_mm512_mul_ps(dw1, da), s1, acc[1][j]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < T; ++j) {
    store_pair(acc[0][j], out[j]);
    store_pair(acc[1][j], out[j] + 2);
  }
  if constexpr (ops::has_min) {
    add_min_terms<T>(
        sc, n_blocks,
        [&](int64_t b, float* m) {
          for (int r = 0; r < 4; ++r) m[r] = _cvtsh_ss(x[r][b].m);
        },
        out);
  }
}

// The 4-row kernels with two rows per 512-bit register (batch-1 decode): per block one
// activation load for four rows and half the multiplies of the 256-bit form; each half keeps the
// one-row function's lanes and operations, so the results are bit-identical to it.
template <class W>
void dot4_512(const void* w, size_t row_bytes, const typename tile512_ops<W>::act* a,
              int64_t n_blocks, float* out) {
  using ops = tile512_ops<W>;
  const W* x[4] = {row_at<W>(w, row_bytes, 0), row_at<W>(w, row_bytes, 1),
                   row_at<W>(w, row_bytes, 2), row_at<W>(w, row_bytes, 3)};
  __m512 acc0 = _mm512_setzero_ps();
  __m512 acc1 = _mm512_setzero_ps();
  float summs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t b = 0; b < n_blocks; ++b) {
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(x[r] + b + 32), _MM_HINT_T0);
    const __m512i qy =
        _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs)));
    __m512i start = _mm512_setzero_si512();
    if constexpr (ops::offset_shift >= 0) {
      const __m512i sums = _mm512_dpbusd_epi32(start, _mm512_set1_epi8(1), qy);
      start = _mm512_sub_epi32(start, _mm512_slli_epi32(sums, ops::offset_shift));
    }
    const __m512 da = _mm512_set1_ps(_cvtsh_ss(a[b].d));
    const __m512 s0 =
        _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, ops::unpack2(x[0][b], x[1][b]), qy));
    const __m512 s1 =
        _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, ops::unpack2(x[2][b], x[3][b]), qy));
    acc0 = _mm512_fmadd_ps(_mm512_mul_ps(scale_pair(x[0][b].d, x[1][b].d), da), s0, acc0);
    acc1 = _mm512_fmadd_ps(_mm512_mul_ps(scale_pair(x[2][b].d, x[3][b].d), da), s1, acc1);
    if constexpr (ops::has_min) {
      const float sa = _cvtsh_ss(a[b].s);
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) summs[r] += _cvtsh_ss(x[r][b].m) * sa;
    }
  }
  store_pair(acc0, out);
  store_pair(acc1, out + 2);
  if constexpr (ops::has_min) {
    for (int r = 0; r < 4; ++r) out[r] += summs[r];
  }
}

}  // namespace
#endif

// The 4-row kernels stream their weights once per token (batch-1 decode): each row's blocks are
// prefetched 32 blocks ahead (measured +12 % batch-1 decode on the 2-vCPU EPYC VM; the hardware
// prefetcher alone left the kernel waiting on memory). The multi-token tiles reuse a weight tile
// from L1 and gained nothing from it. The row loops are unrolled so that the row pointers and the
// four accumulators live in registers (GCC otherwise kept them in memory: a load and a store per
// row and block); +20 % batch-1 decode.
void dot4_q4_0_q8_0(const void* w, size_t row_bytes, const block_q8_0* a, int64_t n_blocks,
                    float* out) {
#ifdef WEFT_CPU_AVX512
  dot4_512<block_q4_0>(w, row_bytes, a, n_blocks, out);
#else
  const block_q4_0* x[4] = {
      row_at<block_q4_0>(w, row_bytes, 0), row_at<block_q4_0>(w, row_bytes, 1),
      row_at<block_q4_0>(w, row_bytes, 2), row_at<block_q4_0>(w, row_bytes, 3)};
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  const __m256i off = _mm256_set1_epi8(8);
  for (int64_t b = 0; b < n_blocks; ++b) {
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
    const float da = _cvtsh_ss(a[b].d);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(x[r] + b + 32), _MM_HINT_T0);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const __m256 d = _mm256_set1_ps(_cvtsh_ss(x[r][b].d) * da);
      const __m256i qx = _mm256_sub_epi8(nibbles_to_bytes(x[r][b].qs), off);
      acc[r] = _mm256_fmadd_ps(d, dot_s8(qx, qy), acc[r]);
    }
  }
  for (int r = 0; r < 4; ++r) out[r] = hsum8(acc[r]);
#endif
}

void dot4_q4_1_q8_1(const void* w, size_t row_bytes, const block_q8_1* a, int64_t n_blocks,
                    float* out) {
#ifdef WEFT_CPU_AVX512
  dot4_512<block_q4_1>(w, row_bytes, a, n_blocks, out);
#else
  const block_q4_1* x[4] = {
      row_at<block_q4_1>(w, row_bytes, 0), row_at<block_q4_1>(w, row_bytes, 1),
      row_at<block_q4_1>(w, row_bytes, 2), row_at<block_q4_1>(w, row_bytes, 3)};
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  float summs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t b = 0; b < n_blocks; ++b) {
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
    const float da = _cvtsh_ss(a[b].d);
    const float sa = _cvtsh_ss(a[b].s);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(x[r] + b + 32), _MM_HINT_T0);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      summs[r] += _cvtsh_ss(x[r][b].m) * sa;
      const __m256 d = _mm256_set1_ps(_cvtsh_ss(x[r][b].d) * da);
      acc[r] = _mm256_fmadd_ps(d, dot_us8(nibbles_to_bytes(x[r][b].qs), qy), acc[r]);
    }
  }
  for (int r = 0; r < 4; ++r) out[r] = hsum8(acc[r]) + summs[r];
#endif
}

void dot4_q8_0_q8_0(const void* w, size_t row_bytes, const block_q8_0* a, int64_t n_blocks,
                    float* out) {
#ifdef WEFT_CPU_AVX512
  dot4_512<block_q8_0>(w, row_bytes, a, n_blocks, out);
#else
  const block_q8_0* x[4] = {
      row_at<block_q8_0>(w, row_bytes, 0), row_at<block_q8_0>(w, row_bytes, 1),
      row_at<block_q8_0>(w, row_bytes, 2), row_at<block_q8_0>(w, row_bytes, 3)};
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  for (int64_t b = 0; b < n_blocks; ++b) {
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
    const float da = _cvtsh_ss(a[b].d);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(x[r] + b + 32), _MM_HINT_T0);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const __m256 d = _mm256_set1_ps(_cvtsh_ss(x[r][b].d) * da);
      const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r][b].qs));
      acc[r] = _mm256_fmadd_ps(d, dot_s8(qx, qy), acc[r]);
    }
  }
  for (int r = 0; r < 4; ++r) out[r] = hsum8(acc[r]);
#endif
}

namespace {

// Per-type pieces of the multi-token tile kernel; each mirrors its one-row function above.
template <class W>
struct tile_ops;

template <>
struct tile_ops<block_q4_0> {
  using act = block_q8_0;
  static constexpr bool has_min = false;
  static __m256i unpack(const block_q4_0& b) {
    return _mm256_sub_epi8(nibbles_to_bytes(b.qs), _mm256_set1_epi8(8));
  }
  static __m256 dot(__m256i qx, __m256i qy) { return dot_s8(qx, qy); }
};

template <>
struct tile_ops<block_q4_1> {
  using act = block_q8_1;
  static constexpr bool has_min = true;
  static __m256i unpack(const block_q4_1& b) { return nibbles_to_bytes(b.qs); }
  static __m256 dot(__m256i qx, __m256i qy) { return dot_us8(qx, qy); }
};

template <>
struct tile_ops<block_q8_0> {
  using act = block_q8_0;
  static constexpr bool has_min = false;
  static __m256i unpack(const block_q8_0& b) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
  }
  static __m256 dot(__m256i qx, __m256i qy) { return dot_s8(qx, qy); }
};

// 2 weight rows x T activation rows: each weight block is unpacked once for T tokens. Every
// (row, token) pair keeps its own accumulator with the one-row function's operation order, so the
// results are bit-identical to it. The loops are unrolled so that the 2T vector accumulators stay
// in registers (activations are read straight from memory by the multiply); the scalar min-terms of
// Q4_1 (an independent sum over blocks) go in a second pass, for the same reason.
template <class W, int T>
void dot_tile_2xT(const void* w, size_t row_bytes, const typename tile_ops<W>::act* const* a,
                  const act_scales& sc, int64_t n_blocks, float* const* out) {
  using ops = tile_ops<W>;
  using A = typename ops::act;
  const W* x0 = row_at<W>(w, row_bytes, 0);
  const W* x1 = row_at<W>(w, row_bytes, 1);
  const A* y[T];
  __m256 acc0[T];
  __m256 acc1[T];
#pragma GCC unroll 4
  for (int j = 0; j < T; ++j) {
    y[j] = a[j];
    acc0[j] = _mm256_setzero_ps();
    acc1[j] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    const __m256i qx0 = ops::unpack(x0[b]);
    const __m256i qx1 = ops::unpack(x1[b]);
    const float dw0 = _cvtsh_ss(x0[b].d);
    const float dw1 = _cvtsh_ss(x1[b].d);
    const float* dab = sc.d + b * sc.stride;
#pragma GCC unroll 4
    for (int j = 0; j < T; ++j) {
      const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[j][b].qs));
      const float da = dab[j];
      acc0[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw0 * da), ops::dot(qx0, qy), acc0[j]);
      acc1[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw1 * da), ops::dot(qx1, qy), acc1[j]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < T; ++j) {
    out[j][0] = hsum8(acc0[j]);
    out[j][1] = hsum8(acc1[j]);
  }
  if constexpr (ops::has_min) {
    // Each (row, token) sum still runs over the blocks in order (bit-identical); every fp16 scale
    // is converted once per block instead of once per pair.
    float summs0[T];
    float summs1[T];
    if constexpr (T == 4) {
      // The four tokens' sums side by side in one vector per row: lane j is token j's chain, the
      // same fused multiply-add per block as the scalar form.
      __m128 v0 = _mm_setzero_ps();
      __m128 v1 = _mm_setzero_ps();
      for (int64_t b = 0; b < n_blocks; ++b) {
        const __m128 sa = _mm_loadu_ps(sc.s + b * sc.stride);
        v0 = _mm_fmadd_ps(_mm_set1_ps(_cvtsh_ss(x0[b].m)), sa, v0);
        v1 = _mm_fmadd_ps(_mm_set1_ps(_cvtsh_ss(x1[b].m)), sa, v1);
      }
      _mm_storeu_ps(summs0, v0);
      _mm_storeu_ps(summs1, v1);
    } else {
#pragma GCC unroll 4
      for (int j = 0; j < T; ++j) summs0[j] = summs1[j] = 0.0f;
      for (int64_t b = 0; b < n_blocks; ++b) {
        const float m0 = _cvtsh_ss(x0[b].m);
        const float m1 = _cvtsh_ss(x1[b].m);
        const float* sab = sc.s + b * sc.stride;
#pragma GCC unroll 4
        for (int j = 0; j < T; ++j) {
          summs0[j] = std::fma(m0, sab[j], summs0[j]);
          summs1[j] = std::fma(m1, sab[j], summs1[j]);
        }
      }
    }
#pragma GCC unroll 4
    for (int j = 0; j < T; ++j) {
      out[j][0] += summs0[j];
      out[j][1] += summs1[j];
    }
  }
}

template <class W>
void dot_tile_n(const void* w, size_t row_bytes, const typename tile_ops<W>::act* const* a,
                int n_tok, int64_t n_blocks, float* const* out, const act_scales& sc) {
  with_token_count<tile_tokens>(n_tok, [&](auto t) {
#ifdef WEFT_CPU_AVX512
    dot_tile_4xT<W, decltype(t)::value>(w, row_bytes, a, sc, n_blocks, out);
#else
    dot_tile_2xT<W, decltype(t)::value>(w, row_bytes, a, sc, n_blocks, out);
#endif
  });
}

}  // namespace

void dot_tile_q4_0_q8_0(const void* w, size_t row_bytes, const block_q8_0* const* a, int n_tok,
                        int64_t n_blocks, float* const* out, const act_scales& scales) {
  dot_tile_n<block_q4_0>(w, row_bytes, a, n_tok, n_blocks, out, scales);
}
void dot_tile_q4_1_q8_1(const void* w, size_t row_bytes, const block_q8_1* const* a, int n_tok,
                        int64_t n_blocks, float* const* out, const act_scales& scales) {
  dot_tile_n<block_q4_1>(w, row_bytes, a, n_tok, n_blocks, out, scales);
}
void dot_tile_q8_0_q8_0(const void* w, size_t row_bytes, const block_q8_0* const* a, int n_tok,
                        int64_t n_blocks, float* const* out, const act_scales& scales) {
  dot_tile_n<block_q8_0>(w, row_bytes, a, n_tok, n_blocks, out, scales);
}

#else  // portable build

namespace {
template <class W, class A, float (*Dot)(const W*, const A*, int64_t)>
void dot_tile_portable(const void* w, size_t rb, const A* const* a, int n_tok, int64_t n,
                       float* const* out) {
  for (int i = 0; i < 2; ++i) {
    const auto* row = reinterpret_cast<const W*>(static_cast<const char*>(w) + i * rb);
    for (int j = 0; j < n_tok; ++j) out[j][i] = Dot(row, a[j], n);
  }
}
}  // namespace

// The portable tile reads the fp16 scales from the blocks (the same values act_scales holds).
void dot_tile_q4_0_q8_0(const void* w, size_t rb, const block_q8_0* const* a, int n_tok, int64_t n,
                        float* const* out, const act_scales&) {
  dot_tile_portable<block_q4_0, block_q8_0, dot_q4_0_q8_0_portable>(w, rb, a, n_tok, n, out);
}
void dot_tile_q4_1_q8_1(const void* w, size_t rb, const block_q8_1* const* a, int n_tok, int64_t n,
                        float* const* out, const act_scales&) {
  dot_tile_portable<block_q4_1, block_q8_1, dot_q4_1_q8_1_portable>(w, rb, a, n_tok, n, out);
}
void dot_tile_q8_0_q8_0(const void* w, size_t rb, const block_q8_0* const* a, int n_tok, int64_t n,
                        float* const* out, const act_scales&) {
  dot_tile_portable<block_q8_0, block_q8_0, dot_q8_0_q8_0_portable>(w, rb, a, n_tok, n, out);
}

void dot4_q4_0_q8_0(const void* w, size_t rb, const block_q8_0* a, int64_t n, float* out) {
  for (int r = 0; r < 4; ++r)
    out[r] = dot_q4_0_q8_0_portable(
        reinterpret_cast<const block_q4_0*>(static_cast<const char*>(w) + r * rb), a, n);
}
void dot4_q4_1_q8_1(const void* w, size_t rb, const block_q8_1* a, int64_t n, float* out) {
  for (int r = 0; r < 4; ++r)
    out[r] = dot_q4_1_q8_1_portable(
        reinterpret_cast<const block_q4_1*>(static_cast<const char*>(w) + r * rb), a, n);
}
void dot4_q8_0_q8_0(const void* w, size_t rb, const block_q8_0* a, int64_t n, float* out) {
  for (int r = 0; r < 4; ++r)
    out[r] = dot_q8_0_q8_0_portable(
        reinterpret_cast<const block_q8_0*>(static_cast<const char*>(w) + r * rb), a, n);
}

void quantize_act_q8_0(const float* x, block_q8_0* y, int64_t n) {
  quantize_act_q8_0_portable(x, y, n);
}
void quantize_act_q8_1(const float* x, block_q8_1* y, int64_t n) {
  quantize_act_q8_1_portable(x, y, n);
}
float dot_q4_0_q8_0(const block_q4_0* w, const block_q8_0* a, int64_t n) {
  return dot_q4_0_q8_0_portable(w, a, n);
}
float dot_q4_1_q8_1(const block_q4_1* w, const block_q8_1* a, int64_t n) {
  return dot_q4_1_q8_1_portable(w, a, n);
}
float dot_q8_0_q8_0(const block_q8_0* w, const block_q8_0* a, int64_t n) {
  return dot_q8_0_q8_0_portable(w, a, n);
}

#endif

void act_scales_column(const block_q8_0* a, int64_t n_blocks, float* d, int64_t stride) {
  for (int64_t b = 0; b < n_blocks; ++b) d[b * stride] = half_to_float(a[b].d);
}

void act_scales_column(const block_q8_1* a, int64_t n_blocks, float* d, float* s, int64_t stride) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    d[b * stride] = half_to_float(a[b].d);
    s[b * stride] = half_to_float(a[b].s);
  }
}

}  // namespace weft::gpu::cpu
