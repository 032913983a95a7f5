#pragma once
// Public LLM request traces (Azure LLM inference 2023 CSV, Mooncake JSONL) and their scaling to a
// small model's context window and a machine's capacity.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "apps/loadgen/result.hpp"

namespace weft::apps::loadgen {

/// The file formats understood by load_trace().
enum class trace_format {
  azure,     ///< CSV `TIMESTAMP,ContextTokens,GeneratedTokens`, timestamps "YYYY-MM-DD
             ///< hh:mm:ss.fffffff"
  mooncake,  ///< JSONL `{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}`
};

/// One request of a trace, times relative to the first request of the file.
struct trace_entry {
  double timestamp_s = 0.0;
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  std::vector<int64_t> hash_ids;  ///< Mooncake only: ids of the prompt's 512-token blocks
};

/// A loaded trace.
struct trace {
  trace_format format = trace_format::azure;
  std::string path;
  std::vector<trace_entry> entries;
};

/// Mooncake's prompt block size (tokens per hash id) in the original traces.
inline constexpr int64_t mooncake_block_tokens = 512;

/// Guesses the format from the extension (.csv -> azure, .jsonl/.json -> mooncake).
result<trace_format> detect_trace_format(const std::string& path);

/// Reads a whole trace file; a malformed line is an error naming the file and line.
result<trace> load_trace(const std::string& path, trace_format format);

/// Parses an Azure timestamp ("2023-11-16 18:15:46.6805900") into seconds since the Unix epoch.
result<double> parse_azure_timestamp(const std::string& text);

/// How a trace is cut and scaled.
struct trace_scaling_config {
  size_t offset = 0;             ///< skip this many requests at the start
  size_t count = 0;              ///< keep this many (0 = all after offset)
  double time_scale = 0.0;       ///< multiply trace times by this (0 = derive from target_rate_rps)
  double target_rate_rps = 0.0;  ///< mean rate to compress/stretch time to (0 = keep trace time)
  int64_t max_prompt_tokens = 0;  ///< scale prompts so the percentile below fits (0 = no scaling)
  int64_t max_output_tokens = 0;  ///< scale outputs likewise (0 = no scaling)
  double scale_percentile =
      100.0;  ///< which percentile of the lengths maps to the maximum; above it clip
  /// Explicit prompt scale factor (> 0 overrides the percentile rule; max_prompt_tokens still
  /// clips). For Mooncake traces the 512-token hash blocks scale with it.
  double prompt_scale = 0.0;
};

/// What scaling was applied (stated in the benchmark output).
struct trace_scaling {
  double time_scale = 1.0;
  double source_rate_rps = 0.0;  ///< mean rate of the selected requests in trace time
  double scaled_rate_rps = 0.0;
  double prompt_scale = 1.0;
  double output_scale = 1.0;
  int64_t block_tokens = 0;  ///< Mooncake block size after scaling (0 for Azure)
  size_t n_prompt_clipped = 0;
  size_t n_output_clipped = 0;
};

/// One request after scaling.
struct scaled_trace_request {
  double send_time_s = 0.0;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  /// Mooncake: hash ids of the blocks the prompt is made of; block i has `block_tokens` tokens
  /// except the last, which has `last_block_tokens`.
  std::vector<int64_t> hash_ids;
  int64_t last_block_tokens = 0;
};

/// A cut and scaled trace.
struct scaled_trace {
  std::vector<scaled_trace_request> requests;
  trace_scaling scaling;
};

/// Cuts and scales `source`. Lengths are scaled linearly (factor = max / percentile, at most 1) and
/// clipped to [1, max]; times by time_scale, or by source_rate / target_rate. Errors on an empty
/// selection or on a target rate for a trace whose requests all have the same timestamp.
result<scaled_trace> scale_trace(const trace& source, const trace_scaling_config& config);

const char* to_string(trace_format format);

}  // namespace weft::apps::loadgen
