#include "actors/cache/placement.hpp"

#include <xxhash.h>
#include <algorithm>
#include <cmath>
#include <string>

namespace weft::cache {
namespace {

uint64_t hash_words(uint64_t a, uint64_t b, uint64_t seed) {
  unsigned char buf[16];
  for (int i = 0; i < 8; ++i) {
    buf[i] = static_cast<unsigned char>(a >> (8 * i));
    buf[8 + i] = static_cast<unsigned char>(b >> (8 * i));
  }
  return XXH3_64bits_withSeed(buf, sizeof(buf), seed);
}

std::string shard_name(shard_id id) {
  return "shard " + std::to_string(id);
}

}  // namespace

placement::placement(placement_config cfg) : cfg_(cfg) {
  if (cfg_.vnodes_per_shard <= 0) cfg_.vnodes_per_shard = 1;
  if (!(cfg_.epsilon > 0)) cfg_.epsilon = 0.25;
}

int64_t placement::bound(int64_t n_keys) const {
  if (shards_.empty()) return 0;
  double mean = static_cast<double>(n_keys) / static_cast<double>(shards_.size());
  // The small slack keeps exact products (e.g. 1.5 * 2.0) from rounding up past the integer.
  auto b = static_cast<int64_t>(std::ceil((1.0 + cfg_.epsilon) * mean - 1e-9));
  return std::max<int64_t>(b, 1);
}

uint64_t placement::position(uint64_t key) const {
  return hash_words(key, ~0ULL, cfg_.seed);
}

std::vector<shard_id> placement::walk(uint64_t key) const {
  std::vector<shard_id> order;
  if (ring_.empty()) return order;
  order.reserve(shards_.size());
  const uint64_t pos = position(key);
  auto it = std::lower_bound(ring_.begin(), ring_.end(), pos,
                             [](const ring_point& p, uint64_t v) { return p.pos < v; });
  size_t start = static_cast<size_t>(it - ring_.begin());
  for (size_t i = 0; i < ring_.size() && order.size() < shards_.size(); ++i) {
    shard_id s = ring_[(start + i) % ring_.size()].shard;
    if (std::find(order.begin(), order.end(), s) == order.end()) order.push_back(s);
  }
  return order;
}

std::optional<shard_id> placement::first_below(uint64_t key, int64_t cap,
                                               std::optional<shard_id> skip) const {
  for (shard_id s : walk(key)) {
    if (skip && s == *skip) continue;
    if (shards_.at(s).load < cap) return s;
  }
  return std::nullopt;
}

void placement::move_key(uint64_t key, shard_id from, shard_id to) {
  shards_.at(from).load -= 1;
  shards_.at(to).load += 1;
  owner_[key] = to;
  // A replica on the new home is redundant now.
  if (auto r = replicas_.find(key); r != replicas_.end()) {
    auto& v = r->second;
    if (auto p = std::find(v.begin(), v.end(), to); p != v.end()) {
      v.erase(p);
      shards_.at(to).replica_load -= 1;
    }
    if (v.empty()) replicas_.erase(r);
  }
}

std::vector<uint64_t> placement::sorted_keys_of(std::optional<shard_id> shard) const {
  std::vector<uint64_t> keys;
  for (const auto& [k, s] : owner_)
    if (!shard || s == *shard) keys.push_back(k);
  std::sort(keys.begin(), keys.end());
  return keys;
}

// -- membership
// -------------------------------------------------------------------------------------

result<std::vector<key_move>> placement::add_shard(shard_id id) {
  if (shards_.count(id)) return make_error(errc::already_exists, shard_name(id) + " is present");
  shards_.emplace(id, shard_state{});
  for (int32_t v = 0; v < cfg_.vnodes_per_shard; ++v)
    ring_.push_back(ring_point{hash_words(id, static_cast<uint64_t>(v), cfg_.seed), id});
  std::sort(ring_.begin(), ring_.end(), [](const ring_point& a, const ring_point& b) {
    return a.pos != b.pos ? a.pos < b.pos : a.shard < b.shard;
  });

  // Keys whose walk reaches the new shard before their home move to it while it has room; other
  // shards only lose keys, so the bound holds everywhere.
  std::vector<key_move> moves;
  const int64_t cap = bound(n_assigned_);
  for (uint64_t key : sorted_keys_of(std::nullopt)) {
    if (shards_.at(id).load >= cap) break;
    const shard_id home_now = owner_.at(key);
    for (shard_id s : walk(key)) {
      if (s == home_now) break;
      if (s == id) {
        moves.push_back(key_move{key, home_now, id});
        move_key(key, home_now, id);
        break;
      }
    }
  }
  return moves;
}

result<std::vector<key_move>> placement::remove_shard(shard_id id) {
  auto it = shards_.find(id);
  if (it == shards_.end()) return make_error(errc::not_found, shard_name(id) + " is unknown");
  if (shards_.size() == 1 && it->second.load > 0)
    return make_error(errc::unavailable, "cannot remove the last shard while it homes keys");

  // Drop replicas held on the removed shard.
  for (auto r = replicas_.begin(); r != replicas_.end();) {
    auto& v = r->second;
    v.erase(std::remove(v.begin(), v.end(), id), v.end());
    r = v.empty() ? replicas_.erase(r) : std::next(r);
  }
  std::vector<uint64_t> orphans = sorted_keys_of(id);
  shards_.erase(it);
  ring_.erase(std::remove_if(ring_.begin(), ring_.end(),
                             [id](const ring_point& p) { return p.shard == id; }),
              ring_.end());

  // Re-home orphans as if assigned afresh, in key order (deterministic).
  n_assigned_ -= static_cast<int64_t>(orphans.size());
  std::vector<key_move> moves;
  moves.reserve(orphans.size());
  for (uint64_t key : orphans) {
    shard_id to = *first_below(key, bound(n_assigned_ + 1));
    shards_.at(to).load += 1;
    n_assigned_ += 1;
    owner_[key] = to;
    if (auto r = replicas_.find(key); r != replicas_.end()) {
      auto& v = r->second;
      if (auto p = std::find(v.begin(), v.end(), to); p != v.end()) {
        v.erase(p);
        shards_.at(to).replica_load -= 1;
      }
      if (v.empty()) replicas_.erase(r);
    }
    moves.push_back(key_move{key, id, to});
  }
  return moves;
}

// -- keys
// -------------------------------------------------------------------------------------------

result<shard_id> placement::home(uint64_t key) const {
  if (auto it = owner_.find(key); it != owner_.end()) return it->second;
  if (shards_.empty()) return make_error(errc::unavailable, "no cache shards");
  // Total capacity n * bound(m+1) >= (1+eps)(m+1) > m, so some shard is below the bound.
  return *first_below(key, bound(n_assigned_ + 1));
}

result<shard_id> placement::assign(uint64_t key) {
  auto h = home(key);
  if (!h) return h;
  if (!owner_.count(key)) {
    owner_.emplace(key, *h);
    shards_.at(*h).load += 1;
    n_assigned_ += 1;
  }
  return h;
}

status placement::unassign(uint64_t key) {
  auto it = owner_.find(key);
  if (it == owner_.end()) return make_error(errc::not_found, "key is not assigned");
  shards_.at(it->second).load -= 1;
  n_assigned_ -= 1;
  owner_.erase(it);
  if (auto r = replicas_.find(key); r != replicas_.end()) {
    for (shard_id s : r->second) shards_.at(s).replica_load -= 1;
    replicas_.erase(r);
  }
  return {};
}

std::optional<shard_id> placement::owner(uint64_t key) const {
  if (auto it = owner_.find(key); it != owner_.end()) return it->second;
  return std::nullopt;
}

std::vector<key_move> placement::rebalance() {
  std::vector<key_move> moves;
  const int64_t cap = bound(n_assigned_);
  for (auto& [id, st] : shards_) {
    if (st.load <= cap) continue;
    for (uint64_t key : sorted_keys_of(id)) {
      if (st.load <= cap) break;
      // Prefer a shard below the bound; the bound admits every key, so one exists.
      auto to = first_below(key, cap, id);
      if (!to) break;
      moves.push_back(key_move{key, id, *to});
      move_key(key, id, *to);
    }
  }
  return moves;
}

// -- replicas
// ---------------------------------------------------------------------------------------

std::vector<shard_id> placement::replicas(uint64_t key, size_t k) const {
  std::vector<shard_id> out;
  auto h = home(key);
  if (!h || k == 0) return out;
  out.push_back(*h);
  std::vector<shard_id> order = walk(key);  // tie-break: ring order from the key
  std::vector<std::pair<int64_t, size_t>> ranked;
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] == *h) continue;
    const auto& st = shards_.at(order[i]);
    ranked.emplace_back(st.load + st.replica_load, i);
  }
  std::sort(ranked.begin(), ranked.end());
  for (size_t i = 0; i < ranked.size() && out.size() < k; ++i)
    out.push_back(order[ranked[i].second]);
  return out;
}

status placement::add_replica(uint64_t key, shard_id shard) {
  auto o = owner_.find(key);
  if (o == owner_.end()) return make_error(errc::not_found, "key is not assigned");
  auto s = shards_.find(shard);
  if (s == shards_.end()) return make_error(errc::not_found, shard_name(shard) + " is unknown");
  if (o->second == shard) return make_error(errc::already_exists, "shard is the key's home");
  auto& v = replicas_[key];
  if (std::find(v.begin(), v.end(), shard) != v.end())
    return make_error(errc::already_exists, shard_name(shard) + " already holds a replica");
  v.push_back(shard);
  s->second.replica_load += 1;
  return {};
}

status placement::drop_replica(uint64_t key, shard_id shard) {
  auto r = replicas_.find(key);
  if (r == replicas_.end()) return make_error(errc::not_found, "key has no replicas");
  auto& v = r->second;
  auto p = std::find(v.begin(), v.end(), shard);
  if (p == v.end()) return make_error(errc::not_found, shard_name(shard) + " holds no replica");
  v.erase(p);
  shards_.at(shard).replica_load -= 1;
  if (v.empty()) replicas_.erase(r);
  return {};
}

std::vector<shard_id> placement::locations(uint64_t key) const {
  std::vector<shard_id> out;
  auto o = owner_.find(key);
  if (o == owner_.end()) return out;
  out.push_back(o->second);
  if (auto r = replicas_.find(key); r != replicas_.end())
    out.insert(out.end(), r->second.begin(), r->second.end());
  return out;
}

// -- observers
// --------------------------------------------------------------------------------------

int64_t placement::load(shard_id id) const {
  auto it = shards_.find(id);
  return it == shards_.end() ? 0 : it->second.load;
}

int64_t placement::replica_load(shard_id id) const {
  auto it = shards_.find(id);
  return it == shards_.end() ? 0 : it->second.replica_load;
}

int64_t placement::max_load() const {
  int64_t m = 0;
  for (const auto& [id, st] : shards_) m = std::max(m, st.load);
  return m;
}

std::vector<shard_id> placement::shard_ids() const {
  std::vector<shard_id> ids;
  ids.reserve(shards_.size());
  for (const auto& [id, st] : shards_) ids.push_back(id);
  return ids;
}

size_t pick_replica(uint64_t key, std::span<const shard_id> replicas,
                    std::span<const int64_t> outstanding, uint64_t read_seq) {
  const size_t n = replicas.size();
  if (n == 0) return 0;
  const size_t start = static_cast<size_t>((hash_words(key, 0, 0) + read_seq) % n);
  size_t best = start;
  auto load_of = [&](size_t i) { return i < outstanding.size() ? outstanding[i] : 0; };
  for (size_t j = 1; j < n; ++j) {
    size_t i = (start + j) % n;
    if (load_of(i) < load_of(best)) best = i;
  }
  return best;
}

}  // namespace weft::cache
