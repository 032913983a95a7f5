#pragma once
// `weft rl`'s options: what the command line (and --config) sets, and the CLI11 definitions of
// every option with its help text and range (docs/rl.md).

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace weft::apps {

struct rl_options {
  std::string config_file;
  std::string model_path;
  std::string task = "arithmetic";
  int digits = 1;
  std::string ops = "+";
  int length = 5;
  int numbers = 3;
  int words = 2;
  std::string tools;                   ///< --tools calc,lookup (empty: none)
  std::vector<std::string> tool_cmds;  ///< --tool-cmd NAME=COMMAND, repeatable
  std::vector<std::string> tool_urls;  ///< --tool-url NAME=URL, repeatable
  int tool_concurrency = 8;
  int tool_procs = 1;
  int tool_workers = 0;  ///< --tools on this many tool nodes (needs --agents)
  int max_tool_calls = 4;
  int tool_latency_ms = 0;
  std::string tool_latency_dist = "fixed";
  double tool_timeout_s = 10.0;
  std::string tool_turns = "sample";
  int64_t rollout_max_running = 0;
  bool trajectory_priority = false;
  bool routing_replay = false;
  std::string data_path;
  std::string match = "number";
  std::string answer_format = "none";
  double format_weight = 0.1;
  std::string mode = "sync";
  int64_t max_staleness = 1;
  std::string off_policy = "ppo-clip";
  double is_cap = 2.0;
  double kl_coef = 0.0;
  double router_aux_loss_coef = 0.0;
  int64_t updates_per_step = 1;
  int64_t steps = 100;
  int64_t prompts_per_step = 4;
  int64_t group_size = 8;
  int32_t max_new_tokens = 32;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  bool no_fused_reference = false;
  bool blocking_reference = false;
  double lr = 1e-6;
  int64_t warmup_steps = 0;
  std::string lr_schedule = "constant";
  double min_lr_ratio = 0.1;
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;
  double clip_low = 0.2;
  double clip_high = 0.2;
  std::string loss_agg = "token";
  bool no_scale_rewards = false;
  bool drop_zero_variance = false;
  int64_t eval_every = 10;
  int64_t eval_prompts = 32;
  uint64_t seed = 0;
  int threads = 0;
  std::string device = "cpu";  ///< the trainer's (--device)
  std::string rollout_device;  ///< the rollout engine's (--rollout-device; empty: --device)
  int64_t micro_batch_tokens = 1024;
  std::string rollout_type = "f32";
  std::string checkpoint_dir;
  int64_t checkpoint_every = 10;
  int keep_checkpoints = 2;
  bool resume = false;
  std::string save_path;
  std::string save_type = "f16";
  std::string metrics_path;
  int metrics_port = 0;
  std::string plot_path;
  std::string prompt_format = "chat";
  std::string reward_cmd;
  std::string reward_url;
  std::string reward_key;
  double reward_timeout_s = 60.0;
  int reward_restarts = 3;
  int reward_workers = 0;      ///< --reward-cmd on this many reward nodes (needs --agents)
  int reward_procs = 1;        ///< --reward-cmd: copies of the program, batches scored at once
  int reward_concurrency = 4;  ///< --reward-url: requests in flight at once
  std::string reward_batch = "group";  ///< --reward-url: a POST per group, or finished samples
  /// --reward-cmd / --reward-url: wait for each group's rewards as it finishes instead of
  /// scoring on a thread of its own while the rollouts go on.
  bool blocking_rewards = false;
  /// The KL reference on this many reference nodes (needs --agents and --kl-coef).
  int reference_workers = 0;
  /// Data-parallel trainer ranks: rank 0 in this process, the others on trainer nodes (needs
  /// --agents).
  int trainers = 1;
  double allreduce_timeout_s = 120.0;
  double bucket_mb =
      25.0;  ///< --trainers: gradients summed in buckets of ~this many MiB (0: after)
  /// --trainers with --device cuda: where the group sums its gradients (auto, nccl or ucx).
  std::string dist_backend = "auto";
  std::string write_sft_path;
  int64_t sft_examples = 1000;
  int agents = 0;  ///< rollout agents in node processes (0: the engine in this process)
  // The agents' options: 0 / empty when not given (refused without --agents).
  int agent_threads = 0;               ///< default 1
  std::string dispatch;                ///< default length-aware
  double weight_sync_timeout_s = 0.0;  ///< default 60
  int64_t consolidate_tail = 0;        ///< 0: off
  int weight_fanout = 0;               ///< 0: every agent pulls from the controller
  bool netns = false;                  ///< each agent's node in a network namespace of its own
};

/// Where prompts and rewards come from.
void add_task_options(CLI::App* cmd, rl_options* o);
/// The mode, the batch, the update, sampling and the rollout agents.
void add_update_options(CLI::App* cmd, rl_options* o);
/// Checkpoints, export and what the run shows.
void add_run_options(CLI::App* cmd, rl_options* o);

}  // namespace weft::apps
