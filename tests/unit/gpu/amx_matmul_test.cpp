// The AMX matmul kernel (gpu/cpu/amx_matmul.hpp), with its tiles (`amx`), on AVX-512 VNNI alone
// (`vnni`) and on AVX2 (`avx2`): bit for bit its documented order (exact block sums, then per block
// acc = fma(d_w * d_a, isum, acc) [+ fma(m_w, s_a, acc)]) in every batch size and thread count,
// close to the exact product, and refused with a reason where it cannot run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu/cpu/amx_matmul.hpp"
#include "gpu/cpu/matmul.hpp"
#include "gpu/cpu/quant_dot.hpp"
#include "gpu/ggml_types.hpp"

namespace weft::gpu::cpu {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct quantized {
  std::vector<uint8_t> bytes;
  tensor_view view;
};

quantized make_weights(ggml_type t, int64_t rows, int64_t cols, uint32_t seed) {
  const auto f = random_floats(static_cast<size_t>(rows * cols), seed);
  quantized q;
  const size_t rb = *row_size_bytes(t, cols);
  q.bytes.resize(rb * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(quantize_row(t, f.data() + r * cols, q.bytes.data() + r * rb, cols), row_status::ok);
  }
  q.view.type = t;
  q.view.data = q.bytes.data();
  q.view.n_cols = cols;
  q.view.n_rows = rows;
  q.view.row_bytes = rb;
  q.view.mat_bytes = rb * static_cast<size_t>(rows);
  return q;
}

int weight_q(ggml_type t, const uint8_t* block, int k) {
  switch (t) {
    case ggml_type::q4_0: {
      const auto* b = reinterpret_cast<const block_q4_0*>(block);
      return (k < 16 ? b->qs[k] & 0x0F : b->qs[k - 16] >> 4) - 8;
    }
    case ggml_type::q4_1: {
      const auto* b = reinterpret_cast<const block_q4_1*>(block);
      return k < 16 ? b->qs[k] & 0x0F : b->qs[k - 16] >> 4;
    }
    default:
      return reinterpret_cast<const block_q8_0*>(block)->qs[k];
  }
}

// The kernel's documented numerics, one (row, token) at a time.
float amx_order_dot(ggml_type t, const tensor_view& w, int64_t r, const float* x) {
  const int64_t nb = w.n_cols / 32;
  const size_t wb = *row_size_bytes(t, 32);
  const auto* row = static_cast<const uint8_t*>(w.row(r));
  float acc = 0.0f;
  if (t == ggml_type::q4_1) {
    std::vector<block_q8_1> a(static_cast<size_t>(nb));
    quantize_act_q8_1(x, a.data(), w.n_cols);
    for (int64_t b = 0; b < nb; ++b) {
      const auto* blk = reinterpret_cast<const block_q4_1*>(row + b * wb);
      int32_t isum = 0;
      for (int k = 0; k < 32; ++k) isum += weight_q(t, row + b * wb, k) * a[b].qs[k];
      const float s = fp16_to_fp32(blk->d) * fp16_to_fp32(a[b].d);
      acc = std::fma(s, static_cast<float>(isum), acc);
      acc = std::fma(fp16_to_fp32(blk->m), fp16_to_fp32(a[b].s), acc);
    }
    return acc;
  }
  std::vector<block_q8_0> a(static_cast<size_t>(nb));
  quantize_act_q8_0(x, a.data(), w.n_cols);
  for (int64_t b = 0; b < nb; ++b) {
    uint16_t dw = 0;
    std::memcpy(&dw, row + b * wb, sizeof dw);
    int32_t isum = 0;
    for (int k = 0; k < 32; ++k) isum += weight_q(t, row + b * wb, k) * a[b].qs[k];
    acc = std::fma(fp16_to_fp32(dw) * fp16_to_fp32(a[b].d), static_cast<float>(isum), acc);
  }
  return acc;
}

class amx_kernel : public ::testing::TestWithParam<std::tuple<ggml_type, quant_matmul_kernel>> {
 protected:
  void SetUp() override {
    const quant_matmul_kernel k = std::get<1>(GetParam());
    if (k == quant_matmul_kernel::amx && !amx_available())
      GTEST_SKIP() << "no AMX here: " << amx_unavailable_reason();
    if (k == quant_matmul_kernel::vnni && !amx_vnni_available())
      GTEST_SKIP() << "no AVX-512 VNNI here: " << amx_vnni_unavailable_reason();
    if (k == quant_matmul_kernel::avx2 && !amx_avx2_available())
      GTEST_SKIP() << "this build has no AVX2 kernels";
    ASSERT_TRUE(set_quant_matmul_kernel(k).ok());
  }
  ggml_type type() const { return std::get<0>(GetParam()); }
  void TearDown() override { (void)set_quant_matmul_kernel(quant_matmul_kernel::ggml); }
};

// 37 rows (a partial group of 16) and 885 (55 whole groups and a partial one: the parallel tiles
// hand a call 7 groups on one thread, 4 on two, so batch-1 decode runs four, two and one packed
// groups at once), 96 and 160 columns (odd block counts: the kernel alternates two accumulators),
// batches around the VNNI / tile switch (16 / 17 tokens; the vnni kernel: its 16-token chunks)
// and the 16-token tile, one and two threads.
TEST_P(amx_kernel, is_its_documented_order_bit_for_bit_in_every_batch) {
  const ggml_type t = type();
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{37, 96}, {37, 160}, {885, 160}}) {
    const auto w = make_weights(t, rows, cols, 11);
    const auto x = random_floats(static_cast<size_t>(40 * cols), 12);
    // As stored, and from the packed copy (whole groups; the last 5 rows read as stored).
    std::vector<uint8_t> packed(packed_weight_bytes(w.view));
    ASSERT_EQ(packed.size(), w.view.mat_bytes);
    for (const bool use_packed : {false, true}) {
      tensor_view v = w.view;
      if (use_packed) {
        thread_pool pack_pool(2);
        ASSERT_TRUE(pack_weight(pack_pool, v, packed.data()).ok());
        v.packed = packed.data();
      }
      for (const int threads : {1, 2}) {
        thread_pool pool(threads);
        matmul_scratch scratch;
        for (const int64_t n : {1, 3, 8, 9, 16, 17, 31, 40}) {
          std::vector<float> y(static_cast<size_t>(n * rows));
          ASSERT_TRUE(matmul(pool, scratch, v, x.data(), n, y.data()).ok());
          for (int64_t tk = 0; tk < n; ++tk) {
            for (int64_t r = 0; r < rows; ++r) {
              const float want = amx_order_dot(t, w.view, r, x.data() + tk * cols);
              const float got = y[static_cast<size_t>(tk * rows + r)];
              ASSERT_EQ(std::memcmp(&want, &got, sizeof got), 0)
                  << std::string{type_name(t)} << (use_packed ? " packed" : "") << " cols " << cols
                  << " batch " << n << " token " << tk << " row " << r << ": " << got << " vs "
                  << want;
            }
          }
        }
      }
    }
  }
}

TEST_P(amx_kernel, matches_the_exact_product_as_closely_as_ggml_order) {
  const ggml_type t = type();
  const int64_t rows = 64, cols = 256, n = 24;
  const auto w = make_weights(t, rows, cols, 21);
  const auto x = random_floats(static_cast<size_t>(n * cols), 22);
  thread_pool pool(2);
  matmul_scratch scratch;
  std::vector<float> amx(static_cast<size_t>(n * rows)), ggml(amx.size()), ref(amx.size());
  ASSERT_TRUE(matmul(pool, scratch, w.view, x.data(), n, amx.data()).ok());
  ASSERT_TRUE(set_quant_matmul_kernel(quant_matmul_kernel::ggml).ok());
  ASSERT_TRUE(matmul(pool, scratch, w.view, x.data(), n, ggml.data()).ok());
  matmul_reference(w.view, x.data(), n, ref.data());
  double err_amx = 0.0, err_ggml = 0.0;
  int differ = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err_amx = std::max(err_amx, std::fabs(static_cast<double>(amx[i]) - ref[i]));
    err_ggml = std::max(err_ggml, std::fabs(static_cast<double>(ggml[i]) - ref[i]));
    differ += amx[i] != ggml[i];
  }
  EXPECT_LT(err_amx, 1e-4 * cols);
  EXPECT_LT(err_amx, 4.0 * err_ggml + 1e-6);
  EXPECT_GT(differ, 0) << "the AMX order should round differently from ggml's somewhere";
}

TEST_P(amx_kernel, multi_is_bit_identical_to_separate_calls) {
  const ggml_type t = type();
  const int64_t cols = 128, n = 19;
  const auto a = make_weights(t, 48, cols, 31);
  const auto b = make_weights(t, 21, cols, 32);
  const auto x = random_floats(static_cast<size_t>(n * cols), 33);
  thread_pool pool(2);
  matmul_scratch scratch;
  std::vector<float> ya(static_cast<size_t>(n * 48)), yb(static_cast<size_t>(n * 21));
  std::vector<float> ma(ya.size()), mb(yb.size());
  ASSERT_TRUE(matmul(pool, scratch, a.view, x.data(), n, ya.data()).ok());
  ASSERT_TRUE(matmul(pool, scratch, b.view, x.data(), n, yb.data()).ok());
  const tensor_view ws[] = {a.view, b.view};
  float* const ys[] = {ma.data(), mb.data()};
  ASSERT_TRUE(matmul_multi(pool, scratch, ws, x.data(), n, ys).ok());
  EXPECT_EQ(std::memcmp(ya.data(), ma.data(), ya.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(yb.data(), mb.data(), yb.size() * sizeof(float)), 0);
}

// A stack of matrices (MoE experts): each matrix's packed copy sits mat_bytes after the last, and
// matrix(i) carries it along.
TEST_P(amx_kernel, packed_expert_stacks_match_the_stored_layout) {
  const ggml_type t = type();
  const int64_t rows = 32, cols = 64, mats = 3, n = 5;
  const auto one = make_weights(t, rows * mats, cols, 41);
  tensor_view w = one.view;
  w.n_rows = rows;
  w.n_mats = mats;
  w.mat_bytes = w.row_bytes * static_cast<size_t>(rows);
  std::vector<uint8_t> packed(packed_weight_bytes(w));
  ASSERT_EQ(packed.size(), w.mat_bytes * mats);
  thread_pool pool(2);
  ASSERT_TRUE(pack_weight(pool, w, packed.data()).ok());
  tensor_view wp = w;
  wp.packed = packed.data();
  const auto x = random_floats(static_cast<size_t>(n * cols), 42);
  matmul_scratch scratch;
  for (int64_t i = 0; i < mats; ++i) {
    std::vector<float> a(static_cast<size_t>(n * rows)), b(a.size());
    ASSERT_TRUE(matmul(pool, scratch, w.matrix(i), x.data(), n, a.data()).ok());
    ASSERT_TRUE(matmul(pool, scratch, wp.matrix(i), x.data(), n, b.data()).ok());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "expert " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    types, amx_kernel,
    ::testing::Combine(::testing::Values(ggml_type::q4_0, ggml_type::q4_1, ggml_type::q8_0),
                       ::testing::Values(quant_matmul_kernel::amx, quant_matmul_kernel::vnni,
                                         quant_matmul_kernel::avx2)),
    [](const auto& info) {
      return std::string{type_name(std::get<0>(info.param))} + "_" +
             quant_matmul_kernel_name(std::get<1>(info.param));
    });

// The default kernel packs quantized weights in groups of 4 rows where it has the kernels for
// them (AVX2 builds: ops_test's packed_quant); otherwise it reads them as stored: nothing
// to pack, and asking is an error. Weights it never packs (f32) are an error either way.
TEST(amx_kernel_choice, the_ggml_kernel_packs_only_where_it_has_packed_kernels) {
  ASSERT_TRUE(set_quant_matmul_kernel(quant_matmul_kernel::ggml).ok());
  const auto w = make_weights(ggml_type::q4_1, 32, 64, 51);
  thread_pool pool(1);
  std::vector<uint8_t> dst(w.view.mat_bytes);
#ifdef WEFT_QUANT_PACKED4
  EXPECT_EQ(packed_weight_bytes(w.view), w.view.mat_bytes);
  EXPECT_TRUE(pack_weight(pool, w.view, dst.data()).ok());
#else
  EXPECT_EQ(packed_weight_bytes(w.view), 0u);
  EXPECT_EQ(pack_weight(pool, w.view, dst.data()).code(), status_code::invalid_argument);
#endif
  // WEFT_CPU_PACK_WEIGHTS=0: nothing is packed, by either kernel.
  set_pack_weights(false);
  EXPECT_EQ(packed_weight_bytes(w.view), 0u);
  EXPECT_EQ(pack_weight(pool, w.view, dst.data()).code(), status_code::invalid_argument);
  set_pack_weights(true);
  const auto f = make_weights(ggml_type::f32, 32, 64, 52);
  EXPECT_EQ(packed_weight_bytes(f.view), 0u);
  EXPECT_EQ(pack_weight(pool, f.view, dst.data()).code(), status_code::invalid_argument);
}

// WEFT_CPU_MATMUL is read once per process: each case runs in a fresh one (a re-executed test).
int kernel_from_env(const char* value) {
  if (value == nullptr) {
    ::unsetenv("WEFT_CPU_MATMUL");
  } else {
    ::setenv("WEFT_CPU_MATMUL", value, 1);
  }
  const auto k = quant_matmul_kernel_in_use();
  if (!k) {
    return k.error().message().find("must be auto, ggml, avx2, vnni or amx") != std::string::npos
               ? 3
               : 4;
  }
  if (*k == quant_matmul_kernel::vnni) return 5;
  if (*k == quant_matmul_kernel::avx2) return 6;
  return *k == quant_matmul_kernel::amx ? 2 : 1;
}

bool intel_cpu() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  return std::string{vendor} == "GenuineIntel";
#else
  return false;
#endif
}

// auto: amx where it can run, else vnni on Intel CPUs with AVX-512 VNNI (ggml on others that have
// it), else avx2 where the build has it, else ggml.
TEST(amx_kernel_choice, auto_and_unset_pick_amx_then_vnni_then_avx2_exactly_where_they_can_run) {
  ::testing::GTEST_FLAG(death_test_style) = "threadsafe";
  const int want = amx_available()        ? 2
                   : amx_vnni_available() ? (intel_cpu() ? 5 : 1)
                   : amx_avx2_available() ? 6
                                          : 1;
  EXPECT_EXIT(std::exit(kernel_from_env(nullptr)), ::testing::ExitedWithCode(want), "");
  EXPECT_EXIT(std::exit(kernel_from_env("auto")), ::testing::ExitedWithCode(want), "");
  EXPECT_EXIT(std::exit(kernel_from_env("ggml")), ::testing::ExitedWithCode(1), "");
  EXPECT_EXIT(std::exit(kernel_from_env("vnni")),
              ::testing::ExitedWithCode(amx_vnni_available() ? 5 : 4), "");
  EXPECT_EXIT(std::exit(kernel_from_env("amx")), ::testing::ExitedWithCode(amx_available() ? 2 : 4),
              "");
  EXPECT_EXIT(std::exit(kernel_from_env("avx2")),
              ::testing::ExitedWithCode(amx_avx2_available() ? 6 : 4), "");
  EXPECT_EXIT(std::exit(kernel_from_env("fast")), ::testing::ExitedWithCode(3), "");
}

TEST(amx_kernel_choice, is_refused_with_the_reason_where_it_cannot_run) {
  const status st = set_quant_matmul_kernel(quant_matmul_kernel::amx);
  const status vst = set_quant_matmul_kernel(quant_matmul_kernel::vnni);
  (void)set_quant_matmul_kernel(quant_matmul_kernel::ggml);
  if (amx_available()) {
    EXPECT_TRUE(st.ok()) << st.message();
    EXPECT_STREQ(amx_unavailable_reason(), "");
  } else {
    EXPECT_EQ(st.code(), status_code::unsupported);
    EXPECT_NE(st.message().find(amx_unavailable_reason()), std::string::npos) << st.message();
  }
  if (amx_vnni_available()) {
    EXPECT_TRUE(vst.ok()) << vst.message();
    EXPECT_STREQ(amx_vnni_unavailable_reason(), "");
  } else {
    EXPECT_EQ(vst.code(), status_code::unsupported);
    EXPECT_NE(vst.message().find(amx_vnni_unavailable_reason()), std::string::npos)
        << vst.message();
  }
}

}  // namespace
}  // namespace weft::gpu::cpu
