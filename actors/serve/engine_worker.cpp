// The engine worker role: an engine on its own thread (a detached actor), fed by the router.

#include "actors/serve/engine_worker.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <deque>
#include <map>
#include <thread>
#include <tuple>
#include <unordered_set>

#include "actors/auth.hpp"
#include "actors/cache/rma_pull.hpp"
#include "actors/cache/segment_keys.hpp"
#include "actors/host_port.hpp"
#include "actors/serve/kv_transfer.hpp"
#include "actors/serve/mlfq_policy.hpp"
#include "actors/serve/model_host.hpp"
#include "actors/serve/schedule_policies.hpp"
#include "actors/serve/serve_atoms.hpp"
#include "actors/serve/wire_convert.hpp"
#include "gpu/engine.hpp"
#include "schema/caf_bridge.hpp"

namespace weft::serve {

using schema::envelope;
using schema::make_error_envelope;
namespace wire = schema::wire;

result<worker_config> worker_config::from_json(const std::string& json) {
  auto j = nlohmann::json::parse(json.empty() ? "{}" : json, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return make_error(errc::invalid_argument, "engine_worker: config is not a JSON object");
  worker_config c;
  try {
    if (!j.contains("model") || !j["model"].is_string()) {
      return make_error(errc::invalid_argument,
                        "engine_worker: config.model (a GGUF path) is required");
    }
    c.model = j["model"].get<std::string>();
    if (!j.contains("router") || !j["router"].is_string()) {
      return make_error(errc::invalid_argument,
                        "engine_worker: config.router (HOST:PORT) is required");
    }
    auto router = actors::parse_host_port(j["router"].get<std::string>());
    if (!router) {
      return make_error(errc::invalid_argument,
                        "engine_worker: config.router: " + router.error().message);
    }
    std::tie(c.router_host, c.router_port) = *router;
    c.device = j.value("device", c.device);
    c.threads = j.value("threads", c.threads);
    c.kv_blocks = j.value("kv_blocks", c.kv_blocks);
    c.block_size = j.value("block_size", c.block_size);
    c.max_batch_tokens = j.value("max_batch_tokens", c.max_batch_tokens);
    c.max_running = j.value("max_running", c.max_running);
    c.policy = j.value("policy", c.policy);
    c.mlfq_prefill_cost = j.value("mlfq_prefill_cost", c.mlfq_prefill_cost);
    c.mlfq_starvation_steps = j.value("mlfq_starvation_steps", c.mlfq_starvation_steps);
    c.role = j.value("role", c.role);
    c.prefix_cache = j.value("prefix_cache", c.prefix_cache);
    c.load_interval_ms = j.value("load_interval_ms", c.load_interval_ms);
    c.kv_lease_ms = j.value("kv_lease_ms", c.kv_lease_ms);
    c.segment_tokens = j.value("segment_tokens", c.segment_tokens);
    c.pool_timeout_ms = j.value("pool_timeout_ms", c.pool_timeout_ms);
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument,
                      std::string{"engine_worker: bad config field: "} + e.what());
  }
  if (c.kv_blocks < 1 || c.block_size < 1 || c.max_batch_tokens < 2 || c.max_running < 1 ||
      c.threads < 0) {
    return make_error(errc::invalid_argument,
                      "engine_worker: kv_blocks, block_size, max_running >= 1, max_batch_tokens >= "
                      "2, threads >= 0");
  }
  if (c.role != "both" && c.role != "prefill" && c.role != "decode") {
    return make_error(errc::invalid_argument,
                      "engine_worker: role must be both, prefill or decode");
  }
  if (c.load_interval_ms < 10) c.load_interval_ms = 10;
  if (c.segment_tokens < 0 || (c.segment_tokens > 0 && c.segment_tokens % c.block_size != 0)) {
    return make_error(errc::invalid_argument,
                      "engine_worker: segment_tokens must be a multiple of block_size");
  }
  if (c.pool_timeout_ms < 10) c.pool_timeout_ms = 10;
  if (c.kv_lease_ms < 100)
    return make_error(errc::invalid_argument, "engine_worker: kv_lease_ms must be >= 100");
  return c;
}

std::string worker_config::to_json() const {
  nlohmann::json j = {{"model", model},
                      {"router", router_host + ":" + std::to_string(router_port)},
                      {"device", device},
                      {"threads", threads},
                      {"kv_blocks", kv_blocks},
                      {"block_size", block_size},
                      {"max_batch_tokens", max_batch_tokens},
                      {"max_running", max_running},
                      {"policy", policy},
                      {"mlfq_prefill_cost", mlfq_prefill_cost},
                      {"mlfq_starvation_steps", mlfq_starvation_steps},
                      {"role", role},
                      {"prefix_cache", prefix_cache},
                      {"load_interval_ms", load_interval_ms},
                      {"kv_lease_ms", kv_lease_ms},
                      {"segment_tokens", segment_tokens},
                      {"pool_timeout_ms", pool_timeout_ms}};
  return j.dump();
}

namespace {

struct running_request {
  uint32_t attempt = 0;
  uint32_t next_position = 0;  ///< position of the next token this worker generates
  uint32_t n_prompt = 0;
  uint32_t n_prefill = 0;  ///< prompt + resumed tokens to compute before the first new token
  bool started = false;    ///< produced its first token here
  bool want_logprobs = false;
  bool handoff = false;         ///< disaggregated prefill: offer the KV after the first new token
  bool publish = false;         ///< publish the prompt's segments to the pool after its prefill
  std::vector<int32_t> prompt;  ///< kept only when publishing
  /// Home shard of each leading segment (the router directory's plan), for the publish.
  std::vector<pool_segment> pool_plan;
  std::string trace_id;
};

/// A request waiting for its prefix segments from the pool (lookups, then pulls).
struct pending_fetch {
  generate_spec spec;
  std::vector<uint64_t> keys;  ///< segment keys of the prompt's leading full segments
  int64_t local_tokens = 0;    ///< what the worker's own prefix cache already holds
  size_t replies_left = 0;
  struct hit {
    size_t shard = 0;  ///< index in the shard list at lookup time
    uint64_t offset = 0, size = 0, lease = 0;
    std::vector<std::byte> address, region;
  };
  std::map<uint64_t, hit> hits;    ///< key -> where to pull it
  std::vector<caf::actor> shards;  ///< the shard list at lookup time
  gpu::seq_id seq = 0;             ///< allocated once pulling
  int64_t n_tokens = 0;            ///< tokens being pulled
  size_t pulls_left = 0;
  bool failed = false;
  bool aborted = false;  ///< aborted (or superseded) while pulling
  uint64_t bytes = 0;
};

/// A KV pull in flight (disaggregated decode).
struct pending_import {
  generate_spec spec;
  uint64_t lease_id = 0;
  bool aborted = false;  ///< the request was aborted or superseded while its bytes were moving
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
};

struct worker_state {
  static inline const char* name = "weft.engine_worker";
  std::string worker_name;
  std::string node_id;
  worker_config cfg;
  actors::cluster_secret secret;
  std::unique_ptr<model_host> host;
  std::unique_ptr<gpu::engine> engine;
  std::shared_ptr<gpu::schedule_policy> policy;
  caf::actor router;
  std::map<uint64_t, running_request> requests;
  // Disaggregation: the node's transport, the prefill side's exporter, the decode side's importer.
  std::shared_ptr<transport::engine> transport;
  std::unique_ptr<kv_exporter> exporter;
  std::unique_ptr<kv_importer> importer;
  std::map<uint64_t, pending_import> imports;  ///< pull id -> pull
  std::map<uint64_t, uint64_t> import_of;      ///< request id -> pull id
  // Prefix-cache pool (cfg.segment_tokens > 0 and shards known): segment keys, the live shards
  // (where each segment is read and published comes with each request, from the router's
  // directory), lookups and pulls in flight, publishes under KV leases.
  cache::segment_key_config keys;
  std::vector<caf::actor> shards;
  std::map<std::string, size_t> shard_by_name;  ///< shard name -> index in `shards`
  std::unique_ptr<cache::rma_puller> puller;
  std::map<uint64_t, pending_fetch> fetches;  ///< request id -> fetch
  std::map<uint64_t, uint64_t> fetch_pulls;   ///< pull id -> request id
  std::map<uint64_t, size_t> publish_leases;  ///< KV lease -> shard answers outstanding
  std::unordered_set<uint64_t> published;     ///< keys the pool has (recently published or fetched)
  std::deque<uint64_t> published_order;
  uint64_t pool_hit_tokens = 0, prompt_tokens = 0, pool_bytes_in = 0;
  bool stepping = false;
  // load accounting
  uint64_t last_prefill = 0, last_decode = 0;
  std::chrono::steady_clock::time_point last_load_at = std::chrono::steady_clock::now();
  uint64_t last_step_unix_ms = 0;
};

using worker_ptr = caf::stateful_actor<worker_state>*;

wire::FinishReason to_wire_finish(gpu::finish_reason r) {
  switch (r) {
    case gpu::finish_reason::none:
      return wire::FinishReason::NONE;
    case gpu::finish_reason::stop_token:
      return wire::FinishReason::STOP_TOKEN;
    case gpu::finish_reason::stop_string:
      return wire::FinishReason::STOP_STRING;
    case gpu::finish_reason::length:
      return wire::FinishReason::LENGTH;
    case gpu::finish_reason::aborted:
      return wire::FinishReason::ABORTED;
    case gpu::finish_reason::error:
      return wire::FinishReason::ERROR;
  }
  return wire::FinishReason::ERROR;
}

envelope make_chunk(const std::string& worker, uint64_t id, const running_request& r,
                    const gpu::request_output& out, uint32_t position) {
  return envelope::build<wire::TokenChunk>([&](wire::TokenChunk::Builder b) {
    b.setRequestId(id);
    b.setAttempt(r.attempt);
    b.setPosition(position);
    auto toks = b.initTokens(static_cast<unsigned>(out.new_tokens.size()));
    for (size_t i = 0; i < out.new_tokens.size(); ++i)
      toks.set(static_cast<unsigned>(i), out.new_tokens[i]);
    if (r.want_logprobs && out.samples.size() == out.new_tokens.size()) {
      auto lps = b.initLogprobs(static_cast<unsigned>(out.samples.size()));
      for (size_t i = 0; i < out.samples.size(); ++i) {
        auto e = lps[static_cast<unsigned>(i)];
        e.setToken(out.samples[i].token);
        e.setLogprob(out.samples[i].logprob);
        auto top = e.initTop(static_cast<unsigned>(out.samples[i].top.size()));
        for (size_t k = 0; k < out.samples[i].top.size(); ++k) {
          top[static_cast<unsigned>(k)].setToken(out.samples[i].top[k].token);
          top[static_cast<unsigned>(k)].setLogprob(out.samples[i].top[k].logprob);
        }
      }
    }
    b.setFinish(to_wire_finish(out.finish));
    b.setPromptTokens(r.n_prompt);
    b.setCachedTokens(static_cast<uint32_t>(out.cached_prompt_tokens));
    if (out.finish == gpu::finish_reason::error) {
      b.initError().setCode(wire::ErrorCode::INTERNAL);
      b.getError().setMessage(out.error);
    }
    b.setWorker(worker);
  });
}

envelope error_chunk(const std::string& worker, uint64_t id, uint32_t attempt, uint32_t position,
                     errc code, const std::string& message) {
  return envelope::build<wire::TokenChunk>([&](wire::TokenChunk::Builder b) {
    b.setRequestId(id);
    b.setAttempt(attempt);
    b.setPosition(position);
    b.setFinish(wire::FinishReason::ERROR);
    b.initError().setCode(schema::to_wire(code));
    b.getError().setMessage(message);
    b.setWorker(worker);
  });
}

envelope make_load(worker_state& st) {
  auto s = st.engine->stats();
  auto now = std::chrono::steady_clock::now();
  const double dt = std::chrono::duration<double>(now - st.last_load_at).count();
  const auto prefill = static_cast<uint64_t>(s.n_prefill_tokens);
  const auto decode = static_cast<uint64_t>(s.n_decode_tokens);
  const float prefill_rate =
      dt > 0 ? static_cast<float>(static_cast<double>(prefill - st.last_prefill) / dt) : 0.0f;
  const float decode_rate =
      dt > 0 ? static_cast<float>(static_cast<double>(decode - st.last_decode) / dt) : 0.0f;
  st.last_prefill = prefill;
  st.last_decode = decode;
  st.last_load_at = now;
  return envelope::build<wire::WorkerLoad>([&](wire::WorkerLoad::Builder b) {
    b.setName(st.worker_name);
    b.setNWaiting(static_cast<uint32_t>(s.n_waiting));
    b.setNRunning(static_cast<uint32_t>(s.n_running));
    b.setNSwapped(static_cast<uint32_t>(s.n_swapped));
    b.setKvBlocksUsed(static_cast<uint32_t>(s.kv.n_blocks_used));
    b.setKvBlocksFree(static_cast<uint32_t>(s.kv.n_blocks_free));
    b.setSteps(static_cast<uint64_t>(s.n_steps));
    b.setPrefillTokens(prefill);
    b.setDecodeTokens(decode);
    b.setPreemptions(static_cast<uint64_t>(s.n_preemptions));
    uint64_t queued = 0;
    for (const auto& [id, r] : st.requests) queued += r.started ? 0 : r.n_prefill;
    b.setQueuedPrefillTokens(queued);
    b.setKvBlocksTotal(static_cast<uint32_t>(s.kv.n_blocks_total));
    // Live sequences per scheduling level (MLFQ queues; FCFS has one level).
    std::vector<uint32_t> levels(1, 0);
    const auto* mlfq = dynamic_cast<const mlfq_policy*>(st.policy.get());
    for (const auto& [id, r] : st.requests) {
      const int32_t lvl = mlfq != nullptr ? std::max(0, mlfq->level_of(id)) : 0;
      if (levels.size() <= static_cast<size_t>(lvl)) levels.resize(static_cast<size_t>(lvl) + 1, 0);
      ++levels[static_cast<size_t>(lvl)];
    }
    auto lv = b.initQueueDepthPerLevel(static_cast<unsigned>(levels.size()));
    for (size_t i = 0; i < levels.size(); ++i) lv.set(static_cast<unsigned>(i), levels[i]);
    b.setPrefillTokensPerS(prefill_rate);
    b.setDecodeTokensPerS(decode_rate);
    b.setSwapsOut(static_cast<uint64_t>(s.n_swaps_out));
    b.setPrefixHitTokens(static_cast<uint64_t>(s.kv.n_prefix_hits_tokens));
    b.setLastStepUnixMs(st.last_step_unix_ms);
    b.setPoolHitTokens(st.pool_hit_tokens);
    b.setPromptTokens(st.prompt_tokens);
    b.setPoolBytesIn(st.pool_bytes_in);
  });
}

envelope make_hello(const worker_state& st) {
  const uint64_t deadline = actors::now_ms() + 60'000;
  const std::string fields = st.worker_name + "|" + st.node_id;
  auto token = actors::request_token(st.secret, worker_hello_purpose, fields, deadline);
  return envelope::build<wire::WorkerHello>([&](wire::WorkerHello::Builder b) {
    b.setName(st.worker_name);
    b.setNodeId(st.node_id);
    b.setPid(static_cast<uint32_t>(::getpid()));
    b.setRole(st.cfg.role == "prefill"  ? wire::WorkerRole::PREFILL
              : st.cfg.role == "decode" ? wire::WorkerRole::DECODE
                                        : wire::WorkerRole::BOTH);
    b.setModel(st.host->id);
    b.setKvBlocksTotal(static_cast<uint32_t>(st.cfg.kv_blocks));
    b.setBlockSize(static_cast<uint32_t>(st.cfg.block_size));
    b.setMaxRunning(static_cast<uint32_t>(st.cfg.max_running));
    b.setNCtx(static_cast<uint32_t>(st.host->n_ctx));
    b.setPolicy(st.cfg.policy);
    b.setSegmentTokens(static_cast<uint32_t>(st.cfg.segment_tokens));
    if (st.cfg.segment_tokens > 0) {
      b.setPoolKeyModel(st.keys.model_id);
      b.setPoolKeyLayout(st.keys.kv_layout);
    }
    const auto& lay = st.engine->kv().layout();
    b.setKvBytesPerToken(
        static_cast<uint64_t>(lay.block_bytes() / static_cast<size_t>(lay.block_size)) * 2 *
        static_cast<uint64_t>(lay.n_layers));
    b.setDeadlineMs(deadline);
    b.setSessionToken(kj::ArrayPtr<const kj::byte>(token.data(), token.size()));
  });
}

void kick(worker_ptr self) {
  if (self->state.stepping) return;
  self->state.stepping = true;
  self->send(self, step_atom::value);
}

void send_handoff(worker_ptr self, kv_handoff h) {
  h.worker = self->state.worker_name;
  self->send(self->state.router, handoff_atom::value, to_wire(h));
}

/// Disaggregated prefill: the request produced its first new token (already streamed); take its
/// KV out of the engine and offer it under a lease. The router picks the decode worker.
void hand_off(worker_ptr self, uint64_t id, const running_request& r) {
  auto& st = self->state;
  auto d = st.engine->detach(id);
  if (!d) {
    self->send(st.router, chunk_atom::value,
               error_chunk(st.worker_name, id, r.attempt, r.next_position, errc::internal,
                           d.error().to_string()));
    return;
  }
  kv_offer o;
  o.request_id = id;
  o.seq = d->seq;
  o.tokens = std::span<const int32_t>(d->tokens).first(d->tokens.size() - 1);
  o.lease_ms = st.cfg.kv_lease_ms;
  auto desc = st.exporter->offer(o);
  if (!desc) {
    (void)st.engine->kv().free_sequence(d->seq);
    spdlog::error("worker {}: cannot offer the KV of request {}: {}", st.worker_name, id,
                  desc.error().to_string());
    self->send(st.router, chunk_atom::value,
               error_chunk(st.worker_name, id, r.attempt, r.next_position, errc::internal,
                           "KV handoff: " + desc.error().to_string()));
    return;
  }
  auto info = read_kv_descriptor(*desc);
  kv_handoff h;
  h.request_id = id;
  h.attempt = r.attempt;
  h.stage = wire::KvHandoffStage::OFFERED;
  h.lease_id = info ? info->lease_id : 0;
  h.descriptor = desc->to_bytes();
  spdlog::debug("worker {}: request {} ({}): offered {} tokens of KV under lease {}",
                st.worker_name, id, r.trace_id, o.tokens.size(), h.lease_id);
  send_handoff(self, std::move(h));
}

/// Frees an offered sequence whose lease ended (released by the router, or expired).
void free_leased(worker_ptr self, const kv_lease& l) {
  if (auto s = self->state.engine->kv().free_sequence(l.seq); !s) {
    spdlog::error("worker {}: freeing leased sequence of request {}: {}", self->state.worker_name,
                  l.request_id, s.to_string());
  }
}

void import_failed(worker_ptr self, const generate_spec& spec, uint64_t lease_id,
                   const error& err) {
  spdlog::warn("worker {}: KV import of request {} ({}) failed: {}", self->state.worker_name,
               spec.request_id, spec.trace_id, err.to_string());
  kv_handoff h;
  h.request_id = spec.request_id;
  h.attempt = spec.attempt;
  h.stage = wire::KvHandoffStage::FAILED;
  h.lease_id = lease_id;
  h.err = err;
  send_handoff(self, std::move(h));
}

/// Disaggregated decode: start pulling the KV named by the request's descriptor.
void start_import(worker_ptr self, generate_spec spec) {
  auto& st = self->state;
  const auto desc = schema::envelope::from_bytes(schema::kind::kv_descriptor, spec.kv_source);
  auto info = read_kv_descriptor(desc);
  const uint64_t lease_id = info ? info->lease_id : 0;
  if (!info) return import_failed(self, spec, 0, info.error());
  if (info->request_id != spec.request_id) {
    return import_failed(self, spec, lease_id,
                         make_error(errc::invalid_argument, "KV descriptor of another request"));
  }
  if (st.importer == nullptr) {
    return import_failed(self, spec, lease_id,
                         make_error(errc::invalid_argument, "this worker does not import KV"));
  }
  auto me = caf::actor_cast<caf::actor>(self);
  auto pull = st.importer->start(desc, [me](uint64_t pull_id, const transport::completion&) {
    caf::anon_send(me, pulled_atom::value, pull_id);
  });
  if (!pull) return import_failed(self, spec, lease_id, pull.error());
  st.import_of[spec.request_id] = *pull;
  pending_import p;
  p.lease_id = lease_id;
  p.spec = std::move(spec);
  st.imports.emplace(*pull, std::move(p));
}

/// A pull's transfer ended: commit it into the engine (or report the failure).
void on_pulled(worker_ptr self, uint64_t pull_id) {
  auto& st = self->state;
  auto it = st.imports.find(pull_id);
  if (it == st.imports.end()) return;
  pending_import p = std::move(it->second);
  st.imports.erase(it);
  if (auto f = st.import_of.find(p.spec.request_id);
      f != st.import_of.end() && f->second == pull_id) {
    st.import_of.erase(f);
  }
  auto got = st.importer->finish(pull_id);
  if (p.aborted) {
    if (got) (void)st.engine->kv().free_sequence(got->seq);
    return;
  }
  if (!got) return import_failed(self, p.spec, p.lease_id, got.error());
  const auto& spec = p.spec;
  const auto n_resumed = static_cast<int64_t>(spec.resume.size());
  std::vector<int32_t> tokens = spec.prompt;
  tokens.insert(tokens.end(), spec.resume.begin(), spec.resume.end());
  gpu::sampling_params params = spec.params;
  params.max_tokens -= static_cast<int32_t>(n_resumed);
  if (auto s = st.engine->add_imported_request(spec.request_id, got->seq, std::move(tokens),
                                               n_resumed, params);
      !s.ok()) {
    return import_failed(self, spec, p.lease_id, make_error(errc::invalid_argument, s.to_string()));
  }
  running_request rr;
  rr.attempt = spec.attempt;
  rr.next_position = static_cast<uint32_t>(n_resumed);
  rr.n_prompt = static_cast<uint32_t>(spec.prompt.size());
  rr.started = true;
  rr.want_logprobs = spec.want_logprobs;
  rr.trace_id = spec.trace_id;
  st.requests[spec.request_id] = std::move(rr);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now() - p.started);
  kv_handoff h;
  h.request_id = spec.request_id;
  h.attempt = spec.attempt;
  h.stage = wire::KvHandoffStage::PULLED;
  h.lease_id = p.lease_id;
  h.bytes = got->size_bytes;
  h.micros = static_cast<uint64_t>(micros.count());
  spdlog::debug("worker {}: request {} ({}): pulled {} tokens of KV ({} bytes) in {} us",
                st.worker_name, spec.request_id, spec.trace_id, got->n_tokens, got->size_bytes,
                h.micros);
  send_handoff(self, std::move(h));
  kick(self);
}

/// Router -> prefill worker: the pull of a lease ended (either way): free its blocks.
void on_handoff(worker_ptr self, const envelope& env) {
  auto& st = self->state;
  auto m = env.read<wire::KvHandoff>();
  if (!m) {
    spdlog::warn("worker {}: malformed KvHandoff: {}", st.worker_name, m.error().to_string());
    return;
  }
  auto h = from_wire(m->get());
  if (!h || h->stage != wire::KvHandoffStage::RELEASE || st.exporter == nullptr) return;
  auto l = st.exporter->release(h->lease_id);
  if (!l) {
    spdlog::debug("worker {}: release of lease {}: {}", st.worker_name, h->lease_id,
                  l.error().to_string());
    return;
  }
  free_leased(self, *l);
}

/// Leases nobody released in time: free their blocks and tell the router.
void expire_leases(worker_ptr self) {
  auto& st = self->state;
  if (st.exporter == nullptr || st.exporter->n_leases() == 0) return;
  for (const auto& l : st.exporter->expire(unix_now_ms())) {
    spdlog::warn("worker {}: KV lease {} of request {} expired; blocks freed", st.worker_name,
                 l.lease_id, l.request_id);
    free_leased(self, l);
    if (st.publish_leases.erase(l.lease_id) != 0) continue;  // a pool publish nobody answered
    kv_handoff h;
    h.request_id = l.request_id;
    h.stage = wire::KvHandoffStage::EXPIRED;
    h.lease_id = l.lease_id;
    send_handoff(self, std::move(h));
  }
}

/// Drops a pull in flight (abort, or a newer attempt of the same request).
void drop_import(worker_ptr self, uint64_t request_id) {
  auto& st = self->state;
  auto f = st.import_of.find(request_id);
  if (f == st.import_of.end()) return;
  if (auto it = st.imports.find(f->second); it != st.imports.end()) {
    it->second.aborted = true;
    (void)st.importer->cancel(f->second);
  }
  st.import_of.erase(f);
}

// -- prefix-cache pool ----------------------------------------------------------------------------

void admit(worker_ptr self, generate_spec d, gpu::seq_id prefilled);

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

/// Looks the prompt's leading segments up in the pool; true if the request now waits for it.
bool start_fetch(worker_ptr self, generate_spec& d) {
  auto& st = self->state;
  if (st.shards.empty() || d.pool_plan.empty() || !d.resume.empty()) return false;
  auto keys = cache::segment_keys(st.keys, d.prompt);
  const auto S = static_cast<size_t>(st.cfg.segment_tokens);
  while (!keys.empty() && keys.size() * S + 2 > d.prompt.size())
    keys.pop_back();  // leave 2 to compute
  // Only the leading run the directory placed can be fetched.
  std::vector<size_t> read_shard;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto s = planned_shard(st, d.pool_plan, i, keys[i], true);
    if (!s) break;
    read_shard.push_back(*s);
  }
  keys.resize(read_shard.size());
  if (keys.empty()) return false;
  // What this worker's own prefix cache holds.
  // What this worker's own prefix cache holds (nothing usable when local reuse is off: then every
  // hit comes from the pool).
  const int64_t local = st.cfg.prefix_cache
                            ? st.engine->kv().match_prefix(
                                  std::span<const int32_t>(d.prompt).first(keys.size() * S + 1))
                            : 0;
  if (local >= static_cast<int64_t>(keys.size() * S)) return false;
  pending_fetch f;
  f.keys = keys;
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
    const auto tokens =
        std::span<const int32_t>(f.spec.prompt).first(static_cast<size_t>(f.n_tokens));
    if (auto c = kv.commit(f.seq, tokens); c.ok()) {
      seq = f.seq;
      st.pool_hit_tokens += static_cast<uint64_t>(f.n_tokens);
      st.pool_bytes_in += f.bytes;
      for (size_t i = 0; i < static_cast<size_t>(f.n_tokens / st.cfg.segment_tokens); ++i)
        remember_published(st, f.keys[i]);
      spdlog::debug("worker {}: request {} ({}): {} prompt tokens from the pool", st.worker_name,
                    id, f.spec.trace_id, f.n_tokens);
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
      kv.layout(), std::span<const int32_t>(f.spec.prompt).first(static_cast<size_t>(f.n_tokens)));
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
                           caf::anon_send(me, pulled_atom::value, pid, ok, err);
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
  const auto blocks_per_segment = static_cast<uint32_t>(st.cfg.segment_tokens / st.cfg.block_size);
  std::map<size_t, std::vector<std::pair<uint64_t, uint32_t>>> by_shard;  // shard -> (key, segment)
  for (size_t i = 0; i < keys.size(); ++i) {
    if (st.published.count(keys[i]) != 0) continue;
    if (auto home = planned_shard(st, plan, i, keys[i], false))
      by_shard[*home].emplace_back(keys[i], static_cast<uint32_t>(i));
  }
  if (by_shard.empty()) return;
  auto fork = st.engine->fork_kv(id);
  if (!fork) return;
  auto& kv = st.engine->kv();
  const auto n = static_cast<size_t>(kv.length(*fork));
  if (n > prompt.size()) {
    (void)kv.free_sequence(*fork);
    return;
  }
  kv_offer o;
  o.request_id = id;
  o.seq = *fork;
  o.tokens = std::span<const int32_t>(prompt).first(n);
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
  for (auto& [shard, segs] : by_shard) {
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

void run_step(worker_ptr self) {
  auto& st = self->state;
  if (!st.engine->has_work()) {
    st.stepping = false;
    return;
  }
  auto outs = st.engine->step();
  st.last_step_unix_ms = actors::now_ms();
  if (!outs) {
    spdlog::error("worker {}: step failed: {}", st.worker_name, outs.error().to_string());
    for (auto& [id, r] : st.requests) {
      (void)st.engine->abort(id);
      self->send(st.router, chunk_atom::value,
                 error_chunk(st.worker_name, id, r.attempt, r.next_position, errc::internal,
                             outs.error().to_string()));
    }
    st.requests.clear();
  } else {
    for (const auto& out : *outs) {
      auto it = st.requests.find(out.id);
      if (it == st.requests.end()) continue;
      auto& r = it->second;
      const uint32_t position = r.next_position;
      r.started = true;
      r.next_position += static_cast<uint32_t>(out.new_tokens.size());
      self->send(st.router, chunk_atom::value,
                 make_chunk(st.worker_name, out.id, r, out, position));
      if (r.publish && out.finish == gpu::finish_reason::none && !out.new_tokens.empty()) {
        publish_segments(self, out.id, r);
      }
      if (out.finish != gpu::finish_reason::none) {
        st.requests.erase(it);
      } else if (r.handoff && !out.new_tokens.empty()) {
        hand_off(self, out.id, r);
        st.requests.erase(it);
      }
    }
  }
  // Yield to the mailbox between steps: new requests and aborts join the next iteration.
  self->send(self, step_atom::value);
}

void on_generate(worker_ptr self, const envelope& env) {
  auto& st = self->state;
  auto req = env.read<wire::GenerateRequest>();
  if (!req) {
    spdlog::warn("worker {}: malformed GenerateRequest: {}", st.worker_name,
                 req.error().to_string());
    return;
  }
  auto r = req->get();
  const uint64_t id = r.getRequestId();
  auto decoded = from_wire(r);
  if (!decoded) {
    self->send(st.router, chunk_atom::value,
               error_chunk(st.worker_name, id, r.getAttempt(), r.getResumeTokens().size(),
                           errc::invalid_argument, decoded.error().message));
    return;
  }
  auto& d = *decoded;
  if (st.requests.count(id) != 0) {
    // A duplicate dispatch (e.g. a router retry): the newer attempt wins.
    (void)st.engine->abort(id);
    st.requests.erase(id);
  }
  drop_import(self, id);
  if (auto f = st.fetches.find(id); f != st.fetches.end()) f->second.aborted = true;
  if (!d.kv_source.empty()) {
    start_import(self, std::move(d));
    return;
  }
  if (d.handoff && st.exporter == nullptr) {
    self->send(st.router, chunk_atom::value,
               error_chunk(st.worker_name, id, r.getAttempt(), r.getResumeTokens().size(),
                           errc::invalid_argument,
                           "this worker does not hand off KV (role " + st.cfg.role + ")"));
    return;
  }
  if (start_fetch(self, d)) return;  // its prefix comes from the pool first
  admit(self, std::move(d), 0);
}

/// Queues a request in the engine (`prefilled`: a sequence already holding its prompt's leading
/// KV, fetched from the pool; 0: none).
void admit(worker_ptr self, generate_spec d, gpu::seq_id prefilled) {
  auto& st = self->state;
  const uint64_t id = d.request_id;
  const auto n_resumed = static_cast<uint32_t>(d.resume.size());
  std::vector<int32_t> tokens = d.prompt;
  tokens.insert(tokens.end(), d.resume.begin(), d.resume.end());
  gpu::sampling_params p = d.params;
  p.max_tokens = p.max_tokens - static_cast<int32_t>(n_resumed);
  if (p.max_tokens < 1) {
    if (prefilled != 0) (void)st.engine->kv().free_sequence(prefilled);
    self->send(st.router, chunk_atom::value,
               error_chunk(st.worker_name, id, d.attempt, n_resumed, errc::invalid_argument,
                           "resumed request has no tokens left to generate"));
    return;
  }
  auto s = prefilled != 0
               ? st.engine->add_prefilled_request(id, prefilled, std::move(tokens), std::move(p))
               : st.engine->add_resumed_request(id, std::move(tokens), n_resumed, std::move(p));
  if (!s.ok()) {
    self->send(st.router, chunk_atom::value,
               error_chunk(st.worker_name, id, d.attempt, n_resumed, errc::invalid_argument,
                           s.to_string()));
    return;
  }
  st.prompt_tokens += d.prompt.size();
  running_request rr;
  rr.publish = !st.shards.empty() && !d.pool_plan.empty() && n_resumed == 0;
  if (rr.publish) {
    rr.prompt = d.prompt;
    rr.pool_plan = std::move(d.pool_plan);
  }
  rr.attempt = d.attempt;
  rr.next_position = n_resumed;
  rr.n_prompt = static_cast<uint32_t>(d.prompt.size());
  rr.n_prefill = static_cast<uint32_t>(d.prompt.size()) + n_resumed;
  rr.want_logprobs = d.want_logprobs;
  rr.handoff = d.handoff;
  rr.trace_id = d.trace_id;
  st.requests[id] = std::move(rr);
  spdlog::debug("worker {}: request {} ({}) attempt {}: {} prompt + {} resumed tokens",
                st.worker_name, id, d.trace_id, d.attempt, d.prompt.size(), n_resumed);
  kick(self);
}

caf::behavior engine_worker(worker_ptr self, std::string name, std::string node_id,
                            worker_config cfg, actors::cluster_secret secret,
                            std::shared_ptr<transport::engine> transport) {
  auto& st = self->state;
  st.transport = std::move(transport);
  st.worker_name = std::move(name);
  st.node_id = std::move(node_id);
  st.cfg = std::move(cfg);
  st.secret = std::move(secret);
  // A detached actor: loading the weights here blocks only this actor's own thread.
  model_host_options mo;
  mo.path = st.cfg.model;
  mo.device = st.cfg.device;
  mo.threads = st.cfg.threads;
  mo.max_batch_tokens = st.cfg.max_batch_tokens;
  const auto t0 = std::chrono::steady_clock::now();
  auto host = load_model_host(mo);
  if (!host) {
    spdlog::error("worker {}: {}", st.worker_name, host.error().message);
    self->quit(caf::make_error(caf::sec::runtime_error, host.error().message));
    return {};
  }
  st.host = std::move(host.value());
  gpu::engine_config ec;
  ec.kv_blocks = st.cfg.kv_blocks;
  ec.block_size = st.cfg.block_size;
  ec.max_batch_tokens = st.cfg.max_batch_tokens;
  ec.max_running = st.cfg.max_running;
  ec.prefix_cache = st.cfg.prefix_cache;
  const gpu::tokenizer* tk = &st.host->tok;
  ec.detokenize = [tk](int32_t id) { return tk->token_to_piece(id); };
  mlfq_config mq;
  mq.prefill_cost_per_token = st.cfg.mlfq_prefill_cost;
  mq.starvation_steps = st.cfg.mlfq_starvation_steps;
  auto policy = make_schedule_policy(st.cfg.policy, mq);
  if (!policy) {
    self->quit(caf::make_error(caf::sec::runtime_error, policy.error().message));
    return {};
  }
  st.policy = policy.value();
  ec.policy = std::move(policy.value());
  auto eng = gpu::engine::create(*st.host->model, ec);
  if (!eng) {
    spdlog::error("worker {}: engine: {}", st.worker_name, eng.error().to_string());
    self->quit(caf::make_error(caf::sec::runtime_error, eng.error().to_string()));
    return {};
  }
  st.engine = std::move(eng.value());
  if (st.cfg.role != "both" || st.cfg.segment_tokens > 0) {
    kv_transfer_config kc;
    kc.model_id = st.host->id;
    status made;
    if (st.cfg.role == "prefill" || (st.cfg.segment_tokens > 0 && st.cfg.role != "decode")) {
      auto ex = kv_exporter::create(st.engine->kv(), st.transport, kc);
      if (ex)
        st.exporter = std::move(ex.value());
      else
        made = ex.error();
    }
    if (made.ok() && st.cfg.role == "decode") {
      auto im = kv_importer::create(st.engine->kv(), st.transport, kc);
      if (im)
        st.importer = std::move(im.value());
      else
        made = im.error();
    }
    if (!made.ok()) {
      spdlog::error("worker {}: KV transfer ({}): {}", st.worker_name, st.cfg.role,
                    made.to_string());
      self->quit(caf::make_error(caf::sec::runtime_error, made.to_string()));
      return {};
    }
  }
  if (st.exporter != nullptr && st.cfg.segment_tokens > 0) {
    st.keys.model_id = st.host->id;
    st.keys.kv_layout = st.engine->kv().layout().describe();
    st.keys.segment_tokens = st.cfg.segment_tokens;
    if (auto v = cache::validate(st.keys, st.cfg.block_size); !v.ok()) {
      spdlog::error("worker {}: {}", st.worker_name, v.to_string());
      self->quit(caf::make_error(caf::sec::runtime_error, v.to_string()));
      return {};
    }
    st.puller = std::make_unique<cache::rma_puller>(st.transport);
  } else {
    st.cfg.segment_tokens = 0;  // decode workers neither fetch nor publish
  }
  // Find the router (published by `weft serve`); it may still be starting.
  caf::expected<caf::actor> router = caf::sec::cannot_connect_to_node;
  for (int i = 0; i < 50; ++i) {
    router = self->system().middleman().remote_actor(st.cfg.router_host, st.cfg.router_port);
    if (router) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!router) {
    const std::string why = "cannot reach the router at " + st.cfg.router_host + ":" +
                            std::to_string(st.cfg.router_port);
    spdlog::error("worker {}: {}", st.worker_name, why);
    self->quit(caf::make_error(caf::sec::runtime_error, why));
    return {};
  }
  st.router = *router;
  self->monitor(st.router);
  self->set_down_handler([self](const caf::down_msg& dm) {
    if (dm.source == self->state.router.address()) {
      spdlog::warn("worker {}: router is gone; stopping", self->state.worker_name);
      self->quit(caf::exit_reason::user_shutdown);
    }
  });
  spdlog::info("worker {}: {} loaded in {:.2f} s ({} KV blocks of {} tokens, policy {}, role {})",
               st.worker_name, st.host->id,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
               st.cfg.kv_blocks, st.cfg.block_size, st.cfg.policy, st.cfg.role);
  self->send(st.router, hello_atom::value, make_hello(st));
  self->send(self, tick_atom::value);
  return {
      [self](generate_atom, const envelope& env) { on_generate(self, env); },
      [self](handoff_atom, const envelope& env) { on_handoff(self, env); },
      [self](pulled_atom, uint64_t pull_id) { on_pulled(self, pull_id); },
      [self](pulled_atom, uint64_t pull_id, bool ok, const std::string& err) {
        on_fetch_pulled(self, pull_id, ok, err);
      },
      [self](shards_atom, std::vector<std::string> names, std::vector<caf::actor> handles) {
        on_shards(self, std::move(names), std::move(handles));
      },
      [self](cache_reply_atom, const envelope& env) { on_cache_reply(self, env); },
      [self](cache_done_atom, const envelope& env) { on_publish_done(self, env); },
      [self](fetch_timeout_atom, uint64_t id) { on_fetch_timeout(self, id); },
      [self](abort_atom, const envelope& env) {
        auto a = env.read<wire::AbortRequest>();
        if (!a) return;
        const uint64_t id = a->get().getRequestId();
        drop_import(self, id);
        if (auto f = self->state.fetches.find(id); f != self->state.fetches.end()) {
          if (f->second.seq == 0) {
            release_hits(self, f->second);
            self->state.fetches.erase(f);
          } else {
            f->second.aborted = true;  // freed once its pulls ended
          }
        }
        if (self->state.requests.erase(id) != 0) {
          (void)self->state.engine->abort(id);
          spdlog::debug("worker {}: aborted request {} ({})", self->state.worker_name, id,
                        a->get().getReason().cStr());
        }
      },
      [self](step_atom) { run_step(self); },
      [self](tick_atom) {
        expire_leases(self);
        self->send(self->state.router, load_atom::value, make_load(self->state));
        self->delayed_send(self, std::chrono::milliseconds(self->state.cfg.load_interval_ms),
                           tick_atom::value);
      },
      [self](hello_atom) {
        self->send(self->state.router, hello_atom::value, make_hello(self->state));
      },
  };
}

result<caf::actor> spawn_engine_worker(caf::actor_system& sys, const actors::role_context& ctx) {
  auto cfg = worker_config::from_json(ctx.config_json);
  if (!cfg) return cfg.error();
  if ((cfg->role != "both" || cfg->segment_tokens > 0) && ctx.engine == nullptr) {
    return make_error(errc::invalid_argument,
                      "engine_worker: role " + cfg->role +
                          " moves KV over the node's transport, and this node has none "
                          "(start it with --transport ucx)");
  }
  return sys.spawn<caf::detached>(engine_worker, ctx.name, ctx.node_id, std::move(cfg.value()),
                                  ctx.secret, ctx.engine);
}

}  // namespace

void add_serve_roles(actors::role_registry& roles) {
  roles.add("engine_worker", spawn_engine_worker);
}

}  // namespace weft::serve
