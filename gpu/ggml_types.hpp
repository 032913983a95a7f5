#pragma once
/// Tensor element types as stored in GGUF files (the ggml type ids), their block layouts, half /
/// bfloat16 conversions and the reference (scalar) quantize / dequantize routines.
///
/// The reference routines are the oracle for every optimised kernel: they favour clarity over
/// speed. All functions here are pure and thread-safe.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace weft::gpu {

/// Element type of a tensor. The numeric values are the type ids written in GGUF files.
enum class ggml_type : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  iq2_xxs = 16,
  iq2_xs = 17,
  iq3_xxs = 18,
  iq1_s = 19,
  iq4_nl = 20,
  iq3_s = 21,
  iq2_s = 22,
  iq4_xs = 23,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  iq1_m = 29,
  bf16 = 30,
  tq1_0 = 34,
  tq2_0 = 35,
  mxfp4 = 39,
};

/// Static facts about one ggml type.
struct ggml_type_traits {
  ggml_type type;
  std::string_view name;  ///< Lower-case ggml name, e.g. "q4_1".
  int64_t block_size;     ///< Elements per block (1 for plain types).
  size_t type_size;       ///< Bytes per block.
  bool weft_supported;    ///< weft can dequantize it (and kernels exist for it).
};

/// Traits of the type with GGUF id `id`, or nullopt when the id is not a known ggml type.
std::optional<ggml_type_traits> find_type_traits(uint32_t id);

/// Traits of a known type.
ggml_type_traits type_traits(ggml_type type);

/// Lower-case name of the type ("f32", "q4_1", ...); "unknown(<id>)" is not produced here: use
/// find_type_traits for untrusted ids.
std::string_view type_name(ggml_type type);

/// Parses a lower-case or upper-case type name ("Q4_1", "f16"); nullopt when unknown.
std::optional<ggml_type> parse_type_name(std::string_view name);

/// Bytes taken by `n_elements` elements of `type` (a row); nullopt when n is not a multiple of the
/// block size or the size overflows.
std::optional<size_t> row_size_bytes(ggml_type type, int64_t n_elements);

// -- block layouts ------------------------------------------------------------------------------

/// Elements per block of the 32-element quantized formats.
inline constexpr int64_t qk32 = 32;

/// Q8_0: y = d * q, 32 signed bytes per block.
struct block_q8_0 {
  uint16_t d;  ///< fp16 scale.
  int8_t qs[qk32];
};
static_assert(sizeof(block_q8_0) == 34);

/// Q8_1 (activations): like Q8_0 plus s = d * sum(q), used by dot products with Q4_1.
struct block_q8_1 {
  uint16_t d;  ///< fp16 scale.
  uint16_t s;  ///< fp16 d * sum(qs).
  int8_t qs[qk32];
};
static_assert(sizeof(block_q8_1) == 36);

/// Q4_0: y = d * (q - 8); byte j holds element j (low nibble) and element j + 16 (high nibble).
struct block_q4_0 {
  uint16_t d;
  uint8_t qs[qk32 / 2];
};
static_assert(sizeof(block_q4_0) == 18);

/// Q4_1: y = d * q + m; byte j holds element j (low nibble) and element j + 16 (high nibble).
struct block_q4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[qk32 / 2];
};
static_assert(sizeof(block_q4_1) == 20);

// -- scalar conversions -------------------------------------------------------------------------

/// IEEE half (binary16 bits) to float; exact.
float fp16_to_fp32(uint16_t h);

/// Float to IEEE half bits, round to nearest even; overflow gives infinity, NaN stays NaN.
uint16_t fp32_to_fp16(float f);

/// bfloat16 bits to float; exact.
float bf16_to_fp32(uint16_t b);

/// Float to bfloat16 bits, round to nearest even; NaN stays (quiet) NaN.
uint16_t fp32_to_bf16(float f);

// -- rows ---------------------------------------------------------------------------------------

/// Outcome of a row conversion.
enum class row_status {
  ok,
  unsupported_type,  ///< weft has no reference routine for this type.
  bad_length,        ///< n is negative or not a multiple of the block size.
};

/// Converts `n` elements of `type` at `src` to floats in `dst` (reference implementation).
/// Supported: f32, f16, bf16, q8_0, q8_1, q4_0, q4_1.
[[nodiscard]] row_status dequantize_row(ggml_type type, const void* src, float* dst, int64_t n);

/// Converts `n` floats to `type` at `dst` (row_size_bytes(type, n) bytes; reference
/// implementation). Supported: f32, f16, bf16, q8_0, q8_1, q4_0, q4_1.
[[nodiscard]] row_status quantize_row(ggml_type type, const float* src, void* dst, int64_t n);

}  // namespace weft::gpu
