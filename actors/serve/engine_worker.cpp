// The engine worker role: an engine on its own thread (a detached actor), fed by the router.

#include "actors/serve/engine_worker.hpp"

#include "actors/private_messages.hpp"
#include "actors/serve/engine_worker_state.hpp"
#include "gpu/cpu/thread_class.hpp"
#include "gpu/grammar.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>
#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <chrono>
#include <deque>
#include <map>
#include <thread>
#include <unordered_set>

#include "actors/auth.hpp"
#include "actors/cache/rma_pull.hpp"
#include "actors/cache/segment_keys.hpp"
#include "actors/runtime.hpp"
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

namespace worker_internal {

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
    if (!out.embedding.empty()) {
      auto e = b.initEmbedding(static_cast<unsigned>(out.embedding.size()));
      for (size_t i = 0; i < out.embedding.size(); ++i)
        e.set(static_cast<unsigned>(i), out.embedding[i]);
    }
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
  const auto decode = static_cast<uint64_t>(s.n_decode_tokens);
  // The prefill rate is the speed of the passes that prefilled (0: none in this interval), not
  // prompt tokens per wall second: a worker whose prompts the prefix cache mostly serves, or that
  // prefills now and then, is not slow to prefill.
  const double pass_s = s.prefill_pass_s - st.last_prefill_pass_s;
  const float prefill_rate =
      pass_s > 0
          ? static_cast<float>(
                static_cast<double>(s.prefill_pass_tokens - st.last_prefill_pass_tokens) / pass_s)
          : 0.0f;
  const float decode_rate =
      dt > 0 ? static_cast<float>(static_cast<double>(decode - st.last_decode) / dt) : 0.0f;
  st.last_prefill_pass_s = s.prefill_pass_s;
  st.last_prefill_pass_tokens = s.prefill_pass_tokens;
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
    b.setPrefillTokens(static_cast<uint64_t>(s.n_prefill_tokens));
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
    b.setPrefixWaits(static_cast<uint64_t>(s.n_prefix_waits));
    b.setLastStepUnixMs(st.last_step_unix_ms);
    b.setStepBoundMs(st.steps.bound_ms(
        std::max({st.cfg.max_batch_tokens, st.cfg.idle_batch_tokens, st.rebuild_batch_tokens}),
        actors::now_ms()));
    b.setPoolHitTokens(st.pool_hit_tokens);
    b.setPromptTokens(st.prompt_tokens);
    b.setPoolBytesIn(st.pool_bytes_in);
    b.setResumePoolTokens(st.resume_pool_tokens);
    b.setCheckpointSegments(st.checkpoint_segments);
    b.setStepSeconds(s.step_s);
    b.setForwardSeconds(s.forward_s);
    b.setSampleSeconds(s.sample_s);
    b.setOutputSeconds(st.output_s);
    b.setBetweenSeconds(st.between_s);
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
    caf::send_as(me, me, pulled_atom::value, pull_id);
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

/// While this worker rebuilds requests migrated from a dead (or hung) worker, it computes with
/// every core of the machine — the dead worker's included, idle until its replacement has loaded —
/// and goes back to its own threads once each has its first new token (docs/serving.md,
/// "Recovery"). The logits do not depend on the thread count, so the tokens are the same.
void update_borrowed_cores(worker_ptr self) {
  auto& st = self->state;
  if (!st.host || !st.host->dev) return;
  auto& dev = *st.host->dev;
  const int own = dev.capabilities().n_compute_threads;
  if (dev.max_compute_threads() <= own) return;
  size_t rebuilding = 0;
  for (const auto& [id, r] : st.requests) rebuilding += r.rebuilding ? 1 : 0;
  if (rebuilding > 0 && !st.borrowing_cores) {
    dev.set_compute_threads(dev.max_compute_threads());
    st.borrowing_cores = true;
    spdlog::info("worker {}: rebuilding {} migrated request(s) on {} threads (own: {})",
                 st.worker_name, rebuilding, dev.max_compute_threads(), own);
  } else if (rebuilding == 0 && st.borrowing_cores) {
    dev.set_compute_threads(own);
    st.borrowing_cores = false;
    spdlog::info("worker {}: migrated requests rebuilt; back to {} thread(s)", st.worker_name, own);
  }
}

void run_step(worker_ptr self) {
  auto& st = self->state;
  using clock = std::chrono::steady_clock;
  if (st.step_sent) {
    st.between_s += std::chrono::duration<double>(clock::now() - st.step_sent_at).count();
    st.step_sent = false;
  }
  if (!st.engine->has_work()) {
    st.stepping = false;
    update_borrowed_cores(self);
    return;
  }
  const int64_t tokens_before = st.engine->tokens_computed();
  const auto step_at = clock::now();
  auto outs = st.engine->step();
  const auto stepped_at = clock::now();
  st.last_step_unix_ms = actors::now_ms();
  st.steps.record(std::chrono::duration<double, std::milli>(stepped_at - step_at).count(),
                  st.engine->tokens_computed() - tokens_before, st.last_step_unix_ms);
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
      if (!out.new_tokens.empty()) r.rebuilding = false;
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
  update_borrowed_cores(self);
  st.step_sent_at = clock::now();
  st.output_s += std::chrono::duration<double>(st.step_sent_at - stepped_at).count();
  st.step_sent = true;
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
  if (d.params.pooling != gpu::pooling_type::none) {
    // An embedding is computed here from its whole prompt: no KV handoff, no prefix from the pool
    // (mean pooling needs every token's state).
    d.handoff = false;
    d.pool_plan.clear();
  }
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
               ? st.engine->add_prefilled_request(id, prefilled, std::move(tokens), std::move(p),
                                                  n_resumed)
               : st.engine->add_resumed_request(id, std::move(tokens), n_resumed, std::move(p));
  if (!s.ok()) {
    self->send(st.router, chunk_atom::value,
               error_chunk(st.worker_name, id, d.attempt, n_resumed, errc::invalid_argument,
                           s.to_string()));
    return;
  }
  // A retried request (its worker died, or its KV handoff failed) has kept its client waiting
  // already: it goes ahead of this worker's queue until its first token (docs/serving.md).
  if (d.attempt > 0) (void)st.engine->expedite(id);
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
  rr.rebuilding = n_resumed > 0;
  st.requests[id] = std::move(rr);
  if (n_resumed > 0) update_borrowed_cores(self);
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
  // A detached actor: loading the weights here blocks only this actor's own thread, which runs
  // every forward pass (a compute thread, also where no CPU thread pool drives them: CUDA).
  gpu::cpu::enter_compute_class();
  model_host_options mo;
  mo.path = st.cfg.model;
  mo.device = st.cfg.device;
  mo.threads = st.cfg.threads;
  mo.weights_memory = *gpu::parse_gguf_memory(st.cfg.weights_memory);
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
  // Rebuilding migrated requests: passes of up to 256 tokens (or the worker's own budget if more).
  ec.rebuild_batch_tokens = std::max<int64_t>(256, st.cfg.max_batch_tokens);
  st.rebuild_batch_tokens = ec.rebuild_batch_tokens;
  ec.idle_batch_tokens = st.cfg.idle_batch_tokens;
  ec.prefix_cache = st.cfg.prefix_cache;
  const gpu::tokenizer* tk = &st.host->tok;
  ec.detokenize = [tk](int32_t id) { return tk->token_to_piece(id); };
  ec.vocab = gpu::grammar::token_trie::of(*tk);  // structured outputs' token masks
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
  result<caf::actor> router = make_error(errc::unavailable, "not tried");
  for (int i = 0; i < 50; ++i) {
    router = actors::connect_actor(self->system(), st.cfg.router_host, st.cfg.router_port);
    if (router) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!router) {
    const std::string why = router.error().message;
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
      [self](pulled_atom, uint64_t pull_id) {
        if (actors::from_self(self)) on_pulled(self, pull_id);
      },
      [self](pulled_atom, uint64_t pull_id, bool ok, const std::string& err) {
        if (!actors::from_self(self)) return;
        on_fetch_pulled(self, pull_id, ok, err);
      },
      [self](shards_atom, std::vector<std::string> names, std::vector<caf::actor> handles) {
        on_shards(self, std::move(names), std::move(handles));
      },
      [self](cache_reply_atom, const envelope& env) { on_cache_reply(self, env); },
      [self](cache_done_atom, const envelope& env) { on_publish_done(self, env); },
      [self](cache_ckpt_atom, const envelope& env) { on_pool_checkpoint(self, env); },
      [self](fetch_timeout_atom, uint64_t id) {
        if (actors::from_self(self)) on_fetch_timeout(self, id);
      },
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
      [self](step_atom) {
        if (actors::from_self(self)) run_step(self);
      },
      [self](tick_atom) {
        if (!actors::from_self(self)) return;
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

}  // namespace worker_internal

void add_serve_roles(actors::role_registry& roles) {
  roles.add("engine_worker", worker_internal::spawn_engine_worker);
}

}  // namespace weft::serve
