#pragma once
/// The per-iteration scheduling policy interface of the engine, and the default FCFS policy.
///
/// Every `engine::step()` asks the policy to rank all live requests (waiting, resident on the
/// device, or swapped to host memory), highest priority first. The engine then runs the first
/// `max_running` requests in that order whose KV fits; a higher-ranked request that needs blocks
/// displaces lower-ranked ones (they pause with their KV kept, or are swapped to host memory when
/// blocks are short). The policy only orders; the engine owns memory, batching and correctness.
///
/// Policies are plain classes (no CAF, no device): the simulator can run the same code. A policy
/// object keeps per-request state, so give each engine its own instance. Called from the engine's
/// thread only; implementations need no locking and must not throw.

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

namespace weft::gpu {

/// Caller-chosen request identifier.
using request_id = uint64_t;

/// Where a live request's KV is.
enum class sched_state {
  waiting,   ///< Not admitted yet: no KV anywhere.
  resident,  ///< KV on the device (running, or paused by a higher-ranked request).
  swapped,   ///< KV in host memory; must be swapped in before it runs again.
};

/// What a policy sees of one live request when ranking.
struct sched_request {
  request_id id = 0;
  uint64_t arrival = 0;     ///< Engine-wide arrival order (add_request calls), unique, increasing.
  int64_t n_prompt = 0;     ///< Prompt tokens.
  int64_t n_generated = 0;  ///< Tokens sampled so far.
  int64_t n_computed = 0;   ///< Tokens whose K/V are computed (includes prefix-cache hits).
  sched_state state = sched_state::waiting;
  bool scheduled_last_step = false;  ///< It had tokens in the previous forward pass.
  int32_t priority = 0;              ///< sampling_params::priority (lower first).
};

/// A scheduling policy: ranks live requests every iteration.
class schedule_policy {
 public:
  virtual ~schedule_policy() = default;

  /// Short stable name ("fcfs", "mlfq"), for logs and metrics.
  virtual std::string_view name() const = 0;
  /// A request was added to the engine (state waiting, nothing computed).
  virtual void on_add(const sched_request& r) = 0;
  /// After a forward pass, once per request that had tokens in it: `prefill_tokens` prompt tokens
  /// and `decode_tokens` generated tokens were computed for `id` in that iteration.
  virtual void on_progress(request_id id, int64_t prefill_tokens, int64_t decode_tokens) = 0;
  /// The request left the engine (finished, aborted or failed); forget it.
  virtual void on_finish(request_id id) = 0;
  /// Reorders `live` (all live requests, given in arrival order) highest priority first. Must keep
  /// exactly the same elements: the engine rejects a step whose ranking adds, drops or repeats one.
  /// `now_step` is the engine's iteration counter (increases by one per step() call).
  virtual void rank(std::vector<sched_request>& live, int64_t now_step) = 0;
};

/// First come, first served: arrival order, no preemption by priority. The engine's default; with
/// it the engine behaves as a plain FCFS continuous-batching engine (running requests are never
/// displaced by later arrivals; KV shortage swaps out the most recently arrived request).
/// Stateless.
class fcfs_policy final : public schedule_policy {
 public:
  std::string_view name() const override { return "fcfs"; }
  void on_add(const sched_request&) override {}
  void on_progress(request_id, int64_t, int64_t) override {}
  void on_finish(request_id) override {}
  void rank(std::vector<sched_request>& live, int64_t) override {
    std::sort(live.begin(), live.end(),
              [](const sched_request& a, const sched_request& b) { return a.arrival < b.arrival; });
  }
};

/// Priority scheduling (vLLM's `--scheduling-policy priority`): lower sampling_params::priority
/// first, ties in arrival order. Preemptive: a request that outranks running ones takes their
/// place in the batch when `max_running` or the KV is short (they pause with their KV kept, or
/// are swapped to host memory). With every priority equal it ranks as fcfs_policy. Stateless.
class priority_policy final : public schedule_policy {
 public:
  std::string_view name() const override { return "priority"; }
  void on_add(const sched_request&) override {}
  void on_progress(request_id, int64_t, int64_t) override {}
  void on_finish(request_id) override {}
  void rank(std::vector<sched_request>& live, int64_t) override {
    std::sort(live.begin(), live.end(), [](const sched_request& a, const sched_request& b) {
      return a.priority != b.priority ? a.priority < b.priority : a.arrival < b.arrival;
    });
  }
};

}  // namespace weft::gpu
