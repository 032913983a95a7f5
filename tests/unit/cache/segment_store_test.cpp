#include <gtest/gtest.h>

#include <cstddef>
#include <map>
#include <vector>

#include "actors/cache/segment_store.hpp"

namespace weft::cache {
namespace {

constexpr int64_t seg_bytes = 64;

std::vector<std::byte> bytes_for(uint64_t key, size_t n = seg_bytes) {
  std::vector<std::byte> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((key * 31 + i) & 0xff);
  return b;
}

segment_store make_store(int32_t n_slots, int32_t slots_per_chunk = 64) {
  auto s = segment_store::create(segment_store_config{.capacity_bytes = n_slots * seg_bytes,
                                                      .segment_bytes = seg_bytes,
                                                      .slots_per_chunk = slots_per_chunk});
  EXPECT_TRUE(s.ok());
  return std::move(s).value();
}

bool holds(segment_store& s, uint64_t key) {
  auto got = s.get(key);
  if (!got) return false;
  auto want = bytes_for(key);
  return got->size() == want.size() && std::equal(got->begin(), got->end(), want.begin());
}

TEST(segment_store, create_validates_sizes) {
  EXPECT_EQ(segment_store::create({.capacity_bytes = 10, .segment_bytes = 64}).error().code,
            errc::invalid_argument);
  EXPECT_EQ(segment_store::create({.capacity_bytes = 64, .segment_bytes = 0}).error().code,
            errc::invalid_argument);
  EXPECT_EQ(
      segment_store::create({.capacity_bytes = 640, .segment_bytes = 64, .slots_per_chunk = 0})
          .error()
          .code,
      errc::invalid_argument);
  EXPECT_EQ(make_store(10).n_slots(), 10);
}

TEST(segment_store, put_get_roundtrip_and_stats) {
  auto s = make_store(4);
  ASSERT_TRUE(s.put(7, bytes_for(7)).ok());
  auto shorter = bytes_for(8, 10);
  ASSERT_TRUE(s.put(8, shorter).ok());
  EXPECT_TRUE(holds(s, 7));
  auto got = s.get(8);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->size(), 10u);
  EXPECT_EQ(s.get(9).error().code, errc::not_found);
  auto st = s.stats();
  EXPECT_EQ(st.n_segments, 2);
  EXPECT_EQ(st.bytes_used, seg_bytes + 10);
  EXPECT_EQ(st.capacity_bytes, 4 * seg_bytes);
  EXPECT_EQ(st.hits, 2u);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_EQ(st.evictions, 0u);

  EXPECT_EQ(s.put(0, bytes_for(0)).code, errc::invalid_argument);
  EXPECT_EQ(s.put(9, bytes_for(9, seg_bytes + 1)).code, errc::invalid_argument);
  EXPECT_EQ(s.put(9, std::span<const std::byte>{}).code, errc::invalid_argument);
}

TEST(segment_store, evicts_least_recently_used) {
  auto s = make_store(4);
  for (uint64_t k = 1; k <= 4; ++k) ASSERT_TRUE(s.put(k, bytes_for(k)).ok());
  ASSERT_TRUE(s.get(1).ok());  // 2 is now the least recently used
  ASSERT_TRUE(s.put(5, bytes_for(5)).ok());
  EXPECT_FALSE(s.contains(2));
  EXPECT_TRUE(s.contains(1));
  ASSERT_TRUE(s.put(6, bytes_for(6)).ok());
  EXPECT_FALSE(s.contains(3));
  EXPECT_EQ(s.stats().evictions, 2u);
  EXPECT_EQ(s.stats().n_segments, 4);
  for (uint64_t k : {1, 4, 5, 6}) EXPECT_TRUE(holds(s, k)) << k;
}

TEST(segment_store, eviction_never_frees_a_leased_segment) {
  auto s = make_store(4);
  std::map<uint64_t, segment_lease> leases;
  for (uint64_t k = 1; k <= 4; ++k) {
    ASSERT_TRUE(s.put(k, bytes_for(k)).ok());
    auto l = s.lease(k, /*deadline_ms=*/k == 4 ? 100 : 1000);
    ASSERT_TRUE(l.ok());
    leases[k] = *l;
  }
  // Full of leased segments: put fails cleanly and changes nothing.
  auto refused = s.put(9, bytes_for(9));
  EXPECT_EQ(refused.code, errc::overloaded);
  EXPECT_FALSE(s.contains(9));
  for (uint64_t k = 1; k <= 4; ++k) {
    EXPECT_TRUE(holds(s, k)) << k;
    auto want = bytes_for(k);
    EXPECT_TRUE(std::equal(leases[k].bytes.begin(), leases[k].bytes.end(), want.begin()));
  }
  EXPECT_EQ(s.stats().evictions, 0u);
  EXPECT_EQ(s.stats().n_leased_segments, 4);

  // Releasing 2 then 1 makes 2 the least recently used unleased segment.
  ASSERT_TRUE(s.release(leases[2].lease_id).ok());
  ASSERT_TRUE(s.release(leases[1].lease_id).ok());
  ASSERT_TRUE(s.put(10, bytes_for(10)).ok());
  EXPECT_FALSE(s.contains(2));
  ASSERT_TRUE(s.put(11, bytes_for(11)).ok());
  EXPECT_FALSE(s.contains(1));
  // Only leased 3 and 4 plus the unleased newcomers are left: 10 goes next, never 3 or 4.
  ASSERT_TRUE(s.put(12, bytes_for(12)).ok());
  EXPECT_FALSE(s.contains(10));
  EXPECT_TRUE(s.contains(3));
  EXPECT_TRUE(s.contains(4));

  // The deadline of 4's lease passes: after expire it is evictable, and it is the LRU one.
  EXPECT_EQ(s.expire(99), 0u);
  EXPECT_EQ(s.expire(100), 1u);
  EXPECT_FALSE(s.leased(4));
  EXPECT_TRUE(s.leased(3));
  ASSERT_TRUE(s.get(11).ok());
  ASSERT_TRUE(s.get(12).ok());
  ASSERT_TRUE(s.put(13, bytes_for(13)).ok());
  EXPECT_FALSE(s.contains(4));
  EXPECT_TRUE(holds(s, 3));
  EXPECT_EQ(s.release(leases[4].lease_id).code, errc::not_found);  // already expired
}

TEST(segment_store, leased_segments_are_not_erased_or_overwritten) {
  auto s = make_store(4);
  ASSERT_TRUE(s.put(1, bytes_for(1)).ok());
  auto a = s.lease(1, 1000);
  auto b = s.lease(1, 2000);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->lease_id, b->lease_id);
  EXPECT_EQ(s.lease(2, 1000).error().code, errc::not_found);

  EXPECT_EQ(s.erase(1).code, errc::unavailable);
  EXPECT_EQ(s.put(1, bytes_for(2)).code, errc::already_exists);  // different bytes
  EXPECT_TRUE(s.put(1, bytes_for(1)).ok());                      // same bytes: a no-op
  EXPECT_TRUE(holds(s, 1));

  ASSERT_TRUE(s.release(a->lease_id).ok());
  EXPECT_TRUE(s.leased(1));  // b still holds it
  EXPECT_EQ(s.erase(1).code, errc::unavailable);
  EXPECT_EQ(s.release(a->lease_id).code, errc::not_found);
  ASSERT_TRUE(s.release(b->lease_id).ok());
  EXPECT_TRUE(s.erase(1).ok());
  EXPECT_FALSE(s.contains(1));
  EXPECT_EQ(s.erase(1).code, errc::not_found);
  EXPECT_EQ(s.stats().n_leases, 0);
}

TEST(segment_store, compact_keeps_leased_addresses_and_frees_empty_chunks) {
  auto s = make_store(8, /*slots_per_chunk=*/2);
  for (uint64_t k = 1; k <= 8; ++k) ASSERT_TRUE(s.put(k, bytes_for(k)).ok());
  EXPECT_EQ(s.stats().bytes_allocated, 8 * seg_bytes);
  // Slots fill in order, so key k sits in slot k-1. Lease 6 (chunk 2) and punch holes in front.
  auto pinned = s.lease(6, 1000);
  ASSERT_TRUE(pinned.ok());
  const std::byte* pinned_at = pinned->bytes.data();
  for (uint64_t k : {1, 2, 3, 5}) ASSERT_TRUE(s.erase(k).ok());
  auto live8 = s.get(8);
  ASSERT_TRUE(live8.ok());
  const std::byte* old8 = live8->data();

  auto report = s.compact();
  // 8 and 7 move into slots 0 and 1, 4 from slot 3 to slot 2; 6 (leased) stays in slot 5. Chunk 3
  // (slots 6, 7) is empty and returned; chunk 1 holds 4, chunk 2 holds 6.
  EXPECT_EQ(report.segments_moved, 3);
  EXPECT_EQ(report.bytes_freed, 2 * seg_bytes);
  EXPECT_EQ(s.stats().bytes_allocated, 6 * seg_bytes);
  EXPECT_TRUE(s.leased(6));
  auto again = s.get(6);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), pinned_at);
  EXPECT_NE(s.get(8)->data(), old8);
  for (uint64_t k : {4, 6, 7, 8}) EXPECT_TRUE(holds(s, k)) << k;
  EXPECT_EQ(s.stats().n_segments, 4);

  // After release, the pinned segment can move too.
  ASSERT_TRUE(s.release(pinned->lease_id).ok());
  auto second = s.compact();
  EXPECT_EQ(second.segments_moved, 1);  // 6 moves to slot 3, emptying chunk 2
  EXPECT_EQ(second.bytes_freed, 2 * seg_bytes);
  for (uint64_t k : {4, 6, 7, 8}) EXPECT_TRUE(holds(s, k)) << k;
  // Refilling reallocates chunks on demand.
  for (uint64_t k = 20; k < 24; ++k) ASSERT_TRUE(s.put(k, bytes_for(k)).ok());
  EXPECT_EQ(s.stats().evictions, 0u);
  for (uint64_t k : {4, 6, 7, 8, 20, 21, 22, 23}) EXPECT_TRUE(holds(s, k)) << k;
}

TEST(segment_store, compact_of_a_full_or_empty_store_is_a_no_op) {
  auto s = make_store(4, 2);
  EXPECT_EQ(s.compact().segments_moved, 0);
  for (uint64_t k = 1; k <= 4; ++k) ASSERT_TRUE(s.put(k, bytes_for(k)).ok());
  auto r = s.compact();
  EXPECT_EQ(r.segments_moved, 0);
  EXPECT_EQ(r.bytes_freed, 0);
}

}  // namespace
}  // namespace weft::cache
