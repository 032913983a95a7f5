// The ggml kernel's quantized dot products from weights packed 4 rows to a group (quant_dot.hpp,
// pack4_rows): the same integer sums, scales and fused multiply-adds per lane as the one-row
// functions, so the same bits, with a block of four rows read by one or two loads.
//
// Lanes. ggml sums a row's block in 8 int32 lanes of 4 products: for Q4 lanes 0-3 hold elements
// 0-15 (the low nibbles) and lanes 4-7 elements 16-31 (the high nibbles); for Q8_0 lane l holds
// elements 4l..4l+3. A packed Q4 block is 64 bytes, row r's 16 bytes at 16r, so its low nibbles
// against the broadcast activation elements 0-15 give lanes 0-3 of all four rows in one 512-bit
// register (row r at lanes 4r..4r+3), and its high nibbles lanes 4-7; with AVX2 the block is two
// 256-bit registers of two rows each (row 2p + k at lanes 4k..4k+3 of register p). A packed Q8_0
// block is two 512-bit registers of two rows each (row r's 8 lanes at 8(r % 2)), or four 256-bit
// ones. Each lane's chain over the blocks is the one-row function's:
// acc = fma(d_w * d_a, float(isum), acc), then ggml's tree over the row's 8 lanes.
//
// The AVX-512 VNNI build has the multi-token tiles too (prefill and batched decode); AVX2 builds
// (the package preset's x86-64-v3, CPUs without AVX-512) have batch-1 decode's 4-row function,
// and their tiles read the weights as stored.
#include "gpu/cpu/quant_dot.hpp"
#include "gpu/cpu/tile_common.hpp"

#ifdef WEFT_QUANT_PACKED4

#include <cstring>

#include "gpu/cpu/simd.hpp"

namespace weft::gpu::cpu {

namespace {

template <class W>
struct packed4;

template <>
struct packed4<block_q4_0> {
  using act = block_q8_0;
  static constexpr size_t qs_bytes = 64;
  static constexpr bool has_min = false;
  static constexpr bool nibbles = true;
  static constexpr int offset_shift = 3;  // the nibble is q + 8
};

template <>
struct packed4<block_q4_1> {
  using act = block_q8_1;
  static constexpr size_t qs_bytes = 64;
  static constexpr bool has_min = true;
  static constexpr bool nibbles = true;
  static constexpr int offset_shift = -1;  // unsigned already
};

template <>
struct packed4<block_q8_0> {
  using act = block_q8_0;
  static constexpr size_t qs_bytes = 128;
  static constexpr bool has_min = false;
  static constexpr bool nibbles = false;
  static constexpr int offset_shift = 7;  // stored as q + 128
};

template <class W>
constexpr size_t group_block_bytes = 4 * sizeof(W);

// The four rows' fp16 d (or m) of a packed block as floats.
inline __m128 four_halves(const uint8_t* at) {
  return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at)));
}

// ggml's sum of one row's 8 lanes (hi = lanes 4-7, lo = lanes 0-3): (hi + lo), then the pairs.
inline float hsum_halves(__m128 lo, __m128 hi) {
  __m128 r = _mm_add_ps(hi, lo);
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

#ifdef WEFT_QUANT_PACKED4_TILES

// One packed block's quants as two registers of unsigned bytes, (lo, hi) in the lane order above.
template <class W>
inline void unpack(const uint8_t* at, __m512i& q0, __m512i& q1) {
  if constexpr (packed4<W>::nibbles) {
    const __m512i q = _mm512_loadu_si512(at);
    const __m512i mask = _mm512_set1_epi8(0x0F);
    q0 = _mm512_and_si512(q, mask);
    q1 = _mm512_and_si512(_mm512_srli_epi16(q, 4), mask);
  } else {
    q0 = _mm512_loadu_si512(at);
    q1 = _mm512_loadu_si512(at + 64);
  }
}

// The activation block against (q0, q1): Q4 broadcasts elements 0-15 and 16-31, Q8_0 all 32 twice.
template <class W>
inline void activations(const typename packed4<W>::act& y, __m512i& y0, __m512i& y1) {
  if constexpr (packed4<W>::nibbles) {
    y0 = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y.qs)));
    y1 = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y.qs + 16)));
  } else {
    y0 = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs)));
    y1 = y0;
  }
}

// The exact integer sums of one register: offset weights are corrected by the offset times the
// activation's 4-element sums (int32 cannot overflow here).
template <class W>
inline __m512 block_sums(__m512i q, __m512i y) {
  __m512i start = _mm512_setzero_si512();
  if constexpr (packed4<W>::offset_shift >= 0) {
    const __m512i sums = _mm512_dpbusd_epi32(start, _mm512_set1_epi8(1), y);
    start = _mm512_sub_epi32(start, _mm512_slli_epi32(sums, packed4<W>::offset_shift));
  }
  return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, q, y));
}

// Which of the four products d_w * d_a each lane of (q0, q1) takes.
template <class W>
inline __m512i scale_index(int half) {
  if constexpr (packed4<W>::nibbles) {
    (void)half;
    return _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  } else {
    const int r = 2 * half;
    return _mm512_setr_epi32(r, r, r, r, r, r, r, r, r + 1, r + 1, r + 1, r + 1, r + 1, r + 1,
                             r + 1, r + 1);
  }
}

// Row r's result from the two accumulators.
template <class W>
inline void store_rows(__m512 acc0, __m512 acc1, float* out) {
  if constexpr (packed4<W>::nibbles) {
    out[0] = hsum_halves(_mm512_extractf32x4_ps(acc0, 0), _mm512_extractf32x4_ps(acc1, 0));
    out[1] = hsum_halves(_mm512_extractf32x4_ps(acc0, 1), _mm512_extractf32x4_ps(acc1, 1));
    out[2] = hsum_halves(_mm512_extractf32x4_ps(acc0, 2), _mm512_extractf32x4_ps(acc1, 2));
    out[3] = hsum_halves(_mm512_extractf32x4_ps(acc0, 3), _mm512_extractf32x4_ps(acc1, 3));
  } else {
    out[0] = hsum_halves(_mm512_extractf32x4_ps(acc0, 0), _mm512_extractf32x4_ps(acc0, 1));
    out[1] = hsum_halves(_mm512_extractf32x4_ps(acc0, 2), _mm512_extractf32x4_ps(acc0, 3));
    out[2] = hsum_halves(_mm512_extractf32x4_ps(acc1, 0), _mm512_extractf32x4_ps(acc1, 1));
    out[3] = hsum_halves(_mm512_extractf32x4_ps(acc1, 2), _mm512_extractf32x4_ps(acc1, 3));
  }
}

// One token (batch-1 decode): the group is one contiguous stream, prefetched ~2 KB ahead.
template <class W>
void dot4_packed(const void* g, const typename packed4<W>::act* a, int64_t n_blocks, float* out) {
  using P = packed4<W>;
  const auto* base = static_cast<const uint8_t*>(g);
  const __m512i idx0 = scale_index<W>(0);
  const __m512i idx1 = scale_index<W>(1);
  __m512 acc0 = _mm512_setzero_ps();
  __m512 acc1 = _mm512_setzero_ps();
  __m128 summs = _mm_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* at = base + static_cast<size_t>(b) * group_block_bytes<W>;
    _mm_prefetch(reinterpret_cast<const char*>(at + 2048), _MM_HINT_T0);
    __m512i q0, q1, y0, y1;
    unpack<W>(at, q0, q1);
    activations<W>(a[b], y0, y1);
    const __m512 s0 = block_sums<W>(q0, y0);
    const __m512 s1 = block_sums<W>(q1, y1);
    const __m128 d = _mm_mul_ps(four_halves(at + P::qs_bytes), _mm_set1_ps(_cvtsh_ss(a[b].d)));
    const __m512 d512 = _mm512_castps128_ps512(d);
    acc0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx0, d512), s0, acc0);
    acc1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx1, d512), s1, acc1);
    if constexpr (P::has_min) {
      summs =
          _mm_fmadd_ps(four_halves(at + P::qs_bytes + 8), _mm_set1_ps(_cvtsh_ss(a[b].s)), summs);
    }
  }
  store_rows<W>(acc0, acc1, out);
  if constexpr (P::has_min) {
    alignas(16) float m[4];
    _mm_store_ps(m, summs);
    for (int r = 0; r < 4; ++r) out[r] += m[r];
  }
}

// T tokens: each block is unpacked once and its scales converted once for all of them.
template <class W, int T>
void dot_tile_packed(const void* g, const typename packed4<W>::act* const* a, const act_scales& sc,
                     int64_t n_blocks, float* const* out) {
  using P = packed4<W>;
  const auto* base = static_cast<const uint8_t*>(g);
  const __m512i idx0 = scale_index<W>(0);
  const __m512i idx1 = scale_index<W>(1);
  __m512 acc0[T];
  __m512 acc1[T];
#pragma GCC unroll 8
  for (int j = 0; j < T; ++j) {
    acc0[j] = _mm512_setzero_ps();
    acc1[j] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* at = base + static_cast<size_t>(b) * group_block_bytes<W>;
    __m512i q0, q1;
    unpack<W>(at, q0, q1);
    const __m128 dw = four_halves(at + P::qs_bytes);
    const float* dab = sc.d + b * sc.stride;
#pragma GCC unroll 8
    for (int j = 0; j < T; ++j) {
      __m512i y0, y1;
      activations<W>(a[j][b], y0, y1);
      const __m512 s0 = block_sums<W>(q0, y0);
      const __m512 s1 = block_sums<W>(q1, y1);
      const __m512 d512 = _mm512_castps128_ps512(_mm_mul_ps(dw, _mm_set1_ps(dab[j])));
      acc0[j] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx0, d512), s0, acc0[j]);
      acc1[j] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx1, d512), s1, acc1[j]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < T; ++j) store_rows<W>(acc0[j], acc1[j], out[j]);
  if constexpr (P::has_min) {
    add_min_terms<T>(
        sc, n_blocks,
        [&](int64_t b, float* m) {
          const uint8_t* at =
              base + static_cast<size_t>(b) * group_block_bytes<W> + P::qs_bytes + 8;
          _mm_store_ps(m, four_halves(at));
        },
        out);
  }
}

template <class W>
void tile_packed_n(const void* g, const typename packed4<W>::act* const* a, int n_tok,
                   int64_t n_blocks, float* const* out, const act_scales& sc) {
  with_token_count<tile_tokens>(
      n_tok, [&](auto t) { dot_tile_packed<W, decltype(t)::value>(g, a, sc, n_blocks, out); });
}

#else  // AVX2

// Unsigned weight bytes against signed activation bytes: 8 int32 lanes of 4 products each, exact
// (a pair of products is at most 2 x 15 x 127 for nibbles, 2 x 128 x 127 for |q8|: no int16
// saturation), as the one-row functions' dot_us8.
inline __m256i sums4(__m256i q, __m256i y) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), _mm256_set1_epi16(1));
}

// One token (batch-1 decode): the group is one contiguous stream, prefetched ~2 KB ahead. Q4: per
// block two registers of two rows (p = 0: rows 0, 1; p = 1: rows 2, 3), their low nibbles against
// activation elements 0-15 (acc[2p]) and high nibbles against 16-31 (acc[2p + 1]). Q4_0's sums
// are the nibbles' minus 8 times the activations' 4-element sums (the same integers as the one-row
// function's signed products). Q8_0: one register a row, back to signed bytes.
template <class W>
void dot4_packed(const void* g, const typename packed4<W>::act* a, int64_t n_blocks, float* out) {
  using P = packed4<W>;
  const auto* base = static_cast<const uint8_t*>(g);
  const __m256i mask = _mm256_set1_epi8(0x0F);
  __m256i pick[4] = {};  // the row whose scale each lane of register k takes
  if constexpr (P::nibbles) {
    pick[0] = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    pick[1] = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
  } else {
    for (int r = 0; r < 4; ++r) pick[r] = _mm256_set1_epi32(r);
  }
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  __m128 summs = _mm_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    const uint8_t* at = base + static_cast<size_t>(b) * group_block_bytes<W>;
    _mm_prefetch(reinterpret_cast<const char*>(at + 2048), _MM_HINT_T0);
    const __m256 d = _mm256_castps128_ps256(
        _mm_mul_ps(four_halves(at + P::qs_bytes), _mm_set1_ps(_cvtsh_ss(a[b].d))));
    if constexpr (P::nibbles) {
      const __m256i y0 =
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a[b].qs)));
      const __m256i y1 = _mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(a[b].qs + 16)));
      __m256i off0 = _mm256_setzero_si256(), off1 = _mm256_setzero_si256();
      if constexpr (P::offset_shift >= 0) {
        const __m256i ones = _mm256_set1_epi8(1);
        off0 = _mm256_slli_epi32(sums4(ones, y0), P::offset_shift);
        off1 = _mm256_slli_epi32(sums4(ones, y1), P::offset_shift);
      }
#pragma GCC unroll 2
      for (int p = 0; p < 2; ++p) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 32 * p));
        const __m256i lo = sums4(_mm256_and_si256(q, mask), y0);
        const __m256i hi = sums4(_mm256_and_si256(_mm256_srli_epi16(q, 4), mask), y1);
        const __m256 scale = _mm256_permutevar8x32_ps(d, pick[p]);
        acc[2 * p] =
            _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(_mm256_sub_epi32(lo, off0)), acc[2 * p]);
        acc[2 * p + 1] =
            _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(_mm256_sub_epi32(hi, off1)), acc[2 * p + 1]);
      }
    } else {
      const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
      const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
        const __m256i x = _mm256_xor_si256(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 32 * r)), flip);
        const __m256i s = sums4(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
        acc[r] =
            _mm256_fmadd_ps(_mm256_permutevar8x32_ps(d, pick[r]), _mm256_cvtepi32_ps(s), acc[r]);
      }
    }
    if constexpr (P::has_min) {
      summs =
          _mm_fmadd_ps(four_halves(at + P::qs_bytes + 8), _mm_set1_ps(_cvtsh_ss(a[b].s)), summs);
    }
  }
  if constexpr (P::nibbles) {
    for (int p = 0; p < 2; ++p) {
      out[2 * p] =
          hsum_halves(_mm256_castps256_ps128(acc[2 * p]), _mm256_castps256_ps128(acc[2 * p + 1]));
      out[2 * p + 1] = hsum_halves(_mm256_extractf128_ps(acc[2 * p], 1),
                                   _mm256_extractf128_ps(acc[2 * p + 1], 1));
    }
  } else {
    for (int r = 0; r < 4; ++r) {
      out[r] = hsum_halves(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
    }
  }
  if constexpr (P::has_min) {
    alignas(16) float m[4];
    _mm_store_ps(m, summs);
    for (int r = 0; r < 4; ++r) out[r] += m[r];
  }
}

#endif  // WEFT_QUANT_PACKED4_TILES

template <class W>
void pack4(const void* w, size_t row_bytes, int64_t n_blocks, uint8_t* dst) {
  using P = packed4<W>;
  constexpr size_t row_qs = P::qs_bytes / 4;
  for (int64_t b = 0; b < n_blocks; ++b) {
    uint8_t* out = dst + static_cast<size_t>(b) * group_block_bytes<W>;
    for (int r = 0; r < 4; ++r) {
      const W& blk = reinterpret_cast<const W*>(static_cast<const uint8_t*>(w) + r * row_bytes)[b];
      std::memcpy(out + r * row_qs, blk.qs, row_qs);
      if constexpr (!P::nibbles) {
        for (size_t i = 0; i < row_qs; ++i) out[r * row_qs + i] ^= 0x80;
      }
      std::memcpy(out + P::qs_bytes + 2 * r, &blk.d, 2);
      if constexpr (P::has_min) std::memcpy(out + P::qs_bytes + 8 + 2 * r, &blk.m, 2);
    }
  }
}

}  // namespace

void pack4_rows(ggml_type type, const void* w, size_t row_bytes, int64_t n_blocks, void* dst) {
  auto* out = static_cast<uint8_t*>(dst);
  switch (type) {
    case ggml_type::q4_0:
      pack4<block_q4_0>(w, row_bytes, n_blocks, out);
      break;
    case ggml_type::q4_1:
      pack4<block_q4_1>(w, row_bytes, n_blocks, out);
      break;
    case ggml_type::q8_0:
      pack4<block_q8_0>(w, row_bytes, n_blocks, out);
      break;
    default:
      break;
  }
}

void dot4_packed_q4_0_q8_0(const void* g, const block_q8_0* a, int64_t n_blocks, float* out) {
  dot4_packed<block_q4_0>(g, a, n_blocks, out);
}
void dot4_packed_q4_1_q8_1(const void* g, const block_q8_1* a, int64_t n_blocks, float* out) {
  dot4_packed<block_q4_1>(g, a, n_blocks, out);
}
void dot4_packed_q8_0_q8_0(const void* g, const block_q8_0* a, int64_t n_blocks, float* out) {
  dot4_packed<block_q8_0>(g, a, n_blocks, out);
}
#ifdef WEFT_QUANT_PACKED4_TILES
void dot_tile_packed_q4_0_q8_0(const void* g, const block_q8_0* const* a, int n_tok,
                               int64_t n_blocks, float* const* out, const act_scales& scales) {
  tile_packed_n<block_q4_0>(g, a, n_tok, n_blocks, out, scales);
}
void dot_tile_packed_q4_1_q8_1(const void* g, const block_q8_1* const* a, int n_tok,
                               int64_t n_blocks, float* const* out, const act_scales& scales) {
  tile_packed_n<block_q4_1>(g, a, n_tok, n_blocks, out, scales);
}
void dot_tile_packed_q8_0_q8_0(const void* g, const block_q8_0* const* a, int n_tok,
                               int64_t n_blocks, float* const* out, const act_scales& scales) {
  tile_packed_n<block_q8_0>(g, a, n_tok, n_blocks, out, scales);
}

#endif

}  // namespace weft::gpu::cpu

#endif  // WEFT_QUANT_PACKED4
