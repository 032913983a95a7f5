#include "apps/loadgen/stats.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace weft::apps::loadgen {

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0.0;
  const double pos = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

distribution_summary summarize(std::vector<double> values) {
  distribution_summary s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.count = values.size();
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  s.p50 = percentile(values, 50);
  s.p90 = percentile(values, 90);
  s.p99 = percentile(values, 99);
  s.min = values.front();
  s.max = values.back();
  return s;
}

bool meets_slo(const request_record& r, const slo_config& slo) {
  if (!r.ok()) return false;
  if (slo.ttft_ms > 0 && !(r.ttft_ms >= 0 && r.ttft_ms <= slo.ttft_ms)) return false;
  if (slo.tpot_ms > 0 && r.tpot_ms >= 0 && r.tpot_ms > slo.tpot_ms) return false;
  return true;
}

run_summary summarize_run(const std::vector<request_record>& records, const slo_config& slo) {
  run_summary s;
  s.n_requests = records.size();
  std::vector<double> ttft, tpot, itl, e2e, prompt, completion, cached, lag;
  double first_send = INFINITY, last_end = -INFINITY, first_sched = INFINITY,
         last_sched = -INFINITY;
  size_t n_meet = 0;
  for (const auto& r : records) {
    first_sched = std::min(first_sched, r.scheduled_s);
    last_sched = std::max(last_sched, r.scheduled_s);
    if (r.status == request_status::client_overload) {
      ++s.n_client_overload;
      ++s.n_failed;
      continue;
    }
    first_send = std::min(first_send, r.sent_s);
    lag.push_back(r.dispatch_lag_ms);
    if (r.e2e_ms >= 0) last_end = std::max(last_end, r.sent_s + r.e2e_ms / 1000.0);
    if (!r.ok()) {
      ++s.n_failed;
      continue;
    }
    ++s.n_ok;
    if (meets_slo(r, slo)) ++n_meet;
    ttft.push_back(r.ttft_ms);
    if (r.tpot_ms >= 0) tpot.push_back(r.tpot_ms);
    itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
    e2e.push_back(r.e2e_ms);
    if (r.prompt_tokens >= 0) {
      prompt.push_back(static_cast<double>(r.prompt_tokens));
      s.total_prompt_tokens += r.prompt_tokens;
    }
    if (r.completion_tokens >= 0) {
      completion.push_back(static_cast<double>(r.completion_tokens));
      s.total_completion_tokens += r.completion_tokens;
    }
    if (r.cached_tokens >= 0) {
      cached.push_back(static_cast<double>(r.cached_tokens));
      s.total_cached_tokens += r.cached_tokens;
    }
  }
  if (last_end > first_send) s.duration_s = last_end - first_send;
  if (records.size() > 1 && last_sched > first_sched) {
    s.offered_rate_rps = static_cast<double>(records.size() - 1) / (last_sched - first_sched);
  }
  if (s.duration_s > 0) {
    s.request_throughput_rps = static_cast<double>(s.n_ok) / s.duration_s;
    s.output_throughput_tps = static_cast<double>(s.total_completion_tokens) / s.duration_s;
  }
  if ((slo.ttft_ms > 0 || slo.tpot_ms > 0) && !records.empty()) {
    s.slo_attainment = static_cast<double>(n_meet) / static_cast<double>(records.size());
  }
  s.ttft_ms = summarize(std::move(ttft));
  s.tpot_ms = summarize(std::move(tpot));
  s.itl_ms = summarize(std::move(itl));
  s.e2e_ms = summarize(std::move(e2e));
  s.prompt_tokens = summarize(std::move(prompt));
  s.completion_tokens = summarize(std::move(completion));
  s.cached_tokens = summarize(std::move(cached));
  s.dispatch_lag_ms = summarize(std::move(lag));
  return s;
}

nlohmann::json to_json(const distribution_summary& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90},
          {"p99", s.p99},     {"min", s.min},   {"max", s.max}};
}

nlohmann::json to_json(const run_summary& s) {
  nlohmann::json j{{"n_requests", s.n_requests},
                   {"n_ok", s.n_ok},
                   {"n_failed", s.n_failed},
                   {"n_client_overload", s.n_client_overload},
                   {"duration_s", s.duration_s},
                   {"offered_rate_rps", s.offered_rate_rps},
                   {"request_throughput_rps", s.request_throughput_rps},
                   {"output_throughput_tps", s.output_throughput_tps},
                   {"total_prompt_tokens", s.total_prompt_tokens},
                   {"total_completion_tokens", s.total_completion_tokens},
                   {"total_cached_tokens", s.total_cached_tokens},
                   {"ttft_ms", to_json(s.ttft_ms)},
                   {"tpot_ms", to_json(s.tpot_ms)},
                   {"itl_ms", to_json(s.itl_ms)},
                   {"e2e_ms", to_json(s.e2e_ms)},
                   {"prompt_tokens", to_json(s.prompt_tokens)},
                   {"completion_tokens", to_json(s.completion_tokens)},
                   {"cached_tokens", to_json(s.cached_tokens)},
                   {"dispatch_lag_ms", to_json(s.dispatch_lag_ms)}};
  j["slo_attainment"] =
      s.slo_attainment >= 0 ? nlohmann::json(s.slo_attainment) : nlohmann::json(nullptr);
  return j;
}

nlohmann::json to_json(const request_record& r) {
  const auto opt = [](double v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
  const auto opt_i = [](int64_t v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
  nlohmann::json j{{"index", r.index},
                   {"scheduled_s", r.scheduled_s},
                   {"sent_s", r.sent_s},
                   {"dispatch_lag_ms", r.dispatch_lag_ms},
                   {"status", to_string(r.status)},
                   {"http_status", r.http_status},
                   {"prompt_tokens_target", r.prompt_tokens_target},
                   {"max_tokens", r.max_tokens},
                   {"ttft_ms", opt(r.ttft_ms)},
                   {"tpot_ms", opt(r.tpot_ms)},
                   {"e2e_ms", opt(r.e2e_ms)},
                   {"itl_ms", r.itl_ms},
                   {"prompt_tokens", opt_i(r.prompt_tokens)},
                   {"completion_tokens", opt_i(r.completion_tokens)},
                   {"cached_tokens", opt_i(r.cached_tokens)},
                   {"n_chunks", r.n_chunks},
                   {"usage_reported", r.usage_reported},
                   {"finish_reason", r.finish_reason}};
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

}  // namespace weft::apps::loadgen
