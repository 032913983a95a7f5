#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "actors/cache/placement.hpp"

namespace weft::cache {
namespace {

// Well-spread keys, as segment_keys() would produce.
uint64_t key_of(uint64_t i) {
  return (i + 1) * 0x9E3779B97F4A7C15ULL;
}

placement ring(int n_shards, double epsilon = 0.25) {
  placement p(placement_config{.vnodes_per_shard = 64, .epsilon = epsilon});
  for (int s = 0; s < n_shards; ++s) EXPECT_TRUE(p.add_shard(static_cast<shard_id>(s)).ok());
  return p;
}

void assign_keys(placement& p, int n_keys) {
  for (int i = 0; i < n_keys; ++i) ASSERT_TRUE(p.assign(key_of(i)).ok());
}

int64_t ceil_bound(double epsilon, int64_t keys, int64_t shards) {
  return static_cast<int64_t>(std::ceil((1 + epsilon) * static_cast<double>(keys) / shards - 1e-9));
}

std::map<uint64_t, shard_id> owners(const placement& p, int n_keys) {
  std::map<uint64_t, shard_id> out;
  for (int i = 0; i < n_keys; ++i) out[key_of(i)] = *p.owner(key_of(i));
  return out;
}

TEST(placement, bounded_load_over_10k_keys_and_8_shards) {
  for (double eps : {0.25, 0.1}) {
    auto p = ring(8, eps);
    assign_keys(p, 10'000);
    EXPECT_EQ(p.n_assigned(), 10'000);
    int64_t sum = 0;
    for (shard_id s : p.shard_ids()) sum += p.load(s);
    EXPECT_EQ(sum, 10'000);
    EXPECT_LE(p.max_load(), ceil_bound(eps, 10'000, 8)) << "epsilon " << eps;
    EXPECT_EQ(p.load_bound(), ceil_bound(eps, 10'000, 8));
  }
}

TEST(placement, assignment_is_deterministic_and_sticky) {
  auto a = ring(8);
  auto b = ring(8);
  assign_keys(a, 2000);
  assign_keys(b, 2000);
  EXPECT_EQ(owners(a, 2000), owners(b, 2000));
  // Re-assigning a key keeps its shard and does not count it twice.
  auto before = *a.owner(key_of(5));
  EXPECT_EQ(*a.assign(key_of(5)), before);
  EXPECT_EQ(a.n_assigned(), 2000);
  EXPECT_EQ(*a.home(key_of(5)), before);
}

TEST(placement, removing_a_shard_moves_only_its_keys) {
  auto p = ring(8);
  assign_keys(p, 10'000);
  auto before = owners(p, 10'000);
  const int64_t its_load = p.load(3);
  auto moves = p.remove_shard(3);
  ASSERT_TRUE(moves.ok());
  EXPECT_EQ(static_cast<int64_t>(moves->size()), its_load);
  for (const auto& m : *moves) {
    EXPECT_EQ(m.from, 3u);
    EXPECT_NE(m.to, 3u);
  }
  auto after = owners(p, 10'000);
  int changed = 0;
  for (const auto& [k, s] : before) {
    if (s != 3) {
      EXPECT_EQ(after[k], s);
    }
    changed += after[k] != s;
  }
  EXPECT_EQ(changed, its_load);
  EXPECT_EQ(p.n_shards(), 7u);
  EXPECT_LE(p.max_load(), ceil_bound(0.25, 10'000, 7));
}

TEST(placement, adding_a_shard_moves_about_one_nth_of_the_keys) {
  auto p = ring(8);
  assign_keys(p, 10'000);
  auto before = owners(p, 10'000);
  auto moves = p.add_shard(8);
  ASSERT_TRUE(moves.ok());
  const double ideal = 10'000.0 / 9;
  EXPECT_GT(static_cast<double>(moves->size()), 0.5 * ideal);
  EXPECT_LE(static_cast<int64_t>(moves->size()), ceil_bound(0.25, 10'000, 9));
  for (const auto& m : *moves) EXPECT_EQ(m.to, 8u);
  auto after = owners(p, 10'000);
  size_t changed = 0;
  for (const auto& [k, s] : before) changed += after[k] != s;
  EXPECT_EQ(changed, moves->size());
  EXPECT_EQ(p.load(8), static_cast<int64_t>(moves->size()));
  EXPECT_LE(p.max_load(), ceil_bound(0.25, 10'000, 9));
}

TEST(placement, rebalance_restores_the_bound_after_unassigns) {
  auto p = ring(4);
  assign_keys(p, 4000);
  // Drop most keys of every shard but shard 0.
  for (int i = 0; i < 4000; ++i)
    if (*p.owner(key_of(i)) != 0 && i % 10 != 0) {
      ASSERT_TRUE(p.unassign(key_of(i)).ok());
    }
  EXPECT_GT(p.max_load(), p.load_bound());
  auto moves = p.rebalance();
  EXPECT_FALSE(moves.empty());
  for (const auto& m : moves) EXPECT_EQ(m.from, 0u);
  EXPECT_LE(p.max_load(), p.load_bound());
  EXPECT_EQ(p.unassign(key_of(1'000'000)).code, errc::not_found);
}

TEST(placement, membership_errors) {
  placement p;
  EXPECT_EQ(p.home(1).error().code, errc::unavailable);
  EXPECT_EQ(p.assign(1).error().code, errc::unavailable);
  ASSERT_TRUE(p.add_shard(1).ok());
  EXPECT_EQ(p.add_shard(1).error().code, errc::already_exists);
  EXPECT_EQ(p.remove_shard(2).error().code, errc::not_found);
  ASSERT_TRUE(p.assign(42).ok());
  EXPECT_EQ(p.remove_shard(1).error().code, errc::unavailable);
  ASSERT_TRUE(p.unassign(42).ok());
  EXPECT_TRUE(p.remove_shard(1).ok());
  EXPECT_EQ(p.n_shards(), 0u);
}

TEST(placement, replicas_are_distinct_home_first_and_least_loaded) {
  auto p = ring(6);
  assign_keys(p, 3000);
  // Skew total loads: shards 2 and 4 take many replicas.
  for (int i = 0; i < 400; ++i) {
    for (shard_id s : {2u, 4u})
      if (*p.owner(key_of(i)) != s) {
        ASSERT_TRUE(p.add_replica(key_of(i), s).ok());
      }
  }
  for (int i = 0; i < 200; ++i) {
    const uint64_t key = key_of(i);
    auto r = p.replicas(key, 3);
    ASSERT_EQ(r.size(), 3u);
    EXPECT_EQ(r[0], *p.owner(key));
    EXPECT_EQ(std::set<shard_id>(r.begin(), r.end()).size(), 3u);
    // The chosen others are no more loaded than any shard left out.
    auto total = [&](shard_id s) { return p.load(s) + p.replica_load(s); };
    int64_t worst_chosen = std::max(total(r[1]), total(r[2]));
    for (shard_id s : p.shard_ids()) {
      if (std::find(r.begin(), r.end(), s) != r.end()) continue;
      EXPECT_LE(worst_chosen, total(s));
    }
    EXPECT_TRUE(std::find(r.begin() + 1, r.end(), 2u) == r.end());
    EXPECT_TRUE(std::find(r.begin() + 1, r.end(), 4u) == r.end());
  }
  EXPECT_EQ(p.replicas(key_of(0), 10).size(), 6u);
  EXPECT_TRUE(p.replicas(key_of(0), 0).empty());
}

TEST(placement, replica_bookkeeping) {
  auto p = ring(4);
  const uint64_t key = key_of(7);
  EXPECT_EQ(p.add_replica(key, 1).code, errc::not_found);  // not assigned
  const shard_id home = *p.assign(key);
  EXPECT_EQ(p.add_replica(key, home).code, errc::already_exists);
  const shard_id other = (home + 1) % 4;
  ASSERT_TRUE(p.add_replica(key, other).ok());
  EXPECT_EQ(p.add_replica(key, other).code, errc::already_exists);
  EXPECT_EQ(p.add_replica(key, 99).code, errc::not_found);
  EXPECT_EQ(p.locations(key), (std::vector<shard_id>{home, other}));
  EXPECT_EQ(p.replica_load(other), 1);
  // Removing the replica's shard drops the replica.
  ASSERT_TRUE(p.remove_shard(other).ok());
  EXPECT_EQ(p.locations(key).size(), 1u);
  ASSERT_TRUE(p.unassign(key).ok());
  EXPECT_TRUE(p.locations(key).empty());
}

TEST(placement, pick_replica_prefers_least_outstanding) {
  std::vector<shard_id> replicas{3, 5, 7};
  std::vector<int64_t> outstanding{5, 1, 3};
  for (uint64_t seq = 0; seq < 10; ++seq)
    EXPECT_EQ(pick_replica(42, replicas, outstanding, seq), 1u);
  EXPECT_EQ(pick_replica(42, {}, {}, 0), 0u);
  // Deterministic given its inputs.
  std::vector<int64_t> idle{0, 0, 0};
  EXPECT_EQ(pick_replica(42, replicas, idle, 17), pick_replica(42, replicas, idle, 17));
}

TEST(placement, reads_of_a_hot_key_spread_evenly_over_its_replicas) {
  auto p = ring(8);
  assign_keys(p, 1000);
  const uint64_t hot = key_of(3);
  auto r = p.replicas(hot, 4);
  ASSERT_EQ(r.size(), 4u);

  // Reads that finish at once: the tie-break rotates.
  std::vector<int64_t> idle(r.size(), 0);
  std::vector<int> served(r.size(), 0);
  for (uint64_t seq = 0; seq < 4000; ++seq) served[pick_replica(hot, r, idle, seq)] += 1;
  for (int n : served) EXPECT_EQ(n, 1000);

  // Reads that queue up: each replica finishes one read per tick while 4 arrive per tick.
  std::vector<int64_t> outstanding(r.size(), 0);
  std::fill(served.begin(), served.end(), 0);
  uint64_t seq = 0;
  for (int tick = 0; tick < 1000; ++tick) {
    for (int i = 0; i < 5; ++i) {  // 5 arrivals: more than the replicas drain, so queues build
      size_t at = pick_replica(hot, r, outstanding, seq++);
      outstanding[at] += 1;
      served[at] += 1;
    }
    for (auto& o : outstanding) o = std::max<int64_t>(0, o - 1);
    int64_t lo = *std::min_element(outstanding.begin(), outstanding.end());
    int64_t hi = *std::max_element(outstanding.begin(), outstanding.end());
    EXPECT_LE(hi - lo, 1);
  }
  for (int n : served) EXPECT_NEAR(n, 1250, 2);
}

}  // namespace
}  // namespace weft::cache
