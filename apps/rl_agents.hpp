#pragma once
// `weft rl --agents N`: the rollout agents of a run on a private local cluster — the head and the
// controller in this process, each agent in its own `weft node` process, placed and restarted
// (one-for-one) by a supervisor; dead node processes are relaunched (docs/rl.md, "Rollout agents").

#include <cstdint>
#include <memory>
#include <string>

#include "actors/rl/remote_reference.hpp"
#include "actors/rl/remote_rewards.hpp"
#include "actors/rl/remote_rollouts.hpp"
#include "actors/rl/remote_tools.hpp"
#include "actors/rl/remote_trainers.hpp"
#include "schema/status.hpp"

namespace weft::apps {

struct rl_agents_options {
  int agents = 2;
  int agent_threads = 1;
  bool length_aware = true;
  int64_t consolidate_tail = 0;  ///< rollouts an agent takes from a step's tail (0: off)
  int weight_fanout = 0;         ///< pulls one source serves at once (0: all from the controller)
  uint32_t weight_timeout_ms = 60'000;
  uint32_t start_timeout_ms = 300'000;
  std::string model_path;
  std::string weight_type = "f32";
  std::string device = "cpu";
  int64_t max_sequences = 64;
  int32_t max_new_tokens = 32;
  int64_t max_running = 0;  ///< each agent engine's sequences per pass (0: max_sequences)
  bool priority = false;    ///< agents' engines rank by the requests' priority
  /// --routing-replay: the agents' engines record routes of this shape (the model's layers,
  /// experts and experts used); all zero: no routes.
  gpu::train::route_shape routes;
  int max_restarts = 10;
  /// Each agent's node process in a network namespace of its own (root only): the agents reach
  /// the controller, and each other, over a bridge whose links a chaos test can cut.
  bool netns = false;
  /// `--reward-workers K`: the reward program (`reward_cmd`) runs on K nodes of its own, as
  /// supervised reward workers (actors/rl/remote_rewards.hpp).
  int reward_workers = 0;
  std::string reward_cmd;
  int reward_procs = 1;  ///< copies of the program on each reward node
  double reward_timeout_s = 60.0;
  int reward_restarts = 3;
  /// `--trainers K`: ranks 1..K-1 of the data-parallel trainer group on K-1 trainer nodes under
  /// a one-for-all supervisor (actors/rl/remote_trainers.hpp); `trainer` is their configuration
  /// (rank and controller filled in here).
  int trainers = 1;
  uint32_t allreduce_timeout_ms = 120'000;
  double bucket_mb = 25.0;  ///< `--bucket-mb`: the all-reduce in buckets during the backward
  rl::rl_trainer_config trainer;
  /// `--reference-workers K`: the KL reference on K reference nodes
  /// (actors/rl/remote_reference.hpp); `reference` is their configuration (worker and
  /// controller filled in here).
  int reference_workers = 0;
  rl::reference_worker_config reference;
  /// `--tool-workers K`: the tools of agentic rollouts on K tool nodes
  /// (actors/rl/remote_tools.hpp), each running `tools`.
  int tool_workers = 0;
  rl::tool_actors_config tools;
};

class rl_agent_cluster {
 public:
  /// Starts the head, the controller, the node processes and the agents; returns once every agent
  /// holds the model's weights.
  static result<std::unique_ptr<rl_agent_cluster>> start(const rl_agents_options& o);
  /// Stops the agents (the supervisor first) and their node processes.
  ~rl_agent_cluster();
  std::shared_ptr<rl::remote_rollouts> backend() const { return backend_; }
  /// The reward workers' controller (null without reward workers).
  std::shared_ptr<rl::remote_rewards> rewards() const { return rewards_; }
  /// Ranks 1..K-1 of the trainer group (null without --trainers K > 1).
  std::shared_ptr<rl::remote_trainers> trainers() const { return trainers_; }
  /// The reference workers' controller (null without --reference-workers).
  std::shared_ptr<rl::remote_reference> reference() const { return reference_; }
  /// The tool workers' controller (null without --tool-workers).
  std::shared_ptr<rl::remote_tools> tools() const { return tools_; }
  /// The head's node table as JSON (what `weft cluster status --json` prints).
  std::string cluster_json() const;
  /// The pid of agent node i's process (0 while it is not running).
  uint32_t node_pid(int i) const;

  struct impl;

 private:
  rl_agent_cluster();
  status start_reward_workers(const rl_agents_options& o, const std::string& host);
  status start_trainers(const rl_agents_options& o, const std::string& host);
  status start_reference_workers(const rl_agents_options& o, const std::string& host);
  status start_tool_workers(const rl_agents_options& o, const std::string& host);
  std::unique_ptr<impl> d_;
  std::shared_ptr<rl::remote_rollouts> backend_;
  std::shared_ptr<rl::remote_rewards> rewards_;
  std::shared_ptr<rl::remote_trainers> trainers_;
  std::shared_ptr<rl::remote_reference> reference_;
  std::shared_ptr<rl::remote_tools> tools_;
};

}  // namespace weft::apps
