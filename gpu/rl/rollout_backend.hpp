#pragma once
/// Where `weft rl`'s rollouts are generated (docs/rl.md, "Rollout agents"): the GRPO loop adds
/// rollout requests, polls for their tokens and publishes every new weight version through this
/// interface, and never sees whether one engine in its own process (`local_rollout_backend`) or
/// rollout agents in other processes (actors/rl/, `weft rl --agents N`) do the work.
///
/// Contract, for every backend:
/// - `add` queues requests; each one's tokens come back from `poll` in order, each output tagged
///   with the weight version its tokens were sampled with, until one output finishes it.
/// - `poll` blocks until at least one output is ready or nothing is in flight; an output of an
///   aborted request may still arrive (finish == aborted).
/// - `publish(version, tensors)` makes `version` the weights of every request started after it
///   returns; requests in flight continue with it from their next token (their KV is kept).
/// Plain classes, no CAF.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/engine.hpp"
#include "gpu/gguf.hpp"
#include "gpu/model.hpp"
#include "gpu/status.hpp"
#include "gpu/train/trainable_model.hpp"

namespace weft::gpu::rl {

/// One rollout: a prompt (followed by `n_replay` tokens generated before, when it moves from a
/// lost agent) and how to sample it.
struct rollout_request {
  request_id id = 0;
  std::vector<int32_t> prompt;
  int64_t n_replay = 0;
  sampling_params params;
  /// Requests that share a prompt and should run on one agent (a GRPO group); -1: none.
  int64_t group = -1;
};

/// Tokens of one request from one engine step, and the weight version that sampled them.
struct rollout_output {
  request_output out;
  int64_t version = 0;
};

/// A tensor of the trainer's weights, by GGUF name.
struct named_weights {
  std::string_view name;
  std::span<const float> values;
};

/// What a backend's engines went through (cumulative; zeros for one engine in this process).
struct rollout_backend_stats {
  int64_t agents_lost = 0;     ///< rollout agents that died or were stopped
  int64_t rollouts_moved = 0;  ///< rollouts resumed on another agent
  /// Tail consolidation: rollouts moved off an agent to free it, and how many times it ran.
  int64_t rollouts_consolidated = 0;
  int64_t consolidations = 0;
  int64_t peer_weight_pulls = 0;  ///< weight versions an agent pulled from a peer agent
  /// Weight versions an agent pulled from the controller's image (the trainer's process).
  int64_t controller_weight_pulls = 0;
  int ready_agents = 0;      ///< agents holding the current version now
  double last_pull_s = 0.0;  ///< the slowest agent's pull in the last publish()
};

class rollout_backend {
 public:
  virtual ~rollout_backend() = default;
  virtual status add(std::vector<rollout_request> requests) = 0;
  virtual status abort(request_id id) = 0;
  virtual result<std::vector<rollout_output>> poll() = 0;
  virtual bool has_work() const = 0;
  virtual status publish(int64_t version, std::span<const named_weights> tensors) = 0;
  /// The engine's model when it lives in this process (tests), else null.
  virtual model* local_model() { return nullptr; }
  virtual rollout_backend_stats stats() const { return {}; }
};

/// Weight types a rollout engine may store the trainer's weights in: f32 (the trainer's own),
/// bf16, f16, and q8_0 (quantized rollouts: the behaviour policy differs most from the trainer's,
/// and the PPO ratio / importance correction accounts for it).
bool is_rollout_weight_type(ggml_type t);
inline constexpr const char* rollout_weight_types = "f32, bf16, f16 or q8_0";

/// How a rollout engine is sized; the same for the in-process engine and every agent, so that
/// the same requests give the same tokens wherever they run.
struct rollout_engine_params {
  /// Sequences that may be generating at once (the steps in flight and an evaluation).
  int64_t max_sequences = 64;
  int32_t max_new_tokens = 32;
  ggml_type weight_type = ggml_type::f32;
  std::string device = "cpu";
  int threads = 1;
  /// Sequences in one forward pass (vLLM's max_num_seqs); 0: max_sequences. Beyond it requests
  /// wait (or pause, KV kept) in the policy's order.
  int64_t max_running = 0;
  /// Rank requests by sampling_params::priority (gpu::priority_policy, lower first) instead of
  /// first come, first served: `weft rl --trajectory-priority`.
  bool priority = false;
  /// Mixture-of-experts routing replay (`weft rl --routing-replay`): the engine records each
  /// token's experts (engine_config::record_routes, kept beside the cached KV) and a finished
  /// rollout carries them (request_output::routes) for the trainer to route the same way.
  bool record_routes = false;
};

/// The engine configuration of a rollout engine for `m` (KV for every sequence at once within
/// 1 GiB, never less than the longest request: a 512-token prompt).
engine_config rollout_engine_config(const model& m, const rollout_engine_params& p);

/// The rollout engine's model: an in-memory GGUF image of `weights` (the source file's metadata
/// and tokenizer) stored as p.weight_type, loaded on `dev`.
result<std::unique_ptr<model>> load_rollout_model(const gguf_file& source,
                                                  const train::trainable_model<float>& weights,
                                                  const rollout_engine_params& p, device& dev);

/// The longest prompt a rollout may have (tokens).
inline constexpr int64_t max_rollout_prompt_tokens = 512;

/// One engine in this process, stepped by poll(); deterministic.
class local_rollout_backend final : public rollout_backend {
 public:
  static result<std::unique_ptr<local_rollout_backend>> create(
      const gguf_file& source, const train::trainable_model<float>& weights,
      const rollout_engine_params& p, std::function<std::string(int32_t)> detokenize);
  status add(std::vector<rollout_request> requests) override;
  status abort(request_id id) override;
  result<std::vector<rollout_output>> poll() override;
  bool has_work() const override;
  status publish(int64_t version, std::span<const named_weights> tensors) override;
  model* local_model() override { return model_.get(); }

 private:
  local_rollout_backend() = default;
  std::unique_ptr<device> dev_;
  std::unique_ptr<model> model_;
  std::unique_ptr<engine> engine_;
  int64_t version_ = 0;
};

/// Applies a new weight version to an engine in place: every tensor converted to the engine's
/// stored type, and a new prefix-cache namespace (KV computed with old weights is never matched
/// again; sequences in flight keep theirs).
status apply_weights(model& m, engine& e, int64_t version, std::span<const named_weights> tensors);

}  // namespace weft::gpu::rl
