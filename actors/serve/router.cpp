// The router / scheduler actor: admission, worker choice, token-stream deduplication, migration.

#include "actors/serve/router.hpp"
#include "actors/private_messages.hpp"

#include <spdlog/spdlog.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>

#include "actors/serve/engine_worker.hpp"
#include "actors/serve/router_state.hpp"
#include "actors/serve/serve_atoms.hpp"
#include "actors/serve/stall_watch.hpp"

namespace weft::serve {

namespace test_hooks {
std::atomic<bool> drop_token_on_migration{false};
}  // namespace test_hooks

using schema::envelope;
using schema::make_error_envelope;

namespace router_internal {

void count(router_ptr self, const std::string& outcome) {
  if (auto& m = self->state.cfg.metrics)
    m->inc("weft_router_requests_total", {{"outcome", outcome}});
}

envelope accepted() {
  return make_error_envelope(error{});
}

envelope make_client_chunk(
    uint64_t id, uint32_t position, std::span<const int32_t> tokens,
    const std::vector<std::tuple<int32_t, float, std::vector<std::pair<int32_t, float>>>>& lps,
    wire::FinishReason finish, uint32_t prompt_tokens, uint32_t cached, const error& err,
    const std::string& worker, capnp::List<float>::Reader embedding = {}) {
  return envelope::build<wire::TokenChunk>([&](wire::TokenChunk::Builder b) {
    b.setRequestId(id);
    b.setPosition(position);
    auto t = b.initTokens(static_cast<unsigned>(tokens.size()));
    for (size_t i = 0; i < tokens.size(); ++i) t.set(static_cast<unsigned>(i), tokens[i]);
    if (!lps.empty()) {
      auto l = b.initLogprobs(static_cast<unsigned>(lps.size()));
      for (size_t i = 0; i < lps.size(); ++i) {
        auto e = l[static_cast<unsigned>(i)];
        e.setToken(std::get<0>(lps[i]));
        e.setLogprob(std::get<1>(lps[i]));
        const auto& top = std::get<2>(lps[i]);
        auto tl = e.initTop(static_cast<unsigned>(top.size()));
        for (size_t k = 0; k < top.size(); ++k) {
          tl[static_cast<unsigned>(k)].setToken(top[k].first);
          tl[static_cast<unsigned>(k)].setLogprob(top[k].second);
        }
      }
    }
    b.setFinish(finish);
    b.setPromptTokens(prompt_tokens);
    b.setCachedTokens(cached);
    if (!err.ok()) {
      b.initError().setCode(schema::to_wire(err.code));
      b.getError().setMessage(err.message);
    }
    b.setWorker(worker);
    if (embedding.size() > 0) b.setEmbedding(embedding);
  });
}

envelope abort_message(uint64_t id, const std::string& reason) {
  return envelope::build<wire::AbortRequest>([&](wire::AbortRequest::Builder b) {
    b.setRequestId(id);
    b.setReason(reason);
  });
}

void release_lease(router_ptr self, request_info& r);

void fail_request(router_ptr self, uint64_t id, const error& err, const std::string& outcome) {
  auto& st = self->state;
  auto it = st.requests.find(id);
  if (it == st.requests.end()) return;
  auto& r = it->second;
  self->send(r.client, chunk_atom::value,
             make_client_chunk(id, static_cast<uint32_t>(r.generated.size()), {}, {},
                               wire::FinishReason::ERROR,
                               static_cast<uint32_t>(r.spec.prompt.size()), 0, err, r.worker));
  if (!r.worker.empty()) {
    if (auto w = st.workers.find(r.worker); w != st.workers.end()) {
      w->second.inflight.erase(id);
      if (r.transferring)
        self->send(w->second.handle, abort_atom::value, abort_message(id, "failed"));
    }
  }
  release_lease(self, r);
  st.requests.erase(it);
  count(self, outcome);
}

/// Ends a request's transfer stage: the prefill worker frees the leased blocks.
void release_lease(router_ptr self, request_info& r) {
  auto& st = self->state;
  if (!r.transferring) return;
  if (auto owner = st.workers.find(r.kv_owner); owner != st.workers.end()) {
    kv_handoff h;
    h.request_id = r.spec.request_id;
    h.attempt = r.spec.attempt;
    h.stage = wire::KvHandoffStage::RELEASE;
    h.lease_id = r.lease_id;
    h.worker = "router";
    self->send(owner->second.handle, handoff_atom::value, to_wire(h));
  }
  r.transferring = false;
  r.kv_owner.clear();
  r.lease_id = 0;
}
void dispatch(router_ptr self, uint64_t id, worker_info& w) {
  auto& st = self->state;
  auto& r = st.requests.at(id);
  r.worker = w.name;
  r.spec.resume = r.generated;
  // A prefill worker hands the KV off to a decode worker; while none is alive (all died, or
  // restarting) it decodes the sequence itself: degraded, but the service goes on.
  r.spec.handoff = w.role == wire::WorkerRole::PREFILL && has_decoder(st);
  if (w.role == wire::WorkerRole::PREFILL && !r.spec.handoff) {
    spdlog::warn("router: no decode worker alive: request {} ({}) decodes on prefill worker {}", id,
                 r.spec.trace_id, w.name);
    if (auto& m = st.cfg.metrics) m->inc("weft_router_colocated_fallback_total");
  }
  r.spec.kv_source.clear();
  w.inflight.insert(id);
  w.dispatched_prompt_tokens += r.spec.prompt.size() + r.spec.resume.size();
  note_prefill(st, w, r.spec.prompt);
  plan_pool(self, w, r.spec);
  self->send(w.handle, generate_atom::value, to_wire(r.spec));
  spdlog::debug("router: request {} ({}) attempt {} -> {}", id, r.spec.trace_id, r.spec.attempt,
                w.name);
}

void drain_pending(router_ptr self) {
  auto& st = self->state;
  while (!st.pending.empty()) {
    const uint64_t id = st.pending.front();
    auto it = st.requests.find(id);
    if (it == st.requests.end()) {
      st.pending.pop_front();
      continue;
    }
    auto* w = choose_worker(st, it->second.spec.prompt, it->second.generated.size(), nullptr);
    if (w == nullptr) return;
    st.pending.pop_front();
    dispatch(self, id, *w);
  }
}

void update_gauges(router_ptr self) {
  auto& st = self->state;
  auto& m = st.cfg.metrics;
  if (!m) return;
  m->set("weft_router_pending", static_cast<double>(st.pending.size()));
  m->set("weft_router_running", static_cast<double>(st.requests.size() - st.pending.size()));
  m->set("weft_workers", {{"state", "ready"}}, static_cast<double>(st.workers.size()));
  std::vector<double> levels;
  for (const auto& [name, w] : st.workers) {
    for (size_t i = 0; i < w.levels.size(); ++i) {
      if (levels.size() <= i) levels.resize(i + 1, 0.0);
      levels[i] += w.levels[i];
    }
  }
  for (size_t i = 0; i < levels.size(); ++i)
    m->set("weft_queue_depth", {{"level", std::to_string(i)}}, levels[i]);
}

/// A worker's step-loop seconds by stage: forward, sample, schedule (the rest of the engine's
/// step), outputs, between.
std::map<std::string, double> worker_stage_seconds(const worker_info& w) {
  return {{"forward", w.forward_s},
          {"sample", w.sample_s},
          {"schedule", std::max(0.0, w.step_s - w.forward_s - w.sample_s)},
          {"outputs", w.output_s},
          {"between", w.between_s}};
}

void set_worker_gauges(metrics_registry& m, const worker_info& w) {
  const metric_labels l = {{"worker", w.name}};
  m.set("weft_kv_blocks_used", l, w.kv_used);
  m.set("weft_kv_blocks_free", l, w.kv_free);
  m.set_total("weft_worker_preemptions_total", l, static_cast<double>(w.preemptions));
  m.set("weft_worker_swapped", l, w.n_swapped);
  m.set_total("weft_worker_steps_total", l, static_cast<double>(w.steps));
  m.set_total("weft_worker_prompt_tokens_total", l, static_cast<double>(w.prompt_tokens));
  m.set_total("weft_cache_hit_tokens_total", {{"worker", w.name}, {"source", "local"}},
              static_cast<double>(w.prefix_hits));
  m.set_total("weft_cache_hit_tokens_total", {{"worker", w.name}, {"source", "pool"}},
              static_cast<double>(w.pool_hit_tokens));
  m.set_total("weft_cache_pool_bytes_in_total", l, static_cast<double>(w.pool_bytes_in));
  m.set_total("weft_migration_pool_tokens_total", l, static_cast<double>(w.resume_pool_tokens));
  m.set_total("weft_cache_prefix_waits_total", l, static_cast<double>(w.prefix_waits));
  for (const auto& [stage, secs] : worker_stage_seconds(w)) {
    m.set_total("weft_worker_seconds_total", {{"worker", w.name}, {"stage", stage}}, secs);
  }
}

void on_worker_lost(router_ptr self, const std::string& name, const std::string& why) {
  auto& st = self->state;
  auto it = st.workers.find(name);
  if (it == st.workers.end()) return;
  auto orphans = it->second.inflight;
  spdlog::warn("router: worker {} (node {}, pid {}) lost ({}): migrating {} request(s)", name,
               it->second.node_id, it->second.pid, why, orphans.size());
  if (auto& m = st.cfg.metrics) {
    m->inc("weft_router_worker_deaths_total");
    // The worker's KV is gone with it: its blocks are no longer anyone's.
    const metric_labels l = {{"worker", name}};
    m->set("weft_kv_blocks_used", l, 0);
    m->set("weft_kv_blocks_free", l, 0);
  }
  st.workers.erase(it);
  ++st.deaths;
  const auto now = clock_type::now();
  // Sequences whose KV the lost worker was handing off: their decode worker drops the pull and
  // they start over (prefill of prompt + tokens so far) like the lost worker's own.
  for (auto& [id, r] : st.requests) {
    if (!r.transferring || r.kv_owner != name) continue;
    if (auto d = st.workers.find(r.worker); d != st.workers.end()) {
      d->second.inflight.erase(id);
      self->send(d->second.handle, abort_atom::value, abort_message(id, "KV owner lost"));
    }
    r.transferring = false;
    orphans.insert(id);
  }
  for (uint64_t id : orphans) {
    auto rit = st.requests.find(id);
    if (rit == st.requests.end()) continue;
    auto& r = rit->second;
    release_lease(self, r);
    if (static_cast<int32_t>(r.generated.size()) >= r.spec.params.max_tokens) {
      // Everything was generated; only the finish was lost.
      self->send(r.client, chunk_atom::value,
                 make_client_chunk(id, static_cast<uint32_t>(r.generated.size()), {}, {},
                                   wire::FinishReason::LENGTH,
                                   static_cast<uint32_t>(r.spec.prompt.size()), 0, {}, r.worker));
      st.requests.erase(rit);
      count(self, "ok");
      continue;
    }
    r.spec.attempt += 1;
    r.worker.clear();
    r.orphaned_at = now;
    r.pending_since = now;
    ++st.migrations;
    if (auto& m = st.cfg.metrics) m->inc("weft_router_migrations_total");
    st.pending.push_back(id);
  }
  drain_pending(self);
  update_gauges(self);
}

/// How long (ms) a worker may go without a step or a load report: `--stall-ms`, or a multiple of
/// the longest step any worker reported it may take, whichever is longer (stall_watch.hpp).
uint64_t stall_limit(const router_state& st) {
  uint32_t bound = 0;
  for (const auto& [name, b] : st.step_bounds) bound = std::max(bound, b);
  return stall_limit_ms(st.cfg.stall_ms, bound);
}

/// Why worker `w` counts as hung at `now`, or "" if it does not: it has work but made no engine
/// step for the stall limit (and is past its start-up grace), or sent no load report for that
/// long. `unresponsive` tells which.
std::string hung_reason(const router_state& st, const worker_info& w, clock_type::time_point now,
                        uint64_t now_unix, bool* unresponsive) {
  const auto ms = [](auto d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  };
  const auto stall = static_cast<int64_t>(stall_limit(st));
  if (unresponsive != nullptr) *unresponsive = false;
  if (ms(now - w.hello_at) < stall) return "";
  if (ms(now - w.last_report) >= stall) {
    if (unresponsive != nullptr) *unresponsive = true;
    return "no load report for " + std::to_string(ms(now - w.last_report)) + " ms (limit " +
           std::to_string(stall) + " ms)";
  }
  const bool has_work = w.n_running + w.n_waiting + w.n_swapped > 0 || !w.inflight.empty();
  if (!has_work || w.last_step_unix_ms == 0) return "";
  const int64_t idle = static_cast<int64_t>(now_unix - std::min(now_unix, w.last_step_unix_ms));
  if (idle < stall) return "";
  return "no engine step for " + std::to_string(idle) + " ms (limit " + std::to_string(stall) +
         " ms) with " + std::to_string(w.inflight.size()) + " request(s) in flight";
}

/// Treats every hung worker as dead: its requests migrate now, and its process is ended through
/// cfg.on_hung (the serving app SIGKILLs it, and the node is relaunched like after a crash).
void reap_hung_workers(router_ptr self) {
  auto& st = self->state;
  if (auto& m = st.cfg.metrics) {
    m->set("weft_router_stall_limit_seconds", static_cast<double>(stall_limit(st)) / 1000.0);
  }
  const auto now = clock_type::now();
  const uint64_t now_unix = actors::now_ms();
  std::vector<std::pair<std::string, std::string>> hung;
  for (const auto& [name, w] : st.workers) {
    if (auto why = hung_reason(st, w, now, now_unix, nullptr); !why.empty()) {
      hung.emplace_back(name, why);
    }
  }
  for (const auto& [name, why] : hung) {
    auto it = st.workers.find(name);
    if (it == st.workers.end()) continue;
    const uint32_t pid = it->second.pid;
    const caf::actor handle = it->second.handle;
    spdlog::warn("router: worker {} (pid {}) is hung: {}; treating it as dead", name, pid, why);
    if (auto& m = st.cfg.metrics) m->inc("weft_router_hung_workers_total");
    on_worker_lost(self, name, "hung: " + why);
    self->demonitor(handle);
    if (st.cfg.on_hung) st.cfg.on_hung(name, pid);
  }
}

/// Puts a request back in the queue after its KV handoff failed: it starts over with a prefill of
/// prompt + tokens so far (the client's stream continues where it was).
void requeue_after_handoff(router_ptr self, uint64_t id, const error& why) {
  auto& st = self->state;
  auto& r = st.requests.at(id);
  if (auto w = st.workers.find(r.worker); w != st.workers.end()) w->second.inflight.erase(id);
  release_lease(self, r);
  if (++r.handoff_failures > 3) {
    fail_request(self, id, make_error(why.code, "KV handoff failed 4 times: " + why.message),
                 "error");
    return;
  }
  r.spec.attempt += 1;
  r.worker.clear();
  r.pending_since = clock_type::now();
  st.pending.push_back(id);
  drain_pending(self);
}

void on_handoff(router_ptr self, const envelope& env) {
  auto& st = self->state;
  auto m = env.read<wire::KvHandoff>();
  if (!m) {
    spdlog::warn("router: malformed KvHandoff: {}", m.error().to_string());
    return;
  }
  auto h = from_wire(m->get());
  if (!h) {
    spdlog::warn("router: bad KvHandoff: {}", h.error().to_string());
    return;
  }
  auto sender = caf::actor_cast<caf::actor>(self->current_sender());
  auto from = st.workers.find(h->worker);
  if (from == st.workers.end() || from->second.handle != sender) return;  // not a member (any more)
  auto& metrics = st.cfg.metrics;
  auto it = st.requests.find(h->request_id);
  const bool current = it != st.requests.end() && it->second.spec.attempt == h->attempt &&
                       it->second.worker == h->worker;
  switch (h->stage) {
    case wire::KvHandoffStage::OFFERED: {
      if (!current || it->second.transferring) {
        // Aborted or migrated meanwhile: the offer is nobody's; free it at once.
        kv_handoff rel;
        rel.request_id = h->request_id;
        rel.attempt = h->attempt;
        rel.stage = wire::KvHandoffStage::RELEASE;
        rel.lease_id = h->lease_id;
        rel.worker = "router";
        self->send(sender, handoff_atom::value, to_wire(rel));
        return;
      }
      auto& r = it->second;
      r.transferring = true;
      r.kv_owner = h->worker;
      r.lease_id = h->lease_id;
      auto* d = choose_decoder(st);
      if (d == nullptr) {
        requeue_after_handoff(self, h->request_id,
                              make_error(errc::unavailable, "no decode worker"));
        return;
      }
      from->second.inflight.erase(h->request_id);
      r.worker = d->name;
      d->inflight.insert(h->request_id);
      generate_spec spec = r.spec;
      spec.resume = r.generated;
      spec.handoff = false;
      spec.kv_source = std::move(h->descriptor);
      self->send(d->handle, generate_atom::value, to_wire(spec));
      spdlog::debug("router: request {} ({}): KV lease {} on {} -> {}", h->request_id,
                    r.spec.trace_id, h->lease_id, h->worker, d->name);
      return;
    }
    case wire::KvHandoffStage::PULLED: {
      if (!current || !it->second.transferring) return;
      release_lease(self, it->second);
      if (metrics) {
        metrics->inc("weft_kv_handoffs_total", {{"outcome", "ok"}});
        metrics->inc("weft_kv_transfer_bytes_total", {}, static_cast<double>(h->bytes));
        metrics->observe("weft_kv_transfer_seconds", static_cast<double>(h->micros) * 1e-6);
      }
      return;
    }
    case wire::KvHandoffStage::FAILED: {
      if (!current || !it->second.transferring) return;
      spdlog::warn("router: request {} ({}): KV pull on {} failed ({}); starting over",
                   h->request_id, it->second.spec.trace_id, h->worker, h->err.to_string());
      if (metrics) metrics->inc("weft_kv_handoffs_total", {{"outcome", "failed"}});
      requeue_after_handoff(self, h->request_id, h->err);
      return;
    }
    case wire::KvHandoffStage::EXPIRED:
      spdlog::warn("router: KV lease {} of request {} expired on {}", h->lease_id, h->request_id,
                   h->worker);
      if (metrics) metrics->inc("weft_kv_leases_expired_total");
      return;
    case wire::KvHandoffStage::RELEASE:
      return;
  }
}

caf::behavior router(router_ptr self, router_config cfg) {
  self->state.cfg = std::move(cfg);
  if (self->state.cfg.metrics) declare_router_metrics(*self->state.cfg.metrics);
  cache::directory_config dc;
  dc.max_replicas = self->state.cfg.cache_replicas;
  self->state.directory = cache::pool_directory(dc);
  self->set_down_handler([self](const caf::down_msg& dm) {
    std::string lost;
    for (const auto& [name, w] : self->state.workers) {
      if (w.handle.address() == dm.source) lost = name;
    }
    if (!lost.empty()) on_worker_lost(self, lost, caf::to_string(dm.reason));
    on_shard_down(self, dm.source, caf::to_string(dm.reason));
  });
  self->send(self, tick_atom::value);
  return {
      [self](submit_atom, const envelope& env) -> envelope {
        auto& st = self->state;
        auto req = env.read<wire::GenerateRequest>();
        if (!req) return make_error_envelope(req.error());
        auto spec = from_wire(req->get());
        if (!spec) return make_error_envelope(spec.error());
        if (st.requests.count(spec->request_id) != 0) {
          return make_error_envelope(make_error(errc::already_exists, "request id in use"));
        }
        if (st.requests.size() >= st.cfg.max_outstanding) {
          count(self, "rejected");
          return make_error_envelope(
              make_error(errc::overloaded, "server busy: " + std::to_string(st.requests.size()) +
                                               " requests outstanding (limit " +
                                               std::to_string(st.cfg.max_outstanding) + ")"));
        }
        double ttft_ms = 0.0;
        auto* w = choose_worker(st, spec->prompt, 0, &ttft_ms);
        if (w != nullptr && st.cfg.ttft_slo_ms > 0 && ttft_ms > st.cfg.ttft_slo_ms) {
          count(self, "rejected");
          return make_error_envelope(make_error(
              errc::overloaded,
              fmt::format(
                  "server busy: predicted time to first token {:.0f} ms exceeds the {} ms SLO",
                  ttft_ms, st.cfg.ttft_slo_ms)));
        }
        const uint64_t id = spec->request_id;
        request_info info;
        info.spec = std::move(spec.value());
        info.client = caf::actor_cast<caf::actor>(self->current_sender());
        st.requests.emplace(id, std::move(info));
        if (w != nullptr) {
          dispatch(self, id, *w);
        } else {
          st.pending.push_back(id);
        }
        return accepted();
      },
      [self](abort_atom, const envelope& env) {
        auto& st = self->state;
        auto a = env.read<wire::AbortRequest>();
        if (!a) return;
        const uint64_t id = a->get().getRequestId();
        auto it = st.requests.find(id);
        if (it == st.requests.end()) return;
        if (!it->second.worker.empty()) {
          if (auto w = st.workers.find(it->second.worker); w != st.workers.end()) {
            w->second.inflight.erase(id);
            self->send(w->second.handle, abort_atom::value, env);
          }
        } else {
          st.pending.erase(std::remove(st.pending.begin(), st.pending.end(), id), st.pending.end());
        }
        release_lease(self, it->second);
        st.requests.erase(it);
        count(self, "aborted");
      },
      [self](chunk_atom, const envelope& env) {
        auto& st = self->state;
        auto c = env.read<wire::TokenChunk>();
        if (!c) {
          spdlog::warn("router: malformed TokenChunk: {}", c.error().to_string());
          return;
        }
        auto chunk = c->get();
        const uint64_t id = chunk.getRequestId();
        auto it = st.requests.find(id);
        if (it == st.requests.end()) return;  // aborted, finished, or failed already
        auto& r = it->second;
        if (chunk.getAttempt() != r.spec.attempt) return;  // from an attempt that was migrated away
        const uint32_t have = static_cast<uint32_t>(r.generated.size());
        const uint32_t position = chunk.getPosition();
        if (position > have) {
          spdlog::error("router: request {}: token gap (have {}, chunk at {}) from {}", id, have,
                        position, chunk.getWorker().cStr());
          fail_request(self, id, make_error(errc::internal, "token stream gap"), "error");
          return;
        }
        auto toks = chunk.getTokens();
        auto lps = chunk.getLogprobs();
        std::vector<int32_t> fresh;
        std::vector<std::tuple<int32_t, float, std::vector<std::pair<int32_t, float>>>> fresh_lps;
        for (unsigned i = 0; i < toks.size(); ++i) {
          if (position + i < have) continue;  // a duplicate of a token the client already has
          fresh.push_back(toks[i]);
          if (lps.size() == toks.size()) {
            std::vector<std::pair<int32_t, float>> top;
            for (auto t : lps[i].getTop()) top.emplace_back(t.getToken(), t.getLogprob());
            fresh_lps.emplace_back(lps[i].getToken(), lps[i].getLogprob(), std::move(top));
          }
        }
        std::vector<int32_t> to_client = fresh;
        if (!fresh.empty() && r.orphaned_at && test_hooks::drop_token_on_migration) {
          to_client.erase(to_client.begin());  // the broken build: one token never reaches it
          if (!fresh_lps.empty()) fresh_lps.erase(fresh_lps.begin());
        }
        if (!fresh.empty() && r.orphaned_at) {
          const double s =
              std::chrono::duration<double>(clock_type::now() - *r.orphaned_at).count();
          if (auto& m = st.cfg.metrics) m->observe("weft_migration_resume_seconds", s);
          spdlog::info(
              "router: request {} ({}) resumed on {} {:.0f} ms after its worker died ({} tokens "
              "before)",
              id, r.spec.trace_id, chunk.getWorker().cStr(), s * 1e3, have);
          r.orphaned_at.reset();
        }
        r.generated.insert(r.generated.end(), fresh.begin(), fresh.end());
        const auto finish = chunk.getFinish();
        if (!fresh.empty() && finish == wire::FinishReason::NONE) {
          if (auto w = st.workers.find(r.worker); w != st.workers.end())
            checkpoint_pool(self, r, w->second);
        }
        error err;
        if (chunk.hasError())
          err = make_error(schema::from_wire(chunk.getError().getCode()),
                           chunk.getError().getMessage().cStr());
        if (fresh.empty() && finish == wire::FinishReason::NONE) return;
        self->send(
            r.client, chunk_atom::value,
            make_client_chunk(id, have, to_client, fresh_lps, finish, chunk.getPromptTokens(),
                              chunk.getCachedTokens(), err, r.worker, chunk.getEmbedding()));
        if (finish != wire::FinishReason::NONE) {
          if (auto w = st.workers.find(r.worker); w != st.workers.end())
            w->second.inflight.erase(id);
          st.requests.erase(it);
          count(self, finish == wire::FinishReason::ERROR ? "error" : "ok");
        }
      },
      [self](handoff_atom, const envelope& env) { on_handoff(self, env); },
      [self](cache_load_atom, const envelope& env) { on_shard_load(self, env); },
      [self](cache_replicated_atom, uint64_t key, const std::string& shard, bool ok) {
        on_replica_copied(self, key, shard, ok);
      },
      [self](hello_atom, const envelope& env) {
        auto& st = self->state;
        auto h = env.read<wire::WorkerHello>();
        if (!h) {
          spdlog::warn("router: malformed WorkerHello: {}", h.error().to_string());
          return;
        }
        auto hello = h->get();
        const std::string name = hello.getName().cStr();
        const std::string fields = name + "|" + hello.getNodeId().cStr();
        auto token = hello.getSessionToken();
        if (auto ok =
                actors::verify_request_token(st.cfg.secret, worker_hello_purpose, fields,
                                             hello.getDeadlineMs(), token.begin(), token.size());
            !ok.ok()) {
          spdlog::warn("router: refused hello from '{}': {}", name, ok.to_string());
          return;
        }
        if (hello.getRole() == wire::WorkerRole::CACHE_SHARD) {
          on_shard_hello(self, name, hello);
          return;
        }
        auto sender = caf::actor_cast<caf::actor>(self->current_sender());
        if (auto old = st.workers.find(name);
            old != st.workers.end() && old->second.handle != sender) {
          on_worker_lost(self, name, "replaced by a new incarnation");
        }
        worker_info& w = st.workers[name];
        const bool fresh = !w.handle;
        w.name = name;
        w.handle = sender;
        w.node_id = hello.getNodeId().cStr();
        w.pid = hello.getPid();
        w.role = hello.getRole();
        w.model = hello.getModel().cStr();
        w.policy = hello.getPolicy().cStr();
        w.kv_blocks_total = hello.getKvBlocksTotal();
        w.max_running = hello.getMaxRunning();
        w.n_ctx = hello.getNCtx();
        w.block_size = hello.getBlockSize();
        w.segment_tokens = hello.getSegmentTokens();
        w.pool_key_config = {};
        if (w.segment_tokens > 0 && hello.getPoolKeyLayout().size() > 0) {
          w.pool_key_config.model_id = hello.getPoolKeyModel().cStr();
          w.pool_key_config.kv_layout = hello.getPoolKeyLayout().cStr();
          w.pool_key_config.segment_tokens = static_cast<int64_t>(w.segment_tokens);
        }
        w.kv_bytes_per_token = hello.getKvBytesPerToken();
        w.recent.set_capacity(static_cast<size_t>(w.kv_blocks_total) *
                              std::max<uint32_t>(w.block_size, 1) /
                              static_cast<size_t>(key_tokens(w)));
        w.kv_free = w.kv_blocks_total;
        w.hello_at = clock_type::now();
        w.last_report = clock_type::now();
        if (fresh) {
          self->monitor(sender);
          send_shards(self, sender);
          spdlog::info("router: worker {} ready on node {} (pid {}, model {}, policy {})", name,
                       w.node_id, w.pid, w.model, w.policy);
        }
        drain_pending(self);
        update_gauges(self);
      },
      [self](load_atom, const envelope& env) {
        auto& st = self->state;
        auto l = env.read<wire::WorkerLoad>();
        if (!l) return;
        auto load = l->get();
        auto it = st.workers.find(load.getName().cStr());
        if (it == st.workers.end()) return;
        auto& w = it->second;
        if (caf::actor_cast<caf::actor>(self->current_sender()) != w.handle) return;
        w.n_waiting = load.getNWaiting();
        w.n_running = load.getNRunning();
        w.n_swapped = load.getNSwapped();
        w.kv_used = load.getKvBlocksUsed();
        w.kv_free = load.getKvBlocksFree();
        w.steps = load.getSteps();
        w.preemptions = load.getPreemptions();
        w.prefill_tokens = load.getPrefillTokens();
        w.decode_tokens = load.getDecodeTokens();
        w.swaps_out = load.getSwapsOut();
        w.prefix_hits = load.getPrefixHitTokens();
        w.prefix_waits = load.getPrefixWaits();
        w.queued_prefill_tokens = load.getQueuedPrefillTokens();
        w.last_step_unix_ms = load.getLastStepUnixMs();
        // Kept by name after the worker is gone (its replacement has measured nothing yet), and
        // while it reports none (no step in its window): the host is no faster for it.
        if (load.getStepBoundMs() > 0) st.step_bounds[w.name] = load.getStepBoundMs();
        w.pool_hit_tokens = load.getPoolHitTokens();
        w.prompt_tokens = load.getPromptTokens();
        w.pool_bytes_in = load.getPoolBytesIn();
        w.resume_pool_tokens = load.getResumePoolTokens();
        w.step_s = load.getStepSeconds();
        w.forward_s = load.getForwardSeconds();
        w.sample_s = load.getSampleSeconds();
        w.output_s = load.getOutputSeconds();
        w.between_s = load.getBetweenSeconds();
        w.levels.clear();
        for (auto x : load.getQueueDepthPerLevel()) w.levels.push_back(x);
        // Only intervals with prefill work say something about the prefill rate.
        if (load.getPrefillTokensPerS() > 0.0f) {
          w.prefill_rate = w.prefill_rate <= 0.0f
                               ? load.getPrefillTokensPerS()
                               : 0.7f * w.prefill_rate + 0.3f * load.getPrefillTokensPerS();
        }
        if (load.getDecodeTokensPerS() > 0.0f) {
          w.decode_rate = w.decode_rate <= 0.0f
                              ? load.getDecodeTokensPerS()
                              : 0.7f * w.decode_rate + 0.3f * load.getDecodeTokensPerS();
        }
        w.dispatched_prompt_tokens = 0;
        w.last_report = clock_type::now();
        if (auto& m = st.cfg.metrics) set_worker_gauges(*m, w);
      },
      [self](tick_atom) {
        if (!actors::from_self(self)) return;
        auto& st = self->state;
        const auto now = clock_type::now();
        // Requests that found no live worker in time fail explicitly.
        for (auto it = st.pending.begin(); it != st.pending.end();) {
          auto r = st.requests.find(*it);
          if (r == st.requests.end()) {
            it = st.pending.erase(it);
            continue;
          }
          if (now - r->second.pending_since > std::chrono::milliseconds(st.cfg.queue_timeout_ms)) {
            const uint64_t id = *it;
            it = st.pending.erase(it);
            fail_request(
                self, id,
                make_error(errc::unavailable, "no engine worker available for " +
                                                  std::to_string(st.cfg.queue_timeout_ms) + " ms"),
                "unavailable");
            continue;
          }
          ++it;
        }
        reap_hung_workers(self);
        // Once a second: memory rebalancing between the pool's shards.
        if (++st.ticks % 10 == 0) rebalance_pool(self);
        update_gauges(self);
        self->delayed_send(self, std::chrono::milliseconds(100), tick_atom::value);
      },
      [self](status_atom) -> std::string {
        auto& st = self->state;
        const auto now = clock_type::now();
        const uint64_t now_unix = actors::now_ms();
        nlohmann::json workers = nlohmann::json::array();
        bool healthy = false;
        for (const auto& [name, w] : st.workers) {
          const auto since_report_ms =
              std::chrono::duration_cast<std::chrono::milliseconds>(now - w.last_report).count();
          const bool has_work = w.n_running + w.n_waiting + w.n_swapped > 0 || !w.inflight.empty();
          bool unresponsive = false;
          const bool hung = !hung_reason(st, w, now, now_unix, &unresponsive).empty();
          const bool reporting = !unresponsive;
          const bool stepping = !hung || unresponsive;
          const std::string state = !reporting  ? "unresponsive"
                                    : !stepping ? "stalled"
                                    : has_work  ? "busy"
                                                : "idle";
          healthy = healthy || (reporting && stepping);
          workers.push_back(
              {{"name", name},
               {"node_id", w.node_id},
               {"pid", w.pid},
               {"role", w.role == wire::WorkerRole::PREFILL  ? "prefill"
                        : w.role == wire::WorkerRole::DECODE ? "decode"
                                                             : "both"},
               {"state", state},
               {"model", w.model},
               {"policy", w.policy},
               {"inflight", w.inflight.size()},
               {"running", w.n_running},
               {"waiting", w.n_waiting},
               {"swapped", w.n_swapped},
               {"kv_blocks_used", w.kv_used},
               {"kv_blocks_free", w.kv_free},
               {"kv_blocks_total", w.kv_blocks_total},
               {"steps", w.steps},
               {"stage_seconds", worker_stage_seconds(w)},
               {"preemptions", w.preemptions},
               {"prefill_tokens", w.prefill_tokens},
               {"decode_tokens", w.decode_tokens},
               {"prefix_hit_tokens", w.prefix_hits},
               {"prefix_waits", w.prefix_waits},
               {"pool_hit_tokens", w.pool_hit_tokens},
               {"prompt_tokens", w.prompt_tokens},
               {"queue_depth_per_level", w.levels},
               {"prefill_tokens_per_s", w.prefill_rate},
               {"decode_tokens_per_s", w.decode_rate},
               {"last_report_ms_ago", since_report_ms},
               {"step_bound_ms", st.step_bounds.contains(name) ? st.step_bounds.at(name) : 0u}});
        }
        nlohmann::json shards = nlohmann::json::array();
        for (const auto& [name, s] : st.shards) {
          shards.push_back({{"name", name},
                            {"node_id", s.node_id},
                            {"pid", s.pid},
                            {"segments", s.n_segments},
                            {"bytes_used", s.bytes_used},
                            {"capacity_bytes", s.capacity_bytes},
                            {"lookups", s.lookups},
                            {"hits", s.hits},
                            {"publishes", s.publishes},
                            {"evictions", s.evictions}});
        }
        nlohmann::json j = {{"healthy", healthy},
                            {"workers", workers},
                            {"shards", shards},
                            {"pending", st.pending.size()},
                            {"outstanding", st.requests.size()},
                            {"worker_deaths", st.deaths},
                            {"migrations", st.migrations},
                            {"stall_limit_ms", stall_limit(st)}};
        return j.dump();
      },
  };
}

}  // namespace router_internal

caf::actor spawn_router(caf::actor_system& sys, router_config cfg) {
  return sys.spawn(router_internal::router, std::move(cfg));
}

}  // namespace weft::serve
