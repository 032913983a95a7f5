// The engine worker's prefix-cache pool client: lookups before prefill, pulls of pooled segments
// into the KV cache, publishes after prefill (docs/cache_pool.md).

#include <spdlog/spdlog.h>
#include <caf/all.hpp>

#include <algorithm>
#include <optional>

#include "actors/private_messages.hpp"
#include "actors/serve/engine_worker_state.hpp"
#include "actors/serve/serve_atoms.hpp"

namespace weft::serve::worker_internal {

using schema::envelope;
namespace wire = schema::wire;

/// Index in st.shards of the shard the plan names for segment `i` (`read` or `home`) when the
/// plan's key is `key` (the router computed the same key) and the shard is live.
std::optional<size_t> planned_shard(const worker_state& st, const std::vector<pool_segment>& plan,
                                    size_t i, uint64_t key, bool read) {
  if (i >= plan.size() || plan[i].key != key) return std::nullopt;
  auto it = st.shard_by_name.find(read ? plan[i].read : plan[i].home);
  if (it == st.shard_by_name.end()) return std::nullopt;
  return it->second;
}

void remember_published(worker_state& st, uint64_t key) {
  if (!st.published.insert(key).second) return;
  st.published_order.push_back(key);
  if (st.published_order.size() > 16384) {
    st.published.erase(st.published_order.front());
    st.published_order.pop_front();
  }
}

/// Router -> worker: the live shards (the router's directory names them in each request's plan).
void on_shards(worker_ptr self, std::vector<std::string> names, std::vector<caf::actor> handles) {
  auto& st = self->state;
  if (st.cfg.segment_tokens <= 0 || names.size() != handles.size()) return;
  st.shards = std::move(handles);
  st.shard_by_name.clear();
  for (size_t i = 0; i < names.size(); ++i) st.shard_by_name[names[i]] = i;
  if (st.shards.empty()) return;
  // A shard that came back (restarted empty) must see publishes again.
  st.published.clear();
  st.published_order.clear();
  spdlog::info("worker {}: prefix-cache pool of {} shard(s)", st.worker_name, st.shards.size());
}

/// Looks the sequence's leading segments up in the pool; true if the request now waits for it. A
/// new request's are its prompt's; a resumed (migrated) one's also cover the generated tokens its
/// dead worker checkpointed to the pool (sequence_segment_keys).
bool start_fetch(worker_ptr self, generate_spec& d) {
  auto& st = self->state;
  if (st.shards.empty() || d.pool_plan.empty()) return false;
  std::vector<int32_t> tokens = d.prompt;
  tokens.insert(tokens.end(), d.resume.begin(), d.resume.end());
  const auto S = static_cast<size_t>(st.cfg.segment_tokens);
  const size_t usable =
      cache::usable_segments(d.prompt.size(), tokens.size(), st.cfg.segment_tokens);
  auto keys = cache::sequence_segment_keys(
      st.keys, std::span<const int32_t>(tokens).first(usable * S), d.prompt.size());
  // Only the leading run the directory placed can be fetched.
  std::vector<size_t> read_shard;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto s = planned_shard(st, d.pool_plan, i, keys[i], true);
    if (!s) break;
    read_shard.push_back(*s);
  }
  keys.resize(read_shard.size());
  if (keys.empty()) return false;
  // What this worker's own prefix cache holds (nothing usable when local reuse is off: then every
  // hit comes from the pool). The engine attaches local blocks of the prompt only.
  const int64_t local = st.cfg.prefix_cache
                            ? st.engine->kv().match_prefix(std::span<const int32_t>(d.prompt).first(
                                  std::min(keys.size() * S + 1, d.prompt.size())))
                            : 0;
  if (local >= static_cast<int64_t>(keys.size() * S)) return false;
  pending_fetch f;
  f.keys = keys;
  f.tokens = std::move(tokens);
  f.local_tokens = local;
  f.shards = st.shards;
  std::map<size_t, std::vector<uint64_t>> by_shard;
  for (size_t i = 0; i < keys.size(); ++i) by_shard[read_shard[i]].push_back(keys[i]);
  for (auto& [shard, ks] : by_shard) {
    self->send(st.shards[shard], cache_lookup_atom::value,
               envelope::build<wire::CacheLookup>([&](wire::CacheLookup::Builder b) {
                 b.setRequestId(d.request_id);
                 auto l = b.initKeys(static_cast<unsigned>(ks.size()));
                 for (size_t i = 0; i < ks.size(); ++i) l.set(static_cast<unsigned>(i), ks[i]);
                 b.setWorker(st.worker_name);
               }));
  }
  f.replies_left = by_shard.size();
  const uint64_t id = d.request_id;
  f.spec = std::move(d);
  st.fetches[id] = std::move(f);
  self->delayed_send(self, std::chrono::milliseconds(st.cfg.pool_timeout_ms),
                     fetch_timeout_atom::value, id);
  return true;
}

/// Gives the shards their staging slots back.
void release_hits(worker_ptr self, const pending_fetch& f) {
  std::map<size_t, std::vector<uint64_t>> by_shard;
  for (const auto& [key, h] : f.hits) by_shard[h.shard].push_back(h.lease);
  for (auto& [shard, leases] : by_shard) {
    if (shard >= f.shards.size()) continue;
    self->send(f.shards[shard], cache_release_atom::value,
               envelope::build<wire::CacheRelease>([&](wire::CacheRelease::Builder b) {
                 auto l = b.initLeaseIds(static_cast<unsigned>(leases.size()));
                 for (size_t i = 0; i < leases.size(); ++i)
                   l.set(static_cast<unsigned>(i), leases[i]);
               }));
  }
}

/// Ends a fetch: the request goes to the engine, with the pulled prefix or cold.
void end_fetch(worker_ptr self, uint64_t id) {
  auto& st = self->state;
  auto it = st.fetches.find(id);
  if (it == st.fetches.end()) return;
  pending_fetch f = std::move(it->second);
  st.fetches.erase(it);
  release_hits(self, f);
  if (f.aborted || st.requests.count(id) != 0) {
    if (f.seq != 0) (void)st.engine->kv().free_sequence(f.seq);
    return;
  }
  gpu::seq_id seq = 0;
  if (f.seq != 0 && !f.failed) {
    auto& kv = st.engine->kv();
    const auto tokens = std::span<const int32_t>(f.tokens).first(static_cast<size_t>(f.n_tokens));
    if (auto c = kv.commit(f.seq, tokens); c.ok()) {
      seq = f.seq;
      st.pool_hit_tokens += std::min(static_cast<uint64_t>(f.n_tokens), f.spec.prompt.size());
      st.pool_bytes_in += f.bytes;
      for (size_t i = 0; i < static_cast<size_t>(f.n_tokens / st.cfg.segment_tokens); ++i)
        remember_published(st, f.keys[i]);
      if (f.spec.resume.empty()) {
        spdlog::debug("worker {}: request {} ({}): {} prompt tokens from the pool", st.worker_name,
                      id, f.spec.trace_id, f.n_tokens);
      } else {
        st.resume_pool_tokens += static_cast<uint64_t>(f.n_tokens);
        spdlog::info(
            "worker {}: resumed request {} ({}): {} of its {} tokens' KV from the pool, {} to "
            "recompute",
            st.worker_name, id, f.spec.trace_id, f.n_tokens, f.tokens.size(),
            static_cast<int64_t>(f.tokens.size()) - f.n_tokens);
      }
    } else {
      (void)kv.free_sequence(f.seq);
    }
  } else if (f.seq != 0) {
    (void)st.engine->kv().free_sequence(f.seq);
  }
  admit(self, std::move(f.spec), seq);
}

/// Every lookup answered (or the timeout): pull the leading run of hits, if it beats the local
/// cache.
void pull_hits(worker_ptr self, uint64_t id) {
  auto& st = self->state;
  auto& f = st.fetches.at(id);
  size_t run = 0;
  while (run < f.keys.size() && f.hits.count(f.keys[run]) != 0) ++run;
  const int64_t S = st.cfg.segment_tokens;
  if (static_cast<int64_t>(run) * S <= f.local_tokens || st.exporter == nullptr)
    return end_fetch(self, id);
  auto& kv = st.engine->kv();
  f.n_tokens = static_cast<int64_t>(run) * S;
  auto prepared = kv.prepare_import(
      kv.layout(), std::span<const int32_t>(f.tokens).first(static_cast<size_t>(f.n_tokens)));
  if (!prepared) return end_fetch(self, id);
  f.seq = prepared->first;
  const auto& ranges = prepared->second;
  const size_t per_segment = ranges.size() / run;
  const std::vector<transport::region> locals = {st.exporter->pool(0), st.exporter->pool(1)};
  // One pull per shard, of the segments it serves.
  std::map<size_t, std::vector<cache::pull_piece>> pieces;
  for (size_t s = 0; s < run; ++s) {
    const auto& h = f.hits.at(f.keys[s]);
    if (h.size != per_segment * kv.layout().block_bytes()) {
      f.failed = true;
      return end_fetch(self, id);
    }
    for (size_t j = 0; j < per_segment; ++j) {
      const auto& r = ranges[s * per_segment + j];
      const uint32_t li = r.is_value ? 1 : 0;
      const auto local_off =
          static_cast<uint64_t>(reinterpret_cast<std::byte*>(r.data) - locals[li].data);
      pieces[h.shard].push_back({0, h.offset + j * r.size_bytes, local_off, r.size_bytes, li});
    }
    f.bytes += h.size;
  }
  auto me = caf::actor_cast<caf::actor>(self);
  for (auto& [shard, ps] : pieces) {
    const auto& any = *std::find_if(f.hits.begin(), f.hits.end(),
                                    [&](const auto& kv) { return kv.second.shard == shard; });
    auto pull =
        st.puller->start(any.second.address, {any.second.region}, locals, ps,
                         st.cfg.pool_timeout_ms, [me](uint64_t pid, bool ok, std::string err) {
                           caf::send_as(me, me, pulled_atom::value, pid, ok, err);
                         });
    if (!pull) {
      f.failed = true;
      if (f.pulls_left == 0) return end_fetch(self, id);
      break;
    }
    st.fetch_pulls[*pull] = id;
    ++f.pulls_left;
  }
}

void on_cache_reply(worker_ptr self, const envelope& env) {
  auto& st = self->state;
  auto m = env.read<wire::CacheLookupReply>();
  if (!m) return;
  auto r = m->get();
  auto it = st.fetches.find(r.getRequestId());
  auto sender = caf::actor_cast<caf::actor>(self->current_sender());
  size_t shard = 0;
  if (it != st.fetches.end()) {
    auto& sh = it->second.shards;
    shard = static_cast<size_t>(std::find(sh.begin(), sh.end(), sender) - sh.begin());
  }
  if (it == st.fetches.end() || it->second.replies_left == 0 || it->second.seq != 0 ||
      shard >= it->second.shards.size()) {
    // Late (timed out) or unknown: hand the staging slots straight back.
    std::vector<uint64_t> leases;
    for (auto h : r.getHits()) leases.push_back(h.getLeaseId());
    if (!leases.empty() && sender) {
      self->send(sender, cache_release_atom::value,
                 envelope::build<wire::CacheRelease>([&](wire::CacheRelease::Builder b) {
                   auto l = b.initLeaseIds(static_cast<unsigned>(leases.size()));
                   for (size_t i = 0; i < leases.size(); ++i)
                     l.set(static_cast<unsigned>(i), leases[i]);
                 }));
    }
    return;
  }
  auto& f = it->second;
  auto addr = r.getPeerAddress();
  auto region = r.getRegion();
  for (auto h : r.getHits()) {
    pending_fetch::hit x;
    x.shard = shard;
    x.offset = h.getOffset();
    x.size = h.getSizeBytes();
    x.lease = h.getLeaseId();
    x.address.assign(reinterpret_cast<const std::byte*>(addr.begin()),
                     reinterpret_cast<const std::byte*>(addr.end()));
    x.region.assign(reinterpret_cast<const std::byte*>(region.begin()),
                    reinterpret_cast<const std::byte*>(region.end()));
    f.hits[h.getKey()] = std::move(x);
  }
  if (--f.replies_left == 0) pull_hits(self, r.getRequestId());
}

void on_fetch_timeout(worker_ptr self, uint64_t id) {
  auto& st = self->state;
  auto it = st.fetches.find(id);
  if (it == st.fetches.end() || it->second.seq != 0)
    return;  // done, or pulling (the pull has its own deadline)
  spdlog::debug("worker {}: request {}: pool lookup timed out ({} shard(s) silent)", st.worker_name,
                id, it->second.replies_left);
  it->second.replies_left = 0;
  pull_hits(self, id);
}

void on_fetch_pulled(worker_ptr self, uint64_t pull_id, bool ok, const std::string& err) {
  auto& st = self->state;
  st.puller->finished(pull_id, ok);
  auto p = st.fetch_pulls.find(pull_id);
  if (p == st.fetch_pulls.end()) return;
  const uint64_t id = p->second;
  st.fetch_pulls.erase(p);
  auto it = st.fetches.find(id);
  if (it == st.fetches.end()) return;
  if (!ok) {
    spdlog::warn("worker {}: request {}: pool pull failed ({}); prefilling it", st.worker_name, id,
                 err);
    it->second.failed = true;
  }
  if (--it->second.pulls_left == 0) end_fetch(self, id);
}

/// Offers the KV of request `id` (a copy-on-write fork, under a lease) to the pool and asks each
/// shard of `by_shard` to store its segments (key, segment index); the fork must hold at least
/// `need` tokens of `tokens` (the sequence's tokens).
void offer_segments(worker_ptr self, uint64_t id, std::span<const int32_t> tokens, size_t need,
                    const std::map<size_t, std::vector<std::pair<uint64_t, uint32_t>>>& by_shard) {
  auto& st = self->state;
  if (by_shard.empty()) return;
  auto fork = st.engine->fork_kv(id);
  if (!fork) return;
  auto& kv = st.engine->kv();
  const auto n = static_cast<size_t>(kv.length(*fork));
  if (n > tokens.size() || n < need) {
    (void)kv.free_sequence(*fork);
    return;
  }
  const auto blocks_per_segment = static_cast<uint32_t>(st.cfg.segment_tokens / st.cfg.block_size);
  kv_offer o;
  o.request_id = id;
  o.seq = *fork;
  o.tokens = tokens.first(n);
  o.lease_ms = st.cfg.kv_lease_ms;
  o.checksum = kv_checksum_mode::none;
  auto desc = st.exporter->offer(o);
  if (!desc) {
    spdlog::debug("worker {}: cannot offer request {} to the pool: {}", st.worker_name, id,
                  desc.error().to_string());
    (void)kv.free_sequence(*fork);
    return;
  }
  auto info = read_kv_descriptor(*desc);
  const auto bytes = desc->to_bytes();
  for (const auto& [shard, segs] : by_shard) {
    self->send(st.shards[shard], cache_publish_atom::value,
               envelope::build<wire::CachePublish>([&](wire::CachePublish::Builder b) {
                 b.setDescriptor(kj::ArrayPtr<const kj::byte>(
                     reinterpret_cast<const kj::byte*>(bytes.data()), bytes.size()));
                 auto l = b.initSegments(static_cast<unsigned>(segs.size()));
                 for (size_t i = 0; i < segs.size(); ++i) {
                   l[static_cast<unsigned>(i)].setKey(segs[i].first);
                   l[static_cast<unsigned>(i)].setFirstBlock(segs[i].second * blocks_per_segment);
                   l[static_cast<unsigned>(i)].setNBlocks(blocks_per_segment);
                 }
                 b.setWorker(st.worker_name);
               }));
    for (const auto& [key, seg] : segs) remember_published(st, key);
  }
  st.publish_leases[info ? info->lease_id : 0] = by_shard.size();
}

/// After a request's prefill: offer its prompt's KV under a lease and ask each home shard to
/// store the segments it lacks (not known to be in the pool yet).
void publish_segments(worker_ptr self, uint64_t id, running_request& r) {
  auto& st = self->state;
  r.publish = false;
  const std::vector<int32_t> prompt = std::move(r.prompt);
  r.prompt = {};
  const std::vector<pool_segment> plan = std::move(r.pool_plan);
  r.pool_plan = {};
  if (st.shards.empty() || plan.empty() || st.exporter == nullptr) return;
  const auto keys = cache::segment_keys(st.keys, prompt);
  std::map<size_t, std::vector<std::pair<uint64_t, uint32_t>>> by_shard;  // shard -> (key, segment)
  for (size_t i = 0; i < keys.size(); ++i) {
    if (st.published.count(keys[i]) != 0) continue;
    if (auto home = planned_shard(st, plan, i, keys[i], false))
      by_shard[*home].emplace_back(keys[i], static_cast<uint32_t>(i));
  }
  offer_segments(self, id, prompt, 0, by_shard);
}

/// Router -> worker: publish more segments of a running sequence (prompt + generated tokens), so
/// that if this worker dies the sequence resumes elsewhere from the pool (docs/cache_pool.md).
void on_pool_checkpoint(worker_ptr self, const envelope& env) {
  auto& st = self->state;
  if (caf::actor_cast<caf::actor>(self->current_sender()) != st.router) return;
  auto m = env.read<wire::PoolCheckpoint>();
  if (!m) {
    spdlog::warn("worker {}: malformed PoolCheckpoint: {}", st.worker_name, m.error().to_string());
    return;
  }
  auto c = m->get();
  const uint64_t id = c.getRequestId();
  auto it = st.requests.find(id);
  if (it == st.requests.end() || it->second.attempt != c.getAttempt() || !it->second.started ||
      st.shards.empty() || st.exporter == nullptr || st.cfg.segment_tokens <= 0)
    return;
  const auto segs = c.getSegments();
  const size_t first = c.getFirstSegment();
  const auto S = static_cast<size_t>(st.cfg.segment_tokens);
  const auto tokens = st.engine->tokens(id);
  const size_t end = (first + segs.size()) * S;
  // The KV holds every token but the newest.
  if (segs.size() == 0 || end + 1 > tokens.size()) return;
  const auto keys = cache::sequence_segment_keys(st.keys, tokens.first(end), it->second.n_prompt);
  std::map<size_t, std::vector<std::pair<uint64_t, uint32_t>>> by_shard;
  for (unsigned i = 0; i < segs.size(); ++i) {
    const uint64_t key = keys[first + i];
    if (segs[i].getKey() != key) {
      spdlog::warn("worker {}: request {}: checkpoint segment {} has another key than ours",
                   st.worker_name, id, first + i);
      return;
    }
    if (st.published.count(key) != 0) continue;
    auto home = st.shard_by_name.find(segs[i].getHome().cStr());
    if (home == st.shard_by_name.end()) continue;
    by_shard[home->second].emplace_back(key, static_cast<uint32_t>(first + i));
    ++st.checkpoint_segments;
  }
  offer_segments(self, id, tokens, end, by_shard);
}

void on_publish_done(worker_ptr self, const envelope& env) {
  auto& st = self->state;
  auto m = env.read<wire::CachePublishDone>();
  if (!m) return;
  auto d = m->get();
  if (d.hasError()) {
    spdlog::debug("worker {}: publish to {}: {}", st.worker_name, d.getShard().cStr(),
                  d.getError().getMessage().cStr());
  }
  auto it = st.publish_leases.find(d.getLeaseId());
  if (it == st.publish_leases.end() || --it->second > 0) return;
  st.publish_leases.erase(it);
  if (auto l = st.exporter->release(d.getLeaseId())) free_leased(self, *l);
}

}  // namespace weft::serve::worker_internal
