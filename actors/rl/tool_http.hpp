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
#include <string>
#include <string_view>

#include "gpu/rl/tools.hpp"
#include "gpu/status.hpp"

namespace weft::rl {

/// Splits "http://host[:port][/path]" into "http://host[:port]" and the path ("/" when none).
/// False for anything else (https is not built in; put a proxy in front).
bool split_http_url(std::string_view url, std::string& base, std::string& path);

/// Parses "NAME=URL" (the tool_command's `command` holds the URL); an error says what is wrong.
gpu::result<gpu::rl::tool_command> parse_tool_endpoint(std::string_view spec);

class tool_http_client {
 public:
  /// `endpoint` from parse_tool_endpoint; each request may take timeout_s; max_attempts sends.
  tool_http_client(gpu::rl::tool_command endpoint, double timeout_s, int max_attempts);
  /// Call `id` (blocking): the endpoint's result, or "error: ..." (see above).
  std::string call(uint64_t id, const gpu::rl::tool_call& c);
  int64_t retries() const { return retries_; }

 private:
  gpu::rl::tool_command endpoint_;
  std::string base_, path_;
  double timeout_s_;
  int max_attempts_;
  int64_t retries_ = 0;
};

}  // namespace weft::rl
