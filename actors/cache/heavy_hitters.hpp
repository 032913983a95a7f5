#pragma once
/// Access-rate sketch that finds hot segments: Space-Saving (Metwally, Agrawal, El Abbadi, ICDT'05)
/// with exponential decay.
///
/// Keeps at most `capacity` counters. A recorded key that is not monitored takes over the counter
/// with the smallest count c and starts at c + 1 with error c, so every count over-estimates the
/// true (decayed) access count by at most its error, and every key whose count exceeds
/// total / capacity is monitored. Every `window` records all counts, errors and the total are
/// halved, so the sketch measures recent rates and a key that cooled down stops being hot.
///
/// A key is hot when its guaranteed count (count - error, a lower bound) is at least
/// `min_count` and at least `hot_share` of the recent total: on a uniform stream nothing is hot.
///
/// Plain C++, deterministic. Not thread-safe: one owner (the pool directory actor).

#include <cstddef>
#include <cstdint>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace weft::cache {

/// Settings of the sketch.
struct heavy_hitters_config {
  /// Counters kept (> 0); keys with a share above 1/capacity are always monitored.
  size_t capacity = 1024;
  /// Records between halvings (> 0).
  uint64_t window = 65'536;
  /// Share of the recent accesses that makes a key hot.
  double hot_share = 0.01;
  /// Guaranteed count below which a key is never hot (avoids "hot" after a handful of reads).
  uint64_t min_count = 16;
};

/// One monitored key.
struct heavy_hitter {
  uint64_t key = 0;
  uint64_t count = 0;  ///< upper bound of the recent access count
  uint64_t error = 0;  ///< count - error is a lower bound
};

/// Space-Saving top-k with periodic halving.
class heavy_hitters {
 public:
  explicit heavy_hitters(heavy_hitters_config cfg = {});

  /// Counts one access of `key`.
  void record(uint64_t key);

  /// Upper bound of the key's recent access count; 0 if it is not monitored.
  uint64_t estimate(uint64_t key) const;

  /// Lower bound of the key's recent access count (count - error); 0 if it is not monitored.
  uint64_t guaranteed(uint64_t key) const;

  /// True when the key's guaranteed count is >= min_count and >= hot_share * recent total.
  bool hot(uint64_t key) const;

  /// The n monitored keys with the highest counts, highest first (ties: smaller key first).
  std::vector<heavy_hitter> top(size_t n) const;

  /// Recent (decayed) number of accesses.
  uint64_t total() const { return total_; }
  size_t n_monitored() const { return counters_.size(); }
  const heavy_hitters_config& config() const { return cfg_; }

 private:
  struct counter {
    uint64_t count = 0;
    uint64_t error = 0;
  };

  void halve();

  heavy_hitters_config cfg_;
  std::unordered_map<uint64_t, counter> counters_;
  std::set<std::pair<uint64_t, uint64_t>> by_count_;  // (count, key): begin() is the minimum
  uint64_t total_ = 0;
  uint64_t since_halving_ = 0;
};

}  // namespace weft::cache
