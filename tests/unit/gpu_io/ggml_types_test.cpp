#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gpu/ggml_types.hpp"

namespace weft::gpu {
namespace {

TEST(ggml_types, ids_and_sizes_match_the_gguf_format) {
  EXPECT_EQ(static_cast<uint32_t>(ggml_type::f32), 0u);
  EXPECT_EQ(static_cast<uint32_t>(ggml_type::q4_1), 3u);
  EXPECT_EQ(static_cast<uint32_t>(ggml_type::q8_0), 8u);
  EXPECT_EQ(static_cast<uint32_t>(ggml_type::bf16), 30u);
  EXPECT_EQ(type_traits(ggml_type::q4_0).type_size, 18u);
  EXPECT_EQ(type_traits(ggml_type::q4_1).type_size, 20u);
  EXPECT_EQ(type_traits(ggml_type::q8_0).type_size, 34u);
  EXPECT_EQ(type_traits(ggml_type::q8_1).type_size, 36u);
  EXPECT_EQ(type_traits(ggml_type::q4_k).block_size, 256);
  EXPECT_EQ(type_traits(ggml_type::q4_k).type_size, 144u);
  EXPECT_FALSE(find_type_traits(4).has_value());  // removed q4_2
  EXPECT_FALSE(find_type_traits(1000).has_value());
  EXPECT_EQ(parse_type_name("Q4_1"), ggml_type::q4_1);
  EXPECT_EQ(parse_type_name("nope"), std::nullopt);
  EXPECT_EQ(row_size_bytes(ggml_type::q4_1, 64), 40u);
  EXPECT_EQ(row_size_bytes(ggml_type::q4_1, 33), std::nullopt);
  EXPECT_EQ(row_size_bytes(ggml_type::f16, 3), 6u);
}

TEST(ggml_types, every_enumerator_has_traits) {
  for (ggml_type t :
       {ggml_type::f32,     ggml_type::f16,    ggml_type::q4_0,    ggml_type::q4_1,
        ggml_type::q5_0,    ggml_type::q5_1,   ggml_type::q8_0,    ggml_type::q8_1,
        ggml_type::q2_k,    ggml_type::q3_k,   ggml_type::q4_k,    ggml_type::q5_k,
        ggml_type::q6_k,    ggml_type::q8_k,   ggml_type::iq2_xxs, ggml_type::iq2_xs,
        ggml_type::iq3_xxs, ggml_type::iq1_s,  ggml_type::iq4_nl,  ggml_type::iq3_s,
        ggml_type::iq2_s,   ggml_type::iq4_xs, ggml_type::i8,      ggml_type::i16,
        ggml_type::i32,     ggml_type::i64,    ggml_type::f64,     ggml_type::iq1_m,
        ggml_type::bf16,    ggml_type::tq1_0,  ggml_type::tq2_0,   ggml_type::mxfp4}) {
    const auto traits = find_type_traits(static_cast<uint32_t>(t));
    ASSERT_TRUE(traits.has_value()) << static_cast<uint32_t>(t);
    EXPECT_EQ(traits->type, t);
    EXPECT_GT(traits->type_size, 0u);
    EXPECT_EQ(parse_type_name(traits->name), t);
  }
}

TEST(ggml_types, fp16_conversion_is_exact_for_every_half) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_fp32(static_cast<uint16_t>(h));
    const uint16_t back = fp32_to_fp16(f);
    if (std::isnan(f)) {
      EXPECT_EQ(back & 0x7c00u, 0x7c00u);
      EXPECT_NE(back & 0x3ffu, 0u);
    } else {
      ASSERT_EQ(back, h) << "half " << h;
    }
  }
}

TEST(ggml_types, fp16_rounding) {
  EXPECT_EQ(fp16_to_fp32(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_fp32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bffu);
  EXPECT_EQ(fp32_to_fp16(65519.0f), 0x7bffu);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00u);  // ties to even -> inf
  EXPECT_EQ(fp32_to_fp16(1e9f), 0x7c00u);
  EXPECT_EQ(fp32_to_fp16(-1e9f), 0xfc00u);
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0u);  // tie to even -> 0
  EXPECT_EQ(fp32_to_fp16(std::ldexp(1.5f, -25)), 1u);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
  EXPECT_EQ(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00u);
  EXPECT_EQ(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02u);
  // Compare with the rounding of a double computation over random floats.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-70000.0f, 70000.0f);
  for (int i = 0; i < 100000; ++i) {
    const float f = dist(rng) * (i % 2 ? 1.0f : 1e-4f);
    const float h = fp16_to_fp32(fp32_to_fp16(f));
    if (std::fabs(f) >= 65520.0f) {
      EXPECT_TRUE(std::isinf(h));
      continue;
    }
    // The result is one of the two neighbours and the nearer one.
    const float err = std::fabs(h - f);
    const float ulp = std::fabs(f) < std::ldexp(1.0f, -14) ? std::ldexp(1.0f, -24)
                                                           : std::ldexp(1.0f, std::ilogb(f) - 10);
    ASSERT_LE(err, ulp / 2) << f;
  }
}

TEST(ggml_types, bf16_conversion) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80u);
  EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
  EXPECT_EQ(fp32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80u);      // tie -> even
  EXPECT_EQ(fp32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82u);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bf16_to_fp32(static_cast<uint16_t>(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(fp32_to_bf16(f), b);
    }
  }
}

std::vector<float> random_values(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

struct quant_case {
  ggml_type type;
  double max_rel_rmse;  // rmse / rms of the input
};

class quant_accuracy : public ::testing::TestWithParam<quant_case> {};

TEST_P(quant_accuracy, round_trip_error_is_within_the_format_bound) {
  const auto [type, bound] = GetParam();
  const int64_t n = 32 * 64;
  const auto x = random_values(static_cast<size_t>(n), 11, 0.5f);
  std::vector<std::byte> q(*row_size_bytes(type, n));
  ASSERT_EQ(quantize_row(type, x.data(), q.data(), n), row_status::ok);
  std::vector<float> y(static_cast<size_t>(n));
  ASSERT_EQ(dequantize_row(type, q.data(), y.data(), n), row_status::ok);
  double err = 0, ref = 0, max_block_err_ratio = 0;
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0, lo = 1e30f, hi = -1e30f, worst = 0;
    for (int64_t j = b * 32; j < b * 32 + 32; ++j) {
      amax = std::max(amax, std::fabs(x[j]));
      lo = std::min(lo, x[j]);
      hi = std::max(hi, x[j]);
      worst = std::max(worst, std::fabs(x[j] - y[j]));
      err += (x[j] - y[j]) * (x[j] - y[j]);
      ref += x[j] * x[j];
    }
    // Per-element error bound: half a quantization step (+ fp16 rounding of the scale).
    float step = 0;
    if (type == ggml_type::q8_0 || type == ggml_type::q8_1) step = amax / 127;
    if (type == ggml_type::q4_0) step = amax / 8;
    if (type == ggml_type::q4_1) step = (hi - lo) / 15;
    if (step > 0) max_block_err_ratio = std::max(max_block_err_ratio, double(worst / step));
  }
  EXPECT_LT(std::sqrt(err / ref), bound);
  // q8: the codes use the fp32 scale, the stored scale is fp16 (up to 127 * 2^-11 of a step more).
  const bool q8 = type == ggml_type::q8_0 || type == ggml_type::q8_1;
  // q4_0: the extreme value maps exactly to -8 d, so a value of the opposite sign and the same
  // magnitude is clipped to 7 d: up to one step of error.
  const double limit = q8 ? 0.57 : (type == ggml_type::q4_0 ? 1.0 : 0.52);
  EXPECT_LE(max_block_err_ratio, limit);
}

INSTANTIATE_TEST_SUITE_P(
    types, quant_accuracy,
    ::testing::Values(quant_case{ggml_type::f32, 1e-9}, quant_case{ggml_type::f16, 1e-3},
                      quant_case{ggml_type::bf16, 6e-3}, quant_case{ggml_type::q8_0, 0.01},
                      quant_case{ggml_type::q8_1, 0.01}, quant_case{ggml_type::q4_0, 0.12},
                      quant_case{ggml_type::q4_1, 0.12}));

TEST(ggml_types, q4_1_layout_low_nibbles_first_half) {
  block_q4_1 b{};
  b.d = fp32_to_fp16(1.0f);
  b.m = fp32_to_fp16(-2.0f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>((j & 15) | ((15 - j) << 4));
  float y[32];
  ASSERT_EQ(dequantize_row(ggml_type::q4_1, &b, y, 32), row_status::ok);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], static_cast<float>(j) - 2.0f);
    EXPECT_EQ(y[j + 16], static_cast<float>(15 - j) - 2.0f);
  }
}

TEST(ggml_types, q4_0_layout_and_offset) {
  block_q4_0 b{};
  b.d = fp32_to_fp16(0.5f);
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(0x0 | (0xf << 4));
  float y[32];
  ASSERT_EQ(dequantize_row(ggml_type::q4_0, &b, y, 32), row_status::ok);
  EXPECT_EQ(y[0], -4.0f);
  EXPECT_EQ(y[16], 3.5f);
}

TEST(ggml_types, q8_1_sum_field) {
  const auto x = random_values(64, 3, 1.0f);
  block_q8_1 b[2];
  ASSERT_EQ(quantize_row(ggml_type::q8_1, x.data(), b, 64), row_status::ok);
  for (const auto& blk : b) {
    int sum = 0;
    for (int8_t q : blk.qs) sum += q;
    EXPECT_NEAR(fp16_to_fp32(blk.s), fp16_to_fp32(blk.d) * sum,
                std::fabs(fp16_to_fp32(blk.d) * sum) * 2e-3 + 1e-3);
  }
}

TEST(ggml_types, zero_block_and_unsupported_types) {
  std::vector<float> zeros(32, 0.0f), y(32, 1.0f);
  block_q4_1 b{};
  ASSERT_EQ(quantize_row(ggml_type::q4_1, zeros.data(), &b, 32), row_status::ok);
  ASSERT_EQ(dequantize_row(ggml_type::q4_1, &b, y.data(), 32), row_status::ok);
  for (float v : y) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(dequantize_row(ggml_type::q4_k, &b, y.data(), 256), row_status::unsupported_type);
  EXPECT_EQ(quantize_row(ggml_type::q8_0, zeros.data(), &b, 31), row_status::bad_length);
}

}  // namespace
}  // namespace weft::gpu
