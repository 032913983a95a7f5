#include "apps/loadgen/openai_client.hpp"

#include <httplib.h>

#include <cmath>

namespace weft::apps::loadgen {

namespace {

void set_timeouts(httplib::Client& cli, const client_config& c) {
  const auto usec = [](double s) { return static_cast<time_t>(std::llround(s * 1e6)); };
  cli.set_connection_timeout(usec(c.connect_timeout_s) / 1000000,
                             usec(c.connect_timeout_s) % 1000000);
  cli.set_read_timeout(usec(c.timeout_s) / 1000000, usec(c.timeout_s) % 1000000);
  cli.set_write_timeout(usec(c.timeout_s) / 1000000, usec(c.timeout_s) % 1000000);
}

/// A client for a short control request (at most 30 s) and its authorization header.
struct control_client {
  explicit control_client(const client_config& config) : cli{config.server.scheme_host_port} {
    client_config c = config;
    c.timeout_s = std::min(config.timeout_s, 30.0);
    set_timeouts(cli, c);
    if (!config.api_key.empty()) headers.emplace("Authorization", "Bearer " + config.api_key);
  }
  httplib::Client cli;
  httplib::Headers headers;
};

}  // namespace

result<server_endpoint> parse_base_url(const std::string& url) {
  const auto scheme_end = url.find("://");
  if (scheme_end == std::string::npos ||
      (url.compare(0, scheme_end, "http") != 0 && url.compare(0, scheme_end, "https") != 0)) {
    return result<server_endpoint>::failure("server URL '" + url +
                                            "' must start with http:// or https://");
  }
  const auto path_start = url.find('/', scheme_end + 3);
  server_endpoint e;
  e.scheme_host_port = url.substr(0, path_start);
  if (e.scheme_host_port.size() <= scheme_end + 3)
    return result<server_endpoint>::failure("server URL '" + url + "' has no host");
  if (path_start != std::string::npos) e.path_prefix = url.substr(path_start);
  while (!e.path_prefix.empty() && e.path_prefix.back() == '/') e.path_prefix.pop_back();
  if (e.path_prefix.size() >= 3 && e.path_prefix.compare(e.path_prefix.size() - 3, 3, "/v1") == 0) {
    e.path_prefix.resize(e.path_prefix.size() - 3);
  }
  return e;
}

request_record send_request(const client_config& config, const request_spec& spec,
                            steady_clock::time_point run_start) {
  request_record rec;
  rec.index = spec.index;
  rec.scheduled_s = spec.send_time_s;
  rec.prompt_tokens_target = spec.prompt_tokens_target;
  rec.max_tokens = spec.max_tokens;

  httplib::Client cli{config.server.scheme_host_port};
  set_timeouts(cli, config);

  httplib::Request req;
  req.method = "POST";
  req.path = config.server.path_prefix + endpoint_path(config.request.api);
  req.body = make_request_body(config.request, spec).dump();
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  if (!config.api_key.empty()) req.set_header("Authorization", "Bearer " + config.api_key);

  const auto sent = steady_clock::now();
  rec.sent_s = std::chrono::duration<double>(sent - run_start).count();
  rec.dispatch_lag_ms = (rec.sent_s - rec.scheduled_s) * 1000.0;
  stream_recorder recorder{config.request.api, rec, sent};
  bool timed_out = false;
  const auto deadline = sent + std::chrono::duration_cast<steady_clock::duration>(
                                   std::chrono::duration<double>(config.timeout_s));
  req.response_handler = [&](const httplib::Response& res) {
    recorder.on_status(res.status);
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const auto now = steady_clock::now();
    if (now > deadline) {
      timed_out = true;
      return false;
    }
    return recorder.on_bytes(std::string_view{data, n}, now);
  };

  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent_ok = cli.send(req, res, err);
  // A server silent for longer than the read timeout shows up as a read error: that is a timeout
  // too.
  if (err == httplib::Error::Read && steady_clock::now() - sent >= deadline - sent)
    timed_out = true;
  if (sent_ok || err == httplib::Error::Success) {
    if (rec.http_status == 0) recorder.on_status(res.status);
    recorder.finish(request_status::ok, {});
  } else if (timed_out || err == httplib::Error::Read) {
    // httplib reports a read timeout as a read error; either way the request did not finish in time
    // or the connection broke mid-stream.
    recorder.finish(
        timed_out ? request_status::timeout : request_status::connection_error,
        timed_out ? "exceeded the request timeout of " + std::to_string(config.timeout_s) + " s"
                  : "connection broke while reading " +
                        config.server.url(endpoint_path(config.request.api)));
  } else if (err == httplib::Error::Canceled) {
    recorder.finish(request_status::ok, {});  // the recorder stopped the stream on an error event
  } else {
    recorder.finish(request_status::connection_error,
                    "cannot reach " + config.server.url(endpoint_path(config.request.api)) + ": " +
                        httplib::to_string(err));
  }
  return rec;
}

result<server_info> probe_server(const client_config& config) {
  control_client client(config);
  const std::string path = config.server.path_prefix + "/v1/models";
  auto res = client.cli.Get(path, client.headers);
  if (!res) {
    return result<server_info>::failure("cannot reach the server at " +
                                        config.server.url("/v1/models") + ": " +
                                        httplib::to_string(res.error()));
  }
  server_info info;
  info.http_status = res->status;
  if (res->status == 200) {
    const auto j = nlohmann::json::parse(res->body, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("data") && j["data"].is_array()) {
      for (const auto& m : j["data"]) {
        if (m.is_object() && m.contains("id") && m["id"].is_string())
          info.model_ids.push_back(m["id"].get<std::string>());
      }
    }
  }
  return info;
}

result<int64_t> chat_template_overhead(const client_config& config) {
  control_client client(config);
  const std::string path = config.server.path_prefix + "/tokenize";
  auto count = [&](const nlohmann::json& body) -> result<int64_t> {
    auto res = client.cli.Post(path, client.headers, body.dump(), "application/json");
    if (!res) return result<int64_t>::failure(httplib::to_string(res.error()));
    const auto j = nlohmann::json::parse(res->body, nullptr, false);
    if (res->status != 200 || j.is_discarded() || !j.is_object() || !j.contains("tokens") ||
        !j["tokens"].is_array()) {
      return result<int64_t>::failure("POST " + path + " answered " + std::to_string(res->status));
    }
    return static_cast<int64_t>(j["tokens"].size());
  };
  const std::string text = " the";
  auto chat = count({{"messages", {{{"role", "user"}, {"content", text}}}}});
  if (!chat) return chat;
  auto plain = count({{"prompt", text}, {"add_special_tokens", false}});
  if (!plain) return plain;
  return std::max<int64_t>(0, chat.value() - plain.value());
}

}  // namespace weft::apps::loadgen
