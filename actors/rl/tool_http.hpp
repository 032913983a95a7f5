#pragma once
/// A tool of your own behind an HTTP endpoint (`weft rl --tool-url NAME=URL`, docs/rl.md
/// "Agentic rollouts"): each call is POSTed as {"id": 7, "tool": "search", "args": "..."} and
/// answered by {"result": "..."} — the shape of a retrieval server a Search-R1-style run calls.
/// Unlike a --tool-cmd program, an endpoint serves several calls at once (the tool actors keep
/// `--tool-concurrency` of them in flight). A failed request (no connection, a timeout, a 5xx or
/// 429) is sent again after a pause, a bounded number of times; after that, or at once for a 4xx
/// or an answer without a string "result", the call's result is "error: ..." — what the model
/// sees from a tool that failed — and a warning names the call.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpu/rl/tools.hpp"
#include "gpu/status.hpp"

namespace weft::rl {

/// Splits "http://host[:port][/path]" into "http://host[:port]" and the path ("/" when none).
/// False for anything else (https is not built in; put a proxy in front).
bool split_http_url(std::string_view url, std::string& base, std::string& path);

/// One JSON POST to a user's endpoint (tools and rewards), with the retries both use: no
/// connection, a timeout (`timeout_s` per request), a 5xx or a 429 is sent again after a pause
/// (first_pause_ms, doubling), `max_sends` sends in all, `on_retry(why, resend)` told before each
/// resend. The answer (any other status, with its body), or `why` the last send failed.
struct http_post {
  std::string base, path;  ///< split_http_url's halves
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  double timeout_s = 60.0;
  int max_sends = 3;
  int first_pause_ms = 200;
};
struct http_answer {
  int status = 0;
  std::string body;
};
gpu::result<http_answer> post_with_retries(
    const http_post& p, const std::function<void(const std::string& why, int resend)>& on_retry);

/// Parses "NAME=URL" (the tool_command's `command` holds the URL); an error says what is wrong.
gpu::result<gpu::rl::tool_command> parse_tool_endpoint(std::string_view spec);

class tool_http_client {
 public:
  /// `endpoint` from parse_tool_endpoint; each request may take timeout_s; max_attempts sends.
  tool_http_client(gpu::rl::tool_command endpoint, double timeout_s, int max_attempts);
  /// Call `id` (blocking): the endpoint's result, or "error: ..." (see above).
  std::string call(uint64_t id, const gpu::rl::tool_call& c);

 private:
  gpu::rl::tool_command endpoint_;
  std::string base_, path_;
  double timeout_s_;
  int max_attempts_;
};

}  // namespace weft::rl
