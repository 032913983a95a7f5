// Paged KV cache: accounting under random operation sequences, copy-on-write, prefix reuse,
// export/import and swap round trips — each slot's payload (routing replay's routes) moving with
// its K/V through copy-on-write, prefix reuse and swap.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/kv_cache.hpp"

namespace {

using namespace weft::gpu;

struct cache_fixture : ::testing::Test {
  void SetUp() override {
    auto d = device_registry::instance().create("cpu", device_config{1, 0});
    ASSERT_TRUE(d.ok());
    dev = std::move(d.value());
    kv_cache_config c;
    c.layout = {2, 2, 8, 4, ggml_type::f16};
    c.n_blocks = 16;
    c.slot_payload_bytes = 3;
    auto k = kv_cache::create(*dev, c);
    ASSERT_TRUE(k.ok());
    kv = std::move(k.value());
  }
  // Fills the K/V of positions [pos, pos + n) of `s` with a value derived from the token.
  void write(seq_id s, std::span<const int32_t> toks) {
    const int64_t pos = kv->length(s);
    ASSERT_TRUE(kv->reserve(s, static_cast<int64_t>(toks.size())).ok());
    std::vector<int32_t> slots;
    ASSERT_TRUE(kv->slots(s, pos, static_cast<int64_t>(toks.size()), slots).ok());
    const int64_t row = kv->layout().n_kv_heads * kv->layout().head_dim;
    for (int64_t l = 0; l < kv->layout().n_layers; ++l) {
      for (size_t i = 0; i < toks.size(); ++i) {
        for (int64_t j = 0; j < row; ++j) {
          kv->k_layer(l)[slots[i] * row + j] = static_cast<uint16_t>(toks[i] * 7 + l);
          kv->v_layer(l)[slots[i] * row + j] = static_cast<uint16_t>(toks[i] * 11 + l);
        }
      }
    }
    for (size_t i = 0; i < toks.size(); ++i) {
      for (int j = 0; j < 3; ++j)
        kv->slot_payload(slots[i])[j] = static_cast<uint8_t>(toks[i] * 13 + j);
    }
    ASSERT_TRUE(kv->commit(s, toks).ok());
  }
  // Checks that every committed position of `s` holds the data written for `toks` (and its
  // payload unless `payload` is false: imported blocks carry none).
  void expect_content(seq_id s, const std::vector<int32_t>& toks, bool payload = true) {
    ASSERT_EQ(kv->length(s), static_cast<int64_t>(toks.size()));
    std::vector<int32_t> slots;
    ASSERT_TRUE(kv->slots(s, 0, kv->length(s), slots).ok());
    const int64_t row = kv->layout().n_kv_heads * kv->layout().head_dim;
    for (int64_t l = 0; l < kv->layout().n_layers; ++l) {
      for (size_t i = 0; i < toks.size(); ++i) {
        EXPECT_EQ(kv->k_layer(l)[slots[i] * row], static_cast<uint16_t>(toks[i] * 7 + l));
        EXPECT_EQ(kv->v_layer(l)[slots[i] * row + row - 1],
                  static_cast<uint16_t>(toks[i] * 11 + l));
      }
    }
    for (size_t i = 0; i < toks.size() && payload; ++i) {
      for (int j = 0; j < 3; ++j)
        EXPECT_EQ(kv->slot_payload(slots[i])[j], static_cast<uint8_t>(toks[i] * 13 + j)) << i;
    }
  }
  std::unique_ptr<device> dev;
  std::unique_ptr<kv_cache> kv;
};

TEST_F(cache_fixture, fork_shares_blocks_and_copies_on_write) {
  const seq_id a = kv->create_sequence();
  std::vector<int32_t> t = {1, 2, 3, 4, 5, 6};
  write(a, t);
  EXPECT_EQ(kv->stats().n_blocks_used, 2);
  auto b = kv->fork(a);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(kv->stats().n_blocks_used, 2);  // shared
  std::vector<int32_t> extra = {9};
  write(*b, extra);                         // writes into the shared, partially filled block
  EXPECT_EQ(kv->stats().n_blocks_used, 3);  // one copy
  expect_content(a, t);
  auto tb = t;
  tb.push_back(9);
  expect_content(*b, tb);
  EXPECT_TRUE(kv->check_invariants().ok());
  ASSERT_TRUE(kv->free_sequence(a).ok());
  ASSERT_TRUE(kv->free_sequence(*b).ok());
  EXPECT_EQ(kv->stats().n_blocks_used, 0);
  EXPECT_TRUE(kv->check_invariants().ok());
}

TEST_F(cache_fixture, prefix_blocks_are_reused_by_chained_hash) {
  const seq_id a = kv->create_sequence();
  std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  write(a, t);
  ASSERT_TRUE(kv->free_sequence(a).ok());
  EXPECT_EQ(kv->stats().n_blocks_cached, 2);  // two full blocks hashed
  const seq_id b = kv->create_sequence();
  std::vector<int32_t> same_prefix = {1, 2, 3, 4, 5, 6, 7, 8, 42, 43};
  auto m = kv->attach_prefix(b, same_prefix);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, 8);
  expect_content(b, {1, 2, 3, 4, 5, 6, 7, 8});
  // A different first block breaks the chain even if the second block matches.
  const seq_id c = kv->create_sequence();
  std::vector<int32_t> other = {0, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(*kv->attach_prefix(c, other), 0);
  // At least one token is always left to compute: the second block's leading three tokens.
  const seq_id d = kv->create_sequence();
  std::vector<int32_t> exact = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(kv->match_prefix(exact), 7);
  EXPECT_EQ(*kv->attach_prefix(d, exact), 7);
  expect_content(d, {1, 2, 3, 4, 5, 6, 7});
  EXPECT_TRUE(kv->check_invariants().ok());
  EXPECT_EQ(kv->stats().n_prefix_hits_tokens, 15);
}

// A prompt that leaves a cached block part-way (or ends inside it) reuses the rows it shares:
// they are copied into a block of its own, and the cached block stays intact for later matches.
TEST_F(cache_fixture, the_leading_tokens_of_a_cached_block_are_reused) {
  const seq_id a = kv->create_sequence();
  write(a, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  // A live sequence's full blocks are candidates too (a's second block {5..8}).
  const seq_id b = kv->create_sequence();
  const std::vector<int32_t> diverging = {1, 2, 3, 4, 5, 6, 42, 43};
  EXPECT_EQ(kv->match_prefix(diverging), 6);
  EXPECT_EQ(*kv->attach_prefix(b, diverging), 6);
  expect_content(b, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(kv->block_table(b)[0], kv->block_table(a)[0]);  // the full block is shared
  EXPECT_NE(kv->block_table(b)[1], kv->block_table(a)[1]);  // the partial one is a copy
  write(b, std::vector<int32_t>{42, 43});
  expect_content(b, {1, 2, 3, 4, 5, 6, 42, 43});
  expect_content(a, {1, 2, 3, 4, 5, 6, 7, 8, 9});  // the source block was not written
  ASSERT_TRUE(kv->check_invariants().ok());
  // b's second block {5, 6, 42, 43} is now registered beside a's {5, 6, 7, 8}: the longest
  // leading match wins.
  ASSERT_TRUE(kv->free_sequence(a).ok());
  ASSERT_TRUE(kv->free_sequence(b).ok());
  const seq_id c = kv->create_sequence();
  EXPECT_EQ(*kv->attach_prefix(c, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 42, 7}), 7);
  expect_content(c, {1, 2, 3, 4, 5, 6, 42});
  const seq_id d = kv->create_sequence();
  EXPECT_EQ(*kv->attach_prefix(d, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 0, 0}), 7);
  expect_content(d, {1, 2, 3, 4, 5, 6, 7});
  // A first block is matched from the namespace root the same way; another token breaks it.
  const seq_id e = kv->create_sequence();
  EXPECT_EQ(*kv->attach_prefix(e, std::vector<int32_t>{1, 2, 9, 9}), 2);
  expect_content(e, {1, 2});
  const seq_id f = kv->create_sequence();
  EXPECT_EQ(*kv->attach_prefix(f, std::vector<int32_t>{2, 2, 9, 9}), 0);
  ASSERT_TRUE(kv->check_invariants().ok());
  // Under another namespace nothing matches, whole or in part.
  kv->set_prefix_namespace(7);
  const seq_id g = kv->create_sequence();
  EXPECT_EQ(*kv->attach_prefix(g, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}), 0);
  for (seq_id s : {c, d, e, f, g}) ASSERT_TRUE(kv->free_sequence(s).ok());
  EXPECT_EQ(kv->stats().n_blocks_used, 0);
  EXPECT_TRUE(kv->check_invariants().ok());
}

// Whole blocks only when leading-token matches are off (RL rollout engines).
TEST_F(cache_fixture, leading_token_matches_can_be_turned_off) {
  kv_cache_config c;
  c.layout = kv->layout();
  c.n_blocks = 8;
  c.leading_token_matches = false;
  auto whole = kv_cache::create(*dev, c);
  ASSERT_TRUE(whole.ok());
  const seq_id a = (*whole)->create_sequence();
  ASSERT_TRUE((*whole)->reserve(a, 9).ok());
  ASSERT_TRUE((*whole)->commit(a, std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}).ok());
  const std::vector<int32_t> diverging = {1, 2, 3, 4, 5, 6, 42, 43};
  EXPECT_EQ((*whole)->match_prefix(diverging), 4);
  const seq_id b = (*whole)->create_sequence();
  EXPECT_EQ(*(*whole)->attach_prefix(b, diverging), 4);
  EXPECT_TRUE((*whole)->check_invariants().ok());
}

// The source block of a leading-token match may be the only free block: it is not handed out as
// the copy's destination, and without room the match is skipped, not failed.
TEST_F(cache_fixture, a_leading_token_match_without_a_free_block_is_skipped) {
  const seq_id a = kv->create_sequence();
  write(a, std::vector<int32_t>{1, 2, 3, 4, 5});
  const seq_id filler = kv->create_sequence();
  ASSERT_TRUE(kv->reserve(filler, 14 * 4).ok());  // 14 of 16 blocks; a holds the other two
  ASSERT_TRUE(kv->free_sequence(a).ok());         // a's full block cached, its partial one free
  const seq_id b = kv->create_sequence();
  EXPECT_EQ(*kv->attach_prefix(b, std::vector<int32_t>{1, 2, 3, 9}), 3);
  expect_content(b, {1, 2, 3});
  ASSERT_TRUE(kv->check_invariants().ok());
  const seq_id c = kv->create_sequence();  // the last free block is the cached source itself
  EXPECT_EQ(*kv->attach_prefix(c, std::vector<int32_t>{1, 2, 9}), 0);
  EXPECT_EQ(kv->length(c), 0);
  EXPECT_TRUE(kv->check_invariants().ok());
}

TEST_F(cache_fixture, export_import_and_swap_round_trip) {
  const seq_id a = kv->create_sequence();
  std::vector<int32_t> t = {3, 1, 4, 1, 5, 9, 2};
  write(a, t);
  auto ranges = kv->export_ranges(a);
  ASSERT_TRUE(ranges.ok());
  EXPECT_EQ(ranges->size(), 2u * 2u * 2u);  // blocks x layers x {K, V}
  auto imp = kv->prepare_import(kv->layout(), t);
  ASSERT_TRUE(imp.ok());
  ASSERT_EQ(imp->second.size(), ranges->size());
  for (size_t i = 0; i < ranges->size(); ++i) {
    std::memcpy(imp->second[i].data, (*ranges)[i].data, (*ranges)[i].size_bytes);
  }
  ASSERT_TRUE(kv->commit(imp->first, t).ok());
  expect_content(imp->first, t, false);
  kv_layout other = kv->layout();
  other.head_dim = 16;
  EXPECT_EQ(kv->prepare_import(other, t).error().code(), status_code::invalid_argument);

  const int64_t used = kv->stats().n_blocks_used;
  ASSERT_TRUE(kv->swap_out(a).ok());
  EXPECT_TRUE(kv->is_swapped(a));
  EXPECT_EQ(kv->stats().n_blocks_used, used - 2);
  // Other data through (nearly) every free block meanwhile: swap_in restores K/V and payload.
  const seq_id z = kv->create_sequence();
  write(z, std::vector<int32_t>(52, 77));
  ASSERT_TRUE(kv->free_sequence(z).ok());
  ASSERT_TRUE(kv->swap_in(a).ok());
  expect_content(a, t);
  EXPECT_TRUE(kv->check_invariants().ok());
}

TEST_F(cache_fixture, out_of_memory_rolls_back) {
  const seq_id a = kv->create_sequence();
  EXPECT_EQ(kv->reserve(a, 17 * 4).code(), status_code::out_of_memory);
  EXPECT_EQ(kv->stats().n_blocks_used, 0);
  EXPECT_TRUE(kv->check_invariants().ok());
}

// Random add / fork / free / swap / prefix sequences never leak or double-free a block.
TEST_F(cache_fixture, random_operations_keep_accounting_exact) {
  std::mt19937 rng(1234);
  std::vector<seq_id> live;
  std::map<seq_id, std::vector<int32_t>> content;  // what each sequence must hold
  for (int step = 0; step < 3000; ++step) {
    const int op = static_cast<int>(rng() % 7);
    if (op == 0 || live.empty()) {
      const seq_id s = kv->create_sequence();
      std::vector<int32_t> toks(rng() % 9);
      for (auto& t : toks) t = static_cast<int32_t>(rng() % 3);  // small alphabet -> prefix hits
      if (!toks.empty()) {
        const int64_t expected = kv->match_prefix(toks);
        auto m = kv->attach_prefix(s, toks);
        ASSERT_TRUE(m.ok());
        // The match is skipped only when no block is free for the copy of a partial block.
        if (*m != expected) {
          ASSERT_EQ(*m, expected / 4 * 4) << "step " << step;
        }
        content[s].assign(toks.begin(), toks.begin() + *m);
      }
      live.push_back(s);
    } else {
      const size_t i = rng() % live.size();
      const seq_id s = live[i];
      if (op == 1 || op == 2) {
        if (kv->is_swapped(s)) continue;
        std::vector<int32_t> toks(1 + rng() % 6);
        for (auto& t : toks) t = static_cast<int32_t>(rng() % 3);
        if (kv->reserve(s, static_cast<int64_t>(toks.size())).ok()) {
          write(s, toks);
          content[s].insert(content[s].end(), toks.begin(), toks.end());
        }
      } else if (op == 3) {
        auto f = kv->fork(s);
        if (f.ok()) {
          live.push_back(*f);
          content[*f] = content[s];
        }
      } else if (op == 4) {
        ASSERT_TRUE(kv->free_sequence(s).ok());
        live.erase(live.begin() + static_cast<int64_t>(i));
        content.erase(s);
      } else if (op == 5) {
        if (!kv->is_swapped(s)) (void)kv->swap_out(s);
      } else {
        if (kv->is_swapped(s)) (void)kv->swap_in(s);
      }
    }
    const status st = kv->check_invariants();
    ASSERT_TRUE(st.ok()) << "step " << step << ": " << st.to_string();
    const seq_id probe = live.empty() ? 0 : live[rng() % live.size()];
    if (probe != 0 && !kv->is_swapped(probe)) expect_content(probe, content[probe]);
    ASSERT_FALSE(HasFailure()) << "step " << step;
    const kv_stats ks = kv->stats();
    ASSERT_EQ(ks.n_blocks_used + ks.n_blocks_free, ks.n_blocks_total);
  }
  for (seq_id s : live) ASSERT_TRUE(kv->free_sequence(s).ok());
  EXPECT_EQ(kv->stats().n_blocks_used, 0);
  EXPECT_EQ(kv->stats().n_sequences, 0);
  EXPECT_TRUE(kv->check_invariants().ok());
}

}  // namespace
