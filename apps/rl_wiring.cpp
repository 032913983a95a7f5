// Where the pieces of a `weft rl` run live: the wiring behind apps/rl_wiring.hpp.

#include "apps/rl_wiring.hpp"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include "actors/rl/tool_http.hpp"
#include "gpu/gguf.hpp"
#include "gpu/model.hpp"
#include "gpu/rl/tasks.hpp"
#include "gpu/rl/tools.hpp"

namespace weft::apps {

namespace fs = std::filesystem;
using namespace gpu::rl;

namespace {

/// The tools of your own: --tool-cmd's programs and --tool-url's endpoints.
gpu::result<std::vector<tool_command>> tool_commands(const rl_options& o) {
  std::vector<tool_command> out;
  for (const auto& spec : o.tool_cmds) {
    auto c = parse_tool_command(spec);
    if (!c) return gpu::status{c.error().code(), "--tool-cmd: " + c.error().message()};
    out.push_back(std::move(*c));
  }
  for (const auto& spec : o.tool_urls) {
    auto c = weft::rl::parse_tool_endpoint(spec);
    if (!c) return gpu::status{c.error().code(), "--tool-url: " + c.error().message()};
    for (const auto& other : out) {
      if (other.name == c->name) {
        return gpu::status{gpu::status_code::invalid_argument,
                           "tool '" + c->name + "' is given twice (--tool-cmd / --tool-url)"};
      }
    }
    out.push_back(std::move(*c));
  }
  return out;
}

/// What the tool actors run (in this process, or on each tool worker's node).
weft::rl::tool_actors_config tool_config(const rl_options& o, const grpo_loop_config& cfg) {
  weft::rl::tool_actors_config tc;
  tc.tools = cfg.tools;
  tc.latency_ms = static_cast<uint32_t>(o.tool_latency_ms);
  tc.exponential_latency = o.tool_latency_dist == "exponential";
  tc.commands = *tool_commands(o);
  tc.timeout_ms = static_cast<uint32_t>(o.tool_timeout_s * 1000.0);
  tc.concurrency = o.tool_concurrency;
  tc.processes = o.tool_procs;
  return tc;
}

/// A batch's samples as what an external reward is sent (sample s answers prompts[s.group]).
std::vector<reward_request> reward_requests(const std::vector<rl_prompt>& prompts,
                                            const std::vector<rollout_sample>& samples) {
  std::vector<reward_request> req;
  req.reserve(samples.size());
  for (const auto& s : samples) {
    const rl_prompt& p = prompts[static_cast<size_t>(s.group)];
    req.push_back(reward_request{p.text, s.text, p.answer});
  }
  return req;
}

/// --reward-cmd: the loop's rewards come from `rewards`, started here.
void use_reward_process(const rl_options& o, grpo_loop& loop,
                        std::optional<reward_process_pool>& rewards) {
  rewards.emplace(reward_process_config{o.reward_cmd, o.reward_timeout_s, o.reward_restarts},
                  o.reward_procs);
  // One line per sample: each is scored as it finishes; --reward-procs batches at once.
  loop.set_reward(
      [&rewards](const std::vector<rl_prompt>& prompts,
                 const std::vector<rollout_sample>& samples) {
        return rewards->score(reward_requests(prompts, samples));
      },
      reward_unit::sample, o.reward_procs);
  spdlog::info("rewards from `{}` (JSON lines on stdin/stdout{})", o.reward_cmd,
               o.reward_procs > 1 ? fmt::format(", {} copies", o.reward_procs) : std::string{});
}

/// --reward-url: the loop's rewards come from an HTTP endpoint.
bool use_reward_endpoint(const rl_options& o, grpo_loop& loop,
                         std::optional<reward_http>& rewards) {
  auto r = reward_http::create(
      reward_http_config{o.reward_url, o.reward_timeout_s, o.reward_restarts, o.reward_key});
  if (!r) {
    spdlog::error("{}", r.error().message());
    return false;
  }
  rewards.emplace(std::move(*r));
  loop.set_reward(
      [&rewards](const std::vector<rl_prompt>& prompts,
                 const std::vector<rollout_sample>& samples) {
        return rewards->score(reward_requests(prompts, samples));
      },
      o.reward_batch == "samples" ? reward_unit::sample : reward_unit::group, o.reward_concurrency);
  spdlog::info("rewards from {} (POST {{\"samples\": [...]}} of {}, {} at once)", o.reward_url,
               o.reward_batch == "samples" ? "finished samples" : "a group",
               o.blocking_rewards ? 1 : o.reward_concurrency);
  return true;
}

}  // namespace

/// The tools a run enables: --tools, then those of --tool-cmd not named there.
gpu::result<std::vector<std::string>> enabled_tools(const rl_options& o) {
  auto cmds = tool_commands(o);
  if (!cmds) return cmds.error();
  std::vector<std::string> own;
  for (const auto& c : *cmds) own.push_back(c.name);
  auto tools = parse_tools(o.tools, own);
  if (!tools) return gpu::status{tools.error().code(), "--tools: " + tools.error().message()};
  for (const auto& n : own) {
    if (std::find(tools->begin(), tools->end(), n) == tools->end()) tools->push_back(n);
  }
  return tools;
}

/// `--agents N`: the run's private cluster with its rollout agents (and reward workers).
result<std::unique_ptr<rl_agent_cluster>> start_agents(const rl_options& o,
                                                       const grpo_loop_config& cfg) {
  rl_agents_options ao;
  ao.agents = o.agents;
  ao.agent_threads = o.agent_threads > 0 ? o.agent_threads : 1;
  ao.length_aware = o.dispatch != "round-robin";
  ao.consolidate_tail = o.consolidate_tail;
  ao.weight_fanout = o.weight_fanout;
  ao.weight_timeout_ms = static_cast<uint32_t>(
      (o.weight_sync_timeout_s > 0.0 ? o.weight_sync_timeout_s : 60.0) * 1000.0);
  ao.model_path = o.model_path;
  ao.weight_type = o.rollout_type;
  ao.device = cfg.rollout_device;
  const auto p = grpo_loop::engine_params(cfg);
  ao.max_sequences = p.max_sequences;
  ao.max_new_tokens = p.max_new_tokens;
  ao.max_running = p.max_running;
  ao.priority = p.priority;
  if (p.record_routes) {
    auto f = gpu::gguf_file::open(o.model_path);
    auto hp = f ? gpu::read_model_hparams(*f) : gpu::result<gpu::model_hparams>(f.error());
    if (!hp) return make_error(errc::invalid_argument, hp.error().message());
    ao.routes = {hp->n_layers, hp->n_experts, hp->n_experts_used};
  }
  ao.netns = o.netns;
  ao.reward_workers = o.reward_workers;
  ao.reward_cmd = o.reward_cmd;
  ao.reward_procs = o.reward_procs;
  ao.reward_timeout_s = o.reward_timeout_s;
  ao.reward_restarts = o.reward_restarts;
  ao.trainers = o.trainers;
  ao.allreduce_timeout_ms = static_cast<uint32_t>(o.allreduce_timeout_s * 1000.0);
  ao.bucket_mb = o.bucket_mb;
  ao.trainer.model_path = fs::absolute(o.model_path).string();
  ao.trainer.threads = o.threads;
  ao.trainer.shares = cfg.shares;
  ao.trainer.temperature = cfg.temperature;
  ao.trainer.device = o.device;
  ao.trainer.dist_backend = o.dist_backend;
  ao.trainer.grpo = cfg.grpo;
  ao.trainer.adamw = cfg.adamw;
  ao.reference_workers = o.reference_workers;
  ao.tool_workers = o.tool_workers;
  if (o.tool_workers > 0) ao.tools = tool_config(o, cfg);
  ao.reference.model_path = ao.trainer.model_path;
  ao.reference.threads = o.threads;
  ao.reference.temperature = cfg.temperature;
  ao.reference.device = o.device;  // the in-process reference's device: the same bits
  return rl_agent_cluster::start(ao);
}

/// --metrics-port: Prometheus text and, with agents, the run's cluster for `weft cluster status
/// --rl` (false: said why).
bool serve_metrics(const rl_options& o, rl_reporter& report, const rl_agent_cluster* cluster,
                   const weft::rl::tool_actors* tools, std::optional<metrics_server>& http) {
  if (o.metrics_port <= 0) return true;
  http.emplace([&report] { return report.prometheus(); });
  if (cluster != nullptr) {
    http->add_json("/admin/cluster", [cluster, tools, model = o.model_path] {
      return "{\"model\":" + nlohmann::json(model).dump() +
             ",\"cluster\":" + cluster->cluster_json() +
             ",\"rl\":" + cluster->backend()->status_json() + ",\"rewards\":" +
             (cluster->rewards() ? cluster->rewards()->status_json() : std::string{"null"}) +
             ",\"trainers\":" +
             (cluster->trainers() ? cluster->trainers()->status_json() : std::string{"null"}) +
             ",\"reference\":" +
             (cluster->reference() ? cluster->reference()->status_json() : std::string{"null"}) +
             ",\"tools\":" + (tools ? tools->status_json() : std::string{"null"}) +
             ",\"tool_workers\":" +
             (cluster->tools() ? cluster->tools()->status_json() : std::string{"null"}) + "}";
    });
  }
  if (!http->start(o.metrics_port)) {
    spdlog::error("--metrics-port {}: cannot listen on 127.0.0.1", o.metrics_port);
    return false;
  }
  spdlog::info("metrics on http://127.0.0.1:{}/metrics", o.metrics_port);
  return true;
}

/// The run's rewards: the reward workers of its cluster (--reward-workers), a program beside the
/// trainer (--reward-cmd) or an endpoint (--reward-url); the task's verifier otherwise. false: said
/// why.
bool use_rewards(const rl_options& o, rl_agent_cluster* cluster, grpo_loop& loop,
                 std::optional<reward_process_pool>& rewards,
                 std::optional<reward_http>& endpoint) {
  if (cluster && cluster->rewards()) {
    loop.set_reward(
        [r = cluster->rewards()](const std::vector<rl_prompt>& prompts,
                                 const std::vector<rollout_sample>& samples) {
          return r->score(reward_requests(prompts, samples));
        },
        reward_unit::sample);
    spdlog::info(
        "rewards from `{}` on {} reward worker(s){}", o.reward_cmd, o.reward_workers,
        o.reward_procs > 1 ? fmt::format(", {} copies each", o.reward_procs) : std::string{});
  } else if (!o.reward_cmd.empty()) {
    use_reward_process(o, loop, rewards);
  }
  return o.reward_url.empty() || use_reward_endpoint(o, loop, endpoint);
}

/// `--reference-workers K`: the KL reference on the cluster's reference nodes.
void use_reference(const rl_options& o, rl_agent_cluster* cluster, grpo_loop& loop) {
  if (!cluster || !cluster->reference()) return;
  loop.set_reference(cluster->reference());
  spdlog::info("KL reference on {} reference worker(s)", o.reference_workers);
}

/// `--trainers K`: ranks 1..K-1 on the cluster's trainer nodes. false: said why.
bool use_trainer_group(const rl_options& o, rl_agent_cluster* cluster, grpo_loop& loop) {
  if (!cluster || !cluster->trainers()) return true;
  if (auto st = loop.set_update_group(cluster->trainers()); !st) {
    spdlog::error("{}", st.message());
    return false;
  }
  spdlog::info("{} data-parallel trainer ranks: rank 0 here, 1..{} on trainer nodes", o.trainers,
               o.trainers - 1);
  return true;
}

/// `--tools`: the tool actors the loop's samples call (none without tools). false: said why.
bool start_tools(const rl_options& o, const grpo_loop_config& cfg, grpo_loop& loop,
                 rl_agent_cluster* cluster, std::shared_ptr<weft::rl::tool_actors>& tools) {
  if (cfg.tools.empty()) return true;
  const weft::rl::tool_actors_config tc = tool_config(o, cfg);
  std::string names;
  for (const auto& t : cfg.tools) names += (names.empty() ? "" : ",") + t;
  if (cluster && cluster->tools()) {
    loop.set_tools(cluster->tools());
  } else {
    auto made = weft::rl::tool_actors::create(tc);
    if (!made) {
      spdlog::error("--tools: {}", made.error().message);
      return false;
    }
    tools = std::move(*made);
    loop.set_tools(tools);
  }
  spdlog::info(
      "agentic rollouts: tool actors {} ({} ms a call, {}){}, up to {} calls a sample, {} turns",
      names, o.tool_latency_ms, o.tool_latency_dist,
      o.tool_workers > 0 ? fmt::format(" on {} tool worker(s)", o.tool_workers) : std::string{},
      o.max_tool_calls, o.tool_turns);
  for (const auto& c : tc.commands) {
    if (c.http) {
      spdlog::info("tool {}: POST {} ({} calls at once)", c.name, c.command, tc.concurrency);
    } else {
      spdlog::info("tool {}: `{}` (JSON lines, {} process{})", c.name, c.command, tc.processes,
                   tc.processes == 1 ? "" : "es");
    }
  }
  return true;
}

}  // namespace weft::apps
