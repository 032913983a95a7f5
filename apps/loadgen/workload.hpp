#pragma once
// The list of requests of one open-loop run: when to send each, its prompt and its output length.

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apps/loadgen/distributions.hpp"
#include "apps/loadgen/result.hpp"
#include "apps/loadgen/trace.hpp"

namespace weft::apps::loadgen {

/// One request to send.
struct request_spec {
  size_t index = 0;
  double send_time_s = 0.0;  ///< scheduled time from the start of the run
  std::string prompt;
  int64_t prompt_tokens_target =
      0;  ///< approximate (words); the server's count comes back in usage
  int64_t max_tokens = 0;
};

/// Synthetic workload parameters.
struct synthetic_config {
  arrival_config arrival;
  length_config prompt;
  length_config output;
  int64_t shared_prefix_tokens = 0;  ///< every prompt starts with the same this many tokens
};

/// Where a workload comes from and how it is shaped.
struct workload_config {
  size_t num_requests =
      100;            ///< synthetic: requests generated; trace: cap on requests replayed (0 = all)
  uint64_t seed = 0;  ///< prompt text and random draws; probe i of a sweep uses mix_seed(seed, i)
  synthetic_config synthetic;
  const trace* source_trace = nullptr;  ///< replay this trace instead of synthetic (not owned)
  trace_scaling_config scaling;
  /// Tokens the server adds around every prompt (the chat template of --api chat): the words of
  /// each prompt are that many fewer, so the prompt the model sees has the target length. Not
  /// applied to hash-id traces (their block texts must stay shared).
  int64_t prompt_overhead_tokens = 0;
};

/// A built workload and a JSON description of it (kind, parameters, scaling applied, target
/// lengths).
struct workload {
  std::vector<request_spec> requests;  ///< sorted by send time
  nlohmann::json description;
};

/// Builds the requests for one run at `rate_rps` (overrides the synthetic arrival rate or the
/// trace's target rate; <= 0 keeps the configured one). Errors name the bad parameter.
result<workload> build_workload(const workload_config& config, double rate_rps);

}  // namespace weft::apps::loadgen
