// Worker choice of the router: prefill placement by the configured route (TTFT estimates, cache
// affinity, ties), decode placement for hand-offs. See router_state.hpp.
#include <algorithm>

#include "actors/serve/router_state.hpp"

namespace weft::serve::router_internal {

bool can_prefill(const worker_info& w) {
  return w.role != wire::WorkerRole::DECODE;
}

bool has_decoder(const router_state& st) {
  return std::any_of(st.workers.begin(), st.workers.end(),
                     [](const auto& kv) { return kv.second.role == wire::WorkerRole::DECODE; });
}

/// The decode worker for a handed-off sequence: the fewest live sequences per slot, then the most
/// free KV blocks.
worker_info* choose_decoder(router_state& st) {
  worker_info* best = nullptr;
  double best_load = 0.0;
  for (auto& [name, w] : st.workers) {
    if (w.role != wire::WorkerRole::DECODE) continue;
    const double load = static_cast<double>(std::max<size_t>(w.n_running, w.inflight.size())) /
                            std::max<uint32_t>(w.max_running, 1) -
                        1e-6 * w.kv_free;
    if (best == nullptr || load < best_load) {
      best = &w;
      best_load = load;
    }
  }
  return best;
}

/// Predicted time to first token of a `prompt_tokens` prompt on `w`, in ms; `cached` (when given)
/// is what its cache or the pool already holds (the pool's part costs a transfer).
double predicted_ttft_ms(const router_state& st, const worker_info& w, size_t prompt_tokens,
                         const cache_estimate& cached) {
  const double rate = w.prefill_rate > 1.0f ? w.prefill_rate : st.cfg.prefill_tokens_per_s_hint;
  const int64_t hit = std::max(cached.local_tokens, cached.pool_tokens);
  const double transfer_ms =
      cached.pool_tokens > cached.local_tokens
          ? static_cast<double>((cached.pool_tokens - cached.local_tokens) * w.kv_bytes_per_token) /
                (st.cfg.pool_gbps * 1e6)
          : 0.0;
  const double queued =
      static_cast<double>(w.queued_prefill_tokens + w.dispatched_prompt_tokens + prompt_tokens) -
      static_cast<double>(hit);
  // Sequences beyond max_running wait for a slot: a rough extra delay of one decode pass each.
  double slot_wait_ms = 0.0;
  if (w.max_running > 0 && w.n_running + w.inflight.size() >= w.max_running &&
      w.decode_rate > 1.0f) {
    slot_wait_ms = 1000.0 * static_cast<double>(w.n_waiting + 1) / w.decode_rate * w.max_running;
  }
  return 1000.0 * std::max(queued, 0.0) / rate + slot_wait_ms + transfer_ms;
}

/// Two TTFT estimates closer than max(margin_ms, share x the lower one) count as a tie.
constexpr double route_tie_margin_ms = 1.0;
constexpr double route_tie_margin_share = 0.1;

/// The worker for a prompt (prompt + `extra` resumed tokens) by the configured route; its
/// predicted TTFT in *ttft_ms.
worker_info* choose_worker(router_state& st, std::span<const int32_t> prompt, size_t extra,
                           double* ttft_ms) {
  worker_info* best = nullptr;
  double best_ms = 0.0;
  const size_t n = prompt.size() + extra;
  std::vector<worker_info*> able;
  for (auto& [name, w] : st.workers) {
    if (can_prefill(w)) able.push_back(&w);
  }
  if (able.empty()) return nullptr;
  const auto& route = st.cfg.route;
  if (route == "round-robin") {
    best = able[st.round_robin++ % able.size()];
    best_ms = predicted_ttft_ms(st, *best, n);
  } else if (route == "cache-affinity") {
    const auto keys = prefix_keys(*able.front(), prompt);
    size_t best_local = 0;
    for (auto* w : able) {
      const auto c = estimate_cache(st, *w, keys, prompt.size());
      const double ms = predicted_ttft_ms(st, *w, n, c);
      const auto local = static_cast<size_t>(c.local_tokens);
      if (best == nullptr || local > best_local || (local == best_local && ms < best_ms)) {
        best = w;
        best_ms = ms;
        best_local = local;
      }
    }
  } else {
    // least-ttft, or least-load (no cache term). Resumed sequences (extra > 0) replay tokens the
    // caches never saw: only the prompt can hit.
    const auto keys =
        route == "least-load" ? std::vector<uint64_t>{} : prefix_keys(*able.front(), prompt);
    // least-load ranks by the work already queued (an idle worker is idle however fast its last
    // prompts ran); least-ttft by the full estimate. Either reports the full estimate.
    const bool load_only = route == "least-load";
    std::vector<double> ms(able.size());
    std::vector<double> full(able.size());
    for (size_t i = 0; i < able.size(); ++i) {
      const auto c =
          keys.empty() ? cache_estimate{} : estimate_cache(st, *able[i], keys, prompt.size());
      full[i] = predicted_ttft_ms(st, *able[i], n, c);
      ms[i] = load_only ? predicted_ttft_ms(st, *able[i], 0) : full[i];
    }
    // Estimates within the tie margin are equal (each worker's prefill rate is a noisy
    // measurement): equal ones take turns, so idle workers share the load instead of the first
    // one (or the one whose rate measured a little higher) taking every request.
    const double low = *std::min_element(ms.begin(), ms.end());
    const double bound = low + std::max(route_tie_margin_ms, low * route_tie_margin_share);
    std::vector<size_t> tied;
    for (size_t i = 0; i < able.size(); ++i) {
      if (ms[i] <= bound) tied.push_back(i);
    }
    // A tie never turns a request that a tied worker could serve within the SLO into a rejection.
    if (st.cfg.ttft_slo_ms > 0) {
      std::vector<size_t> within;
      for (size_t i : tied) {
        if (full[i] <= st.cfg.ttft_slo_ms) within.push_back(i);
      }
      if (!within.empty()) tied = std::move(within);
    }
    const size_t pick = tied[st.tie_turn++ % tied.size()];
    best = able[pick];
    best_ms = full[pick];
  }
  if (ttft_ms != nullptr) *ttft_ms = best_ms;
  return best;
}

}  // namespace weft::serve::router_internal
