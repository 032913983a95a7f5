#include "actors/cache/directory.hpp"

#include <algorithm>

namespace weft::cache {

pool_directory::pool_directory(directory_config cfg)
    : cfg_(cfg), placement_(cfg.placement), hot_(cfg.hot) {
  cfg_.max_replicas = std::max<uint32_t>(cfg_.max_replicas, 1);
  cfg_.capacity = std::max<size_t>(cfg_.capacity, 1);
}

void pool_directory::add_shard(shard_id id) {
  auto moved = placement_.add_shard(id);
  if (!moved) return;
  queue_moves(*moved);
}

size_t pool_directory::rebalance() {
  const auto moved = placement_.rebalance();
  queue_moves(moved);
  return moved.size();
}

void pool_directory::queue_moves(const std::vector<key_move>& moved) {
  for (const auto& m : moved) {
    auto it = moves_.find(m.key);
    if (it == moves_.end()) {
      moves_[m.key] = {m.from, m.to, false};
      move_queue_.push_back(m.key);
      continue;
    }
    // Moved again before its copy finished: the segment is still where the first move found it.
    // A copy in flight to the interim home becomes a replica there if it lands (replica_done).
    if (m.to == it->second.from) {
      drop_move(m.key);  // back home where it is held: nothing to copy
      continue;
    }
    if (it->second.ordered) {
      --moves_in_flight_;
      move_queue_.push_back(m.key);
    }
    it->second.to = m.to;
    it->second.ordered = false;
  }
}

void pool_directory::drop_move(uint64_t key) {
  auto it = moves_.find(key);
  if (it == moves_.end()) return;
  if (it->second.ordered) --moves_in_flight_;
  moves_.erase(it);  // a queued entry is skipped when the queue reaches it
}

void pool_directory::remove_shard(shard_id id) {
  if (placement_.n_shards() == 1 && placement_.shard_ids().front() == id) {
    // The last shard: nothing is held anywhere any more.
    placement_ = placement(cfg_.placement);
    lru_.clear();
    lru_pos_.clear();
    reads_.clear();
    ordered_.clear();
    candidates_.clear();
    moves_.clear();
    move_queue_.clear();
    moves_in_flight_ = 0;
    return;
  }
  (void)placement_.remove_shard(id);
  // Moves from or to the dead shard cannot complete: those keys are misses until published.
  std::vector<uint64_t> dead;
  for (const auto& [key, m] : moves_) {
    if (m.from == id || m.to == id) dead.push_back(key);
  }
  for (uint64_t key : dead) drop_move(key);
}

void pool_directory::touch(uint64_t key) {
  if (auto it = lru_pos_.find(key); it != lru_pos_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  lru_.push_front(key);
  lru_pos_[key] = lru_.begin();
  while (lru_.size() > cfg_.capacity) {
    const uint64_t old = lru_.back();
    lru_.pop_back();
    lru_pos_.erase(old);
    reads_.erase(old);
    drop_move(old);
    (void)placement_.unassign(old);
  }
}

std::vector<segment_route> pool_directory::route(std::span<const uint64_t> keys) {
  std::vector<segment_route> out;
  if (placement_.n_shards() == 0) return out;
  const size_t want = std::min<size_t>(cfg_.max_replicas, placement_.n_shards());
  out.reserve(keys.size());
  for (uint64_t key : keys) {
    touch(key);
    auto home = placement_.assign(key);
    if (!home) break;
    hot_.record(key);
    if (auto m = moves_.find(key); m != moves_.end()) {
      // Its new home does not hold it yet: read where it is, publish to the new home.
      out.push_back({key, m->second.from, *home});
      continue;
    }
    const auto locs = placement_.locations(key);
    const size_t i = pick_replica(key, locs, {}, reads_[key]++);
    out.push_back({key, locs.empty() ? *home : locs[i], *home});
    if (locs.size() < want && ordered_.count(key) == 0 && hot_.hot(key)) candidates_.push_back(key);
  }
  return out;
}

std::vector<segment_route> pool_directory::place(std::span<const uint64_t> keys) {
  std::vector<segment_route> out;
  if (placement_.n_shards() == 0) return out;
  out.reserve(keys.size());
  for (uint64_t key : keys) {
    touch(key);
    auto home = placement_.assign(key);
    if (!home) break;
    out.push_back({key, *home, *home});
  }
  return out;
}

std::vector<replica_order> pool_directory::take_replica_orders() {
  std::vector<replica_order> out;
  while (moves_in_flight_ < cfg_.max_moves_in_flight && !move_queue_.empty()) {
    const uint64_t key = move_queue_.front();
    move_queue_.pop_front();
    auto it = moves_.find(key);
    if (it == moves_.end() || it->second.ordered) continue;  // dropped, or queued twice
    it->second.ordered = true;
    ++moves_in_flight_;
    out.push_back({key, it->second.from, it->second.to});
  }
  std::vector<uint64_t> keys;
  keys.swap(candidates_);
  for (uint64_t key : keys) {
    auto home = placement_.owner(key);
    if (!home || ordered_.count(key) != 0 || moves_.count(key) != 0) continue;
    const auto locs = placement_.locations(key);
    for (shard_id s : placement_.replicas(key, locs.size() + 1)) {
      if (std::find(locs.begin(), locs.end(), s) != locs.end()) continue;
      out.push_back({key, *home, s});
      ordered_.insert(key);
      break;
    }
  }
  return out;
}

copy_kind pool_directory::replica_done(uint64_t key, shard_id to, bool ok) {
  if (auto it = moves_.find(key); it != moves_.end() && it->second.ordered && it->second.to == to) {
    --moves_in_flight_;
    moves_.erase(it);
    return copy_kind::move;
  }
  ordered_.erase(key);
  if (ok && placement_.owner(key)) (void)placement_.add_replica(key, to);
  return copy_kind::replica;
}

size_t pool_directory::replicated_keys() const {
  size_t n = 0;
  for (uint64_t key : lru_) n += placement_.locations(key).size() > 1 ? 1 : 0;
  return n;
}

int64_t pool_directory::replicas() const {
  int64_t n = 0;
  for (shard_id s : placement_.shard_ids()) n += placement_.replica_load(s);
  return n;
}

size_t pool_directory::hot_keys() const {
  size_t n = 0;
  for (const auto& h : hot_.top(hot_.n_monitored())) n += hot_.hot(h.key) ? 1 : 0;
  return n;
}

}  // namespace weft::cache
