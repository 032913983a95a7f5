#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "actors/cache/directory.hpp"

namespace weft::cache {
namespace {

uint64_t key_of(uint64_t i) {
  return (i + 1) * 0x9E3779B97F4A7C15ULL;
}

directory_config small(uint32_t replicas = 2, size_t capacity = 4096) {
  directory_config c;
  c.max_replicas = replicas;
  c.capacity = capacity;
  c.hot.min_count = 8;
  c.hot.hot_share = 0.05;
  return c;
}

pool_directory with_shards(int n, directory_config cfg) {
  pool_directory d(cfg);
  for (int s = 0; s < n; ++s) d.add_shard(static_cast<shard_id>(100 + s));
  return d;
}

TEST(pool_directory, no_shards_routes_nothing) {
  pool_directory d(small());
  const std::vector<uint64_t> keys = {key_of(0), key_of(1)};
  EXPECT_TRUE(d.route(keys).empty());
  EXPECT_TRUE(d.take_replica_orders().empty());
}

TEST(pool_directory, homes_obey_the_load_bound_and_are_sticky) {
  auto d = with_shards(4, small(1));
  std::vector<uint64_t> keys;
  for (int i = 0; i < 2000; ++i) keys.push_back(key_of(i));
  const auto first = d.route(keys);
  ASSERT_EQ(first.size(), keys.size());
  const auto bound = static_cast<int64_t>(std::ceil(1.1 * 2000 / 4.0));
  for (int s = 0; s < 4; ++s) EXPECT_LE(d.load(static_cast<shard_id>(100 + s)), bound);
  const auto again = d.route(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(again[i].home, first[i].home);
    EXPECT_EQ(again[i].read, first[i].home);  // no replicas: reads go home
  }
}

TEST(pool_directory, placing_written_keys_homes_them_without_making_them_hot) {
  auto d = with_shards(4, small(2));
  auto twin = with_shards(4, small(2));
  const uint64_t k = key_of(7);
  std::vector<segment_route> placed;
  for (int i = 0; i < 40; ++i) {
    const std::vector<uint64_t> keys = {k, key_of(1000 + i)};
    placed = d.place(keys);
    ASSERT_EQ(placed.size(), 2u);
    EXPECT_EQ(placed[0].read, placed[0].home);
  }
  EXPECT_TRUE(d.take_replica_orders().empty()) << "writes are not reads";
  EXPECT_EQ(d.hot_keys(), 0u);
  // The same home a read would have given it; a later read finds it there.
  const std::vector<uint64_t> just_k = {k};
  EXPECT_EQ(twin.route(just_k)[0].home, placed[0].home);
  const auto read = d.route(just_k);
  ASSERT_EQ(read.size(), 1u);
  EXPECT_EQ(read[0].home, placed[0].home);
  EXPECT_EQ(read[0].read, placed[0].home);
}

TEST(pool_directory, a_hot_key_gets_a_replica_and_reads_spread_over_both) {
  auto d = with_shards(4, small(2));
  const uint64_t hot = key_of(7);
  std::vector<replica_order> orders;
  for (int i = 0; i < 40 && orders.empty(); ++i) {
    const std::vector<uint64_t> keys = {hot, key_of(1000 + i)};
    (void)d.route(keys);
    orders = d.take_replica_orders();
  }
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(orders[0].key, hot);
  EXPECT_NE(orders[0].from, orders[0].to);
  // While the order is in flight no second order for the same key.
  const std::vector<uint64_t> just_hot = {hot};
  (void)d.route(just_hot);
  EXPECT_TRUE(d.take_replica_orders().empty());
  d.replica_done(hot, orders[0].to, true);
  EXPECT_EQ(d.locations(hot).size(), 2u);
  EXPECT_EQ(d.replicated_keys(), 1u);
  EXPECT_EQ(d.replicas(), 1);
  std::map<shard_id, int> reads;
  for (int i = 0; i < 10; ++i) reads[d.route(just_hot).at(0).read]++;
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(reads[orders[0].from], 5);
  EXPECT_EQ(reads[orders[0].to], 5);
  // Capped at max_replicas: no further orders.
  (void)d.route(just_hot);
  EXPECT_TRUE(d.take_replica_orders().empty());
}

TEST(pool_directory, a_failed_order_is_retried_later) {
  auto d = with_shards(3, small(2));
  const uint64_t hot = key_of(3);
  const std::vector<uint64_t> keys = {hot};
  std::vector<replica_order> orders;
  for (int i = 0; i < 40 && orders.empty(); ++i) {
    (void)d.route(keys);
    orders = d.take_replica_orders();
  }
  ASSERT_EQ(orders.size(), 1u);
  d.replica_done(hot, orders[0].to, false);
  EXPECT_EQ(d.locations(hot).size(), 1u);
  (void)d.route(keys);
  EXPECT_EQ(d.take_replica_orders().size(), 1u);
}

TEST(pool_directory, a_uniform_stream_makes_no_replicas) {
  auto d = with_shards(4, small(2));
  for (int i = 0; i < 3000; ++i) {
    const std::vector<uint64_t> keys = {key_of(i % 500)};
    (void)d.route(keys);
    EXPECT_TRUE(d.take_replica_orders().empty());
  }
}

TEST(pool_directory, forgets_the_least_recently_routed_beyond_capacity) {
  auto d = with_shards(2, small(1, 100));
  for (int i = 0; i < 250; ++i) {
    const std::vector<uint64_t> keys = {key_of(i)};
    (void)d.route(keys);
  }
  EXPECT_EQ(d.tracked_keys(), 100u);
  EXPECT_TRUE(d.locations(key_of(0)).empty());
  EXPECT_EQ(d.locations(key_of(249)).size(), 1u);
  EXPECT_EQ(d.load(100) + d.load(101), 100);
}

TEST(pool_directory, a_dead_shard_rehomes_only_its_keys_and_drops_its_replicas) {
  auto d = with_shards(3, small(1));
  std::vector<uint64_t> keys;
  for (int i = 0; i < 300; ++i) keys.push_back(key_of(i));
  const auto before = d.route(keys);
  d.remove_shard(101);
  const auto after = d.route(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_NE(after[i].home, 101u);
    if (before[i].home != 101u) {
      EXPECT_EQ(after[i].home, before[i].home);
    }
  }
  d.remove_shard(100);
  d.remove_shard(102);
  EXPECT_EQ(d.n_shards(), 0u);
  EXPECT_EQ(d.tracked_keys(), 0u);
  EXPECT_TRUE(d.route(keys).empty());
}

// Two shards without replicas, `moves` copies in flight at most, 90 keys.
pool_directory two_shards_for_moves(uint32_t moves, std::vector<uint64_t>& keys) {
  auto cfg = small(1);
  cfg.max_moves_in_flight = moves;
  keys.clear();
  for (int i = 0; i < 90; ++i) keys.push_back(key_of(i));
  return with_shards(2, cfg);
}

TEST(pool_directory, keys_a_joining_shard_takes_over_are_read_where_they_are_until_copied) {
  std::vector<uint64_t> keys;
  auto d = two_shards_for_moves(3, keys);
  const auto before = d.route(keys);
  d.add_shard(102);  // e.g. a restarted shard, empty
  const size_t moved = d.pending_moves();
  ASSERT_GT(moved, 0u);
  const auto during = d.route(keys);
  size_t to_new = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (during[i].home != 102u) {
      EXPECT_EQ(during[i].home, before[i].home);  // only keys that moved changed home
      continue;
    }
    ++to_new;
    EXPECT_EQ(during[i].read, before[i].home);  // still read where the segment is
  }
  EXPECT_EQ(to_new, moved);
  // Copies go out a few at a time: never more than the in-flight limit.
  std::map<uint64_t, replica_order> orders;
  for (int round = 0; d.pending_moves() > 0 && round < 100; ++round) {
    const auto batch = d.take_replica_orders();
    ASSERT_LE(batch.size(), 3u);
    ASSERT_FALSE(batch.empty());
    for (const auto& o : batch) {
      EXPECT_EQ(o.to, 102u);
      orders[o.key] = o;
      // Every second copy fails: the key is then simply a miss on its new home.
      const bool ok = (orders.size() % 2) == 0;
      EXPECT_EQ(d.replica_done(o.key, o.to, ok), copy_kind::move);
    }
  }
  EXPECT_EQ(orders.size(), moved);
  EXPECT_EQ(d.pending_moves(), 0u);
  const auto after = d.route(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(after[i].home, during[i].home);
    EXPECT_EQ(after[i].read, after[i].home);  // one location each (replicas off)
  }
}

TEST(pool_directory, a_move_whose_source_dies_is_dropped) {
  std::vector<uint64_t> keys;
  auto d = two_shards_for_moves(100, keys);
  (void)d.route(keys);
  d.add_shard(102);
  ASSERT_GT(d.pending_moves(), 0u);
  const auto orders = d.take_replica_orders();
  EXPECT_EQ(orders.size(), d.pending_moves());
  d.remove_shard(100);
  d.remove_shard(101);
  EXPECT_EQ(d.pending_moves(), 0u);
  // A late report of a dropped move is harmless.
  for (const auto& o : orders) EXPECT_EQ(d.replica_done(o.key, o.to, true), copy_kind::replica);
  for (const auto& r : d.route(keys)) EXPECT_EQ(r.read, 102u);
}

TEST(pool_directory, rebalance_moves_keys_off_a_shard_that_forgetting_left_above_the_bound) {
  auto d = with_shards(2, small(1, 60));
  std::vector<uint64_t> keys;
  for (int i = 0; i < 60; ++i) keys.push_back(key_of(i));
  const auto first = d.route(keys);
  std::vector<uint64_t> on_b;
  for (const auto& r : first) {
    if (r.home == 101u) on_b.push_back(r.key);
  }
  ASSERT_GT(on_b.size(), 10u);
  ASSERT_LT(on_b.size(), 50u);
  EXPECT_EQ(d.rebalance(), 0u);  // balanced: nothing to do
  // Shard 100's keys become the least recently routed and are forgotten: 101 is above the bound.
  (void)d.route(on_b);
  d.set_capacity(on_b.size() + 1);
  const std::vector<uint64_t> fresh = {key_of(1000)};  // a new key makes the directory forget
  (void)d.route(fresh);
  const auto total = static_cast<int64_t>(on_b.size() + 1);
  EXPECT_LE(d.load(100), 1);
  EXPECT_GE(d.load(101), static_cast<int64_t>(on_b.size()));
  const size_t moved = d.rebalance();
  ASSERT_GT(moved, 0u);
  EXPECT_EQ(d.pending_moves(), moved);
  EXPECT_LE(d.load(101), (total * 11 + 19) / 20);  // 1.1 x the mean, rounded up
  EXPECT_EQ(d.load(100) + d.load(101), total);
  // Moved keys are read where they are until copied, then from their new home.
  std::map<uint64_t, shard_id> new_home;
  for (const auto& r : d.route(on_b)) {
    EXPECT_EQ(r.read, 101u);
    if (r.home == 100u) new_home[r.key] = r.home;
  }
  EXPECT_EQ(new_home.size(), moved);
  size_t copied = 0;
  for (int round = 0; d.pending_moves() > 0 && round < 100; ++round) {
    for (const auto& o : d.take_replica_orders()) {
      EXPECT_EQ(o.from, 101u);
      EXPECT_EQ(o.to, 100u);
      EXPECT_EQ(d.replica_done(o.key, o.to, true), copy_kind::move);
      ++copied;
    }
  }
  EXPECT_EQ(copied, moved);
  for (const auto& r : d.route(on_b)) EXPECT_EQ(r.read, r.home);
  EXPECT_EQ(d.rebalance(), 0u);
}

}  // namespace
}  // namespace weft::cache
