#include "actors/rl/tool_http.hpp"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <regex>
#include <thread>

namespace weft::rl {

bool split_http_url(std::string_view url, std::string& base, std::string& path) {
  static const std::regex re(R"(^(http://[^/\s]+)(/\S*)?$)");
  std::smatch m;
  const std::string s(url);
  if (!std::regex_match(s, m, re)) return false;
  base = m[1];
  path = m[2].length() > 0 ? std::string(m[2]) : "/";
  return true;
}

gpu::result<gpu::rl::tool_command> parse_tool_endpoint(std::string_view spec) {
  auto t = gpu::rl::parse_tool_command(spec);
  if (!t) {
    std::string why = t.error().message();
    if (auto at = why.find("NAME=COMMAND"); at != std::string::npos)
      why.replace(at, 12, "NAME=URL");
    if (auto at = why.find("has no command"); at != std::string::npos)
      why.replace(at, 14, "has no URL");
    return gpu::status{t.error().code(), why};
  }
  std::string base, path;
  if (!split_http_url(t->command, base, path)) {
    return gpu::status{gpu::status_code::invalid_argument, "tool '" + t->name + "': " + t->command +
                                                               " is not http://host[:port][/path]"};
  }
  t->http = true;
  return t;
}

tool_http_client::tool_http_client(gpu::rl::tool_command endpoint, double timeout_s,
                                   int max_attempts)
    : endpoint_(std::move(endpoint)),
      timeout_s_(timeout_s),
      max_attempts_(std::max(1, max_attempts)) {
  split_http_url(endpoint_.command, base_, path_);
}

gpu::result<http_answer> post_with_retries(
    const http_post& p, const std::function<void(const std::string& why, int resend)>& on_retry) {
  httplib::Client cli(p.base);
  const auto secs = static_cast<time_t>(p.timeout_s);
  const auto usecs = static_cast<time_t>((p.timeout_s - static_cast<double>(secs)) * 1e6);
  cli.set_connection_timeout(secs, usecs);
  cli.set_read_timeout(secs, usecs);
  cli.set_write_timeout(secs, usecs);
  httplib::Headers headers(p.headers.begin(), p.headers.end());
  std::string why;
  for (int send = 0; send < std::max(1, p.max_sends); ++send) {
    if (send > 0) {
      on_retry(why, send);
      std::this_thread::sleep_for(
          std::chrono::milliseconds(p.first_pause_ms << std::min(send - 1, 5)));
    }
    auto res = cli.Post(p.path, headers, p.body, "application/json");
    if (!res) {
      why = "no answer (" + httplib::to_string(res.error()) + ")";
      continue;
    }
    if (res->status >= 500 || res->status == 429) {
      why = "HTTP " + std::to_string(res->status);
      continue;
    }
    return http_answer{res->status, res->body};
  }
  return gpu::status{gpu::status_code::internal, why};
}

std::string tool_http_client::call(uint64_t id, const gpu::rl::tool_call& c) {
  http_post p;
  p.base = base_;
  p.path = path_;
  p.body = nlohmann::json{{"id", id}, {"tool", c.tool}, {"args", c.args}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
  p.timeout_s = timeout_s_;
  p.max_sends = max_attempts_;
  p.first_pause_ms = 200;
  auto res = post_with_retries(p, [&](const std::string& why, int resend) {
    spdlog::warn("tool {} at {}: {}; sending call {} again ({} of {})", endpoint_.name,
                 endpoint_.command, why, id, resend, max_attempts_ - 1);
  });
  if (!res) {
    spdlog::warn("tool {} at {}: {} after {} tries; call {} fails", endpoint_.name,
                 endpoint_.command, res.error().message(), max_attempts_, id);
    return "error: the " + c.tool + " tool did not answer";
  }
  if (res->status != 200) {
    spdlog::warn("tool {} refused call {}: HTTP {} {}", endpoint_.name, id, res->status,
                 res->body.substr(0, 200));
    return "error: the " + c.tool + " tool refused the call (HTTP " + std::to_string(res->status) +
           ")";
  }
  const auto j = nlohmann::json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("result") || !j["result"].is_string()) {
    spdlog::warn("tool {}: the answer to call {} is not {{\"result\": \"...\"}}: {}",
                 endpoint_.name, id, res->body.substr(0, 200));
    return "error: the " + c.tool + " tool gave no result";
  }
  return j["result"].get<std::string>();
}

}  // namespace weft::rl
