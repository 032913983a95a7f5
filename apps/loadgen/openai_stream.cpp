#include "apps/loadgen/openai_stream.hpp"

namespace weft::apps::loadgen {

namespace {

constexpr size_t max_error_body_bytes = 4096;

double ms_between(steady_clock::time_point a, steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// A readable message from an error body: OpenAI's {"error": {"message": ...}}, {"detail": ...}, or
// the text.
std::string error_message_of(const std::string& body) {
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object()) {
    if (auto e = j.find("error"); e != j.end()) {
      if (e->is_object() && e->contains("message") && (*e)["message"].is_string())
        return (*e)["message"].get<std::string>();
      if (e->is_string()) return e->get<std::string>();
    }
    if (auto d = j.find("detail"); d != j.end())
      return d->is_string() ? d->get<std::string>() : d->dump();
  }
  return body;
}

}  // namespace

const char* endpoint_path(api_kind api) {
  return api == api_kind::chat ? "/v1/chat/completions" : "/v1/completions";
}

const char* to_string(api_kind api) {
  return api == api_kind::chat ? "chat" : "completions";
}

const char* to_string(request_status status) {
  switch (status) {
    case request_status::ok:
      return "ok";
    case request_status::http_error:
      return "http_error";
    case request_status::stream_error:
      return "stream_error";
    case request_status::connection_error:
      return "connection_error";
    case request_status::timeout:
      return "timeout";
    case request_status::client_overload:
      return "client_overload";
  }
  return "?";
}

nlohmann::json make_request_body(const request_options& options, const request_spec& spec) {
  nlohmann::json body;
  body["model"] = options.model;
  if (options.api == api_kind::chat) {
    body["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", spec.prompt}}});
  } else {
    body["prompt"] = spec.prompt;
  }
  body["max_tokens"] = spec.max_tokens;
  body["temperature"] = options.temperature;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (options.eos == eos_mode::ignore) body["ignore_eos"] = true;
  return body;
}

stream_recorder::stream_recorder(api_kind api, request_record& record,
                                 steady_clock::time_point sent)
    : api_{api}, record_{record}, sent_{sent}, last_bytes_{sent} {}

void stream_recorder::on_status(int http_status) {
  record_.http_status = http_status;
}

void stream_recorder::fail(request_status status, std::string message) {
  if (failed_) return;
  failed_ = true;
  record_.status = status;
  record_.error = std::move(message);
}

bool stream_recorder::on_bytes(std::string_view bytes, steady_clock::time_point now) {
  last_bytes_ = now;
  if (record_.http_status != 200) {
    if (error_body_.size() < max_error_body_bytes)
      error_body_.append(bytes.substr(0, max_error_body_bytes - error_body_.size()));
    return true;
  }
  for (const auto& data : parser_.feed(bytes)) on_event(data, now);
  return !failed_;
}

void stream_recorder::on_event(const std::string& data, steady_clock::time_point now) {
  if (failed_) return;
  if (data == "[DONE]") {
    done_ = true;
    return;
  }
  const auto j = nlohmann::json::parse(data, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    fail(request_status::stream_error, "malformed stream chunk: " + data.substr(0, 200));
    return;
  }
  if (auto e = j.find("error"); e != j.end() && !e->is_null()) {
    fail(request_status::stream_error, "server error in stream: " + error_message_of(j.dump()));
    return;
  }
  if (auto c = j.find("choices"); c != j.end() && c->is_array() && !c->empty()) {
    const auto& choice = (*c)[0];
    const nlohmann::json* text = nullptr;
    if (api_ == api_kind::chat) {
      if (auto d = choice.find("delta"); d != choice.end() && d->is_object()) {
        if (auto t = d->find("content"); t != d->end()) text = &*t;
      }
    } else if (auto t = choice.find("text"); t != choice.end()) {
      text = &*t;
    }
    if (text != nullptr && text->is_string() && !text->get_ref<const std::string&>().empty()) {
      chunk_times_.push_back(now);
    }
    if (auto f = choice.find("finish_reason"); f != choice.end() && f->is_string()) {
      record_.finish_reason = f->get<std::string>();
    }
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    const auto get = [&](const nlohmann::json& o, const char* key) -> int64_t {
      auto it = o.find(key);
      return it != o.end() && it->is_number_integer() ? it->get<int64_t>() : -1;
    };
    record_.usage_reported = true;
    record_.prompt_tokens = get(*u, "prompt_tokens");
    record_.completion_tokens = get(*u, "completion_tokens");
    if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object()) {
      record_.cached_tokens = get(*d, "cached_tokens");
    }
  }
}

void stream_recorder::finish(request_status transport_status, const std::string& transport_error) {
  if (record_.http_status == 200) {
    for (const auto& data : parser_.finish()) on_event(data, last_bytes_);
  }
  record_.n_chunks = chunk_times_.size();
  if (!chunk_times_.empty()) record_.ttft_ms = ms_between(sent_, chunk_times_.front());
  record_.e2e_ms = ms_between(sent_, last_bytes_);
  for (size_t i = 1; i < chunk_times_.size(); ++i)
    record_.itl_ms.push_back(ms_between(chunk_times_[i - 1], chunk_times_[i]));

  if (transport_status != request_status::ok && !failed_) {
    fail(transport_status, transport_error);
  } else if (!failed_ && record_.http_status != 200) {
    fail(request_status::http_error, "HTTP " + std::to_string(record_.http_status) + ": " +
                                         error_message_of(error_body_).substr(0, 500));
  } else if (!failed_ && chunk_times_.empty()) {
    fail(request_status::stream_error, "stream ended without any token (" +
                                           std::to_string(parser_.bytes_seen()) +
                                           " body bytes received)");
  } else if (!failed_ && !done_ && record_.finish_reason.empty()) {
    fail(request_status::stream_error, "stream ended without [DONE] or a finish_reason");
  }
  if (failed_) return;
  if (record_.completion_tokens < 0)
    record_.completion_tokens = static_cast<int64_t>(chunk_times_.size());
  if (record_.completion_tokens > 1) {
    record_.tpot_ms =
        (record_.e2e_ms - record_.ttft_ms) / static_cast<double>(record_.completion_tokens - 1);
  }
}

}  // namespace weft::apps::loadgen
