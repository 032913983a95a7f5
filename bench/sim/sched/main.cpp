// weft_sched_sim: the engine's iteration scheduling under FCFS and skip-join MLFQ (the real policy
// classes) on `weft bench serve`'s synthetic workloads (the same generator and seeds), with a
// step-time model instead of a forward pass. Prints one line per (rate, policy) with mean / p50 /
// p99 E2E and each policy's mean E2E relative to the first policy's; writes JSON.
//
//   weft_sched_sim --rates 6,7,8 --seeds 7,8,9 -n 300 --max-running 2 --output-dist pareto ...

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "actors/serve/schedule_policies.hpp"
#include "apps/loadgen/workload.hpp"
#include "bench/sim/sched/sched_sim.hpp"

using namespace weft;
namespace lg = weft::apps::loadgen;
namespace sim = weft::bench::sim;
using nlohmann::json;

namespace {

struct stats {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
};

stats summarize(std::vector<double> v) {
  stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  const auto at = [&](double q) {
    return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
  };
  s.mean = sum / static_cast<double>(v.size());
  s.p50 = at(0.5);
  s.p90 = at(0.9);
  s.p99 = at(0.99);
  return s;
}

json to_json(const stats& s) {
  return {{"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90}, {"p99", s.p99}};
}

template <class T>
std::vector<T> parse_list(const std::string& text) {
  std::vector<T> out;
  std::stringstream ss(text);
  for (std::string x; std::getline(ss, x, ',');) {
    if (x.empty()) continue;
    if constexpr (std::is_same_v<T, std::string>)
      out.push_back(x);
    else
      out.push_back(static_cast<T>(std::stod(x)));
  }
  return out;
}

/// weft serve's policies by name, plus the simulator's references (srpt, las). `requests` is the
/// run the policy will see (the oracle reads its output lengths). Null with `error` set for an
/// unknown name or bad MLFQ settings.
std::shared_ptr<gpu::schedule_policy> make_policy(const std::string& name,
                                                  const serve::mlfq_config& mlfq,
                                                  const std::vector<sim::sim_request>& requests,
                                                  std::string& error) {
  if (name == "srpt") return std::make_shared<sim::srpt_oracle>(requests);
  if (name == "las") return std::make_shared<sim::las_policy>();
  auto made = serve::make_schedule_policy(name, mlfq);
  if (!made) {
    error = made.error().to_string();
    return nullptr;
  }
  return made.value();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Simulates one engine worker's iteration scheduling (the real fcfs / mlfq policy classes) "
      "on weft bench serve's synthetic workloads, with a step-time model in place of the forward "
      "pass. Fit the model from gpu_engine_bench and weft bench serve figures (docs/serving.md)."};
  std::string policies_arg = "fcfs,mlfq", rates_arg = "4,6,8", seeds_arg = "7";
  size_t n = 300;
  sim::sim_engine_config engine;
  engine.max_running = 2;
  std::string prompt_dist = "fixed", output_dist = "pareto";
  lg::length_config prompt{.dist = lg::length_dist::fixed, .mean_tokens = 16};
  lg::length_config output{
      .dist = lg::length_dist::pareto, .mean_tokens = 32, .max_tokens = 512, .pareto_alpha = 1.2};
  serve::mlfq_config mlfq;
  mlfq.prefill_cost_per_token = 0.4;  // weft serve's default
  std::string out_dir = std::string{WEFT_SOURCE_DIR} + "/bench/results";
  std::string trace_path;
  lg::trace_scaling_config scaling;
  app.add_option("--policies", policies_arg,
                 "Comma-separated policies (fcfs, mlfq; references: srpt = an oracle that knows "
                 "output lengths, las = least attained service); ratios are to the first")
      ->capture_default_str();
  app.add_option("--rates", rates_arg, "Comma-separated request rates (req/s)")
      ->capture_default_str();
  app.add_option("--seeds", seeds_arg, "Comma-separated workload seeds (pooled per rate)")
      ->capture_default_str();
  app.add_option("-n,--num-requests", n, "Requests per run")->capture_default_str();
  app.add_option("--max-running", engine.max_running, "Batch slots")->capture_default_str();
  app.add_option("--max-batch-tokens", engine.max_batch_tokens, "Tokens per forward pass")
      ->capture_default_str();
  app.add_option("--idle-batch-tokens", engine.idle_batch_tokens,
                 "Tokens of a pass without decodes (weft serve's --idle-batch-tokens; 0 = "
                 "--max-batch-tokens)")
      ->capture_default_str();
  app.add_option("--step-base-ms", engine.model.base_ms, "Step model: fixed cost of a pass")
      ->capture_default_str();
  app.add_option("--step-per-seq-ms", engine.model.per_seq_ms,
                 "Step model: cost per sequence that samples a token")
      ->capture_default_str();
  app.add_option("--step-per-prefill-token-ms", engine.model.per_prefill_token_ms,
                 "Step model: cost per prompt token")
      ->capture_default_str();
  app.add_option("--overhead-ms", engine.model.overhead_ms,
                 "Per-request latency outside the engine (HTTP, router)")
      ->capture_default_str();
  app.add_option("--prompt-dist", prompt_dist, "fixed, uniform, pareto, lognormal")
      ->capture_default_str();
  app.add_option("--prompt-tokens", prompt.mean_tokens, "Prompt length (fixed) or mean")
      ->capture_default_str();
  app.add_option("--prompt-max", prompt.max_tokens, "Prompt clip (0 = none)")
      ->capture_default_str();
  app.add_option("--output-dist", output_dist, "fixed, uniform, pareto, lognormal")
      ->capture_default_str();
  app.add_option("--output-tokens", output.mean_tokens, "Output length (fixed) or mean")
      ->capture_default_str();
  app.add_option("--output-max", output.max_tokens, "Output clip (0 = none)")
      ->capture_default_str();
  app.add_option("--pareto-alpha", output.pareto_alpha, "Pareto shape of output lengths")
      ->capture_default_str();
  app.add_option("--lognormal-sigma", output.lognormal_sigma, "Log-normal sigma of output lengths")
      ->capture_default_str();
  app.add_option("--mlfq-queues", mlfq.n_queues, "MLFQ queues")->capture_default_str();
  app.add_option("--mlfq-base-quantum", mlfq.base_quantum, "MLFQ quantum of queue 0")
      ->capture_default_str();
  app.add_option("--mlfq-prefill-cost", mlfq.prefill_cost_per_token,
                 "MLFQ cost of a prompt token in decode iterations")
      ->capture_default_str();
  app.add_option("--mlfq-starvation-steps", mlfq.starvation_steps,
                 "MLFQ starvation guard (iterations)")
      ->capture_default_str();
  app.add_option("--trace", trace_path,
                 "Replay a trace (Azure CSV or Mooncake JSONL) time-scaled to each rate instead of "
                 "the synthetic lengths; --seeds are then trace offsets (windows of -n requests)")
      ->check(CLI::ExistingFile);
  app.add_option("--prompt-scale", scaling.prompt_scale,
                 "Trace: multiply prompt lengths by this (0 = the --max-prompt-tokens rule)")
      ->capture_default_str();
  app.add_option("--max-prompt-tokens", scaling.max_prompt_tokens,
                 "Trace: scale (or with --prompt-scale clip) prompts to this many tokens")
      ->capture_default_str();
  app.add_option("--max-output-tokens", scaling.max_output_tokens,
                 "Trace: scale output lengths so the longest has this many tokens (0 = as traced)")
      ->capture_default_str();
  app.add_option("--out", out_dir, "Directory of the JSON result")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (!lg::parse_length_dist(prompt_dist, prompt.dist) ||
      !lg::parse_length_dist(output_dist, output.dist)) {
    std::fprintf(stderr, "unknown length distribution (fixed, uniform, pareto, lognormal)\n");
    return 2;
  }
  std::vector<std::string> policies;
  std::vector<double> rates;
  std::vector<uint64_t> seeds;
  try {
    policies = parse_list<std::string>(policies_arg);
    rates = parse_list<double>(rates_arg);
    seeds = parse_list<uint64_t>(seeds_arg);
  } catch (const std::exception&) {
    std::fprintf(stderr, "--rates and --seeds take comma-separated numbers\n");
    return 2;
  }
  if (policies.empty() || rates.empty() || seeds.empty() || n == 0 || engine.max_running < 1 ||
      engine.max_batch_tokens < 2) {
    std::fprintf(stderr,
                 "need policies, rates, seeds, -n >= 1, --max-running >= 1 and "
                 "--max-batch-tokens >= 2\n");
    return 2;
  }
  for (const auto& p : policies) {
    if (std::string error; !make_policy(p, mlfq, {}, error)) {
      std::fprintf(stderr, "%s\n", error.c_str());
      return 2;
    }
  }

  std::optional<lg::trace> source;
  if (!trace_path.empty()) {
    auto format = lg::detect_trace_format(trace_path);
    auto t = format ? lg::load_trace(trace_path, format.value())
                    : lg::result<lg::trace>::failure(format.error());
    if (!t) {
      std::fprintf(stderr, "%s\n", t.error().c_str());
      return 2;
    }
    source = std::move(t.value());
  }

  json j;
  j["benchmark"] = "sched_sim";
  j["engine"] = {{"max_running", engine.max_running},
                 {"max_batch_tokens", engine.max_batch_tokens},
                 {"idle_batch_tokens", engine.idle_batch_tokens},
                 {"step_base_ms", engine.model.base_ms},
                 {"step_per_seq_ms", engine.model.per_seq_ms},
                 {"step_per_prefill_token_ms", engine.model.per_prefill_token_ms},
                 {"overhead_ms", engine.model.overhead_ms}};
  j["mlfq"] = {{"n_queues", mlfq.n_queues},
               {"base_quantum", mlfq.base_quantum},
               {"prefill_cost_per_token", mlfq.prefill_cost_per_token},
               {"starvation_steps", mlfq.starvation_steps}};
  j["seeds"] = seeds;
  if (source)
    j["trace"] = {{"path", trace_path},
                  {"offsets", seeds},
                  {"prompt_scale", scaling.prompt_scale},
                  {"max_prompt_tokens", scaling.max_prompt_tokens},
                  {"max_output_tokens", scaling.max_output_tokens}};
  j["num_requests"] = n;
  for (double rate : rates) {
    // The same requests as `weft bench serve --seed S --rate R` with these length settings.
    std::vector<std::vector<sim::sim_request>> runs;
    double busy = 0, span = 0;
    for (uint64_t seed : seeds) {
      lg::workload_config wc;
      wc.num_requests = n;
      wc.seed = seed;
      wc.synthetic.prompt = prompt;
      wc.synthetic.output = output;
      if (source) {
        wc.source_trace = &*source;
        wc.scaling = scaling;
        wc.scaling.offset = seed;
      }
      auto w = lg::build_workload(wc, rate);
      if (!w) {
        std::fprintf(stderr, "workload: %s\n", w.error().c_str());
        return 2;
      }
      std::vector<sim::sim_request> reqs;
      for (const auto& r : w->requests)
        reqs.push_back({r.send_time_s, std::max<int64_t>(1, r.prompt_tokens_target), r.max_tokens});
      runs.push_back(std::move(reqs));
    }
    json jr = {{"rate_rps", rate}};
    double first_mean = 0;
    for (size_t pi = 0; pi < policies.size(); ++pi) {
      std::vector<double> e2e, ttft;
      int64_t preemptions = 0;
      for (const auto& reqs : runs) {
        std::string error;  // the names were checked above
        const auto policy = make_policy(policies[pi], mlfq, reqs, error);
        const sim::sim_run run = sim::simulate(reqs, *policy, engine);
        for (const auto& o : run.outcomes) {
          e2e.push_back(o.e2e_s * 1000.0);
          ttft.push_back(o.ttft_s * 1000.0);
          preemptions += o.preemptions;
        }
        if (pi == 0) {
          busy += run.busy_s;
          span += run.makespan_s;
        }
      }
      const stats se = summarize(e2e), st = summarize(ttft);
      if (pi == 0) first_mean = se.mean;
      jr["policies"][policies[pi]] = {
          {"e2e_ms", to_json(se)}, {"ttft_ms", to_json(st)}, {"preemptions", preemptions}};
      std::printf("rate %5.2f  %-5s E2E mean %7.0f ms  p50 %6.0f  p99 %7.0f  TTFT p50 %5.0f ms",
                  rate, policies[pi].c_str(), se.mean, se.p50, se.p99, st.p50);
      if (pi == 0)
        std::printf("  busy %.0f %%\n", 100.0 * busy / span);
      else
        std::printf("  mean %.2fx lower than %s\n", first_mean / se.mean, policies[0].c_str());
    }
    jr["busy_fraction_first_policy"] = busy / span;
    j["results"].push_back(jr);
  }
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char date[32];
  std::strftime(date, sizeof date, "%Y%m%d-%H%M%S", std::gmtime(&now));
  std::filesystem::create_directories(out_dir);
  const auto path = std::filesystem::path{out_dir} / ("sched-sim-" + std::string{date} + ".json");
  std::ofstream(path) << j.dump(2) << "\n";
  std::printf("wrote %s\n", path.c_str());
  return 0;
}
