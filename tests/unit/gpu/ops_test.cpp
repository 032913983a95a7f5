// CPU kernels against plain scalar references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpu/cpu/attention.hpp"
#include "gpu/cpu/blas_kernels.hpp"
#include "gpu/cpu/elementwise.hpp"
#include "gpu/cpu/half_dot.hpp"
#include "gpu/cpu/matmul.hpp"
#include "gpu/cpu/quant_dot.hpp"
#include "gpu/cpu/thread_pool.hpp"
#include "gpu/device.hpp"
#include "tests/unit/gpu/cpu_test_support.hpp"

namespace {

using namespace weft::gpu;
using namespace weft::gpu::cpu;
using namespace weft::gpu::cpu::test_support;

std::vector<uint8_t> quantize(ggml_type t, const std::vector<float>& x, int64_t rows,
                              int64_t cols) {
  const size_t rb = *row_size_bytes(t, cols);
  std::vector<uint8_t> out(rb * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(quantize_row(t, x.data() + r * cols, out.data() + r * rb, cols), row_status::ok);
  }
  return out;
}

tensor_view view_of(ggml_type t, const std::vector<uint8_t>& bytes, int64_t rows, int64_t cols) {
  tensor_view v;
  v.type = t;
  v.data = bytes.data();
  v.n_rows = rows;
  v.n_cols = cols;
  v.row_bytes = *row_size_bytes(t, cols);
  v.mat_bytes = v.row_bytes * static_cast<size_t>(rows);
  return v;
}

// This binary's main() ran select_blas_kernels (tests/support/gtest_main.cpp), as every weft
// program's does: on a CPU with AVX2 or AVX-512, OpenBLAS must not be left on its SSE3 fallback
// (Debian 12's OpenBLAS picks it for CPUs it does not know; docs/engine.md, "BLAS kernels").
TEST(blas_kernels, openblas_runs_kernels_that_fit_the_cpu) {
  const char* core = cpu::blas_corename();
  ASSERT_NE(core, nullptr) << "OpenBLAS is linked into this binary";
  if (cpu::blas_coretype_for_this_cpu() == nullptr) GTEST_SKIP() << "no AVX2 here";
  EXPECT_STRCASENE(core, "Prescott")
      << "OPENBLAS_CORETYPE="
      << (std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "(unset)");
}

TEST(quant_dot, avx2_and_portable_paths_are_bit_identical) {
  const int64_t n = 32 * 48;
  auto w = random_floats(n, 1);
  auto a = random_floats(n, 2, 3.0f);
  std::vector<block_q8_0> a8(n / 32), a8p(n / 32);
  std::vector<block_q8_1> a81(n / 32), a81p(n / 32);
  quantize_act_q8_0(a.data(), a8.data(), n);
  quantize_act_q8_0_portable(a.data(), a8p.data(), n);
  quantize_act_q8_1(a.data(), a81.data(), n);
  quantize_act_q8_1_portable(a.data(), a81p.data(), n);
  ASSERT_EQ(std::memcmp(a8.data(), a8p.data(), sizeof(block_q8_0) * a8.size()), 0);
  ASSERT_EQ(std::memcmp(a81.data(), a81p.data(), sizeof(block_q8_1) * a81.size()), 0);
  auto w40 = quantize(ggml_type::q4_0, w, 1, n);
  auto w41 = quantize(ggml_type::q4_1, w, 1, n);
  auto w80 = quantize(ggml_type::q8_0, w, 1, n);
  const auto* q40 = reinterpret_cast<const block_q4_0*>(w40.data());
  const auto* q41 = reinterpret_cast<const block_q4_1*>(w41.data());
  const auto* q80 = reinterpret_cast<const block_q8_0*>(w80.data());
  EXPECT_EQ(dot_q4_0_q8_0(q40, a8.data(), n / 32), dot_q4_0_q8_0_portable(q40, a8.data(), n / 32));
  EXPECT_EQ(dot_q4_1_q8_1(q41, a81.data(), n / 32),
            dot_q4_1_q8_1_portable(q41, a81.data(), n / 32));
  EXPECT_EQ(dot_q8_0_q8_0(q80, a8.data(), n / 32), dot_q8_0_q8_0_portable(q80, a8.data(), n / 32));
  // The four-row kernels give each row's one-row result (rows and tokens of nb blocks each).
  const int64_t nb = n / 32 / 8;
  const size_t rb40 = sizeof(block_q4_0) * nb, rb41 = sizeof(block_q4_1) * nb,
               rb80 = sizeof(block_q8_0) * nb;
  float o[4];
  dot4_q4_0_q8_0(q40, rb40, a8.data(), nb, o);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(o[r], dot_q4_0_q8_0_portable(q40 + r * nb, a8.data(), nb));
  dot4_q4_1_q8_1(q41, rb41, a81.data(), nb, o);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(o[r], dot_q4_1_q8_1_portable(q41 + r * nb, a81.data(), nb));
  dot4_q8_0_q8_0(q80, rb80, a8.data(), nb, o);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(o[r], dot_q8_0_q8_0_portable(q80 + r * nb, a8.data(), nb));
  // The tile kernels too (tile_rows x n tokens): activation rows j = blocks [j * nb, (j + 1) * nb).
  static_assert(tile_rows <= 4 && tile_tokens <= 8);
  for (int n_tok = 1; n_tok <= tile_tokens; ++n_tok) {
    float t[8][4];
    float* outs[8] = {t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]};
    const block_q8_0* acts8[8];
    const block_q8_1* acts81[8];
    // The activations' scales as matmul hands them over: block-major floats, n_tok tokens per
    // block, the s table padded by tile_tokens floats.
    std::vector<float> d8(static_cast<size_t>(n_tok * nb)), d81(d8.size()),
        s81(d8.size() + tile_tokens);
    for (int j = 0; j < n_tok; ++j) {
      acts8[j] = a8.data() + j * nb;
      acts81[j] = a81.data() + j * nb;
      act_scales_column(acts8[j], nb, d8.data() + j, n_tok);
      act_scales_column(acts81[j], nb, d81.data() + j, s81.data() + j, n_tok);
    }
    const act_scales sc8{d8.data(), nullptr, n_tok};
    const act_scales sc81{d81.data(), s81.data(), n_tok};
    dot_tile_q4_0_q8_0(q40, rb40, acts8, n_tok, nb, outs, sc8);
    for (int j = 0; j < n_tok; ++j)
      for (int r = 0; r < tile_rows; ++r)
        EXPECT_EQ(t[j][r], dot_q4_0_q8_0_portable(q40 + r * nb, acts8[j], nb)) << n_tok;
    dot_tile_q4_1_q8_1(q41, rb41, acts81, n_tok, nb, outs, sc81);
    for (int j = 0; j < n_tok; ++j)
      for (int r = 0; r < tile_rows; ++r)
        EXPECT_EQ(t[j][r], dot_q4_1_q8_1_portable(q41 + r * nb, acts81[j], nb)) << n_tok;
    dot_tile_q8_0_q8_0(q80, rb80, acts8, n_tok, nb, outs, sc8);
    for (int j = 0; j < n_tok; ++j)
      for (int r = 0; r < tile_rows; ++r)
        EXPECT_EQ(t[j][r], dot_q8_0_q8_0_portable(q80 + r * nb, acts8[j], nb)) << n_tok;
  }
}

TEST(quant_dot, activation_quantization_is_within_half_a_step) {
  auto x = random_floats(256, 3, 2.0f);
  std::vector<block_q8_1> q(8);
  quantize_act_q8_1(x.data(), q.data(), 256);
  for (int b = 0; b < 8; ++b) {
    const float d = fp16_to_fp32(q[b].d);
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      EXPECT_NEAR(q[b].qs[j] * d, x[b * 32 + j], 0.51f * d + 1e-3f);
      sum += q[b].qs[j];
    }
    EXPECT_NEAR(fp16_to_fp32(q[b].s), d * sum, std::fabs(d * sum) * 1e-3f + 1e-4f);
  }
}

TEST_P(simd_layouts, f16_dots_match_double_reference) {
  for (int64_t n : {16, 64, 96, 200}) {
    auto x = random_floats(static_cast<size_t>(n), 4);
    auto y = random_floats(static_cast<size_t>(n), 5);
    std::vector<uint16_t> xh(n), yh(n);
    double ref = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      xh[i] = fp32_to_fp16(x[i]);
      yh[i] = fp32_to_fp16(y[i]);
      ref += static_cast<double>(fp16_to_fp32(xh[i])) * fp16_to_fp32(yh[i]);
    }
    EXPECT_NEAR(dot_f16(xh.data(), yh.data(), n), ref, 1e-4 * n);
    if (n % ggml_simd_lanes(GetParam()) == 0) {
      EXPECT_NEAR(dot_f16_gemm(xh.data(), yh.data(), n), ref, 1e-4 * n);
    }
  }
}

TEST_P(simd_layouts, f16_column_dots_equal_the_dots_of_the_transpose_bit_for_bit) {
  using column_fn =
      void (*)(const uint16_t* const*, int64_t, const uint16_t*, int64_t, int64_t, float*, float*);
  using dot_fn = float (*)(const uint16_t*, const uint16_t*, int64_t);
  for (int64_t cols : {64, 12}) {
    for (auto [n_rows, n] :
         {std::pair<int64_t, int64_t>{96, 96}, {70, 96}, {5, 32}, {100, 100}, {1, 1}, {130, 160}}) {
      auto v = random_floats(static_cast<size_t>(n_rows * cols), 7);
      auto y = random_floats(static_cast<size_t>(n), 8);  // also past n_rows: zero rows x any y
      std::vector<uint16_t> vh(v.size()), yh(y.size()), col(static_cast<size_t>(n), 0);
      for (size_t i = 0; i < v.size(); ++i) vh[i] = fp32_to_fp16(v[i]);
      for (size_t i = 0; i < y.size(); ++i) yh[i] = fp32_to_fp16(y[i]);
      std::vector<const uint16_t*> rows;
      for (int64_t i = 0; i < n_rows; ++i) rows.push_back(vh.data() + i * cols);
      std::vector<float> scratch(static_cast<size_t>(64 * cols)), out(static_cast<size_t>(cols));
      // Each column through `columns` equals `dot` on that column (zeros past n_rows).
      const auto check = [&](column_fn columns, dot_fn dot, const char* what) {
        columns(rows.data(), n_rows, yh.data(), n, cols, scratch.data(), out.data());
        for (int64_t d = 0; d < cols; ++d) {
          for (int64_t i = 0; i < n_rows; ++i)
            col[static_cast<size_t>(i)] = vh[static_cast<size_t>(i * cols + d)];
          const float want = dot(col.data(), yh.data(), n);
          EXPECT_EQ(std::memcmp(&out[static_cast<size_t>(d)], &want, sizeof(float)), 0)
              << what << " cols " << cols << " rows " << n_rows << " n " << n << " d " << d << ": "
              << out[static_cast<size_t>(d)] << " vs " << want;
        }
      };
      check(dot_f16_columns, dot_f16, "gemv");
      if (n % ggml_simd_lanes(GetParam()) == 0) check(dot_f16_gemm_columns, dot_f16_gemm, "gemm");
    }
  }
}

// ggml_vec_dot_f16's order written out plainly (4 accumulators of `lanes` lanes, acc0 + acc2,
// acc1 + acc3, their sum, the layout's horizontal tree, the tail in double): the vector kernels
// must give exactly this.
float dot_f16_tree(const uint16_t* x, const uint16_t* y, int64_t n, int lanes) {
  const int64_t step = 4 * lanes, np = n / step * step;
  float acc[4][16] = {};
  for (int64_t i = 0; i < np; i += step)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < lanes; ++l) {
        const int64_t e = i + j * lanes + l;
        acc[j][l] = std::fma(fp16_to_fp32(x[e]), fp16_to_fp32(y[e]), acc[j][l]);
      }
  double sum = 0.0;
  if (np > 0) {
    float v[16];
    for (int l = 0; l < lanes; ++l) v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    float t4[4];
    if (lanes == 16) {
      float t8[8];
      for (int l = 0; l < 8; ++l) t8[l] = v[8 + l] + v[l];
      for (int l = 0; l < 4; ++l) t4[l] = t8[4 + l] + t8[l];
      sum = static_cast<double>((t4[0] + t4[2]) + (t4[1] + t4[3]));
    } else {
      for (int l = 0; l < 4; ++l) t4[l] = v[l] + v[4 + l];
      sum = static_cast<double>((t4[0] + t4[1]) + (t4[2] + t4[3]));
    }
  }
  for (int64_t i = np; i < n; ++i)
    sum += static_cast<double>(fp16_to_fp32(x[i]) * fp16_to_fp32(y[i]));
  return static_cast<float>(sum);
}

TEST_P(simd_layouts, f16_dots_follow_ggml_order_bit_for_bit) {
  for (int64_t n : {64, 96, 128, 200, 31}) {
    auto x = random_floats(static_cast<size_t>(n), 11);
    auto y = random_floats(static_cast<size_t>(n), 12);
    std::vector<uint16_t> xh(static_cast<size_t>(n)), yh(xh.size());
    for (size_t i = 0; i < xh.size(); ++i) {
      xh[i] = fp32_to_fp16(x[i]);
      yh[i] = fp32_to_fp16(y[i]);
    }
    const float got = dot_f16(xh.data(), yh.data(), n);
    const float want = dot_f16_tree(xh.data(), yh.data(), n, ggml_simd_lanes(GetParam()));
    EXPECT_EQ(std::memcmp(&got, &want, sizeof(float)), 0) << n << ": " << got << " vs " << want;
  }
}

TEST_P(simd_layouts, exp_and_softmax_match_libm) {
  for (float v = -100.0f; v < 88.0f; v += 0.173f) {
    const double e = std::exp(static_cast<double>(v));
    EXPECT_NEAR(exp_approx(v), e, std::max(e * 4e-7, 3e-45)) << v;  // 1 ulp among denormals
  }
  EXPECT_EQ(exp_approx(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp_approx(-200.0f), 0.0f);
  EXPECT_EQ(exp_approx(200.0f), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(exp_approx(std::numeric_limits<float>::quiet_NaN())));
  // A masked row (trailing -inf) sums only the live entries; the tail past the lanes uses libm.
  std::vector<float> row = {0.5f, -1.0f, 2.0f, 0.0f, -3.0f, 1.0f, 0.25f, -0.5f, 1.5f, -2.0f, 0.75f};
  row.resize(32, -std::numeric_limits<float>::infinity());
  double expect = 0.0;
  for (int i = 0; i < 11; ++i) expect += std::exp(static_cast<double>(row[i]) - 2.0);
  const double sum = exp_sum_row(row.data(), 32, 2.0f);
  EXPECT_NEAR(sum, expect, 1e-6);
  for (int i = 11; i < 32; ++i) EXPECT_EQ(row[i], 0.0f);
}

// The vectorised softmax exponent (AVX-512 builds) gives exp_sum_row_scalar's bits: every value
// and the sum, over scores spanning the normal, subnormal and underflow ranges, -inf padding and a
// tail past the last full group of lanes.
TEST_P(simd_layouts, exp_sum_row_is_the_scalar_computation) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> wide(-140.0f, 0.5f), narrow(-12.0f, 0.0f);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t n = 16 * (1 + trial % 9) + (trial % 3 == 0 ? 7 : 0);
    std::vector<float> row(static_cast<size_t>(n));
    for (auto& v : row) v = trial % 2 == 0 ? wide(rng) : narrow(rng);
    for (int64_t i = n - 1; i >= n - trial % 20 && i >= 0; --i)
      row[static_cast<size_t>(i)] = -std::numeric_limits<float>::infinity();
    auto a = row, b = row;
    const double sa = exp_sum_row(a.data(), n, 0.25f);
    const double sb = exp_sum_row_scalar(b.data(), n, 0.25f);
    EXPECT_EQ(std::memcmp(&sa, &sb, sizeof sa), 0) << trial << ": " << sa << " vs " << sb;
    EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<size_t>(n)), 0) << trial;
  }
}

INSTANTIATE_TEST_SUITE_P(layouts, simd_layouts,
                         ::testing::Values(ggml_simd::avx2, ggml_simd::avx512),
                         [](const auto& info) { return std::string{ggml_simd_name(info.param)}; });

// The two layouts are different computations (what makes matching llama.cpp host-specific): over
// random inputs some fp16 dot products and some exp values must round differently.
TEST(simd_layouts_differ, reduction_orders_and_exp_finish) {
  simd_layout_guard guard;
  int dot_diffs = 0;
  for (int seed = 0; seed < 50; ++seed) {
    auto x = random_floats(256, 100 + seed);
    auto y = random_floats(256, 200 + seed);
    std::vector<uint16_t> xh(256), yh(256);
    for (int i = 0; i < 256; ++i) {
      xh[i] = fp32_to_fp16(x[i]);
      yh[i] = fp32_to_fp16(y[i]);
    }
    set_ggml_simd_layout(ggml_simd::avx2);
    const float a = dot_f16(xh.data(), yh.data(), 256);
    set_ggml_simd_layout(ggml_simd::avx512);
    const float b = dot_f16(xh.data(), yh.data(), 256);
    dot_diffs += a != b;
  }
  EXPECT_GT(dot_diffs, 0);
  int exp_diffs = 0;
  for (float v = -20.0f; v < 20.0f; v += 0.01f)
    exp_diffs += exp_approx_avx2(v) != exp_approx_avx512(v);
  EXPECT_GT(exp_diffs, 0);
}

class matmul_types : public ::testing::TestWithParam<ggml_type> {};

TEST_P(matmul_types, matches_reference_and_is_batch_invariant) {
  const ggml_type t = GetParam();
  const int64_t rows = 37, cols = 96, tokens = 9;
  auto wf = random_floats(static_cast<size_t>(rows * cols), 6);
  auto wq = quantize(t, wf, rows, cols);
  const tensor_view w = view_of(t, wq, rows, cols);
  auto x = random_floats(static_cast<size_t>(tokens * cols), 7);
  thread_pool pool(2);
  matmul_scratch scratch;
  std::vector<float> y(static_cast<size_t>(tokens * rows)), ref(y.size());
  ASSERT_TRUE(matmul(pool, scratch, w, x.data(), tokens, y.data()).ok());
  matmul_reference(w, x.data(), tokens, ref.data());
  for (size_t i = 0; i < y.size(); ++i)
    EXPECT_NEAR(y[i], ref[i], 1e-3f * (1.0f + std::fabs(ref[i]))) << i;
  // Each token alone gives bit-identical rows (f32 weights: up to the batches that go to OpenBLAS
  // sgemm, tested below).
  for (int64_t tk = 0; tk < tokens; ++tk) {
    std::vector<float> one(static_cast<size_t>(rows));
    ASSERT_TRUE(matmul(pool, scratch, w, x.data() + tk * cols, 1, one.data()).ok());
    EXPECT_EQ(std::memcmp(one.data(), y.data() + tk * rows, sizeof(float) * rows), 0)
        << "token " << tk;
  }
}

// f32 and bf16 weights below 48 tokens: every output is dot_f32's of the row and the token, bit
// for bit, whatever the batch (decode batches of every size, odd counts, rows left over from the
// 4-row tiles, a row length with a tail past the 8 lanes). From 48 tokens f32 goes to OpenBLAS
// sgemm, which agrees to rounding.
TEST(matmul, f32_and_bf16_tiles_are_dot_f32_bit_for_bit_in_every_batch) {
  const int64_t rows = 37, cols = 100, max_tokens = 64;
  const auto wf = random_floats(static_cast<size_t>(rows * cols), 16);
  const auto x = random_floats(static_cast<size_t>(max_tokens * cols), 17);
  std::vector<uint16_t> wb(wf.size());
  std::vector<float> wbf(wf.size());  // the bf16 weights widened back, what the tiles dot
  for (size_t i = 0; i < wf.size(); ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, &wf[i], sizeof bits);
    wb[i] = static_cast<uint16_t>(bits >> 16);
    bits = static_cast<uint32_t>(wb[i]) << 16;
    std::memcpy(&wbf[i], &bits, sizeof bits);
  }
  const auto view = [&](ggml_type t, const void* data, size_t elem) {
    tensor_view v;
    v.type = t;
    v.data = data;
    v.n_rows = rows;
    v.n_cols = cols;
    v.row_bytes = static_cast<size_t>(cols) * elem;
    v.mat_bytes = v.row_bytes * static_cast<size_t>(rows);
    return v;
  };
  const tensor_view wv32 = view(ggml_type::f32, wf.data(), sizeof(float));
  const tensor_view wv16 = view(ggml_type::bf16, wb.data(), sizeof(uint16_t));
  thread_pool pool(2);
  matmul_scratch scratch;
  for (const auto& [w, dense] :
       {std::pair{wv32, wf.data()}, std::pair{wv16, static_cast<const float*>(wbf.data())}}) {
    SCOPED_TRACE(type_name(w.type));
    for (int64_t n : {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 47, 48, 64}) {
      std::vector<float> y(static_cast<size_t>(n * rows));
      ASSERT_TRUE(matmul(pool, scratch, w, x.data(), n, y.data()).ok());
      const bool gemm = w.type == ggml_type::f32 && n >= 48;
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t r = 0; r < rows; ++r) {
          const float want = dot_f32(dense + r * cols, x.data() + t * cols, cols);
          const float got = y[static_cast<size_t>(t * rows + r)];
          if (gemm) {
            EXPECT_NEAR(got, want, 1e-5f * (1 + std::fabs(want)));
          } else {
            EXPECT_EQ(got, want) << "batch " << n << " token " << t << " row " << r;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(types, matmul_types,
                         ::testing::Values(ggml_type::f32, ggml_type::f16, ggml_type::bf16,
                                           ggml_type::q8_0, ggml_type::q4_0, ggml_type::q4_1));

// The ggml kernel's packed copy (AVX2 builds: groups of 4 rows, quant_dot.hpp pack4_rows)
// gives every output bit for bit as the weights as stored do, in every batch size and thread
// count: 38 rows (a partial group after 9 whole ones, and tiles of 8 rows that end mid-group),
// odd block counts; a stack of expert matrices carries its copy along (tensor_view::matrix).
class packed_quant : public ::testing::TestWithParam<ggml_type> {
 protected:
  void SetUp() override {
    auto k = quant_matmul_kernel_in_use();
    ASSERT_TRUE(k.ok());
    before_ = *k;
    ASSERT_TRUE(set_quant_matmul_kernel(quant_matmul_kernel::ggml).ok());
  }
  void TearDown() override { (void)set_quant_matmul_kernel(before_); }
  quant_matmul_kernel before_ = quant_matmul_kernel::ggml;
};

TEST_P(packed_quant, is_bit_identical_to_the_stored_layout_in_every_batch) {
  const ggml_type t = GetParam();
  const int64_t rows = 38, mats = 2;
  for (const int64_t cols : {96, 160}) {
    const auto wq =
        quantize(t, random_floats(static_cast<size_t>(rows * mats * cols), 61), rows * mats, cols);
    tensor_view w = view_of(t, wq, rows, cols);
    w.n_mats = mats;
    const size_t bytes = packed_weight_bytes(w);
#ifdef WEFT_QUANT_PACKED4
    ASSERT_EQ(bytes, w.mat_bytes * mats);
#else
    ASSERT_EQ(bytes, 0u);
    GTEST_SKIP() << "this build has no packed kernels (they need AVX2, FMA and F16C)";
#endif
    std::vector<uint8_t> packed(bytes);
    {
      thread_pool pack_pool(2);
      ASSERT_TRUE(pack_weight(pack_pool, w, packed.data()).ok());
    }
    tensor_view wp = w;
    wp.packed = packed.data();
    const auto x = random_floats(static_cast<size_t>(40 * cols), 62);
    for (const int threads : {1, 2}) {
      thread_pool pool(threads);
      matmul_scratch scratch;
      for (int64_t m = 0; m < mats; ++m) {
        for (const int64_t n : {1, 2, 3, 5, 8, 9, 16, 17, 40}) {
          std::vector<float> want(static_cast<size_t>(n * rows)), got(want.size());
          ASSERT_TRUE(matmul(pool, scratch, w.matrix(m), x.data(), n, want.data()).ok());
          ASSERT_TRUE(matmul(pool, scratch, wp.matrix(m), x.data(), n, got.data()).ok());
          ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
              << type_name(t) << " cols " << cols << " matrix " << m << " batch " << n
              << " threads " << threads;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(types, packed_quant,
                         ::testing::Values(ggml_type::q8_0, ggml_type::q4_0, ggml_type::q4_1),
                         [](const auto& info) { return std::string{type_name(info.param)}; });

TEST(matmul, multi_is_bit_identical_to_separate_calls) {
  thread_pool pool(2);
  matmul_scratch scratch;
  const int64_t cols = 64, tokens = 5;
  auto x = random_floats(static_cast<size_t>(tokens * cols), 30);
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<tensor_view> ws;
  const int64_t rows[] = {19, 8, 8};
  for (int i = 0; i < 3; ++i) {
    bytes.push_back(quantize(ggml_type::q4_1,
                             random_floats(static_cast<size_t>(rows[i] * cols), 31 + i), rows[i],
                             cols));
  }
  for (int i = 0; i < 3; ++i)
    ws.push_back(view_of(ggml_type::q4_1, bytes[static_cast<size_t>(i)], rows[i], cols));
  std::vector<std::vector<float>> sep(3), multi(3);
  std::vector<float*> ptrs;
  for (int i = 0; i < 3; ++i) {
    sep[i].resize(static_cast<size_t>(tokens * rows[i]));
    multi[i].resize(sep[i].size());
    ptrs.push_back(multi[i].data());
    ASSERT_TRUE(matmul(pool, scratch, ws[i], x.data(), tokens, sep[i].data()).ok());
  }
  ASSERT_TRUE(matmul_multi(pool, scratch, ws, x.data(), tokens, ptrs).ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(sep[i], multi[i]);
}

TEST(matmul, rejects_unsupported_types) {
  thread_pool pool(1);
  matmul_scratch scratch;
  tensor_view w;
  w.type = ggml_type::q6_k;
  w.n_rows = 1;
  w.n_cols = 256;
  float x[256] = {}, y[1];
  EXPECT_EQ(matmul(pool, scratch, w, x, 1, y).code(), status_code::unsupported);
}

TEST(elementwise, get_row_dequantizes_q8_0) {
  auto x = random_floats(2 * 64, 14);
  auto q = quantize(ggml_type::q8_0, x, 2, 64);
  const tensor_view v = view_of(ggml_type::q8_0, q, 2, 64);
  std::vector<float> y(64), ref(64);
  ASSERT_TRUE(get_row(v, 1, y.data()).ok());
  ASSERT_EQ(dequantize_row(ggml_type::q8_0, v.row(1), ref.data(), 64), row_status::ok);
  EXPECT_EQ(y, ref);
  EXPECT_FALSE(get_row(v, 2, y.data()).ok());
}

TEST(thread_pool, runs_every_index_once_and_spins_safely) {
  thread_pool pool(3);
  std::vector<std::atomic<int>> hits(3);
  for (int round = 0; round < 1000; ++round) {
    thread_pool::spin_scope spin(pool);
    pool.parallel([&](int i, int n) {
      EXPECT_EQ(n, 3);
      hits[static_cast<size_t>(i)].fetch_add(1);
    });
  }
  for (auto& h : hits) EXPECT_EQ(h.load(), 1000);
  auto [b, e] = split_range(10, 3, 2);
  EXPECT_EQ(b, 7);
  EXPECT_EQ(e, 10);
}

TEST(thread_pool, active_count_changes_between_jobs_and_idle_threads_do_no_work) {
  thread_pool pool(3, 1);
  EXPECT_EQ(pool.size(), 3);
  std::vector<std::atomic<int>> hits(3);
  // 1 thread, then 3, then 2, then 3 again, many times over (a survivor borrowing cores and
  // giving them back): every job runs on exactly the requested threads, each index once.
  const int pattern[] = {1, 3, 2, 3, 1};
  int expected[3] = {0, 0, 0};
  for (int round = 0; round < 400; ++round) {
    const int want = pattern[round % 5];
    pool.request_active(want);
    thread_pool::spin_scope spin(pool);
    for (int job = 0; job < 3; ++job) {
      pool.parallel([&](int i, int n) {
        EXPECT_EQ(n, want);
        EXPECT_LT(i, want);
        hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (int i = 0; i < want; ++i) ++expected[i];
    }
    EXPECT_EQ(pool.active(), want);
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)].load(), expected[i]) << i;
  pool.request_active(99);  // clamped
  pool.parallel([&](int, int n) { EXPECT_EQ(n, 3); });
}

TEST(device_registry, cpu_is_always_there) {
  auto& reg = device_registry::instance();
  auto d = reg.create("cpu", device_config{1, 0});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d.value()->capabilities().kind, device_kind::cpu);
  auto buf = d.value()->allocate(100);
  ASSERT_TRUE(buf.ok());
  std::vector<char> src(100, 'x'), dst(100);
  ASSERT_TRUE(d.value()->copy_to_device(buf->data, src.data(), 100).ok());
  ASSERT_TRUE(d.value()->copy_to_host(dst.data(), buf->data, 100).ok());
  EXPECT_EQ(src, dst);
  d.value()->release(*buf);
  EXPECT_EQ(reg.create("no-such-device").error().code(), status_code::not_found);
  EXPECT_EQ(reg.count("cpu"), 1);
  EXPECT_EQ(reg.count("no-such-device"), 0);
#ifdef WEFT_WITH_CUDA
  // Registered in CUDA builds; without a GPU the creation fails with a clear error, never a crash.
  auto c = reg.create("cuda");
  if (!c.ok()) {
    EXPECT_EQ(c.error().code(), status_code::unsupported) << c.error().to_string();
    EXPECT_EQ(reg.count("cuda"), 0);
  } else {
    EXPECT_GE(reg.count("cuda"), 1);
  }
#endif
}

TEST(device_registry, a_backend_counts_its_devices) {
  auto& reg = device_registry::instance();
  reg.add(
      "counted-test", device_kind::cpu,
      [](const device_config&) -> result<std::unique_ptr<device>> {
        return status{status_code::unsupported, "not for creating"};
      },
      [] { return 3; });
  EXPECT_EQ(reg.count("counted-test"), 3);
  reg.add("counted-test", device_kind::cpu,
          [](const device_config&) -> result<std::unique_ptr<device>> {
            return status{status_code::unsupported, "not for creating"};
          });
  EXPECT_EQ(reg.count("counted-test"), 1) << "a backend without a counter has one device";
}

}  // namespace
