// The router's picture of what the workers' caches and the prefix-cache pool hold, and the pool's
// shards: their hellos, loads and deaths, the directory's plans and replica orders.

#include <spdlog/spdlog.h>
#include <caf/all.hpp>

#include <algorithm>

#include <xxhash.h>

#include "actors/serve/router_state.hpp"
#include "actors/serve/serve_atoms.hpp"

namespace weft::serve::router_internal {

using schema::envelope;

/// Tokens per prefix key of the router's cache picture: the pool's segment size when workers use
/// one, else four KV blocks.
int64_t key_tokens(const worker_info& w) {
  return w.segment_tokens > 0 ? w.segment_tokens
                              : 4 * static_cast<int64_t>(std::max<uint32_t>(w.block_size, 1));
}

std::vector<uint64_t> prefix_keys(const worker_info& w, std::span<const int32_t> prompt) {
  cache::segment_key_config kc;
  kc.model_id = w.model;
  kc.kv_layout = "router";
  kc.segment_tokens = key_tokens(w);
  return cache::segment_keys(kc, prompt);
}

cache_estimate estimate_cache(const router_state& st, const worker_info& w,
                              const std::vector<uint64_t>& keys, size_t prompt_tokens) {
  cache_estimate e;
  const int64_t g = key_tokens(w);
  const auto cap = static_cast<int64_t>(prompt_tokens) - 2;
  e.local_tokens = std::min<int64_t>(static_cast<int64_t>(w.recent.leading(keys)) * g,
                                     std::max<int64_t>(cap, 0));
  if (w.segment_tokens > 0 && !st.shards.empty()) {
    e.pool_tokens = std::min<int64_t>(static_cast<int64_t>(st.pool_keys.leading(keys)) * g,
                                      std::max<int64_t>(cap, 0));
  }
  return e;
}

/// Records that `w` prefills `prompt`: its cache (and the pool, which it publishes to) now hold the
/// prompt's prefix keys, as far as the router can tell.
void note_prefill(router_state& st, worker_info& w, std::span<const int32_t> prompt) {
  if (st.cfg.route == "round-robin" || st.cfg.route == "least-load") return;
  const auto keys = prefix_keys(w, prompt);
  for (uint64_t k : keys) w.recent.touch(k);
  if (w.segment_tokens > 0 && !st.shards.empty()) {
    for (uint64_t k : keys) st.pool_keys.touch(k);
  }
}

cache::shard_id shard_id_of(const std::string& name) {
  return static_cast<cache::shard_id>(XXH32(name.data(), name.size(), 0));
}

// The directory and the shard table change together (hello, down); a shard the table lacks (never
// expected) ends a plan or drops an order instead of failing the router.
const shard_info* shard_named(const router_state& st, cache::shard_id id) {
  auto n = st.shard_by_id.find(id);
  if (n == st.shard_by_id.end()) return nullptr;
  auto it = st.shards.find(n->second);
  return it == st.shards.end() ? nullptr : &it->second;
}

void send_copy_orders(router_ptr self) {
  auto& st = self->state;
  for (const auto& o : st.directory.take_replica_orders()) {
    const auto* to = shard_named(st, o.to);
    const auto* from = shard_named(st, o.from);
    if (to == nullptr || from == nullptr) {
      spdlog::error("router: copy order for {:016x} names an unknown shard; dropped", o.key);
      st.directory.replica_done(o.key, o.to, false);
      continue;
    }
    self->send(to->handle, cache_replicate_atom::value, o.key, from->handle);
  }
}

void rebalance_pool(router_ptr self) {
  auto& st = self->state;
  if (st.directory.n_shards() < 2) return;
  const size_t moved = st.directory.rebalance();
  if (moved == 0) return;
  spdlog::info("router: pool rebalance re-homes {} segment(s) off shards above the load bound",
               moved);
  if (auto& m = st.cfg.metrics) {
    m->inc("weft_cache_rebalance_moves_total", {}, static_cast<double>(moved));
  }
  send_copy_orders(self);
}

/// The pool directory's plan for a request's leading segments (where to read each, where to
/// publish it), and the copies (hot-key replicas, moved keys) that are due now. A resumed
/// request's plan covers the segments of its prompt and generated tokens planned before (the
/// dispatch's plan and checkpoints): its dead worker published them.
void plan_pool(router_ptr self, const worker_info& w, generate_spec& spec) {
  auto& st = self->state;
  spec.pool_plan.clear();
  auto req = st.requests.find(spec.request_id);
  if (w.segment_tokens == 0 || w.pool_key_config.kv_layout.empty() ||
      st.directory.n_shards() == 0 || req == st.requests.end())
    return;
  auto& r = req->second;
  std::vector<int32_t> tokens = spec.prompt;
  tokens.insert(tokens.end(), spec.resume.begin(), spec.resume.end());
  size_t n = cache::usable_segments(spec.prompt.size(), tokens.size(), w.segment_tokens);
  if (!spec.resume.empty()) n = std::min<size_t>(n, r.pool_segments);
  if (n == 0) return;
  const auto keys = cache::sequence_segment_keys(
      w.pool_key_config,
      std::span<const int32_t>(tokens).first(n * static_cast<size_t>(w.segment_tokens)),
      spec.prompt.size());
  for (const auto& route : st.directory.route(keys)) {
    const auto* read = shard_named(st, route.read);
    const auto* home = shard_named(st, route.home);
    if (read == nullptr || home == nullptr) {
      spdlog::error("router: pool directory names an unknown shard; request {} plans {} segment(s)",
                    spec.request_id, spec.pool_plan.size());
      break;
    }
    spec.pool_plan.push_back({route.key, read->name, home->name});
  }
  if (spec.resume.empty()) r.pool_segments = static_cast<uint32_t>(spec.pool_plan.size());
  send_copy_orders(self);
}

void checkpoint_pool(router_ptr self, request_info& r, const worker_info& w) {
  auto& st = self->state;
  if (!st.cfg.pool_generated || w.segment_tokens == 0 || w.pool_key_config.kv_layout.empty() ||
      st.directory.n_shards() == 0 || r.generated.empty())
    return;
  const auto S = static_cast<size_t>(w.segment_tokens);
  // The worker's KV holds the prompt and every generated token but the newest.
  const size_t in_kv = r.spec.prompt.size() + r.generated.size() - 1;
  const size_t whole = in_kv / S;
  if (whole <= r.pool_segments) return;
  std::vector<int32_t> tokens = r.spec.prompt;
  tokens.insert(tokens.end(), r.generated.begin(), r.generated.end());
  auto keys = cache::sequence_segment_keys(
      w.pool_key_config, std::span<const int32_t>(tokens).first(whole * S), r.spec.prompt.size());
  const size_t first = r.pool_segments;
  keys.erase(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(first));
  std::vector<std::pair<uint64_t, const shard_info*>> homes;
  for (const auto& route : st.directory.place(keys)) {
    const auto* home = shard_named(st, route.home);
    if (home == nullptr) break;
    homes.emplace_back(route.key, home);
  }
  if (homes.empty()) return;
  r.pool_segments = static_cast<uint32_t>(first + homes.size());
  self->send(w.handle, cache_ckpt_atom::value,
             envelope::build<wire::PoolCheckpoint>([&](wire::PoolCheckpoint::Builder b) {
               b.setRequestId(r.spec.request_id);
               b.setAttempt(r.spec.attempt);
               b.setFirstSegment(static_cast<uint32_t>(first));
               auto l = b.initSegments(static_cast<unsigned>(homes.size()));
               for (size_t i = 0; i < homes.size(); ++i) {
                 l[static_cast<unsigned>(i)].setKey(homes[i].first);
                 l[static_cast<unsigned>(i)].setRead(homes[i].second->name);
                 l[static_cast<unsigned>(i)].setHome(homes[i].second->name);
               }
             }));
  if (auto& m = st.cfg.metrics)
    m->inc("weft_cache_checkpoint_segments_total", {}, static_cast<double>(homes.size()));
}

/// The live shards, as (names, handles) in name order: what workers place segments with.
void send_shards(router_ptr self, const caf::actor& to) {
  std::vector<std::string> names;
  std::vector<caf::actor> handles;
  for (const auto& [name, s] : self->state.shards) {
    names.push_back(name);
    handles.push_back(s.handle);
  }
  self->send(to, shards_atom::value, std::move(names), std::move(handles));
}

void broadcast_shards(router_ptr self) {
  for (const auto& [name, w] : self->state.workers) send_shards(self, w.handle);
}

void on_shard_hello(router_ptr self, const std::string& name, wire::WorkerHello::Reader hello) {
  auto& st = self->state;
  auto sender = caf::actor_cast<caf::actor>(self->current_sender());
  auto& s = st.shards[name];
  const bool fresh = s.handle != sender;
  s.name = name;
  s.handle = sender;
  s.node_id = hello.getNodeId().cStr();
  s.pid = hello.getPid();
  if (fresh) {
    const auto id = shard_id_of(name);
    if (st.shard_by_id.count(id) != 0) st.directory.remove_shard(id);  // a new incarnation
    st.directory.add_shard(id);
    st.shard_by_id[id] = name;
    s.slots = hello.getKvBlocksTotal();
    st.pool_slots += s.slots;
    st.pool_keys.set_capacity(static_cast<size_t>(st.pool_slots));
    st.directory.set_capacity(static_cast<size_t>(st.pool_slots));
    // A (re)started shard is empty: forget what the pool was thought to hold.
    st.pool_keys.clear();
    self->monitor(sender);
    // Keys it now homes are copied to it from the shards that hold them (a few at a time).
    send_copy_orders(self);
    spdlog::info("router: cache shard {} ready on node {} (pid {}, {} segment slots)", name,
                 s.node_id, s.pid, hello.getKvBlocksTotal());
    broadcast_shards(self);
  }
}

void on_shard_load(router_ptr self, const envelope& env) {
  auto& st = self->state;
  auto l = env.read<wire::CacheShardLoad>();
  if (!l) return;
  auto load = l->get();
  auto it = st.shards.find(load.getName().cStr());
  if (it == st.shards.end() ||
      caf::actor_cast<caf::actor>(self->current_sender()) != it->second.handle)
    return;
  auto& s = it->second;
  s.n_segments = load.getNSegments();
  s.bytes_used = load.getBytesUsed();
  s.capacity_bytes = load.getCapacityBytes();
  s.lookups = load.getLookups();
  s.hits = load.getHits();
  s.publishes = load.getPublishes();
  s.evictions = load.getEvictions();
  s.bytes_in = load.getBytesIn();
  s.bytes_out = load.getBytesOut();
  auto& m = st.cfg.metrics;
  if (!m) return;
  const metric_labels lb = {{"shard", s.name}};
  m->set("weft_cache_segments", lb, static_cast<double>(s.n_segments));
  m->set("weft_cache_bytes_used", lb, static_cast<double>(s.bytes_used));
  m->set_total("weft_cache_shard_lookups_total", lb, static_cast<double>(s.lookups));
  m->set_total("weft_cache_shard_hits_total", lb, static_cast<double>(s.hits));
  m->set_total("weft_cache_shard_bytes_in_total", lb, static_cast<double>(s.bytes_in));
  m->set_total("weft_cache_shard_bytes_out_total", lb, static_cast<double>(s.bytes_out));
  m->set_total("weft_cache_shard_evictions_total", lb, static_cast<double>(s.evictions));
  double max_seg = 0, sum_seg = 0;
  for (const auto& [n, o] : st.shards) {
    max_seg = std::max(max_seg, static_cast<double>(o.n_segments));
    sum_seg += static_cast<double>(o.n_segments);
  }
  const double mean = st.shards.empty() ? 0.0 : sum_seg / static_cast<double>(st.shards.size());
  m->set("weft_cache_shard_imbalance", mean > 0 ? max_seg / mean : 1.0);
  m->set("weft_cache_replica_segments", static_cast<double>(st.directory.replicas()));
  m->set("weft_cache_replicated_keys", static_cast<double>(st.directory.replicated_keys()));
  m->set("weft_cache_hot_segments", static_cast<double>(st.directory.hot_keys()));
  m->set("weft_cache_pending_moves", static_cast<double>(st.directory.pending_moves()));
  for (const auto& [n, o] : st.shards) {
    m->set("weft_cache_directory_load", {{"shard", n}},
           static_cast<double>(st.directory.load(shard_id_of(n))));
  }
}

bool on_shard_down(router_ptr self, const caf::actor_addr& source, const std::string& reason) {
  auto& st = self->state;
  for (auto it = st.shards.begin(); it != st.shards.end(); ++it) {
    if (it->second.handle.address() != source) continue;
    spdlog::warn("router: cache shard {} lost ({}); its segments are misses until it is back",
                 it->first, reason);
    if (auto& m = st.cfg.metrics) m->inc("weft_cache_shard_deaths_total");
    st.pool_slots -= std::min(st.pool_slots, it->second.slots);
    st.pool_keys.clear();
    st.directory.remove_shard(shard_id_of(it->first));
    st.shard_by_id.erase(shard_id_of(it->first));
    st.shards.erase(it);
    broadcast_shards(self);
    return true;
  }
  return false;
}

void on_replica_copied(router_ptr self, uint64_t key, const std::string& shard, bool ok) {
  auto& st = self->state;
  auto it = st.shards.find(shard);
  if (it == st.shards.end() ||
      caf::actor_cast<caf::actor>(self->current_sender()) != it->second.handle)
    return;
  const auto kind = st.directory.replica_done(key, shard_id_of(shard), ok);
  if (auto& m = st.cfg.metrics) {
    m->inc(kind == cache::copy_kind::move ? "weft_cache_key_moves_total"
                                          : "weft_cache_replications_total",
           {{"outcome", ok ? "copied" : "failed"}});
  }
  send_copy_orders(self);  // the next queued moves
}

}  // namespace weft::serve::router_internal
