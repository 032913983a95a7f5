#pragma once
/// Quantized dot products of the CPU backend, computed the way llama.cpp's x86 kernels compute
/// them.
///
/// Activations are quantized per 32-element block to Q8_0 (for Q8_0/Q4_0 weights) or Q8_1 (for
/// Q4_1 weights) with id = 127 / amax and round-half-even; a block's integer dot product is formed
/// per group of 4 elements (8 lanes), scaled by d_w * d_a and accumulated with FMA in 8 float
/// lanes, then the lanes are summed in a fixed tree order. The portable (`*_portable`) and AVX2
/// variants give bit-identical results; the dispatching functions pick AVX2 when compiled in. All
/// functions are pure and thread-safe.

#include <cstdint>

#include "gpu/ggml_types.hpp"

namespace weft::gpu::cpu {

/// Which implementation the dispatching functions use in this build ("avx512-vnni", "avx2+vnni",
/// "avx2" or "portable").
const char* quant_kernel_path();

/// The vector width of the ggml CPU build whose reduction orders weft reproduces. llama.cpp built
/// for the host (-march=native, its default) sums fp16 dot products, softmax rows and the
/// attention GEMMs in 16 lanes on AVX-512 machines and in 8 lanes on AVX2 ones, and evaluates
/// `exp` with a different final step; the two give different roundings. weft follows the host:
/// `avx512` when the CPU has AVX-512F and AVX-512DQ, else `avx2` (also the choice on non-x86
/// hosts). `WEFT_GGML_SIMD=avx2|avx512` overrides the detection (read once, at first use).
enum class ggml_simd { avx2, avx512 };
ggml_simd ggml_simd_layout();
/// Sets the layout for the whole process (tests exercise both on one machine).
void set_ggml_simd_layout(ggml_simd layout);
const char* ggml_simd_name(ggml_simd layout);
/// Lanes of the layout (8 or 16).
inline int ggml_simd_lanes(ggml_simd layout) {
  return layout == ggml_simd::avx512 ? 16 : 8;
}

// -- activation quantization --------------------------------------------------------------------

/// Quantizes `n` floats (n % 32 == 0) to Q8_0 blocks, as llama.cpp quantizes activations.
void quantize_act_q8_0(const float* x, block_q8_0* y, int64_t n);
/// Quantizes `n` floats (n % 32 == 0) to Q8_1 blocks (s = d * sum(q)).
void quantize_act_q8_1(const float* x, block_q8_1* y, int64_t n);
void quantize_act_q8_0_portable(const float* x, block_q8_0* y, int64_t n);
void quantize_act_q8_1_portable(const float* x, block_q8_1* y, int64_t n);

// -- dot products over `n_blocks` blocks of 32 ---------------------------------------------------

float dot_q4_0_q8_0(const block_q4_0* w, const block_q8_0* a, int64_t n_blocks);
float dot_q4_1_q8_1(const block_q4_1* w, const block_q8_1* a, int64_t n_blocks);
float dot_q8_0_q8_0(const block_q8_0* w, const block_q8_0* a, int64_t n_blocks);
/// Four rows at once (rows `row_bytes` apart), each with exactly the numerics of the one-row
/// function: independent accumulators give the CPU four FMA chains to overlap.
void dot4_q4_0_q8_0(const void* w, size_t row_bytes, const block_q8_0* a, int64_t n_blocks,
                    float* out);
void dot4_q4_1_q8_1(const void* w, size_t row_bytes, const block_q8_1* a, int64_t n_blocks,
                    float* out);
void dot4_q8_0_q8_0(const void* w, size_t row_bytes, const block_q8_0* a, int64_t n_blocks,
                    float* out);
/// The fp16 scales of a tile's activation blocks, converted to float once per matmul and stored
/// block-major: d[b * stride + j] is block b's scale of the tile's token j (s likewise, Q8_1 only).
struct act_scales {
  const float* d = nullptr;
  const float* s = nullptr;
  int64_t stride = 0;
};
/// Writes token `t`'s column of the block-major scales (d, and s when non-null) of one activation
/// row of `n_blocks` Q8_0 / Q8_1 blocks.
void act_scales_column(const block_q8_0* a, int64_t n_blocks, float* d, int64_t stride);
void act_scales_column(const block_q8_1* a, int64_t n_blocks, float* d, float* s, int64_t stride);
/// The shape of one tile call in this build: with AVX-512 VNNI, 4 weight rows x up to 8 tokens
/// (two rows side by side in the 16 lanes of a register); otherwise 2 rows x up to 4 tokens.
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(__AVX512F__) && \
    defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
inline constexpr int tile_rows = 4;
inline constexpr int tile_tokens = 8;
/// This build's tiles read weights packed 4 rows to a group too (dot_tile_packed_*, below).
#define WEFT_QUANT_PACKED4_TILES 1
#else
inline constexpr int tile_rows = 2;
inline constexpr int tile_tokens = 4;
#endif
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/// This build has the kernels that read weights packed 4 rows to a group (below): batch-1 decode's
/// dot4_packed_* in every AVX2 build, the multi-token tiles too with AVX-512 VNNI.
#define WEFT_QUANT_PACKED4 1
#endif
/// `tile_rows` weight rows (`row_bytes` apart) times `n_tok` (1..tile_tokens) activation rows:
/// out[j][i] = dot of row i with a[j]. Each weight block is unpacked once for all tokens (batched
/// decode and prefill); every result is bit-identical to the one-row function's. `scales` are the
/// activations' scales (see act_scales; the portable build reads the blocks' own and ignores them);
/// the `s` table must be readable `tile_tokens` floats past its last entry.
void dot_tile_q4_0_q8_0(const void* w, size_t row_bytes, const block_q8_0* const* a, int n_tok,
                        int64_t n_blocks, float* const* out, const act_scales& scales);
void dot_tile_q4_1_q8_1(const void* w, size_t row_bytes, const block_q8_1* const* a, int n_tok,
                        int64_t n_blocks, float* const* out, const act_scales& scales);
void dot_tile_q8_0_q8_0(const void* w, size_t row_bytes, const block_q8_0* const* a, int n_tok,
                        int64_t n_blocks, float* const* out, const act_scales& scales);

#ifdef WEFT_QUANT_PACKED4
// -- weights packed 4 rows to a group (AVX2 builds) -----------------------------------------------

/// Packs rows 0-3 of Q4_0 / Q4_1 / Q8_0 weights (`row_bytes` apart, `n_blocks` blocks each) into
/// `dst`, 4 * row_bytes bytes — the bytes the four rows take as stored: per block the four rows'
/// quants (Q4: 4 x 16 bytes of nibbles; Q8_0: 4 x 32 bytes, offset by 128 into unsigned range),
/// then their four fp16 d, then (Q4_1) their four fp16 m. The kernels below read a block of all
/// four rows with one or two loads, their lanes side by side, instead of unpacking and pairing
/// rows a block apart.
void pack4_rows(ggml_type type, const void* w, size_t row_bytes, int64_t n_blocks, void* dst);
/// dot4_* (one token) from a packed group `g`: bit-identical to them.
void dot4_packed_q4_0_q8_0(const void* g, const block_q8_0* a, int64_t n_blocks, float* out);
void dot4_packed_q4_1_q8_1(const void* g, const block_q8_1* a, int64_t n_blocks, float* out);
void dot4_packed_q8_0_q8_0(const void* g, const block_q8_0* a, int64_t n_blocks, float* out);
#endif
#ifdef WEFT_QUANT_PACKED4_TILES
/// dot_tile_* (1..tile_tokens tokens) from a packed group `g`: bit-identical to them.
void dot_tile_packed_q4_0_q8_0(const void* g, const block_q8_0* const* a, int n_tok,
                               int64_t n_blocks, float* const* out, const act_scales& scales);
void dot_tile_packed_q4_1_q8_1(const void* g, const block_q8_1* const* a, int n_tok,
                               int64_t n_blocks, float* const* out, const act_scales& scales);
void dot_tile_packed_q8_0_q8_0(const void* g, const block_q8_0* const* a, int n_tok,
                               int64_t n_blocks, float* const* out, const act_scales& scales);
#endif

float dot_q4_0_q8_0_portable(const block_q4_0* w, const block_q8_0* a, int64_t n_blocks);
float dot_q4_1_q8_1_portable(const block_q4_1* w, const block_q8_1* a, int64_t n_blocks);
float dot_q8_0_q8_0_portable(const block_q8_0* w, const block_q8_0* a, int64_t n_blocks);

/// Fast fp16 <-> f32 conversions (F16C when available; identical results to ggml_types.hpp).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
void float_to_half_row(const float* x, uint16_t* y, int64_t n);
void half_to_float_row(const uint16_t* x, float* y, int64_t n);

}  // namespace weft::gpu::cpu
