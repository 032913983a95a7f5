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

/// Which implementation the dispatching functions use in this build ("avx2" or "portable").
const char* quant_kernel_path();

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
float dot_q4_0_q8_0_portable(const block_q4_0* w, const block_q8_0* a, int64_t n_blocks);
float dot_q4_1_q8_1_portable(const block_q4_1* w, const block_q8_1* a, int64_t n_blocks);
float dot_q8_0_q8_0_portable(const block_q8_0* w, const block_q8_0* a, int64_t n_blocks);

// -- half precision -----------------------------------------------------------------------------

/// Dot product of two fp16 vectors with float accumulation: 4 x 16 lanes per 64-element step
/// (llama.cpp's AVX-512 layout), a fixed reduction tree, the tail summed in double.
float dot_f16(const uint16_t* x, const uint16_t* y, int64_t n);
/// Dot product of two fp16 vectors (n % 16 == 0) in 16 lanes, element i in lane i % 16 with one FMA
/// chain per lane, then the 512-bit reduction tree (llama.cpp's tinyBLAS layout for n >= 2
/// columns).
float dot_f16_lanes16(const uint16_t* x, const uint16_t* y, int64_t n);
/// Dot product of fp16 weights and f32 activations (activations rounded to fp16 first, as ggml).
float dot_f16_f32(const uint16_t* w, const float* x, int64_t n);
/// Plain f32 dot product (8 lanes, FMA, fixed reduction order).
float dot_f32(const float* x, const float* y, int64_t n);

/// Fast fp16 <-> f32 conversions (F16C when available; identical results to ggml_types.hpp).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
void float_to_half_row(const float* x, uint16_t* y, int64_t n);
void half_to_float_row(const uint16_t* x, float* y, int64_t n);

}  // namespace weft::gpu::cpu
