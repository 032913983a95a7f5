// The overlapped all-reduce's buckets (gpu/train/gradient_buckets.hpp): groups are never split, a
// bucket closes once it reaches the cap, and buckets start strictly in order however the groups
// finish.
#include <gtest/gtest.h>

#include <vector>

#include "gpu/train/gradient_buckets.hpp"

namespace {

using weft::gpu::train::gradient_buckets;

// Four groups over six parameters; sizes in bytes.
gradient_buckets four_groups(int64_t cap) {
  const std::vector<int64_t> bytes = {10, 20, 30, 40, 50, 60};
  return gradient_buckets({{5}, {3, 4}, {1, 2}, {0}}, bytes, cap);
}

TEST(gradient_buckets, cut_at_group_boundaries_once_the_cap_is_reached) {
  auto b = four_groups(100);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b.params(0), (std::vector<int>{5, 3, 4}));  // 60 + 40 + 50 = 150 >= 100
  EXPECT_EQ(b.bytes(0), 150);
  EXPECT_EQ(b.params(1), (std::vector<int>{1, 2, 0}));  // the rest, under the cap
  EXPECT_EQ(b.bytes(1), 60);
  auto one = four_groups(0);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one.params(0), (std::vector<int>{5, 3, 4, 1, 2, 0}));
  auto each = four_groups(1);
  EXPECT_EQ(each.size(), 4u);
}

TEST(gradient_buckets, start_in_order_whatever_order_the_groups_finish_in) {
  auto b = four_groups(1);                 // a bucket per group
  EXPECT_TRUE(b.finish_group(1).empty());  // bucket 0 waits for group 0
  EXPECT_TRUE(b.finish_group(3).empty());
  EXPECT_EQ(b.finish_group(0), (std::vector<size_t>{0, 1}));
  EXPECT_TRUE(b.finish_group(0).empty());  // told again: nothing new
  EXPECT_FALSE(b.all_started());
  EXPECT_EQ(b.finish_group(2), (std::vector<size_t>{2, 3}));
  EXPECT_TRUE(b.all_started());
  b.reset();
  EXPECT_FALSE(b.all_started());
  EXPECT_EQ(b.finish_group(0), (std::vector<size_t>{0}));
  EXPECT_EQ(b.finish_all(), (std::vector<size_t>{1, 2, 3}));
  EXPECT_TRUE(b.finish_all().empty());
}

TEST(gradient_buckets, a_bucket_of_several_groups_waits_for_its_last) {
  auto b = four_groups(100);
  EXPECT_TRUE(b.finish_group(0).empty());
  EXPECT_EQ(b.finish_group(1), (std::vector<size_t>{0}));
  EXPECT_TRUE(b.finish_group(2).empty());
  EXPECT_EQ(b.finish_group(3), (std::vector<size_t>{1}));
}

}  // namespace
