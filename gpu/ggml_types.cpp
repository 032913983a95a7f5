#include "gpu/ggml_types.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>

namespace weft::gpu {

namespace {

// Block sizes and block byte sizes of every ggml type that can appear in a GGUF file. Only the ones
// flagged `true` have reference routines in weft; the others are known so that a file using them
// gets a precise "unsupported type q4_k" error instead of "unknown type 12".
constexpr std::array<ggml_type_traits, 32> type_table{{
    {ggml_type::f32, "f32", 1, 4, true},
    {ggml_type::f16, "f16", 1, 2, true},
    {ggml_type::q4_0, "q4_0", 32, 18, true},
    {ggml_type::q4_1, "q4_1", 32, 20, true},
    {ggml_type::q5_0, "q5_0", 32, 22, false},
    {ggml_type::q5_1, "q5_1", 32, 24, false},
    {ggml_type::q8_0, "q8_0", 32, 34, true},
    {ggml_type::q8_1, "q8_1", 32, 36, true},
    {ggml_type::q2_k, "q2_k", 256, 84, false},
    {ggml_type::q3_k, "q3_k", 256, 110, false},
    {ggml_type::q4_k, "q4_k", 256, 144, false},
    {ggml_type::q5_k, "q5_k", 256, 176, false},
    {ggml_type::q6_k, "q6_k", 256, 210, false},
    {ggml_type::q8_k, "q8_k", 256, 292, false},
    {ggml_type::iq2_xxs, "iq2_xxs", 256, 66, false},
    {ggml_type::iq2_xs, "iq2_xs", 256, 74, false},
    {ggml_type::iq3_xxs, "iq3_xxs", 256, 98, false},
    {ggml_type::iq1_s, "iq1_s", 256, 50, false},
    {ggml_type::iq4_nl, "iq4_nl", 32, 18, false},
    {ggml_type::iq3_s, "iq3_s", 256, 110, false},
    {ggml_type::iq2_s, "iq2_s", 256, 82, false},
    {ggml_type::iq4_xs, "iq4_xs", 256, 136, false},
    {ggml_type::i8, "i8", 1, 1, false},
    {ggml_type::i16, "i16", 1, 2, false},
    {ggml_type::i32, "i32", 1, 4, false},
    {ggml_type::i64, "i64", 1, 8, false},
    {ggml_type::f64, "f64", 1, 8, false},
    {ggml_type::iq1_m, "iq1_m", 256, 56, false},
    {ggml_type::bf16, "bf16", 1, 2, true},
    {ggml_type::tq1_0, "tq1_0", 256, 54, false},
    {ggml_type::tq2_0, "tq2_0", 256, 66, false},
    {ggml_type::mxfp4, "mxfp4", 32, 17, false},
}};

// -- per-type reference routines -----------------------------------------------------------------

void dequantize_q8_0(const block_q8_0* blocks, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float d = fp16_to_fp32(blocks[b].d);
    for (int64_t j = 0; j < qk32; ++j) dst[b * qk32 + j] = d * static_cast<float>(blocks[b].qs[j]);
  }
}

void dequantize_q8_1(const block_q8_1* blocks, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float d = fp16_to_fp32(blocks[b].d);
    for (int64_t j = 0; j < qk32; ++j) dst[b * qk32 + j] = d * static_cast<float>(blocks[b].qs[j]);
  }
}

void dequantize_q4_0(const block_q4_0* blocks, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float d = fp16_to_fp32(blocks[b].d);
    float* out = dst + b * qk32;
    for (int64_t j = 0; j < qk32 / 2; ++j) {
      out[j] = d * static_cast<float>((blocks[b].qs[j] & 0x0f) - 8);
      out[j + qk32 / 2] = d * static_cast<float>((blocks[b].qs[j] >> 4) - 8);
    }
  }
}

void dequantize_q4_1(const block_q4_1* blocks, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float d = fp16_to_fp32(blocks[b].d);
    const float m = fp16_to_fp32(blocks[b].m);
    float* out = dst + b * qk32;
    for (int64_t j = 0; j < qk32 / 2; ++j) {
      out[j] = d * static_cast<float>(blocks[b].qs[j] & 0x0f) + m;
      out[j + qk32 / 2] = d * static_cast<float>(blocks[b].qs[j] >> 4) + m;
    }
  }
}

// Symmetric 8-bit: the largest magnitude maps to +-127. Returns d (as stored, fp32 before rounding
// to fp16 is used for the codes so that the codes are the best fit for the exact scale).
float quantize_symmetric_8(const float* x, int8_t* qs) {
  float amax = 0.0f;
  for (int64_t j = 0; j < qk32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int64_t j = 0; j < qk32; ++j) {
    const float v = std::nearbyint(x[j] * id);
    qs[j] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
  }
  return d;
}

void quantize_q8_0(const float* src, block_q8_0* blocks, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    blocks[b].d = fp32_to_fp16(quantize_symmetric_8(src + b * qk32, blocks[b].qs));
  }
}

void quantize_q8_1(const float* src, block_q8_1* blocks, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float d = quantize_symmetric_8(src + b * qk32, blocks[b].qs);
    int sum = 0;
    for (int64_t j = 0; j < qk32; ++j) sum += blocks[b].qs[j];
    blocks[b].d = fp32_to_fp16(d);
    blocks[b].s = fp32_to_fp16(d * static_cast<float>(sum));
  }
}

void quantize_q4_0(const float* src, block_q4_0* blocks, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float* x = src + b * qk32;
    // The value of largest magnitude (with its sign) maps to code 0, i.e. -8 * d: this uses the
    // asymmetric end of the [-8, 7] range for the extreme value.
    float extreme = 0.0f;
    for (int64_t j = 0; j < qk32; ++j) {
      if (std::fabs(x[j]) > std::fabs(extreme)) extreme = x[j];
    }
    const float d = extreme / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    blocks[b].d = fp32_to_fp16(d);
    for (int64_t j = 0; j < qk32 / 2; ++j) {
      const auto code = [&](float v) {
        return static_cast<uint8_t>(std::clamp(std::floor(v * id + 8.5f), 0.0f, 15.0f));
      };
      blocks[b].qs[j] = static_cast<uint8_t>(code(x[j]) | (code(x[j + qk32 / 2]) << 4));
    }
  }
}

void quantize_q4_1(const float* src, block_q4_1* blocks, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float* x = src + b * qk32;
    const auto [lo, hi] = std::minmax_element(x, x + qk32);
    const float min = *lo;
    const float d = (*hi - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    blocks[b].d = fp32_to_fp16(d);
    blocks[b].m = fp32_to_fp16(min);
    for (int64_t j = 0; j < qk32 / 2; ++j) {
      const auto code = [&](float v) {
        return static_cast<uint8_t>(std::clamp(std::floor((v - min) * id + 0.5f), 0.0f, 15.0f));
      };
      blocks[b].qs[j] = static_cast<uint8_t>(code(x[j]) | (code(x[j + qk32 / 2]) << 4));
    }
  }
}

}  // namespace

std::optional<ggml_type_traits> find_type_traits(uint32_t id) {
  for (const auto& t : type_table) {
    if (static_cast<uint32_t>(t.type) == id) return t;
  }
  return std::nullopt;
}

ggml_type_traits type_traits(ggml_type type) {
  // Every enumerator is in the table (checked by a unit test), so this cannot fall through for a
  // value produced by the enum; an out-of-range cast gets a zero-sized, unsupported entry.
  if (auto t = find_type_traits(static_cast<uint32_t>(type))) return *t;
  return ggml_type_traits{type, "unknown", 1, 0, false};
}

std::string_view type_name(ggml_type type) {
  return type_traits(type).name;
}

std::optional<ggml_type> parse_type_name(std::string_view name) {
  for (const auto& t : type_table) {
    if (t.name.size() != name.size()) continue;
    bool equal = true;
    for (size_t i = 0; i < name.size(); ++i) {
      if (std::tolower(static_cast<unsigned char>(name[i])) != t.name[i]) {
        equal = false;
        break;
      }
    }
    if (equal) return t.type;
  }
  return std::nullopt;
}

std::optional<size_t> row_size_bytes(ggml_type type, int64_t n_elements) {
  const auto t = type_traits(type);
  if (n_elements < 0 || t.type_size == 0 || n_elements % t.block_size != 0) return std::nullopt;
  const auto n_blocks = static_cast<uint64_t>(n_elements / t.block_size);
  if (n_blocks > std::numeric_limits<size_t>::max() / t.type_size) return std::nullopt;
  return static_cast<size_t>(n_blocks * t.type_size);
}

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

uint16_t fp32_to_fp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (abs >= 0x38800000u) {                                              // normal half
    const uint32_t exp = (abs >> 23) - 127 + 15;
    const uint32_t mant = abs & 0x7fffffu;
    uint32_t h = (exp << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry rolls into the exponent
    return static_cast<uint16_t>(sign | h);
  }
  if (abs <= 0x33000000u) return sign;  // <= 2^-25: rounds (to even) to zero
  // Half subnormal: units of 2^-24.
  const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const int shift = 126 - static_cast<int>(abs >> 23);  // 14..24
  uint32_t h = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_fp32(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

uint16_t fp32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

row_status dequantize_row(ggml_type type, const void* src, float* dst, int64_t n) {
  const auto traits = type_traits(type);
  if (!traits.weft_supported) return row_status::unsupported_type;
  if (n < 0 || n % traits.block_size != 0) return row_status::bad_length;
  const int64_t n_blocks = n / traits.block_size;
  switch (type) {
    case ggml_type::f32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return row_status::ok;
    case ggml_type::f16:
    case ggml_type::bf16: {
      const auto* in = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, in + 2 * i, 2);
        dst[i] = type == ggml_type::f16 ? fp16_to_fp32(bits) : bf16_to_fp32(bits);
      }
      return row_status::ok;
    }
    case ggml_type::q8_0:
      dequantize_q8_0(static_cast<const block_q8_0*>(src), dst, n_blocks);
      return row_status::ok;
    case ggml_type::q8_1:
      dequantize_q8_1(static_cast<const block_q8_1*>(src), dst, n_blocks);
      return row_status::ok;
    case ggml_type::q4_0:
      dequantize_q4_0(static_cast<const block_q4_0*>(src), dst, n_blocks);
      return row_status::ok;
    case ggml_type::q4_1:
      dequantize_q4_1(static_cast<const block_q4_1*>(src), dst, n_blocks);
      return row_status::ok;
    default:
      return row_status::unsupported_type;
  }
}

row_status quantize_row(ggml_type type, const float* src, void* dst, int64_t n) {
  const auto traits = type_traits(type);
  if (!traits.weft_supported) return row_status::unsupported_type;
  if (n < 0 || n % traits.block_size != 0) return row_status::bad_length;
  const int64_t n_blocks = n / traits.block_size;
  switch (type) {
    case ggml_type::f32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return row_status::ok;
    case ggml_type::f16:
    case ggml_type::bf16: {
      auto* out = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t bits = type == ggml_type::f16 ? fp32_to_fp16(src[i]) : fp32_to_bf16(src[i]);
        std::memcpy(out + 2 * i, &bits, 2);
      }
      return row_status::ok;
    }
    case ggml_type::q8_0:
      quantize_q8_0(src, static_cast<block_q8_0*>(dst), n_blocks);
      return row_status::ok;
    case ggml_type::q8_1:
      quantize_q8_1(src, static_cast<block_q8_1*>(dst), n_blocks);
      return row_status::ok;
    case ggml_type::q4_0:
      quantize_q4_0(src, static_cast<block_q4_0*>(dst), n_blocks);
      return row_status::ok;
    case ggml_type::q4_1:
      quantize_q4_1(src, static_cast<block_q4_1*>(dst), n_blocks);
      return row_status::ok;
    default:
      return row_status::unsupported_type;
  }
}

}  // namespace weft::gpu
