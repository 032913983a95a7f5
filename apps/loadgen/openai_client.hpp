#pragma once
// Sends one streaming OpenAI request over HTTP (cpp-httplib, one connection per request).

#include <string>
#include <vector>

#include "apps/loadgen/openai_stream.hpp"
#include "apps/loadgen/result.hpp"

namespace weft::apps::loadgen {

/// A server's base URL split for httplib: "http://host:port" plus a path prefix ("" or "/api").
struct server_endpoint {
  std::string scheme_host_port;
  std::string path_prefix;
  /// The URL of `path` on this server, for messages.
  std::string url(const std::string& path) const { return scheme_host_port + path_prefix + path; }
};

/// Parses "http://host:port[/prefix]" (a trailing "/v1" is dropped: endpoints add it).
result<server_endpoint> parse_base_url(const std::string& url);

/// How requests are sent.
struct client_config {
  server_endpoint server;
  request_options request;
  std::string api_key;       ///< sent as "Authorization: Bearer <key>" when not empty
  double timeout_s = 600.0;  ///< whole-request limit
  double connect_timeout_s = 10.0;
};

/// Sends `spec` now (blocking until the stream ends) and returns its record, with times relative
/// to `run_start`. Never throws; every failure is a status in the record. Thread-safe (no shared
/// state).
request_record send_request(const client_config& config, const request_spec& spec,
                            steady_clock::time_point run_start);

/// What GET /v1/models answered.
struct server_info {
  int http_status = 0;
  std::vector<std::string> model_ids;
};

/// Checks that the server answers (GET <prefix>/v1/models). An error means it cannot be reached;
/// a non-200 status is returned, not an error (not every server lists models).
result<server_info> probe_server(const client_config& config);

/// Tokens a chat request adds around a user message (the chat template), measured with the
/// server's POST /tokenize (vLLM's and weft's {"messages"} form): count(messages) − count(text).
/// An error when the server has no such endpoint (llama-server tokenizes text only).
result<int64_t> chat_template_overhead(const client_config& config);

}  // namespace weft::apps::loadgen
