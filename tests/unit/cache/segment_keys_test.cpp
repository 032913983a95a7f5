#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "actors/cache/segment_keys.hpp"

namespace weft::cache {
namespace {

segment_key_config config(int64_t seg = 16) {
  return {"llama-3-8b@rev1", "f16/l32/h8/d128", seg};
}

std::vector<int32_t> tokens(size_t n, int32_t first = 100) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(segment_keys, deterministic_and_only_full_segments) {
  auto t = tokens(16 * 5);
  auto a = segment_keys(config(), t);
  auto b = segment_keys(config(), t);
  ASSERT_EQ(a.size(), 5u);
  EXPECT_EQ(a, b);
  for (uint64_t k : a) EXPECT_NE(k, 0u);
  // Segments with the same tokens at different positions still differ: keys are chained.
  std::vector<int32_t> repeated(16 * 3, 7);
  auto r = segment_keys(config(), repeated);
  EXPECT_NE(r[0], r[1]);
  EXPECT_NE(r[1], r[2]);
}

TEST(segment_keys, partial_tail_segment_has_no_key) {
  auto t = tokens(16 * 2 + 9);
  auto keys = segment_keys(config(), t);
  ASSERT_EQ(keys.size(), 2u);
  auto full = segment_keys(config(), std::span<const int32_t>(t).first(32));
  EXPECT_EQ(keys, full);
  EXPECT_TRUE(segment_keys(config(), tokens(15)).empty());
  EXPECT_TRUE(segment_keys(config(), std::span<const int32_t>{}).empty());
  EXPECT_TRUE(segment_keys(config(0), tokens(64)).empty());
}

TEST(segment_keys, equal_prefixes_give_equal_keys) {
  auto a = tokens(16 * 6);
  auto b = a;
  for (size_t i = 16 * 3; i < b.size(); ++i) b[i] += 1000;  // diverge from segment 3 on
  auto ka = segment_keys(config(), a);
  auto kb = segment_keys(config(), b);
  ASSERT_EQ(ka.size(), 6u);
  ASSERT_EQ(kb.size(), 6u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(ka[i], kb[i]) << i;
  for (size_t i = 3; i < 6; ++i) EXPECT_NE(ka[i], kb[i]) << i;
}

TEST(segment_keys, one_changed_token_changes_that_and_all_later_keys) {
  auto a = tokens(16 * 5);
  auto b = a;
  b[16 * 2 + 5] = -1;  // inside segment 2
  auto ka = segment_keys(config(), a);
  auto kb = segment_keys(config(), b);
  EXPECT_EQ(ka[0], kb[0]);
  EXPECT_EQ(ka[1], kb[1]);
  for (size_t i = 2; i < 5; ++i) EXPECT_NE(ka[i], kb[i]) << i;
}

TEST(segment_keys, model_and_layout_change_every_key) {
  auto t = tokens(16 * 4);
  auto base = segment_keys(config(), t);
  auto other_model = config();
  other_model.model_id = "llama-3-8b@rev2";
  auto other_layout = config();
  other_layout.kv_layout = "q8_0/l32/h8/d128";
  auto km = segment_keys(other_model, t);
  auto kl = segment_keys(other_layout, t);
  for (size_t i = 0; i < base.size(); ++i) {
    EXPECT_NE(base[i], km[i]) << i;
    EXPECT_NE(base[i], kl[i]) << i;
    EXPECT_NE(km[i], kl[i]) << i;
  }
  // Field boundaries are part of the hash: ("ab", "c") is not ("a", "bc").
  segment_key_config x{"ab", "c", 16};
  segment_key_config y{"a", "bc", 16};
  EXPECT_NE(segment_keys(x, t), segment_keys(y, t));
}

TEST(segment_keys, segment_size_changes_keys) {
  auto t = tokens(64);
  auto k16 = segment_keys(config(16), t);
  auto k32 = segment_keys(config(32), t);
  ASSERT_EQ(k32.size(), 2u);
  EXPECT_NE(k16[1], k32[0]);  // both cover tokens [0, 32)
}

TEST(segment_keys, next_segment_key_chains_like_segment_keys) {
  auto t = tokens(16 * 3);
  auto keys = segment_keys(config(), t);
  uint64_t prev = 0;
  for (size_t i = 0; i < 3; ++i) {
    prev = next_segment_key(config(), prev, std::span<const int32_t>(t).subspan(i * 16, 16));
    EXPECT_EQ(prev, keys[i]) << i;
  }
}

TEST(segment_keys, validate_requires_a_multiple_of_the_block_size) {
  EXPECT_TRUE(validate(config(64), 16).ok());
  EXPECT_EQ(validate(config(24), 16).code, errc::invalid_argument);
  EXPECT_EQ(validate(config(0), 16).code, errc::invalid_argument);
  EXPECT_EQ(validate(config(16), 0).code, errc::invalid_argument);
}

TEST(segment_keys, generated_segments_are_keyed_apart_from_prompt_segments) {
  auto t = tokens(16 * 4);
  const auto prompt_keys = segment_keys(config(), t);
  // A 40-token prompt: segments 0 and 1 end inside it and keep their prompt keys; 2 and 3 hold
  // decode-computed KV and differ from a 64-token prompt's keys.
  auto keys = sequence_segment_keys(config(), t, 40);
  ASSERT_EQ(keys.size(), 4u);
  EXPECT_EQ(keys[0], prompt_keys[0]);
  EXPECT_EQ(keys[1], prompt_keys[1]);
  EXPECT_NE(keys[2], prompt_keys[2]);
  EXPECT_NE(keys[3], prompt_keys[3]);
  // Where the prompt ended is part of the key of every later segment.
  auto other = sequence_segment_keys(config(), t, 41);
  EXPECT_EQ(other[1], keys[1]);
  EXPECT_NE(other[2], keys[2]);
  EXPECT_NE(other[3], keys[3]);
  // A whole prompt has its prompt keys; the keys agree with a longer sequence's leading ones.
  EXPECT_EQ(sequence_segment_keys(config(), t, t.size()), prompt_keys);
  auto longer = tokens(16 * 6);
  auto lk = sequence_segment_keys(config(), longer, 40);
  EXPECT_EQ(std::vector<uint64_t>(lk.begin(), lk.begin() + 4), keys);
}

TEST(segment_keys, usable_segments_leave_tokens_to_compute) {
  // A prompt alone: two prompt tokens are always left.
  EXPECT_EQ(usable_segments(34, 34, 16), 2u);
  EXPECT_EQ(usable_segments(33, 33, 16), 1u);
  EXPECT_EQ(usable_segments(17, 17, 16), 0u);
  // Resumed: past the prompt, one token left is enough; never one prompt token alone.
  EXPECT_EQ(usable_segments(20, 49, 16), 3u);
  EXPECT_EQ(usable_segments(20, 48, 16), 2u);
  EXPECT_EQ(usable_segments(33, 40, 16), 1u);  // 32 would leave one prompt token
  EXPECT_EQ(usable_segments(32, 40, 16), 2u);  // the whole prompt, 8 generated to replay
  EXPECT_EQ(usable_segments(10, 12, 16), 0u);
  EXPECT_EQ(usable_segments(10, 12, 0), 0u);
}

}  // namespace
}  // namespace weft::cache
