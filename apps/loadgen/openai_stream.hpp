#pragma once
// The OpenAI streaming protocol as the load generator sees it: request bodies, the per-request
// record, and the recorder that turns a timed SSE byte stream into TTFT / TPOT / inter-token gaps.

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "apps/loadgen/sse_parser.hpp"
#include "apps/loadgen/workload.hpp"

namespace weft::apps::loadgen {

using steady_clock = std::chrono::steady_clock;

/// Which OpenAI endpoint requests go to.
enum class api_kind {
  completions,  ///< POST /v1/completions, `prompt`, chunks carry choices[0].text
  chat,  ///< POST /v1/chat/completions, one user message, chunks carry choices[0].delta.content
};

/// Whether to ask the server to ignore end-of-sequence (weft/vLLM `ignore_eos` extension).
enum class eos_mode {
  ignore,   ///< send "ignore_eos": true so outputs have the requested lengths
  respect,  ///< do not send the field
};

/// What goes into every request body.
struct request_options {
  api_kind api = api_kind::completions;
  std::string model;
  double temperature = 0.0;
  eos_mode eos = eos_mode::ignore;
};

/// Path of the endpoint under the server's base path ("/v1/completions" or "/v1/chat/completions").
const char* endpoint_path(api_kind api);
const char* to_string(api_kind api);

/// The JSON body of a streaming request (stream=true, stream_options.include_usage=true).
nlohmann::json make_request_body(const request_options& options, const request_spec& spec);

/// Outcome of one request.
enum class request_status {
  ok,
  http_error,        ///< non-200 status
  stream_error,      ///< error event, malformed chunk, or stream ended without tokens / end marker
  connection_error,  ///< could not connect or the connection broke
  timeout,           ///< exceeded the per-request time limit
  client_overload,   ///< not sent: the client's in-flight bound was reached at its send time
};
const char* to_string(request_status status);

/// Everything measured about one request (times in ms, relative times in s from the run start).
/// Token counts are -1 when the server did not report them.
struct request_record {
  size_t index = 0;
  double scheduled_s = 0.0;
  double sent_s = 0.0;
  double dispatch_lag_ms = 0.0;  ///< sent - scheduled (the client's own lateness)
  int64_t prompt_tokens_target = 0;
  int64_t max_tokens = 0;
  request_status status = request_status::ok;
  int http_status = 0;
  std::string error;
  double ttft_ms = -1.0;
  double tpot_ms = -1.0;  ///< (e2e - ttft) / (completion_tokens - 1); -1 when fewer than 2 tokens
  double e2e_ms = -1.0;
  std::vector<double> itl_ms;  ///< gaps between consecutive content chunks
  int64_t prompt_tokens = -1;
  int64_t completion_tokens = -1;
  int64_t cached_tokens = -1;
  size_t n_chunks = 0;  ///< content chunks (token arrivals) received
  bool usage_reported = false;
  std::string finish_reason;

  bool ok() const { return status == request_status::ok; }
};

/// Builds a request_record from the bytes of one streaming response as they arrive.
/// Not thread-safe; one per request.
class stream_recorder {
 public:
  /// `record` must outlive the recorder; `sent` is when the request was sent.
  stream_recorder(api_kind api, request_record& record, steady_clock::time_point sent);

  /// Records the HTTP status of the response (before its body).
  void on_status(int http_status);

  /// Feeds body bytes received at `now`. Returns false to abort the stream (error event seen).
  bool on_bytes(std::string_view bytes, steady_clock::time_point now);

  /// Ends the stream and computes the figures. `transport_status` / `transport_error` describe a
  /// failure below HTTP (connection, timeout), or ok.
  void finish(request_status transport_status, const std::string& transport_error);

 private:
  void on_event(const std::string& data, steady_clock::time_point now);
  void fail(request_status status, std::string message);

  api_kind api_;
  request_record& record_;
  steady_clock::time_point sent_;
  steady_clock::time_point last_bytes_;
  sse_parser parser_;
  std::vector<steady_clock::time_point> chunk_times_;
  std::string error_body_;  ///< body of a non-200 response (bounded)
  bool done_ = false;       ///< "[DONE]" seen
  bool failed_ = false;
};

}  // namespace weft::apps::loadgen
