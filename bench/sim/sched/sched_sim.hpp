#pragma once
/// An iteration-level simulator of one engine worker: it drives a real `gpu::schedule_policy`
/// (fcfs_policy, serve::mlfq_policy, ...) exactly as `gpu::engine` does — rank every live request
/// each step, run the first `max_running`, decodes first and prompt chunks after them up to
/// `max_batch_tokens`, report progress, forget finished requests — and replaces the forward pass by
/// a step-time model fitted from measurements. It answers "what would this policy do on this
/// workload at this rate" in milliseconds instead of minutes, with the same policy code.
///
/// Not modelled: KV-cache capacity (no swapping; every admitted request keeps its KV), sampling
/// and stop strings (a request generates exactly its output length), the HTTP/actor path (one
/// fixed per-request overhead). Plain C++: no CAF, no device.

#include <cstdint>
#include <vector>

#include "gpu/schedule_policy.hpp"

namespace weft::bench::sim {

/// One request of a simulated run.
struct sim_request {
  double arrival_s = 0.0;     ///< Arrival time from the start of the run (non-decreasing).
  int64_t prompt_tokens = 1;  ///< >= 1.
  int64_t output_tokens = 1;  ///< Tokens to generate (>= 1); the first comes with the prefill.
};

/// Duration of one forward pass: base + per_seq x (sequences that sample a token) + per_prefill x
/// (prompt tokens in the pass). The defaults were fitted on a 2-vCPU AVX-512 VM serving
/// SmolLM2-135M Q4_1 with one worker (docs/serving.md, "Scheduling simulator"): refit them for
/// another machine or model from `gpu_engine_bench` and `weft bench serve` figures.
struct step_model {
  double base_ms = 6.2;
  double per_seq_ms = 1.9;
  double per_prefill_token_ms = 1.0;
  /// Added once to every request's TTFT and E2E: HTTP, router and streaming latency.
  double overhead_ms = 2.0;

  double step_ms(int64_t n_sampling, int64_t n_prefill_tokens) const {
    return base_ms + per_seq_ms * static_cast<double>(n_sampling) +
           per_prefill_token_ms * static_cast<double>(n_prefill_tokens);
  }
};

/// The engine settings the simulator honours.
struct sim_engine_config {
  int64_t max_running = 4;         ///< Batch slots (as `weft serve --max-running`).
  int64_t max_batch_tokens = 512;  ///< Tokens per forward pass (decodes + prompt chunks).
  /// A pass without decodes may take this many prompt tokens (the engine's idle_batch_tokens;
  /// `weft serve --idle-batch-tokens`). 0 or less than max_batch_tokens: max_batch_tokens.
  int64_t idle_batch_tokens = 0;
  step_model model;
};

/// What happened to one request.
struct sim_outcome {
  double ttft_s = 0.0;      ///< Arrival -> first token (+ overhead).
  double e2e_s = 0.0;       ///< Arrival -> last token (+ overhead).
  int64_t preemptions = 0;  ///< Times it ran in a pass and was left out of the next while live.
};

/// Totals of a run.
struct sim_run {
  std::vector<sim_outcome> outcomes;  ///< In request order.
  double makespan_s = 0.0;            ///< Time the last request finished.
  double busy_s = 0.0;                ///< Time spent in forward passes.
  int64_t steps = 0;
};

/// Shortest remaining output first, knowing every request's output length. Not a deployable
/// policy (a server does not know how long a reply will be): the clairvoyant bound a size-blind
/// policy such as MLFQ is measured against. Ties go by arrival. `requests` must outlive it and be
/// the vector passed to simulate() (request ids are indices into it).
class srpt_oracle final : public gpu::schedule_policy {
 public:
  explicit srpt_oracle(const std::vector<sim_request>& requests) : requests_(requests) {}
  std::string_view name() const override { return "srpt"; }
  void on_add(const gpu::sched_request&) override {}
  void on_progress(gpu::request_id, int64_t, int64_t) override {}
  void on_finish(gpu::request_id) override {}
  void rank(std::vector<gpu::sched_request>& live, int64_t now_step) override;

 private:
  const std::vector<sim_request>& requests_;
};

/// Least attained service: fewest tokens generated first (ties by arrival) — MLFQ's limit with
/// one-token quanta and unboundedly many queues, and the best size-blind order for sizes with a
/// decreasing hazard rate such as Pareto. A reference for how much MLFQ's coarse levels cost.
class las_policy final : public gpu::schedule_policy {
 public:
  std::string_view name() const override { return "las"; }
  void on_add(const gpu::sched_request&) override {}
  void on_progress(gpu::request_id, int64_t, int64_t) override {}
  void on_finish(gpu::request_id) override {}
  void rank(std::vector<gpu::sched_request>& live, int64_t now_step) override;
};

/// Runs `requests` through `policy` (a fresh instance: policies keep per-request state).
/// Requests must be sorted by arrival. Deterministic.
sim_run simulate(const std::vector<sim_request>& requests, gpu::schedule_policy& policy,
                 const sim_engine_config& config);

}  // namespace weft::bench::sim
