#include "gpu/cpu/amx_matmul.hpp"

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <vector>

#include "gpu/ggml_types.hpp"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define WEFT_AMX_BUILD 1
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 flags the _mm512_undefined_*() inside the AVX-512 intrinsics when they are inlined into a
// function with a target attribute; the value is never read.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace weft::gpu::cpu {

#if WEFT_AMX_BUILD

// The kernel's functions are compiled for AMX and AVX-512 whatever the build's -march (the portable
// package targets x86-64-v3); they run only after amx_vnni_available() found AVX-512 VNNI on the
// CPU, and the tile path (AMX instructions) only after amx_available() found AMX too.
#define WEFT_AMX_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")))

namespace {

constexpr int arch_req_xcomp_perm = 0x1023;
constexpr int xfeature_xtiledata = 18;

struct probe_result {
  bool vnni = false;  // AVX-512 F/DQ/BW/VL and VNNI: the kernel without its tiles
  bool ok = false;    // and AMX-INT8 with the kernel's permission for the tile state
  const char* vnni_reason = "";
  const char* reason = "";
};

probe_result probe() {
  probe_result r;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) {
    r.vnni_reason = r.reason = "the CPU reports no extended features (cpuid leaf 7)";
    return r;
  }
  const bool avx512 = (b & (1u << 16)) != 0 && (b & (1u << 30)) != 0 && (b & (1u << 31)) != 0 &&
                      (b & (1u << 17)) != 0;
  const bool tile = (d & (1u << 24)) != 0, int8 = (d & (1u << 25)) != 0;
  const bool vnni = (c & (1u << 11)) != 0;
  r.vnni = avx512 && vnni;
  if (!r.vnni) {
    r.vnni_reason = "this CPU has no AVX-512 VNNI (Intel Cascade Lake / AMD Zen 4 or later has it)";
  }
  if (!tile || !int8 || !r.vnni) {
    r.reason = "this CPU has no AMX-INT8 (Intel Sapphire Rapids or later has it)";
    return r;
  }
  if (syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) != 0) {
    r.reason = "the kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM)";
    return r;
  }
  r.ok = true;
  return r;
}

const probe_result& probed() {
  static const probe_result r = probe();
  return r;
}

// ldtilecfg's 64-byte operand (palette 1).
struct alignas(64) tile_config {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles: 0, 1 accumulators (m tokens x 16 rows of int32); 2, 3 activations (m tokens x 32 int8);
// 4, 5 weights (8 rows of 16 weight rows x 4 int8, the VNNI layout of 32 x 16).
thread_local int configured_tokens = 0;

WEFT_AMX_TARGET void configure(int m) {
  if (configured_tokens == m) return;
  tile_config c;
  for (int t = 0; t < 2; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = static_cast<uint8_t>(m);
    c.colsb[2 + t] = 32;
    c.rows[2 + t] = static_cast<uint8_t>(m);
    c.colsb[4 + t] = 64;
    c.rows[4 + t] = 8;
  }
  // GCC's _tile_loadconfig tells the compiler it reads 8 bytes: without the barrier the stores to
  // the rest of `c` may be dropped.
  __asm__ __volatile__("" : : "r"(&c) : "memory");
  _tile_loadconfig(&c);
  configured_tokens = m;
}

// Dword j of 16 rows' 16 bytes (src[n], n = 0..15) -> out[j], row n in dword n.
WEFT_AMX_TARGET inline void transpose_16x4(const uint8_t* const* src, __m512i out[4]) {
  __m512i z[4];
  for (int q = 0; q < 4; ++q) {
    z[q] = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src[4 * q])));
    z[q] = _mm512_inserti32x4(z[q],
                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(src[4 * q + 1])), 1);
    z[q] = _mm512_inserti32x4(z[q],
                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(src[4 * q + 2])), 2);
    z[q] = _mm512_inserti32x4(z[q],
                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(src[4 * q + 3])), 3);
  }
  // z[q] holds row 4q + k's dword j at 4k + j.
  const __m512i j01 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
  const __m512i j23 = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
  const __m512i a01 = _mm512_permutex2var_epi32(z[0], j01, z[1]);  // j0 rows 0-7 | j1 rows 0-7
  const __m512i a23 = _mm512_permutex2var_epi32(z[0], j23, z[1]);
  const __m512i b01 = _mm512_permutex2var_epi32(z[2], j01, z[3]);  // rows 8-15
  const __m512i b23 = _mm512_permutex2var_epi32(z[2], j23, z[3]);
  const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
  const __m512i hi =
      _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  out[0] = _mm512_permutex2var_epi32(a01, lo, b01);
  out[1] = _mm512_permutex2var_epi32(a01, hi, b01);
  out[2] = _mm512_permutex2var_epi32(a23, lo, b23);
  out[3] = _mm512_permutex2var_epi32(a23, hi, b23);
}

// A group's 16 rows are 16 streams the hardware prefetcher does not follow well: the next group's
// rows (contiguous) are fetched a slice per block while this group runs.
struct next_group_prefetch {
  const uint8_t* next;
  size_t bytes, per_block;
  next_group_prefetch(const tensor_view& w, int64_t r0)
      : next(static_cast<const uint8_t*>(w.row(std::min(r0 + 16, w.n_rows)))),
        bytes(static_cast<size_t>(std::clamp<int64_t>(w.n_rows - r0 - 16, 0, 16)) * w.row_bytes),
        per_block((bytes / static_cast<size_t>(std::max<int64_t>(1, w.n_cols / 32)) + 63) / 64 *
                  64) {}
  void slice(int64_t b) const {
    const size_t end = std::min(bytes, static_cast<size_t>(b + 1) * per_block);
    for (size_t o = static_cast<size_t>(b) * per_block; o < end; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(next + o), _MM_HINT_T0);
  }
};

// One group of 16 weight rows in the AMX layout: per block 512 bytes of int8 weights (tile rows
// 0-3: elements 0-15, rows 4-7: elements 16-31) and the rows' scales d (and m, Q4_1) as floats.
struct packed_group {
  std::vector<uint8_t> storage;  // 512 per block, from the first 64-byte boundary in it
  uint8_t* bytes = nullptr;
  std::vector<float> d, m;  // 16 per block
};

// The quants of one block of 16 rows (VNNI order, as transpose_16x4 leaves them: Q4 4 vectors of
// packed nibbles, Q8_0 8 of int8) as u8: v[j] holds each row's elements 4j..4j+3. The u8 dot
// product minus `offset` times the activations' sum is the block's exact sum (Q4_0: nibble - 8;
// Q8_0: (w + 128) - 128).
template <ggml_type T>
WEFT_AMX_TARGET inline void to_u8(const __m512i* q, __m512i v[8]) {
  if constexpr (T == ggml_type::q8_0) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) v[j] = _mm512_xor_si512(q[j], flip);
  } else {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm512_and_si512(q[j], low4);
      v[4 + j] = _mm512_and_si512(_mm512_srli_epi16(q[j], 4), low4);
    }
  }
}

// Block b of 16 rows as stored (src[n]: row n's quants of block b) in the VNNI order.
template <ggml_type T>
WEFT_AMX_TARGET inline void transpose_block(const uint8_t* const* src, __m512i q[8]) {
  transpose_16x4(src, q);
  if constexpr (T == ggml_type::q8_0) {
    const uint8_t* hi[16];
    for (int n = 0; n < 16; ++n) hi[n] = src[n] + 16;
    transpose_16x4(hi, q + 4);
  }
}

// Row n's first 4 bytes of a block (fp16 d, then m for Q4_1) in dword n, rows outside `rows` 0.
WEFT_AMX_TARGET inline __m512i gather_dm(const uint8_t* base, __m512i index, __mmask16 rows) {
  return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), rows, index, base, 1);
}

WEFT_AMX_TARGET inline __m512i row_offsets(size_t row_bytes) {
  return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                            _mm512_set1_epi32(static_cast<int>(row_bytes)));
}

// Block b of a group of 16 rows read where the model stores them (rows past n_valid read as
// zeros): the quants as u8 (to_u8), each row's fp16 d (and m, Q4_1) as floats.
template <ggml_type T>
struct group_reader {
  static constexpr amx_weight_layout layout = amx_layout_of(T);
  const uint8_t* base;  // row r0
  size_t row_bytes;
  int64_t n_valid;
  __mmask16 rows;
  __m512i index;  // row n's offset from row r0
  next_group_prefetch ahead;

  WEFT_AMX_TARGET group_reader(const tensor_view& w, int64_t r0, int64_t valid)
      : base(static_cast<const uint8_t*>(w.row(r0))),
        row_bytes(w.row_bytes),
        n_valid(valid),
        rows(static_cast<__mmask16>((1u << valid) - 1u)),
        index(row_offsets(w.row_bytes)),
        ahead(w, r0) {}

  WEFT_AMX_TARGET void block(int64_t b, __m512i v[8], __m512& d, __m512& m) const {
    ahead.slice(b);
    alignas(64) static const uint8_t zeros[32] = {};
    const uint8_t* at = base + static_cast<size_t>(b) * layout.block;
    const uint8_t* src[16];
    for (int n = 0; n < 16; ++n) src[n] = n < n_valid ? at + n * row_bytes + layout.qs : zeros;
    __m512i q[8];
    transpose_block<T>(src, q);
    to_u8<T>(q, v);
    const __m512i dm = gather_dm(at, index, rows);
    d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
    m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
  }
};

// The same from w.packed (amx_pack): each block's quants already in the VNNI order, then the 16
// rows' fp16 d (and m), one contiguous stream per group.
template <ggml_type T>
struct packed_reader {
  static constexpr amx_weight_layout layout = amx_layout_of(T);
  static constexpr size_t stride = 16 * layout.block;
  const uint8_t* base;  // the group's first byte in w.packed
  __mmask16 rows = 0xFFFF;
  size_t ahead = 0;  // the next group's offset from this one, 0: not prefetched

  // `next`: the next group is packed and read next (decode): its bytes are fetched a block's
  // worth per block, as vnni1_packed does.
  WEFT_AMX_TARGET packed_reader(const tensor_view& w, int64_t r0, bool next = false)
      : base(static_cast<const uint8_t*>(w.packed) + static_cast<size_t>(r0) * w.row_bytes),
        ahead(next ? static_cast<size_t>(amx_rows_per_group) * w.row_bytes : 0) {}

  WEFT_AMX_TARGET void block(int64_t b, __m512i v[8], __m512& d, __m512& m) const {
    load(base + static_cast<size_t>(b) * stride, ahead, v, d, m);
  }

  // The packed block at `at` (its quants as u8, its rows' d and m as floats); ahead != 0: the
  // block's worth of bytes that far on fetched first.
  WEFT_AMX_TARGET static void load(const uint8_t* at, size_t ahead, __m512i v[8], __m512& d,
                                   __m512& m) {
    if (ahead != 0) {
#pragma GCC unroll 8
      for (size_t o = 0; o < stride; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(at + ahead + o), _MM_HINT_T0);
    }
    __m512i q[8];
#pragma GCC unroll 8
    for (size_t j = 0; j < layout.packed_qs / 64; ++j) q[j] = _mm512_loadu_si512(at + j * 64);
    to_u8<T>(q, v);
    d = _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + layout.packed_qs)));
    if constexpr (T == ggml_type::q4_1) {
      m = _mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + layout.packed_qs + 32)));
    } else {
      m = _mm512_setzero_ps();
    }
  }
};

// Whether a group is read from w.packed: amx_pack packs whole groups only.
bool packed_group_at(const tensor_view& w, int64_t r0) {
  return w.packed != nullptr && r0 + amx_rows_per_group <= w.n_rows;
}

// The group's blocks as int8 (u8 quants minus the offset) for the tiles, and its scales.
template <ggml_type T, class Reader>
WEFT_AMX_TARGET void pack_group(const Reader& reader, int64_t nb, packed_group& p) {
  p.storage.resize(static_cast<size_t>(nb * 512 + 64));
  p.bytes = p.storage.data() + (64 - reinterpret_cast<uintptr_t>(p.storage.data()) % 64) % 64;
  p.d.resize(static_cast<size_t>(nb * 16));
  p.m.resize(static_cast<size_t>(nb * 16));
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(amx_layout_of(T).offset));
  for (int64_t b = 0; b < nb; ++b) {
    __m512i v[8];
    __m512 d, m;
    reader.block(b, v, d, m);
    uint8_t* out = p.bytes + b * 512;
    for (int j = 0; j < 8; ++j) _mm512_storeu_si512(out + j * 64, _mm512_sub_epi8(v[j], offset));
    _mm512_storeu_ps(p.d.data() + b * 16, d);
    _mm512_storeu_ps(p.m.data() + b * 16, m);
  }
}

struct group_args {
  const packed_group* p;
  const amx_acts* a;
  size_t act_block;  // bytes per activation block
  size_t act_qs;     // offset of its qs
  int64_t nb;
  bool q4_1;
};

// Block b of tokens [t0, t0 + m) (t0 a multiple of 16) into accumulator tile C (A, B: the tiles
// it loads into), the activations from their tile copy.
#define WEFT_AMX_PRODUCT(C, A, B, g, t0, b)                                                   \
  do {                                                                                        \
    _tile_zero(C);                                                                            \
    _tile_loadd(A, (g).a->tiles + static_cast<size_t>(((t0) / 16) * (g).nb + (b)) * 512, 32); \
    _tile_loadd(B, (g).p->bytes + (b)*512, 64);                                               \
    _tile_dpbssd(C, A, B);                                                                    \
  } while (0)

// acc[i] (token t0 + i, 16 rows) += block b's term, in block order, for all 16 tokens of the
// tile (past the batch's last token: zero activations, the scale table's zero padding).
WEFT_AMX_TARGET inline void epilogue(const group_args& g, const int32_t (*c)[16], int64_t t0,
                                     int64_t b, __m512* acc) {
  const __m512 dw = _mm512_loadu_ps(g.p->d.data() + b * 16);
  const float* da = g.a->d + b * g.a->n_tokens + t0;
  constexpr int n = 16;
  if (g.q4_1) {
    const __m512 mw = _mm512_loadu_ps(g.p->m.data() + b * 16);
    const float* sa = g.a->s + b * g.a->n_tokens + t0;
    // Unrolled for a full tile, so the accumulators stay in registers.
#pragma GCC unroll 16
    for (int i = 0; i < n; ++i) {
      const __m512 x = _mm512_mul_ps(dw, _mm512_set1_ps(da[i]));
      const __m512 s = _mm512_cvtepi32_ps(_mm512_load_si512(c[i]));
      acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sa[i]), _mm512_fmadd_ps(x, s, acc[i]));
    }
  } else {
#pragma GCC unroll 16
    for (int i = 0; i < n; ++i) {
      const __m512 x = _mm512_mul_ps(dw, _mm512_set1_ps(da[i]));
      acc[i] = _mm512_fmadd_ps(x, _mm512_cvtepi32_ps(_mm512_load_si512(c[i])), acc[i]);
    }
  }
}

// Tokens [t0, t0 + m) against the group: two accumulators, so block b + 1's product runs while
// block b's sums are scaled. A last tile of fewer than 16 tokens runs all 16 rows (the tile copy's
// rows past the batch are zeros) and stores m: one tile configuration for every call, where
// switching it for a short last tile (LDTILECFG, twice a group) cost more than the rows it saves.
WEFT_AMX_TARGET void token_tile(const group_args& g, int64_t t0, int m, float* y, int64_t ld,
                                __mmask16 rows) {
  configure(16);
  __m512 acc[16];
#pragma GCC unroll 16
  for (auto& v : acc) v = _mm512_setzero_ps();
  alignas(64) int32_t c0[16][16];
  alignas(64) int32_t c1[16][16];
  const int64_t nb = g.nb;
  WEFT_AMX_PRODUCT(0, 2, 4, g, t0, 0);
  for (int64_t b = 0; b < nb; b += 2) {
    if (b + 1 < nb) WEFT_AMX_PRODUCT(1, 3, 5, g, t0, b + 1);
    _tile_stored(0, c0, 64);
    epilogue(g, c0, t0, b, acc);
    if (b + 2 < nb) WEFT_AMX_PRODUCT(0, 2, 4, g, t0, b + 2);
    if (b + 1 < nb) {
      _tile_stored(1, c1, 64);
      epilogue(g, c1, t0, b + 1, acc);
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    if (i < m) _mm512_mask_storeu_ps(y + (t0 + i) * ld, rows, acc[i]);
  }
}

thread_local packed_group tls_group;

// Up to this many tokens the group runs on AVX-512 VNNI instead of the tiles: the same exact block
// sums and the same epilogue (so the same bits), without unpacking the weights for a decode step's
// few tokens. Session 45 found the tiles faster from 9 tokens, against a VNNI path whose loops GCC
// had left rolled; unrolled and prefetching (session 51, 2-vCPU AMX VM, decode steps) VNNI is
// faster up to 16: batch 10 +24 %, 12 +19 %, 16 +5 %. 16 accumulators fill the register file, so
// 17 tokens and more take the tiles.
constexpr int64_t vnni_max_tokens = 16;

// One group (rows r0 + n for n in reader.rows) against tokens [t0, t0 + N) of a (1 <= N <=
// vnni_max_tokens). N is known at compile time and every loop over tokens and quants is unrolled,
// so the accumulators, the unpacked quants and the activation broadcasts stay in registers: GCC's
// -O2 leaves such loops rolled, and the arrays then go through the stack (session 51, AMX VM: with
// the prefetch below, decode at batch 2 250 -> 370 tok/s, batch 8 466 -> 630).
template <ggml_type T, int N, class Reader>
WEFT_AMX_TARGET void vnni_group(const Reader& reader, const group_args& g, int64_t r0,
                                int64_t n_rows, const int32_t* asum, float* y, int64_t t0 = 0) {
  static_assert(N >= 1 && N <= vnni_max_tokens);
  constexpr int32_t offset = amx_layout_of(T).offset;
  constexpr int64_t n_tok = N;
  const int64_t ld = g.a->n_tokens;  // the scale tables' stride
  const uint8_t* rows = g.a->rows + static_cast<size_t>(t0) * g.a->row_bytes + g.act_qs;
  asum += t0 * g.nb;
  y += t0 * n_rows;
  __m512 acc[N];
#pragma GCC unroll 16
  for (int64_t t = 0; t < n_tok; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < g.nb; ++b) {
    __m512i v[8];
    __m512 dw, mw;
    reader.block(b, v, dw, mw);
    const float* da = g.a->d + b * ld + t0;
#pragma GCC unroll 16
    for (int64_t t = 0; t < n_tok; ++t) {
      const uint8_t* aq =
          rows + static_cast<size_t>(t) * g.a->row_bytes + static_cast<size_t>(b) * g.act_block;
      int32_t a4[8];
      __builtin_memcpy(a4, aq, sizeof a4);
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int j = 0; j < 8; j += 2) {
        s0 = _mm512_dpbusd_epi32(s0, v[j], _mm512_set1_epi32(a4[j]));
        s1 = _mm512_dpbusd_epi32(s1, v[j + 1], _mm512_set1_epi32(a4[j + 1]));
      }
      __m512i isum = _mm512_add_epi32(s0, s1);
      if constexpr (offset != 0)
        isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(offset * asum[t * g.nb + b]));
      const __m512 x = _mm512_mul_ps(dw, _mm512_set1_ps(da[t]));
      acc[t] = _mm512_fmadd_ps(x, _mm512_cvtepi32_ps(isum), acc[t]);
      if constexpr (T == ggml_type::q4_1)
        acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(g.a->s[b * ld + t0 + t]), acc[t]);
    }
  }
#pragma GCC unroll 16
  for (int64_t t = 0; t < n_tok; ++t)
    _mm512_mask_storeu_ps(y + t * n_rows + r0, reader.rows, acc[t]);
}

// One token (batch-1 decode) against G whole packed groups (16 G rows, contiguous in w.packed):
// each block's activation dwords are broadcast once for all G groups, the G accumulators are
// independent chains, and (`prefetch`) the next G groups are fetched a block's worth per block —
// the hardware prefetcher alone left the loads waiting (session 51, AMX VM: 182-192 tok/s without,
// 266-286 with, one group at a time). Every row's integer sums and float operations are
// vnni_group's, in its order, so the bits are the same.
template <ggml_type T, int G>
WEFT_AMX_TARGET void vnni1_packed(const tensor_view& w, const group_args& g, int64_t r0,
                                  const int32_t* asum, float* y, bool prefetch) {
  constexpr amx_weight_layout layout = amx_layout_of(T);
  constexpr size_t stride = packed_reader<T>::stride;
  const size_t group_bytes = static_cast<size_t>(amx_rows_per_group) * w.row_bytes;
  const auto* base = static_cast<const uint8_t*>(w.packed) + static_cast<size_t>(r0) * w.row_bytes;
  const size_t ahead = static_cast<size_t>(G) * group_bytes;
  const uint8_t* act = g.a->rows + g.act_qs;
  __m512 acc[G];
#pragma GCC unroll 8
  for (int k = 0; k < G; ++k) acc[k] = _mm512_setzero_ps();
  for (int64_t b = 0; b < g.nb; ++b) {
    __m512i a[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      int32_t a4;
      __builtin_memcpy(&a4, act + static_cast<size_t>(b) * g.act_block + 4 * j, sizeof a4);
      a[j] = _mm512_set1_epi32(a4);
    }
    const __m512 da = _mm512_set1_ps(g.a->d[b]);
#pragma GCC unroll 8
    for (int k = 0; k < G; ++k) {
      __m512i v[8];
      __m512 dw, mw;
      packed_reader<T>::load(
          base + static_cast<size_t>(k) * group_bytes + static_cast<size_t>(b) * stride,
          prefetch ? ahead : 0, v, dw, mw);
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int j = 0; j < 8; j += 2) {
        s0 = _mm512_dpbusd_epi32(s0, v[j], a[j]);
        s1 = _mm512_dpbusd_epi32(s1, v[j + 1], a[j + 1]);
      }
      __m512i isum = _mm512_add_epi32(s0, s1);
      if constexpr (layout.offset != 0)
        isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(layout.offset * asum[b]));
      acc[k] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(isum), acc[k]);
      if constexpr (T == ggml_type::q4_1)
        acc[k] = _mm512_fmadd_ps(mw, _mm512_set1_ps(g.a->s[b]), acc[k]);
    }
  }
#pragma GCC unroll 8
  for (int k = 0; k < G; ++k) _mm512_storeu_ps(y + r0 + k * amx_rows_per_group, acc[k]);
}

// Batch-1 decode: whole packed groups four (else two, one) at a time, the rest as vnni_group.
// Four at a time and one at a time measured alike once both prefetch (within the VM's noise).
template <ggml_type T>
WEFT_AMX_TARGET void vnni1_rows(const tensor_view& w, const group_args& g, int64_t r_begin,
                                int64_t r_end, const int32_t* asum, float* y) {
  constexpr int64_t R = amx_rows_per_group;
  int64_t r0 = r_begin;
  // Whole packed groups end at the last multiple of 16 rows in the matrix and in the range.
  const int64_t packed_end =
      w.packed != nullptr ? std::min(r_end, w.n_rows / R * R) / R * R : r_begin;
  while (r0 + 4 * R <= packed_end) {
    vnni1_packed<T, 4>(w, g, r0, asum, y, r0 + 8 * R <= packed_end);
    r0 += 4 * R;
  }
  if (r0 + 2 * R <= packed_end) {
    vnni1_packed<T, 2>(w, g, r0, asum, y, r0 + 4 * R <= packed_end);
    r0 += 2 * R;
  }
  if (r0 + R <= packed_end) {
    vnni1_packed<T, 1>(w, g, r0, asum, y, r0 + 2 * R <= packed_end);
    r0 += R;
  }
  for (; r0 < r_end; r0 += R) {
    const group_reader<T> reader(w, r0, std::min<int64_t>(R, r_end - r0));
    vnni_group<T, 1>(reader, g, r0, w.n_rows, asum, y);
  }
}

template <ggml_type T, int N>
WEFT_AMX_TARGET void vnni_rows(const tensor_view& w, const group_args& g, int64_t r_begin,
                               int64_t r_end, const int32_t* asum, float* y) {
  for (int64_t r0 = r_begin; r0 < r_end; r0 += amx_rows_per_group) {
    if (packed_group_at(w, r0) && r0 + amx_rows_per_group <= r_end) {
      const int64_t next = r0 + amx_rows_per_group;
      const bool ahead = packed_group_at(w, next) && next + amx_rows_per_group <= r_end;
      vnni_group<T, N>(packed_reader<T>(w, r0, ahead), g, r0, w.n_rows, asum, y);
    } else {
      const group_reader<T> reader(w, r0, std::min<int64_t>(amx_rows_per_group, r_end - r0));
      vnni_group<T, N>(reader, g, r0, w.n_rows, asum, y);
    }
  }
}

// 2..vnni_max_tokens tokens: the instantiation of vnni_rows for g's token count, from N up.
template <ggml_type T, int N = 2>
WEFT_AMX_TARGET void vnni_rows_for(const tensor_view& w, const group_args& g, int64_t r_begin,
                                   int64_t r_end, const int32_t* asum, float* y) {
  if constexpr (N < vnni_max_tokens) {
    if (g.a->n_tokens != N) return vnni_rows_for<T, N + 1>(w, g, r_begin, r_end, asum, y);
  }
  vnni_rows<T, N>(w, g, r_begin, r_end, asum, y);
}

// Tokens [t0, t0 + n) of a (1 <= n <= vnni_max_tokens) against one group: vnni_group's
// instantiation for n, from N up.
template <ggml_type T, class Reader, int N = 1>
WEFT_AMX_TARGET void vnni_group_for(int64_t n, const Reader& reader, const group_args& g,
                                    int64_t r0, int64_t n_rows, const int32_t* asum, float* y,
                                    int64_t t0) {
  if constexpr (N < vnni_max_tokens) {
    if (n != N) return vnni_group_for<T, Reader, N + 1>(n, reader, g, r0, n_rows, asum, y, t0);
  }
  vnni_group<T, N>(reader, g, r0, n_rows, asum, y, t0);
}

// More than vnni_max_tokens tokens without the tiles (the `vnni` kernel: CPUs with AVX-512 VNNI
// and no AMX, or WEFT_CPU_MATMUL=vnni): per group of 16 rows, the tokens 16 at a time, so the
// group's bytes are read from memory once and from L1 for the other chunks. Every (row, token)
// pair gets vnni_group's integer sums and float operations in block order — the tile path's bits.
template <ggml_type T>
WEFT_AMX_TARGET void vnni_chunked_rows(const tensor_view& w, const group_args& g, int64_t r_begin,
                                       int64_t r_end, const int32_t* asum, float* y) {
  const int64_t n_tokens = g.a->n_tokens;
  for (int64_t r0 = r_begin; r0 < r_end; r0 += amx_rows_per_group) {
    const auto chunks = [&](const auto& reader) {
      for (int64_t t0 = 0; t0 < n_tokens; t0 += vnni_max_tokens) {
        const int64_t n = std::min(vnni_max_tokens, n_tokens - t0);
        if (n == vnni_max_tokens) {
          vnni_group<T, vnni_max_tokens>(reader, g, r0, w.n_rows, asum, y, t0);
        } else {
          vnni_group_for<T>(n, reader, g, r0, w.n_rows, asum, y, t0);
        }
      }
    };
    if (packed_group_at(w, r0) && r0 + amx_rows_per_group <= r_end) {
      chunks(packed_reader<T>(w, r0));
    } else {
      chunks(group_reader<T>(w, r0, std::min<int64_t>(amx_rows_per_group, r_end - r0)));
    }
  }
}

// The VNNI path and the tile path for one weight type.
template <ggml_type T>
WEFT_AMX_TARGET void matmul_rows(const tensor_view& w, const group_args& g, int64_t r_begin,
                                 int64_t r_end, const int32_t* asum, float* y) {
  const amx_acts& a = *g.a;
  if (a.n_tokens == 1) return vnni1_rows<T>(w, g, r_begin, r_end, asum, y);
  if (a.n_tokens <= vnni_max_tokens) return vnni_rows_for<T>(w, g, r_begin, r_end, asum, y);
  if (a.tiles == nullptr) return vnni_chunked_rows<T>(w, g, r_begin, r_end, asum, y);
  for (int64_t r0 = r_begin; r0 < r_end; r0 += amx_rows_per_group) {
    const int64_t n_valid = std::min<int64_t>(amx_rows_per_group, r_end - r0);
    if (packed_group_at(w, r0) && n_valid == amx_rows_per_group) {
      pack_group<T>(packed_reader<T>(w, r0), g.nb, tls_group);
    } else {
      pack_group<T>(group_reader<T>(w, r0, n_valid), g.nb, tls_group);
    }
    const auto rows = static_cast<__mmask16>((1u << n_valid) - 1u);
    // The next group's packed bytes, fetched into L2 a slice per token tile while this group's
    // tiles run: unpacking a group otherwise waits on memory for most of its loads.
    const int64_t n_tiles = (a.n_tokens + 15) / 16;
    const bool ahead =
        r0 + amx_rows_per_group < r_end && packed_group_at(w, r0 + amx_rows_per_group);
    const auto* next = ahead ? static_cast<const uint8_t*>(w.packed) +
                                   static_cast<size_t>(r0 + amx_rows_per_group) * w.row_bytes
                             : nullptr;
    const size_t group_bytes = static_cast<size_t>(amx_rows_per_group) * w.row_bytes;
    const size_t slice = (group_bytes / static_cast<size_t>(n_tiles) + 63) / 64 * 64;
    for (int64_t j = 0, t0 = 0; j < n_tiles; ++j, t0 += 16) {
      if (next != nullptr) {
        const size_t end = std::min(group_bytes, static_cast<size_t>(j + 1) * slice);
        for (size_t o = static_cast<size_t>(j) * slice; o < end; o += 64)
          _mm_prefetch(reinterpret_cast<const char*>(next + o), _MM_HINT_T1);
      }
      token_tile(g, t0, static_cast<int>(std::min<int64_t>(16, a.n_tokens - t0)), y + r0, w.n_rows,
                 rows);
    }
  }
}

// Matrix `w`'s whole groups into dst (the matrix's bytes of w.packed).
template <ggml_type T>
WEFT_AMX_TARGET void pack_matrix(const tensor_view& w, uint8_t* dst) {
  constexpr amx_weight_layout layout = amx_layout_of(T);
  const int64_t nb = w.n_cols / 32;
  const __m512i index = row_offsets(w.row_bytes);
  for (int64_t r0 = 0; r0 + amx_rows_per_group <= w.n_rows; r0 += amx_rows_per_group) {
    const auto* base = static_cast<const uint8_t*>(w.row(r0));
    uint8_t* out = dst + static_cast<size_t>(r0) * w.row_bytes;
    for (int64_t b = 0; b < nb; ++b, out += packed_reader<T>::stride) {
      const uint8_t* at = base + static_cast<size_t>(b) * layout.block;
      const uint8_t* src[16];
      for (int n = 0; n < 16; ++n) src[n] = at + n * w.row_bytes + layout.qs;
      __m512i q[8];
      transpose_block<T>(src, q);
      for (size_t j = 0; j < layout.packed_qs / 64; ++j) _mm512_storeu_si512(out + j * 64, q[j]);
      const __m512i dm = gather_dm(at, index, 0xFFFF);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + layout.packed_qs),
                          _mm512_cvtepi32_epi16(dm));
      if constexpr (T == ggml_type::q4_1) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + layout.packed_qs + 32),
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
      }
    }
  }
}

}  // namespace

bool amx_available() {
  return probed().ok;
}

size_t amx_act_tiles_bytes(int64_t n_cols, int64_t n_tokens) {
  if (n_tokens <= vnni_max_tokens || n_cols % 32 != 0) return 0;
  return static_cast<size_t>((n_tokens + 15) / 16 * (n_cols / 32)) * 512;
}

void amx_tile_acts(const amx_acts& a, ggml_type w_type, int64_t n_cols, int64_t t_begin,
                   int64_t t_end, uint8_t* tiles) {
  const int64_t nb = n_cols / 32;
  if (t_end == a.n_tokens) {
    // The last tile's rows past the batch: zeros (token_tile runs all 16 rows).
    for (int64_t t = a.n_tokens; t % 16 != 0; ++t) {
      uint8_t* out =
          tiles + static_cast<size_t>(t / 16 * nb) * 512 + static_cast<size_t>(t % 16) * 32;
      for (int64_t b = 0; b < nb; ++b) __builtin_memset(out + b * 512, 0, 32);
    }
  }
  const bool q4_1 = w_type == ggml_type::q4_1;
  const size_t block = q4_1 ? sizeof(block_q8_1) : sizeof(block_q8_0);
  const size_t qs = q4_1 ? offsetof(block_q8_1, qs) : offsetof(block_q8_0, qs);
  for (int64_t t = t_begin; t < t_end; ++t) {
    const uint8_t* row = a.rows + static_cast<size_t>(t) * a.row_bytes + qs;
    uint8_t* out =
        tiles + static_cast<size_t>(t / 16 * nb) * 512 + static_cast<size_t>(t % 16) * 32;
    for (int64_t b = 0; b < nb; ++b) {
      __builtin_memcpy(out + b * 512, row + static_cast<size_t>(b) * block, 32);
    }
  }
}

size_t amx_packed_bytes(const tensor_view& w) {
  const bool type =
      w.type == ggml_type::q4_0 || w.type == ggml_type::q4_1 || w.type == ggml_type::q8_0;
  if (!type || !amx_vnni_available() || w.n_cols % 32 != 0 || w.n_rows < amx_rows_per_group)
    return 0;
  return w.mat_bytes * static_cast<size_t>(w.n_mats);
}

WEFT_AMX_TARGET void amx_pack(const tensor_view& w, void* dst) {
  for (int64_t i = 0; i < w.n_mats; ++i) {
    const tensor_view m = w.matrix(i);
    auto* out = static_cast<uint8_t*>(dst) + static_cast<size_t>(i) * w.mat_bytes;
    switch (w.type) {
      case ggml_type::q4_0:
        pack_matrix<ggml_type::q4_0>(m, out);
        break;
      case ggml_type::q4_1:
        pack_matrix<ggml_type::q4_1>(m, out);
        break;
      default:
        pack_matrix<ggml_type::q8_0>(m, out);
        break;
    }
  }
}

const char* amx_unavailable_reason() {
  return probed().reason;
}

bool amx_vnni_available() {
  return probed().vnni;
}

const char* amx_vnni_unavailable_reason() {
  return probed().vnni_reason;
}

WEFT_AMX_TARGET void amx_matmul_rows(const tensor_view& w, const amx_acts& a, float* y,
                                     int64_t r_begin, int64_t r_end) {
  group_args g{&tls_group, &a, 0, 0, w.n_cols / 32, w.type == ggml_type::q4_1};
  if (g.q4_1) {
    g.act_block = sizeof(block_q8_1), g.act_qs = offsetof(block_q8_1, qs);
  } else {
    g.act_block = sizeof(block_q8_0), g.act_qs = offsetof(block_q8_0, qs);
  }
  // The VNNI path's activation block sums, for the offset of Q4_0 / Q8_0 weights.
  thread_local std::vector<int32_t> sums;
  if ((a.n_tokens <= vnni_max_tokens || a.tiles == nullptr) && amx_layout_of(w.type).offset != 0) {
    amx_act_block_sums(a, w.type, w.n_cols, sums);
  }
  switch (w.type) {
    case ggml_type::q4_0:
      return matmul_rows<ggml_type::q4_0>(w, g, r_begin, r_end, sums.data(), y);
    case ggml_type::q4_1:
      return matmul_rows<ggml_type::q4_1>(w, g, r_begin, r_end, sums.data(), y);
    default:
      return matmul_rows<ggml_type::q8_0>(w, g, r_begin, r_end, sums.data(), y);
  }
}

#undef WEFT_AMX_PRODUCT

#else  // no AMX build

bool amx_available() {
  return false;
}

const char* amx_unavailable_reason() {
  return "this build has no AMX kernel (x86-64 Linux with GCC or Clang only)";
}

bool amx_vnni_available() {
  return false;
}

const char* amx_vnni_unavailable_reason() {
  return amx_unavailable_reason();
}

size_t amx_packed_bytes(const tensor_view&) {
  return 0;
}

size_t amx_act_tiles_bytes(int64_t, int64_t) {
  return 0;
}

void amx_tile_acts(const amx_acts&, ggml_type, int64_t, int64_t, int64_t, uint8_t*) {}

void amx_pack(const tensor_view&, void*) {}

void amx_matmul_rows(const tensor_view&, const amx_acts&, float*, int64_t, int64_t) {}

#endif

}  // namespace weft::gpu::cpu
