#pragma once
/// Quantized matrix products on Intel AMX (Sapphire Rapids and later): the `amx` matmul kernel.
///
/// One TDPBSSD per 32-element block multiplies 16 weight rows by up to 16 tokens' int8 activations
/// (Q4_0 / Q4_1 / Q8_0 weights unpacked to int8, activations quantized to Q8_0 / Q8_1 as for the
/// default kernel), giving each (row, token) pair the block's exact integer sum. The float part
/// runs per block in block order, 16 rows in one vector:
///
///     acc = fma(d_w * d_a, float(isum), acc)      (then acc = fma(m_w, s_a, acc) for Q4_1)
///
/// so a token's result depends on nothing else in the batch: the same bits for 1 token or 512, on
/// one thread or many. They are not ggml's bits — llama.cpp's x86 kernels sum each block in 8 lanes
/// of 4 products (quant_dot.hpp), which no AMX instruction can reproduce at speed; the error
/// against the exact product is of the same size (tests/unit/gpu/amx_matmul_test.cpp). This is why
/// the oracle pins `WEFT_CPU_MATMUL=ggml` (docs/engine.md "AMX matmuls").

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpu/tensor_view.hpp"

namespace weft::gpu::cpu {

/// Weight rows per AMX call.
inline constexpr int64_t amx_rows_per_group = 16;

/// Whether this build has the AMX kernel (compiled with AMX-INT8) and this process may use the
/// tile registers (CPU support and the kernel's permission, asked for once). Thread-safe.
bool amx_available();
/// Why amx_available() is false ("" when it is true).
const char* amx_unavailable_reason();
/// Whether this build has the kernel and the CPU the AVX-512 VNNI half of it (F, DQ, BW, VL and
/// VNNI): the `vnni` matmul kernel — the same packing, integer sums and bits as with AMX, every
/// batch on VNNI, more than 16 tokens 16 at a time (no tile copy of the activations). Thread-safe.
bool amx_vnni_available();
/// Why amx_vnni_available() is false ("" when it is true).
const char* amx_vnni_unavailable_reason();

/// Bytes of w's packed copy (amx_pack), 0 where the kernel reads `w` as stored: not Q4_0 / Q4_1 /
/// Q8_0, fewer than 16 rows, or no AMX here.
size_t amx_packed_bytes(const tensor_view& w);
/// Writes w's packed copy to dst (amx_packed_bytes(w) bytes), to be set as w.packed: each whole
/// group of 16 rows in the bytes those rows take in w.data, per 32-element block the 16 rows'
/// quants in AMX's VNNI order (Q4: 256 bytes of nibbles, Q8_0: 512 of int8), then their fp16 d
/// (and m, Q4_1). The kernel then streams one contiguous run per group instead of 16 rows a
/// block apart; rows after the last whole group it reads from w.data. Same results either way.
void amx_pack(const tensor_view& w, void* dst);

/// The quantized activations one AMX call reads: `n_tokens` rows `row_bytes` apart of Q8_0 blocks
/// (Q4_0 / Q8_0 weights) or Q8_1 blocks (Q4_1), and their scales as floats, block-major:
/// d[b * n_tokens + t] (and s likewise, Q8_1 only).
struct amx_acts {
  const uint8_t* rows = nullptr;
  size_t row_bytes = 0;
  const float* d = nullptr;
  const float* s = nullptr;
  int64_t n_tokens = 0;
  /// The same quants in the tiles' layout (amx_tile_acts), which the tile path reads for more than
  /// 16 tokens (amx_act_tiles_bytes(n_cols, n_tokens) > 0); nullptr: such batches run on VNNI,
  /// 16 tokens at a time (the `vnni` kernel), with the same results.
  const uint8_t* tiles = nullptr;
};

/// Bytes of the tile copy of n_tokens rows of n_cols activations (amx_tile_acts), 0 where the
/// kernel does not use one: batches of up to 16 tokens run on AVX-512 VNNI from the rows.
size_t amx_act_tiles_bytes(int64_t n_cols, int64_t n_tokens);
/// Copies the quants of tokens [t_begin, t_end) of `a` (rows of Q8_1 blocks for Q4_1 weights,
/// else Q8_0) to `tiles` (amx_act_tiles_bytes, 64-byte aligned): per tile of 16 tokens and per
/// 32-element block 512 contiguous bytes, token t's quants at (t % 16) * 32 — one aligned tile
/// load per block instead of 16 rows that straddle cache lines; the range ending at a.n_tokens
/// also zeroes the last tile's rows past it. Token ranges may be copied by different threads.
void amx_tile_acts(const amx_acts& a, ggml_type w_type, int64_t n_cols, int64_t t_begin,
                   int64_t t_end, uint8_t* tiles);

/// y[t * w.n_rows + r] for rows [r_begin, r_end) (r_begin a multiple of amx_rows_per_group) of
/// Q4_0 / Q4_1 / Q8_0 weights `w` and every token of `a`. Call only when amx_vnni_available(),
/// and with `a.tiles` only when amx_available().
void amx_matmul_rows(const tensor_view& w, const amx_acts& a, float* y, int64_t r_begin,
                     int64_t r_end);

/// The `avx2` matmul kernel (amx_matmul_avx2.cpp): the amx kernel's packing, integer sums and
/// bits on AVX2 (CPUs without AVX-512 VNNI; the package preset's x86-64-v3), 8 rows a register.
/// Whether this build has it (AVX2, FMA and F16C at compile time).
bool amx_avx2_available();
/// amx_packed_bytes for the avx2 kernel (the same layout, written by amx_avx2_pack).
size_t amx_avx2_packed_bytes(const tensor_view& w);
void amx_avx2_pack(const tensor_view& w, void* dst);
/// amx_matmul_rows on AVX2 (the same results; `a.tiles` is not read). Call only when
/// amx_avx2_available().
void amx_avx2_matmul_rows(const tensor_view& w, const amx_acts& a, float* y, int64_t r_begin,
                          int64_t r_end);
/// sums[t * (n_cols / 32) + b]: the sum of token t's activation block b's 32 int8 quants (Q8_1
/// blocks for Q4_1 weights, else Q8_0), for the offset of Q4_0 / Q8_0 weights' unsigned form.
void amx_act_block_sums(const amx_acts& a, ggml_type w_type, int64_t n_cols,
                        std::vector<int32_t>& sums);

/// Where a weight type's quants sit in its 32-element block, the offset its unsigned (u8) form
/// carries, and the bytes of a packed block's quants (16 rows); amx_matmul.cpp (amx, vnni) and
/// amx_matmul_avx2.cpp (avx2) read their packed copies through it.
struct amx_weight_layout {
  size_t block;
  size_t qs;
  int32_t offset;
  size_t packed_qs;
};

constexpr amx_weight_layout amx_layout_of(ggml_type t) {
  switch (t) {
    case ggml_type::q4_0:
      return {sizeof(block_q4_0), offsetof(block_q4_0, qs), 8, 256};
    case ggml_type::q4_1:
      return {sizeof(block_q4_1), offsetof(block_q4_1, qs), 0, 256};
    default:
      return {sizeof(block_q8_0), offsetof(block_q8_0, qs), 128, 512};
  }
}

}  // namespace weft::gpu::cpu
