#include "apps/rl_report.hpp"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <sstream>

#include "apps/train_report.hpp"

namespace weft::apps {

namespace fs = std::filesystem;

rl_reporter::rl_reporter(fs::path metrics_path, int64_t total_steps, int64_t resume_step)
    : path_(std::move(metrics_path)), total_(total_steps) {
  if (path_.has_parent_path()) fs::create_directories(path_.parent_path());
  std::vector<std::string> kept;
  if (resume_step > 0) {
    std::ifstream in(path_);
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("step") || !j["step"].is_number_integer()) continue;
      if (j["step"].get<int64_t>() <= resume_step) kept.push_back(line);
    }
  }
  out_.open(path_, std::ios::trunc);
  for (const auto& l : kept) out_ << l << '\n';
  out_.flush();
}

void rl_reporter::report(const gpu::rl::rl_step_record& r, double step_seconds) {
  {
    std::lock_guard lock(mu_);
    last_ = r;
    ++steps_;
    samples_ += r.samples;
    tokens_ += r.completion_tokens;
    seconds_ += step_seconds;
    rollout_s_ += r.rollout_s;
    train_s_ += r.train_s;
    sync_s_ += r.sync_s;
    ref_s_ += r.ref_s;
    ref_wait_s_ += r.ref_wait_s;
    reduce_s_ += r.reduce_s;
    reward_s_ += r.reward_s;
    reward_wait_s_ += r.reward_wait_s;
    tool_calls_ += r.tool_calls;
  }
  const double sps = static_cast<double>(r.samples) / std::max(step_seconds, 1e-9);
  const double eta = static_cast<double>(total_ - r.step) * seconds_ / static_cast<double>(steps_);
  spdlog::info(
      "step {}/{}  reward {:.3f} ±{:.2f}  len {:.1f}  stop {:.0f}%  loss {:+.4f}  |g| {:.3f}  "
      "clip {:.1f}%  gen {:.2f}s train {:.2f}s sync {:.3f}s  {:.2f} samples/s  eta {}",
      r.step, total_, r.reward_mean, r.reward_std, r.completion_len, 100.0 * r.stopped_fraction,
      r.loss, r.grad_norm, 100.0 * r.clip_fraction, r.rollout_s, r.train_s, r.sync_s, sps,
      format_duration(eta));
  if (r.kl > 0.0 && r.ref_wait_s > 0.0) {
    spdlog::info(
        "  KL to the reference {:.5f} per token; its workers {:.2f}s, {:.2f}s of it "
        "waited for",
        r.kl, r.ref_s, r.ref_wait_s);
  } else if (r.kl > 0.0) {
    spdlog::info("  KL to the reference {:.5f} per token", r.kl);
  }
  if (r.reward_s > 0.0) {
    spdlog::info("  rewards: {:.2f}s scoring, {:.2f}s of it waited for", r.reward_s,
                 r.reward_wait_s);
  }
  if (r.routes_replayed > 0) {
    spdlog::info(
        "  routing replay: {} token-layers routed as the rollouts were, {:.2f}% of them "
        "differ from the trainer's own top-k",
        r.routes_replayed, 100.0 * r.route_mismatch);
  }
  if (r.agents.agents_lost > agents_lost_) {
    spdlog::info(
        "  rollout agents: {} ready, {} lost so far, {} rollouts moved, {} weight pulls "
        "from peers",
        r.agents.ready_agents, r.agents.agents_lost, r.agents.rollouts_moved,
        r.agents.peer_weight_pulls);
    agents_lost_ = r.agents.agents_lost;
  }
  if (r.reward_restarts > reward_restarts_) {
    spdlog::info("  rewards: {} restart(s) of the reward program or resent requests so far",
                 r.reward_restarts);
    reward_restarts_ = r.reward_restarts;
  }
  if (r.reward_workers_lost > reward_workers_lost_) {
    spdlog::info("  reward workers: {} lost so far, {} parts scored again", r.reward_workers_lost,
                 r.reward_parts_rescored);
    reward_workers_lost_ = r.reward_workers_lost;
  }
  if (r.reference_workers_lost > reference_workers_lost_) {
    spdlog::info("  reference workers: {} lost so far, {} batches sent again",
                 r.reference_workers_lost, r.reference_batches_resent);
    reference_workers_lost_ = r.reference_workers_lost;
  }
  if (r.trainer_groups > std::max<int64_t>(1, trainer_groups_)) {
    spdlog::info(
        "  trainer group: restarted {} time(s) so far; rank 0's state sent to the new group",
        r.trainer_groups - 1);
  }
  trainer_groups_ = std::max(trainer_groups_, r.trainer_groups);
  if (r.tool_restarts > tool_restarts_) {
    spdlog::info("  tool actors: {} restarted so far, {} calls sent again", r.tool_restarts,
                 r.tool_calls_resent);
    tool_restarts_ = r.tool_restarts;
  }
  if (r.tool_calls > 0) {
    spdlog::info(
        "  tools: {} calls ({:.2f} per sample), {} result tokens, {:.0f}% of the "
        "continuations' context from the prefix cache",
        r.tool_calls,
        static_cast<double>(r.tool_calls) / static_cast<double>(std::max<int64_t>(1, r.samples)),
        r.tool_tokens, 100.0 * r.tool_kv_reuse);
  }
  if (r.staleness_max > 0 || r.in_flight > 0) {
    spdlog::info("  staleness {:.2f} (max {}), {} samples of mixed versions, {} in flight",
                 r.staleness_mean, r.staleness_max, r.mixed_version_samples, r.in_flight);
  }
  nlohmann::json j = {{"kind", "step"},
                      {"step", r.step},
                      {"version", r.version},
                      {"samples", r.samples},
                      {"reward", r.reward_mean},
                      {"reward_std", r.reward_std},
                      {"zero_variance_groups", r.zero_variance_groups},
                      {"completion_len", r.completion_len},
                      {"completion_len_max", r.completion_len_max},
                      {"completion_tokens", r.completion_tokens},
                      {"stopped_fraction", r.stopped_fraction},
                      {"loss", r.loss},
                      {"grad_norm", r.grad_norm},
                      {"lr", r.lr},
                      {"clip_fraction", r.clip_fraction},
                      {"ratio_deviation", r.ratio_deviation},
                      {"routes_replayed", r.routes_replayed},
                      {"route_mismatch", r.route_mismatch},
                      {"prompt_cache_hit", r.prompt_cache_hit},
                      {"kl", r.kl},
                      {"agents_ready", r.agents.ready_agents},
                      {"agents_lost", r.agents.agents_lost},
                      {"rollouts_moved", r.agents.rollouts_moved},
                      {"rollouts_consolidated", r.agents.rollouts_consolidated},
                      {"consolidations", r.agents.consolidations},
                      {"peer_weight_pulls", r.agents.peer_weight_pulls},
                      {"controller_weight_pulls", r.agents.controller_weight_pulls},
                      {"reward_restarts", r.reward_restarts},
                      {"reward_workers_lost", r.reward_workers_lost},
                      {"reward_parts_rescored", r.reward_parts_rescored},
                      {"reference_workers_lost", r.reference_workers_lost},
                      {"reference_batches_resent", r.reference_batches_resent},
                      {"weight_pull_s", r.agents.last_pull_s},
                      {"staleness_mean", r.staleness_mean},
                      {"staleness_max", r.staleness_max},
                      {"mixed_version_samples", r.mixed_version_samples},
                      {"in_flight", r.in_flight},
                      {"rollout_s", r.rollout_s},
                      {"train_s", r.train_s},
                      {"sync_s", r.sync_s},
                      {"ref_s", r.ref_s},
                      {"ref_wait_s", r.ref_wait_s},
                      {"reduce_s", r.reduce_s},
                      {"reward_s", r.reward_s},
                      {"reward_wait_s", r.reward_wait_s},
                      {"trainer_groups", r.trainer_groups},
                      {"tool_calls", r.tool_calls},
                      {"tool_tokens", r.tool_tokens},
                      {"tool_kv_reuse", r.tool_kv_reuse},
                      {"tool_restarts", r.tool_restarts},
                      {"tool_calls_resent", r.tool_calls_resent},
                      {"step_s", step_seconds},
                      {"samples_per_s", sps}};
  out_ << j.dump() << '\n';
  out_.flush();
}

void rl_reporter::report_eval(const gpu::rl::rl_eval_record& e) {
  {
    std::lock_guard lock(mu_);
    last_eval_ = e;
    has_eval_ = true;
  }
  spdlog::info(
      "eval at step {}: pass@1 {:.3f} on {} held-out prompts (greedy), len {:.1f}, {} tool calls, "
      "{:.1f}s",
      e.step, e.pass_at_1, e.prompts, e.completion_len, e.tool_calls, e.seconds);
  nlohmann::json j = {{"kind", "eval"},
                      {"step", e.step},
                      {"pass_at_1", e.pass_at_1},
                      {"prompts", e.prompts},
                      {"completion_len", e.completion_len},
                      {"tool_calls", e.tool_calls},
                      {"eval_s", e.seconds}};
  out_ << j.dump() << '\n';
  out_.flush();
}

void rl_reporter::add_checkpoint() {
  std::lock_guard lock(mu_);
  ++checkpoints_;
}

std::string rl_reporter::prometheus() const {
  std::lock_guard lock(mu_);
  std::ostringstream o;
  auto metric = [&o](const char* name, const char* type, const char* help, double value) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
      << name << ' ' << value << '\n';
  };
  metric("weft_rl_steps_total", "counter", "GRPO steps done by this process",
         static_cast<double>(steps_));
  metric("weft_rl_samples_total", "counter", "Samples generated and trained on",
         static_cast<double>(samples_));
  metric("weft_rl_completion_tokens_total", "counter", "Generated tokens trained on",
         static_cast<double>(tokens_));
  metric("weft_rl_checkpoints_total", "counter", "Checkpoints written",
         static_cast<double>(checkpoints_));
  metric("weft_rl_weight_version", "gauge", "Weight version the rollout engine serves",
         static_cast<double>(last_.version));
  metric("weft_rl_reward_mean", "gauge", "Mean reward of the last step's samples",
         last_.reward_mean);
  metric("weft_rl_kl", "gauge",
         "Mean KL estimate (k3) to the reference over the last step's tokens", last_.kl);
  metric("weft_rl_staleness_mean", "gauge",
         "Mean versions between the trainer and the last step's samples' oldest tokens",
         last_.staleness_mean);
  metric("weft_rl_in_flight_samples", "gauge",
         "Samples of later steps generating when the last step trained",
         static_cast<double>(last_.in_flight));
  metric("weft_rl_clip_fraction", "gauge", "Fraction of the last step's tokens clipped",
         last_.clip_fraction);
  metric("weft_rl_route_mismatch", "gauge",
         "Routing replay: share of the last step's replayed (token, layer) routes the trainer's "
         "own router would have chosen otherwise",
         last_.route_mismatch);
  metric("weft_rl_rollout_seconds_total", "counter", "Time spent generating", rollout_s_);
  metric("weft_rl_train_seconds_total", "counter", "Time spent scoring and training", train_s_);
  metric("weft_rl_sync_seconds_total", "counter", "Time spent copying weights to the engine",
         sync_s_);
  metric("weft_rl_agents_ready", "gauge",
         "Rollout agents holding the current weights (--agents; 0 in one process)",
         static_cast<double>(last_.agents.ready_agents));
  metric("weft_rl_agents_lost_total", "counter", "Rollout agents that died or were stopped",
         static_cast<double>(last_.agents.agents_lost));
  metric("weft_rl_rollouts_moved_total", "counter",
         "Rollouts resumed on another agent after theirs was lost",
         static_cast<double>(last_.agents.rollouts_moved));
  metric("weft_rl_rollouts_consolidated_total", "counter",
         "Rollouts moved off an agent to consolidate a step's tail (--consolidate-tail)",
         static_cast<double>(last_.agents.rollouts_consolidated));
  metric("weft_rl_peer_weight_pulls_total", "counter",
         "Weight versions an agent pulled from a peer agent (a joining agent, or "
         "--weight-fanout's tree)",
         static_cast<double>(last_.agents.peer_weight_pulls));
  metric("weft_rl_controller_weight_pulls_total", "counter",
         "Weight versions an agent pulled from the trainer's process",
         static_cast<double>(last_.agents.controller_weight_pulls));
  metric("weft_rl_reward_restarts_total", "counter",
         "--reward-cmd processes restarted (a crash or a hang) or --reward-url requests sent "
         "again",
         static_cast<double>(last_.reward_restarts));
  metric("weft_rl_reward_workers_lost_total", "counter",
         "Reward workers (--reward-workers) that died or were stopped",
         static_cast<double>(last_.reward_workers_lost));
  metric("weft_rl_reward_parts_rescored_total", "counter",
         "Parts of reward batches scored again after their worker was lost",
         static_cast<double>(last_.reward_parts_rescored));
  metric("weft_rl_reference_workers_lost_total", "counter",
         "KL reference workers (--reference-workers) that died or were stopped",
         static_cast<double>(last_.reference_workers_lost));
  metric("weft_rl_reference_batches_resent_total", "counter",
         "Reference batches sent again after their worker was lost",
         static_cast<double>(last_.reference_batches_resent));
  metric("weft_rl_trainer_group_restarts_total", "counter",
         "Restarts of the trainer group (--trainers): a rank was lost and the group formed again",
         static_cast<double>(std::max<int64_t>(0, last_.trainer_groups - 1)));
  metric("weft_rl_allreduce_seconds_total", "counter",
         "Time rank 0 spent in the trainer group's gradient all-reduces (--trainers)", reduce_s_);
  metric("weft_rl_reward_seconds_total", "counter",
         "Time the external reward (--reward-cmd, --reward-url, --reward-workers) took to score "
         "the trained samples",
         reward_s_);
  metric("weft_rl_reward_wait_seconds_total", "counter",
         "Time the run waited for rewards with nothing else to do", reward_wait_s_);
  metric("weft_rl_tool_calls_total", "counter",
         "Tool calls of agentic rollouts (--tools) in trained samples",
         static_cast<double>(tool_calls_));
  metric("weft_rl_tool_restarts_total", "counter", "Tool actors (--tools) restarted after dying",
         static_cast<double>(last_.tool_restarts));
  metric("weft_rl_tool_calls_resent_total", "counter",
         "Tool calls sent again (a tool died or missed its deadline)",
         static_cast<double>(last_.tool_calls_resent));
  metric("weft_rl_reference_seconds_total", "counter",
         "Time spent in the KL reference's forward (--kl-coef)", ref_s_);
  metric("weft_rl_reference_wait_seconds_total", "counter",
         "Time the run waited for reference workers (--reference-workers) with nothing else to "
         "do",
         ref_wait_s_);
  if (has_eval_) {
    metric("weft_rl_eval_pass_at_1", "gauge", "Held-out greedy pass@1 at the last evaluation",
           last_eval_.pass_at_1);
  }
  return o.str();
}

}  // namespace weft::apps
