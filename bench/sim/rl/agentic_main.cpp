// weft_agentic_sim: agentic GRPO rollouts (generation turns between tool calls) on one rollout
// engine, first come first served against `weft rl --trajectory-priority` — weft's own policy
// classes, priorities and length ranker, with a step-time model instead of forward passes
// (docs/rl.md, "Trajectory-level scheduling"). One line per (max running, tool latency) with
// samples/s of both and their ratio; writes JSON.
//
//   weft_agentic_sim --max-running 32,64 --tool-mean-s 0.5,2,5 --out bench/results

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "bench/sim/dated_json.hpp"
#include "bench/sim/rl/agentic_sim.hpp"

namespace {

using weft::bench::sim::agentic_sim_config;
using weft::bench::sim::agentic_sim_result;

nlohmann::json to_json(const agentic_sim_result& r) {
  return {{"seconds", r.seconds},
          {"trajectories", r.trajectories},
          {"samples_per_s", r.samples_per_s},
          {"mean_step_s", r.mean_step_s},
          {"mean_queued_s", r.mean_queued_s},
          {"mean_batch", r.mean_batch},
          {"preemptions", r.preemptions},
          {"turns", r.turns}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Agentic GRPO rollouts on one engine: first come first served vs weft rl's trajectory "
      "priority (Heddle), with weft's policy classes and a step-time model (docs/rl.md)"};
  agentic_sim_config c;
  std::vector<int64_t> max_running{32, 64, 128};
  std::vector<double> tool_mean_s{0.5, 2.0, 5.0};
  std::string out_dir = "bench/results";
  app.add_option("--max-running", max_running, "Sequences the engine decodes at once (list)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--tool-mean-s", tool_mean_s, "Mean tool-call latency, exponential (list, s)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--steps", c.steps, "RL steps per run")->capture_default_str();
  app.add_option("--prompts-per-step", c.prompts_per_step, "Prompts per step")
      ->capture_default_str();
  app.add_option("--group-size", c.group_size, "Samples per prompt")->capture_default_str();
  app.add_option("--step-base-ms", c.step_base_ms, "Decode step time: base (ms)")
      ->capture_default_str();
  app.add_option("--step-per-seq-ms", c.step_per_seq_ms,
                 "Decode step time: per running sequence (ms)")
      ->capture_default_str();
  app.add_option("--mean-turns", c.mean_turns, "Mean turns of a trajectory (tool calls + 1)")
      ->capture_default_str();
  app.add_option("--max-turns", c.max_turns, "Turns cap")->capture_default_str();
  app.add_option("--prompt-sigma", c.prompt_sigma, "Lognormal spread of prompts' work")
      ->capture_default_str();
  app.add_option("--sample-sigma", c.sample_sigma, "Lognormal spread of turns within a group")
      ->capture_default_str();
  app.add_option("--mean-turn-tokens", c.mean_turn_tokens, "Mean tokens a turn generates")
      ->capture_default_str();
  app.add_option("--turn-sigma", c.turn_sigma, "Lognormal spread of a turn's tokens")
      ->capture_default_str();
  app.add_option("--dataset-prompts", c.dataset_prompts, "Prompts before the data repeats")
      ->capture_default_str();
  app.add_option("--seed", c.seed, "Seed of prompts, lengths and latencies")->capture_default_str();
  app.add_option("--out", out_dir, "Directory for agentic-sim-<date>.json")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  nlohmann::json runs = nlohmann::json::array();
  std::printf("%8s  %7s  %12s  %12s  %6s  %14s  %14s\n", "running", "tool s", "fcfs smp/s",
              "prio smp/s", "ratio", "queued s fcfs", "queued s prio");
  for (int64_t r : max_running) {
    for (double t : tool_mean_s) {
      agentic_sim_config x = c;
      x.max_running = r;
      x.tool_mean_s = t;
      const auto fcfs = weft::bench::sim::simulate_agentic(x, false);
      const auto prio = weft::bench::sim::simulate_agentic(x, true);
      const double ratio = fcfs.samples_per_s > 0 ? prio.samples_per_s / fcfs.samples_per_s : 0.0;
      std::printf("%8lld  %7.2f  %12.2f  %12.2f  %5.2fx  %14.2f  %14.2f\n",
                  static_cast<long long>(r), t, fcfs.samples_per_s, prio.samples_per_s, ratio,
                  fcfs.mean_queued_s, prio.mean_queued_s);
      runs.push_back({{"max_running", r},
                      {"tool_mean_s", t},
                      {"fcfs", to_json(fcfs)},
                      {"trajectory_priority", to_json(prio)},
                      {"ratio_priority_to_fcfs", ratio}});
    }
  }
  nlohmann::json doc = {{"benchmark", "agentic_sim"},
                        {"config",
                         {{"steps", c.steps},
                          {"prompts_per_step", c.prompts_per_step},
                          {"group_size", c.group_size},
                          {"step_base_ms", c.step_base_ms},
                          {"step_per_seq_ms", c.step_per_seq_ms},
                          {"mean_turns", c.mean_turns},
                          {"max_turns", c.max_turns},
                          {"prompt_sigma", c.prompt_sigma},
                          {"sample_sigma", c.sample_sigma},
                          {"mean_turn_tokens", c.mean_turn_tokens},
                          {"turn_sigma", c.turn_sigma},
                          {"dataset_prompts", c.dataset_prompts},
                          {"seed", c.seed}}},
                        {"heddle_reported_speedup", 2.5},
                        {"runs", runs}};
  const auto path = weft::bench::sim::write_dated_json(out_dir, "agentic-sim", doc);
  std::printf("wrote %s (Heddle reports up to 2.5x rollout throughput)\n", path.c_str());
  return 0;
}
