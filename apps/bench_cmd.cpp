// `weft bench serve`: an open-loop load generator for OpenAI-compatible servers (weft serve,
// vLLM, llama.cpp / llama-cpp-python servers). The logic lives in apps/loadgen/; this file is the
// command line and the sequence of runs (one rate, a sweep of rates, or a goodput search).

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "apps/commands.hpp"
#include "apps/loadgen/goodput.hpp"
#include "apps/loadgen/openai_client.hpp"
#include "apps/loadgen/report.hpp"
#include "apps/loadgen/runner.hpp"
#include "apps/loadgen/stats.hpp"
#include "apps/loadgen/trace.hpp"
#include "apps/loadgen/workload.hpp"

namespace weft::apps {

namespace {

namespace lg = loadgen;

struct serve_bench_options {
  // Server and protocol.
  std::string url = "http://127.0.0.1:8000";
  std::string api = "completions";
  std::string model;
  std::string api_key;
  double temperature = 0.0;
  bool respect_eos = false;
  double timeout_s = 600.0;
  size_t max_in_flight = 256;
  // Workload.
  size_t num_requests = 100;
  uint64_t seed = 0;
  std::string arrival = "poisson";
  double rate_rps = 1.0;
  double burstiness = 1.0;
  std::string prompt_dist = "fixed";
  int64_t prompt_tokens = 128;
  int64_t prompt_min = 1;
  int64_t prompt_max = 0;
  std::string output_dist = "fixed";
  int64_t output_tokens = 64;
  int64_t output_min = 1;
  int64_t output_max = 0;
  double pareto_alpha = 1.5;
  double lognormal_sigma = 1.0;
  int64_t shared_prefix_tokens = 0;
  // Trace replay.
  std::string trace_path;
  std::string trace_format = "auto";
  size_t trace_offset = 0;
  double time_scale = 0.0;
  int64_t max_prompt_tokens = 0;
  int64_t max_output_tokens = 0;
  double scale_percentile = 100.0;
  double prompt_scale = 0.0;
  // What to run.
  std::vector<double> rates;
  bool goodput = false;
  double rate_min_rps = 0.5;
  double rate_max_rps = 8.0;
  int bisect_steps = 4;
  double ttft_slo_ms = 0.0;
  double tpot_slo_ms = 0.0;
  double attainment_target = 0.9;
  // Output.
  std::string label;
  std::string out_path;
  std::string plot_path;
  std::string plot_script;
  bool no_records = false;
  double progress_interval_s = 5.0;
  std::string command_line;
  bool rate_given =
      false;  ///< --rate was on the command line (a trace then runs at that mean rate)
};

// Every figure of one run, printed and kept for the JSON.
struct run_outcome {
  double rate_rps = 0.0;
  lg::run_summary summary;
  nlohmann::json json;
};

class serve_bench {
 public:
  explicit serve_bench(serve_bench_options o) : o_{std::move(o)} {}

  int run() {
    if (!configure()) return 2;
    if (!probe_server()) return 1;
    nlohmann::json doc = header();
    std::vector<run_outcome> runs;
    std::optional<lg::goodput_result> goodput;
    lg::bisection_config bisect{o_.rate_min_rps, o_.rate_max_rps, o_.bisect_steps,
                                o_.attainment_target};
    bool fatal = false;

    if (o_.goodput) {
      size_t probe_index = 0;
      goodput = lg::bisect_goodput(bisect, [&](double rate) {
        if (fatal) return 0.0;
        auto r = run_once(rate, probe_index++);
        if (!r) {
          fatal = true;
          return 0.0;
        }
        runs.push_back(std::move(*r));
        return std::max(0.0, runs.back().summary.slo_attainment);
      });
    } else if (!o_.rates.empty()) {
      for (size_t i = 0; i < o_.rates.size() && !fatal; ++i) {
        auto r = run_once(o_.rates[i], i);
        if (r)
          runs.push_back(std::move(*r));
        else
          fatal = true;
      }
    } else {
      // One run: the synthetic rate, or the trace at --rate if given on the command line, else its
      // own time.
      auto r = run_once(trace_ ? trace_rate_ : o_.rate_rps, 0);
      if (r)
        runs.push_back(std::move(*r));
      else
        fatal = true;
    }

    bool any_ok = false;
    for (const auto& r : runs) any_ok = any_ok || r.summary.n_ok > 0;
    doc["runs"] = nlohmann::json::array();
    for (auto& r : runs) doc["runs"].push_back(std::move(r.json));
    if (goodput) {
      nlohmann::json probes = nlohmann::json::array();
      for (const auto& p : goodput->probes)
        probes.push_back(
            {{"rate_rps", p.rate_rps}, {"attainment", p.attainment}, {"pass", p.pass}});
      doc["goodput"] = {
          {"goodput_rps", fatal ? nlohmann::json(nullptr) : nlohmann::json(goodput->goodput_rps)},
          {"upper_bound_rps", goodput->upper_bound_rps},
          {"status", fatal ? "aborted" : lg::to_string(goodput->status)},
          {"rate_min_rps", bisect.rate_min_rps},
          {"rate_max_rps", bisect.rate_max_rps},
          {"bisect_steps", bisect.steps},
          {"attainment_target", bisect.attainment_target},
          {"probes", probes}};
      if (!fatal) std::printf("%s\n", lg::goodput_line(label_, *goodput, bisect, slo_).c_str());
    }
    doc["finished_at"] = lg::utc_timestamp();
    if (fatal) doc["aborted"] = true;

    const std::string out = o_.out_path.empty() ? default_out_path() : o_.out_path;
    if (auto w = lg::write_json_file(out, doc); !w) {
      spdlog::error("{}", w.error());
      return 1;
    }
    std::printf("serve %s results: %s\n", label_.c_str(), out.c_str());
    std::fflush(stdout);
    if (fatal) return 1;
    if (!any_ok) {
      spdlog::error("bench serve: no request succeeded (see the errors above)");
      return 1;
    }
    if (!o_.plot_path.empty()) {
      auto script = lg::find_plot_script(o_.plot_script);
      if (!script) {
        spdlog::error("plot: {}", script.error());
        return 3;
      }
      if (auto p = lg::run_plot(script.value(), {out}, o_.plot_path); !p) {
        spdlog::error("plot: {}", p.error());
        return 3;
      }
      std::printf("serve %s plot: %s\n", label_.c_str(), o_.plot_path.c_str());
    }
    return 0;
  }

 private:
  bool configure() {
    auto ep = lg::parse_base_url(o_.url);
    if (!ep) return fail(ep.error());
    client_.server = ep.value();
    client_.request.api = o_.api == "chat" ? lg::api_kind::chat : lg::api_kind::completions;
    client_.request.model = o_.model;
    client_.request.temperature = o_.temperature;
    client_.request.eos = o_.respect_eos ? lg::eos_mode::respect : lg::eos_mode::ignore;
    client_.api_key = o_.api_key;
    client_.timeout_s = o_.timeout_s;
    slo_ = {o_.ttft_slo_ms, o_.tpot_slo_ms};

    wl_.num_requests = o_.num_requests;
    wl_.seed = o_.seed;
    auto& s = wl_.synthetic;
    if (!lg::parse_arrival_kind(o_.arrival, s.arrival.kind))
      return fail("unknown --arrival " + o_.arrival);
    s.arrival.rate_rps = o_.rate_rps;
    s.arrival.burstiness = o_.burstiness;
    if (!lg::parse_length_dist(o_.prompt_dist, s.prompt.dist))
      return fail("unknown --prompt-dist " + o_.prompt_dist);
    if (!lg::parse_length_dist(o_.output_dist, s.output.dist))
      return fail("unknown --output-dist " + o_.output_dist);
    s.prompt = {s.prompt.dist, o_.prompt_tokens, o_.prompt_min,
                o_.prompt_max, o_.pareto_alpha,  o_.lognormal_sigma};
    s.output = {s.output.dist, o_.output_tokens, o_.output_min,
                o_.output_max, o_.pareto_alpha,  o_.lognormal_sigma};
    s.shared_prefix_tokens = o_.shared_prefix_tokens;

    if (!o_.trace_path.empty()) {
      lg::trace_format fmt_kind = lg::trace_format::azure;
      if (o_.trace_format == "auto") {
        auto f = lg::detect_trace_format(o_.trace_path);
        if (!f) return fail(f.error());
        fmt_kind = f.value();
      } else {
        fmt_kind =
            o_.trace_format == "mooncake" ? lg::trace_format::mooncake : lg::trace_format::azure;
      }
      auto t = lg::load_trace(o_.trace_path, fmt_kind);
      if (!t) return fail(t.error());
      trace_ = std::make_unique<lg::trace>(std::move(t.value()));
      wl_.source_trace = trace_.get();
      wl_.scaling = {o_.trace_offset,      0,
                     o_.time_scale,        0.0,
                     o_.max_prompt_tokens, o_.max_output_tokens,
                     o_.scale_percentile,  o_.prompt_scale};
      if (o_.time_scale > 0 && (o_.rate_given || o_.goodput || !o_.rates.empty())) {
        return fail(
            "--time-scale fixes the trace's speed: do not combine it with --rate, --rates or "
            "--goodput");
      }
      trace_rate_ = o_.rate_given ? o_.rate_rps : 0.0;
      spdlog::info("trace {}: {} requests ({})", o_.trace_path, trace_->entries.size(),
                   lg::to_string(fmt_kind));
    }
    if (o_.goodput) {
      if (slo_.ttft_ms <= 0 && slo_.tpot_ms <= 0)
        return fail("--goodput needs --ttft-slo-ms and/or --tpot-slo-ms");
      if (auto e = lg::validate(lg::bisection_config{o_.rate_min_rps, o_.rate_max_rps,
                                                     o_.bisect_steps, o_.attainment_target});
          !e.empty()) {
        return fail(e);
      }
    }
    for (double r : o_.rates) {
      if (!(r > 0)) return fail("every rate of --rates must be > 0");
    }
    // Build once up front so a bad workload fails before anything is sent.
    auto w = lg::build_workload(
        wl_, o_.goodput ? o_.rate_min_rps
                        : (o_.rates.empty() ? (trace_ ? trace_rate_ : o_.rate_rps) : o_.rates[0]));
    if (!w) return fail(w.error());
    label_ = o_.label.empty() ? (trace_ ? std::string{"trace"} : o_.arrival) : o_.label;
    return true;
  }

  bool probe_server() {
    auto info = lg::probe_server(client_);
    if (!info) return fail(info.error() + " (is the server running? start it, or pass --url)");
    if (info->http_status != 200) {
      spdlog::warn("GET {} answered HTTP {}; going on", client_.server.url("/v1/models"),
                   info->http_status);
    }
    if (client_.request.model.empty()) {
      if (!info->model_ids.empty()) {
        client_.request.model = info->model_ids.front();
        spdlog::info("model: {} (first of GET /v1/models; pass --model to choose)",
                     client_.request.model);
      } else {
        client_.request.model = "default";
        spdlog::warn("the server lists no model; sending model \"default\" (pass --model)");
      }
    }
    server_models_ = info->model_ids;
    if (client_.request.api == lg::api_kind::chat) {
      // The chat template wraps every prompt: shorten the words by what it adds, so the model
      // sees --prompt-tokens.
      auto overhead = lg::chat_template_overhead(client_);
      if (overhead) {
        wl_.prompt_overhead_tokens = overhead.value();
        spdlog::info(
            "--api chat: the chat template adds {} tokens to each prompt (POST "
            "/tokenize); prompt words shortened by as many",
            overhead.value());
      } else {
        spdlog::warn(
            "--api chat: cannot measure the chat template's tokens ({}); prompts carry "
            "them on top of the target lengths",
            overhead.error());
      }
    }
    return true;
  }

  /// bench/results/serve-LABEL-DATE.json, or -2, -3 ... when an earlier run of the day wrote it.
  std::string default_out_path() const {
    const std::string stem = fmt::format("bench/results/serve-{}-{}", label_, lg::utc_date());
    std::string path = stem + ".json";
    for (int i = 2; std::filesystem::exists(path); ++i) path = fmt::format("{}-{}.json", stem, i);
    return path;
  }

  nlohmann::json header() const {
    return {
        {"benchmark", "serve"},
        {"label", label_},
        {"started_at", lg::utc_timestamp()},
        {"machine", lg::machine_info()},
        {"commit", lg::git_commit()},
        {"command_line", o_.command_line},
        {"server",
         {{"url", o_.url},
          {"endpoint", lg::endpoint_path(client_.request.api)},
          {"model", client_.request.model},
          {"models_listed", server_models_},
          {"chat_template_tokens_subtracted", wl_.prompt_overhead_tokens}}},
        {"request",
         {{"temperature", client_.request.temperature},
          {"ignore_eos", client_.request.eos == lg::eos_mode::ignore},
          {"stream", true},
          {"include_usage", true},
          {"timeout_s", client_.timeout_s},
          {"max_in_flight", o_.max_in_flight}}},
        {"slo",
         {{"ttft_ms", slo_.ttft_ms > 0 ? nlohmann::json(slo_.ttft_ms) : nlohmann::json(nullptr)},
          {"tpot_ms", slo_.tpot_ms > 0 ? nlohmann::json(slo_.tpot_ms) : nlohmann::json(nullptr)},
          {"attainment_target", o_.attainment_target}}}};
  }

  // One open-loop run at `rate_rps` (<= 0: trace time); nullopt when the server is gone.
  std::optional<run_outcome> run_once(double rate_rps, size_t probe_index) {
    lg::workload_config cfg = wl_;
    cfg.seed = probe_index == 0 ? wl_.seed
                                : lg::mix_seed(wl_.seed, probe_index);  // fresh prompts per probe
    auto w = lg::build_workload(cfg, rate_rps);
    if (!w) {
      fail(w.error());
      return std::nullopt;
    }
    const auto& desc = w->description;
    if (trace_) {
      const auto& sc = desc["scaling"];
      spdlog::info(
          "trace scaling: time x{:.4g} ({:.3f} -> {:.3f} req/s), prompt lengths x{:.4g}, output "
          "lengths x{:.4g}{}",
          sc["time_scale"].get<double>(), sc["source_rate_rps"].get<double>(),
          sc["scaled_rate_rps"].get<double>(), sc["prompt_scale"].get<double>(),
          sc["output_scale"].get<double>(),
          sc.contains("block_tokens")
              ? fmt::format(", block {} tokens", sc["block_tokens"].get<int64_t>())
              : "");
    }
    spdlog::info(
        "run {}: {} requests, target prompt tokens mean {:.1f} (max {}), output tokens mean {:.1f} "
        "(max {})",
        probe_index, w->requests.size(), desc["prompt_tokens_target"]["mean"].get<double>(),
        desc["prompt_tokens_target"]["max"].get<int64_t>(),
        desc["output_tokens_target"]["mean"].get<double>(),
        desc["output_tokens_target"]["max"].get<int64_t>());
    lg::run_config rc;
    rc.client = client_;
    rc.max_in_flight = o_.max_in_flight;
    rc.progress_interval_s = o_.progress_interval_s;
    const double shown_rate =
        rate_rps > 0 ? rate_rps : (trace_ ? desc["scaling"]["scaled_rate_rps"].get<double>() : 0.0);
    rc.progress_label = fmt::format("{} @ {:.3f} req/s", label_, shown_rate);
    auto records = lg::run_open_loop(rc, w->requests);

    run_outcome out;
    out.rate_rps = shown_rate;
    out.summary = lg::summarize_run(records, slo_);
    for (const auto& line : lg::summary_lines(label_, shown_rate, out.summary, slo_))
      std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    // Show the first distinct errors so a misconfiguration is obvious.
    size_t shown = 0;
    std::string last;
    for (const auto& r : records) {
      if (!r.ok() && r.error != last && shown < 3) {
        spdlog::warn("request {} failed ({}): {}", r.index, lg::to_string(r.status), r.error);
        last = r.error;
        ++shown;
      }
    }
    out.json = {{"rate_rps", shown_rate},
                {"seed", cfg.seed},
                {"workload", desc},
                {"summary", lg::to_json(out.summary)}};
    if (!o_.no_records) {
      nlohmann::json recs = nlohmann::json::array();
      for (const auto& r : records) recs.push_back(lg::to_json(r));
      out.json["requests"] = std::move(recs);
    }
    size_t n_conn = 0;
    for (const auto& r : records)
      n_conn += r.status == lg::request_status::connection_error ? 1 : 0;
    if (n_conn == records.size()) {
      fail("every request failed to connect to " +
           client_.server.url(lg::endpoint_path(client_.request.api)) + " (server down?)");
      return std::nullopt;
    }
    return out;
  }

  bool fail(const std::string& message) {
    spdlog::error("bench serve: {}", message);
    return false;
  }

 private:
  serve_bench_options o_;
  lg::client_config client_;
  lg::slo_config slo_;
  lg::workload_config wl_;
  std::unique_ptr<lg::trace> trace_;
  double trace_rate_ = 0.0;
  std::string label_;
  std::vector<std::string> server_models_;
};

void add_serve_bench(CLI::App& bench) {
  auto o = std::make_shared<serve_bench_options>();
  CLI::App* cmd = bench.add_subcommand("serve",
                                       "Open-loop load generator for an OpenAI-compatible server: "
                                       "sends streaming requests at scheduled times "
                                       "(Poisson/gamma arrivals or a time-scaled trace), measures "
                                       "TTFT, TPOT, inter-token gaps, E2E latency, "
                                       "throughput and SLO attainment, and searches the goodput "
                                       "(highest rate with >= 90% attainment)");
  cmd->option_defaults()->always_capture_default();

  const auto* g_srv = "Server";
  cmd->add_option("--url", o->url, "Base URL of the server (http://host:port[/prefix])")
      ->group(g_srv);
  cmd->add_option("--api", o->api,
                  "Endpoint: completions (/v1/completions) or chat (/v1/chat/completions)")
      ->check(CLI::IsMember({"completions", "chat"}))
      ->group(g_srv);
  cmd->add_option("--model", o->model,
                  "Model name sent in requests (default: first of GET /v1/models)")
      ->group(g_srv);
  cmd->add_option("--api-key", o->api_key, "Bearer token (or OPENAI_API_KEY)")
      ->envname("OPENAI_API_KEY")
      ->group(g_srv);
  cmd->add_option("--temperature", o->temperature, "Sampling temperature")
      ->check(CLI::Range(0.0, 2.0))
      ->group(g_srv);
  cmd->add_flag("--respect-eos", o->respect_eos,
                "Do not send \"ignore_eos\": true (outputs may then end early)")
      ->group(g_srv);
  cmd->add_option("--timeout-s", o->timeout_s, "Per-request time limit (s)")
      ->check(positive_number)
      ->group(g_srv);
  cmd->add_option("--max-in-flight", o->max_in_flight,
                  "Client bound on concurrent requests; a request due beyond it is recorded as "
                  "client_overload")
      ->check(CLI::Range(1, 4096))
      ->group(g_srv);

  const auto* g_wl = "Synthetic workload";
  cmd->add_option("-n,--num-requests", o->num_requests,
                  "Requests per run (for a trace: how many to replay, 0 = all)")
      ->group(g_wl);
  cmd->add_option("--seed", o->seed, "Seed of arrivals, lengths and prompt text")->group(g_wl);
  cmd->add_option("--arrival", o->arrival, "Arrival process: poisson or gamma")
      ->check(CLI::IsMember({"poisson", "gamma"}))
      ->group(g_wl);
  auto* rate_opt =
      cmd->add_option("--rate", o->rate_rps,
                      "Mean request rate (req/s); for a trace: time-scale it to this mean rate")
          ->check(positive_number)
          ->group(g_wl);
  cmd->add_option("--burstiness", o->burstiness,
                  "Gamma shape k (cv = 1/sqrt(k); 1 = Poisson, < 1 burstier)")
      ->check(positive_number)
      ->group(g_wl);
  const auto dists = CLI::IsMember({"fixed", "uniform", "pareto", "lognormal"});
  cmd->add_option("--prompt-dist", o->prompt_dist,
                  "Prompt lengths: fixed, uniform, pareto, lognormal")
      ->check(dists)
      ->group(g_wl);
  cmd->add_option("--prompt-tokens", o->prompt_tokens,
                  "Prompt length (fixed) or mean (pareto/lognormal), in tokens (approx.)")
      ->group(g_wl);
  cmd->add_option("--prompt-min", o->prompt_min, "Minimum prompt length (uniform, and clip)")
      ->group(g_wl);
  cmd->add_option("--prompt-max", o->prompt_max,
                  "Maximum prompt length (uniform, and clip; 0 = none)")
      ->group(g_wl);
  cmd->add_option("--output-dist", o->output_dist,
                  "Output lengths (max_tokens): fixed, uniform, pareto, lognormal")
      ->check(dists)
      ->group(g_wl);
  cmd->add_option("--output-tokens", o->output_tokens,
                  "Output length (fixed) or mean (pareto/lognormal)")
      ->group(g_wl);
  cmd->add_option("--output-min", o->output_min, "Minimum output length (uniform, and clip)")
      ->group(g_wl);
  cmd->add_option("--output-max", o->output_max,
                  "Maximum output length (uniform, and clip; 0 = none)")
      ->group(g_wl);
  cmd->add_option("--pareto-alpha", o->pareto_alpha, "Pareto shape (> 1; smaller = heavier tail)")
      ->group(g_wl);
  cmd->add_option("--lognormal-sigma", o->lognormal_sigma,
                  "Log-normal sigma (larger = heavier tail)")
      ->group(g_wl);
  cmd->add_option("--shared-prefix-tokens", o->shared_prefix_tokens,
                  "Tokens of a system prompt shared by every request")
      ->group(g_wl);

  const auto* g_tr = "Trace replay";
  cmd->add_option(
         "--trace", o->trace_path,
         "Replay a trace: Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens) or Mooncake JSONL "
         "(timestamp ms, input_length, output_length, hash_ids)")
      ->check(CLI::ExistingFile)
      ->group(g_tr);
  cmd->add_option("--trace-format", o->trace_format, "auto (from the extension), azure or mooncake")
      ->check(CLI::IsMember({"auto", "azure", "mooncake"}))
      ->group(g_tr);
  cmd->add_option("--trace-offset", o->trace_offset,
                  "Skip this many requests at the start of the trace")
      ->group(g_tr);
  cmd->add_option("--time-scale", o->time_scale,
                  "Multiply trace times by this (0.1 = 10x faster); or use --rate")
      ->check(non_negative_number)
      ->group(g_tr);
  cmd->add_option("--max-prompt-tokens", o->max_prompt_tokens,
                  "Scale prompt lengths linearly so the --scale-percentile prompt has this many "
                  "tokens (clip above)")
      ->group(g_tr);
  cmd->add_option("--max-output-tokens", o->max_output_tokens, "Same for output lengths")
      ->group(g_tr);
  cmd->add_option("--prompt-scale", o->prompt_scale,
                  "Multiply trace prompt lengths (and Mooncake hash blocks) by this instead of the "
                  "--scale-percentile rule; --max-prompt-tokens still clips")
      ->check(non_negative_number)
      ->group(g_tr);
  cmd->add_option("--scale-percentile", o->scale_percentile,
                  "Percentile of the lengths mapped onto the maximum")
      ->check(CLI::Range(1.0, 100.0))
      ->group(g_tr);

  const auto* g_run = "Rates, SLOs and goodput";
  cmd->add_option("--rates", o->rates,
                  "Run once per rate (req/s), for SLO-attainment-vs-rate curves")
      ->delimiter(',')
      ->group(g_run);
  cmd->add_flag("--goodput", o->goodput,
                "Bisect the rate for the highest one with >= --attainment-target SLO attainment")
      ->group(g_run);
  cmd->add_option("--rate-min", o->rate_min_rps, "Lowest rate of the goodput search (req/s)")
      ->group(g_run);
  cmd->add_option("--rate-max", o->rate_max_rps, "Highest rate of the goodput search (req/s)")
      ->group(g_run);
  cmd->add_option("--bisect-steps", o->bisect_steps, "Bisection probes after the two ends")
      ->check(CLI::Range(0, 20))
      ->group(g_run);
  cmd->add_option("--ttft-slo-ms", o->ttft_slo_ms, "TTFT objective (ms); 0 = none")->group(g_run);
  cmd->add_option("--tpot-slo-ms", o->tpot_slo_ms, "TPOT objective (ms); 0 = none")->group(g_run);
  cmd->add_option("--attainment-target", o->attainment_target,
                  "Fraction of requests that must meet both SLOs")
      ->check(CLI::Range(0.01, 1.0))
      ->group(g_run);

  const auto* g_out = "Output";
  cmd->add_option("--label", o->label, "Name of this series (default: arrival kind or 'trace')")
      ->group(g_out);
  cmd->add_option(
         "--out", o->out_path,
         "JSON output (default bench/results/serve-<label>-<date>.json, then -2, -3 ... so "
         "an earlier run of the day is kept)")
      ->group(g_out);
  cmd->add_option("--plot", o->plot_path,
                  "Also write a PNG: attainment vs rate, TTFT and E2E CDFs (needs matplotlib)")
      ->group(g_out);
  cmd->add_option("--plot-script", o->plot_script,
                  "Path of bench/e2e/plot_serve.py (default: found beside the binary)")
      ->group(g_out);
  cmd->add_flag("--no-records", o->no_records, "Leave per-request records out of the JSON")
      ->group(g_out);
  cmd->add_option("--progress-interval-s", o->progress_interval_s,
                  "Seconds between progress lines (0 = none)")
      ->group(g_out);

  cmd->callback([o, rate_opt] {
    o->rate_given = rate_opt->count() > 0;
    o->command_line = lg::process_command_line();
    serve_bench b{*o};
    const int rc = b.run();
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace

void add_bench_command(CLI::App& app, const global_options& /*globals*/) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks of a running deployment");
  bench->require_subcommand(1);
  add_serve_bench(*bench);
}

}  // namespace weft::apps
