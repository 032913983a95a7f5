// Attention of the CPU backend: against a double-precision reference, bit for bit against ggml's
// orders built from the public primitives (both lane layouts), and invariant to prompt chunking and
// thread splits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gpu/cpu/attention.hpp"
#include "gpu/cpu/elementwise.hpp"
#include "gpu/cpu/half_dot.hpp"
#include "gpu/cpu/quant_dot.hpp"
#include "gpu/ggml_types.hpp"
#include "tests/unit/gpu/cpu_test_support.hpp"

namespace {

using namespace weft::gpu;
using namespace weft::gpu::cpu;
using namespace weft::gpu::cpu::test_support;

// Each layout in turn (the tests switch the process-wide one and restore it).
class attention_layouts : public simd_layouts {};

// A paged fp16 K and V cache (n_blocks blocks of bs rows of n_kv * hd) of random values.
struct half_cache {
  std::vector<uint16_t> k, v;
};
half_cache random_half_cache(int64_t n_blocks, int64_t bs, int64_t n_kv, int64_t hd,
                             uint32_t seed) {
  const auto n = static_cast<size_t>(n_blocks * bs * n_kv * hd);
  const auto kf = random_floats(n, seed), vf = random_floats(n, seed + 1);
  half_cache c{std::vector<uint16_t>(n), std::vector<uint16_t>(n)};
  for (size_t i = 0; i < n; ++i) {
    c.k[i] = fp32_to_fp16(kf[i]);
    c.v[i] = fp32_to_fp16(vf[i]);
  }
  return c;
}

// The fields every attention test sets (q and out are the caller's).
struct batch_layout {
  const std::vector<int32_t>& table;
  const std::vector<int32_t>& offsets;
  const std::vector<int32_t>& tok_seq;
  const std::vector<int32_t>& tok_pos;
  const std::vector<int32_t>& seq_n;
};
attention_batch paged_batch(const half_cache& c, const batch_layout& l, int64_t n_heads,
                            int64_t n_kv, int64_t hd, int64_t bs) {
  attention_batch b;
  b.k_cache = c.k.data();
  b.v_cache = c.v.data();
  b.token_seq = l.tok_seq.data();
  b.token_pos = l.tok_pos.data();
  b.block_table = l.table.data();
  b.seq_block_offset = l.offsets.data();
  b.seq_n_tokens = l.seq_n.data();
  b.n_tokens = static_cast<int64_t>(l.tok_seq.size());
  b.n_heads = n_heads;
  b.n_kv_heads = n_kv;
  b.head_dim = hd;
  b.block_size = bs;
  b.scale = 1.0f / std::sqrt(float(hd));
  return b;
}

// Attention over a two-sequence paged cache against the double-precision reference, in both the
// decode (GEMV) and prefill (GEMM) numerics.
TEST(attention, paged_gqa_matches_reference) {
  const int64_t n_heads = 4, n_kv = 2, hd = 32, bs = 4, n_blocks = 8;
  const half_cache kc = random_half_cache(n_blocks, bs, n_kv, hd, 15);
  // seq 0 uses blocks 5, 1, 6; seq 1 uses blocks 2, 7.
  const std::vector<int32_t> table = {5, 1, 6, 2, 7};
  const std::vector<int32_t> offsets = {0, 3};
  const std::vector<int32_t> tok_seq = {0, 0, 1};
  const std::vector<int32_t> tok_pos = {9, 10, 6};
  for (int32_t chunk : {1, 2}) {
    const std::vector<int32_t> seq_n = {chunk, 1};
    auto q = random_floats(static_cast<size_t>(3 * n_heads * hd), 17);
    std::vector<float> out(q.size()), ref(q.size());
    attention_batch b =
        paged_batch(kc, {table, offsets, tok_seq, tok_pos, seq_n}, n_heads, n_kv, hd, bs);
    b.q = q.data();
    attention_scratch s;
    b.out = out.data();
    attention_tasks(b, s, 0, 1);
    b.out = ref.data();
    attention_reference(b);
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], ref[i], 2e-3) << i;
  }
}

// Prefill attention is batch invariant bit for bit: a token's output does not depend on how its
// sequence's prompt is chunked, on the other sequences in the batch, on the tile a token lands in
// or on the thread (scratch) that ran it — scratch is reused across calls, as the engine's is.
// Query groups of 3 and 4 heads per kv head (the tiled kernel takes up to 3 at a time), head
// sizes 64 and 128 (the two score kernels with keys held in registers).
TEST(attention, prefill_is_bit_identical_however_the_prompt_is_chunked) {
  for (const auto& [n_heads, hd] : {std::pair<int64_t, int64_t>{9, 64}, {12, 64}, {6, 128}}) {
    const int64_t n_kv = 3, bs = 16, n_blocks = 12;
    const half_cache kc = random_half_cache(n_blocks, bs, n_kv, hd, 41);
    // Sequence 0: 70 positions in blocks 9, 2, 7, 4, 11; sequence 1: 45 in blocks 0, 5, 10.
    const std::vector<int32_t> table = {9, 2, 7, 4, 11, 0, 5, 10};
    const std::vector<int32_t> offsets = {0, 5};
    const std::vector<int64_t> lengths = {70, 45};
    const auto q = random_floats(static_cast<size_t>(115 * n_heads * hd), 43);
    const size_t q_row = static_cast<size_t>(n_heads * hd);
    // Output of (sequence, position): row seq * 70 + pos.
    auto run = [&](const std::vector<std::vector<std::pair<int64_t, int64_t>>>& batches,
                   std::vector<attention_scratch>& scratch, bool reference) {
      std::vector<float> result(2 * 70 * q_row, 0.0f);
      for (const auto& parts : batches) {
        std::vector<int32_t> tok_seq, tok_pos, seq_n(2, 0);
        std::vector<float> qb;
        for (size_t sq = 0; sq < parts.size(); ++sq) {
          for (int64_t p = parts[sq].first; p < parts[sq].second; ++p) {
            tok_seq.push_back(static_cast<int32_t>(sq));
            tok_pos.push_back(static_cast<int32_t>(p));
            const size_t src = (sq == 0 ? 0 : 70) + static_cast<size_t>(p);
            qb.insert(qb.end(), q.begin() + static_cast<std::ptrdiff_t>(src * q_row),
                      q.begin() + static_cast<std::ptrdiff_t>((src + 1) * q_row));
          }
          seq_n[sq] = static_cast<int32_t>(parts[sq].second - parts[sq].first);
        }
        std::vector<float> out(qb.size());
        attention_batch b =
            paged_batch(kc, {table, offsets, tok_seq, tok_pos, seq_n}, n_heads, n_kv, hd, bs);
        b.q = qb.data();
        b.out = out.data();
        if (reference) {
          attention_reference(b);
        } else {
          const auto n = static_cast<int64_t>(scratch.size());
          for (int64_t i = 0; i < n; ++i) attention_tasks(b, scratch[static_cast<size_t>(i)], i, n);
        }
        for (size_t t = 0; t < tok_seq.size(); ++t) {
          const size_t dst = static_cast<size_t>(tok_seq[t] * 70 + tok_pos[t]);
          std::copy_n(out.begin() + static_cast<std::ptrdiff_t>(t * q_row), q_row,
                      result.begin() + static_cast<std::ptrdiff_t>(dst * q_row));
        }
      }
      return result;
    };
    std::vector<attention_scratch> two(2), three(3);
    const auto whole = run({{{0, 70}, {0, 45}}}, two, false);
    const auto chunked =
        run({{{0, 23}, {0, 2}}, {{23, 50}, {2, 45}}, {{50, 70}, {45, 45}}}, three, false);
    const auto alone = run({{{0, 37}, {0, 0}}, {{37, 70}, {0, 0}}, {{0, 0}, {0, 45}}}, two, false);
    const auto ref = run({{{0, 70}, {0, 45}}}, two, true);
    for (int sq = 0; sq < 2; ++sq) {
      for (int64_t p = 0; p < lengths[static_cast<size_t>(sq)]; ++p) {
        const size_t at = static_cast<size_t>(sq * 70 + p) * q_row;
        EXPECT_EQ(std::memcmp(whole.data() + at, chunked.data() + at, q_row * sizeof(float)), 0)
            << n_heads << " heads, sequence " << sq << " position " << p;
        EXPECT_EQ(std::memcmp(whole.data() + at, alone.data() + at, q_row * sizeof(float)), 0)
            << n_heads << " heads, sequence " << sq << " position " << p;
        for (size_t i = 0; i < q_row; ++i)
          ASSERT_NEAR(whole[at + i], ref[at + i], 2e-3) << sq << " " << p << " " << i;
      }
    }
  }
}

// One (token, query head)'s attention output in ggml's order, from the public primitives: q
// rounded to fp16; per key the layout's dot (`gemm`: dot_f16_gemm, a prefill chunk; else dot_f16,
// a decode token) times the scale; the softmax's steps (max, -inf padding to n_kv, exp_sum_row, one
// float reciprocal, probabilities rounded to fp16); the value sums (dot_f16_gemm_columns /
// dot_f16_columns). `row(cache, p)`: position p's row of the head's kv head.
template <class Row>
void ggml_attention_head(const half_cache& kc, const Row& row, int64_t n_pos, const float* q,
                         int64_t hd, float scale, bool gemm, float* out) {
  const int64_t n_pad = (n_pos + 31) / 32 * 32;
  std::vector<uint16_t> qh(static_cast<size_t>(hd));
  float_to_half_row(q, qh.data(), hd);
  std::vector<float> sc(static_cast<size_t>(n_pad));
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t p = 0; p < n_pos; ++p) {
    const uint16_t* k = row(kc.k, p);
    sc[static_cast<size_t>(p)] =
        (gemm ? dot_f16_gemm(k, qh.data(), hd) : dot_f16(k, qh.data(), hd)) * scale;
    max = std::max(max, sc[static_cast<size_t>(p)]);
  }
  for (int64_t p = n_pos; p < n_pad; ++p)
    sc[static_cast<size_t>(p)] = -std::numeric_limits<float>::infinity();
  const float inv = static_cast<float>(1.0 / exp_sum_row(sc.data(), n_pad, max));
  for (int64_t p = 0; p < n_pos; ++p) sc[static_cast<size_t>(p)] *= inv;
  std::vector<uint16_t> probs(static_cast<size_t>(n_pad), 0);
  float_to_half_row(sc.data(), probs.data(), n_pos);
  std::vector<const uint16_t*> v_rows;
  for (int64_t p = 0; p < n_pos; ++p) v_rows.push_back(row(kc.v, p));
  std::vector<float> acc(static_cast<size_t>(64 * hd));
  if (gemm) {
    dot_f16_gemm_columns(v_rows.data(), n_pos, probs.data(), n_pad, hd, acc.data(), out);
  } else {
    dot_f16_columns(v_rows.data(), n_pos, probs.data(), n_pad, hd, acc.data(), out);
  }
}

// Prefill attention (GEMM numerics) against the same steps assembled from the public primitives
// in ggml's order: q rounded to fp16, dot_f16_gemm per key times the scale, the softmax (max,
// -inf padding to n_kv, exp_sum_row, one float reciprocal, probabilities rounded to fp16),
// dot_f16_gemm_columns over the values. Bit for bit, in both lane layouts: the tiled kernels
// (16-lane AVX-512, 8-lane AVX2) must equal the per-key path they replace. Two sequences, a
// prompt of 37 tokens (three tiles, the last partial) and one of 20 after 9 cached positions.
TEST_P(attention_layouts, prefill_attention_matches_ggml_gemm_numerics_bit_for_bit) {
  for (const auto& [n_heads, hd] : {std::pair<int64_t, int64_t>{9, 64}, {6, 128}, {4, 32}}) {
    const int64_t n_kv = n_heads == 4 ? 2 : 3, bs = 16, n_blocks = 8;
    const half_cache kc = random_half_cache(n_blocks, bs, n_kv, hd, 61);
    const std::vector<int32_t> table = {6, 1, 4, 0, 7, 2};
    const std::vector<int32_t> offsets = {0, 3};
    std::vector<int32_t> tok_seq, tok_pos;
    for (int32_t p = 0; p < 37; ++p) tok_seq.push_back(0), tok_pos.push_back(p);
    for (int32_t p = 9; p < 29; ++p) tok_seq.push_back(1), tok_pos.push_back(p);
    const std::vector<int32_t> seq_n = {37, 20};
    const auto q = random_floats(tok_seq.size() * static_cast<size_t>(n_heads * hd), 63);
    attention_batch b =
        paged_batch(kc, {table, offsets, tok_seq, tok_pos, seq_n}, n_heads, n_kv, hd, bs);
    b.q = q.data();
    std::vector<float> out(q.size());
    b.out = out.data();
    std::vector<attention_scratch> scratch(2);
    for (int64_t i = 0; i < 2; ++i) attention_tasks(b, scratch[static_cast<size_t>(i)], i, 2);
    const int64_t group = n_heads / n_kv;
    std::vector<float> want(static_cast<size_t>(hd));
    for (size_t t = 0; t < tok_seq.size(); ++t) {
      const int32_t* tab = table.data() + offsets[static_cast<size_t>(tok_seq[t])];
      for (int64_t h = 0; h < n_heads; ++h) {
        const auto row = [&, g = h / group](const std::vector<uint16_t>& cache, int64_t p) {
          return cache.data() + ((tab[p / bs] * bs + p % bs) * n_kv + g) * hd;
        };
        ggml_attention_head(kc, row, tok_pos[t] + 1,
                            q.data() + (static_cast<int64_t>(t) * n_heads + h) * hd, hd, b.scale,
                            /*gemm=*/true, want.data());
        const float* got = out.data() + (static_cast<int64_t>(t) * n_heads + h) * hd;
        ASSERT_EQ(std::memcmp(got, want.data(), want.size() * sizeof(float)), 0)
            << ggml_simd_name(GetParam()) << ": " << n_heads << " heads of " << hd << ", token "
            << t << ", head " << h;
      }
    }
  }
}

// Decode attention (GEMV numerics: one token per sequence) against the public primitives in ggml's
// order — dot_f16 per key times the scale, the softmax's steps, dot_f16_columns — bit for bit in
// both layouts, with 1-3 threads (query heads of a kv head run together, 1-3 at a time).
TEST_P(attention_layouts, decode_attention_matches_ggml_gemv_numerics_bit_for_bit) {
  for (const auto& [n_heads, hd] : {std::pair<int64_t, int64_t>{9, 64}, {6, 128}, {4, 32}}) {
    const int64_t n_kv = n_heads == 4 ? 2 : 3, bs = 16, n_blocks = 24;
    const half_cache kc = random_half_cache(n_blocks, bs, n_kv, hd, 71);
    const std::vector<int32_t> offsets = {0, 13, 14};
    const std::vector<int32_t> tok_seq = {0, 1, 2}, tok_pos = {200, 5, 95}, seq_n = {1, 1, 1};
    const std::vector<int32_t> table = {3,  17, 8,  21, 0,  12, 5, 14, 9,  1,
                                        20, 7,  16, 2,  23, 4,  6, 10, 11, 13};
    const auto q = random_floats(static_cast<size_t>(3 * n_heads * hd), 73);
    attention_batch b =
        paged_batch(kc, {table, offsets, tok_seq, tok_pos, seq_n}, n_heads, n_kv, hd, bs);
    b.q = q.data();
    const int64_t group = n_heads / n_kv;
    std::vector<float> want(q.size());
    for (size_t t = 0; t < tok_seq.size(); ++t) {
      const int32_t* tab = table.data() + offsets[t];
      for (int64_t h = 0; h < n_heads; ++h) {
        const auto row = [&, g = h / group](const std::vector<uint16_t>& cache, int64_t p) {
          return cache.data() + ((tab[p / bs] * bs + p % bs) * n_kv + g) * hd;
        };
        const int64_t at = (static_cast<int64_t>(t) * n_heads + h) * hd;
        ggml_attention_head(kc, row, tok_pos[t] + 1, q.data() + at, hd, b.scale,
                            /*gemm=*/false, want.data() + at);
      }
    }
    for (int64_t threads : {1, 2, 3}) {
      std::vector<float> out(q.size(), -1.0f);
      std::vector<attention_scratch> s(static_cast<size_t>(threads));
      b.out = out.data();
      for (int64_t i = 0; i < threads; ++i)
        attention_tasks(b, s[static_cast<size_t>(i)], i, threads);
      EXPECT_EQ(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)), 0)
          << ggml_simd_name(GetParam()) << ": " << n_heads << " heads of " << hd << ", " << threads
          << " threads";
    }
  }
}

// Decode attention (GEMV numerics) gives the same bits however a step's (token, head) pairs are
// split over threads: a thread runs the heads of one kv head in its range together (3, 2 or 1 at
// a time), and each must equal the others' result for that head.
TEST(attention, decode_is_bit_identical_across_thread_splits) {
  for (const auto& [n_heads, hd] : {std::pair<int64_t, int64_t>{9, 64}, {12, 64}, {6, 128}}) {
    const int64_t n_kv = 3, bs = 16, n_blocks = 24;
    const half_cache kc = random_half_cache(n_blocks, bs, n_kv, hd, 51);
    // Three sequences decoding one token each, at positions 200 (201 keys: three full steps of 64
    // and a tail, padded to 224), 5 and 95; blocks 13 + 1 + 6 of the 24.
    const std::vector<int32_t> offsets = {0, 13, 14};
    const std::vector<int32_t> tok_seq = {0, 1, 2}, tok_pos = {200, 5, 95}, seq_n = {1, 1, 1};
    const std::vector<int32_t> table = {3,  17, 8,  21, 0,  12, 5, 14, 9,  1,
                                        20, 7,  16, 2,  23, 4,  6, 10, 11, 13};
    const auto q = random_floats(static_cast<size_t>(3 * n_heads * hd), 53);
    attention_batch b =
        paged_batch(kc, {table, offsets, tok_seq, tok_pos, seq_n}, n_heads, n_kv, hd, bs);
    b.q = q.data();
    std::vector<float> one(q.size()), ref(q.size());
    {
      attention_scratch s;
      b.out = one.data();
      attention_tasks(b, s, 0, 1);
    }
    b.out = ref.data();
    attention_reference(b);
    for (size_t i = 0; i < one.size(); ++i) ASSERT_NEAR(one[i], ref[i], 2e-3) << i;
    for (int64_t threads = 2; threads <= 7; ++threads) {
      std::vector<float> out(q.size(), -1.0f);
      std::vector<attention_scratch> s(static_cast<size_t>(threads));
      b.out = out.data();
      for (int64_t i = 0; i < threads; ++i)
        attention_tasks(b, s[static_cast<size_t>(i)], i, threads);
      EXPECT_EQ(std::memcmp(out.data(), one.data(), out.size() * sizeof(float)), 0)
          << n_heads << " heads of " << hd << ", " << threads << " threads";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(layouts, attention_layouts,
                         ::testing::Values(ggml_simd::avx2, ggml_simd::avx512),
                         [](const auto& info) { return std::string{ggml_simd_name(info.param)}; });

}  // namespace
