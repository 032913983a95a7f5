#include "apps/loadgen/workload.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "apps/loadgen/prompt_text.hpp"

namespace weft::apps::loadgen {

namespace {

nlohmann::json describe(const length_config& c) {
  nlohmann::json j{{"dist", to_string(c.dist)},
                   {"mean_tokens", c.mean_tokens},
                   {"min_tokens", c.min_tokens},
                   {"max_tokens", c.max_tokens}};
  if (c.dist == length_dist::pareto) j["pareto_alpha"] = c.pareto_alpha;
  if (c.dist == length_dist::lognormal) j["lognormal_sigma"] = c.lognormal_sigma;
  return j;
}

nlohmann::json length_stats(const std::vector<request_spec>& reqs, bool prompt) {
  if (reqs.empty()) return nlohmann::json::object();
  std::vector<int64_t> v;
  for (const auto& r : reqs) v.push_back(prompt ? r.prompt_tokens_target : r.max_tokens);
  std::sort(v.begin(), v.end());
  const double mean = static_cast<double>(std::accumulate(v.begin(), v.end(), int64_t{0})) /
                      static_cast<double>(v.size());
  return {{"mean", mean}, {"min", v.front()}, {"p50", v[v.size() / 2]}, {"max", v.back()}};
}

result<workload> build_synthetic(const workload_config& config, double rate_rps) {
  synthetic_config s = config.synthetic;
  if (rate_rps > 0) s.arrival.rate_rps = rate_rps;
  if (auto e = validate(s.arrival); !e.empty()) return result<workload>::failure(e);
  if (auto e = validate(s.prompt); !e.empty())
    return result<workload>::failure("prompt lengths: " + e);
  if (auto e = validate(s.output); !e.empty())
    return result<workload>::failure("output lengths: " + e);
  if (config.num_requests == 0) return result<workload>::failure("number of requests must be > 0");
  if (s.shared_prefix_tokens < 0)
    return result<workload>::failure("shared prefix must be >= 0 tokens");
  s.arrival.seed = mix_seed(config.seed, 1);
  const size_t n = config.num_requests;
  const auto times = generate_arrivals(s.arrival, n);
  const auto prompt_lens = sample_lengths(s.prompt, n, mix_seed(config.seed, 2));
  const auto output_lens = sample_lengths(s.output, n, mix_seed(config.seed, 3));
  const std::string prefix = make_words(mix_seed(config.seed, 4), s.shared_prefix_tokens);
  workload w;
  w.requests.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    request_spec r;
    r.index = i;
    r.send_time_s = times[i];
    r.prompt = prefix;
    const int64_t own = s.shared_prefix_tokens > 0
                            ? std::max<int64_t>(0, prompt_lens[i] - config.prompt_overhead_tokens)
                            : std::max<int64_t>(1, prompt_lens[i] - config.prompt_overhead_tokens);
    append_words(r.prompt, mix_seed(config.seed, 1000 + i), own);
    r.prompt_tokens_target = s.shared_prefix_tokens + prompt_lens[i];
    r.max_tokens = output_lens[i];
    w.requests.push_back(std::move(r));
  }
  w.description = {
      {"kind", "synthetic"},
      {"arrival", {{"kind", to_string(s.arrival.kind)}, {"rate_rps", s.arrival.rate_rps}}},
      {"num_requests", n},
      {"prompt", describe(s.prompt)},
      {"output", describe(s.output)},
      {"shared_prefix_tokens", s.shared_prefix_tokens}};
  if (s.arrival.kind == arrival_kind::gamma) {
    w.description["arrival"]["burstiness"] = s.arrival.burstiness;
    w.description["arrival"]["cv"] = 1.0 / std::sqrt(s.arrival.burstiness);
  }
  return w;
}

result<workload> build_from_trace(const workload_config& config, double rate_rps) {
  trace_scaling_config sc = config.scaling;
  if (config.num_requests > 0) sc.count = config.num_requests;
  if (rate_rps > 0) {
    sc.target_rate_rps = rate_rps;
    sc.time_scale = 0;
  }
  auto scaled = scale_trace(*config.source_trace, sc);
  if (!scaled) return result<workload>::failure(scaled.error());
  const auto& src = *config.source_trace;
  workload w;
  w.requests.reserve(scaled->requests.size());
  for (size_t i = 0; i < scaled->requests.size(); ++i) {
    const auto& s = scaled->requests[i];
    request_spec r;
    r.index = i;
    r.send_time_s = s.send_time_s;
    r.prompt_tokens_target = s.prompt_tokens;
    r.max_tokens = s.output_tokens;
    if (!s.hash_ids.empty()) {
      // Equal hash id -> equal block text; the text of a block depends on its id only (and the
      // seed).
      for (size_t b = 0; b < s.hash_ids.size(); ++b) {
        const int64_t len =
            b + 1 == s.hash_ids.size() ? s.last_block_tokens : scaled->scaling.block_tokens;
        append_words(
            r.prompt,
            mix_seed(config.seed, static_cast<uint64_t>(s.hash_ids[b]) + (uint64_t{1} << 40)), len);
      }
    } else {
      append_words(r.prompt, mix_seed(config.seed, 1000 + i),
                   std::max<int64_t>(1, s.prompt_tokens - config.prompt_overhead_tokens));
    }
    w.requests.push_back(std::move(r));
  }
  std::stable_sort(
      w.requests.begin(), w.requests.end(),
      [](const request_spec& a, const request_spec& b) { return a.send_time_s < b.send_time_s; });
  const auto& k = scaled->scaling;
  w.description = {{"kind", "trace"},
                   {"trace",
                    {{"path", src.path},
                     {"format", to_string(src.format)},
                     {"requests_in_file", src.entries.size()}}},
                   {"offset", sc.offset},
                   {"num_requests", w.requests.size()},
                   {"scaling",
                    {{"time_scale", k.time_scale},
                     {"source_rate_rps", k.source_rate_rps},
                     {"scaled_rate_rps", k.scaled_rate_rps},
                     {"prompt_scale", k.prompt_scale},
                     {"output_scale", k.output_scale},
                     {"scale_percentile", sc.scale_percentile},
                     {"max_prompt_tokens", sc.max_prompt_tokens},
                     {"max_output_tokens", sc.max_output_tokens},
                     {"prompts_clipped", k.n_prompt_clipped},
                     {"outputs_clipped", k.n_output_clipped}}}};
  if (src.format == trace_format::mooncake)
    w.description["scaling"]["block_tokens"] = k.block_tokens;
  return w;
}

}  // namespace

result<workload> build_workload(const workload_config& config, double rate_rps) {
  auto w = config.source_trace != nullptr ? build_from_trace(config, rate_rps)
                                          : build_synthetic(config, rate_rps);
  if (w) {
    if (w->requests.empty()) return result<workload>::failure("the workload holds no requests");
    w->description["seed"] = config.seed;
    w->description["prompt_tokens_target"] = length_stats(w->requests, true);
    w->description["output_tokens_target"] = length_stats(w->requests, false);
  }
  return w;
}

}  // namespace weft::apps::loadgen
