#include "gpu/cpu/matmul.hpp"

#include <cblas.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/cpu/amx_matmul.hpp"
#include "gpu/cpu/half_dot.hpp"
#include "gpu/cpu/quant_dot.hpp"

namespace weft::gpu::cpu {

namespace {

status kernel_check(quant_matmul_kernel kernel) {
  if (kernel == quant_matmul_kernel::amx && !amx_available()) {
    return {status_code::unsupported,
            std::string{"the amx matmul kernel cannot run here: "} + amx_unavailable_reason()};
  }
  if (kernel == quant_matmul_kernel::vnni && !amx_vnni_available()) {
    return {status_code::unsupported, std::string{"the vnni matmul kernel cannot run here: "} +
                                          amx_vnni_unavailable_reason()};
  }
  if (kernel == quant_matmul_kernel::avx2 && !amx_avx2_available()) {
    return {status_code::unsupported,
            "the avx2 matmul kernel cannot run here: this build has no AVX2, FMA and F16C"};
  }
  return {};
}

bool cpu_vendor_is_intel() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return false;
  return b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;  // "GenuineIntel"
#else
  return false;
#endif
}

// `auto`: AMX where the CPU has it; else the vnni kernel on Intel CPUs with AVX-512 VNNI, where it
// was measured faster than the ggml kernel (docs/engine.md); else, on CPUs without AVX-512 VNNI,
// the avx2 kernel (measured faster on AMD Zen 3: prompts 1.2-1.5x, batched decode 1.1-1.3x);
// else ggml (AMD Zen 4, where neither was measured).
quant_matmul_kernel auto_kernel() {
  if (amx_available()) return quant_matmul_kernel::amx;
  if (amx_vnni_available()) {
    return cpu_vendor_is_intel() ? quant_matmul_kernel::vnni : quant_matmul_kernel::ggml;
  }
  if (amx_avx2_available()) return quant_matmul_kernel::avx2;
  return quant_matmul_kernel::ggml;
}

struct kernel_choice {
  std::mutex mu;
  bool read = false;
  quant_matmul_kernel kernel = quant_matmul_kernel::ggml;
  status error;
};

kernel_choice& choice() {
  static kernel_choice c;
  return c;
}

// The kernel in use, for matmul's fast path: -1 before WEFT_CPU_MATMUL is read, -2 when it is
// invalid or names a kernel that cannot run here.
std::atomic<int> active_kernel{-1};

}  // namespace

const char* quant_matmul_kernel_name(quant_matmul_kernel kernel) {
  switch (kernel) {
    case quant_matmul_kernel::amx:
      return "amx";
    case quant_matmul_kernel::vnni:
      return "vnni";
    case quant_matmul_kernel::avx2:
      return "avx2";
    default:
      return "ggml";
  }
}

result<quant_matmul_kernel> quant_matmul_kernel_in_use() {
  kernel_choice& c = choice();
  std::lock_guard lock(c.mu);
  if (!c.read) {
    c.read = true;
    const char* env = std::getenv("WEFT_CPU_MATMUL");
    const std::string v = env != nullptr && *env != '\0' ? env : "auto";
    if (v == "auto") {
      c.kernel = auto_kernel();
    } else if (v == "amx" || v == "vnni" || v == "avx2") {
      c.kernel = v == "amx"    ? quant_matmul_kernel::amx
                 : v == "vnni" ? quant_matmul_kernel::vnni
                               : quant_matmul_kernel::avx2;
      if (auto st = kernel_check(c.kernel); !st) {
        c.error = {st.code(), "WEFT_CPU_MATMUL=" + v + ": " + st.message()};
      }
    } else if (v != "ggml") {
      c.error = {status_code::invalid_argument,
                 "WEFT_CPU_MATMUL must be auto, ggml, avx2, vnni or amx, not '" + v + "'"};
    }
    active_kernel.store(c.error.ok() ? static_cast<int>(c.kernel) : -2);
  }
  if (!c.error.ok()) return c.error;
  return c.kernel;
}

status set_quant_matmul_kernel(quant_matmul_kernel kernel) {
  if (auto st = kernel_check(kernel); !st) return st;
  kernel_choice& c = choice();
  std::lock_guard lock(c.mu);
  c.read = true;
  c.kernel = kernel;
  c.error = {};
  active_kernel.store(static_cast<int>(kernel));
  return {};
}

bool matmul_supports(ggml_type type) {
  switch (type) {
    case ggml_type::f32:
    case ggml_type::f16:
    case ggml_type::bf16:
    case ggml_type::q8_0:
    case ggml_type::q4_0:
    case ggml_type::q4_1:
      return true;
    default:
      return false;
  }
}

namespace {

// Activation format each weight type is multiplied with.
size_t act_row_bytes(ggml_type type, int64_t n_cols) {
  switch (type) {
    case ggml_type::q8_0:
    case ggml_type::q4_0:
      return static_cast<size_t>(n_cols / 32) * sizeof(block_q8_0);
    case ggml_type::q4_1:
      return static_cast<size_t>(n_cols / 32) * sizeof(block_q8_1);
    case ggml_type::f16:
      return static_cast<size_t>(n_cols) * sizeof(uint16_t);
    default:
      return 0;
  }
}

// Scales of the quantized activations of n_tokens rows, block-major (d then s, each
// n_blocks x n_tokens floats): what the multi-token tiles read.
struct scale_table {
  float* d = nullptr;
  float* s = nullptr;
  int64_t n_tokens = 0;
  act_scales at(int64_t t) const { return {d + t, s == nullptr ? nullptr : s + t, n_tokens}; }
};

scale_table make_scales(matmul_scratch& scratch, ggml_type type, int64_t n_cols, int64_t n_tokens,
                        bool grouped) {
  if (n_tokens <= 1 && !grouped) return {};
  if (type != ggml_type::q4_0 && type != ggml_type::q4_1 && type != ggml_type::q8_0) return {};
  const size_t per = static_cast<size_t>(n_cols / 32 * n_tokens);
  // The tiles read the s table a vector of tile_tokens floats at a time, the amx kernel's last
  // tile up to 16 entries past a block's tokens: zero padding past its end.
  const size_t pad = std::max<size_t>(tile_tokens, 16);
  scratch.scales.resize(2 * per + pad);
  std::fill(scratch.scales.begin() + static_cast<std::ptrdiff_t>(2 * per), scratch.scales.end(),
            0.0f);
  return {scratch.scales.data(), type == ggml_type::q4_1 ? scratch.scales.data() + per : nullptr,
          n_tokens};
}

void convert_rows(ggml_type type, const float* x, uint8_t* a, int64_t t_begin, int64_t t_end,
                  int64_t n_cols, size_t a_row, const scale_table& sc = {}) {
  for (int64_t t = t_begin; t < t_end; ++t) {
    const float* xr = x + t * n_cols;
    uint8_t* ar = a + static_cast<size_t>(t) * a_row;
    switch (type) {
      case ggml_type::q8_0:
      case ggml_type::q4_0:
        quantize_act_q8_0(xr, reinterpret_cast<block_q8_0*>(ar), n_cols);
        if (sc.d != nullptr) {
          act_scales_column(reinterpret_cast<const block_q8_0*>(ar), n_cols / 32, sc.d + t,
                            sc.n_tokens);
        }
        break;
      case ggml_type::q4_1:
        quantize_act_q8_1(xr, reinterpret_cast<block_q8_1*>(ar), n_cols);
        if (sc.d != nullptr) {
          act_scales_column(reinterpret_cast<const block_q8_1*>(ar), n_cols / 32, sc.d + t,
                            sc.s + t, sc.n_tokens);
        }
        break;
      case ggml_type::f16:
        float_to_half_row(xr, reinterpret_cast<uint16_t*>(ar), n_cols);
        break;
      default:
        break;
    }
  }
}

// The packed-group kernels of a weight type (quant_dot.hpp, pack4_rows), or nullptr where this
// build has none.
template <class A>
using dot4_packed_fn = void (*)(const void*, const A*, int64_t, float*);
template <class A>
using tile_packed_fn = void (*)(const void*, const A* const*, int, int64_t, float* const*,
                                const act_scales&);

template <class W, class A, float (*Dot)(const W*, const A*, int64_t),
          void (*Dot4)(const void*, size_t, const A*, int64_t, float*),
          void (*Tile)(const void*, size_t, const A* const*, int, int64_t, float* const*,
                       const act_scales&),
          dot4_packed_fn<A> Dot4P = nullptr, tile_packed_fn<A> TileP = nullptr>
void rows_quant(const tensor_view& w, const uint8_t* a, size_t a_row, const scale_table& sc,
                int64_t n_tokens, float* y, int64_t r_begin, int64_t r_end) {
  const int64_t nb = w.n_cols / 32;
  const auto act = [&](int64_t t) {
    return reinterpret_cast<const A*>(a + static_cast<size_t>(t) * a_row);
  };
  // Rows from r_begin (a multiple of 8) in groups of 4: w.packed holds each whole group at the
  // offset it has in w.data (pack_weight).
  const auto* packed = static_cast<const char*>(w.packed);
  const auto group = [&](int64_t r) { return packed + static_cast<size_t>(r) * w.row_bytes; };
  if (n_tokens == 1) {
    int64_t r = r_begin;
    if constexpr (Dot4P != nullptr) {
      if (packed != nullptr) {
        for (; r + 4 <= r_end; r += 4) Dot4P(group(r), act(0), nb, y + r);
      }
    }
    for (; r + 4 <= r_end; r += 4) Dot4(w.row(r), w.row_bytes, act(0), nb, y + r);
    for (; r < r_end; ++r) y[r] = Dot(static_cast<const W*>(w.row(r)), act(0), nb);
    return;
  }
  // 16 rows x 16 tokens per tile: both the weight rows and the activation rows stay in L1. Inside,
  // tile_rows x tile_tokens at a time, so each weight block is unpacked once per tile_tokens.
  constexpr int64_t row_tile = 16;
  constexpr int64_t tok_tile = 16;
  static_assert(row_tile % tile_rows == 0 && tok_tile % tile_tokens == 0);
  for (int64_t r0 = r_begin; r0 < r_end; r0 += row_tile) {
    const int64_t r1 = std::min(r_end, r0 + row_tile);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += tok_tile) {
      const int64_t t1 = std::min(n_tokens, t0 + tok_tile);
      for (int64_t t = t0; t < t1; t += tile_tokens) {
        const int n = static_cast<int>(std::min<int64_t>(tile_tokens, t1 - t));
        const A* acts[tile_tokens];
        float* outs[tile_tokens];
        for (int j = 0; j < n; ++j) acts[j] = act(t + j);
        const act_scales scales = sc.at(t);
        int64_t r = r0;
        if constexpr (TileP != nullptr) {  // packed builds: tile_rows is the group's 4 rows
          if (packed != nullptr) {
            for (; r + tile_rows <= r1; r += tile_rows) {
              for (int j = 0; j < n; ++j) outs[j] = y + (t + j) * w.n_rows + r;
              TileP(group(r), acts, n, nb, outs, scales);
            }
          }
        }
        for (; r + tile_rows <= r1; r += tile_rows) {
          for (int j = 0; j < n; ++j) outs[j] = y + (t + j) * w.n_rows + r;
          Tile(w.row(r), w.row_bytes, acts, n, nb, outs, scales);
        }
        for (; r < r1; ++r) {
          for (int j = 0; j < n; ++j)
            y[(t + j) * w.n_rows + r] = Dot(static_cast<const W*>(w.row(r)), acts[j], nb);
        }
      }
    }
  }
}

void rows_f16(const tensor_view& w, const uint8_t* a, size_t a_row, int64_t n_tokens, float* y,
              int64_t r_begin, int64_t r_end) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    const auto* at = reinterpret_cast<const uint16_t*>(a + static_cast<size_t>(t) * a_row);
    for (int64_t r = r_begin; r < r_end; ++r) {
      y[t * w.n_rows + r] = dot_f16(static_cast<const uint16_t*>(w.row(r)), at, w.n_cols);
    }
  }
}

// Rows [r_begin, r_end) of f32 weights (`row(r)` gives row r's floats) times the activations,
// f32_tile_rows rows at a time against every token, f32_tile_tokens tokens a call: each weight row
// is read from memory once, and every result is dot_f32's, so a token's outputs do not depend on
// the batch it ran in. `dense`: the rows are contiguous, and the next tile is prefetched while the
// batch's first tokens run against this one (the later ones find the weights in L1).
template <class Row>
void rows_f32_tiled(const tensor_view& w, Row row, const f32_acts& a, float* y, int64_t r_begin,
                    int64_t r_end, bool dense) {
  int64_t r = r_begin;
  for (; r + f32_tile_rows <= r_end; r += f32_tile_rows) {
    const float* rows = row(r);
    const float* next = dense && a.n_tokens > 1 && r + 2 * f32_tile_rows <= r_end
                            ? rows + f32_tile_rows * w.n_cols
                            : nullptr;
    for (int64_t t = 0; t < a.n_tokens; t += f32_tile_tokens) {
      const int n = static_cast<int>(std::min<int64_t>(f32_tile_tokens, a.n_tokens - t));
      float* outs[f32_tile_tokens];
      for (int j = 0; j < n; ++j) outs[j] = y + (t + j) * w.n_rows + r;
      dot_tile_f32(rows, w.n_cols, a, t, n, outs, t == 0 ? next : nullptr);
    }
  }
  for (; r < r_end; ++r) {
    const float* one = row(r);
    for (int64_t t = 0; t < a.n_tokens; ++t)
      y[t * w.n_rows + r] = dot_f32(one, a.x + t * w.n_cols, w.n_cols);
  }
}

// bf16 weights (trainer exports, RL weight versions) with f32 activations: f32_tile_rows rows
// widened to f32 at a time (a bf16 is the top half of an f32), then the f32 tiles.
void rows_bf16(const tensor_view& w, const f32_acts& a, float* y, int64_t r_begin, int64_t r_end) {
  thread_local std::vector<float> rows;
  rows.resize(static_cast<size_t>(w.n_cols) * f32_tile_rows);
  const auto widen = [&](int64_t r) -> const float* {
    const int64_t k = std::min<int64_t>(f32_tile_rows, r_end - r);
    for (int64_t i = 0; i < k; ++i) {
      const auto* b = static_cast<const uint16_t*>(w.row(r + i));
      float* out = rows.data() + i * w.n_cols;
      for (int64_t c = 0; c < w.n_cols; ++c) {
        const uint32_t bits = static_cast<uint32_t>(b[c]) << 16;
        std::memcpy(&out[c], &bits, sizeof bits);
      }
    }
    return rows.data();
  };
  rows_f32_tiled(w, widen, a, y, r_begin, r_end, /*dense=*/false);
}

// f32 weights: the tiles below f32_gemm_min_tokens tokens (decode batches: OpenBLAS would pack the
// whole weight matrix for a few tokens), OpenBLAS's sgemm from there (prefill).
constexpr int64_t f32_gemm_min_tokens = 48;

bool f32_dense(const tensor_view& w) {
  return w.row_bytes == static_cast<size_t>(w.n_cols) * sizeof(float);
}

bool f32_uses_gemm(const tensor_view& w, int64_t n_tokens) {
  return w.type == ggml_type::f32 && n_tokens >= f32_gemm_min_tokens && f32_dense(w);
}

void rows_f32(const tensor_view& w, const f32_acts& a, float* y, int64_t r_begin, int64_t r_end) {
  if (r_end <= r_begin) return;
  if (f32_uses_gemm(w, a.n_tokens)) {
    // C[t][r] = sum_c X[t][c] * W[r][c] over this thread's rows.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(a.n_tokens),
                static_cast<int>(r_end - r_begin), static_cast<int>(w.n_cols), 1.0f, a.x,
                static_cast<int>(w.n_cols), static_cast<const float*>(w.row(r_begin)),
                static_cast<int>(w.n_cols), 0.0f, y + r_begin, static_cast<int>(w.n_rows));
    return;
  }
  if (f32_dense(w)) {
    rows_f32_tiled(
        w, [&](int64_t r) { return static_cast<const float*>(w.row(r)); }, a, y, r_begin, r_end,
        /*dense=*/true);
    return;
  }
  for (int64_t r = r_begin; r < r_end; ++r) {
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      y[t * w.n_rows + r] =
          dot_f32(static_cast<const float*>(w.row(r)), a.x + t * w.n_cols, w.n_cols);
    }
  }
}

// Tiles [0, n_tiles) over the pool's threads, handed out in chunks from a shared counter: about
// eight per thread, or (`one_per_thread`) ceil(n_tiles / threads) each. Eight per thread: a thread
// whose vCPU ran faster this time takes more instead of spinning at the join while the other
// finishes a fixed half. One share per thread: each thread streams one contiguous range (its
// kernel's prefetch runs through it); a thread that comes late to the job finds its share taken by
// the other instead of holding the join. A row's result never depends on which thread made it.
template <class F>
void tiles_parallel(thread_pool& pool, int64_t n_tiles, F&& f, bool one_per_thread = false) {
  std::atomic<int64_t> next{0};
  pool.parallel([&](int, int n) {
    const int64_t threads = n;
    const int64_t chunk = one_per_thread ? (n_tiles + threads - 1) / threads
                                         : std::max<int64_t>(1, n_tiles / (8 * threads));
    for (;;) {
      const int64_t b = next.fetch_add(chunk, std::memory_order_relaxed);
      if (b >= n_tiles) break;
      f(b, std::min(n_tiles, b + chunk));
    }
  });
}

bool is_quantized(ggml_type t) {
  return t == ggml_type::q4_0 || t == ggml_type::q4_1 || t == ggml_type::q8_0;
}

// The kernel weights of type `t` go to in this process: ggml for the float types (an error: the
// kernel chosen through WEFT_CPU_MATMUL cannot run).
result<quant_matmul_kernel> kernel_for(ggml_type t) {
  if (!is_quantized(t)) return quant_matmul_kernel::ggml;
  const int k = active_kernel.load(std::memory_order_relaxed);
  if (k >= 0) return static_cast<quant_matmul_kernel>(k);
  return quant_matmul_kernel_in_use();
}

// The amx, vnni and avx2 kernels (amx_matmul.hpp) take groups of 16 rows and the same packed copy.
bool grouped(quant_matmul_kernel k) {
  return k != quant_matmul_kernel::ggml;
}

// Rows per parallel tile: the amx / vnni kernels' groups of 16, else 8.
int64_t tile_unit(quant_matmul_kernel k) {
  return grouped(k) ? amx_rows_per_group : 8;
}

// Decode steps on the grouped kernels (up to 16 tokens: no AMX tiles) give each thread one
// contiguous share of the rows: the kernels prefetch the next groups of their range, and every
// chunk boundary restarts that stream cold. Session 58 (AMX VM, 2 vCPUs, SmolLM2 Q4_1): batch-1
// decode 236-250 -> 279-310 tok/s against chunks of at least four groups (eight per thread),
// batch 4-32 +2-6 %, the avx2 kernel on the same host batch 1 +4-16 %, batch 16 +2-4 %. Prefill
// (the AMX tiles) keeps the fine chunks: one share per thread measured 2-3 % slower there.
bool one_share_per_thread(quant_matmul_kernel k, int64_t n_tokens) {
  constexpr int64_t decode_max_tokens = 16;  // the amx kernel's VNNI path; the tiles above
  return grouped(k) && n_tokens <= decode_max_tokens;
}

// The AMX tile path's copy of the activations (amx_tile_acts) in `scratch`, 64-byte aligned;
// nullptr where the call needs none (the vnni kernel never does).
uint8_t* amx_tiles_for(matmul_scratch& scratch, quant_matmul_kernel k, int64_t n_cols,
                       int64_t n_tokens) {
  const size_t bytes = k == quant_matmul_kernel::amx ? amx_act_tiles_bytes(n_cols, n_tokens) : 0;
  if (bytes == 0) return nullptr;
  if (scratch.amx_tiles.size() < bytes + 64) scratch.amx_tiles.resize(bytes + 64);
  uint8_t* p = scratch.amx_tiles.data();
  return p + (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64;
}

// convert_rows for tokens [t_begin, t_end), then their tile copy where the AMX kernel reads one.
void convert_token_range(ggml_type type, const float* x, uint8_t* a, int64_t t_begin, int64_t t_end,
                         int64_t n_cols, size_t a_row, const scale_table& sc, uint8_t* amx_tiles) {
  convert_rows(type, x, a, t_begin, t_end, n_cols, a_row, sc);
  if (amx_tiles != nullptr) {
    amx_tile_acts(amx_acts{a, a_row, nullptr, nullptr, sc.n_tokens}, type, n_cols, t_begin, t_end,
                  amx_tiles);
  }
}

void rows_dispatch(const tensor_view& w, const f32_acts& fa, const uint8_t* a, size_t a_row,
                   const scale_table& sc, int64_t n_tokens, float* y, int64_t r_begin,
                   int64_t r_end, quant_matmul_kernel k, const uint8_t* amx_tiles) {
  if (grouped(k)) {
    const amx_acts acts{a, a_row, sc.d, sc.s, n_tokens, amx_tiles};
    if (k == quant_matmul_kernel::avx2) {
      amx_avx2_matmul_rows(w, acts, y, r_begin, r_end);
    } else {
      amx_matmul_rows(w, acts, y, r_begin, r_end);
    }
    return;
  }
#if defined(WEFT_QUANT_PACKED4_TILES)
#define WEFT_PACKED(type) , dot4_packed_##type, dot_tile_packed_##type
#elif defined(WEFT_QUANT_PACKED4)
#define WEFT_PACKED(type) , dot4_packed_##type
#else
#define WEFT_PACKED(type)
#endif
  switch (w.type) {
    case ggml_type::q4_1:
      rows_quant<block_q4_1, block_q8_1, dot_q4_1_q8_1, dot4_q4_1_q8_1,
                 dot_tile_q4_1_q8_1 WEFT_PACKED(q4_1_q8_1)>(w, a, a_row, sc, n_tokens, y, r_begin,
                                                            r_end);
      break;
    case ggml_type::q4_0:
      rows_quant<block_q4_0, block_q8_0, dot_q4_0_q8_0, dot4_q4_0_q8_0,
                 dot_tile_q4_0_q8_0 WEFT_PACKED(q4_0_q8_0)>(w, a, a_row, sc, n_tokens, y, r_begin,
                                                            r_end);
      break;
    case ggml_type::q8_0:
      rows_quant<block_q8_0, block_q8_0, dot_q8_0_q8_0, dot4_q8_0_q8_0,
                 dot_tile_q8_0_q8_0 WEFT_PACKED(q8_0_q8_0)>(w, a, a_row, sc, n_tokens, y, r_begin,
                                                            r_end);
      break;
#undef WEFT_PACKED
    case ggml_type::f16:
      rows_f16(w, a, a_row, n_tokens, y, r_begin, r_end);
      break;
    case ggml_type::f32:
      rows_f32(w, fa, y, r_begin, r_end);
      break;
    case ggml_type::bf16:
      rows_bf16(w, fa, y, r_begin, r_end);
      break;
    default:
      break;
  }
}

}  // namespace

namespace {

// The ggml kernel's packed copy (AVX2 builds): every whole group of 4 rows, at the offsets the
// rows have in w.data.
size_t packed4_bytes(const tensor_view& w) {
#ifdef WEFT_QUANT_PACKED4
  if (is_quantized(w.type) && w.n_rows >= 4 && w.n_cols % 32 == 0) {
    return w.mat_bytes * static_cast<size_t>(w.n_mats);
  }
#endif
  (void)w;
  return 0;
}

// -1 before WEFT_CPU_PACK_WEIGHTS is read, else 0 / 1.
std::atomic<int> pack_weights_flag{-1};

}  // namespace

bool pack_weights_enabled() {
  int v = pack_weights_flag.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* env = std::getenv("WEFT_CPU_PACK_WEIGHTS");
    v = env != nullptr && std::string_view{env} == "0" ? 0 : 1;
    pack_weights_flag.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

void set_pack_weights(bool enabled) {
  pack_weights_flag.store(enabled ? 1 : 0, std::memory_order_relaxed);
}

size_t packed_weight_bytes(const tensor_view& w) {
  if (!pack_weights_enabled()) return 0;
  const auto k = kernel_for(w.type);
  if (!k) return 0;
  if (*k == quant_matmul_kernel::avx2) return amx_avx2_packed_bytes(w);
  return grouped(*k) ? amx_packed_bytes(w) : packed4_bytes(w);
}

status pack_weight(thread_pool& pool, const tensor_view& w, void* dst) {
  if (packed_weight_bytes(w) == 0) {
    return {status_code::invalid_argument, "pack_weight: the matmul kernel in use reads " +
                                               std::string{type_name(w.type)} +
                                               " weights as stored"};
  }
#ifdef WEFT_QUANT_PACKED4
  if (!grouped(*kernel_for(w.type))) {
    pool.parallel([&](int i, int n) {
      for (int64_t m = 0; m < w.n_mats; ++m) {
        const tensor_view v = w.matrix(m);
        const auto [b, e] = split_range(v.n_rows / 4, n, i);
        for (int64_t g = b; g < e; ++g) {
          auto* out = static_cast<uint8_t*>(dst) + static_cast<size_t>(m) * w.mat_bytes +
                      static_cast<size_t>(4 * g) * w.row_bytes;
          pack4_rows(w.type, v.row(4 * g), w.row_bytes, w.n_cols / 32, out);
        }
      }
    });
    return {};
  }
#endif
  // Matrices (experts) or, for one matrix, row ranges of whole groups, one per task.
  const bool avx2 = *kernel_for(w.type) == quant_matmul_kernel::avx2;
  pool.parallel([&](int i, int n) {
    for (int64_t m = 0; m < w.n_mats; ++m) {
      tensor_view v = w.matrix(m);
      const int64_t groups = v.n_rows / amx_rows_per_group;
      const auto [b, e] = split_range(groups, n, i);
      if (b >= e) continue;
      auto* out = static_cast<uint8_t*>(dst) + static_cast<size_t>(m) * w.mat_bytes +
                  static_cast<size_t>(b * amx_rows_per_group) * w.row_bytes;
      v.data = v.row(b * amx_rows_per_group);
      v.n_rows = (e - b) * amx_rows_per_group;
      v.mat_bytes = v.row_bytes * static_cast<size_t>(v.n_rows);
      if (avx2) {
        amx_avx2_pack(v, out);
      } else {
        amx_pack(v, out);
      }
    }
  });
  return {};
}

status matmul(thread_pool& pool, matmul_scratch& scratch, const tensor_view& w, const float* x,
              int64_t n_tokens, float* y) {
  if (!matmul_supports(w.type)) {
    return {status_code::unsupported,
            std::string{"matmul: weight type "} + std::string{type_name(w.type)}};
  }
  if (w.type != ggml_type::f32 && w.type != ggml_type::f16 && w.type != ggml_type::bf16 &&
      w.n_cols % 32 != 0) {
    return {status_code::invalid_argument, "matmul: quantized row length not a multiple of 32"};
  }
  if (n_tokens <= 0) return {};
  const auto kernel = kernel_for(w.type);
  if (!kernel) return kernel.error();
  const size_t a_row = act_row_bytes(w.type, w.n_cols);
  if (a_row > 0 && scratch.bytes.size() < a_row * static_cast<size_t>(n_tokens)) {
    scratch.bytes.resize(a_row * static_cast<size_t>(n_tokens));
  }
  uint8_t* a = scratch.bytes.data();
  const scale_table sc = make_scales(scratch, w.type, w.n_cols, n_tokens, grouped(*kernel));
  uint8_t* tiles = amx_tiles_for(scratch, *kernel, w.n_cols, n_tokens);
  if (a_row > 0) {
    if (n_tokens == 1) {
      convert_rows(w.type, x, a, 0, 1, w.n_cols, a_row, sc);
    } else {
      pool.parallel([&](int i, int n) {
        const auto [b, e] = split_range(n_tokens, n, i);
        convert_token_range(w.type, x, a, b, e, w.n_cols, a_row, sc, tiles);
      });
    }
  }
  f32_acts fa{x, n_tokens, w.n_cols};
  if ((w.type == ggml_type::f32 || w.type == ggml_type::bf16) && !f32_uses_gemm(w, n_tokens)) {
    pack_f32_acts(fa, scratch.f32_pairs);
  }
  // Split rows in multiples of 8 (AMX: 16) so tiles never straddle threads.
  const int64_t unit = tile_unit(*kernel);
  const int64_t n_tiles = (w.n_rows + unit - 1) / unit;
  tiles_parallel(
      pool, n_tiles,
      [&](int64_t b, int64_t e) {
        rows_dispatch(w, fa, a, a_row, sc, n_tokens, y, b * unit, std::min(w.n_rows, e * unit),
                      *kernel, tiles);
      },
      one_share_per_thread(*kernel, n_tokens));
  return {};
}

status matmul_multi(thread_pool& pool, matmul_scratch& scratch, std::span<const tensor_view> ws,
                    const float* x, int64_t n_tokens, std::span<float* const> ys) {
  bool same = !ws.empty() && n_tokens > 0;
  for (const auto& w : ws) {
    same = same && w.n_cols == ws[0].n_cols && act_row_bytes(w.type, w.n_cols) > 0 &&
           act_row_bytes(w.type, w.n_cols) == act_row_bytes(ws[0].type, ws[0].n_cols) &&
           (w.type == ggml_type::q4_1) == (ws[0].type == ggml_type::q4_1) && w.n_cols % 32 == 0;
  }
  if (!same) {
    for (size_t i = 0; i < ws.size(); ++i) {
      if (auto st = matmul(pool, scratch, ws[i], x, n_tokens, ys[i]); !st) return st;
    }
    return {};
  }
  for (const auto& w : ws) {
    if (!matmul_supports(w.type)) {
      return {status_code::unsupported,
              std::string{"matmul: weight type "} + std::string{type_name(w.type)}};
    }
  }
  const tensor_view& w0 = ws[0];
  // Quantized weights all take the same kernel (formats agree, checked above).
  const auto kernel = kernel_for(w0.type);
  if (!kernel) return kernel.error();
  const size_t a_row = act_row_bytes(w0.type, w0.n_cols);
  if (scratch.bytes.size() < a_row * static_cast<size_t>(n_tokens))
    scratch.bytes.resize(a_row * static_cast<size_t>(n_tokens));
  uint8_t* a = scratch.bytes.data();
  // One activation format for all weights (checked above); the Q8_1 table also serves Q8_0.
  const scale_table sc = make_scales(scratch, w0.type, w0.n_cols, n_tokens, grouped(*kernel));
  uint8_t* tiles = amx_tiles_for(scratch, *kernel, w0.n_cols, n_tokens);
  if (n_tokens == 1) {
    convert_rows(w0.type, x, a, 0, 1, w0.n_cols, a_row, sc);
  } else {
    pool.parallel([&](int i, int n) {
      const auto [b, e] = split_range(n_tokens, n, i);
      convert_token_range(w0.type, x, a, b, e, w0.n_cols, a_row, sc, tiles);
    });
  }
  // Tiles of 8 rows (AMX: 16) over all weights, in one parallel region.
  const int64_t unit = tile_unit(*kernel);
  std::vector<int64_t> first_tile(ws.size() + 1, 0);
  for (size_t i = 0; i < ws.size(); ++i)
    first_tile[i + 1] = first_tile[i] + (ws[i].n_rows + unit - 1) / unit;
  tiles_parallel(
      pool, first_tile.back(),
      [&](int64_t b, int64_t e) {
        for (size_t k = 0; k < ws.size(); ++k) {
          const int64_t lo = std::max(b, first_tile[k]) - first_tile[k];
          const int64_t hi = std::min(e, first_tile[k + 1]) - first_tile[k];
          if (hi <= lo) continue;
          rows_dispatch(ws[k], f32_acts{x, n_tokens, ws[k].n_cols}, a, a_row, sc, n_tokens, ys[k],
                        lo * unit, std::min(ws[k].n_rows, hi * unit), *kernel, tiles);
        }
      },
      one_share_per_thread(*kernel, n_tokens));
  return {};
}

void matmul_reference(const tensor_view& w, const float* x, int64_t n_tokens, float* y) {
  std::vector<float> wr(static_cast<size_t>(w.n_cols));
  std::vector<float> xr(static_cast<size_t>(w.n_cols));
  std::vector<uint8_t> act(static_cast<size_t>(w.n_cols) * 2 + 64);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xt = x + t * w.n_cols;
    // The activation as the kernel sees it.
    switch (w.type) {
      case ggml_type::q8_0:
      case ggml_type::q4_0:
        quantize_act_q8_0_portable(xt, reinterpret_cast<block_q8_0*>(act.data()), w.n_cols);
        (void)dequantize_row(ggml_type::q8_0, act.data(), xr.data(), w.n_cols);
        break;
      case ggml_type::q4_1:
        quantize_act_q8_1_portable(xt, reinterpret_cast<block_q8_1*>(act.data()), w.n_cols);
        (void)dequantize_row(ggml_type::q8_1, act.data(), xr.data(), w.n_cols);
        break;
      case ggml_type::f16:
        for (int64_t c = 0; c < w.n_cols; ++c) xr[c] = fp16_to_fp32(fp32_to_fp16(xt[c]));
        break;
      default:
        std::copy(xt, xt + w.n_cols, xr.begin());
        break;
    }
    if (w.type == ggml_type::q4_1) {
      // Q4_1 x Q8_1 uses the block's stored fp16 s = d * sum(q) for the offset term.
      const auto* a = reinterpret_cast<const block_q8_1*>(act.data());
      for (int64_t r = 0; r < w.n_rows; ++r) {
        const auto* q = static_cast<const block_q4_1*>(w.row(r));
        double s = 0.0;
        for (int64_t b = 0; b < w.n_cols / 32; ++b) {
          int64_t isum = 0;
          for (int j = 0; j < 32; ++j) {
            const int v = j < 16 ? (q[b].qs[j] & 0x0F) : (q[b].qs[j - 16] >> 4);
            isum += v * a[b].qs[j];
          }
          s += static_cast<double>(fp16_to_fp32(q[b].d)) * fp16_to_fp32(a[b].d) *
                   static_cast<double>(isum) +
               static_cast<double>(fp16_to_fp32(q[b].m)) * fp16_to_fp32(a[b].s);
        }
        y[t * w.n_rows + r] = static_cast<float>(s);
      }
      continue;
    }
    for (int64_t r = 0; r < w.n_rows; ++r) {
      (void)dequantize_row(w.type, w.row(r), wr.data(), w.n_cols);
      double s = 0.0;
      for (int64_t c = 0; c < w.n_cols; ++c) s += static_cast<double>(wr[c]) * xr[c];
      y[t * w.n_rows + r] = static_cast<float>(s);
    }
  }
}

}  // namespace weft::gpu::cpu
