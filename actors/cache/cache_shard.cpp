// The cache-shard role: one shard of the prefix-cache segment pool, serving lookups and publishes.

#include "actors/cache/cache_shard.hpp"
#include "actors/private_messages.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "actors/auth.hpp"
#include "actors/cache/rma_pull.hpp"
#include "actors/cache/segment_store.hpp"
#include "actors/host_port.hpp"
#include "actors/runtime.hpp"
#include "actors/serve/engine_worker.hpp"
#include "actors/serve/serve_atoms.hpp"
#include "schema/caf_bridge.hpp"

namespace weft::cache {

using schema::envelope;
namespace wire = schema::wire;
using serve::cache_done_atom;
using serve::cache_load_atom;
using serve::cache_lookup_atom;
using serve::cache_publish_atom;
using serve::cache_release_atom;
using serve::cache_replicate_atom;
using serve::cache_replicated_atom;
using serve::cache_reply_atom;
using serve::fetch_timeout_atom;
using serve::hello_atom;
using serve::pulled_atom;
using serve::tick_atom;

result<shard_config> shard_config::from_json(const std::string& json) {
  auto j = nlohmann::json::parse(json.empty() ? "{}" : json, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return make_error(errc::invalid_argument, "cache_shard: config is not a JSON object");
  shard_config c;
  try {
    auto router = actors::parse_host_port(j.value("router", std::string{}));
    if (!router)
      return make_error(errc::invalid_argument,
                        "cache_shard: config.router: " + router.error().message);
    std::tie(c.router_host, c.router_port) = *router;
    c.capacity_bytes = j.value("capacity_bytes", c.capacity_bytes);
    c.segment_bytes = j.value("segment_bytes", c.segment_bytes);
    c.staging_slots = j.value("staging_slots", c.staging_slots);
    c.lease_ms = j.value("lease_ms", c.lease_ms);
    c.load_interval_ms = j.value("load_interval_ms", c.load_interval_ms);
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument,
                      std::string{"cache_shard: bad config field: "} + e.what());
  }
  if (c.segment_bytes < 1 || c.capacity_bytes < c.segment_bytes || c.staging_slots < 1 ||
      c.lease_ms < 50) {
    return make_error(errc::invalid_argument,
                      "cache_shard: need segment_bytes >= 1, capacity_bytes >= segment_bytes, "
                      "staging_slots >= 1, "
                      "lease_ms >= 50");
  }
  if (c.load_interval_ms < 10) c.load_interval_ms = 10;
  return c;
}

std::string shard_config::to_json() const {
  return nlohmann::json{{"router", router_host + ":" + std::to_string(router_port)},
                        {"capacity_bytes", capacity_bytes},
                        {"segment_bytes", segment_bytes},
                        {"staging_slots", staging_slots},
                        {"lease_ms", lease_ms},
                        {"load_interval_ms", load_interval_ms}}
      .dump();
}

namespace {

struct staged_slot {
  int32_t slot = 0;
  uint64_t deadline_ms = 0;
};

struct pending_publish {
  caf::actor worker;
  uint64_t lease_id = 0;  ///< the worker's KV lease, released when we answer
  std::vector<std::pair<uint64_t, int32_t>> key_slots;
};

/// A replica copy in progress: the segment is looked up on its home shard, then pulled from the
/// home's staging slot into ours.
struct pending_replica {
  uint64_t key = 0;
  caf::actor source;
  int32_t slot = -1;          ///< our staging slot while pulling
  uint64_t source_lease = 0;  ///< the home's staging lease, released when done
};

struct shard_state {
  static inline const char* name = "weft.cache_shard";
  std::string shard_name;
  std::string node_id;
  shard_config cfg;
  actors::cluster_secret secret;
  std::shared_ptr<transport::engine> transport;
  transport::region staging{};
  std::vector<std::byte> staging_key;
  std::vector<std::byte> address;
  std::unique_ptr<rma_puller> puller;
  std::optional<segment_store> store;
  std::vector<int32_t> free_slots;
  std::map<uint64_t, staged_slot> leases;
  uint64_t next_lease = 1;
  std::map<uint64_t, pending_publish> publishes;
  std::set<uint64_t> inflight_keys;
  std::map<uint64_t, pending_replica> replicas;  ///< replica id (our lookup id) -> copy
  std::map<uint64_t, uint64_t> replica_pulls;    ///< pull id -> replica id
  uint64_t next_replica = 1;
  uint64_t replicas_made = 0;
  caf::actor router;
  uint64_t lookups = 0, hits = 0, stored = 0, bytes_in = 0, bytes_out = 0;

  ~shard_state() {
    puller.reset();
    if (transport && staging.id != 0) (void)transport->release_memory(staging);
  }
  std::byte* slot_data(int32_t slot) const {
    return staging.data + static_cast<size_t>(slot) * static_cast<size_t>(cfg.segment_bytes);
  }
};

using shard_ptr = caf::stateful_actor<shard_state>*;

envelope make_hello(const shard_state& st) {
  const uint64_t deadline = actors::now_ms() + 60'000;
  const std::string fields = st.shard_name + "|" + st.node_id;
  auto token = actors::request_token(st.secret, serve::worker_hello_purpose, fields, deadline);
  return envelope::build<wire::WorkerHello>([&](wire::WorkerHello::Builder b) {
    b.setName(st.shard_name);
    b.setNodeId(st.node_id);
    b.setPid(static_cast<uint32_t>(::getpid()));
    b.setRole(wire::WorkerRole::CACHE_SHARD);
    b.setKvBlocksTotal(static_cast<uint32_t>(st.store->n_slots()));
    b.setDeadlineMs(deadline);
    b.setSessionToken(kj::ArrayPtr<const kj::byte>(token.data(), token.size()));
  });
}

envelope make_load(const shard_state& st) {
  const auto s = st.store->stats();
  return envelope::build<wire::CacheShardLoad>([&](wire::CacheShardLoad::Builder b) {
    b.setName(st.shard_name);
    b.setNSegments(static_cast<uint64_t>(s.n_segments));
    b.setBytesUsed(static_cast<uint64_t>(s.bytes_used));
    b.setCapacityBytes(static_cast<uint64_t>(s.capacity_bytes));
    b.setLookups(st.lookups);
    b.setHits(st.hits);
    b.setPublishes(st.stored);
    b.setEvictions(s.evictions);
    b.setBytesIn(st.bytes_in);
    b.setBytesOut(st.bytes_out);
  });
}

void on_lookup(shard_ptr self, const envelope& env) {
  auto& st = self->state;
  auto sender = caf::actor_cast<caf::actor>(self->current_sender());
  auto m = env.read<wire::CacheLookup>();
  if (!m || !sender) return;
  auto lk = m->get();
  const uint64_t deadline = actors::now_ms() + st.cfg.lease_ms;
  struct hit {
    uint64_t key, offset, size, lease;
  };
  std::vector<hit> hits;
  for (uint64_t key : lk.getKeys()) {
    ++st.lookups;
    if (!st.store->contains(key) || st.free_slots.empty()) continue;
    auto bytes = st.store->get(key);
    if (!bytes) continue;
    const int32_t slot = st.free_slots.back();
    st.free_slots.pop_back();
    std::memcpy(st.slot_data(slot), bytes->data(), bytes->size());
    const uint64_t lease = st.next_lease++;
    st.leases[lease] = {slot, deadline};
    hits.push_back({key, static_cast<uint64_t>(slot) * static_cast<uint64_t>(st.cfg.segment_bytes),
                    bytes->size(), lease});
    ++st.hits;
    st.bytes_out += bytes->size();
  }
  self->send(
      sender, cache_reply_atom::value,
      envelope::build<wire::CacheLookupReply>([&](wire::CacheLookupReply::Builder b) {
        b.setRequestId(lk.getRequestId());
        b.setShard(st.shard_name);
        auto l = b.initHits(static_cast<unsigned>(hits.size()));
        for (size_t i = 0; i < hits.size(); ++i) {
          auto h = l[static_cast<unsigned>(i)];
          h.setKey(hits[i].key);
          h.setOffset(hits[i].offset);
          h.setSizeBytes(hits[i].size);
          h.setLeaseId(hits[i].lease);
        }
        b.setPeerAddress(kj::ArrayPtr<const kj::byte>(
            reinterpret_cast<const kj::byte*>(st.address.data()), st.address.size()));
        b.setRegion(kj::ArrayPtr<const kj::byte>(
            reinterpret_cast<const kj::byte*>(st.staging_key.data()), st.staging_key.size()));
        b.setRegionBytes(st.staging.size_bytes);
        b.setDeadlineMs(deadline);
      }));
}

void release_staged(shard_state& st, uint64_t lease) {
  auto it = st.leases.find(lease);
  if (it == st.leases.end()) return;
  st.free_slots.push_back(it->second.slot);
  st.leases.erase(it);
}

void publish_done(shard_ptr self, const caf::actor& worker, uint64_t lease_id,
                  const std::vector<uint64_t>& stored, const error& err) {
  self->send(worker, cache_done_atom::value,
             envelope::build<wire::CachePublishDone>([&](wire::CachePublishDone::Builder b) {
               b.setLeaseId(lease_id);
               auto l = b.initStored(static_cast<unsigned>(stored.size()));
               for (size_t i = 0; i < stored.size(); ++i)
                 l.set(static_cast<unsigned>(i), stored[i]);
               b.setShard(self->state.shard_name);
               if (!err.ok()) {
                 b.initError().setCode(schema::to_wire(err.code));
                 b.getError().setMessage(err.message);
               }
             }));
}

/// Number of layers named by a kv_layout::describe() string ("layers=30 ...").
int64_t layers_of(const std::string& layout) {
  const auto p = layout.find("layers=");
  if (p == std::string::npos) return 0;
  try {
    return std::stoll(layout.substr(p + 7));
  } catch (...) {
    return 0;
  }
}

void on_publish(shard_ptr self, const envelope& env) {
  auto& st = self->state;
  auto worker = caf::actor_cast<caf::actor>(self->current_sender());
  auto m = env.read<wire::CachePublish>();
  if (!m || !worker) return;
  auto pub = m->get();
  auto draw = pub.getDescriptor();
  const auto desc_env = envelope::from_bytes(
      schema::kind::kv_descriptor,
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(draw.begin()), draw.size()));
  auto dv = desc_env.read<wire::KvDescriptor>();
  if (!dv) {
    spdlog::warn("shard {}: publish with a malformed descriptor: {}", st.shard_name,
                 dv.error().to_string());
    return;
  }
  auto d = dv->get();
  const uint64_t lease_id = d.getLeaseId();
  auto refuse = [&](const std::string& why) {
    publish_done(self, worker, lease_id, {},
                 make_error(errc::invalid_argument, "cache publish: " + why));
  };
  const int64_t n_layers = layers_of(d.getLayout().cStr());
  const uint64_t bb = d.getBlockBytes();
  auto block_ids = d.getBlockIds();
  if (n_layers < 1 || bb == 0 || d.getRegions().size() != 2)
    return refuse("descriptor without layers, block size or pools");
  const uint64_t now = actors::now_ms();
  if (d.getLeaseDeadlineMs() <= now + 20) return refuse("lease already over");
  std::vector<pull_piece> pieces;
  pending_publish pp;
  pp.worker = worker;
  pp.lease_id = lease_id;
  std::vector<uint64_t> already;
  for (auto seg : pub.getSegments()) {
    const uint64_t key = seg.getKey();
    if (key == 0) continue;
    if (st.store->contains(key) || st.inflight_keys.count(key) != 0) {
      already.push_back(key);
      continue;
    }
    const uint64_t bytes =
        static_cast<uint64_t>(seg.getNBlocks()) * static_cast<uint64_t>(n_layers) * 2 * bb;
    if (bytes != static_cast<uint64_t>(st.cfg.segment_bytes))
      return refuse("segment size does not match the shard's");
    if (static_cast<uint64_t>(seg.getFirstBlock()) + seg.getNBlocks() > block_ids.size())
      return refuse("blocks out of range");
    if (st.free_slots.empty()) break;  // busy: the rest is not stored this time
    const int32_t slot = st.free_slots.back();
    st.free_slots.pop_back();
    const uint64_t base = static_cast<uint64_t>(slot) * static_cast<uint64_t>(st.cfg.segment_bytes);
    for (uint32_t b = 0; b < seg.getNBlocks(); ++b) {
      const uint64_t block = block_ids[seg.getFirstBlock() + b];
      for (int64_t l = 0; l < n_layers; ++l) {
        for (uint32_t kv = 0; kv < 2; ++kv) {
          pieces.push_back({kv, static_cast<uint64_t>(l) * d.getLayerStrideBytes() + block * bb,
                            base + ((static_cast<uint64_t>(b) * n_layers + l) * 2 + kv) * bb, bb});
        }
      }
    }
    pp.key_slots.emplace_back(key, slot);
    st.inflight_keys.insert(key);
  }
  if (pp.key_slots.empty()) {
    publish_done(self, worker, lease_id, already, {});
    return;
  }
  auto addr = d.getPeerAddress();
  std::vector<std::vector<std::byte>> keys;
  for (auto r : d.getRegions()) {
    auto k = r.getRemoteKey();
    keys.emplace_back(reinterpret_cast<const std::byte*>(k.begin()),
                      reinterpret_cast<const std::byte*>(k.end()));
  }
  auto me = caf::actor_cast<caf::actor>(self);
  const auto timeout = static_cast<uint32_t>(d.getLeaseDeadlineMs() - now - 20);
  auto pull = st.puller->start(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(addr.begin()), addr.size()),
      keys, {st.staging}, pieces, timeout, [me](uint64_t id, bool ok, std::string err) {
        caf::send_as(me, me, pulled_atom::value, id, ok, err);
      });
  if (!pull) {
    for (auto& [key, slot] : pp.key_slots) {
      st.inflight_keys.erase(key);
      st.free_slots.push_back(slot);
    }
    publish_done(self, worker, lease_id, already, pull.error());
    return;
  }
  st.publishes.emplace(*pull, std::move(pp));
}

// -- replicas of hot segments (ordered by the router's directory) --------------------------------

void send_release(shard_ptr self, const caf::actor& to, uint64_t lease) {
  self->send(to, cache_release_atom::value,
             envelope::build<wire::CacheRelease>(
                 [&](wire::CacheRelease::Builder b) { b.initLeaseIds(1).set(0, lease); }));
}

/// Ends a replica copy: frees what it holds and tells the router.
void end_replica(shard_ptr self, uint64_t id, bool ok, const std::string& why) {
  auto& st = self->state;
  auto it = st.replicas.find(id);
  if (it == st.replicas.end()) return;
  pending_replica r = std::move(it->second);
  st.replicas.erase(it);
  st.inflight_keys.erase(r.key);
  if (r.slot >= 0) st.free_slots.push_back(r.slot);
  if (r.source_lease != 0) send_release(self, r.source, r.source_lease);
  if (ok) ++st.replicas_made;
  if (!ok) spdlog::debug("shard {}: replica of {:016x}: {}", st.shard_name, r.key, why);
  self->send(st.router, cache_replicated_atom::value, r.key, st.shard_name, ok);
}

void on_replicate(shard_ptr self, uint64_t key, const caf::actor& source) {
  auto& st = self->state;
  if (key == 0 || !source) return;
  if (st.store->contains(key)) {
    self->send(st.router, cache_replicated_atom::value, key, st.shard_name, true);
    return;
  }
  if (st.inflight_keys.count(key) != 0) {
    self->send(st.router, cache_replicated_atom::value, key, st.shard_name, false);
    return;
  }
  const uint64_t id = st.next_replica++;
  st.replicas[id] = pending_replica{key, source, -1, 0};
  st.inflight_keys.insert(key);
  self->send(source, serve::cache_lookup_atom::value,
             envelope::build<wire::CacheLookup>([&](wire::CacheLookup::Builder b) {
               b.setRequestId(id);
               b.initKeys(1).set(0, key);
               b.setWorker(st.shard_name);
             }));
  self->delayed_send(self, std::chrono::milliseconds(st.cfg.lease_ms), fetch_timeout_atom::value,
                     id);
}

/// The home shard's answer to a replica lookup: pull the staged segment into our staging slot.
void on_replica_reply(shard_ptr self, const envelope& env) {
  auto& st = self->state;
  auto sender = caf::actor_cast<caf::actor>(self->current_sender());
  auto m = env.read<wire::CacheLookupReply>();
  if (!m || !sender) return;
  auto r = m->get();
  auto it = st.replicas.find(r.getRequestId());
  if (it == st.replicas.end() || it->second.source != sender || it->second.slot >= 0 ||
      it->second.source_lease != 0) {
    for (auto h : r.getHits()) send_release(self, sender, h.getLeaseId());  // late or unknown
    return;
  }
  auto& rep = it->second;
  const uint64_t id = it->first;
  std::optional<wire::CacheHit::Reader> hit;
  for (auto h : r.getHits()) {
    if (h.getKey() == rep.key && !hit) {
      hit = h;
      rep.source_lease = h.getLeaseId();
    } else {
      send_release(self, sender, h.getLeaseId());
    }
  }
  if (!hit) return end_replica(self, id, false, "not on its home any more");
  if (hit->getSizeBytes() != static_cast<uint64_t>(st.cfg.segment_bytes))
    return end_replica(self, id, false, "segment size differs from this shard's");
  if (st.free_slots.empty()) return end_replica(self, id, false, "no free staging slot");
  rep.slot = st.free_slots.back();
  st.free_slots.pop_back();
  auto addr = r.getPeerAddress();
  auto region = r.getRegion();
  const std::vector<std::vector<std::byte>> keys = {
      {reinterpret_cast<const std::byte*>(region.begin()),
       reinterpret_cast<const std::byte*>(region.end())}};
  const std::vector<pull_piece> pieces = {
      {0, hit->getOffset(),
       static_cast<uint64_t>(rep.slot) * static_cast<uint64_t>(st.cfg.segment_bytes),
       hit->getSizeBytes(), 0}};
  auto me = caf::actor_cast<caf::actor>(self);
  auto pull = st.puller->start(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(addr.begin()), addr.size()),
      keys, {st.staging}, pieces, st.cfg.lease_ms, [me](uint64_t pid, bool ok, std::string err) {
        caf::send_as(me, me, pulled_atom::value, pid, ok, err);
      });
  if (!pull) return end_replica(self, id, false, pull.error().to_string());
  st.replica_pulls[*pull] = id;
}

/// A replica pull ended: store the copy.
void on_replica_pulled(shard_ptr self, uint64_t id, bool ok, const std::string& err) {
  auto& st = self->state;
  auto it = st.replicas.find(id);
  if (it == st.replicas.end()) return;
  if (!ok) return end_replica(self, id, false, "pull failed: " + err);
  const auto& rep = it->second;
  auto s =
      st.store->put(rep.key, std::span<const std::byte>(st.slot_data(rep.slot),
                                                        static_cast<size_t>(st.cfg.segment_bytes)));
  if (s.ok()) st.bytes_in += static_cast<uint64_t>(st.cfg.segment_bytes);
  end_replica(self, id, s.ok(), s.ok() ? "" : s.to_string());
}

void on_pulled(shard_ptr self, uint64_t pull_id, bool ok, const std::string& err) {
  auto& st = self->state;
  st.puller->finished(pull_id, ok);
  if (auto rp = st.replica_pulls.find(pull_id); rp != st.replica_pulls.end()) {
    const uint64_t id = rp->second;
    st.replica_pulls.erase(rp);
    return on_replica_pulled(self, id, ok, err);
  }
  auto it = st.publishes.find(pull_id);
  if (it == st.publishes.end()) return;
  pending_publish pp = std::move(it->second);
  st.publishes.erase(it);
  std::vector<uint64_t> stored;
  for (auto& [key, slot] : pp.key_slots) {
    st.inflight_keys.erase(key);
    if (ok) {
      auto s =
          st.store->put(key, std::span<const std::byte>(st.slot_data(slot),
                                                        static_cast<size_t>(st.cfg.segment_bytes)));
      if (s.ok()) {
        stored.push_back(key);
        ++st.stored;
        st.bytes_in += static_cast<uint64_t>(st.cfg.segment_bytes);
      } else {
        spdlog::debug("shard {}: storing segment {:016x}: {}", st.shard_name, key, s.to_string());
      }
    }
    st.free_slots.push_back(slot);
  }
  publish_done(self, pp.worker, pp.lease_id, stored,
               ok ? error{} : make_error(errc::unavailable, "pull failed: " + err));
}

caf::behavior cache_shard(shard_ptr self, std::string name, std::string node_id, shard_config cfg,
                          actors::cluster_secret secret,
                          std::shared_ptr<transport::engine> transport) {
  auto& st = self->state;
  st.shard_name = std::move(name);
  st.node_id = std::move(node_id);
  st.cfg = std::move(cfg);
  st.secret = std::move(secret);
  st.transport = std::move(transport);
  auto fail = [&](const std::string& why) -> caf::behavior {
    spdlog::error("shard {}: {}", st.shard_name, why);
    self->quit(caf::make_error(caf::sec::runtime_error, why));
    return {};
  };
  segment_store_config sc;
  sc.capacity_bytes = st.cfg.capacity_bytes;
  sc.segment_bytes = st.cfg.segment_bytes;
  auto store = segment_store::create(sc);
  if (!store) return fail(store.error().to_string());
  st.store.emplace(std::move(store.value()));
  auto region = st.transport->allocate_memory(static_cast<size_t>(st.cfg.segment_bytes) *
                                              static_cast<size_t>(st.cfg.staging_slots));
  if (!region) return fail("staging memory: " + region.error().to_string());
  st.staging = *region;
  auto key = st.transport->describe(st.staging);
  auto address = st.transport->local_address();
  if (!key || !address) return fail("describing the staging region");
  st.staging_key = std::move(*key);
  st.address = std::move(*address);
  st.puller = std::make_unique<rma_puller>(st.transport);
  for (int32_t i = st.cfg.staging_slots - 1; i >= 0; --i) st.free_slots.push_back(i);
  result<caf::actor> router = make_error(errc::unavailable, "not tried");
  for (int i = 0; i < 50; ++i) {
    router = actors::connect_actor(self->system(), st.cfg.router_host, st.cfg.router_port);
    if (router) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!router) return fail(router.error().message);
  st.router = *router;
  self->monitor(st.router);
  self->set_down_handler([self](const caf::down_msg& dm) {
    if (dm.source == self->state.router.address()) self->quit(caf::exit_reason::user_shutdown);
  });
  spdlog::info("shard {}: {} MiB for {} segments of {} KiB, {} staging slots", st.shard_name,
               st.cfg.capacity_bytes >> 20, st.store->n_slots(), st.cfg.segment_bytes >> 10,
               st.cfg.staging_slots);
  self->send(st.router, hello_atom::value, make_hello(st));
  self->send(self, tick_atom::value);
  return {
      [self](cache_lookup_atom, const envelope& env) { on_lookup(self, env); },
      [self](cache_publish_atom, const envelope& env) { on_publish(self, env); },
      [self](cache_replicate_atom, uint64_t key, const caf::actor& source) {
        on_replicate(self, key, source);
      },
      [self](serve::cache_reply_atom, const envelope& env) { on_replica_reply(self, env); },
      [self](fetch_timeout_atom, uint64_t id) {
        if (!actors::from_self(self)) return;
        // Lookup unanswered, or a pull still running: a pull ends through its own deadline.
        auto it = self->state.replicas.find(id);
        if (it != self->state.replicas.end() && it->second.slot < 0)
          end_replica(self, id, false, "home shard did not answer");
      },
      [self](cache_release_atom, const envelope& env) {
        auto m = env.read<wire::CacheRelease>();
        if (!m) return;
        for (uint64_t id : m->get().getLeaseIds()) release_staged(self->state, id);
      },
      [self](pulled_atom, uint64_t id, bool ok, const std::string& err) {
        if (!actors::from_self(self)) return;
        on_pulled(self, id, ok, err);
      },
      [self](hello_atom) {
        self->send(self->state.router, hello_atom::value, make_hello(self->state));
      },
      [self](tick_atom) {
        if (!actors::from_self(self)) return;
        auto& st = self->state;
        const uint64_t now = actors::now_ms();
        for (auto it = st.leases.begin(); it != st.leases.end();) {
          if (it->second.deadline_ms <= now) {
            st.free_slots.push_back(it->second.slot);
            it = st.leases.erase(it);
          } else {
            ++it;
          }
        }
        // Defragment: give back slab chunks when a quarter of the allocated memory is holes.
        const auto s = st.store->stats();
        if (s.bytes_allocated - s.bytes_used > s.bytes_allocated / 4 + st.cfg.segment_bytes)
          (void)st.store->compact();
        self->send(st.router, cache_load_atom::value, make_load(st));
        self->delayed_send(self, std::chrono::milliseconds(st.cfg.load_interval_ms),
                           tick_atom::value);
      },
  };
}

result<caf::actor> spawn_cache_shard(caf::actor_system& sys, const actors::role_context& ctx) {
  auto cfg = shard_config::from_json(ctx.config_json);
  if (!cfg) return cfg.error();
  if (ctx.engine == nullptr) {
    return make_error(
        errc::invalid_argument,
        "cache_shard moves segments over the node's transport, and this node has none");
  }
  return sys.spawn<caf::detached>(cache_shard, ctx.name, ctx.node_id, std::move(cfg.value()),
                                  ctx.secret, ctx.engine);
}

}  // namespace

void add_cache_roles(actors::role_registry& roles) {
  roles.add("cache_shard", spawn_cache_shard);
}

}  // namespace weft::cache
