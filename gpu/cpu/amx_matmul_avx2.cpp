// The amx kernel's numerics on AVX2 (`--cpu-matmul avx2`): CPUs without AVX-512 VNNI (AMD Zen 2
// and Zen 3, Intel before Ice Lake) and the package preset's x86-64-v3 builds.
//
// The same packed layout (amx_pack's: per 32-element block of a group of 16 rows, dword j of
// every row side by side, then the rows' fp16 d and m), the same exact integer sum per (row,
// token, block) and the same float operations per lane in block order —
//
//     acc = fma(d_w * d_a, float(isum), acc)      (then acc = fma(m_w, s_a, acc) for Q4_1)
//
// — so the same bits as `amx` and `vnni`, 8 rows a register. Where those multiply with VPDPBUSD
// (u8 x s8 summed into int32), AVX2 has VPMADDUBSW, which sums pairs of products into int16 and
// saturates. A nibble times an activation (|a| <= 127) is at most 1905, so a pair at most 3810 and
// the eight pairs of a row's block that share an int16 lane at most 30480: for Q4 weights the eight
// dword products of a block add up in int16 exactly, and one VPMADDWD gives each row's int32 sum —
// 8 + 8 instructions per 8 rows x 32 elements, where ggml's AVX2 order (8 lanes of 4 products a
// row, each lane converted and scaled) needs 4 per row. Q8_0 weights (|w| <= 128) cannot share
// int16 lanes: each dword product is widened on its own (sign trick, then VPMADDWD).
#include <algorithm>
#include <cstring>
#include <vector>

#include "gpu/cpu/amx_matmul.hpp"
#include "gpu/cpu/quant_dot.hpp"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define WEFT_AMX_AVX2 1
#include "gpu/cpu/simd.hpp"
#endif

namespace weft::gpu::cpu {

namespace {

constexpr int64_t R = amx_rows_per_group;

// Rows [r0, r0 + valid) of `w` (valid <= 16, the rest zeros) in the packed layout: per block the
// quants' dword j of row n at 64 j + 4 n, then 16 fp16 d, then (Q4_1) 16 fp16 m; 16 blocks' bytes
// of the type per block (a whole group's packed copy takes the bytes its rows take as stored).
void pack_group(const tensor_view& w, int64_t r0, int64_t valid, uint8_t* out) {
  const amx_weight_layout l = amx_layout_of(w.type);
  const int64_t nb = w.n_cols / 32;
  const size_t stride = static_cast<size_t>(R) * l.block;
  const int dwords = static_cast<int>(l.packed_qs / 64);
  for (int64_t b = 0; b < nb; ++b, out += stride) {
    std::memset(out, 0, stride);
    for (int64_t n = 0; n < valid; ++n) {
      const auto* blk =
          static_cast<const uint8_t*>(w.row(r0 + n)) + static_cast<size_t>(b) * l.block;
      for (int j = 0; j < dwords; ++j) std::memcpy(out + 64 * j + 4 * n, blk + l.qs + 4 * j, 4);
      std::memcpy(out + l.packed_qs + 2 * n, blk, 2);                                          // d
      if (w.type == ggml_type::q4_1) std::memcpy(out + l.packed_qs + 32 + 2 * n, blk + 2, 2);  // m
    }
  }
}

#ifdef WEFT_AMX_AVX2

// Up to this many tokens share one pass over a half group's blocks: 8 registers of quants, N
// accumulators and the temporaries fill AVX2's 16.
constexpr int64_t max_tokens = 4;

struct args {
  const amx_acts* a;
  size_t act_block;  // bytes per activation block
  size_t act_qs;     // offset of its qs
  int64_t nb;
  const int32_t* asum;  // Q4_0: the activation blocks' sums, token-major
};

// Rows 8h..8h+7 of a packed block as 8 registers: v[j] holds each row's elements 4j..4j+3 (u8
// nibbles for Q4, signed bytes for Q8_0).
template <ggml_type T>
[[gnu::always_inline]] inline void load_half(const uint8_t* at, int h, __m256i v[8]) {
  if constexpr (T == ggml_type::q8_0) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j)
      v[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 64 * j + 32 * h));
  } else {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 64 * j + 32 * h));
      v[j] = _mm256_and_si256(q, low4);
      v[4 + j] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
    }
  }
}

// Activation dword j of a block, in every lane (one broadcast load).
[[gnu::always_inline]] inline __m256i dword(const uint8_t* aq, int j) {
  int32_t x;
  __builtin_memcpy(&x, aq + 4 * j, sizeof x);
  return _mm256_set1_epi32(x);
}

// The 8 rows' exact block sums against one token's activation block `aq` (32 int8).
template <ggml_type T>
[[gnu::always_inline]] inline __m256i block_isum(const __m256i v[8], const uint8_t* aq) {
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (T == ggml_type::q8_0) {
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int j = 0; j < 8; j += 2) {
      const __m256i a0 = dword(aq, j), a1 = dword(aq, j + 1);
      const __m256i p0 =
          _mm256_maddubs_epi16(_mm256_sign_epi8(v[j], v[j]), _mm256_sign_epi8(a0, v[j]));
      const __m256i p1 = _mm256_maddubs_epi16(_mm256_sign_epi8(v[j + 1], v[j + 1]),
                                              _mm256_sign_epi8(a1, v[j + 1]));
      s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(p0, ones));
      s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(p1, ones));
    }
    return _mm256_add_epi32(s0, s1);
  } else {
    __m256i s0 = _mm256_maddubs_epi16(v[0], dword(aq, 0));
    __m256i s1 = _mm256_maddubs_epi16(v[1], dword(aq, 1));
#pragma GCC unroll 8
    for (int j = 2; j < 8; j += 2) {
      s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(v[j], dword(aq, j)));
      s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(v[j + 1], dword(aq, j + 1)));
    }
    return _mm256_madd_epi16(_mm256_add_epi16(s0, s1), ones);
  }
}

// Tokens [t0, t0 + N) against rows 8h..8h+7 of the group whose block b is at base + b * stride
// (H = 2: both halves in the same pass, N = 1 only — batch-1 decode, one stream per group).
// `ahead` != 0: block b's bytes that far on are fetched first (the next group, read next).
template <ggml_type T, int N, int H>
void group_pass(const uint8_t* base, const args& g, int h0, int64_t t0, size_t ahead,
                float* out[N][H]) {
  static_assert(N >= 1 && N <= max_tokens && (H == 1 || N == 1));
  constexpr amx_weight_layout l = amx_layout_of(T);
  constexpr size_t stride = static_cast<size_t>(R) * l.block;
  const amx_acts& a = *g.a;
  const int64_t ld = a.n_tokens;
  __m256 acc[N][H];
#pragma GCC unroll 8
  for (int t = 0; t < N; ++t) {
#pragma GCC unroll 2
    for (int k = 0; k < H; ++k) acc[t][k] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < g.nb; ++b) {
    const uint8_t* at = base + static_cast<size_t>(b) * stride;
    if (ahead != 0) {
#pragma GCC unroll 8
      for (size_t o = 0; o < stride; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(at + ahead + o), _MM_HINT_T0);
    }
#pragma GCC unroll 2
    for (int k = 0; k < H; ++k) {
      const int h = h0 + k;
      __m256i v[8];
      load_half<T>(at, h, v);
      const __m256 dw = _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(at + l.packed_qs + 16 * h)));
      __m256 mw = _mm256_setzero_ps();
      if constexpr (T == ggml_type::q4_1) {
        mw = _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(at + l.packed_qs + 32 + 16 * h)));
      }
#pragma GCC unroll 4
      for (int t = 0; t < N; ++t) {
        const int64_t tok = t0 + t;
        const uint8_t* aq = a.rows + static_cast<size_t>(tok) * a.row_bytes +
                            static_cast<size_t>(b) * g.act_block + g.act_qs;
        __m256i isum = block_isum<T>(v, aq);
        if constexpr (T == ggml_type::q4_0)
          isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(8 * g.asum[tok * g.nb + b]));
        const __m256 x = _mm256_mul_ps(dw, _mm256_set1_ps(a.d[b * ld + tok]));
        acc[t][k] = _mm256_fmadd_ps(x, _mm256_cvtepi32_ps(isum), acc[t][k]);
        if constexpr (T == ggml_type::q4_1)
          acc[t][k] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.s[b * ld + tok]), acc[t][k]);
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < N; ++t) {
#pragma GCC unroll 2
    for (int k = 0; k < H; ++k) _mm256_storeu_ps(out[t][k], acc[t][k]);
  }
}

// Tokens [t0, t0 + n) (1 <= n <= max_tokens) of one half: group_pass's instantiation for n.
template <ggml_type T, int N = 1>
void half_tokens(int64_t n, const uint8_t* base, const args& g, int h, int64_t t0,
                 float* out[max_tokens][1]) {
  if constexpr (N < max_tokens) {
    if (n != N) return half_tokens<T, N + 1>(n, base, g, h, t0, out);
  }
  float* o[N][1];
  for (int t = 0; t < N; ++t) o[t][0] = out[t][0];
  group_pass<T, N, 1>(base, g, h, t0, 0, o);
}

thread_local std::vector<uint8_t> tls_group;

template <ggml_type T>
void matmul_rows(const tensor_view& w, const args& g, int64_t r_begin, int64_t r_end, float* y) {
  const amx_acts& a = *g.a;
  const size_t group_bytes = static_cast<size_t>(R) * w.row_bytes;
  const int64_t whole = w.n_rows / R * R;  // packed groups end here
  for (int64_t r0 = r_begin; r0 < r_end; r0 += R) {
    const int64_t valid = std::min(R, r_end - r0);
    const uint8_t* base;
    if (w.packed != nullptr && valid == R && r0 + R <= whole) {
      base = static_cast<const uint8_t*>(w.packed) + static_cast<size_t>(r0) * w.row_bytes;
    } else {  // rows after the last whole group, or weights kept as stored: packed here
      tls_group.resize(group_bytes);
      pack_group(w, r0, valid, tls_group.data());
      base = tls_group.data();
    }
    alignas(32) float tail[max_tokens][R];  // a partial group's results, stored whole first
    if (a.n_tokens == 1) {
      const bool next = w.packed != nullptr && r0 + 2 * R <= std::min(r_end, whole);
      float* o[1][2] = {{valid == R ? y + r0 : tail[0], valid == R ? y + r0 + 8 : tail[0] + 8}};
      group_pass<T, 1, 2>(base, g, 0, 0, next ? group_bytes : 0, o);
      if (valid < R) std::memcpy(y + r0, tail[0], static_cast<size_t>(valid) * sizeof(float));
      continue;
    }
    for (int h = 0; h < 2 && 8 * h < valid; ++h) {
      for (int64_t t0 = 0; t0 < a.n_tokens; t0 += max_tokens) {
        const int64_t n = std::min(max_tokens, a.n_tokens - t0);
        float* o[max_tokens][1];
        for (int64_t t = 0; t < n; ++t)
          o[t][0] = valid == R ? y + (t0 + t) * w.n_rows + r0 + 8 * h : tail[t] + 8 * h;
        half_tokens<T>(n, base, g, h, t0, o);
        if (valid < R) {
          const int64_t cols = std::min<int64_t>(8, valid - 8 * h);
          for (int64_t t = 0; t < n; ++t) {
            std::memcpy(y + (t0 + t) * w.n_rows + r0 + 8 * h, tail[t] + 8 * h,
                        static_cast<size_t>(cols) * sizeof(float));
          }
        }
      }
    }
  }
}

#endif  // WEFT_AMX_AVX2

}  // namespace

void amx_act_block_sums(const amx_acts& a, ggml_type w_type, int64_t n_cols,
                        std::vector<int32_t>& sums) {
  const bool q4_1 = w_type == ggml_type::q4_1;
  const size_t block = q4_1 ? sizeof(block_q8_1) : sizeof(block_q8_0);
  const size_t qs = q4_1 ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
  const int64_t nb = n_cols / 32;
  sums.resize(static_cast<size_t>(a.n_tokens * nb));
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    for (int64_t b = 0; b < nb; ++b) {
      const auto* q = reinterpret_cast<const int8_t*>(
          a.rows + static_cast<size_t>(t) * a.row_bytes + static_cast<size_t>(b) * block + qs);
#ifdef WEFT_AMX_AVX2
      // The 32 int8 quants' sum: as u8 (flipped sign bit) summed by SAD, minus 32 * 128.
      const __m256i u = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)),
                                         _mm256_set1_epi8(static_cast<char>(0x80)));
      const __m256i sad = _mm256_sad_epu8(u, _mm256_setzero_si256());
      const __m128i h =
          _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
      const int64_t sum = _mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1) - 32 * 128;
#else
      int64_t sum = 0;
      for (int k = 0; k < 32; ++k) sum += q[k];
#endif
      sums[static_cast<size_t>(t * nb + b)] = static_cast<int32_t>(sum);
    }
  }
}

bool amx_avx2_available() {
#ifdef WEFT_AMX_AVX2
  return true;
#else
  return false;
#endif
}

size_t amx_avx2_packed_bytes(const tensor_view& w) {
  const bool type =
      w.type == ggml_type::q4_0 || w.type == ggml_type::q4_1 || w.type == ggml_type::q8_0;
  if (!type || !amx_avx2_available() || w.n_cols % 32 != 0 || w.n_rows < R) return 0;
  return w.mat_bytes * static_cast<size_t>(w.n_mats);
}

void amx_avx2_pack(const tensor_view& w, void* dst) {
  for (int64_t i = 0; i < w.n_mats; ++i) {
    const tensor_view m = w.matrix(i);
    auto* out = static_cast<uint8_t*>(dst) + static_cast<size_t>(i) * w.mat_bytes;
    for (int64_t r0 = 0; r0 + R <= m.n_rows; r0 += R)
      pack_group(m, r0, R, out + static_cast<size_t>(r0) * m.row_bytes);
  }
}

void amx_avx2_matmul_rows(const tensor_view& w, const amx_acts& a, float* y, int64_t r_begin,
                          int64_t r_end) {
#ifdef WEFT_AMX_AVX2
  thread_local std::vector<int32_t> sums;
  args g{&a, 0, 0, w.n_cols / 32, nullptr};
  if (w.type == ggml_type::q4_1) {
    g.act_block = sizeof(block_q8_1), g.act_qs = offsetof(block_q8_1, qs);
  } else {
    g.act_block = sizeof(block_q8_0), g.act_qs = offsetof(block_q8_0, qs);
  }
  if (w.type == ggml_type::q4_0) {
    amx_act_block_sums(a, w.type, w.n_cols, sums);
    g.asum = sums.data();
  }
  switch (w.type) {
    case ggml_type::q4_0:
      return matmul_rows<ggml_type::q4_0>(w, g, r_begin, r_end, y);
    case ggml_type::q4_1:
      return matmul_rows<ggml_type::q4_1>(w, g, r_begin, r_end, y);
    default:
      return matmul_rows<ggml_type::q8_0>(w, g, r_begin, r_end, y);
  }
#else
  (void)w, (void)a, (void)y, (void)r_begin, (void)r_end;
#endif
}

}  // namespace weft::gpu::cpu
