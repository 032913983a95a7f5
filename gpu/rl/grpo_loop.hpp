#pragma once
/// GRPO in one process (docs/rl.md, `weft rl --mode sync|async`): each step draws prompts,
/// generates a group of samples per prompt with the rollout engine (which serves the trainer's
/// current weights and records every token's log-probability and weight version), scores each
/// group as soon as it finishes (an external reward on a thread of its own, reward_queue, while
/// the rollouts go on), computes group-relative advantages, takes one optimizer step on
/// the policy objective and copies the new weights into the engine in place (a new weight
/// version; the engine's prefix cache starts a new namespace). With max_staleness K > 0 the
/// rollouts of the next K steps keep the engine busy while a step trains; in-flight samples
/// continue with the new weights between engine steps (every token records its version) and a
/// rollout_scheduler proves that no sample is trained twice, lost, or older than K versions.
/// Deterministic in every mode: the same seed gives the same weights bit for bit.
/// Plain class, no CAF: the RL actors reuse its pieces.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "gpu/chat_template.hpp"
#include "gpu/device.hpp"
#include "gpu/engine.hpp"
#include "gpu/gguf.hpp"
#include "gpu/model.hpp"
#include "gpu/rl/dispatch.hpp"
#include "gpu/rl/grpo.hpp"
#include "gpu/rl/grpo_update.hpp"
#include "gpu/rl/reference.hpp"
#include "gpu/rl/rollout_backend.hpp"
#include "gpu/rl/rollout_scheduler.hpp"
#include "gpu/rl/tasks.hpp"
#include "gpu/rl/tools.hpp"
#include "gpu/rl/work_queue.hpp"
#include "gpu/status.hpp"
#include "gpu/tokenizer.hpp"
#include "gpu/train/checkpoint.hpp"
#include "gpu/train/optimizer.hpp"
#include "gpu/train/trainable_model.hpp"

namespace weft::gpu::rl {

struct grpo_loop_config {
  uint64_t seed = 0;
  int64_t prompts_per_step = 4;
  int64_t group_size = 8;
  int32_t max_new_tokens = 32;
  int64_t eval_prompts = 32;  ///< Held-out problems for pass@1 (greedy).
  /// How rollouts sample (held-out evaluation stays greedy). The behaviour log-probs the engine
  /// records and the trainer's log-probs (the PPO ratio, the KL term) are both of
  /// log-softmax(logits / temperature); top-p / top-k only filter what is drawn (as in TRL and
  /// verl), so an on-policy ratio is exactly 1. temperature > 0, 0 < top_p <= 1, top_k >= 0 (0:
  /// off).
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  /// With a KL term: the reference's forward of a group runs as soon as the group finishes, while
  /// the rest of the step generates (RLHFuse's inter-stage fusion); false: in the training stage,
  /// on the update's packed batches (the baseline).
  bool fuse_reference = true;
  /// With set_reward() (an external reward: a process, an endpoint, reward workers): a finished
  /// group is scored on a thread of its own (reward_queue) while the rollouts go on and its KL
  /// reference runs; the step waits only for the rewards still out when its rollouts are done.
  /// false: the loop waits for each group's rewards as it finishes (the baseline). The rewards,
  /// and so the run, are the same either way.
  bool async_rewards = true;
  /// With a fused reference that runs elsewhere (reference workers, reference_policy::
  /// runs_elsewhere): a finished group's reference call goes to a thread of the loop's own
  /// (reference_queue) and the rollouts go on meanwhile; groups finishing while a call is out go
  /// together in the next one (spread over the workers). A step trains once its groups' log-probs
  /// are in. false: the loop waits for each group's call (the baseline). Same bits either way.
  bool async_reference = true;
  /// With a KL term: the reference is set with set_reference() (e.g. on nodes of its own,
  /// `--reference-workers`) rather than loaded into this process by create().
  bool external_reference = false;
  /// true: each prompt is a user message rendered with the model's chat template; false: the
  /// prompt text is tokenized as is (a base model, or one fine-tuned on raw prompts).
  bool chat = true;
  grpo_config grpo;
  train::lr_schedule schedule;
  train::adamw_config adamw;
  double max_grad_norm = 1.0;
  int64_t micro_batch_tokens = 1024;
  int shares = 1;          ///< Parallel shares of the backward (one thread each).
  int engine_threads = 1;  ///< Compute threads of the rollout engine.
  /// Where the trainer's forward, backward and AdamW run: "cpu" (the host), or a device such as
  /// "cuda" / "cuda:N" (device-resident, as `weft train --device`). The KL reference runs its
  /// forward there too.
  std::string train_device = "cpu";
  /// Where the rollout engine runs: "cpu" (engine_threads threads) or a device such as "cuda:N".
  /// Each weight sync goes through host memory (the trainer's weights are pulled, converted to
  /// rollout_type and uploaded).
  std::string rollout_device = "cpu";
  /// Type the rollout engine stores the weights in (f32, bf16 or f16). f32 keeps the behaviour
  /// policy closest to the trainer's.
  ggml_type rollout_type = ggml_type::f32;
  /// K: the rollouts of steps m + 1 .. m + K may run while step m trains (0: `--mode sync`).
  int64_t max_staleness = 0;
  /// Steps of the run: no rollout starts for a step at or past it (0: no end).
  int64_t total_steps = 0;
  /// Optimizer steps on each step's rollouts (TRL's num_iterations, the GRPO paper's μ).
  int64_t updates_per_step = 1;
  /// `--mode stream` (StreamRL): a step's groups train (forward and backward, gradients summed)
  /// as soon as they are scored, in group order, while later groups still generate; the optimizer
  /// step follows the last group (on a device-resident trainer the gradients sum on the device
  /// and the update runs there). Needs rollouts outside this thread (rollout agents), one update
  /// per step and K = 0.
  bool stream = false;
  /// Agentic rollouts (docs/rl.md, "Agentic rollouts"): the tools a sample may call between
  /// turns ("calc", "lookup"; empty: none). A turn that ends with a call waits for the tool (the
  /// other samples keep generating), gets its result appended and continues on the same agent;
  /// max_new_tokens bounds the generated tokens over all turns. Needs set_tools().
  std::vector<std::string> tools;
  /// Tool calls per sample; a turn that calls once more ends the sample.
  int max_tool_calls = 4;
  /// How turns are scheduled. false (weft's): each sample's call starts when its turn ends and
  /// the sample continues as soon as its result is in, while the others keep generating. true:
  /// the batch-synchronous loop of Search-R1-style trainers, the baseline — calls wait until no
  /// sample is generating, then all run at once, and every continuation starts after the last
  /// result.
  bool batch_turns = false;
  /// Sequences a rollout engine runs in one forward pass (0: all of them at once). Below the
  /// samples in flight, the others queue: a GPU short of KV, or vLLM's max_num_seqs.
  int64_t rollout_max_running = 0;
  /// Heddle's trajectory-level scheduling: the rollout engines rank requests by their
  /// trajectory's predicted length (trajectory_priority_of), longest first, refreshed at every
  /// turn, instead of first come, first served (under which every continuation after a tool call
  /// queues behind the requests that arrived meanwhile).
  bool trajectory_priority = false;
  /// Mixture-of-experts routing replay (R3): the rollout engines record the experts of every
  /// token they compute (kept beside the cached KV, so prefix hits bring them) and the trainer
  /// routes each token the same way (train_batch::routes), so the policy ratio compares one
  /// network, not two routings.
  bool routing_replay = false;
};

/// A tool result's tokens are cut to this many (the engine's context is sized for
/// max_tool_calls of them).
inline constexpr int64_t max_observation_tokens = 64;

/// One generated sample.
struct rollout_sample {
  int64_t group = 0;                ///< Index of its prompt within the step.
  std::vector<int32_t> prompt;      ///< Prompt tokens (chat template applied).
  std::vector<int32_t> completion;  ///< Generated tokens, the stop token included when it stopped.
  std::vector<float> logp;          ///< Behaviour log-probability of each completion token.
  std::vector<int64_t> version;     ///< Weight version each completion token was sampled with.
  bool stopped = false;             ///< Ended with an end-of-generation token (not the length cap).
  std::string text;                 ///< Completion text (stop token excluded).
  double reward = 0.0;
  /// With a KL term: the reference's log-probability of each completion token, computed when the
  /// sample's group finished (while other groups still generate); empty until then.
  std::vector<float> ref_logp;
  /// Agentic rollouts: per completion token, 1 when a tool's result put it there (context for
  /// what follows, not in the loss; its logp is 0 and its version −1), 0 when it was sampled.
  /// Empty when no tool answered.
  std::vector<uint8_t> tool_mask;
  int64_t tool_calls = 0;
  /// Routing replay: the experts of each position the engine computed ([positions][layers][k],
  /// the prompt then the completion; the last token has none), from the request that finished it.
  std::vector<uint8_t> routes;
  /// Prompt tokens of the sample's continuations (after each tool result) and how many of them
  /// the engine found in its prefix cache (the KV kept resident across the call).
  int64_t continued_tokens = 0;
  int64_t cached_tokens = 0;
  /// Prompt tokens its first request found in the rollout engine's prefix cache (−1: no output
  /// yet).
  int64_t prompt_cached = -1;
  /// Tokens the model generated: the completion less the tool results.
  int64_t generated() const;
  /// Oldest and newest weight version of the generated tokens (`now` when there are none).
  std::pair<int64_t, int64_t> versions(int64_t now) const;
};

/// What one step did.
struct rl_step_record {
  int64_t step = 0;     ///< 1-based.
  int64_t version = 0;  ///< Weight version after the step.
  int64_t samples = 0;
  double reward_mean = 0.0;
  double reward_std = 0.0;
  int64_t zero_variance_groups = 0;
  double completion_len = 0.0;  ///< Mean completion tokens per sample.
  int64_t completion_len_max = 0;
  double stopped_fraction = 0.0;
  double loss = 0.0;       ///< Mean over the step's updates.
  double grad_norm = 0.0;  ///< Mean over the step's updates (before clipping).
  double lr = 0.0;
  double clip_fraction = 0.0;
  double ratio_deviation = 0.0;  ///< Mean |π_trainer/π_behaviour − 1| over the step's tokens.
  double kl = 0.0;  ///< Mean k3 estimate of KL(π_θ ‖ π_ref) per token (with a KL term).
  /// Routing replay: (token, layer) pairs the trainer routed as the rollout engine had, and the
  /// share of them where its own router would have chosen other experts.
  int64_t routes_replayed = 0;
  double route_mismatch = 0.0;
  /// Share of the step's prompt tokens the rollout engines took from their prefix cache.
  double prompt_cache_hit = 0.0;
  double staleness_mean = 0.0;  ///< Versions between the trainer and a sample's oldest token.
  int64_t staleness_max = 0;
  int64_t mixed_version_samples = 0;  ///< Samples whose tokens span more than one version.
  int64_t in_flight = 0;              ///< Samples of later steps generating when this step trained.
  int64_t completion_tokens = 0;
  double rollout_s = 0.0, train_s = 0.0, sync_s = 0.0;
  /// With a KL term: seconds of the reference's forward — run as each group finished (inside
  /// rollout_s, overlapping the generation of the other groups), or in train_s without fusion.
  double ref_s = 0.0;
  /// Seconds the reward took over the step's groups (on the reward thread with async rewards),
  /// and seconds the loop waited for rewards with nothing else to do during this step() call.
  double reward_s = 0.0, reward_wait_s = 0.0;
  /// Seconds the loop waited for a KL reference that runs elsewhere (reference workers) during
  /// this step() call, with nothing else to do (ref_s is what the calls took).
  double ref_wait_s = 0.0;
  /// The rollout backend's counters after the step (rollout agents; zeros in one process).
  rollout_backend_stats agents;
  /// Reward workers on other nodes (`weft rl --reward-workers`, filled by the command; zeros
  /// otherwise): workers lost and parts of batches scored again, since the start.
  int64_t reward_workers_lost = 0;
  int64_t reward_parts_rescored = 0;
  /// Reference workers (--reference-workers) lost, and batches sent again, since the start.
  int64_t reference_workers_lost = 0;
  int64_t reference_batches_resent = 0;
  /// A trainer group (`weft rl --trainers K`): groups formed since the start (1 + restarts) and
  /// the seconds of the step's gradient all-reduces (waiting for the other ranks included).
  int64_t trainer_groups = 0;
  double reduce_s = 0.0;
  /// Agentic rollouts: the step's tool calls, the result tokens they added, and the fraction of
  /// the continuations' prompt tokens the engines found in their prefix caches.
  int64_t tool_calls = 0;
  int64_t tool_tokens = 0;
  double tool_kv_reuse = 0.0;
  /// The external reward's restarts since the start: --reward-cmd processes restarted (a crash
  /// or a hang), or --reward-url requests sent again (filled by the command).
  int64_t reward_restarts = 0;
  /// Tool actors restarted and calls sent again since the start (filled by the command).
  int64_t tool_restarts = 0;
  int64_t tool_calls_resent = 0;
};

/// Held-out evaluation: greedy pass@1.
struct rl_eval_record {
  int64_t step = 0;
  int64_t prompts = 0;
  double pass_at_1 = 0.0;
  double completion_len = 0.0;
  double seconds = 0.0;
  int64_t tool_calls = 0;
};

/// Scores a batch of samples (sample s answers prompts[s.group]); one reward per sample, in order.
/// Replaces the task's own verifier (e.g. an external reward process).
using batch_reward = std::function<result<std::vector<double>>(
    const std::vector<rl_prompt>& prompts, const std::vector<rollout_sample>& samples)>;
/// What one call of a batch_reward gets: a whole group, or any samples.
enum class reward_unit { group, sample };

class grpo_loop {
 public:
  /// `source` is the model file the weights came from (metadata and tokenizer of the rollout
  /// engine's image); `model` the trainable weights (moved in); `task` must outlive the loop.
  /// `backend` generates the rollouts (e.g. rollout agents in other processes); null: one engine
  /// in this process, on config.rollout_device (`local_rollout_backend`).
  static result<std::unique_ptr<grpo_loop>> create(
      const gguf_file& source, std::unique_ptr<train::trainable_model<float>> model,
      const rl_task& task, const grpo_loop_config& config,
      std::shared_ptr<rollout_backend> backend = nullptr);
  ~grpo_loop();

  /// Trains every update data-parallel with `group`'s ranks (this process is rank 0); null: alone.
  /// Needs a host trainer and whole steps (not stream mode).
  status set_update_group(std::shared_ptr<update_group> group);
  /// Scores samples with `reward` instead of the task's verifier (training and evaluation).
  /// With config.async_rewards the calls run on threads of the loop's own, `concurrency` (>= 1)
  /// at once: with 1 `reward` may use an object no other thread uses; with more it must be
  /// thread-safe (a pool of reward processes, an HTTP client). Call stop_rewards() before anything
  /// `reward` uses is destroyed.
  /// `unit`: what the reward sees in one call — whole groups (e.g. an endpoint that compares a
  /// group's samples), or any samples (a program that scores each on its own: with async rewards
  /// each sample is then scored as it finishes, with whatever else finished while the previous
  /// call ran).
  void set_reward(batch_reward reward, reward_unit unit = reward_unit::group, int concurrency = 1);
  /// Waits for the reward batch being scored and drops the queued ones (then no reward runs any
  /// more); idempotent. The destructor does it too.
  void stop_rewards();
  /// The same for the reference thread's calls (async reference): call it while the reference's
  /// workers are still up. Idempotent; the destructor does it too.
  void stop_references();
  /// Where the tool calls of agentic rollouts run (config.tools); must be set before the first
  /// step when tools are on.
  void set_tools(std::shared_ptr<tool_backend> tools) { tools_ = std::move(tools); }
  /// The KL term's reference policy (config.external_reference); set before the first step.
  /// With config.async_reference and a reference that runs elsewhere, its fused calls go to a
  /// thread of the loop's own.
  void set_reference(std::shared_ptr<reference_policy> ref);

  /// One GRPO step: rollouts (until every sample of the step has finished; with K > 0 the next
  /// steps' rollouts start too), rewards, advantages, update, weight sync.
  result<rl_step_record> step();
  /// Greedy pass@1 on the held-out problems with the current weights.
  result<rl_eval_record> evaluate();
  /// Generates `group_size` samples (temperature 1) for each prompt with the current weights;
  /// `seed_base` seeds them. Rollouts of later steps in flight (K > 0) advance meanwhile.
  /// Public for tests and benchmarks.
  result<std::vector<rollout_sample>> generate(const std::vector<rl_prompt>& prompts,
                                               int64_t group_size, uint64_t seed_base, bool greedy);

  /// Everything the next step depends on, as a training checkpoint (docs/rl.md): weights, AdamW
  /// moments, the step (= weight version), the prompt cursor (checkpoint_state::cursor.index),
  /// the seed and the schedule; history holds loss, lr, grad norm and completion tokens per step.
  /// Brings a device-resident trainer's host copy up to date first.
  status snapshot_into(train::checkpoint_state& s);
  /// The same without a copy: `meta` gets everything but the tensors, and the view borrows it and
  /// the live parameters and moments (valid until the next step).
  result<train::checkpoint_view> live_checkpoint(train::checkpoint_state& meta);
  /// Continues from a snapshot of the same model and seed, and pushes the weights to the engine:
  /// with K = 0 the run then goes on bit for bit as if it had never stopped; with K > 0 the
  /// rollouts that were in flight start again from their prompts (same prompts and seeds, none
  /// lost or trained twice, but sampled with the restored weights).
  status restore(const train::checkpoint_state& s);

  int64_t steps_done() const { return step_; }
  int64_t version() const { return version_; }
  train::trainable_model<float>& model() { return *model_; }
  /// Routing replay: entries per position of a rollout's routes (layers · experts used); 0 off.
  /// Routing replay: the step's replayed-route counts into `rec`.
  static void note_routing(rl_step_record& rec, int64_t replayed, int64_t differ) {
    rec.routes_replayed = replayed;
    rec.route_mismatch =
        replayed > 0 ? static_cast<double>(differ) / static_cast<double>(replayed) : 0.0;
  }
  int64_t route_width() const {
    return config_.routing_replay ? model_->hparams().n_layers * model_->hparams().n_experts_used
                                  : 0;
  }
  const std::vector<rl_step_record>& history() const { return history_; }
  const prompt_source& prompts() const { return prompts_; }
  const rollout_scheduler& scheduler() const { return sched_; }
  /// The rollout engine's model when it runs in this process (its weights are the trainer's at
  /// version()); null with rollout agents.
  gpu::model* rollout_model() { return backend_->local_model(); }
  /// How the engine of every rollout backend is sized for this configuration.
  static rollout_engine_params engine_params(const grpo_loop_config& config);

 private:
  grpo_loop(std::unique_ptr<train::trainable_model<float>> model, const rl_task& task,
            const grpo_loop_config& config);
  status push_weights();
  /// `s`'s step, cursor, seed, schedule and history, the host copy brought up to date first.
  status checkpoint_meta(train::checkpoint_state& s);
  /// Draws step m's prompts and puts its samples into the engine.
  status start_step(int64_t m);
  std::vector<int32_t> encode_prompt(const rl_prompt& p, status& st) const;
  /// One engine step; tokens go to their samples; finished groups of a step are scored.
  /// `direct_finished` counts finished samples of the generate() call in progress.
  status pump(size_t& direct_finished);
  status sample_finished(int64_t step, size_t index);
  /// The sample of a live request: its step's or the generate() call's.
  rollout_sample* sample_of(request_id id);
  /// Whether rollouts are generating or waiting for a tool.
  bool rollouts_busy() const;
  /// With tools: when the turn of request `id` that just ended calls a tool, starts the call
  /// (the sample then waits) and returns true; false when the sample is finished.
  result<bool> call_tool(request_id id, rollout_sample& s, const request_output& o);
  /// A tool answered the call of request `id`: its result goes into the sample and the sample
  /// continues as a new request (same group, so the same agent and its prefix cache).
  status tool_returned(const tool_result& r);
  /// config.trajectory_priority: the engine priority of the next request of a trajectory with
  /// this prompt (trajectory_priority_of, from the prompt's past lengths); 0 otherwise.
  int32_t priority_for(const std::vector<int32_t>& prompt, int64_t generated,
                       int64_t turns_done) const;
  /// A continuation's first output: its prefix-cache hits go into the sample's count.
  void count_cached(request_id id, rollout_sample& s, const request_output& o);
  /// The requests' sampling parameters with this configuration.
  sampling_params request_params(uint64_t seed, int32_t max_tokens, bool greedy) const;
  /// A step's rewards turned into what the update needs: each sample's advantage, whether it is
  /// kept in the loss, and its per-token loss weight.
  struct scored_step {
    std::vector<double> adv, weights;
    std::vector<uint8_t> keep;
  };
  /// Fills the step's reward and length statistics into `rec` (the samples are scored) and
  /// turns the rewards into advantages and loss weights.
  scored_step score_step(const std::vector<rollout_sample>& samples, rl_step_record& rec) const;
  /// The update's micro-batches, one list per parallel share.
  std::vector<std::vector<train::train_batch>> pack_update(
      const std::vector<rollout_sample>& samples, const scored_step& scored) const;
  /// Fills every loss token's reference log-probability (the frozen starting weights).
  status add_reference_logprobs(std::vector<std::vector<train::train_batch>>& batches);
  /// The reference's log-probs of a finished group's completions (shared prompt prefix, one
  /// forward), into each sample's ref_logp.
  status reference_logprobs_of_group(std::span<rollout_sample> group);
  /// Group g of step m finished: its reference call, now or (async) through references_.
  status reference_group_finished(int64_t m, size_t g);
  /// The groups finished and not yet submitted go to the reference thread if it is idle.
  status submit_unreferenced();
  /// Reference log-probs that are in go to their groups; with `wait`, blocks for at least one
  /// call when some are pending (the time counts into reference_wait_s_).
  status collect_references(bool wait);
  /// Waits for every reference call out (before the loop calls the reference itself).
  status drain_references();
  /// Forward/backward of the PPO-clip objective, clipping, AdamW; fills loss, norm, lr and the
  /// clip statistics into `rec`.
  status update(const std::vector<std::vector<train::train_batch>>& batches, rl_step_record& rec);
  /// One iteration of a device-resident trainer.
  result<iteration_totals> device_iteration(
      const iteration_inputs& in, const std::vector<std::vector<train::train_batch>>& batches);
  /// One iteration over the trainer group, repeated on a new group when a rank is lost.
  result<iteration_totals> group_iteration(
      const iteration_inputs& in, const std::vector<std::vector<train::train_batch>>& batches);
  /// Rank 0 trains device-resident while the trainer group sums on the GPUs, on the host
  /// otherwise (the ZeRO-Offload split with a device): switches as the current group says.
  status follow_group_device();
  /// The end of every step: the new weights to the rollouts, the step's record kept.
  result<rl_step_record> finish_step(rl_step_record& rec);
  /// --mode stream: one step whose groups train as they are scored.
  result<rl_step_record> stream_step();
  /// Forward and backward of groups [g0, g1) of the current step (gradients added, weights
  /// unnormalised: 1 per token, 1/length or 1/max_new_tokens per sample by the aggregation); adds
  /// their kept samples and tokens to the counts.
  status train_groups(const std::vector<rollout_sample>& samples, int64_t g0, int64_t g1,
                      const train::token_objective<float>& obj, double& loss, int64_t& kept,
                      int64_t& kept_tokens);
  /// The optimizer step after gradients were added: scales them by `scale`, clips, AdamW.
  status apply_update(double scale, rl_step_record& rec);
  result<std::vector<double>> score(const std::vector<rl_prompt>& prompts,
                                    const std::vector<rollout_sample>& samples);
  /// score(), through the reward thread with async rewards (blocks until the batch is scored).
  result<std::vector<double>> score_now(const std::vector<rl_prompt>& prompts,
                                        const std::vector<rollout_sample>& samples);
  /// A sample of a pending step.
  struct sample_ref {
    int64_t step = 0;
    size_t index = 0;
  };
  /// Scores `refs` (with async rewards: submits them to the reward thread).
  status score_samples(std::vector<sample_ref> refs);
  /// reward_unit::sample: the finished samples not yet scored go to the reward threads if one is
  /// idle.
  status submit_unscored();
  /// Rewards that are in go to their groups; with `wait`, blocks for at least one when some are
  /// pending. The time blocked counts into reward_wait_s_. The batch under ticket `want` (if
  /// any) goes to `*wanted` instead.
  status collect_rewards(bool wait, uint64_t want = 0,
                         std::optional<result<std::vector<double>>>* wanted = nullptr);
  /// Applies the rewards of `refs` (a group is scored once all of its samples are).
  status apply_rewards(const std::vector<sample_ref>& refs,
                       const result<std::vector<double>>& rewards, double seconds);
  /// Whether every group of step m has its rewards.
  bool step_scored(int64_t m) const;
  /// Whether the loop has rewards to wait for.
  bool rewards_pending() const;

  std::unique_ptr<device> train_dev_;  ///< config.train_device's (outlives model_)
  std::unique_ptr<train::trainable_model<float>> model_;
  /// The reference policy of the KL term: the starting weights, frozen (only with kl_coef > 0).
  std::shared_ptr<reference_policy> ref_;
  const rl_task& task_;
  grpo_loop_config config_;
  prompt_source prompts_;
  std::unique_ptr<tokenizer> tok_;
  std::unique_ptr<chat_template> chat_;
  std::shared_ptr<rollout_backend> backend_;
  train::adamw opt_;
  std::vector<uint8_t> decay_;
  int64_t step_ = 0;
  int64_t version_ = 0;
  request_id next_request_ = 1;
  rollout_scheduler sched_;
  /// A step whose rollouts have started and which is not trained yet.
  struct pending_step {
    std::vector<rl_prompt> prompts;
    std::vector<rollout_sample> samples;  ///< Group after group.
    std::vector<int64_t> group_finished;  ///< Finished samples per group.
    std::vector<int64_t> group_rewarded;  ///< Samples of each group whose reward is in.
    std::vector<uint8_t> group_ref_out;   ///< Groups whose reference call is out (async).
    int64_t cursor = 0;                   ///< Prompt cursor before its prompts were drawn.
    double ref_s = 0.0;                   ///< Reference forwards of its finished groups.
    double reward_s = 0.0;                ///< Its groups' reward calls.
  };
  std::map<int64_t, pending_step> pending_;
  /// Whether every sample of groups [begin, end) of `p` has its reward.
  bool groups_scored(const pending_step& p, int64_t begin, int64_t end) const;
  /// Whether groups [begin, end) of `p` have no reference call out.
  bool groups_referenced(const pending_step& p, int64_t begin, int64_t end) const;
  struct slot {
    int64_t step = 0;
    size_t index = 0;
  };
  std::unordered_map<request_id, slot> slots_;     ///< Requests of pending steps.
  std::unordered_map<request_id, size_t> direct_;  ///< Requests of the generate() in progress.
  std::vector<rollout_sample>* direct_out_ = nullptr;
  std::vector<rl_step_record> history_;
  batch_reward reward_;
  std::shared_ptr<update_group> group_;
  std::shared_ptr<tool_backend> tools_;
  /// config.trajectory_priority: generated tokens per trajectory of each prompt seen (rebuilt
  /// from scratch after a resume: it orders requests, never changes a sample).
  length_ranker trajectory_lengths_;
  /// With tools: each live request's turn (what its continuation needs).
  struct turn {
    sampling_params params;
    int64_t group = -1;
    int64_t calls = 0;           ///< Tool calls of the sample before this turn.
    size_t text_from = 0;        ///< Where this turn's text starts in the sample's text.
    uint64_t first_seed = 0;     ///< The sample's seed (each turn's is derived from it).
    bool cache_counted = false;  ///< Its prompt's prefix-cache hits are in the sample's count.
  };
  std::unordered_map<request_id, turn> turns_;
  /// Requests whose last turn called a tool that has not answered yet.
  std::unordered_set<request_id> waiting_;
  /// batch_turns: calls not started yet, and continuations not added yet.
  std::vector<std::pair<request_id, tool_call>> held_calls_;
  std::vector<rollout_request> held_turns_;
  /// batch_turns: starts the held calls once nothing generates, and the held continuations once
  /// every call has answered.
  status release_held();
  /// Async rewards: the samples of each batch submitted and not yet applied.
  std::unordered_map<uint64_t, std::vector<sample_ref>> scoring_;
  std::vector<sample_ref> unscored_;  ///< reward_unit::sample: finished, not yet submitted.
  reward_unit reward_unit_ = reward_unit::group;
  uint64_t next_ticket_ = 1;
  double reward_wait_s_ = 0.0;  ///< Waited for rewards during the step() call in progress.
  /// Async reference: the groups (step, group) of each call out, and those finished and not yet
  /// submitted.
  std::unordered_map<uint64_t, std::vector<std::pair<int64_t, size_t>>> referencing_;
  std::vector<std::pair<int64_t, size_t>> unreferenced_;
  double reference_wait_s_ = 0.0;  ///< Waited for the reference during the step() call.
  /// Async rewards' and references' threads; declared last, so they stop before anything their
  /// jobs use goes.
  std::unique_ptr<reward_queue> rewards_;
  std::unique_ptr<reference_queue> references_;
};

}  // namespace weft::gpu::rl
