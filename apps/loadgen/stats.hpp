#pragma once
// Summary statistics of a run: percentiles, throughput, SLO attainment.

#include <nlohmann/json.hpp>

#include <cstddef>
#include <vector>

#include "apps/loadgen/openai_stream.hpp"

namespace weft::apps::loadgen {

/// Value at percentile `p` (0..100) of `sorted` (ascending), interpolating linearly between the
/// closest ranks (numpy's default). 0 for an empty input.
double percentile(const std::vector<double>& sorted, double p);

/// mean / p50 / p90 / p99 / min / max of a sample.
struct distribution_summary {
  size_t count = 0;
  double mean = 0.0;
  double p50 = 0.0;
  double p90 = 0.0;
  double p99 = 0.0;
  double min = 0.0;
  double max = 0.0;
};

/// Summarises `values` (any order).
distribution_summary summarize(std::vector<double> values);

/// Latency objectives; a value <= 0 means "no objective on this metric".
struct slo_config {
  double ttft_ms = 0.0;
  double tpot_ms = 0.0;
};

/// True when `r` succeeded and meets every objective set. A request with fewer than two output
/// tokens has no TPOT and meets the TPOT objective.
bool meets_slo(const request_record& r, const slo_config& slo);

/// Everything reported about one run.
struct run_summary {
  size_t n_requests = 0;
  size_t n_ok = 0;
  size_t n_failed = 0;  ///< any status but ok, client overload included
  size_t n_client_overload = 0;
  double duration_s = 0.0;              ///< first send to last response end
  double offered_rate_rps = 0.0;        ///< requests / span of scheduled send times
  double request_throughput_rps = 0.0;  ///< successful requests / duration
  double output_throughput_tps = 0.0;   ///< completion tokens of successful requests / duration
  int64_t total_prompt_tokens = 0;
  int64_t total_completion_tokens = 0;
  int64_t total_cached_tokens = 0;
  double slo_attainment = -1.0;  ///< fraction of all requests meeting the SLO; -1 when no SLO set
  distribution_summary ttft_ms, tpot_ms, itl_ms, e2e_ms, prompt_tokens, completion_tokens,
      cached_tokens, dispatch_lag_ms;
};

/// Summarises the records of one run (latency figures over successful requests only).
run_summary summarize_run(const std::vector<request_record>& records, const slo_config& slo);

nlohmann::json to_json(const distribution_summary& s);
nlohmann::json to_json(const run_summary& s);
nlohmann::json to_json(const request_record& r);

}  // namespace weft::apps::loadgen
