#pragma once
// Where the pieces of a `weft rl` run live (docs/rl.md): its private cluster of rollout agents,
// reward, reference, trainer and tool workers (--agents and the --*-workers flags), the rewards
// (--reward-cmd, --reward-url), the tool actors (--tools) and the metrics endpoint. Each function
// wires one piece into the GRPO loop and says on the log what it did or why it could not.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/rl/tool_actors.hpp"
#include "apps/reward_http.hpp"
#include "apps/rl_agents.hpp"
#include "apps/rl_options.hpp"
#include "apps/rl_report.hpp"
#include "apps/train_report.hpp"
#include "gpu/rl/grpo_loop.hpp"
#include "gpu/rl/reward_process.hpp"
#include "schema/status.hpp"

namespace weft::apps {

/// The tools a run enables: --tools, then those of --tool-cmd / --tool-url not named there.
gpu::result<std::vector<std::string>> enabled_tools(const rl_options& o);

/// `--agents N`: the run's private cluster with its rollout agents (and reward, trainer, reference
/// and tool workers).
result<std::unique_ptr<rl_agent_cluster>> start_agents(const rl_options& o,
                                                       const gpu::rl::grpo_loop_config& cfg);

/// --metrics-port: Prometheus text and, with agents, the run's cluster for `weft cluster status
/// --rl` (false: said why).
bool serve_metrics(const rl_options& o, rl_reporter& report, const rl_agent_cluster* cluster,
                   const weft::rl::tool_actors* tools, std::optional<metrics_server>& http);

/// The run's rewards: the reward workers of its cluster (--reward-workers), a program beside the
/// trainer (--reward-cmd) or an endpoint (--reward-url); the task's verifier otherwise. false: said
/// why.
bool use_rewards(const rl_options& o, rl_agent_cluster* cluster, gpu::rl::grpo_loop& loop,
                 std::optional<gpu::rl::reward_process_pool>& rewards,
                 std::optional<reward_http>& endpoint);

/// `--reference-workers K`: the KL reference on the cluster's reference nodes.
void use_reference(const rl_options& o, rl_agent_cluster* cluster, gpu::rl::grpo_loop& loop);

/// `--trainers K`: ranks 1..K-1 on the cluster's trainer nodes. false: said why.
bool use_trainer_group(const rl_options& o, rl_agent_cluster* cluster, gpu::rl::grpo_loop& loop);

/// `--tools`: the tool actors the loop's samples call (none without tools), in this process or on
/// the cluster's tool workers. false: said why.
bool start_tools(const rl_options& o, const gpu::rl::grpo_loop_config& cfg,
                 gpu::rl::grpo_loop& loop, rl_agent_cluster* cluster,
                 std::shared_ptr<weft::rl::tool_actors>& tools);

}  // namespace weft::apps
